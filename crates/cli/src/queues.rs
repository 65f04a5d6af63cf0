//! `permit queue push`, `ls`, `show` and `work`: work queues from the shell.

use std::ffi::OsString;
use std::io::{BufRead as _, IsTerminal as _};
use std::time::Duration;

use anyhow::Context;
use permit_client::wire::{ItemState, PushItem, QueueView};
use permit_client::{ClaimOptions, Client, ErrorCode, Item, PushOptions, Session, SessionOptions};
use serde_json::value::RawValue;
use tokio::sync::{broadcast, watch};
use tokio::task::JoinSet;

use crate::supervise::{self, Job, Signals};
use crate::{parse_duration, table, UsageError, EXIT_LOST, TTL_DEFAULT};

/// The exit codes of `permit queue work`, printed at the end of its `--help`.
pub const EXIT_CODES_WORK: &str = "\
Exit codes:
  0    stopped by SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGQUIT, after the running commands ended
       and their items were acked or nacked
  1    the server refused a request (for example permission_denied) or answered something
       unexpected (printed on stderr); running commands were let finish first
  64   a malformed --server address or access token (the message says which; nothing was sent)
  74   could not reach the server, or no server could serve (no leader, shutting down), before
       a session was opened (once working, outages are ridden out until the session's deadline)
  76   the session was lost (it expired, was deleted, or no keepalive was acknowledged before
       its deadline): the running commands got SIGTERM, then SIGKILL after --kill-after (by the
       deadline), and their items went back to the queue
  78   https:// against a plain-HTTP port or http:// against a TLS port (the message names the
       address to use)
  126  the command could not be executed: its item was given back, and no other was claimed
  127  the command was not found: its item was given back, and no other was claimed

A command that exits 0 acks its item; any other end (an exit code, a signal) nacks it, and the item is claimed again after the backoff, until the queue's
max_attempts sends it to the dead-letter queue. If permit itself is killed (even with SIGKILL),
the commands and their process groups are killed; if permit is stopped (SIGSTOP) or hangs, a
watchdog kills them just before the session's deadline.";

/// The exit codes of `permit queue push`, printed at the end of its `--help`.
pub const EXIT_CODES_PUSH: &str = "\
Exit codes:
  0   every item was pushed (or was a duplicate of a queued item with the same --key)
  1   the server refused the push (for example queue_full, payload_too_large) or answered
      something unexpected (printed on stderr); with several requests, the earlier ones stay
      pushed
  64  a line (or JSON) that is not JSON, --key with several items, or a malformed --server
      address or access token (the message says which; nothing was sent)
  74  could not reach the server, or no server could serve (no leader, shutting down); the push
      may or may not have happened (push again with --key to make sure without pushing twice)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// `permit queue ...`
#[derive(clap::Subcommand, Debug)]
pub enum QueueCommand {
    /// Push items: one JSON value given as an argument, or one per line of standard input.
    Push(PushArgs),
    /// List queues: items pending, claimed and delayed, claimers, oldest pending age.
    Ls(QueueLsArgs),
    /// Show a queue's counts and settings, and with --items its items.
    Show(QueueShowArgs),
    /// Run a command for each item of a queue, with the payload on its standard input: exit 0
    /// acks the item, anything else nacks it.
    Work(WorkArgs),
}

/// `permit queue push NAME [JSON] [--delay D] [--key K]`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_PUSH)]
pub struct PushArgs {
    /// The queue: 1-128 bytes of [A-Za-z0-9._:-]; created with the defaults if it does not exist.
    pub queue: String,
    /// The payload: one JSON value (quote strings: '"text"'). Without it, every non-empty line
    /// of standard input is one item's JSON, pushed in order (1000 per request).
    pub json: Option<String>,
    /// Keep the items out of claims for this long (up to 7 days).
    #[arg(long, value_parser = parse_duration)]
    pub delay: Option<Duration>,
    /// Deduplication key of the item (one item only): while an item pushed with this key is
    /// queued or claimed, pushing it again adds nothing and prints that item's id.
    #[arg(long)]
    pub key: Option<String>,
}

