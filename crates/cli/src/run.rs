//! `permit run`: hold permits of a semaphore while a command runs; and the flow it shares with
//! `permit elect` and `permit lock` (open a session, wait for the grant, run, stop on loss,
//! release, close).

use std::ffi::OsString;
use std::future::Future;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Context;
use permit_client::{AcquireOptions, Client, Leadership, Permit, Session, SessionOptions, SessionState};

use crate::supervise::{self, Job, Signals};
use crate::{parse_duration, EXIT_CODES_RUN, EXIT_LOST, EXIT_SIGNAL_BASE, EXIT_TIMEOUT, TTL_DEFAULT};

/// `permit run <semaphore> [-n PERMITS] [--capacity N] [--ttl 10s] [--timeout 30s] -- CMD ARGS...`
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
    /// When the hold is lost, wait this long after SIGTERM before sending SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub kill_after: Duration,
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
    /// Session TTL: how soon the permits come back if this process dies or is cut off.
    #[arg(long, default_value = TTL_DEFAULT, value_parser = parse_duration)]
    pub ttl: Duration,
    /// Give up waiting after this long and exit with 75 (default: wait as long as it takes).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
}

impl PermitArgs {
    /// The acquire options these flags ask for.
    pub(crate) fn options(&self, max_hold: Option<Duration>) -> AcquireOptions {
        AcquireOptions { capacity: self.capacity, max_hold, timeout: self.timeout, ephemeral: !self.keep }
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
            job,
        }
    }
}

/// Runs `permit run`.
pub(crate) async fn run(client: &Client, args: RunArgs) -> anyhow::Result<i32> {
    let options = args.permit.options(args.max_hold);
    let job = Job {
        command: args.command,
        kill_after: args.kill_after,
        foreground: args.foreground,
        pass_token: args.pass_token,
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

    fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let lost: std::pin::Pin<Box<dyn Future<Output = ()> + Send>> = match self {
            Held::Permit(permit) => Box::pin(permit.lost()),
            Held::Leadership(leadership) => Box::pin(leadership.lost()),
        };
        lost
    }

    async fn release(self) -> permit_client::Result<()> {
        match self {
            Held::Permit(permit) => permit.release().await,
            Held::Leadership(leadership) => leadership.resign().await,
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
        let granted = tokio::select! {
            granted = acquire(session.clone()) => granted,
            signal = signals.recv() => {
                eprintln!("permit: interrupted by signal {signal} while waiting for {}", self.what);
                close(session).await;
                return Ok(EXIT_SIGNAL_BASE + signal);
            }
        };
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
            Err(error) => {
                close(session).await;
                return Err(error).with_context(|| format!("cannot acquire {}", self.what));
            }
        };
        env.push(("PERMIT_TOKEN", held.token().to_string()));
        env.push(("PERMIT_SESSION", session.id().to_owned()));
        let outcome = match &self.job {
            Some(job) => self.supervise(job, &session, &held, &env, &mut signals).await,
            None => Ok(self.hold_until_signal(&session, &held, &mut signals).await),
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
        job: &Job,
        session: &Session,
        held: &Held,
        env: &[(&str, String)],
        signals: &mut Signals,
    ) -> anyhow::Result<Outcome> {
        let running = match supervise::spawn(job, env).await {
            Ok(running) => running,
            Err(code) => return Ok(Outcome { code, lost: false }),
        };
        let on_lost = || {
            eprintln!(
                "permit: lost {} ({}); stopping the command with SIGTERM",
                self.what,
                why_lost(session)
            );
        };
        let ended =
            running.supervise(signals, held.lost(), on_lost).await.context("waiting for the command")?;
        Ok(if ended.lost {
            Outcome { code: EXIT_LOST, lost: true }
        } else {
            Outcome { code: ended.code, lost: false }
        })
    }

    /// `permit lock`: prints the token (one line on stdout, for scripts), then holds until a
    /// signal (exit 0) or until the hold is lost (exit 76).
    async fn hold_until_signal(&self, session: &Session, held: &Held, signals: &mut Signals) -> Outcome {
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
            () = held.lost() => {
                eprintln!("permit: lost {} ({})", self.what, why_lost(session));
                Outcome { code: EXIT_LOST, lost: true }
            }
        }
    }
}

/// Why a hold was lost, for messages.
fn why_lost(session: &Session) -> &'static str {
    match session.state() {
        SessionState::Expired => "the session expired, or no keepalive was acknowledged before its deadline",
        _ => "--max-hold passed",
    }
}

/// Closes the session, reporting (not failing on) errors: it expires on its own anyway.
async fn close(session: Session) {
    if let Err(error) = session.close().await {
        eprintln!("permit: cannot close the session ({error}); it expires after its TTL");
    }
}
