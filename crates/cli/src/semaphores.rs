//! `permit ls`, `permit show`, `permit set-capacity`, `permit take` and `permit delete`.

use std::time::Duration;

use anyhow::Context;
use permit_client::wire::{PutSemaphoreRequest, Rate, SemaphoreView};
use permit_client::Client;

use crate::{parse_duration, table, UsageError};

/// `permit ls [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct LsArgs {
    /// Print a JSON array of `{name, capacity, held, available, holders, waiters}`.
    #[arg(long)]
    pub json: bool,
}

/// `permit show <semaphore> [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct ShowArgs {
    /// The semaphore.
    pub semaphore: String,
    /// Print the semaphore as JSON, as `GET /v1/semaphores/{name}` returns it.
    #[arg(long)]
    pub json: bool,
}

/// `permit set-capacity <semaphore> <capacity> [--rate 10/s] [--burst N] [--lock-delay 5s]
/// [--group-max N] [--no-rate] [--no-group-max]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct SetCapacityArgs {
    /// The semaphore (created if it does not exist).
    pub semaphore: String,
    /// The capacity in permits: 1-1000000. Shrinking below what is held keeps the holders;
    /// nothing is granted until holdings fit. Policies not named by a flag stay as they are.
    pub capacity: u64,
    /// A rate next to the capacity: permits granted (by acquires and `permit take`) obey it on
    /// the leader's clock. PERMITS/PERIOD: `10/s`, `600/m`, `1000/h`, `5/500ms`, `3/2s`
    /// (permits 1-1000000, a period of whole milliseconds up to a day).
    #[arg(long, value_parser = parse_rate, conflicts_with = "no_rate")]
    pub rate: Option<Rate>,
    /// Most permits the rate grants at once after a quiet spell, given with --rate: 1-1000000
    /// (default: the rate's permits).
    #[arg(long, requires = "rate")]
    pub burst: Option<u64>,
    /// Remove the rate.
    #[arg(long)]
    pub no_rate: bool,
    /// Keep the permits of a hold that ends by expiry or revoke out of circulation this long
    /// (`5s`, `500ms`; at most 60s, `0s` for none); a release returns them at once.
    #[arg(long, value_parser = parse_duration)]
    pub lock_delay: Option<Duration>,
    /// No group (`permit run/lock --group G`) holds more than this many permits: 1-1000000.
    #[arg(long, conflicts_with = "no_group_max")]
    pub group_max: Option<u64>,
    /// Remove the per-group cap.
    #[arg(long)]
    pub no_group_max: bool,
}

impl SetCapacityArgs {
    /// The `PUT` request these arguments ask for: absent flags keep the current policies.
    fn request(&self) -> anyhow::Result<PutSemaphoreRequest> {
        let rate = match (self.rate, self.no_rate) {
            (Some(rate), _) => Some(Some(Rate { burst: self.burst.or(rate.burst), ..rate })),
            (None, true) => Some(None),
            (None, false) => None,
        };
        let lock_delay_ms = match self.lock_delay {
            None => None,
            Some(delay) if delay.subsec_nanos() % 1_000_000 != 0 => {
                return Err(UsageError(format!(
                    "--lock-delay {} is not a whole number of milliseconds",
                    humantime::format_duration(delay)
                ))
                .into())
            }
            Some(delay) => Some(u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
        };
        let group_max = match (self.group_max, self.no_group_max) {
            (Some(max), _) => Some(Some(max)),
            (None, true) => Some(None),
            (None, false) => None,
        };
        Ok(PutSemaphoreRequest { capacity: self.capacity, rate, lock_delay_ms, group_max })
    }
}

/// Largest `permits` of a rate (the server's range).
const RATE_PERMITS_MAX: u64 = 1_000_000;
/// Longest period of a rate, in ms: a day (the server's range).
const RATE_PER_MS_MAX: u64 = 86_400_000;

/// Parses a rate `PERMITS/PERIOD`: `10/s`, `600/m`, `1000/h`, `2/d`, or a period with a number
/// (`5/500ms`, `3/2s`, `1/1m30s`; humantime). The period is whole milliseconds, 1 ms to a day;
/// the permits 1-1000000. The burst is left to `--burst`.
pub(crate) fn parse_rate(text: &str) -> Result<Rate, String> {
    let usage =
        || format!("{text:?} is not a rate: write PERMITS/PERIOD, as in 10/s, 600/m, 1000/h or 5/500ms");
    let (permits, period) = text.trim().split_once('/').ok_or_else(usage)?;
    let permits: u64 = permits.trim().parse().map_err(|_| usage())?;
    if !(1..=RATE_PERMITS_MAX).contains(&permits) {
        return Err(format!("{text:?}: the permits of a rate are 1-{RATE_PERMITS_MAX}"));
    }
    let period = period.trim();
    let per_ms = match period {
        "ms" => 1,
        "s" | "sec" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        "d" => RATE_PER_MS_MAX,
        _ => {
            if !period.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(usage());
            }
            let duration =
                humantime::parse_duration(period).map_err(|error| format!("{}: {error}", usage()))?;
            if duration.subsec_nanos() % 1_000_000 != 0 {
                return Err(format!("{text:?}: the period of a rate is a whole number of milliseconds"));
            }
            u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
        }
    };
    if !(1..=RATE_PER_MS_MAX).contains(&per_ms) {
        return Err(format!("{text:?}: the period of a rate is 1ms to a day (24h)"));
    }
    Ok(Rate { permits, per_ms, burst: None })
}

