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
//! - **Body-read timeout.** Once a request's head has arrived, its body must arrive whole within
//!   `body_read_timeout` (the header-read timeout): a client that trickles its body, or never
//!   sends it, gets `408 body_timeout` and its connection closes (`DeadlineBody`). A body the
//!   client has already sent is never cut off, however long the server takes to read it.
//! - **Per-client cap.** At most `connections_per_client_max` client connections from one source
//!   address (IPv6 addresses count one by one) are open at once; more are refused (counted in
//!   `permit_connections_refused_total{reason="per_client"}`), so that one address cannot take
//!   every slot. A connection whose first request carries a valid peer credential stops counting
//!   towards its address's share (a follower forwards every client's request from one address).
//! - **Peer reserve.** On a node with a cluster secret, `PEER_CONNECTIONS_RESERVED` slots beyond
//!   `connections_max` serve peers only: a connection that finds the client slots full (or its
//!   address at its cap) takes one of them, and must prove within `PEER_PROOF_TIMEOUT` that it
//!   is a peer (a request with a valid credential); every request on it must carry one, else it
//!   gets `429 limit_exceeded` and is closed. When the reserve is full, a new connection evicts
//!   the oldest one that has not proved itself yet, so connections that send nothing cannot
//!   keep peers out: clients, with or without a token, cannot exhaust the connections Raft
//!   needs. See docs/security.md, "Abuse limits on the listener".
//! - **TLS.** The first byte of a connection to a TLS port is peeked: anything but a TLS
//!   handshake record gets `400` with the `tls_required` error body, then the connection closes.
//! - **Shutdown.** When `stop` resolves, the listener closes, idle connections close, and
//!   in-flight requests run to completion (the caller bounds how long it waits).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderValue, Request, Response};
use axum::response::IntoResponse;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use hyper_util::service::{TowerToHyperService, TowerToHyperServiceFuture};
use permit_wire::{ErrorBody, ErrorCode, ErrorDetail, PEER_ID_HEADER};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::metrics::Metrics;
use crate::peer::ClusterSecret;

/// `--header-read-timeout`'s default.
pub(crate) const HEADER_READ_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

/// `--connections-max`'s default: well below the usual 65 536 file descriptors, well above what
/// a node's clients and peers need.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;

/// Largest `--connections-max` accepted (far above any file-descriptor limit in practice).
pub(crate) const CONNECTIONS_MAX_LIMIT: usize = 1 << 24;

/// `--connections-per-client-max`'s default: a quarter of the default cap, so that at least four
/// addresses are needed to fill it, and far above what one client process opens (the benchmark
/// opens at most a few hundred connections, from one address).
pub const CONNECTIONS_PER_CLIENT_MAX_DEFAULT: usize = 1024;

/// Connection slots beyond `--connections-max` that only peers may keep, on a node with a
/// cluster secret: enough for the Raft traffic and forwarded requests of a few peers while the
/// clients' slots are full.
pub(crate) const PEER_CONNECTIONS_RESERVED: usize = 64;

/// How long a connection in a peer slot has to send a request with a valid peer credential
/// (peers send theirs as soon as they connect) before it is closed.
const PEER_PROOF_TIMEOUT: Duration = Duration::from_secs(1);

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
pub(crate) struct ListenerSettings {
    /// Longest wait for a complete request head (and, over TLS, for the handshake).
    pub(crate) header_read_timeout: Duration,
    /// Longest wait for a request's whole body once its head arrived.
    pub(crate) body_read_timeout: Duration,
    /// Most client connections open at once.
    pub(crate) connections_max: usize,
    /// Most client connections from one source address open at once.
    pub(crate) connections_per_client_max: usize,
    /// The cluster secret: with it, [`PEER_CONNECTIONS_RESERVED`] more slots serve peers only.
    pub(crate) cluster_secret: Option<ClusterSecret>,
    /// This node's id, which peers sign their requests for.
    pub(crate) node_id: u64,
    /// Serves HTTPS when set.
    pub(crate) tls: Option<TlsAcceptor>,
}

