//! Operator commands: `permit revoke`, `permit release`, `permit validate`, `permit health` and
//! `permit elections`, so that a stuck holder can be ended, a token checked and a node's health
//! awaited without the dashboard or curl.

use std::time::{Duration, Instant};

use anyhow::Context;
use permit_client::Client;

use crate::{parse_duration, table, EXIT_NOT_CURRENT, EXIT_TIMEOUT, EXIT_UNAVAILABLE};

/// The exit codes of `permit revoke` and `permit release`, printed at the end of their `--help`.
pub const EXIT_CODES_REVOKE: &str = "\
Exit codes:
  0   done (also when the session held nothing there: revoking and releasing are idempotent)
  1   the server refused the request (for example session_not_found or permission_denied) or
      answered something unexpected (printed on stderr)
  64  a malformed --server address or access token (the message says which; nothing was sent)
  74  could not reach the server, or no server could serve (no leader, shutting down)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// The exit codes of `permit validate`, printed at the end of its `--help`.
pub const EXIT_CODES_VALIDATE: &str = "\
Exit codes:
  0   the token is current: a live holder of the semaphore carries it
  3   the token is not current (released, revoked, expired or never issued)
  1   the server refused the request or answered something unexpected (printed on stderr)
  64  a malformed --server address or access token (the message says which; nothing was sent)
  74  could not reach the server, or no server could serve (no leader, shutting down)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// The exit codes of `permit health`, printed at the end of its `--help`.
pub const EXIT_CODES_HEALTH: &str = "\
Exit codes:
  0   the node is healthy (status ok: a member that knows a leader and can write its data dir)
  1   the server answered something unexpected (printed on stderr)
  64  a malformed --server address or access token (the message says which; nothing was sent)
  69  the node answered but is not healthy (status degraded; the reason is printed)
  74  could not reach the server
  75  --wait: the node was not healthy before --timeout passed (the last state is printed)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// `permit revoke [--election] <name> <session>`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_REVOKE)]
pub struct RevokeArgs {
    /// The semaphore (or, with --election, the election).
    pub name: String,
    /// The session whose hold (or leadership, or queue place) to end; `permit show NAME` and
    /// `permit sessions` list them. The session itself stays alive.
    pub session: String,
    /// End a leadership or candidacy in the election NAME instead of a semaphore hold.
    #[arg(long)]
    pub election: bool,
}

/// `permit release [--election] <name> --session <id>`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_REVOKE)]
pub struct ReleaseArgs {
    /// The semaphore (or, with --election, the election to resign from).
    pub name: String,
    /// The session that holds it (or waits for it).
    #[arg(long)]
    pub session: String,
    /// Resign the session's leadership or candidacy in the election NAME.
    #[arg(long)]
    pub election: bool,
}

/// `permit validate <semaphore> <token>`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_VALIDATE)]
pub struct ValidateArgs {
    /// The semaphore.
    pub semaphore: String,
    /// The fencing token to check (PERMIT_TOKEN of `permit run`, printed by `permit lock`).
    pub token: u64,
}

/// `permit health [--wait [--timeout D]] [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_HEALTH)]
pub struct HealthArgs {
    /// Wait until the node is healthy (reachable, a member, with a known leader), polling twice
    /// a second, at most --timeout.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits.
    #[arg(long, default_value = "30s", value_parser = parse_duration, requires = "wait")]
    pub timeout: Duration,
    /// Print the health report as JSON, as `GET /v1/health` returns it.
    #[arg(long)]
    pub json: bool,
}

/// `permit elections [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct ElectionsArgs {
    /// Print a JSON array of `{name, leader, candidates, index}`.
    #[arg(long)]
    pub json: bool,
}

/// Runs `permit revoke`.
pub(crate) async fn revoke(client: &Client, args: RevokeArgs) -> anyhow::Result<i32> {
    let (object, answer) = if args.election {
        ("election", client.revoke_election(&args.name, &args.session).await)
    } else {
        ("semaphore", client.revoke(&args.name, &args.session).await)
    };
    let answer =
        answer.with_context(|| format!("cannot revoke {object} {} of {}", args.name, args.session))?;
    if args.election {
        println!("revoked election {} of session {}", args.name, args.session);
    } else {
        println!("revoked {} permits of {} from session {}", answer.released, args.name, args.session);
    }
    Ok(0)
}

