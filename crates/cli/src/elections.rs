//! `permit elect` (run a command while leading), `permit leader` (who leads, once or as it
//! changes) and `permit proclaim` (the leader publishes a new value).

use std::ffi::OsString;
use std::io::Write as _;
use std::time::Duration;

use anyhow::Context;
use permit_client::wire::ProclaimRequest;
use permit_client::{Client, ErrorCode};

use crate::run::{Held, Hold};
use crate::supervise::{Job, Signals};
use crate::{
    parse_duration, EXIT_CODES_ELECT, EXIT_CODES_LEADER, EXIT_NOT_LEADING, EXIT_NO_LEADER, TTL_DEFAULT,
};

/// The exit codes of `permit proclaim`, printed at the end of its `--help`.
pub const EXIT_CODES_PROCLAIM: &str = "\
Exit codes:
  0   published: the session leads and its value is VALUE now (its token is unchanged)
  3   the session does not lead the election (another does, or none): nothing changed
  1   the server refused the request (for example session_not_found, invalid_argument, or
      feature_unavailable while a cluster member runs an older build) or answered something
      unexpected (printed on stderr)
  64  a malformed --server address or access token (the message says which; nothing was sent)
  74  could not reach the server, or no server could serve (no leader, shutting down)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// `permit proclaim <name> <value> [--session ID]`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_PROCLAIM)]
pub struct ProclaimArgs {
    /// The election.
    pub election: String,
    /// The new value to publish (at most 4096 bytes).
    pub value: String,
    /// The leading session. Inside `permit elect`'s command, PERMIT_SESSION is that
    /// leadership's session (and PERMIT_ELECTION its election); with `--auth`, the command needs
    /// the token that created it (`permit elect --pass-token`).
    #[arg(long, env = "PERMIT_SESSION")]
    pub session: String,
}

/// `permit elect <name> --value V [--ttl 10s] [--timeout D] -- CMD ARGS...`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_ELECT)]
pub struct ElectArgs {
    /// The election: 1-128 bytes of [A-Za-z0-9._:-].
    pub election: String,
    /// The value to publish while leading (for example this host's address), shown by
    /// `permit leader`.
    #[arg(long)]
    pub value: String,
    /// Session TTL: how soon leadership passes on if this process dies or is cut off.
    #[arg(long, default_value = TTL_DEFAULT, value_parser = parse_duration)]
    pub ttl: Duration,
    /// Give up campaigning after this long and exit with 75 (default: wait as long as it takes).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// The stop budget: the command gets SIGTERM this long before the session's local deadline
    /// when no keepalive was acknowledged (or at once when leadership is lost), and SIGKILL at
    /// the deadline, so that it is dead before the server can elect someone else. At most a
    /// third of --ttl (a larger value is clamped, with a message); default a quarter.
    #[arg(long, value_parser = parse_duration)]
    pub kill_after: Option<Duration>,
    /// Do not print the position among the candidates on stderr while waiting.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Keep the command in this terminal's process group and signal only it.
    #[arg(long)]
    pub foreground: bool,
    /// Leave PERMIT_AUTH_TOKEN in the command's environment; by default it is removed, so that
    /// the command (and what it runs or logs) does not get `permit`'s token.
    #[arg(long)]
    pub pass_token: bool,
    /// Session name, shown with the leader in the server's answers (default: `permit elect`, the
    /// election and this process id).
    #[arg(long)]
    pub name: Option<String>,
    /// The command and its arguments, after `--`. It sees PERMIT_TOKEN (the leadership's
    /// fencing token), PERMIT_ELECTION and PERMIT_SESSION, and not PERMIT_AUTH_TOKEN (see
    /// --pass-token).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

/// `permit leader <name> [--json] [--watch]`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_LEADER)]
pub struct LeaderArgs {
    /// The election.
    pub election: String,
    /// Print the election as JSON (`{name, leader: {session, value, token} | null, ...}`); with
    /// --watch, one object per line.
    #[arg(long)]
    pub json: bool,
    /// Keep running and print the leader again each time it changes, or publishes a new value
    /// (an empty line when nobody leads), until Ctrl-C or SIGTERM.
    #[arg(long)]
    pub watch: bool,
}

/// How long one blocking read of `permit leader --watch` asks the server to wait.
const WATCH_WAIT: Duration = Duration::from_secs(30);

/// Runs `permit elect`.
pub(crate) async fn elect(client: &Client, args: ElectArgs) -> anyhow::Result<i32> {
    let name =
        args.name.unwrap_or_else(|| format!("permit elect {} (pid {})", args.election, std::process::id()));
    let hold = Hold {
        what: format!("leadership of election {}", args.election),
        ttl: args.ttl,
        session_name: name,
        timeout: args.timeout,
        quiet: args.quiet,
        job: Some(Job {
            command: args.command,
            kill_after: crate::run::stop_budget(args.ttl, args.kill_after),
            foreground: args.foreground,
            pass_token: args.pass_token,
            deadline: tokio::time::Instant::now(),
            stdin: None,
        }),
    };
    let (election, value, timeout) = (args.election, args.value, args.timeout);
    hold.run(client, |session| async move {
        let leadership = match timeout {
            Some(timeout) => session.campaign_timeout(&election, &value, timeout).await?,
            None => Some(session.campaign(&election, &value).await?),
        };
        Ok(leadership
            .map(|leadership| (Held::Leadership(leadership), vec![("PERMIT_ELECTION", election.clone())])))
    })
    .await
}

/// Runs `permit leader`: prints the leader's value (or the election as JSON), once or, with
/// `--watch`, at every change.
pub(crate) async fn leader(client: &Client, args: LeaderArgs) -> anyhow::Result<i32> {
    if args.watch {
        return watch_leader(client, &args).await;
    }
    let view = client
        .get_election(&args.election)
        .await
        .with_context(|| format!("cannot read election {}", args.election))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    }
    let Some(leader) = view.leader else {
        if !args.json {
            eprintln!("permit: nobody leads {}", args.election);
        }
        return Ok(EXIT_NO_LEADER);
    };
    if !args.json {
        println!("{}", leader.value);
        eprintln!("(session {}, token {})", leader.session, leader.token);
    }
    Ok(0)
}

