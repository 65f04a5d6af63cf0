//! `permit`: the server (`permit serve`) and the client commands in one binary.
//!
//! `serve` goes to `permit-server`, every other command to `permit-cli`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use std::io::IsTerminal;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

mod config_file;

/// mimalloc instead of glibc's malloc: a request allocates and frees a few dozen small blocks
/// across tokio's worker threads, and glibc's free-list consolidation makes that costly for a
/// busy leader (docs/performance.md, "Keepalives at 100 k sessions, 3 nodes").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Returns to the system the free pages mimalloc keeps, this thread's and its shared arenas'
/// (`Config::after_load`).
fn release_free_memory() {
    // Part of the mimalloc library that `mimalloc` links (its Rust binding declares it only
    // behind a feature that needs another crate).
    extern "C" {
        fn mi_collect(force: bool);
    }
    // SAFETY: `mi_collect` takes no pointers and may be called from any thread at any time.
    unsafe { mi_collect(true) }
}

/// A distributed semaphore service: named counting semaphores, locks and leader elections with
/// sessions, FIFO queues and fencing tokens.
#[derive(Parser)]
#[command(name = "permit", version, propagate_version = true)]
struct Cli {
    /// Server URL(s), comma-separated; clients fail over between them.
    #[arg(
        long,
        global = true,
        env = "PERMIT_SERVER",
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7376"
    )]
    server: Vec<String>,
    /// The secret of an access token, for servers started with --auth (sent as
    /// `Authorization: Bearer SECRET`). Surrounding whitespace (a file's trailing newline) is
    /// trimmed; a space or control character inside is refused (exit 64).
    #[arg(long, global = true, env = "PERMIT_AUTH_TOKEN", hide_env_values = true)]
    auth_token: Option<String>,
    #[command(flatten)]
    tls: permit_cli::TlsArgs,
    #[command(subcommand)]
    command: TopCommand,
}

#[derive(Subcommand)]
enum TopCommand {
    /// Run a server (single node by default; `--peers` for a cluster).
    #[command(after_help = format!("{SERVE_CONFIGURATION}\n\n{SERVE_EXIT_CODES}"))]
    Serve(Box<ServeArgs>),
    /// Check a configuration file of `permit serve`, or print its effective configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Turn one surviving node's data into a new single-node cluster, after a cluster lost its
    /// quorum for good (docs/operations.md, *Lost quorum*). Keeps everything the node holds,
    /// under a new cluster identity: the old members are refused if they come back. Stop the
    /// node's server first; then serve the data dir without --peers and grow the cluster back
    /// with `permit cluster add`.
    #[command(after_help = RECOVER_EXIT_CODES)]
    Recover(RecoverArgs),
    #[command(flatten)]
    Client(permit_cli::ClientCommand),
}

/// `permit serve`'s worker threads unless `--worker-threads` says otherwise (see its help).
const SERVE_WORKER_THREADS: u16 = 1;

/// The exit codes of `permit serve`, printed at the end of its `--help`.
const SERVE_EXIT_CODES: &str = "\
Exit codes:
  0    stopped by SIGINT or SIGTERM
  1    could not start, or stopped on an error (the last log line says why)
  134  a bug: an internal check failed (the log shows where); restart it";

/// `permit recover`.
#[derive(Args)]
struct RecoverArgs {
    /// The surviving node's data dir.
    #[arg(long)]
    data_dir: PathBuf,
    /// The surviving node's id (its `serve --id`).
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// Its address in the new cluster (default: its address in the last membership it knew;
    /// serve it there).
    #[arg(long)]
    addr: Option<String>,
}

/// The exit codes of `permit recover`, printed at the end of its `--help`.
const RECOVER_EXIT_CODES: &str = "\
Exit codes:
  0    recovered: serve the data dir as the message says
  1    nothing was changed: the data dir holds no log, a server is using it, or the node is not
       in its membership and no --addr was given (the message says which)";