/// A rate as `parse_rate` reads it: `10/s`, `600/m`, `5/500ms`.
pub(crate) fn format_rate(permits: u64, per_ms: u64) -> String {
    match per_ms {
        1_000 => format!("{permits}/s"),
        60_000 => format!("{permits}/m"),
        3_600_000 => format!("{permits}/h"),
        RATE_PER_MS_MAX => format!("{permits}/d"),
        _ => format!("{permits}/{per_ms}ms"),
    }
}

/// `permit delete <semaphore>`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct DeleteArgs {
    /// The semaphore; refused while anyone holds or waits on it.
    pub semaphore: String,
}

/// `permit sessions [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct SessionsArgs {
    /// Print a JSON array of `{id, name, ttl_ms, remaining_ms, holds, waits}`.
    #[arg(long)]
    pub json: bool,
}

/// Most sessions `permit sessions` prints; the server pages, the CLI stops here.
const SESSIONS_SHOWN_MAX: usize = 100_000;

/// Runs `permit sessions`.
pub(crate) async fn sessions(client: &Client, args: SessionsArgs) -> anyhow::Result<i32> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    while all.len() < SESSIONS_SHOWN_MAX {
        let page = client.list_sessions(after.as_deref(), 1000).await.context("cannot list sessions")?;
        all.extend(page.sessions);
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_default(),
                format!("{}ms", s.ttl_ms),
                s.remaining_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms}ms")),
                s.holds.to_string(),
                s.waits.to_string(),
            ]
        })
        .collect();
    print!("{}", table::format(&["ID", "NAME", "TTL", "REMAINING", "HOLDS", "WAITS"], &rows));
    Ok(0)
}

/// Runs `permit ls`.
pub(crate) async fn ls(client: &Client, args: LsArgs) -> anyhow::Result<i32> {
    let semaphores = client.all_semaphores().await.context("cannot list semaphores")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&semaphores)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = semaphores
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.capacity.to_string(),
                s.held.to_string(),
                s.available.to_string(),
                s.holders.to_string(),
                s.waiters.to_string(),
            ]
        })
        .collect();
    print!("{}", table::format(&["NAME", "CAPACITY", "HELD", "AVAILABLE", "HOLDERS", "WAITERS"], &rows));
    Ok(0)
}

/// Runs `permit show`.
pub(crate) async fn show(client: &Client, args: ShowArgs) -> anyhow::Result<i32> {
    let view = client
        .get_semaphore(&args.semaphore)
        .await
        .with_context(|| format!("cannot read semaphore {}", args.semaphore))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", describe(&view));
    }
    Ok(0)
}

