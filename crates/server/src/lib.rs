//! Permit's server: the imperative shell around `permit-core`.
//!
//! A request enters through [`api`] (axum), becomes a `permit_core::Command`, goes through the
//! group-commit [`raft::proposer`] into the Raft log ([`raft`]: openraft with the segment log
//! store), is applied by the state machine adapter to the [`raft::replica`], and is answered
//! from the outcome.
//! Session deadlines live in memory in the [`lessor`]; the `expiry` driver proposes expiries
//! on the leader. See `docs/ARCHITECTURE.md` for the map.

pub mod api;
pub mod auth;
pub(crate) mod bootstrap;
pub(crate) mod bugs;
pub mod config;
pub(crate) mod entropy;
pub(crate) mod error;
pub(crate) mod expiry;
pub mod failstop;
pub(crate) mod fanout;
pub(crate) mod history;
pub mod lessor;
pub mod listener;
pub mod metrics;
pub mod node;
pub mod notify;
pub mod observe;
pub mod peer;
pub(crate) mod peer_conn;
pub mod raft;
pub mod sd_notify;
pub mod tls;

use std::future::Future;
use std::io::Write;
use std::time::Duration;

pub use config::Config;
pub use node::Node;

/// How long in-flight requests get to finish after a shutdown signal.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Runs a node until `stop` resolves: binds the listener, starts Raft, prints
/// `permit listening on http://ADDR` (`https://` with TLS) on stdout, and serves the API.
///
/// # Errors
/// When the address cannot be bound, the data dir or a TLS file cannot be opened, or Raft fails
/// to start; and when the node fails while serving (a storage error, or Raft stopped on its own:
/// see [`failstop`]), after refusing all work for `failstop::FAILSTOP_LINGER`.
pub async fn serve(config: Config, stop: impl Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    let acceptor = config.tls.as_ref().map(tls::server_config).transpose()?;
    let settings = listener::ListenerSettings {
        header_read_timeout: config.header_read_timeout,
        body_read_timeout: config.header_read_timeout,
        connections_max: config.connections_max,
        connections_per_client_max: config.connections_per_client_max,
        cluster_secret: config.cluster_secret.clone(),
        node_id: config.node_id,
        tls: acceptor.map(tokio_rustls::TlsAcceptor::from),
    };
    let scheme = tls::scheme(config.tls.as_ref());
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.listen))?;
    let addr = listener.local_addr()?;
    let node = Node::start(config, addr).await?;
    let router = api::router(node.app().clone());
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "permit listening on {scheme}://{addr} (node {})", node.id)?;
        stdout.flush()?;
    }
    tracing::info!(%addr, data_dir = %node.config().data_dir.display(), "serving");
    if !node.config().auth && !addr.ip().is_loopback() {
        tracing::warn!(%addr, "auth is off: anyone who reaches this address can use and reconfigure everything");
    } else if !node.config().auth {
        tracing::info!("auth is off (--auth turns it on); only this machine can reach the server");
    }
    // systemd's notifications (`Type=notify`): readiness, the watchdog, and the stop.
    let notify = sd_notify::SdNotify::from_env()
        .map_err(|e| anyhow::anyhow!("NOTIFY_SOCKET: {e}"))?
        .map(std::sync::Arc::new);
    if let Some(notify) = &notify {
        tokio::spawn(notify.clone().run(node.app().clone()));
    }
    let (stopping_tx, stopping_rx) = tokio::sync::oneshot::channel::<()>();
    let stopper = node.clone();
    let stop_notify = notify.clone();
    tokio::spawn(async move {
        stop.await;
        tracing::info!("shutting down");
        if let Some(notify) = &stop_notify {
            notify.stopping();
        }
        stopper.stop().await;
        let _ = stopping_tx.send(());
    });
    let server = crate::listener::serve(listener, router, settings, node.app().metrics.clone(), async {
        let _ = stopping_rx.await;
    });
    let failed = node.clone();
    tokio::select! {
        () = server => {}
        failure = async {
            let failure = failed.fatal().await;
            if let Some(notify) = &notify {
                notify.stopping();
            }
            // Keep answering 503 for a moment, so that probes and clients see why.
            tokio::time::sleep(failstop::FAILSTOP_LINGER).await;
            failure
        } => anyhow::bail!("fail-stop: {failure}"),
        () = async {
            node.stopping().await;
            tokio::time::sleep(SHUTDOWN_GRACE).await;
        } => tracing::warn!("requests still open after the grace period; exiting anyway"),
    }
    drop(node);
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
}