/// `permit queue ls [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct QueueLsArgs {
    /// Print a JSON array of the queues, as `GET /v1/queues` returns them.
    #[arg(long)]
    pub json: bool,
}

/// `permit queue show NAME [--items] [--state S] [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct QueueShowArgs {
    /// The queue.
    pub queue: String,
    /// List the items too (up to --limit): id, state, attempt, claiming session, age, last
    /// error and payload.
    #[arg(long)]
    pub items: bool,
    /// With --items: only items in this state.
    #[arg(long, requires = "items", value_parser = ["pending", "delayed", "claimed"])]
    pub state: Option<String>,
    /// With --items: most items listed.
    #[arg(long, requires = "items", default_value_t = 100)]
    pub limit: usize,
    /// Print JSON: the queue as `GET /v1/queues/{name}` returns it, with an `items` array under
    /// --items.
    #[arg(long)]
    pub json: bool,
}

/// `permit queue work NAME [--concurrency N] [--ttl 10s] -- CMD ARGS...`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_WORK)]
pub struct WorkArgs {
    /// The queue. A queue that does not exist yet is waited for (a push creates it), and so is a
    /// cluster that does not run queues yet (feature version 4).
    pub queue: String,
    /// Items worked on at once, each by its own run of the command, all claimed by one session.
    #[arg(long, short = 'c', default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub concurrency: u32,
    /// Session TTL: how soon the claimed items go back to the queue if this process dies or is
    /// cut off.
    #[arg(long, default_value = TTL_DEFAULT, value_parser = parse_duration)]
    pub ttl: Duration,
    /// The stop budget, as for `permit run`: a command gets SIGTERM this long before the
    /// session's local deadline when no keepalive was acknowledged (or at once when the session
    /// is lost), and SIGKILL at the deadline. At most a third of --ttl; default a quarter.
    #[arg(long, value_parser = parse_duration)]
    pub kill_after: Option<Duration>,
    /// Delay of the retry after a failed run of the command: this long after the first attempt,
    /// doubling with each attempt, up to --backoff-max.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub backoff: Duration,
    /// Longest retry delay.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub backoff_max: Duration,
    /// Leave PERMIT_AUTH_TOKEN in the command's environment; by default it is removed.
    #[arg(long)]
    pub pass_token: bool,
    /// Session name shown by `permit sessions` (default: `permit queue work`, the queue and
    /// this process id).
    #[arg(long)]
    pub name: Option<String>,
    /// The command and its arguments, after `--`. It gets the payload (the JSON text pushed) on
    /// standard input and sees PERMIT_QUEUE, PERMIT_ITEM_ID, PERMIT_ATTEMPT (1 on the first
    /// claim), PERMIT_TOKEN (the claim's fencing token) and PERMIT_SESSION, and not
    /// PERMIT_AUTH_TOKEN (see --pass-token).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// Runs a `permit queue` command.
pub(crate) async fn execute(client: &Client, command: QueueCommand) -> anyhow::Result<i32> {
    match command {
        QueueCommand::Push(args) => push(client, args).await,
        QueueCommand::Ls(args) => ls(client, args).await,
        QueueCommand::Show(args) => show(client, args).await,
        QueueCommand::Work(args) => work(client, args).await,
    }
}

/// Runs `permit queue push`: prints each item's id, one per line.
async fn push(client: &Client, args: PushArgs) -> anyhow::Result<i32> {
    let options = PushOptions { delay: args.delay, key: args.key.clone() };
    let payloads = match args.json {
        Some(json) => vec![json],
        None => {
            if std::io::stdin().is_terminal() {
                eprintln!("permit: reading items from standard input, one JSON value per line (Ctrl-D ends)");
            }
            let mut lines = Vec::new();
            for line in std::io::stdin().lock().lines() {
                lines.push(line.context("cannot read standard input")?);
            }
            lines
        }
    };
    let mut items = Vec::new();
    for (number, text) in payloads.into_iter().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        let payload = RawValue::from_string(text.trim().to_owned()).map_err(|error| {
            UsageError(format!("item {} is not JSON ({error}); quote strings: '\"text\"'", number + 1))
        })?;
        items.push(PushItem { payload, delay_ms: None, key: None });
    }
    if items.is_empty() {
        return Err(
            UsageError("nothing to push: no JSON given, and standard input has no line".into()).into()
        );
    }
    if options.key.is_some() && items.len() > 1 {
        return Err(UsageError(format!("--key names one item, and {} were given", items.len())).into());
    }
    let items = items.into_iter().map(|item| PushItem {
        delay_ms: options.delay.map(|delay| u64::try_from(delay.as_millis()).unwrap_or(u64::MAX)),
        key: options.key.clone(),
        ..item
    });
    let pushed = client
        .push_many(&args.queue, items)
        .await
        .with_context(|| format!("cannot push to queue {}", args.queue))?;
    for item in pushed {
        if item.duplicate {
            eprintln!("permit: item {} with this key is already queued; nothing was added", item.id);
        }
        println!("{}", item.id);
    }
    Ok(0)
}

