//! I8, log hygiene: no node log shows a panic.

use crate::report::{Invariant, Report, Violation};

/// The strings whose presence in a node log means a panic happened.
pub const PANIC_MARKERS: [&str; 2] = ["panicked", "RUST_BACKTRACE"];

/// Lines quoted per log; the rest are counted.
const LINES_QUOTED_MAX: usize = 5;
/// Characters quoted per line.
const LINE_CHARS_MAX: usize = 200;

/// Scans node logs, given as (name, text) pairs, for [`PANIC_MARKERS`]. Each log with a
/// marker is one violation quoting its first lines. `checked` counts logs.
///
/// # Examples
///
/// ```
/// use permit_check::check_logs;
///
/// let logs = [
///     ("n1", "INFO started\nINFO leader elected\n"),
///     ("n2", "INFO started\nthread 'tokio-runtime-worker' panicked at src/raft/segment_log.rs:80:9\n"),
/// ];
/// let report = check_logs(logs);
/// assert_eq!(report.checked, 2);
/// assert!(report.violations[0].message.contains("`n2` line 2"));
/// ```
pub fn check_logs<'a>(logs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Report {
    let mut report = Report::new(0);
    for (name, text) in logs {
        report.checked += 1;
        let hits: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .filter(|(_, line)| PANIC_MARKERS.iter().any(|marker| line.contains(marker)))
            .collect();
        if hits.is_empty() {
            continue;
        }
        let quoted: Vec<String> = hits
            .iter()
            .take(LINES_QUOTED_MAX)
            .map(|(index, line)| {
                format!(
                    "`{name}` line {}: {}",
                    index + 1,
                    line.chars().take(LINE_CHARS_MAX).collect::<String>()
                )
            })
            .collect();
        let more = hits.len().saturating_sub(LINES_QUOTED_MAX);
        let tail = if more > 0 { format!(" (and {more} more lines)") } else { String::new() };
        report.push(Violation::new(
            Invariant::LogHygiene,
            Vec::new(),
            format!("{}{tail}", quoted.join(" | ")),
        ));
    }
    report
}
