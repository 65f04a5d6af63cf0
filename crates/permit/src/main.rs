//! `permit`: the server (`permit serve`) and the client commands in one binary.
//!
//! This crate is glue: `serve` goes to `permit-server`, every other command to `permit-cli`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// A distributed semaphore service: named counting semaphores, locks and leader elections with
/// sessions, FIFO queues and fencing tokens.
#[derive(Parser)]
#[command(name = "permit", version, about, propagate_version = true)]
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
    #[command(flatten)]
    tls: permit_cli::TlsArgs,
    #[command(subcommand)]
    command: TopCommand,
}

#[derive(Subcommand)]
enum TopCommand {
    /// Run a server (single node by default; `--peers` for a cluster).
    Serve(ServeArgs),
    #[command(flatten)]
    Client(permit_cli::ClientCommand),
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on for the HTTP API and peer RPC.
    #[arg(long, default_value = permit_server::config::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Directory of the Raft log and snapshots.
    #[arg(long, default_value = "permit-data")]
    data_dir: PathBuf,
    /// This node's id in a cluster.
    #[arg(long, default_value_t = 1)]
    id: u64,
    /// Every voter of a cluster as ID=HOST:PORT, comma-separated (including this node).
    #[arg(long, value_delimiter = ',', value_parser = parse_peer)]
    peers: Vec<(u64, String)>,
    /// Take a snapshot and compact the log every this many entries.
    #[arg(long, default_value_t = 10_000)]
    snapshot_logs: u64,
    /// Do not form a cluster: wait to be added (`permit cluster add ID ADDR`) or initialised.
    #[arg(long, conflicts_with = "peers")]
    join: bool,
    /// Close a connection that has not sent a complete request head (or TLS handshake) within
    /// this time, or that sits idle between requests that long (slowloris).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    header_read_timeout: std::time::Duration,
    /// Most connections open at once; more are closed as soon as they are accepted.
    #[arg(long, default_value_t = permit_server::listener::CONNECTIONS_MAX_DEFAULT)]
    connections_max: usize,
    /// Serve HTTPS with this PEM certificate chain (also this node's identity towards its peers).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates signed by a CA in this PEM file.
    #[arg(long, requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// Verify peers' certificates against the CAs in this PEM file (default: `--tls-client-ca`,
    /// else the system's roots).
    #[arg(long, requires = "tls_cert")]
    peer_ca: Option<PathBuf>,
}

fn parse_peer(text: &str) -> Result<(u64, String), String> {
    let (id, addr) = text.split_once('=').ok_or("expected ID=HOST:PORT")?;
    let id = id.parse().map_err(|_| format!("bad node id {id:?}"))?;
    Ok((id, addr.to_owned()))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let serving = matches!(cli.command, TopCommand::Serve(_));
    // A panic is a bug (a broken invariant); a half-dead server must not keep answering.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    // The server logs at info by default; client commands only warn.
    let default_filter = if serving { "info,openraft=warn" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        TopCommand::Serve(args) => {
            let config = permit_server::Config {
                node_id: args.id,
                listen: args.listen,
                data_dir: args.data_dir,
                peers: args.peers.into_iter().collect::<BTreeMap<_, _>>(),
                snapshot_logs: args.snapshot_logs,
                join: args.join,
                header_read_timeout: args.header_read_timeout,
                connections_max: args.connections_max,
                tls: args.tls_cert.zip(args.tls_key).map(|(cert, key)| permit_server::tls::TlsConfig {
                    cert,
                    key,
                    client_ca: args.tls_client_ca,
                    peer_ca: args.peer_ca,
                }),
                ..permit_server::Config::default()
            };
            runtime.block_on(permit_server::serve(config, permit_server::shutdown_signal()))
        }
        TopCommand::Client(command) => {
            let code = match runtime.block_on(permit_cli::execute(command, &cli.server, &cli.tls)) {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("permit: {error:#}");
                    1
                }
            };
            drop(runtime);
            std::process::exit(code)
        }
    }
}
