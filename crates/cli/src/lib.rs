//! The client commands of the `permit` binary: `run`, `elect`, `lock`, `take`, `ls`, `show`,
//! `set-capacity`, `delete`, `leader`, `cluster`, `queue` (`push`, `ls`, `show`, `work`), and the
//! operator commands `revoke`, `release`, `validate`, `health` and `elections`.
//!
//! The binary flattens [`ClientCommand`] into its parser next to `serve`, owns the global
//! `--server` option (a comma-separated list, env `PERMIT_SERVER`), the TLS options
//! ([`TlsArgs`]: `--ca-file`, `--client-cert`, `--client-key`) and `--auth-token`, calls
//! [`execute`] with them, and maps an error to an exit code with [`exit_code_of`]. Every server
//! interaction goes through `permit-client`.
//!
//! # Exit codes
//!
//! Each command's `--help` ends with its own table ([`EXIT_CODES_RUN`], [`EXIT_CODES_ELECT`],
//! [`EXIT_CODES_LOCK`], [`EXIT_CODES_TAKE`], [`EXIT_CODES_LEADER`], [`EXIT_CODES_WORK`], [`EXIT_CODES_PUSH`],
//! [`EXIT_CODES_COMMON`]); `docs/operations.md`
//! gathers them.
//!
//! `run`, `elect` and `lock` release what they hold and close their session before exiting,
//! whatever the outcome (within `run`'s short bound after a lost hold). The command of `run`
//! and `elect` dies with `permit`, even when `permit` is killed with SIGKILL, and is dead by the
//! session's local deadline even when `permit` is stopped (a forked watchdog, re-armed after
//! each acknowledged keepalive: see `supervise.rs`). While queued, an outage is ridden out with
//! the queue place until that deadline. `queue work` runs its commands the same way, one per
//! claimed item, all under one session: a lost session stops them all, and their items go back
//! to the queue.
#![deny(missing_docs)]

mod acl;
mod cluster;
mod elections;
mod events;
mod lock;
mod operator;
mod queues;
mod run;
mod semaphores;
mod supervise;
mod table;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use permit_client::{Client, ErrorCode};

pub use elections::{ElectArgs, LeaderArgs, ProclaimArgs};
pub use lock::LockArgs;
pub use operator::{ElectionsArgs, HealthArgs, ReleaseArgs, RevokeArgs, ValidateArgs};
pub use queues::{
    PushArgs, QueueCommand, QueueLsArgs, QueueShowArgs, WorkArgs, EXIT_CODES_PUSH, EXIT_CODES_WORK,
};
pub use run::RunArgs;
pub use semaphores::{DeleteArgs, LsArgs, SetCapacityArgs, ShowArgs, TakeArgs};

