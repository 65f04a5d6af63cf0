//! The accept loop: serves the API router on a TCP listener, over plain HTTP/1.1 or over TLS,
//! with a cap on open connections and a header-read timeout.
//!
//! - **Connection cap.** At most `connections_max` connections are open at once. A connection
//!   accepted beyond the cap is closed at once (the client sees the connection closed rather than
//!   a connect that hangs in the kernel's backlog), counted in
//!   `permit_connections_refused_total{reason="cap"}`, and logged at most once a second.
//! - **Header-read timeout.** A connection that does not deliver a complete request head within
//!   `header_read_timeout` (slowloris), or sits idle between requests that long, is closed. Over
//!   TLS the same bound covers the first byte and the handshake.
//! - **TLS.** The first byte of a connection to a TLS port is peeked: anything but a TLS
//!   handshake record gets `400` with the `tls_required` error body, then the connection closes.
//! - **Shutdown.** When `stop` resolves, the listener closes, idle connections close, and
//!   in-flight requests run to completion (the caller bounds how long it waits).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::TowerToHyperService;
use permit_wire::{ErrorBody, ErrorCode, ErrorDetail};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::metrics::Metrics;

/// `--header-read-timeout`'s default.
pub const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// `--connections-max`'s default: well below the usual 65 536 file descriptors, well above what
/// a node's clients and peers need.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;

/// Largest `--connections-max` accepted (far above any file-descriptor limit in practice).
pub const CONNECTIONS_MAX_LIMIT: usize = 1 << 24;

/// The least time between two warnings about refused connections.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Pause after a failed `accept` (out of file descriptors, say), so that the loop does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Longest time spent writing the plain-HTTP refusal and reading what the client still sends.
const REFUSAL_IO_TIMEOUT: Duration = Duration::from_secs(1);

/// Most bytes read and discarded from a plain-HTTP client before its connection closes.
const REFUSAL_DRAIN_BYTES_MAX: usize = 64 * 1024;

/// How connections are accepted and served.
#[derive(Clone)]
pub struct ListenerSettings {
    /// Longest wait for a complete request head (and, over TLS, for the handshake).
    pub header_read_timeout: Duration,
    /// Most connections open at once.
    pub connections_max: usize,
    /// Serves HTTPS when set.
    pub tls: Option<TlsAcceptor>,
}

/// Serves `router` on `listener` until `stop` resolves, then waits for the open connections to
/// finish their requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    settings: ListenerSettings,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let slots = Arc::new(Semaphore::new(settings.connections_max.clamp(1, CONNECTIONS_MAX_LIMIT)));
    let mut refusals = RefusalLog::default();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.connection_refused("cap");
            refusals.note(settings.connections_max);
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let open = OpenConnection::new(slot, metrics.clone());
        let connection =
            Connection { router: router.clone(), settings: settings.clone(), watcher: graceful.watcher() };
        tokio::spawn(connection.run(stream, open));
    }
    drop(listener);
    graceful.shutdown().await;
}

/// One accepted connection's share of the cap; gives it back when dropped.
struct OpenConnection {
    _slot: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

impl OpenConnection {
    fn new(slot: OwnedSemaphorePermit, metrics: Arc<Metrics>) -> OpenConnection {
        metrics.connection_opened();
        OpenConnection { _slot: slot, metrics }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.metrics.connection_closed();
    }
}

/// What a connection task needs.
struct Connection {
    router: Router,
    settings: ListenerSettings,
    watcher: Watcher,
}

impl Connection {
    /// Serves one connection to its end.
    async fn run(self, stream: TcpStream, open: OpenConnection) {
        match self.settings.tls.clone() {
            None => self.serve_http(stream).await,
            Some(acceptor) => self.serve_tls(stream, acceptor, &open.metrics).await,
        }
        drop(open);
    }

    /// Peeks at the first byte, refuses plain HTTP, completes the handshake, then serves.
    async fn serve_tls(self, stream: TcpStream, acceptor: TlsAcceptor, metrics: &Metrics) {
        let timeout = self.settings.header_read_timeout;
        let mut first = [0u8; 1];
        match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
            Ok(Ok(1..)) => {}
            _ => return, // closed, failed, or silent for too long
        }
        if first[0] != crate::tls::TLS_HANDSHAKE_BYTE {
            metrics.connection_refused("plain_http");
            refuse_plain_http(stream).await;
            return;
        }
        match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => self.serve_http(tls).await,
            Ok(Err(error)) => {
                metrics.connection_refused("tls_handshake");
                tracing::debug!(%error, "TLS handshake failed");
            }
            Err(_) => metrics.connection_refused("tls_handshake"),
        }
    }

    /// Serves HTTP/1.1 on a byte stream until the client closes, the header-read timeout
    /// fires, or shutdown has let its last request finish.
    async fn serve_http<I>(self, io: I)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = TowerToHyperService::new(self.router);
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.settings.header_read_timeout)
            .serve_connection(TokioIo::new(io), service);
        if let Err(error) = self.watcher.watch(connection).await {
            tracing::debug!(%error, "connection ended with an error");
        }
    }
}

/// Answers a plain-HTTP client on a TLS port with `400 tls_required` and closes, after reading
/// (a bounded amount of) what it sent so that the close does not reset the answer away.
async fn refuse_plain_http(mut stream: TcpStream) {
    let body = ErrorBody {
        error: ErrorDetail {
            code: ErrorCode::TlsRequired,
            message: "this port serves HTTPS only: use an https:// URL".to_owned(),
        },
    };
    let body = serde_json::to_string(&body).unwrap_or_default();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut scratch = [0u8; 4096];
        let mut drained = 0;
        while drained < REFUSAL_DRAIN_BYTES_MAX {
            match stream.read(&mut scratch).await? {
                0 => break,
                n => drained += n,
            }
        }
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(REFUSAL_IO_TIMEOUT, exchange).await;
}

/// Warns about connections refused at the cap, at most once per [`REFUSAL_LOG_INTERVAL`].
#[derive(Default)]
struct RefusalLog {
    last: Option<Instant>,
    since: u64,
}

impl RefusalLog {
    fn note(&mut self, cap: usize) {
        self.since += 1;
        if self.last.is_some_and(|last| last.elapsed() < REFUSAL_LOG_INTERVAL) {
            return;
        }
        tracing::warn!(
            refused = self.since,
            cap,
            "connection cap reached: closing new connections (--connections-max)"
        );
        self.last = Some(Instant::now());
        self.since = 0;
    }
}
