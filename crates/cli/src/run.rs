//! `permit run`: hold permits of a semaphore while a command runs; and the flow it shares with
//! `permit elect` and `permit lock` (open a session, wait for the grant, run, stop on loss,
//! release, close).

use std::ffi::OsString;
use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use permit_client::{
    AcquireOptions, Client, ErrorCode, Leadership, Permit, Session, SessionOptions, SessionState,
};

use crate::supervise::{self, Job, Signals};
use crate::{parse_duration, EXIT_CODES_RUN, EXIT_LOST, EXIT_SIGNAL_BASE, EXIT_TIMEOUT, TTL_DEFAULT};

/// `permit run <semaphore> [-n PERMITS] [--capacity N] [--group G] [--ttl 10s] [--timeout 30s] -- CMD ARGS...`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_RUN)]
pub struct RunArgs {
    /// The semaphore and how to hold it.
    #[command(flatten)]
    pub permit: PermitArgs,
    /// Release the permits this long after the grant even if the command still runs (the
    /// command is then stopped as on a lost hold).
    #[arg(long, value_parser = parse_duration)]
    pub max_hold: Option<Duration>,
    /// The stop budget: the command gets SIGTERM this long before the session's local deadline
    /// when no keepalive was acknowledged (or at once when the hold is lost), and SIGKILL at the
    /// deadline, so that it is dead before the server can give the hold to someone else. At
    /// most a third of --ttl (a larger value is clamped, with a message); default a quarter.
    #[arg(long, value_parser = parse_duration)]
    pub kill_after: Option<Duration>,
    /// Keep the command in this terminal's process group (for interactive commands) and signal
    /// only it; by default it gets its own process group, which is signalled as a whole.
    #[arg(long)]
    pub foreground: bool,
    /// Leave PERMIT_AUTH_TOKEN in the command's environment; by default it is removed, so that
    /// the command (and what it runs or logs) does not get `permit`'s token.
    #[arg(long)]
    pub pass_token: bool,
    /// Session name shown by `permit show` (default: `permit run`, the semaphore and this process id).
    #[arg(long)]
    pub name: Option<String>,
    /// The command and its arguments, after `--`. It sees PERMIT_TOKEN (the fencing token),
    /// PERMIT_SEMAPHORE, PERMIT_PERMITS and PERMIT_SESSION, and not PERMIT_AUTH_TOKEN (see
    /// --pass-token).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// What `permit run` and `permit lock` hold: permits of a semaphore, through a session.
#[derive(clap::Args, Debug)]
pub struct PermitArgs {
    /// The semaphore: 1-128 bytes of [A-Za-z0-9._:-].
    pub semaphore: String,
    /// Permits to hold.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub permits: u64,
    /// Create the semaphore with this capacity if it does not exist. A semaphore made this way
    /// is ephemeral: the server deletes it when its last holder and waiter leave (see --keep).
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Keep a semaphore that --capacity creates after everyone leaves.
    #[arg(long, requires = "capacity")]
    pub keep: bool,
    /// Count against this group's cap (the semaphore's group-max, see `permit set-capacity`):
    /// 1-64 bytes of [A-Za-z0-9._:-]. While the group holds its cap, this waits and waiters of
    /// other groups go first.
    #[arg(long)]
    pub group: Option<String>,
    /// Session TTL: how soon the permits come back if this process dies or is cut off.
    #[arg(long, default_value = TTL_DEFAULT, value_parser = parse_duration)]
    pub ttl: Duration,
    /// Give up waiting after this long and exit with 75 (default: wait as long as it takes).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Do not print the queue position on stderr while waiting.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

impl PermitArgs {
    /// The acquire options these flags ask for.
    pub(crate) fn options(&self, max_hold: Option<Duration>) -> AcquireOptions {
        AcquireOptions {
            capacity: self.capacity,
            max_hold,
            timeout: self.timeout,
            ephemeral: !self.keep,
            group: self.group.clone(),
        }
    }