/// `permit config ...`
#[derive(Subcommand)]
enum ConfigCommand {
    /// Check a configuration file on its own (without flags or PERMIT_* variables): its keys,
    /// values and the relations between them, as `permit serve --config FILE` would. Exit 0 when
    /// it is valid, 2 with the problem (file, line, key) when not.
    #[command(after_help = CONFIG_EXIT_CODES)]
    Check {
        /// The TOML file.
        file: PathBuf,
    },
    /// Print the configuration `permit serve` would run with, given the same flags, PERMIT_*
    /// variables and --config file, as TOML, each value with where it came from. Secrets are not
    /// printed (only the paths of their files, and whether PERMIT_ROOT_TOKEN is set).
    #[command(after_help = format!("{SERVE_CONFIGURATION}\n\n{CONFIG_EXIT_CODES}"))]
    Show(Box<ServeArgs>),
}

/// Exit code of `permit config` for a configuration that is not valid.
const EXIT_CONFIG_INVALID: i32 = 2;

/// The exit codes of `permit config check` and `show`, printed at the end of their `--help`.
const CONFIG_EXIT_CODES: &str = "\
Exit codes:
  0    the configuration is valid (and, for `show`, printed)
  2    it is not: the message names the file, and the line and key where it can";

/// How `permit serve` reads its settings, printed at the end of its `--help`.
const SERVE_CONFIGURATION: &str = "\
Configuration:
  Every flag can also be set by its environment variable (shown with each flag: PERMIT_ and
  the flag in upper snake case) and by a key of the same name in the --config file (TOML:
  `listen = \"127.0.0.1:7376\"`, `data-dir = \"/var/lib/permit\"`, `auth = true`,
  `peers = [\"1=10.0.0.1:7376\", \"2=10.0.0.2:7376\"]`). A flag beats its environment variable,
  which beats the file, which beats the default. An unknown key or a bad value stops the
  server with the file, line and key. `permit config check FILE` checks a file;
  `permit config show` prints the effective configuration.";

#[derive(Args)]
struct ServeArgs {
    /// A TOML file of settings, one key per flag (see Configuration below). Flags and PERMIT_*
    /// variables override its values.
    #[arg(long, env = "PERMIT_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on for the HTTP API and peer RPC.
    #[arg(long, env = "PERMIT_LISTEN", default_value = permit_server::config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Directory of the Raft log and snapshots.
    #[arg(long, env = "PERMIT_DATA_DIR", default_value = "permit-data")]
    data_dir: PathBuf,
    /// This node's id in a cluster.
    #[arg(long, env = "PERMIT_ID", default_value_t = 1)]
    id: u64,
    /// Every voter of a cluster as ID=HOST:PORT, comma-separated (including this node).
    #[arg(long, env = "PERMIT_PEERS", value_delimiter = ',', value_parser = parse_peer)]
    peers: Vec<(u64, String)>,
    /// Take a snapshot and compact the log every this many entries.
    #[arg(long, env = "PERMIT_SNAPSHOT_LOGS", default_value_t = 10_000)]
    snapshot_logs: u64,
    /// Do not form a cluster: wait to be added (`permit cluster add ID ADDR`) or initialised.
    #[arg(long, env = "PERMIT_JOIN", conflicts_with = "peers")]
    join: bool,
    /// File holding the secret shared by every node of the cluster (at least 128 bits, see
    /// docs/security.md; make one with `head -c 32 /dev/urandom | base64 > cluster.secret`).
    /// Required with `--peers` and `--join`: peer requests are authenticated with it.
    #[arg(long, env = "PERMIT_CLUSTER_SECRET_FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// Close a connection that has not sent a complete request head (or TLS handshake) within
    /// this time, or that sits idle between requests that long (slowloris); a request's body
    /// must then arrive whole within this time too (else 408 body_timeout).
    #[arg(long, env = "PERMIT_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    header_read_timeout: std::time::Duration,
    /// Most client connections open at once; more are closed as soon as they are accepted. A
    /// node with a cluster secret keeps 64 more slots for its peers.
    #[arg(long, env = "PERMIT_CONNECTIONS_MAX", default_value_t = permit_server::listener::CONNECTIONS_MAX_DEFAULT)]
    connections_max: usize,
    /// Most client connections open at once from one source address (IP); more are refused.
    #[arg(long, env = "PERMIT_CONNECTIONS_PER_CLIENT_MAX", default_value_t = permit_server::listener::CONNECTIONS_PER_CLIENT_MAX_DEFAULT)]
    connections_per_client_max: usize,
    /// Serve HTTPS with this PEM certificate chain (also this node's identity towards its peers).
    #[arg(long, env = "PERMIT_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, env = "PERMIT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by a CA in this PEM file.
    #[arg(long, env = "PERMIT_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Verify peers' certificates against the CAs in this PEM file (default: `--tls-client-ca`,
    /// else the system's roots).
    #[arg(long, env = "PERMIT_PEER_CA", requires = "tls_cert")]
    peer_ca: Option<PathBuf>,
    /// Start a new single-node cluster from a backup (`permit snapshot save`); the data dir must
    /// be empty. Add more nodes with `permit cluster add`.
    #[arg(long, env = "PERMIT_RESTORE", conflicts_with_all = ["peers", "join"])]
    restore: Option<PathBuf>,
    /// Threads that run the server's tasks (HTTP, Raft, the state machine); default: 1. One
    /// thread spares every hand-off between tasks a wake-up of another thread: on a 2-core
    /// machine it answered acquires sooner and handed permits over faster than one thread per
    /// core (docs/performance.md, *One worker thread*). More threads let CPU-heavy loads (many
    /// clients, TLS handshakes, big reads) use more cores. The log's fsyncs run in place on the
    /// one thread until the disk turns slow; snapshot encodes and `/metrics` renders run on
    /// threads of their own.
    #[arg(long, env = "PERMIT_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
    #[command(flatten)]
    auth: AuthArgs,
}