/// Runs `permit release`.
pub(crate) async fn release(client: &Client, args: ReleaseArgs) -> anyhow::Result<i32> {
    if args.election {
        client
            .resign(&args.name, &args.session)
            .await
            .with_context(|| format!("cannot resign election {} for session {}", args.name, args.session))?;
        println!("session {} resigned election {}", args.session, args.name);
    } else {
        let answer = client
            .release(&args.name, &args.session)
            .await
            .with_context(|| format!("cannot release {} for session {}", args.name, args.session))?;
        println!("released {} permits of {} for session {}", answer.released, args.name, args.session);
    }
    Ok(0)
}

/// Runs `permit validate`: exit 0 when current, [`EXIT_NOT_CURRENT`] otherwise.
pub(crate) async fn validate(client: &Client, args: ValidateArgs) -> anyhow::Result<i32> {
    let answer = client
        .validate(&args.semaphore, args.token)
        .await
        .with_context(|| format!("cannot validate token {} of {}", args.token, args.semaphore))?;
    match answer.session {
        Some(session) if answer.valid => {
            println!("current: token {} of {} is held by session {session}", args.token, args.semaphore);
            Ok(0)
        }
        _ => {
            println!("not current: no holder of {} carries token {}", args.semaphore, args.token);
            Ok(EXIT_NOT_CURRENT)
        }
    }
}

/// Pause between two health polls of `permit health --wait`.
const HEALTH_POLL: Duration = Duration::from_millis(500);

/// Runs `permit health`.
pub(crate) async fn health(client: &Client, args: HealthArgs) -> anyhow::Result<i32> {
    let started = Instant::now();
    // Bounded by --timeout: every pass either returns or sleeps, and with --wait a pass's
    // request is cut off at the time left (without --wait, one pass returns).
    loop {
        let answer = if args.wait {
            // A hung node must not hold --wait past its --timeout (one request may take 10 s).
            let left = args.timeout.saturating_sub(started.elapsed()).max(HEALTH_POLL);
            match tokio::time::timeout(left, client.health()).await {
                Ok(answer) => answer.map_err(anyhow::Error::from),
                Err(_) => Err(anyhow::anyhow!("no answer within {}", humantime::format_duration(left))),
            }
        } else {
            client.health().await.map_err(anyhow::Error::from)
        };
        let timed_out = started.elapsed() >= args.timeout;
        match answer {
            Ok(health) if health.status == "ok" => {
                print_health(&health, args.json)?;
                return Ok(0);
            }
            Ok(health) if !args.wait || timed_out => {
                print_health(&health, args.json)?;
                return Ok(if args.wait { EXIT_TIMEOUT } else { EXIT_UNAVAILABLE });
            }
            Err(error) if !args.wait => return Err(error.context("cannot read the node's health")),
            Err(error) if timed_out => {
                eprintln!(
                    "permit: not healthy within {}: {error:#}",
                    humantime::format_duration(args.timeout)
                );
                return Ok(EXIT_TIMEOUT);
            }
            Ok(_) | Err(_) => {}
        }
        let left = args.timeout.saturating_sub(started.elapsed());
        tokio::time::sleep(HEALTH_POLL.min(left)).await;
    }
}

fn print_health(health: &permit_client::wire::Health, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(health)?);
        return Ok(());
    }
    let leader = health.raft_leader.map_or_else(|| "none".to_owned(), |id| id.to_string());
    let mut line = format!(
        "{}: node {}, {}, leader {leader}, term {}, applied {}",
        health.status, health.node_id, health.raft_role, health.raft_term, health.applied_index
    );
    if let Some(reason) = health.reason {
        let reason = serde_json::to_value(reason)?;
        line.push_str(&format!(", not ready: {}", reason.as_str().unwrap_or_default()));
    }
    if let Some(detail) = &health.detail {
        line.push_str(&format!(" ({detail})"));
    }
    println!("{line}");
    Ok(())
}

/// Runs `permit elections`.
pub(crate) async fn elections(client: &Client, args: ElectionsArgs) -> anyhow::Result<i32> {
    let elections = client.all_elections().await.context("cannot list elections")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&elections)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = elections
        .iter()
        .map(|e| match &e.leader {
            Some(leader) => vec![
                e.name.clone(),
                leader.value.clone(),
                leader.session.clone(),
                leader.token.to_string(),
                format!("{}ms", leader.held_ms),
                e.candidates.to_string(),
            ],
            None => {
                vec![e.name.clone(), "-".into(), "-".into(), "-".into(), "-".into(), e.candidates.to_string()]
            }
        })
        .collect();
    print!("{}", table::format(&["NAME", "LEADER", "SESSION", "TOKEN", "HELD", "CANDIDATES"], &rows));
    Ok(0)
}