/// Exit code of a failed command: the server refused the request or answered something
/// unexpected (the error is printed on stderr).
pub const EXIT_ERROR: i32 = 1;
/// Exit code of `permit leader` when nobody leads.
pub const EXIT_NO_LEADER: i32 = 3;
/// Exit code of `permit validate` when the token is not current (a negative answer, like
/// [`EXIT_NO_LEADER`], not an error).
pub const EXIT_NOT_CURRENT: i32 = 3;
/// Exit code of `permit proclaim` when the session does not lead the election (a negative
/// answer, like [`EXIT_NO_LEADER`]; nothing changed).
pub const EXIT_NOT_LEADING: i32 = 3;
/// Exit code of a local mistake found before anything was sent: a malformed `--server` address
/// or access token (`EX_USAGE` of sysexits.h). The message names the fix.
pub const EXIT_USAGE: i32 = 64;
/// Exit code of `permit health` when the node answered but is not healthy (`EX_UNAVAILABLE` of
/// sysexits.h).
pub const EXIT_UNAVAILABLE: i32 = 69;
/// Exit code of a configuration that cannot work with this server, found on the first answer:
/// `https://` against a plain-HTTP port, or `http://` against a TLS port (`EX_CONFIG` of
/// sysexits.h). The message names the address to use.
pub const EXIT_CONFIG: i32 = 78;
/// Exit code when no server could be reached, or none could serve (no leader, shutting down)
/// within the client's retries (`EX_IOERR` of sysexits.h).
pub const EXIT_UNREACHABLE: i32 = 74;
/// Exit code of `permit run` / `elect` / `lock` when `--timeout` passed before the grant
/// (`EX_TEMPFAIL` of sysexits.h).
pub const EXIT_TIMEOUT: i32 = 75;
/// Exit code of `permit take` when the semaphore's rate had no room within `--timeout` (at once
/// without one): nothing was taken. The same code as [`EXIT_TIMEOUT`] (`EX_TEMPFAIL`: try again
/// later), distinct from errors, so that `permit take NAME && CMD` runs CMD only when taken.
pub const EXIT_RATE_LIMITED: i32 = 75;
/// Exit code of `permit run` / `elect` / `lock` when the hold was lost while holding.
pub const EXIT_LOST: i32 = 76;
/// Exit code when the command cannot be executed.
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command is not found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit codes above this one mean "killed by signal (code - 128)".
pub const EXIT_SIGNAL_BASE: i32 = 128;

/// The exit codes of `permit run`, printed at the end of its `--help`.
pub const EXIT_CODES_RUN: &str = "\
Exit codes:
  0      the command exited 0
  1      the server refused a request or answered something unexpected (printed on stderr)
  64     a malformed --server address or access token (the message says which; nothing was sent)
  74     could not reach the server, or no server could serve (no leader, shutting down),
         before a session was opened (once queued, outages are ridden out until the session's
         deadline)
  75     --timeout passed before the grant; nothing is held or queued
  76     the hold was lost while the command ran (the session expired, keepalives were not
         acknowledged until --kill-after before the session's deadline, --max-hold passed, or
         an operator revoked or released it):
         the command got SIGTERM, then SIGKILL after --kill-after (by the deadline); or the
         session was lost while queued (an outage longer than --ttl)
  78     https:// against a plain-HTTP port or http:// against a TLS port (the message names the
         address to use)
  126    the command could not be executed
  127    the command was not found
  128+N  the command was killed by signal N, or permit got signal N while waiting for the grant
  other  the command's own exit code (codes 1, 64, 74-76 and 78 come from permit itself
         only when it printed why on stderr)

If permit itself is killed (even with SIGKILL), the command and its process group are killed;
if permit is stopped (SIGSTOP) or hangs, a watchdog kills them just before the session's deadline.";

/// The exit codes of `permit elect`, printed at the end of its `--help`.
pub const EXIT_CODES_ELECT: &str = "\
Exit codes:
  0      the command exited 0
  1      the server refused a request or answered something unexpected (printed on stderr)
  64     a malformed --server address or access token (the message says which; nothing was sent)
  74     could not reach the server, or no server could serve (no leader, shutting down),
         before a session was opened (once campaigning, outages are ridden out until the
         session's deadline)
  75     --timeout passed before leadership was won; the candidacy is withdrawn
  76     leadership was lost while the command ran (the session expired, keepalives were not
         acknowledged until --kill-after before the session's deadline, or an operator revoked
         it): the command got
         SIGTERM, then SIGKILL after --kill-after (by the deadline); or the session was lost
         while campaigning (an outage longer than --ttl)
  78     https:// against a plain-HTTP port or http:// against a TLS port (the message names the
         address to use)
  126    the command could not be executed
  127    the command was not found
  128+N  the command was killed by signal N, or permit got signal N while campaigning
  other  the command's own exit code (codes 1, 64, 74-76 and 78 come from permit itself
         only when it printed why on stderr)

If permit itself is killed (even with SIGKILL), the command and its process group are killed;
if permit is stopped (SIGSTOP) or hangs, a watchdog kills them just before the session's deadline.";