/// Serves `router` on `listener` until `stop` resolves, then waits for the open connections to
/// finish their requests.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    settings: ListenerSettings,
    metrics: Arc<Metrics>,
    stop: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let admission = Admission::new(&settings);
    let mut refusals = RefusalLog::default();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let (stream, source) = match accepted {
            Ok((stream, source)) => (stream, source.ip().to_canonical()),
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let slot = match admission.admit(source) {
            Ok(slot) => slot,
            Err(reason) => {
                metrics.connection_refused(reason.label());
                refusals.note(reason, &settings);
                drop(stream);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let open = OpenConnection::new(metrics.clone());
        let connection =
            Connection { router: router.clone(), settings: settings.clone(), watcher: graceful.watcher() };
        tokio::spawn(connection.run(stream, slot, open));
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Why a connection was refused at accept (or closed before it served a request).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// Every client slot (and peer slot) is taken.
    Cap,
    /// Its source address has its share of the client slots.
    PerClient,
}

impl Refusal {
    /// The `reason` label of `permit_connections_refused_total`.
    fn label(self) -> &'static str {
        match self {
            Refusal::Cap => "cap",
            Refusal::PerClient => "per_client",
        }
    }
}

/// Decides which slot, if any, an accepted connection gets.
struct Admission {
    /// The client slots (`--connections-max`).
    clients: Arc<Semaphore>,
    /// Open client connections per source address.
    per_client: Arc<Mutex<HashMap<IpAddr, usize>>>,
    per_client_max: usize,
    /// The peer slots, on a node with a cluster secret.
    reserve: Option<Arc<Reserve>>,
}

/// What an accepted connection holds until it closes.
enum Slot {
    /// A client slot, counted against its address until it proves to be a peer's.
    Client { _slot: OwnedSemaphorePermit, address: AddressShare },
    /// A peer slot: the connection must prove it is a peer's.
    Peer { slot: PeerSlot, evicted: oneshot::Receiver<()>, why: Refusal },
}

impl Admission {
    fn new(settings: &ListenerSettings) -> Admission {
        Admission {
            clients: Arc::new(Semaphore::new(settings.connections_max.clamp(1, CONNECTIONS_MAX_LIMIT))),
            per_client: Arc::default(),
            per_client_max: settings.connections_per_client_max.max(1),
            reserve: settings
                .cluster_secret
                .as_ref()
                .map(|_| Arc::new(Reserve::new(PEER_CONNECTIONS_RESERVED))),
        }
    }

    /// A client slot if one is free and `source` has fewer than its share, else a peer slot
    /// (which the connection must earn), else the reason of the refusal.
    fn admit(&self, source: IpAddr) -> Result<Slot, Refusal> {
        let why = {
            // An address is in the map only while it has a client connection open, so that
            // refused connections from many addresses leave nothing behind.
            let mut counts = self.per_client.lock().unwrap_or_else(PoisonError::into_inner);
            if counts.get(&source).is_some_and(|count| *count >= self.per_client_max) {
                Refusal::PerClient
            } else if let Ok(slot) = self.clients.clone().try_acquire_owned() {
                *counts.entry(source).or_default() += 1;
                let address = AddressShare { counts: self.per_client.clone(), source, counted: true };
                return Ok(Slot::Client { _slot: slot, address });
            } else {
                Refusal::Cap
            }
        };
        match self.reserve.as_ref().and_then(Reserve::admit) {
            Some((slot, evicted)) => Ok(Slot::Peer { slot, evicted, why }),
            None => Err(why),
        }
    }
}

/// A client connection's place in its source address's count.
struct AddressShare {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    source: IpAddr,
    counted: bool,
}

impl AddressShare {
    /// Stops counting this connection against its address (it proved to be a peer's).
    fn release(&mut self) {
        if std::mem::take(&mut self.counted) {
            let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(count) = counts.get_mut(&self.source) {
                *count -= 1;
                if *count == 0 {
                    counts.remove(&self.source);
                }
            }
        }
    }
}

impl Drop for AddressShare {
    fn drop(&mut self) {
        self.release();
    }
}

/// The peer slots beyond the client cap.
struct Reserve {
    max: usize,
    state: Mutex<ReserveState>,
}

#[derive(Default)]
struct ReserveState {
    /// Connections in peer slots.
    open: usize,
    next_id: u64,
    /// Those that have not proved to be peers yet, oldest first, with what closes each.
    unproven: VecDeque<(u64, oneshot::Sender<()>)>,
}

/// One connection's peer slot; gives it back when dropped.
struct PeerSlot {
    reserve: Arc<Reserve>,
    id: u64,
}

impl Reserve {
    fn new(max: usize) -> Reserve {
        Reserve { max, state: Mutex::default() }
    }

    /// A peer slot, and what tells its connection it was evicted. When every slot is taken, the
    /// oldest connection that has not proved to be a peer's is evicted (it closes as soon as its
    /// task runs, so the count exceeds `max` only until then) and the new one takes its place;
    /// when all of them proved themselves, `None`.
    fn admit(self: &Arc<Reserve>) -> Option<(PeerSlot, oneshot::Receiver<()>)> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.open >= self.max {
            let (_, evict) = state.unproven.pop_front()?;
            let _ = evict.send(());
        }
        state.open += 1;
        let id = state.next_id;
        state.next_id += 1;
        let (evict, evicted) = oneshot::channel();
        state.unproven.push_back((id, evict));
        Some((PeerSlot { reserve: self.clone(), id }, evicted))
    }

    /// Marks connection `id` as a peer's: it can no longer be evicted.
    fn proven(&self, id: u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.unproven.retain(|(unproven, _)| *unproven != id);
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut state = self.reserve.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.open -= 1;
        state.unproven.retain(|(unproven, _)| *unproven != self.id);
    }
}