/// A duration in ms as people read it: `850ms`, `12s`, `3m 20s`.
fn age(ms: u64) -> String {
    let rounded = if ms < 1000 { ms } else { ms / 1000 * 1000 };
    humantime::format_duration(Duration::from_millis(rounded)).to_string()
}

/// Runs `permit queue ls`.
async fn ls(client: &Client, args: QueueLsArgs) -> anyhow::Result<i32> {
    let queues = client.all_queues().await.context("cannot list queues")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&queues)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = queues
        .iter()
        .map(|q| {
            vec![
                q.name.clone(),
                q.pending.to_string(),
                q.claimed.to_string(),
                q.delayed.to_string(),
                q.claimers.to_string(),
                q.oldest_pending_ms.map_or_else(|| "-".to_owned(), age),
            ]
        })
        .collect();
    let header = ["NAME", "PENDING", "CLAIMED", "DELAYED", "CLAIMERS", "OLDEST"];
    print!("{}", table::format(&header, &rows));
    Ok(0)
}

/// Runs `permit queue show`.
async fn show(client: &Client, args: QueueShowArgs) -> anyhow::Result<i32> {
    let what = || format!("cannot read queue {}", args.queue);
    let view = client.get_queue(&args.queue).await.with_context(what)?;
    let items = if args.items {
        let state = match args.state.as_deref() {
            Some("pending") => Some(ItemState::Pending),
            Some("delayed") => Some(ItemState::Delayed),
            Some("claimed") => Some(ItemState::Claimed),
            _ => None,
        };
        let mut items = Vec::new();
        let mut after: Option<String> = None;
        // Bounded by --limit: every page but the last adds at least one item.
        while items.len() < args.limit {
            let limit = u32::try_from((args.limit - items.len()).min(1000)).unwrap_or(1000);
            let page =
                client.list_items(&args.queue, state, after.as_deref(), limit).await.with_context(what)?;
            let empty = page.items.is_empty();
            items.extend(page.items);
            match page.next_after {
                Some(next) if !empty => after = Some(next),
                _ => break,
            }
        }
        Some(items)
    } else {
        None
    };
    if args.json {
        let mut json = serde_json::to_value(&view)?;
        if let Some(items) = &items {
            json["items"] = serde_json::to_value(items)?;
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(0);
    }
    print!("{}", describe(&view));
    if let Some(items) = items {
        let rows: Vec<Vec<String>> = items
            .iter()
            .map(|item| {
                let state = serde_json::to_value(item.state).ok();
                vec![
                    item.id.clone(),
                    state.as_ref().and_then(|s| s.as_str()).unwrap_or("?").to_owned(),
                    item.attempt.to_string(),
                    item.session.clone().unwrap_or_else(|| "-".into()),
                    age(item.age_ms),
                    item.last_error.clone().unwrap_or_else(|| "-".into()),
                    shorten(item.payload.get(), 60),
                ]
            })
            .collect();
        let header = ["ID", "STATE", "ATTEMPT", "SESSION", "AGE", "LAST ERROR", "PAYLOAD"];
        print!("{}", table::format(&header, &rows));
    }
    Ok(0)
}

/// The human-readable summary of a queue.
fn describe(view: &QueueView) -> String {
    let oldest =
        view.oldest_pending_ms.map_or_else(String::new, |ms| format!(", oldest pending {}", age(ms)));
    let dead_letter = view.dead_letter.as_deref().unwrap_or("none (dead items stay)");
    format!(
        "{}: {} pending, {} claimed, {} delayed, {} claimer(s) waiting{oldest}\n\
         settings: max_attempts {}, dead_letter {dead_letter}, max_items {}\n",
        view.name, view.pending, view.claimed, view.delayed, view.claimers, view.max_attempts, view.max_items
    )
}

/// `text` cut to `chars` characters, with `…` when cut.
fn shorten(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// Pause between claims of a queue that does not exist yet.
const QUEUE_ABSENT_PAUSE: Duration = Duration::from_millis(500);

/// How a worker's run ended.
enum Done {
    /// The item was acked or nacked (or that failed, reported on stderr).
    Settled,
    /// The session was lost while the command ran: it was stopped, and the item is the queue's
    /// again.
    Lost,
    /// The command could not be started (this exit code): the item was given back, and no other
    /// item should be tried.
    CannotRun(i32),
}

/// What the ended runs tell the worker: whether the session was lost, and the exit code of a
/// command that could not be started.
#[derive(Default)]
struct Outcomes {
    lost: bool,
    cannot_run: Option<i32>,
}

impl Outcomes {
    fn record(&mut self, done: Option<Result<Done, tokio::task::JoinError>>) {
        match done {
            Some(Ok(Done::Lost)) => self.lost = true,
            Some(Ok(Done::CannotRun(code))) => self.cannot_run = Some(code),
            Some(Ok(Done::Settled)) | None => {}
            Some(Err(error)) => eprintln!("permit: a worker task failed: {error}"),
        }
    }
}

/// Runs `permit queue work`.
async fn work(client: &Client, args: WorkArgs) -> anyhow::Result<i32> {
    let mut signals = Signals::catch().context("cannot catch signals")?;
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("permit queue work {} (pid {})", args.queue, std::process::id()));
    let session = client
        .session_with(SessionOptions { ttl: args.ttl, name: Some(name) })
        .await
        .context("cannot open a session")?;
    let job = Job {
        command: args.command.clone(),
        kill_after: crate::run::stop_budget(args.ttl, args.kill_after),
        foreground: false,
        pass_token: args.pass_token,
        deadline: session.deadline(),
        stdin: None,
    };
    // Signals after the first are relayed to the running commands.
    let (relay, _) = broadcast::channel::<i32>(16);
    // Set once the worker claims no more: the runs' acks then claim nothing either.
    let (stop_claims, stopped) = watch::channel(false);
    let mut running: JoinSet<Done> = JoinSet::new();
    let mut stopping = false;
    let mut failure: Option<anyhow::Error> = None;
    let mut outcomes = Outcomes::default();
    let mut told_absent = false;
    let mut absent_pause = tokio::time::interval(QUEUE_ABSENT_PAUSE);
    absent_pause.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Reap the commands that ended.
        while let Some(done) = running.try_join_next() {
            outcomes.record(Some(done));
        }
        if stopping || outcomes.lost || outcomes.cannot_run.is_some() || failure.is_some() {
            break;
        }
        let free = args.concurrency as usize - running.len();
        if free == 0 {
            tokio::select! {
                done = running.join_next() => outcomes.record(done),
                signal = signals.recv() => stopping = stop(signal, running.len()),
                () = session.expired() => outcomes.lost = true,
            }
            continue;
        }
        let options = ClaimOptions { max: u32::try_from(free).unwrap_or(1), timeout: None };
        // A claim dropped here (a signal, a lost session) may leave items claimed: closing the
        // session below hands them back.
        let claimed = tokio::select! {
            claimed = session.claim_with(&args.queue, &options) => claimed,
            signal = signals.recv() => { stopping = stop(signal, running.len()); continue }
            () = session.expired() => { outcomes.lost = true; continue }
        };
        match claimed {
            Ok(items) => {
                told_absent = false;
                for item in items {
                    running.spawn(work_on(
                        item,
                        job.clone(),
                        relay.subscribe(),
                        stopped.clone(),
                        args.backoff,
                        args.backoff_max,
                    ));
                }
            }
            Err(error)
                if matches!(error.code(), Some(ErrorCode::QueueNotFound | ErrorCode::FeatureUnavailable)) =>
            {
                // Workers often start before the producers (wait for the first push), or before
                // the cluster runs queues (a new node raises its version a moment after it
                // starts; a rolling upgrade, once every node is upgraded).
                if !told_absent {
                    match error.code() {
                        Some(ErrorCode::QueueNotFound) => eprintln!(
                            "permit: queue {} does not exist yet; waiting for a push to create it",
                            args.queue
                        ),
                        _ => eprintln!("permit: the cluster does not run queues yet ({error}); waiting"),
                    }
                    told_absent = true;
                }
                tokio::select! {
                    _ = absent_pause.tick() => {}
                    signal = signals.recv() => stopping = stop(signal, running.len()),
                }
            }
            Err(permit_client::Error::SessionExpired) => outcomes.lost = true,
            Err(error) => {
                failure =
                    Some(anyhow::Error::new(error).context(format!("cannot claim from queue {}", args.queue)))
            }
        }
    }
    stop_claims.send_replace(true);
    // Let the running commands end (each acks or nacks its item); further signals go to them.
    if !running.is_empty() && !stopping && !outcomes.lost {
        eprintln!("permit: waiting for {} running command(s) to end", running.len());
    }
    loop {
        tokio::select! {
            done = running.join_next() => match done {
                None => break,
                done => outcomes.record(done),
            },
            signal = signals.recv() => {
                eprintln!("permit: signal {signal}: passing it on to {} running command(s)", running.len());
                let _ = relay.send(signal);
            }
        }
    }
    if outcomes.lost {
        eprintln!(
            "permit: lost the session (it expired or was deleted, or no keepalive was acknowledged before its deadline: --ttl {}); its claimed items went back to queue {}",
            humantime::format_duration(args.ttl),
            args.queue
        );
        if tokio::time::timeout(Duration::from_secs(1), close(session)).await.is_err() {
            eprintln!("permit: could not close the session in time; it expires after its TTL");
        }
        return Ok(EXIT_LOST);
    }
    close(session).await;
    match (failure, outcomes.cannot_run) {
        (Some(error), _) => Err(error),
        (None, Some(code)) => Ok(code),
        (None, None) => Ok(0),
    }
}