/// The exit codes of `permit lock`, printed at the end of its `--help`.
pub const EXIT_CODES_LOCK: &str = "\
Exit codes:
  0      released after SIGINT (Ctrl-C), SIGTERM, SIGHUP or SIGQUIT
  1      the server refused a request or answered something unexpected (printed on stderr)
  64     a malformed --server address or access token (the message says which; nothing was sent)
  74     could not reach the server, or no server could serve (no leader, shutting down),
         before a session was opened (once queued, outages are ridden out until the session's
         deadline)
  75     --timeout passed before the grant; nothing is held or queued
  76     the hold was lost (the session expired, no keepalive was acknowledged before the
         session's deadline, or an operator revoked or released it), or the session was lost
         while queued (an outage longer than --ttl)
  78     https:// against a plain-HTTP port or http:// against a TLS port (the message names the
         address to use)
  128+N  interrupted by signal N while waiting for the grant";

/// The exit codes of `permit take`, printed at the end of its `--help`.
pub const EXIT_CODES_TAKE: &str = "\
Exit codes:
  0   taken (nothing is printed; the token with --print-token): `permit take NAME && CMD`
      runs CMD only then
  1   the server refused the request (for example semaphore_not_found, or more permits than
      the rate's burst) or answered something unexpected (printed on stderr); nothing taken
  64  a malformed --server address or access token, or a --timeout above 60s (nothing was sent)
  74  could not reach the server, or no server could serve (no leader, shutting down); the
      take may or may not have happened
  75  rate limited: the rate had no room within --timeout (at once without it); nothing was
      taken; stderr says when it will have room (--quiet: nothing printed)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// The exit codes of `permit leader`, printed at the end of its `--help`.
pub const EXIT_CODES_LEADER: &str = "\
Exit codes:
  0   the leader was printed (--watch: stopped by SIGINT, SIGTERM, SIGHUP or SIGQUIT)
  1   the server refused the request or answered something unexpected (printed on stderr)
  3   nobody leads the election (without --watch)
  64  a malformed --server address or access token (the message says which; nothing was sent)
  74  could not reach the server, or no server could serve (no leader, shutting down)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// The exit codes of `ls`, `show`, `set-capacity`, `delete` and `cluster`, printed at the end of
/// their `--help`.
pub const EXIT_CODES_COMMON: &str = "\
Exit codes:
  0   success
  1   the server refused the request (for example semaphore_not_found) or answered something
      unexpected (printed on stderr)
  64  a malformed --server address or access token (the message says which; nothing was sent)
  74  could not reach the server, or no server could serve (no leader, shutting down)
  78  https:// against a plain-HTTP port or http:// against a TLS port (the message names the
      address to use)";

/// Default session TTL of `run` and `elect`.
const TTL_DEFAULT: &str = "10s";