/// One accepted connection in the `permit_connections_open` gauge.
struct OpenConnection {
    metrics: Arc<Metrics>,
}

impl OpenConnection {
    fn new(metrics: Arc<Metrics>) -> OpenConnection {
        metrics.connection_opened();
        OpenConnection { metrics }
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
    /// Serves one connection to its end; a connection in a peer slot ends early if it is
    /// evicted or does not prove to be a peer's in time.
    async fn run(self, stream: TcpStream, slot: Slot, open: OpenConnection) {
        let metrics = open.metrics.clone();
        let (role, proof, client_slot) = match slot {
            Slot::Client { _slot: slot, address } => (
                Role::Client { decided: AtomicBool::new(false), address: Mutex::new(address) },
                None,
                Some(slot),
            ),
            Slot::Peer { slot, evicted, why } => {
                let proven = Arc::new(AtomicBool::new(false));
                (Role::Peer { slot, proven: proven.clone(), why }, Some((evicted, proven, why)), None)
            }
        };
        let state =
            Arc::new(ConnectionState { role, refused: AtomicBool::new(false), metrics: metrics.clone() });
        let serve = async {
            match self.settings.tls.clone() {
                None => self.serve_http(stream, state.clone()).await,
                Some(acceptor) => self.serve_tls(stream, acceptor, &metrics, state.clone()).await,
            }
        };
        match proof {
            None => serve.await,
            Some((mut evicted, proven, why)) => tokio::select! {
                () = serve => {}
                () = unproven_end(&mut evicted, &proven) => {
                    if !state.refused.swap(true, Ordering::Relaxed) {
                        metrics.connection_refused(why.label());
                    }
                }
            },
        }
        drop(client_slot);
        drop(open);
    }

    /// Peeks at the first byte, refuses plain HTTP, completes the handshake, then serves.
    async fn serve_tls(
        self,
        stream: TcpStream,
        acceptor: TlsAcceptor,
        metrics: &Metrics,
        state: Arc<ConnectionState>,
    ) {
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
            Ok(Ok(tls)) => self.serve_http(tls, state).await,
            Ok(Err(error)) => {
                metrics.connection_refused("tls_handshake");
                tracing::debug!(%error, "TLS handshake failed");
            }
            Err(_) => metrics.connection_refused("tls_handshake"),
        }
    }

    /// Serves HTTP/1.1 on a byte stream until the client closes, the header-read timeout
    /// fires, or shutdown has let its last request finish.
    async fn serve_http<I>(self, io: I, state: Arc<ConnectionState>)
    where
        I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let service = Service {
            router: TowerToHyperService::new(self.router),
            body_read_timeout: self.settings.body_read_timeout,
            secret: self.settings.cluster_secret.clone(),
            node_id: self.settings.node_id,
            state,
        };
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
            retry_after_ms: None,
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
    fn note(&mut self, why: Refusal, settings: &ListenerSettings) {
        self.since += 1;
        if self.last.is_some_and(|last| last.elapsed() < REFUSAL_LOG_INTERVAL) {
            return;
        }
        match why {
            Refusal::Cap => tracing::warn!(
                refused = self.since,
                cap = settings.connections_max,
                "connection cap reached: closing new connections (--connections-max)"
            ),
            Refusal::PerClient => tracing::warn!(
                refused = self.since,
                cap = settings.connections_per_client_max,
                "an address reached its share of connections: closing its new ones \
                 (--connections-per-client-max)"
            ),
        }
        self.last = Some(Instant::now());
        self.since = 0;
    }
}