/// Client authentication and abuse limits (docs/security.md).
#[derive(Args)]
struct AuthArgs {
    /// Require `Authorization: Bearer SECRET` on every client request and enforce the tokens'
    /// rules. On the first start of a cluster the root token is created from PERMIT_ROOT_TOKEN,
    /// --root-token-file, or a new secret written to DATA_DIR/root-token (mode 0600).
    #[arg(long, env = "PERMIT_AUTH")]
    auth: bool,
    /// File holding the root token's secret for the first start with --auth (at least 128
    /// bits: e.g. `openssl rand -hex 32`; a guessable secret is refused).
    #[arg(long, env = "PERMIT_ROOT_TOKEN_FILE", requires = "auth")]
    root_token_file: Option<PathBuf>,
    /// Most live sessions one token may have.
    #[arg(long, env = "PERMIT_SESSIONS_PER_TOKEN_MAX", default_value_t = 10_000)]
    sessions_per_token_max: u64,
    /// Most semaphores, elections and queues one token may have created that still exist (the
    /// root token too); deleting a token deletes the semaphores and elections of them nobody
    /// uses (queues stay: they hold items).
    #[arg(long, env = "PERMIT_OBJECTS_PER_TOKEN_MAX", default_value_t = 10_000)]
    objects_per_token_max: u64,
    /// Most long-polls (blocking acquires, campaigns, claims, watches) one token may have open on
    /// a node.
    #[arg(long, env = "PERMIT_LONG_POLLS_PER_TOKEN_MAX", default_value_t = 1_000)]
    long_polls_per_token_max: u32,
    /// Serve /metrics without a token even with --auth.
    #[arg(long, env = "PERMIT_METRICS_PUBLIC")]
    metrics_public: bool,
    /// Most semaphores and elections with metric series of their own (and, for semaphores, a
    /// 15-minute history); the others are summed under the label value `_other` (and have no
    /// history).
    #[arg(long, env = "PERMIT_METRICS_NAMES_MAX", default_value_t = permit_server::metrics::METRICS_NAMES_MAX_DEFAULT)]
    metrics_names_max: usize,
    /// Listen on a non-loopback address without --auth (anyone who reaches the port can do
    /// anything).
    #[arg(long, env = "PERMIT_ALLOW_UNAUTHENTICATED")]
    allow_unauthenticated: bool,
}