/// The client commands.
#[derive(clap::Subcommand, Debug)]
pub enum ClientCommand {
    /// Hold permits of a semaphore while a command runs.
    Run(RunArgs),
    /// List semaphores: capacity, held, available, holders, waiters.
    Ls(LsArgs),
    /// Show a semaphore's holders, waiters, rate, delayed permits and groups.
    Show(ShowArgs),
    /// Create a semaphore, or set its capacity and policies (rate, lock-delay, group cap).
    SetCapacity(SetCapacityArgs),
    /// Delete a semaphore that nobody holds or waits on.
    Delete(DeleteArgs),
    /// Hold permits of a semaphore until Ctrl-C or SIGTERM (prints the fencing token).
    Lock(LockArgs),
    /// Take permits of a semaphore's rate, holding nothing: exit 0 when taken, 75 when rate
    /// limited (`permit take api.quota && curl ...`).
    Take(TakeArgs),
    /// Work queues: push items, list and show queues, and run a command per item (`work`).
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Run a command while leading an election.
    Elect(ElectArgs),
    /// Print the current leader of an election, or follow it with --watch.
    Leader(LeaderArgs),
    /// Publish a new value as an election's leader, keeping the leadership and its token (for
    /// the command of `permit elect`: PERMIT_SESSION names its session).
    Proclaim(ProclaimArgs),
    /// Cluster membership: status, add, remove.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Backups: `permit snapshot save FILE` (restore with `permit serve --restore FILE`).
    #[command(subcommand)]
    Snapshot(cluster::SnapshotCommand),
    /// List live sessions: name, TTL, time left, holds, waits.
    Sessions(semaphores::SessionsArgs),
    /// Follow a node's events (grants, releases, queue changes, expiries, leader changes), one
    /// line per event.
    Events(events::EventsArgs),
    /// Access tokens of a server started with `--auth`: create, list, delete, self.
    #[command(subcommand)]
    Acl(acl::AclCommand),
    /// List elections: name, leader (value, session, token, tenure), candidates.
    Elections(ElectionsArgs),
    /// End another session's hold on a semaphore (or, with --election, its leadership): for a
    /// stuck holder whose session is still kept alive.
    Revoke(RevokeArgs),
    /// Release a session's hold on a semaphore (or, with --election, resign its leadership).
    Release(ReleaseArgs),
    /// Check a fencing token: exit 0 when a current holder of the semaphore carries it, 3 when not.
    Validate(ValidateArgs),
    /// Print a node's health (status, role, leader, term); --wait blocks until it is healthy.
    Health(HealthArgs),
}

/// TLS options of the client commands: global flags of the binary.
#[derive(clap::Args, Debug, Default, Clone)]
pub struct TlsArgs {
    /// Trust only the CA certificates in this PEM file for `https://` servers (default: the
    /// system's roots).
    #[arg(long, global = true, env = "PERMIT_CA_FILE")]
    pub ca_file: Option<PathBuf>,
    /// Present this PEM client certificate to servers that require one (with `--client-key`).
    #[arg(long, global = true, env = "PERMIT_CLIENT_CERT", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// The PEM private key of `--client-cert`.
    #[arg(long, global = true, env = "PERMIT_CLIENT_KEY", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl TlsArgs {
    /// A client of `servers` with these options.
    ///
    /// # Errors
    ///
    /// Invalid server addresses, and files that cannot be read.
    pub fn client(&self, servers: &[String]) -> anyhow::Result<Client> {
        let mut builder = Client::builder(servers);
        if let Some(ca) = &self.ca_file {
            builder = builder.ca_file(ca).context("invalid --ca-file")?;
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            builder = builder.identity_files(cert, key).context("invalid --client-cert/--client-key")?;
        }
        builder.build().context("invalid --server or TLS option")
    }
}

/// Runs `command` against the servers at `servers` (tried in order, with failover) and returns the
/// process exit code (see the crate docs). Errors are to be printed and mapped to an exit code by
/// [`exit_code_of`].
///
/// # Errors
///
/// Invalid server addresses or TLS files, and any error of the server or the connection, with
/// context.
pub async fn execute(
    command: ClientCommand,
    servers: &[String],
    tls: &TlsArgs,
    auth_token: Option<&str>,
) -> anyhow::Result<i32> {
    let token_given = auth_token.is_some();
    execute_command(command, servers, tls, auth_token).await.map_err(|error| explain(error, token_given))
}