/// Ends when a connection in a peer slot must close: it was evicted, or
/// [`PEER_PROOF_TIMEOUT`] passed before it proved to be a peer's. Never ends for one that did.
async fn unproven_end(evicted: &mut oneshot::Receiver<()>, proven: &AtomicBool) {
    tokio::select! {
        // An error: the sender was dropped because the connection proved itself.
        evicted = evicted => if evicted.is_ok() { return },
        () = tokio::time::sleep(PEER_PROOF_TIMEOUT) => if !proven.load(Ordering::Acquire) { return },
    }
    std::future::pending().await
}

/// What a connection is, as far as its slot goes.
enum Role {
    /// In a client slot; its address share is released if its first request is a peer's.
    Client {
        /// Whether its first request was seen: only that one decides.
        decided: AtomicBool,
        address: Mutex<AddressShare>,
    },
    /// In a peer slot: every request must carry a valid peer credential.
    Peer { slot: PeerSlot, proven: Arc<AtomicBool>, why: Refusal },
}

/// The state one connection's requests share.
struct ConnectionState {
    role: Role,
    /// Whether the connection was already counted as refused.
    refused: AtomicBool,
    metrics: Arc<Metrics>,
}

/// The per-connection service: checks a peer slot's credential, puts the body under its
/// deadline, and hands the request to the router.
struct Service {
    router: TowerToHyperService<Router>,
    body_read_timeout: Duration,
    secret: Option<ClusterSecret>,
    /// This node's id: peers sign their requests for it.
    node_id: u64,
    state: Arc<ConnectionState>,
}

type Routed = TowerToHyperServiceFuture<Router, Request<DeadlineBody>>;

impl hyper::service::Service<Request<Incoming>> for Service {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = futures::future::Either<std::future::Ready<Result<Response<Body>, Self::Error>>, Routed>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if let Some(refusal) = self.check_slot(&request) {
            return futures::future::Either::Left(std::future::ready(Ok(refusal)));
        }
        let deadline = tokio::time::Instant::now() + self.body_read_timeout;
        let request = request.map(|body| DeadlineBody { inner: body, deadline, sleep: None, expired: false });
        futures::future::Either::Right(self.router.call(request))
    }
}

impl Service {
    /// Whether `request` carries a valid peer credential.
    fn is_peers(&self, request: &Request<Incoming>) -> bool {
        request.headers().contains_key(PEER_ID_HEADER)
            && self.secret.as_ref().is_some_and(|secret| {
                let path = request.uri().path_and_query().map_or("", |p| p.as_str());
                crate::peer::signed_for(
                    secret,
                    self.node_id,
                    request.method().as_str(),
                    path,
                    request.headers(),
                )
            })
    }

    /// The refusal of a request on a peer slot without a peer credential; on a client slot, a
    /// first request from a peer frees its address's share.
    fn check_slot(&self, request: &Request<Incoming>) -> Option<Response<Body>> {
        match &self.state.role {
            Role::Client { decided, address } => {
                if !decided.swap(true, Ordering::Relaxed) && self.is_peers(request) {
                    address.lock().unwrap_or_else(PoisonError::into_inner).release();
                }
                None
            }
            Role::Peer { slot, proven, why } => {
                if self.is_peers(request) {
                    if !proven.swap(true, Ordering::AcqRel) {
                        slot.reserve.proven(slot.id);
                    }
                    return None;
                }
                if !self.state.refused.swap(true, Ordering::Relaxed) {
                    self.state.metrics.connection_refused(why.label());
                }
                let message = match why {
                    Refusal::Cap => {
                        "this node has no connection slot free for clients (--connections-max); retry later"
                    }
                    Refusal::PerClient => {
                        "this address has its share of the connections already \
                         (--connections-per-client-max); close some, or retry later"
                    }
                };
                let mut response =
                    crate::error::ApiError::new(ErrorCode::LimitExceeded, message).into_response();
                let headers = response.headers_mut();
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                Some(response)
            }
        }
    }
}