/// The human-readable form of a semaphore: a summary line, then holders and waiters.
fn describe(view: &SemaphoreView) -> String {
    let mut text = format!(
        "{}: capacity {}, held {}, available {}, {} waiting\n",
        view.name,
        view.capacity,
        view.held,
        view.available,
        view.waiters.len()
    );
    text.push_str(&policies(view));
    if !view.delayed.is_empty() {
        let rows: Vec<Vec<String>> = view
            .delayed
            .iter()
            .map(|d| vec![d.permits.to_string(), format!("{}ms", d.remaining_ms), d.until_ms.to_string()])
            .collect();
        text.push_str("\ndelayed (lock-delay):\n");
        text.push_str(&table::format(&["PERMITS", "REMAINING", "UNTIL_MS"], &rows));
    }
    if !view.groups.is_empty() {
        let rows: Vec<Vec<String>> = view
            .groups
            .iter()
            .map(|g| vec![g.group.clone(), g.held.to_string(), g.holders.to_string(), g.waiters.to_string()])
            .collect();
        text.push_str("\ngroups:\n");
        text.push_str(&table::format(&["GROUP", "HELD", "HOLDERS", "WAITERS"], &rows));
    }
    if !view.holders.is_empty() {
        let rows: Vec<Vec<String>> = view
            .holders
            .iter()
            .map(|h| {
                vec![
                    h.session.clone(),
                    h.session_name.clone().unwrap_or_default(),
                    h.permits.to_string(),
                    h.token.to_string(),
                    h.expires_in_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms}ms")),
                    h.group.clone().unwrap_or_default(),
                ]
            })
            .collect();
        text.push_str("\nholders:\n");
        text.push_str(&table::format(
            &["SESSION", "NAME", "PERMITS", "TOKEN", "MAX_HOLD_LEFT", "GROUP"],
            &rows,
        ));
    }
    if !view.waiters.is_empty() {
        let rows: Vec<Vec<String>> = view
            .waiters
            .iter()
            .map(|w| {
                vec![
                    w.position.to_string(),
                    w.session.clone(),
                    w.session_name.clone().unwrap_or_default(),
                    w.permits.to_string(),
                    w.group.clone().unwrap_or_default(),
                    if w.take { "take" } else { "acquire" }.to_owned(),
                ]
            })
            .collect();
        text.push_str("\nwaiters:\n");
        text.push_str(&table::format(&["POSITION", "SESSION", "NAME", "PERMITS", "GROUP", "KIND"], &rows));
    }
    text
}

/// The policies of a semaphore, one line each (nothing for a semaphore without any): the rate
/// with its state, the lock-delay with the permits it keeps, the group cap.
fn policies(view: &SemaphoreView) -> String {
    let mut text = String::new();
    if let Some(rate) = &view.rate {
        text.push_str(&format!(
            "rate: {}, burst {}: {} available now, next in {}ms\n",
            format_rate(rate.permits, rate.per_ms),
            rate.burst,
            rate.available,
            rate.next_in_ms
        ));
    }
    if view.lock_delay_ms > 0 || !view.delayed.is_empty() {
        let delayed: u64 = view.delayed.iter().map(|d| d.permits).sum();
        text.push_str(&format!("lock-delay: {}ms, {delayed} permits delayed now\n", view.lock_delay_ms));
    }
    if let Some(max) = view.group_max {
        text.push_str(&format!("group-max: {max} permits per group\n"));
    }
    text
}

/// Runs `permit set-capacity`.
pub(crate) async fn set_capacity(client: &Client, args: SetCapacityArgs) -> anyhow::Result<i32> {
    let request = args.request()?;
    let view = client
        .put_semaphore_with(&args.semaphore, &request)
        .await
        .with_context(|| format!("cannot set the capacity of {}", args.semaphore))?;
    println!("{}: capacity {}, held {}, available {}", view.name, view.capacity, view.held, view.available);
    print!("{}", policies(&view));
    Ok(0)
}

/// Runs `permit delete`.
pub(crate) async fn delete(client: &Client, args: DeleteArgs) -> anyhow::Result<i32> {
    client
        .delete_semaphore(&args.semaphore)
        .await
        .with_context(|| format!("cannot delete semaphore {}", args.semaphore))?;
    println!("deleted {}", args.semaphore);
    Ok(0)
}