async fn execute_command(
    command: ClientCommand,
    servers: &[String],
    tls: &TlsArgs,
    auth_token: Option<&str>,
) -> anyhow::Result<i32> {
    let mut client = tls.client(servers)?;
    if let Some(secret) = auth_token {
        client = client.auth_token(checked_token(secret)?);
    }
    match command {
        ClientCommand::Run(args) => run::run(&client, args).await,
        ClientCommand::Lock(args) => lock::lock(&client, args).await,
        ClientCommand::Take(args) => semaphores::take(&client, args).await,
        ClientCommand::Queue(command) => queues::execute(&client, command).await,
        ClientCommand::Ls(args) => semaphores::ls(&client, args).await,
        ClientCommand::Show(args) => semaphores::show(&client, args).await,
        ClientCommand::SetCapacity(args) => semaphores::set_capacity(&client, args).await,
        ClientCommand::Delete(args) => semaphores::delete(&client, args).await,
        ClientCommand::Elect(args) => elections::elect(&client, args).await,
        ClientCommand::Leader(args) => elections::leader(&client, args).await,
        ClientCommand::Proclaim(args) => elections::proclaim(&client, args).await,
        ClientCommand::Cluster(command) => cluster::execute(&client, command).await,
        ClientCommand::Acl(command) => acl::execute(&client, command).await,
        ClientCommand::Sessions(args) => semaphores::sessions(&client, args).await,
        ClientCommand::Events(args) => events::events(&client, args).await,
        ClientCommand::Snapshot(command) => cluster::snapshot(&client, command).await,
        ClientCommand::Elections(args) => operator::elections(&client, args).await,
        ClientCommand::Revoke(args) => operator::revoke(&client, args).await,
        ClientCommand::Release(args) => operator::release(&client, args).await,
        ClientCommand::Validate(args) => operator::validate(&client, args).await,
        ClientCommand::Health(args) => operator::health(&client, args).await,
    }
}

/// A local mistake found before anything was sent; exits [`EXIT_USAGE`].
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// The access token to send: `secret` without surrounding whitespace (a file read with
/// `$(cat FILE)` or `echo` keeps no newline, but `PERMIT_AUTH_TOKEN="$(< FILE)"` from an editor
/// or a pasted secret may end with one, and a header cannot carry it). Anything else that is not
/// printable ASCII is refused: no secret the server issues contains it, so it is a mistake of
/// the caller, and sending it would only fail as `unauthenticated` (or not at all, as a header
/// value it cannot be).
fn checked_token(secret: &str) -> Result<String, UsageError> {
    let trimmed = secret.trim();
    if trimmed.is_empty() {
        return Err(UsageError(
            "the access token from --auth-token / PERMIT_AUTH_TOKEN is empty: pass the secret, or \
             unset it for a server without --auth"
                .into(),
        ));
    }
    if let Some((at, c)) = trimmed.char_indices().find(|(_, c)| !c.is_ascii_graphic()) {
        return Err(UsageError(format!(
            "the access token from --auth-token / PERMIT_AUTH_TOKEN has a {} at byte {at}: a token \
             secret is printable ASCII without spaces; check how it was set (a stray character from \
             a paste or an editor?)",
            if c.is_whitespace() {
                "space or line break".to_owned()
            } else {
                format!("non-printable character {c:?}")
            }
        )));
    }
    Ok(trimmed.to_owned())
}

/// `error` with a first line that names the fix, for the mistakes a user can make: no token (or
/// a wrong one) for a server started with `--auth`. Other errors are returned as they are.
fn explain(error: anyhow::Error, token_given: bool) -> anyhow::Error {
    let unauthenticated = error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<permit_client::Error>())
        .any(|cause| cause.code() == Some(ErrorCode::Unauthenticated));
    if !unauthenticated {
        return error;
    }
    if token_given {
        error.context(
            "the server does not know the access token given with --auth-token / PERMIT_AUTH_TOKEN \
             (deleted, mistyped, or of another cluster)",
        )
    } else {
        error.context(
            "the server requires an access token: pass --auth-token SECRET or set PERMIT_AUTH_TOKEN \
             (the root token of a new cluster is in DATA_DIR/root-token)",
        )
    }
}