/// Runs `permit leader --watch`: prints the leader, then again whenever it changes (another
/// session, or a new term of the same session), using the server's blocking reads, until a
/// signal.
async fn watch_leader(client: &Client, args: &LeaderArgs) -> anyhow::Result<i32> {
    let mut signals = Signals::catch().context("cannot catch signals")?;
    let read_failed = || format!("cannot read election {}", args.election);
    let mut view = tokio::select! {
        view = client.get_election(&args.election) => view.with_context(read_failed)?,
        _ = signals.recv() => return Ok(0),
    };
    let mut printed = None;
    loop {
        // A new value of the same leadership (a proclaim) is a change too.
        let leader =
            view.leader.as_ref().map(|leader| (leader.session.clone(), leader.token, leader.value.clone()));
        if printed.as_ref() != Some(&leader) {
            let line = if args.json {
                serde_json::to_string(&view)?
            } else {
                view.leader.as_ref().map_or_else(String::new, |leader| leader.value.clone())
            };
            // Not println!: a reader that went away ends the watch with an error, not a panic.
            writeln!(std::io::stdout(), "{line}").context("cannot write to stdout")?;
            printed = Some(leader);
        }
        view = tokio::select! {
            next = client.watch_election(&args.election, view.index, WATCH_WAIT) => next.with_context(read_failed)?,
            _ = signals.recv() => return Ok(0),
        };
    }
}

/// Runs `permit proclaim`: 0 when published, [`EXIT_NOT_LEADING`] when the session does not lead.
pub(crate) async fn proclaim(client: &Client, args: ProclaimArgs) -> anyhow::Result<i32> {
    let request = ProclaimRequest { session: args.session.clone(), value: args.value };
    match client.proclaim(&args.election, &request).await {
        Ok(leader) => {
            println!(
                "session {} leads {} with value {} (token {})",
                leader.session, args.election, leader.value, leader.token
            );
            Ok(0)
        }
        Err(error) if error.code() == Some(ErrorCode::NotLeader) => {
            eprintln!("session {} does not lead election {}: nothing changed", args.session, args.election);
            Ok(EXIT_NOT_LEADING)
        }
        Err(error) => Err(error).with_context(|| {
            format!("cannot proclaim in election {} for session {}", args.election, args.session)
        }),
    }
}