impl AuthArgs {
    /// The root secret from PERMIT_ROOT_TOKEN or --root-token-file, if either is given.
    fn root_token(&self) -> anyhow::Result<Option<String>> {
        if let Some(path) = &self.root_token_file {
            let secret = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read --root-token-file {}: {e}", path.display()))?;
            return Ok(Some(secret.trim().to_owned()));
        }
        Ok(std::env::var("PERMIT_ROOT_TOKEN").ok().map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()))
    }
}

/// The server's configuration from `serve`'s arguments (reads the secrets' files).
fn server_config(args: ServeArgs) -> anyhow::Result<permit_server::Config> {
    let cluster_secret =
        args.cluster_secret_file.as_deref().map(permit_server::peer::ClusterSecret::from_file).transpose()?;
    Ok(permit_server::Config {
        node_id: args.id,
        listen: args.listen,
        data_dir: args.data_dir,
        peers: args.peers.into_iter().collect::<BTreeMap<_, _>>(),
        snapshot_logs: args.snapshot_logs,
        join: args.join,
        auth: args.auth.auth,
        root_token: if args.auth.auth { args.auth.root_token()? } else { None },
        sessions_per_token_max: args.auth.sessions_per_token_max,
        objects_per_token_max: args.auth.objects_per_token_max,
        long_polls_per_token_max: args.auth.long_polls_per_token_max,
        metrics_public: args.auth.metrics_public,
        metrics_names_max: args.auth.metrics_names_max,
        allow_unauthenticated: args.auth.allow_unauthenticated,
        cluster_secret,
        header_read_timeout: args.header_read_timeout,
        connections_max: args.connections_max,
        connections_per_client_max: args.connections_per_client_max,
        restore: args.restore,
        tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| permit_server::tls::TlsConfig {
            cert,
            key,
            client_ca: args.tls_client_ca,
            peer_ca: args.peer_ca,
        }),
        after_load: Some(release_free_memory),
        ..permit_server::Config::default()
    })
}

/// Runs `permit config check` or `show`; returns the exit code.
fn config_command(command: ConfigCommand, matches: &clap::ArgMatches, sources: &config_file::Sources) -> i32 {
    let line = command_line();
    let serve = line.find_subcommand("serve").expect("serve is a subcommand");
    match command {
        ConfigCommand::Check { file } => {
            let checked = config_file::check(&file, serve)
                .and_then(|matches| Ok(ServeArgs::from_arg_matches(&matches)?))
                .and_then(|args| {
                    // The file on its own: PERMIT_ROOT_TOKEN is the environment's, not the file's.
                    let root_token_from_file = args.auth.root_token_file.is_some();
                    let mut config = server_config(args)?;
                    if !root_token_from_file {
                        config.root_token = None;
                    }
                    Ok(config)
                })
                .and_then(|config| {
                    config.validate().map_err(|e| anyhow::anyhow!("{}: {e:#}", file.display()))
                });
            match checked {
                Ok(()) => {
                    println!("{}: ok", file.display());
                    0
                }
                Err(error) => {
                    eprintln!("permit: {error:#}");
                    EXIT_CONFIG_INVALID
                }
            }
        }
        ConfigCommand::Show(args) => {
            let show =
                matches.subcommand_matches("config").and_then(|config| config.subcommand_matches("show"));
            let show = show.expect("the matches of `config show`");
            print!("{}", config_file::show(serve, show, args.config.as_deref(), sources));
            0
        }
    }
}

fn parse_peer(text: &str) -> Result<(u64, String), String> {
    let (id, addr) = text.split_once('=').ok_or("expected ID=HOST:PORT")?;
    let id = id.parse().map_err(|_| format!("bad node id {id:?}"))?;
    Ok((id, addr.to_owned()))
}

