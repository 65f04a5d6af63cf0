//! The client commands of the `permit` binary: `run`, `elect`, `ls`, `show`, `set-capacity`,
//! `delete` and `leader`.
//!
//! The binary flattens [`ClientCommand`] into its parser next to `serve`, owns the global
//! `--server` option (a comma-separated list, env `PERMIT_SERVER`) and the TLS options
//! ([`TlsArgs`]: `--ca-file`, `--client-cert`, `--client-key`), and calls [`execute`] with them.
//! Every server interaction goes through `permit-client`.
//!
//! # Exit codes
//!
//! | code | meaning |
//! |---|---|
//! | 0 | success (`run`, `elect`: the command exited 0) |
//! | 1 | an error: the server refused, could not be reached, or answered something unexpected (printed on stderr) |
//! | 3 | `leader`: nobody leads the election |
//! | 75 | `run`, `elect`: `--timeout` passed before the permits (or leadership) were granted; nothing is held or queued (`EX_TEMPFAIL`) |
//! | 76 | `run`, `elect`: the hold was lost while the command ran (session expired, or `--max-hold` passed); the command was sent SIGTERM, then SIGKILL after `--kill-after` |
//! | 126 | `run`, `elect`: the command could not be executed (permission denied) |
//! | 127 | `run`, `elect`: the command was not found |
//! | 128+N | `run`, `elect`: the command was killed by signal N (for example 143 after a forwarded SIGTERM) |
//! | other | `run`, `elect`: the command's own exit code |
//!
//! `run` and `elect` release what they hold and close their session before exiting, whatever the
//! outcome.
#![deny(missing_docs)]

mod cluster;
mod elections;
mod run;
mod semaphores;
mod supervise;
mod table;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use permit_client::Client;

pub use elections::{ElectArgs, LeaderArgs};
pub use run::RunArgs;
pub use semaphores::{DeleteArgs, LsArgs, SetCapacityArgs, ShowArgs};

/// Exit code of a failed command (the error is printed on stderr).
pub const EXIT_ERROR: i32 = 1;
/// Exit code of `permit leader` when nobody leads.
pub const EXIT_NO_LEADER: i32 = 3;
/// Exit code of `permit run` / `permit elect` when `--timeout` passed before the grant
/// (`EX_TEMPFAIL` of sysexits.h).
pub const EXIT_TIMEOUT: i32 = 75;
/// Exit code of `permit run` / `permit elect` when the hold was lost while the command ran.
pub const EXIT_LOST: i32 = 76;
/// Exit code when the command cannot be executed.
pub const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command is not found.
pub const EXIT_NOT_FOUND: i32 = 127;
/// Exit codes above this one mean "killed by signal (code - 128)".
pub const EXIT_SIGNAL_BASE: i32 = 128;

/// The exit codes, as printed at the end of `permit run --help` and `permit elect --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0      the command exited 0
  1      error talking to the server (printed on stderr)
  75     --timeout passed before the grant; nothing is held or queued
  76     the hold was lost while the command ran (session expired or --max-hold passed):
         the command got SIGTERM, then SIGKILL after --kill-after
  126    the command could not be executed
  127    the command was not found
  128+N  the command was killed by signal N
  other  the command's exit code";

/// Default session TTL of `run` and `elect`.
const TTL_DEFAULT: &str = "10s";

/// The client commands.
#[derive(clap::Subcommand, Debug)]
pub enum ClientCommand {
    /// Hold permits of a semaphore while a command runs.
    Run(RunArgs),
    /// List semaphores: capacity, held, available, holders, waiters.
    Ls(LsArgs),
    /// Show a semaphore's holders and waiters.
    Show(ShowArgs),
    /// Create a semaphore, or set its capacity.
    SetCapacity(SetCapacityArgs),
    /// Delete a semaphore that nobody holds or waits on.
    Delete(DeleteArgs),
    /// Run a command while leading an election.
    Elect(ElectArgs),
    /// Print the current leader of an election (exit code 3 when nobody leads).
    Leader(LeaderArgs),
    /// Cluster membership: status, add, remove.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
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
/// process exit code (see the crate docs). Errors are to be printed and mapped to [`EXIT_ERROR`].
///
/// # Errors
///
/// Invalid server addresses or TLS files, and any error of the server or the connection, with
/// context.
pub async fn execute(command: ClientCommand, servers: &[String], tls: &TlsArgs) -> anyhow::Result<i32> {
    let client = tls.client(servers)?;
    match command {
        ClientCommand::Run(args) => run::run(&client, args).await,
        ClientCommand::Ls(args) => semaphores::ls(&client, args).await,
        ClientCommand::Show(args) => semaphores::show(&client, args).await,
        ClientCommand::SetCapacity(args) => semaphores::set_capacity(&client, args).await,
        ClientCommand::Delete(args) => semaphores::delete(&client, args).await,
        ClientCommand::Elect(args) => elections::elect(&client, args).await,
        ClientCommand::Leader(args) => elections::leader(&client, args).await,
        ClientCommand::Cluster(command) => cluster::execute(&client, command).await,
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
        assert_eq!(args.semaphore, "db");
        assert_eq!(args.permits, 2);
        assert_eq!(args.ttl, Duration::from_millis(500));
        assert_eq!(args.kill_after, Duration::from_secs(10));
        assert_eq!(args.command, ["sh", "-c", "exit 3"]);
    }

    #[test]
    fn run_and_elect_help_lists_the_exit_codes() {
        for name in ["run", "elect"] {
            let mut command = Cli::command();
            let help = command.find_subcommand_mut(name).expect("subcommand").render_long_help().to_string();
            assert!(help.contains("Exit codes:") && help.contains("76"), "{name} --help:\n{help}");
        }
    }
}