/// `permit take <semaphore> [-n PERMITS] [--timeout 30s] [--print-token] [--quiet]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_TAKE)]
pub struct TakeArgs {
    /// The semaphore, with a rate (`permit set-capacity NAME N --rate 10/s`; one without a
    /// rate takes at once, always).
    pub semaphore: String,
    /// Permits to take: 1 up to the rate's burst.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub permits: u64,
    /// Wait this long for the rate, in the semaphore's FIFO queue (at most 60s); default: answer
    /// at once.
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Print the take's token (larger than every token before it) on stdout.
    #[arg(long)]
    pub print_token: bool,
    /// Do not say on stderr that the rate had no room (the exit code, 75, still does).
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// Runs `permit take`: exit 0 when taken, [`EXIT_RATE_LIMITED`](crate::EXIT_RATE_LIMITED) when
/// the rate had no room within the timeout.
pub(crate) async fn take(client: &Client, args: TakeArgs) -> anyhow::Result<i32> {
    let wait = args.timeout.unwrap_or(Duration::ZERO);
    if wait > Duration::from_millis(permit_client::wire::WAIT_MS_MAX) {
        return Err(UsageError(format!(
            "--timeout {} is longer than a take may wait (60s)",
            humantime::format_duration(wait)
        ))
        .into());
    }
    match client.take(&args.semaphore, args.permits, wait).await {
        Ok(token) => {
            if args.print_token {
                println!("{token}");
            }
            Ok(0)
        }
        Err(permit_client::Error::RateLimited { retry_after, .. }) => {
            if !args.quiet {
                eprintln!(
                    "permit: {} is rate limited: nothing taken; the rate allows {} permit(s) in {}ms",
                    args.semaphore,
                    args.permits,
                    retry_after.as_millis()
                );
            }
            Ok(crate::EXIT_RATE_LIMITED)
        }
        Err(error) => Err(error).with_context(|| format!("cannot take from {}", args.semaphore)),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn rates_parse_into_permits_and_a_period_in_ms() {
        let rate = |text: &str| parse_rate(text).map(|rate| (rate.permits, rate.per_ms, rate.burst));
        assert_eq!(rate("10/s"), Ok((10, 1_000, None)));
        assert_eq!(rate("600/m"), Ok((600, 60_000, None)));
        assert_eq!(rate("1000/h"), Ok((1000, 3_600_000, None)));
        assert_eq!(rate("2/d"), Ok((2, 86_400_000, None)));
        assert_eq!(rate("5/500ms"), Ok((5, 500, None)));
        assert_eq!(rate("3/2s"), Ok((3, 2_000, None)));
        assert_eq!(rate("1/1m30s"), Ok((1, 90_000, None)));
        assert_eq!(rate(" 7 / s "), Ok((7, 1_000, None)));
        assert_eq!(rate("1000000/1ms"), Ok((1_000_000, 1, None)));
        assert_eq!(rate("1/24h"), Ok((1, 86_400_000, None)));
        // Each format_rate form reads back as itself.
        for (permits, per_ms) in
            [(10, 1_000), (600, 60_000), (9, 3_600_000), (2, 86_400_000), (5, 500), (3, 2_000)]
        {
            assert_eq!(rate(&format_rate(permits, per_ms)), Ok((permits, per_ms, None)));
        }
    }

    #[test]
    fn malformed_or_out_of_range_rates_are_refused_with_the_syntax() {
        for text in ["", "10", "10/", "/s", "ten/s", "10/x", "10/week", "-1/s", "10/s/s", "1.5/s", "10/-1s"] {
            let error = parse_rate(text).expect_err(text);
            assert!(error.contains("PERMITS/PERIOD"), "{text:?}: {error}");
        }
        for (text, says) in [
            ("0/s", "1-1000000"),
            ("1000001/s", "1-1000000"),
            ("1/0ms", "1ms to a day"),
            ("1/25h", "1ms to a day"),
            ("1/1500us", "whole number of milliseconds"),
        ] {
            let error = parse_rate(text).expect_err(text);
            assert!(error.contains(says), "{text:?}: {error}");
        }
    }

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: SetCapacityArgs,
    }

    fn request(args: &[&str]) -> Result<PutSemaphoreRequest, String> {
        let cli = Cli::try_parse_from(std::iter::once("set-capacity").chain(args.iter().copied()))
            .map_err(|error| error.to_string())?;
        cli.args.request().map_err(|error| error.to_string())
    }

    #[test]
    fn set_capacity_flags_make_the_put_request() {
        let all = request(&[
            "api",
            "4",
            "--rate",
            "10/s",
            "--burst",
            "20",
            "--lock-delay",
            "5s",
            "--group-max",
            "2",
        ]);
        let expected = PutSemaphoreRequest {
            capacity: 4,
            rate: Some(Some(Rate { permits: 10, per_ms: 1_000, burst: Some(20) })),
            lock_delay_ms: Some(5_000),
            group_max: Some(Some(2)),
        };
        assert_eq!(all, Ok(expected));
        // No flag keeps every policy; --no-rate and --no-group-max remove; 0s ends the delay.
        assert_eq!(
            request(&["api", "4"]),
            Ok(PutSemaphoreRequest { capacity: 4, ..PutSemaphoreRequest::default() })
        );
        let removed = request(&["api", "4", "--no-rate", "--no-group-max", "--lock-delay", "0s"]).unwrap();
        assert_eq!(
            (removed.rate, removed.group_max, removed.lock_delay_ms),
            (Some(None), Some(None), Some(0))
        );
        // Contradictions and a burst without a rate are refused by the parser.
        for bad in [
            &["api", "4", "--rate", "1/s", "--no-rate"][..],
            &["api", "4", "--group-max", "2", "--no-group-max"],
            &["api", "4", "--burst", "3"],
            &["api", "4", "--rate", "fast"],
        ] {
            assert!(request(bad).is_err(), "{bad:?}");
        }
        let error = request(&["api", "4", "--lock-delay", "1500us"]).unwrap_err();
        assert!(error.contains("whole number of milliseconds"), "{error}");
    }
}