/// The command line, with the client-only global flags (`--server`, ...) hidden from
/// `permit serve --help` and `permit config`'s: a server does not use them.
fn command_line() -> clap::Command {
    let command = Cli::command();
    // A subcommand that defines a global flag itself does not get the propagated one.
    let client_flags: Vec<clap::Arg> =
        command.get_arguments().filter(|arg| arg.is_global_set()).cloned().collect();
    let hide = |command: clap::Command| {
        client_flags.iter().cloned().fold(command, |command, flag| command.arg(flag.hide(true)))
    };
    command.mut_subcommand("serve", hide).mut_subcommand("config", hide)
}

/// Whether log lines may carry ANSI colours: only to a terminal, and not when `NO_COLOR` is set
/// to anything but the empty string (<https://no-color.org>).
fn log_colours() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
}

/// Runs the binary; an error is printed as its chain of causes (`permit: a: b: c`) and exits 1.
/// Returning it from `main` instead would print its `Debug` form, which carries a stack trace
/// when `RUST_BACKTRACE` is set: noise for an ordinary mistake such as a bad `--data-dir`.
fn main() {
    if let Err(error) = run() {
        eprintln!("permit: {error:#}");
        std::process::exit(1);
    }
}

fn run() -> anyhow::Result<()> {
    let command = command_line();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = command.clone().try_get_matches_from(&argv).unwrap_or_else(|error| error.exit());
    // `serve` could not start (its exit codes); `config show` was given an invalid file.
    let failed = if matches.subcommand_name() == Some("config") { EXIT_CONFIG_INVALID } else { 1 };
    let (matches, sources) = match config_file::apply(&command, argv, matches) {
        Ok(applied) => applied,
        Err(error) => {
            eprintln!("permit: {error:#}");
            std::process::exit(failed);
        }
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let serving = matches!(cli.command, TopCommand::Serve(_));
    // A panic is a bug (a broken invariant); a half-dead server must not keep answering.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    // The server logs at info by default; client commands only warn. openraft logs WARN lines
    // during every healthy election (messages of an older vote it ignores) and WARN and ERROR
    // lines on every retry to a down follower (twice a second): its errors stay, its
    // replication module's per-retry lines go, and the peer network logs a peer going down and
    // coming back once each (`raft::network::PeerReachability`).
    let default_filter = if serving { "info,openraft=error,openraft::replication=off" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(log_colours())
        .init();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let TopCommand::Serve(args) = &cli.command {
        runtime.worker_threads(usize::from(args.worker_threads.unwrap_or(SERVE_WORKER_THREADS)));
    }
    let runtime = runtime.enable_all().build()?;
    match cli.command {
        TopCommand::Serve(args) => {
            let config = server_config(*args)?;
            let served = runtime.block_on(permit_server::serve(config, permit_server::shutdown_signal()));
            // A failed node must exit promptly even if a disk call still hangs on a worker thread.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            served
        }
        TopCommand::Config(command) => {
            drop(runtime);
            std::process::exit(config_command(command, &matches, &sources))
        }
        TopCommand::Recover(args) => {
            let recovered = runtime.block_on(permit_server::raft::recover::recover(
                &args.data_dir,
                args.id,
                args.addr.as_deref(),
            ))?;
            let committed = recovered.committed.map_or_else(|| "unknown".to_owned(), |c| c.to_string());
            println!(
                "recovered node {} at {}: kept the log up to index {} (known committed: {committed}); \
                 the new cluster {} is this node alone, from index {} in term {}.\n\
                 Start it: permit serve --data-dir {} --id {} --listen {} --cluster-secret-file FILE\n\
                 then add members: permit cluster add ID HOST:PORT",
                recovered.id,
                recovered.addr,
                recovered.last_kept,
                recovered.cluster,
                recovered.membership.index,
                recovered.membership.leader_id.term,
                args.data_dir.display(),
                recovered.id,
                recovered.addr,
            );
            Ok(())
        }
        TopCommand::Client(command) => {
            let code = match runtime.block_on(permit_cli::execute(
                command,
                &cli.server,
                &cli.tls,
                cli.auth_token.as_deref(),
            )) {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("permit: {error:#}");
                    permit_cli::exit_code_of(&error)
                }
            };
            drop(runtime);
            std::process::exit(code)
        }
    }
}
