//! How a run reads: one summary line when it passes; the seed, the violations, the last events
//! and how to replay it when it fails.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use crate::simulation::Run;

/// Trace lines printed for a failed seed unless `PERMIT_SIM_TRACE` says otherwise.
const TRACE_LINES_DEFAULT: usize = 120;

impl Run {
    /// Whether any invariant broke.
    pub fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    /// One line: seed, verdict and counts.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        format!(
            "permit-sim seed {}: {} in {:.1}s wall for {}s simulated; {} records, {} grants, {} faults ({} \
             crashes, {} fsync failures, {} torn tails), {} terms led, {} snapshot installs, applied index {}, {} messages delivered, {} lost; \
             queue: {} pushed, {} acked, {} dead-lettered; committed log: {} entries re-applied, {} grants, \
             takes and hold ends",
            self.seed,
            if self.failed() { "FAILED" } else { "ok" },
            self.wall.as_secs_f64(),
            self.settings.simulated.as_secs(),
            s.records,
            s.grants,
            s.faults,
            s.crashes,
            s.storage.0,
            s.storage.1,
            s.terms_led,
            s.snapshot_installs,
            s.applied_max,
            s.messages.0,
            s.messages.1,
            s.queue.0,
            s.queue.1,
            s.queue.2,
            s.replayed.0,
            s.replayed.1,
        )
    }

    /// Writes the report, the whole history and the trace to `dir/seed-N.txt`; returns the path.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn save(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join(format!("seed-{}.txt", self.seed));
        let mut out = self.report();
        let _ = writeln!(out, "\nhistory ({} records):", self.history.records.len());
        for record in &self.history.records {
            let _ = writeln!(out, "  {record}");
        }
        let _ = writeln!(out, "\ntrace ({} lines):", self.trace.len());
        for line in &self.trace {
            let _ = writeln!(out, "  {line}");
        }
        std::fs::write(&path, out)?;
        Ok(path)
    }

    /// The full report of a failed run: violations, the last events, and the replay command.
    pub fn report(&self) -> String {
        let lines = std::env::var("PERMIT_SIM_TRACE")
            .ok()
            .and_then(|lines| lines.parse().ok())
            .unwrap_or(TRACE_LINES_DEFAULT);
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.summary());
        let _ = writeln!(out, "violations ({}):", self.violations.len());
        for violation in self.violations.iter().take(50) {
            let _ = writeln!(out, "  {violation}");
        }
        let tail = &self.trace[self.trace.len().saturating_sub(lines)..];
        let _ = writeln!(out, "last {} events (PERMIT_SIM_TRACE=N for more):", tail.len());
        for line in tail {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(
            out,
            "replay (best effort: openraft's election timers are not seeded): PERMIT_SIM_SEED={} \
             PERMIT_SIM_SECONDS={} cargo test -p permit-sim --test simulation -- --nocapture",
            self.seed,
            self.settings.simulated.as_secs()
        );
        out
    }
}