/// The first signal stops the claims; the message says how the running commands end.
fn stop(signal: i32, running: usize) -> bool {
    if running > 0 {
        eprintln!(
            "permit: signal {signal}: no more claims; waiting for {running} running command(s) to end (another signal is passed on to them)"
        );
    }
    true
}

/// Runs the command for `item` and acks (exit 0) or nacks (anything else) it; stops the command
/// when the session is lost (then the item is the queue's again, and nothing is sent).
///
/// Its ack claims the queue's next pending item in the same request, unless the worker stopped
/// claiming (`stopped`); the item it takes is worked on here, in this run's place, so that a
/// busy queue costs one request per item and not two (an ack, then the claimer's claim). The
/// claim does not wait: with nothing pending, the claimer's blocking claim serves this place.
async fn work_on(
    mut item: Item,
    job: Job,
    mut signals: broadcast::Receiver<i32>,
    stopped: watch::Receiver<bool>,
    backoff: Duration,
    backoff_max: Duration,
) -> Done {
    loop {
        match run_item(item, &job, &mut signals, &stopped, backoff, backoff_max).await {
            Ran::Next(next) if *stopped.borrow() => {
                // Claimed as the worker stopped: dropped unsettled, it is nacked back at once (the
                // attempt its claim counted stays counted).
                drop(next);
                return Done::Settled;
            }
            Ran::Next(next) => item = next,
            Ran::Done(done) => return done,
        }
    }
}