    /// The hold of these permits by a session named `name` (default: `permit COMMAND`, the
    /// semaphore and this process id), running `job` if any.
    pub(crate) fn hold(&self, command: &str, name: Option<String>, job: Option<Job>) -> Hold {
        let name = name
            .unwrap_or_else(|| format!("permit {command} {} (pid {})", self.semaphore, std::process::id()));
        Hold {
            what: format!("{} permit(s) of semaphore {}", self.permits, self.semaphore),
            ttl: self.ttl,
            session_name: name,
            timeout: self.timeout,
            quiet: self.quiet,
            job,
        }
    }
}

/// The stop budget of a command run while holding (`--kill-after`): at most a third of the TTL,
/// by default a quarter. Keepalives go out every third of the TTL, so a healthy session always
/// has about two thirds of it left; a budget within a third starts stopping the command only
/// when keepalives have failed for a while, and leaves it dead by the local deadline, which is
/// never later than the server's. A larger value is clamped, with a message.
pub(crate) fn stop_budget(ttl: Duration, kill_after: Option<Duration>) -> Duration {
    let most = ttl / 3;
    match kill_after {
        None => ttl / 4,
        Some(asked) if asked > most => {
            eprintln!(
                "permit: --kill-after {} does not fit in --ttl {}: the command must be dead before the session can expire on the server; using {} (a third of the TTL)",
                humantime::format_duration(asked),
                humantime::format_duration(ttl),
                humantime::format_duration(Duration::from_millis(most.as_millis() as u64)),
            );
            most
        }
        Some(asked) => asked,
    }
}

/// Runs `permit run`.
pub(crate) async fn run(client: &Client, args: RunArgs) -> anyhow::Result<i32> {
    let options = args.permit.options(args.max_hold);
    let job = Job {
        command: args.command,
        kill_after: stop_budget(args.permit.ttl, args.kill_after),
        foreground: args.foreground,
        pass_token: args.pass_token,
        deadline: tokio::time::Instant::now(),
        stdin: None,
    };
    let hold = args.permit.hold("run", args.name, Some(job));
    let (semaphore, permits) = (args.permit.semaphore, args.permit.permits);
    hold.run(client, |session| async move {
        let permit = session.acquire_with(&semaphore, permits, &options).await?;
        Ok(permit.map(|permit| {
            let env = vec![
                ("PERMIT_SEMAPHORE", semaphore.clone()),
                ("PERMIT_PERMITS", permit.permits().to_string()),
            ];
            (Held::Permit(permit), env)
        }))
    })
    .await
}

/// What `run` and `elect` hold while the command runs.
pub(crate) enum Held {
    Permit(Permit),
    Leadership(Leadership),
}

impl Held {
    fn token(&self) -> u64 {
        match self {
            Held::Permit(permit) => permit.token(),
            Held::Leadership(leadership) => leadership.token(),
        }
    }

    /// Resolves when the hold is lost: the client's own signs (the session expired, `--max-hold`
    /// passed), or the server no longer counting it ([`ended_on_server`]), which sets `ended`.
    fn lost(&self, client: &Client, ended: &Arc<AtomicBool>) -> impl Future<Output = ()> + Send + 'static {
        let (own, watched): (Pin<Box<dyn Future<Output = ()> + Send>>, _) = match self {
            Held::Permit(permit) => (
                Box::pin(permit.lost()),
                Watched::Semaphore {
                    name: permit.name().to_owned(),
                    session: permit.session().id().to_owned(),
                    token: permit.token(),
                },
            ),
            Held::Leadership(leadership) => (
                Box::pin(leadership.lost()),
                Watched::Election {
                    name: leadership.name().to_owned(),
                    session: leadership.session().id().to_owned(),
                    token: leadership.token(),
                },
            ),
        };
        let (client, ended) = (client.clone(), ended.clone());
        async move {
            tokio::select! {
                () = own => {}
                () = ended_on_server(client, watched) => ended.store(true, Ordering::Relaxed),
            }
        }
    }