/// The exit code of a command that failed with `error`: [`EXIT_USAGE`] for a malformed address
/// or token, [`EXIT_CONFIG`] for a scheme that does not match the server's port,
/// [`EXIT_UNREACHABLE`] when no server could be reached (or none could serve), [`EXIT_ERROR`]
/// otherwise.
///
/// # Examples
///
/// ```
/// let error = anyhow::anyhow!("bad input");
/// assert_eq!(permit_cli::exit_code_of(&error), permit_cli::EXIT_ERROR);
/// ```
pub fn exit_code_of(error: &anyhow::Error) -> i32 {
    let client_errors = || error.chain().filter_map(|cause| cause.downcast_ref::<permit_client::Error>());
    if error.chain().any(|cause| cause.is::<UsageError>())
        || client_errors().any(|error| matches!(error, permit_client::Error::InvalidEndpoint { .. }))
    {
        return EXIT_USAGE;
    }
    if client_errors().any(|error| {
        matches!(
            error,
            permit_client::Error::SchemeMismatch { .. }
                | permit_client::Error::Api { code: ErrorCode::TlsRequired, .. }
        )
    }) {
        return EXIT_CONFIG;
    }
    let unreachable =
        error.chain().filter_map(|cause| cause.downcast_ref::<permit_client::Error>()).any(|error| {
            matches!(
                error,
                permit_client::Error::Transport { .. }
                    | permit_client::Error::Timeout { .. }
                    | permit_client::Error::Api {
                        code: ErrorCode::NoLeader | ErrorCode::ShuttingDown | ErrorCode::LeaderUnreachable,
                        ..
                    }
            )
        });
    if unreachable {
        EXIT_UNREACHABLE
    } else {
        EXIT_ERROR
    }
}

/// Parses `10s`, `500ms`, `1m 30s`, ... (humantime).
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// The binary's shape: the client commands flattened next to its own.
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(subcommand)]
        command: ClientCommand,
    }

    #[test]
    fn parser_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_the_double_dash() {
        let cli =
            Cli::parse_from(["permit", "run", "db", "-n", "2", "--ttl", "500ms", "--", "sh", "-c", "exit 3"]);
        let ClientCommand::Run(args) = cli.command else { panic!("not run: {cli:?}") };
        assert_eq!(args.permit.semaphore, "db");
        assert_eq!(args.permit.permits, 2);
        assert_eq!(args.permit.ttl, Duration::from_millis(500));
        assert_eq!(args.kill_after, None);
        assert_eq!(args.command, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn every_command_has_its_own_exit_code_table() {
        let mut command = Cli::command();
        command.build();
        let mut checked = 0;
        for sub in command.get_subcommands_mut() {
            let name = sub.get_name().to_owned();
            if name == "help" {
                continue;
            }
            let mut leaves = Vec::new();
            let mut pending = vec![sub.clone()];
            while let Some(next) = pending.pop() {
                if next.has_subcommands() {
                    pending.extend(next.get_subcommands().filter(|leaf| leaf.get_name() != "help").cloned());
                } else {
                    leaves.push(next);
                }
            }
            for leaf in &mut leaves {
                let help = leaf.render_long_help().to_string();
                assert_eq!(help.matches("Exit codes:").count(), 1, "{name} {}:\n{help}", leaf.get_name());
                assert!(help.contains("74"), "{name} {}:\n{help}", leaf.get_name());
                checked += 1;
            }
        }
        assert!(checked >= 11, "{checked} commands");
        let elect = command.find_subcommand_mut("elect").expect("elect").render_long_help().to_string();
        assert!(!elect.contains("max-hold") && elect.contains("leadership was lost"), "{elect}");
    }

    #[test]
    fn unreachable_servers_map_to_74() {
        let refused =
            permit_client::Error::Timeout { endpoint: "http://127.0.0.1:1".into(), after: Duration::ZERO };
        let error = anyhow::Error::new(refused).context("cannot open a session");
        assert_eq!(exit_code_of(&error), EXIT_UNREACHABLE);
        assert_eq!(exit_code_of(&anyhow::anyhow!("other")), EXIT_ERROR);
    }
}