/// How one item's run ended: with the next item its ack claimed, or done.
enum Ran {
    Next(Item),
    Done(Done),
}

/// Runs the command for one item and settles it (see [`work_on`]).
async fn run_item(
    item: Item,
    job: &Job,
    signals: &mut broadcast::Receiver<i32>,
    stopped: &watch::Receiver<bool>,
    backoff: Duration,
    backoff_max: Duration,
) -> Ran {
    let session: Session = item.session().clone();
    let job =
        Job { deadline: session.deadline(), stdin: Some(item.payload().as_bytes().to_vec()), ..job.clone() };
    let env = vec![
        ("PERMIT_QUEUE", item.queue().to_owned()),
        ("PERMIT_ITEM_ID", item.id().to_owned()),
        ("PERMIT_ATTEMPT", item.attempt().to_string()),
        ("PERMIT_TOKEN", item.token().to_string()),
        ("PERMIT_SESSION", session.id().to_owned()),
    ];
    let code = match supervise::spawn(&job, &env).await {
        Err(code) => {
            // Every item would fail the same way: give this one back as it was (no delay) and
            // stop, rather than burn the queue's items through their attempts.
            let why = "permit queue work could not start the command";
            if let Err(error) = item.nack(Duration::ZERO, Some(why)).await {
                eprintln!("permit: cannot give the item back ({error}); it comes back when the session ends");
            }
            return Ran::Done(Done::CannotRun(code));
        }
        Ok(running) => {
            let lost = item.lost();
            let due = crate::run::stop_due(session.clone(), job.kill_after);
            let stop = async move {
                tokio::select! {
                    () = lost => {}
                    () = due => {}
                }
            };
            let id = item.id().to_owned();
            let on_lost = || {
                eprintln!("permit: lost the session while item {id} ran; stopping its command with SIGTERM");
            };
            let deadline = || session.deadline();
            match running.supervise(signals, stop, on_lost, deadline).await {
                Ok(ended) if ended.lost => return Ran::Done(Done::Lost),
                // Killed by the watchdog while `permit` was stopped: the claim has lapsed.
                Ok(_) if tokio::time::Instant::now() >= session.deadline() => return Ran::Done(Done::Lost),
                Ok(ended) => ended.code,
                Err(error) => {
                    eprintln!("permit: lost track of the command of item {id}: {error}");
                    crate::EXIT_ERROR
                }
            }
        }
    };
    let id = item.id().to_owned();
    if code == 0 {
        let acked = if *stopped.borrow() {
            item.ack().await.map(|()| None)
        } else {
            item.ack_and_claim(Duration::ZERO).await
        };
        match acked {
            Ok(Some(next)) => return Ran::Next(next),
            Ok(None) => {}
            Err(error) => eprintln!("permit: cannot ack item {id} ({error}); it may be worked on again"),
        }
    } else {
        let delay = retry_delay(item.attempt(), backoff, backoff_max);
        let why = format!("the command exited with {code} (permit queue work)");
        match item.nack(delay, Some(&why)).await {
            Ok(ItemState::Dead) => {
                eprintln!("permit: item {id} failed (exit {code}) and went to the dead-letter queue")
            }
            Ok(_) => eprintln!(
                "permit: item {id} failed (exit {code}); retrying in {}",
                humantime::format_duration(delay)
            ),
            Err(error) => {
                eprintln!("permit: cannot nack item {id} ({error}); it comes back when the session ends")
            }
        }
    }
    Ran::Done(Done::Settled)
}

/// The delay before retrying an item after its `attempt`-th run failed: `backoff` doubled for
/// each attempt after the first, at most `backoff_max`.
fn retry_delay(attempt: u32, backoff: Duration, backoff_max: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1).min(32);
    backoff.saturating_mul(1u32 << doublings.min(31)).min(backoff_max)
}

/// Closes the session, reporting (not failing on) errors: it expires on its own anyway.
async fn close(session: Session) {
    if let Err(error) = session.close().await {
        eprintln!("permit: cannot close the session ({error}); it expires after its TTL");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_back_off_doubling_up_to_the_cap() {
        let (base, cap) = (Duration::from_secs(1), Duration::from_secs(60));
        let delays: Vec<u64> = (1..=8).map(|attempt| retry_delay(attempt, base, cap).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(retry_delay(u32::MAX, base, cap), cap);
        assert_eq!(retry_delay(3, Duration::ZERO, cap), Duration::ZERO);
    }

    #[test]
    fn long_payloads_are_shortened_on_a_character_boundary() {
        assert_eq!(shorten("héllo", 3), "hél…");
        assert_eq!(shorten("abc", 3), "abc");
    }
}