/// A request body that must arrive whole by `deadline` (see the module docs): a client that
/// sends its head and then trickles the body, or never sends it, is answered `408 body_timeout`
/// (the handler's extractor maps [`BodyReadTimeout`]) and the connection closes (hyper does not
/// keep a connection whose request body was not read to its end). Only waiting counts: bytes
/// already received are handed over even after the deadline.
pub(crate) struct DeadlineBody {
    inner: Incoming,
    deadline: tokio::time::Instant,
    /// The timer, made only when the body first has to wait.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    expired: bool,
}

/// The error of a [`DeadlineBody`] whose deadline passed.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request body did not arrive in time: the whole body must follow its head within the header-read timeout")]
pub(crate) struct BodyReadTimeout;

impl hyper::body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.expired {
            return Poll::Ready(Some(Err(Box::new(BodyReadTimeout))));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|frame| frame.map_err(Into::into))),
            Poll::Pending => {
                let deadline = self.deadline;
                let sleep = self.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        self.expired = true;
                        Poll::Ready(Some(Err(Box::new(BodyReadTimeout))))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Whether `error` (an extractor's or `to_bytes`'s) is, or was caused by, a body that did not
/// arrive in time.
pub(crate) fn is_body_timeout(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error.is::<BodyReadTimeout>() {
            return true;
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(connections_max: usize, per_client: usize, secret: bool) -> ListenerSettings {
        ListenerSettings {
            header_read_timeout: HEADER_READ_TIMEOUT_DEFAULT,
            body_read_timeout: HEADER_READ_TIMEOUT_DEFAULT,
            connections_max,
            connections_per_client_max: per_client,
            cluster_secret: secret
                .then(|| ClusterSecret::new(b"Zm9vYmFyYmF6cXV4cXV1eHF1dXpxdXV4ZmxvYmJsZQ==").unwrap()),
            node_id: 1,
            tls: None,
        }
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn an_address_gets_its_share_and_leaves_nothing_behind() {
        let admission = Admission::new(&settings(3, 2, false));
        let a1 = admission.admit(A).unwrap();
        let a2 = admission.admit(A).unwrap();
        assert_eq!(admission.admit(A).err(), Some(Refusal::PerClient));
        let b1 = admission.admit(B).unwrap();
        assert_eq!(admission.admit(B).err(), Some(Refusal::Cap), "the cap holds for everyone");
        drop(a1);
        let a3 = admission.admit(A).unwrap();
        drop((a2, a3, b1));
        assert!(
            admission.per_client.lock().unwrap().is_empty(),
            "refused and closed addresses are forgotten"
        );
    }

    #[test]
    fn a_peer_slot_goes_to_a_newcomer_before_an_unproven_connection_but_not_before_a_peer() {
        let admission = Admission::new(&settings(1, 1, true));
        let reserve = admission.reserve.clone().unwrap();
        let _client = admission.admit(A).unwrap();
        let take = || match admission.admit(B) {
            Ok(Slot::Peer { slot, evicted, why }) => {
                assert_eq!(why, Refusal::Cap);
                (slot, evicted)
            }
            Ok(Slot::Client { .. }) => panic!("a client slot beyond the cap"),
            Err(refusal) => panic!("refused: {refusal:?}"),
        };
        let mut slots: Vec<_> = (0..PEER_CONNECTIONS_RESERVED).map(|_| take()).collect();
        // Every peer slot is taken by an unproven connection: a newcomer evicts the oldest.
        let (newcomer, _) = take();
        assert_eq!(slots[0].1.try_recv(), Ok(()), "the oldest was not evicted");
        assert_eq!(slots[1].1.try_recv(), Err(oneshot::error::TryRecvError::Empty));
        slots.remove(0);
        // Once every slot's connection proved itself a peer's, a newcomer is refused.
        reserve.proven(newcomer.id);
        for (slot, _) in &slots {
            reserve.proven(slot.id);
        }
        assert_eq!(admission.admit(B).err(), Some(Refusal::Cap));
        drop(slots.pop());
        assert!(matches!(admission.admit(B), Ok(Slot::Peer { .. })), "a freed peer slot is given again");
    }
}