    async fn release(self) -> permit_client::Result<()> {
        match self {
            Held::Permit(permit) => permit.release().await,
            Held::Leadership(leadership) => leadership.resign().await,
        }
    }
}

/// A hold as the server shows it: a holder of a semaphore, or an election's leader.
enum Watched {
    Semaphore { name: String, session: String, token: u64 },
    Election { name: String, session: String, token: u64 },
}

/// How long one blocking read of [`ended_on_server`] waits for a change.
const WATCH_WAIT: Duration = Duration::from_secs(30);
/// How long [`ended_on_server`] waits after a failed read before it asks again (an outage is
/// the session deadline's business, not this watch's).
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Resolves when the server no longer shows the hold: an operator revoked it (`permit revoke`)
/// or released it for the session (`permit release --session`), or the semaphore went away.
/// The session lives on then, so neither keepalives nor the local deadline would tell; like
/// Consul's `lock`, which watches its key, this follows the object with blocking reads.
async fn ended_on_server(client: Client, watched: Watched) {
    let mut index = 0;
    loop {
        let read = match &watched {
            Watched::Semaphore { name, session, token } => {
                client.watch_semaphore(name, index, WATCH_WAIT).await.map(|view| {
                    let holds = view.holders.iter().any(|h| h.session == *session && h.token == *token);
                    (view.index, holds)
                })
            }
            Watched::Election { name, session, token } => {
                client.watch_election(name, index, WATCH_WAIT).await.map(|view| {
                    let leads =
                        view.leader.as_ref().is_some_and(|l| l.session == *session && l.token == *token);
                    (view.index, leads)
                })
            }
        };
        match read {
            Ok((_, false)) => return,
            Ok((next, true)) => index = next,
            Err(error) => match error.code() {
                Some(ErrorCode::SemaphoreNotFound) => return,
                // A token that may hold but not read: nothing to watch with; the other signs stay.
                Some(ErrorCode::PermissionDenied) => std::future::pending().await,
                _ => tokio::time::sleep(WATCH_RETRY).await,
            },
        }
    }
}

/// The shared flow of `run`, `elect` and `lock`.
pub(crate) struct Hold {
    /// What is held, for messages ("2 permit(s) of semaphore db").
    pub what: String,
    pub ttl: Duration,
    pub session_name: String,
    pub timeout: Option<Duration>,
    /// Do not print the queue position while waiting (`--quiet`).
    pub quiet: bool,
    /// The command to run while holding; `None` (`permit lock`) prints the token and holds until
    /// SIGINT or SIGTERM.
    pub job: Option<Job>,
}

/// A grant and the environment variables that describe it.
pub(crate) type Grant = (Held, Vec<(&'static str, String)>);

/// After a lost hold, how long `permit` still tries to release and close the session before it
/// exits: the server may be unreachable (that may be why the hold was lost), and the session
/// expires on its own anyway.
const LOST_CLEANUP_TIMEOUT: Duration = Duration::from_secs(1);

/// How the holding phase ended.
struct Outcome {
    /// The exit code.
    code: i32,
    /// Whether the hold was lost (or may have been: the session's local deadline passed).
    lost: bool,
}

impl Hold {
    /// Opens a session, waits for `acquire` (interruptible by SIGINT/SIGTERM), runs the command
    /// while holding (or holds until a signal), then releases and closes the session. Returns the
    /// exit code.
    pub async fn run<F, Fut>(self, client: &Client, acquire: F) -> anyhow::Result<i32>
    where
        F: FnOnce(Session) -> Fut,
        Fut: Future<Output = permit_client::Result<Option<Grant>>>,
    {
        let mut signals = Signals::catch().context("cannot catch signals")?;
        let options = SessionOptions { ttl: self.ttl, name: Some(self.session_name.clone()) };
        let session = client.session_with(options).await.context("cannot open a session")?;
        // Subscribed before the wait starts: the waiter asks every 5 s only while somebody
        // follows the position (a subscription made later would wait for a 30 s answer).
        let progress = (!self.quiet).then(|| {
            let positions = session.watch_queue_position();
            tokio::spawn(report_progress(session.clone(), positions, self.what.clone()))
        });
        let granted = tokio::select! {
            granted = acquire(session.clone()) => granted,
            signal = signals.recv() => {
                eprintln!("permit: interrupted by signal {signal} while waiting for {}", self.what);
                close(session).await;
                return Ok(EXIT_SIGNAL_BASE + signal);
            }
        };
        if let Some(progress) = progress {
            progress.abort();
        }
        let (held, mut env) = match granted {
            Ok(Some(grant)) => grant,
            Ok(None) => {
                let waited = self.timeout.map(humantime::format_duration);
                eprintln!(
                    "permit: timed out after {} waiting for {}",
                    waited.map_or_else(String::new, |w| w.to_string()),
                    self.what
                );
                close(session).await;
                return Ok(EXIT_TIMEOUT);
            }
            Err(permit_client::Error::SessionExpired) => {
                // The wait rode out what it could (an outage is retried, with the queue place,
                // until the session's local deadline): the session, and the place, are lost.
                eprintln!(
                    "permit: lost the session while waiting for {} (the server was unreachable, or no keepalive was acknowledged, until the session's deadline: --ttl {}); the queue place is gone",
                    self.what,
                    humantime::format_duration(self.ttl)
                );
                if tokio::time::timeout(LOST_CLEANUP_TIMEOUT, close(session)).await.is_err() {
                    eprintln!("permit: could not close the session in time; it expires after its TTL");
                }
                return Ok(EXIT_LOST);
            }
            Err(error) => {
                close(session).await;
                return Err(error).with_context(|| format!("cannot acquire {}", self.what));
            }
        };
        env.push(("PERMIT_TOKEN", held.token().to_string()));
        env.push(("PERMIT_SESSION", session.id().to_owned()));
        let outcome = match &self.job {
            Some(job) => self.supervise(client, job, &session, &held, &env, &mut signals).await,
            None => Ok(self.hold_until_signal(client, &session, &held, &mut signals).await),
        };
        // Do not wait on retries against a server that may be gone: after a lost hold, try for
        // a moment; otherwise at most until the session would expire anyway.
        let lost = outcome.as_ref().is_ok_and(|outcome| outcome.lost);
        let left = session.deadline().saturating_duration_since(tokio::time::Instant::now());
        let bound = if lost { LOST_CLEANUP_TIMEOUT } else { left.max(LOST_CLEANUP_TIMEOUT) };
        if tokio::time::timeout(bound, self.clean_up(session, held)).await.is_err() {
            eprintln!("permit: could not release and close the session in time; it expires after its TTL");
        }
        outcome.map(|outcome| outcome.code)
    }

    /// Releases what is held and closes the session, reporting (not failing on) errors.
    async fn clean_up(&self, session: Session, held: Held) {
        if session.state() != SessionState::Expired {
            if let Err(error) = held.release().await {
                eprintln!("permit: cannot release {} ({error}); closing the session frees it", self.what);
            }
        }
        close(session).await;
    }

    async fn supervise(
        &self,
        client: &Client,
        job: &Job,
        session: &Session,
        held: &Held,
        env: &[(&str, String)],
        signals: &mut Signals,
    ) -> anyhow::Result<Outcome> {
        let job = &Job { deadline: session.deadline(), ..job.clone() };
        let running = match supervise::spawn(job, env).await {
            Ok(running) => running,
            Err(code) => return Ok(Outcome { code, lost: false }),
        };
        let ended = Arc::new(AtomicBool::new(false));
        let on_lost = || {
            eprintln!(
                "permit: lost {} ({}); stopping the command with SIGTERM",
                self.what,
                why_lost(session, held, &ended)
            );
        };
        // Stop when the hold is lost, or `kill_after` before the local deadline when keepalives
        // are not acknowledged (SIGKILL then comes at the deadline itself).
        let lost = held.lost(client, &ended);
        let due = stop_due(session.clone(), job.kill_after);
        let stop = async move {
            tokio::select! {
                () = lost => {}
                () = due => {}
            }
        };
        let deadline = || session.deadline();
        let ended =
            running.supervise(signals, stop, on_lost, deadline).await.context("waiting for the command")?;
        // Killed by the watchdog while `permit` was stopped: the deadline has passed.
        let lapsed = tokio::time::Instant::now() >= session.deadline();
        Ok(if ended.lost || lapsed {
            Outcome { code: EXIT_LOST, lost: true }
        } else {
            Outcome { code: ended.code, lost: false }
        })
    }

    /// `permit lock`: prints the token (one line on stdout, for scripts), then holds until a
    /// signal (exit 0) or until the hold is lost (exit 76).
    async fn hold_until_signal(
        &self,
        client: &Client,
        session: &Session,
        held: &Held,
        signals: &mut Signals,
    ) -> Outcome {
        let ended = Arc::new(AtomicBool::new(false));
        // Not println!: a closed stdout (`permit lock x | head -0`) must not end the hold.
        if let Err(error) = writeln!(std::io::stdout(), "{}", held.token()) {
            eprintln!("permit: cannot print the token ({error})");
        }
        eprintln!(
            "permit: holding {} (token {}, session {}); Ctrl-C or SIGTERM releases",
            self.what,
            held.token(),
            session.id()
        );
        tokio::select! {
            _ = signals.recv() => Outcome { code: 0, lost: false },
            () = held.lost(client, &ended) => {
                eprintln!("permit: lost {} ({})", self.what, why_lost(session, held, &ended));
                Outcome { code: EXIT_LOST, lost: true }
            }
        }
    }
}

/// How early the server's end of a hold may be seen before this process's own `--max-hold`
/// deadline and still be that deadline's doing: the server counts it from the grant, the client
/// from its request, and a loaded machine runs the client's timer late.
const MAX_HOLD_SEEN_EARLY: Duration = Duration::from_millis(250);

/// Why a hold was lost, for messages.
fn why_lost(session: &Session, held: &Held, ended_on_server: &AtomicBool) -> &'static str {
    let max_hold_due = match held {
        Held::Permit(permit) => {
            permit.deadline() < session.deadline()
                && permit.deadline() <= tokio::time::Instant::now() + MAX_HOLD_SEEN_EARLY
        }
        Held::Leadership(_) => false,
    };
    if ended_on_server.load(Ordering::Relaxed) && !max_hold_due {
        return "the server ended it: revoked (permit revoke) or released for the session, which lives on";
    }
    match session.state() {
        SessionState::Expired => "the session expired, or no keepalive was acknowledged before its deadline",
        SessionState::Jeopardy => {
            "no keepalive was acknowledged, and the session's deadline is within --kill-after; it may expire"
        }
        SessionState::Alive => "--max-hold passed",
    }
}

/// Resolves `kill_after` before the session's local deadline, which acknowledged keepalives
/// keep moving on (it only moves later).
pub(crate) async fn stop_due(session: Session, kill_after: Duration) {
    loop {
        let at = session.deadline().checked_sub(kill_after).unwrap_or_else(tokio::time::Instant::now);
        tokio::time::sleep_until(at).await;
        if session.deadline().checked_sub(kill_after).is_none_or(|at| tokio::time::Instant::now() >= at) {
            return;
        }
    }
}

/// Prints the queue position on stderr when the wait starts and when it changes, at most once a
/// second, and once when the servers cannot be reached (the wait goes on until the session's
/// deadline). Runs until aborted.
async fn report_progress(
    session: Session,
    mut positions: tokio::sync::watch::Receiver<Option<permit_client::QueuePosition>>,
    what: String,
) {
    const EVERY: Duration = Duration::from_secs(1);
    let mut state = session.watch_state();
    let mut shown = None;
    let mut warned = false;
    loop {
        let position = positions.borrow_and_update().as_ref().map(|place| place.position);
        if position.is_some() && position != shown {
            eprintln!("permit: waiting for {what}: position {} in the queue", position.unwrap_or_default());
            shown = position;
        }
        let jeopardy = *state.borrow_and_update() == SessionState::Jeopardy;
        if jeopardy && !warned {
            let left = session.deadline().saturating_duration_since(tokio::time::Instant::now());
            eprintln!(
                "permit: cannot reach the server; still waiting for {what}, keeping the queue place for up to {}",
                humantime::format_duration(Duration::from_millis(left.as_millis() as u64))
            );
        }
        warned = jeopardy;
        tokio::time::sleep(EVERY).await;
        tokio::select! {
            changed = positions.changed() => if changed.is_err() { return },
            changed = state.changed() => if changed.is_err() { return },
        }
    }
}

/// Closes the session, reporting (not failing on) errors: it expires on its own anyway.
async fn close(session: Session) {
    if let Err(error) = session.close().await {
        eprintln!("permit: cannot close the session ({error}); it expires after its TTL");
    }
}
