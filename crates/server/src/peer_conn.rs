//! The one HTTP client a node calls its peers with: Raft RPCs (`raft/network.rs`), client
//! requests forwarded to the leader (`api/forward.rs`), and health probes (the removal watcher in
//! `raft/removal.rs`, the cluster view and `cluster add`'s check in `api/cluster.rs`).
//! [`PeerClient`] knows how the node reaches its peers: from its own address, and over HTTPS
//! with the cluster's TLS configuration when it has one (its [`scheme`](PeerClient::scheme) is
//! the one the peers' URLs have); every [`PeerPool`] is made from it, so no caller picks a scheme
//! or a TLS setting of its own.
//!
//! Each connection is HTTP/1.1, driven by the task that sends on it. The task that waits for an
//! answer (openraft's replication stream, an election, a read barrier's round; the handler of a
//! forwarded request; a probe) polls hyper's client connection itself while its request is in
//! flight (`tokio::select!` over the exchange and the connection), instead of a connection task
//! of its own as with reqwest: no wake-up to another task and back for each request and its
//! answer (`docs/performance.md`, *Peer RPCs on the sending task*).
//!
//! Between requests a connection waits in its peer's idle list ([`PeerPool`]): openraft 0.9
//! makes a new network client for every read barrier's round (`handle_check_is_leader_request`),
//! so a connection per client would be a connection per round. At most the pool's `idle_max`
//! wait per peer; one idle for [`PEER_POOL_IDLE`] is closed rather than used, before the peer's
//! header-read timeout closes it under a request, and one the peer closed meanwhile is dropped
//! when taken. A request that fails or times out (the caller drops its future) takes its
//! connection with it. One that failed on a reused connection is sent again, once, on a new
//! one, only when the caller says it may be ([`Resend`]): Raft copes with a message delivered
//! twice, a forwarded client write does not.
//!
//! [`PEER_POOL_IDLE`]: crate::tls::PEER_POOL_IDLE

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpSocket, TcpStream};

use permit_wire::Health;

use crate::tls::PEER_POOL_IDLE;

/// An error of one exchange with a peer.
pub(crate) type PeerIoError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request to a peer got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerError {
    /// No connection to the peer could be made: the request was not sent.
    #[error("no connection: {0}")]
    Connect(PeerIoError),
    /// The request may have reached the peer; its answer did not come back whole.
    #[error("no answer: {0}")]
    Lost(PeerIoError),
}

/// Whether a request lost on a reused connection may be sent again on a new one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Yes: the peer copes with it twice (a Raft message, a health probe).
    Once,
    /// No: it may have been applied (a forwarded client request).
    Never,
}

/// One request to a peer.
pub(crate) struct PeerRequest<'a> {
    pub(crate) method: hyper::Method,
    /// Path and query.
    pub(crate) path: &'a str,
    pub(crate) headers: &'a hyper::HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) resend: Resend,
}

/// How a node reaches its peers: the address it dials from and, on a TLS cluster, the TLS it
/// speaks. Pools made from one client share these (and nothing else).
#[derive(Clone)]
pub(crate) struct PeerClient {
    /// Dial from this address when it is a specific one (so peers and fault-injecting proxies
    /// see which node connects).
    local: Option<IpAddr>,
    /// TLS to the peers, when the node has it.
    tls: Option<tokio_rustls::TlsConnector>,
    /// `https` with TLS, else `http`.
    scheme: &'static str,
}

impl PeerClient {
    /// The client of a node that listens on `local` (dialling from it when it is a specific
    /// address), over HTTPS with the peer side of `tls` when the node has TLS.
    ///
    /// # Errors
    /// When a TLS file cannot be read.
    pub(crate) fn new(
        local: Option<IpAddr>,
        tls: Option<&crate::tls::TlsConfig>,
    ) -> anyhow::Result<PeerClient> {
        let scheme = crate::tls::scheme(tls);
        let tls = tls.map(crate::tls::peer_client_config).transpose()?;
        Ok(PeerClient {
            local: local.filter(|ip| !ip.is_unspecified()),
            tls: tls.map(tokio_rustls::TlsConnector::from),
            scheme,
        })
    }

    /// The URL scheme the peers are reached with: `https` on a TLS cluster.
    pub(crate) fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// A pool of connections to the peers, with no connection yet.
    pub(crate) fn pool(&self, limits: PoolLimits) -> PeerPool {
        PeerPool { client: self.clone(), limits, idle: Arc::default() }
    }
}

/// What a [`PeerPool`] waits for and keeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PoolLimits {
    /// A connection (with its TLS handshake) must be up within this.
    pub(crate) connect_timeout: Duration,
    /// The most idle connections kept per peer.
    pub(crate) idle_max: usize,
    /// The largest answer body accepted.
    pub(crate) answer_max: usize,
}

/// Connections to the peers, made by a [`PeerClient`], and the idle ones, by peer address.
/// Clones share the idle lists.
#[derive(Clone)]
pub(crate) struct PeerPool {
    client: PeerClient,
    limits: PoolLimits,
    idle: Arc<Mutex<HashMap<String, Vec<PeerConn>>>>,
}

impl PeerPool {
    /// The health of the peer at `addr` (`GET /v1/health`): its status and body, or `None` when
    /// it gives no such answer within `timeout`.
    pub(crate) async fn health(&self, addr: &str, timeout: Duration) -> Option<(hyper::StatusCode, Health)> {
        let headers = hyper::HeaderMap::new();
        // A health probe changes nothing: sending it twice is harmless.
        let request = PeerRequest {
            method: hyper::Method::GET,
            path: "/v1/health",
            headers: &headers,
            body: Bytes::new(),
            resend: Resend::Once,
        };
        let answer = tokio::time::timeout(timeout, self.send(addr, request)).await.ok()?.ok()?;
        let health = serde_json::from_slice::<Health>(answer.body()).ok()?;
        Some((answer.status(), health))
    }

    /// Sends `request` to the peer at `addr` (`host:port`), on an idle connection to it or a new
    /// one, and reads the answer whole.
    ///
    /// # Errors
    /// [`PeerError::Connect`] when no connection could be made (nothing was sent);
    /// [`PeerError::Lost`] when the peer closed the connection before its answer, or answered
    /// more than the pool's `answer_max`.
    pub(crate) async fn send(
        &self,
        addr: &str,
        request: PeerRequest<'_>,
    ) -> Result<hyper::Response<Bytes>, PeerError> {
        let build = || {
            let mut outgoing = hyper::Request::builder().method(request.method.clone()).uri(request.path);
            if let Some(headers) = outgoing.headers_mut() {
                headers.clone_from(request.headers);
                headers
                    .insert(hyper::header::HOST, addr.parse().map_err(|e| PeerError::Connect(Box::new(e)))?);
            }
            outgoing.body(Body::new(request.body.clone())).map_err(|e| PeerError::Connect(Box::new(e)))
        };
        let mut reuse = true;
        loop {
            let idle = if reuse { self.take_idle(addr) } else { None };
            let reused = idle.is_some();
            let mut peer = match idle {
                Some(peer) => peer,
                None => self.connect(addr).await.map_err(PeerError::Connect)?,
            };
            match Self::exchange(&mut peer, build()?, self.limits.answer_max).await {
                Ok((answer, open)) => {
                    if open {
                        peer.used = Instant::now();
                        self.put_idle(addr, peer);
                    }
                    return Ok(answer);
                }
                // An idle connection that the peer closed since can go unnoticed until it is
                // used.
                Err(_) if reused && request.resend == Resend::Once => reuse = false,
                Err(error) => return Err(PeerError::Lost(error)),
            }
        }
    }

    /// Sends `request` on `peer` and reads the answer, polling the connection meanwhile: the
    /// answer and whether the connection stays open.
    async fn exchange(
        peer: &mut PeerConn,
        request: hyper::Request<Body>,
        answer_max: usize,
    ) -> Result<(hyper::Response<Bytes>, bool), PeerIoError> {
        let PeerConn { sender, conn, .. } = peer;
        let Some(connection) = conn.as_mut() else { return Err("the connection ended".into()) };
        let exchange = async {
            sender.ready().await?;
            let (parts, body) = sender.send_request(request).await?.into_parts();
            let body = Limited::new(body, answer_max).collect().await?.to_bytes();
            Ok::<_, PeerIoError>(hyper::Response::from_parts(parts, body))
        };
        tokio::pin!(exchange);
        tokio::select! {
            biased;
            answer = &mut exchange => Ok((answer?, true)),
            ended = connection.as_mut() => {
                // The peer closed the connection, maybe right after its answer. Dropping the
                // connection ends the exchange: with the answer if it was read whole, else with
                // an error (awaited beside a finished connection, it would wait forever).
                *conn = None;
                match exchange.await {
                    Ok(answer) => Ok((answer, false)),
                    Err(error) => Err(ended.err().map_or(error, Into::into)),
                }
            }
        }
    }

    /// The most recently used idle connection to `addr` that is still fit for a request.
    fn take_idle(&self, addr: &str) -> Option<PeerConn> {
        let mut idle = self.idle.lock().expect("peer pool lock");
        let list = idle.get_mut(addr)?;
        while let Some(mut peer) = list.pop() {
            // A connection the peer closed while it was idle ends when polled (without waiting).
            let ended = peer.conn.as_mut().is_none_or(|conn| conn.as_mut().now_or_never().is_some());
            if !ended && peer.used.elapsed() < PEER_POOL_IDLE && !peer.sender.is_closed() {
                return Some(peer);
            }
        }
        None
    }

    /// Keeps `peer` for the next request to `addr`, unless the pool's `idle_max` already wait.
    fn put_idle(&self, addr: &str, peer: PeerConn) {
        let mut idle = self.idle.lock().expect("peer pool lock");
        let list = idle.entry(addr.to_owned()).or_default();
        // Oldest first: drop the ones too old to be used, then keep at most the limit.
        list.retain(|peer| peer.used.elapsed() < PEER_POOL_IDLE);
        if list.len() < self.limits.idle_max {
            list.push(peer);
        }
    }

    /// The idle connections kept for `addr` now.
    #[cfg(test)]
    fn idle_count(&self, addr: &str) -> usize {
        self.idle.lock().expect("peer pool lock").get(addr).map_or(0, Vec::len)
    }

    async fn connect(&self, addr: &str) -> Result<PeerConn, PeerIoError> {
        let connect_timeout = self.limits.connect_timeout;
        let stream = tokio::time::timeout(connect_timeout, self.stream(addr))
            .await
            .map_err(|_| format!("no connection to {addr} within {connect_timeout:?}"))??;
        let (sender, conn) = http1::handshake(TokioIo::new(stream)).await?;
        Ok(PeerConn { sender, conn: Some(Box::pin(conn)), used: Instant::now() })
    }

    async fn stream(&self, addr: &str) -> Result<Box<dyn Io>, PeerIoError> {
        let mut last_error: PeerIoError = format!("{addr} resolves to no address").into();
        for target in tokio::net::lookup_host(addr).await? {
            match self.tcp(target).await {
                Ok(tcp) => {
                    tcp.set_nodelay(true)?;
                    let Some(tls) = &self.client.tls else { return Ok(Box::new(tcp)) };
                    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
                    let host = host.trim_start_matches('[').trim_end_matches(']');
                    let name = rustls::pki_types::ServerName::try_from(host.to_owned())?;
                    return Ok(Box::new(tls.connect(name, tcp).await?));
                }
                Err(e) => last_error = e.into(),
            }
        }
        Err(last_error)
    }

    async fn tcp(&self, target: SocketAddr) -> std::io::Result<TcpStream> {
        let socket = if target.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        if let Some(local) = self.client.local.filter(|ip| ip.is_ipv4() == target.is_ipv4()) {
            socket.bind(SocketAddr::new(local, 0))?;
        }
        socket.connect(target).await
    }
}

/// A byte stream to a peer: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Send + Sync + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Sync + Unpin> Io for T {}

type Body = Full<Bytes>;

/// hyper's half of a connection: polled while an exchange is in flight.
type Connection = http1::Connection<TokioIo<Box<dyn Io>>, Body>;

struct PeerConn {
    sender: http1::SendRequest<Body>,
    /// `None` once it has ended.
    conn: Option<Pin<Box<Connection>>>,
    used: Instant,
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server on a free loopback port that accepts `connections` connections in turn and on
    /// each answers `per_connection` requests with `answer`; returns its address and, when it
    /// is done, the peer address of each connection and the requests read. It keeps the
    /// connections open until the caller drops what it returned, or closes each after its
    /// answers with `close`.
    async fn serve_and(
        connections: usize,
        per_connection: usize,
        answer: &'static [u8],
        close: bool,
    ) -> (String, tokio::task::JoinHandle<Vec<(SocketAddr, Vec<String>, Option<TcpStream>)>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = tokio::spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..connections {
                let (mut socket, from) = listener.accept().await.expect("accept");
                let mut requests = Vec::new();
                for _ in 0..per_connection {
                    requests.push(read_request(&mut socket).await);
                    socket.write_all(answer).await.expect("write");
                }
                seen.push((from, requests, (!close).then_some(socket)));
            }
            seen
        });
        (addr, server)
    }

    /// Reads one request (its head and `content-length` body) from `socket`.
    async fn read_request(socket: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let head_len = loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            assert!(socket.read_buf(&mut buf).await.expect("read") > 0, "client closed");
        };
        let head = String::from_utf8(buf[..head_len].to_vec()).expect("utf-8").to_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length: "))
            .map_or(0, |v| v.trim().parse::<usize>().expect("length"));
        while buf.len() < head_len + length {
            assert!(socket.read_buf(&mut buf).await.expect("read") > 0, "client closed");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    async fn serve(
        connections: usize,
        per_connection: usize,
        answer: &'static [u8],
    ) -> (String, tokio::task::JoinHandle<Vec<(SocketAddr, Vec<String>, Option<TcpStream>)>>) {
        serve_and(connections, per_connection, answer, false).await
    }

    /// A pool as the Raft network makes it.
    fn pool(local: Option<IpAddr>) -> PeerPool {
        let client = PeerClient::new(local, None).expect("a client without TLS");
        client.pool(PoolLimits { connect_timeout: Duration::from_secs(2), idle_max: 4, answer_max: 1 << 20 })
    }

    /// POSTs `body` as a Raft RPC is sent (`Resend::Once`): the answer's status and body.
    async fn post(
        pool: &PeerPool,
        addr: &str,
        path: &str,
        headers: &[(&'static str, String)],
        body: Vec<u8>,
    ) -> Result<(hyper::StatusCode, Bytes), PeerError> {
        send(pool, addr, path, headers, body, Resend::Once).await
    }

    async fn send(
        pool: &PeerPool,
        addr: &str,
        path: &str,
        headers: &[(&'static str, String)],
        body: Vec<u8>,
        resend: Resend,
    ) -> Result<(hyper::StatusCode, Bytes), PeerError> {
        let mut map = hyper::HeaderMap::new();
        map.insert(hyper::header::CONTENT_TYPE, "application/octet-stream".parse().unwrap());
        for (name, value) in headers {
            map.insert(*name, value.parse().unwrap());
        }
        let request =
            PeerRequest { method: hyper::Method::POST, path, headers: &map, body: body.into(), resend };
        let answer = pool.send(addr, request).await?;
        Ok((answer.status(), answer.into_body()))
    }

    /// A health probe GETs `/v1/health` and reads the body whatever the status (a 503 names
    /// its reason); it gives up within its timeout on a peer that accepts and never answers.
    #[tokio::test]
    async fn a_health_probe_reads_the_body_of_any_status_and_gives_up_in_time() {
        let body = r#"{"status":"degraded","reason":"removed","node_id":3,"raft_leader":null,"raft_role":"learner","raft_term":4,"applied_index":9,"members":[1,2]}"#;
        let answer =
            format!("HTTP/1.1 503 Service Unavailable\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        let (addr, server) = serve(1, 1, Box::leak(answer.into_bytes().into_boxed_slice())).await;
        let pool = pool(None);
        let (status, health) = pool.health(&addr, Duration::from_secs(5)).await.expect("an answer");
        assert_eq!(status, hyper::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!((health.node_id, health.members), (3, vec![1, 2]));
        assert_eq!(health.reason, Some(permit_wire::NotReady::Removed));
        let seen = server.await.expect("server");
        assert!(seen[0].1[0].starts_with("GET /v1/health HTTP/1.1\r\n"), "{:?}", seen[0].1);

        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = silent.local_addr().expect("addr").to_string();
        let held = tokio::spawn(async move { silent.accept().await });
        let started = Instant::now();
        assert!(pool.health(&addr, Duration::from_millis(200)).await.is_none());
        assert!(started.elapsed() < Duration::from_secs(2), "the probe waited {:?}", started.elapsed());
        held.abort();
    }

    #[tokio::test]
    async fn rpcs_share_one_connection_and_carry_their_headers() {
        let (addr, server) = serve(1, 3, b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabc").await;
        let pool = pool(Some("127.0.0.1".parse().unwrap()));
        let headers = [("permit-peer-id", "2".to_owned())];
        for i in 0..3u8 {
            // A clone per RPC, as openraft makes a network client per read barrier round.
            let pool = pool.clone();
            let post = post(&pool, &addr, "/raft/append", &headers, vec![i; 5]);
            let (status, body) = tokio::time::timeout(Duration::from_secs(5), post)
                .await
                .unwrap_or_else(|_| panic!("RPC {i} unanswered: on a new connection?"))
                .unwrap_or_else(|e| panic!("answer {i}: {e}"));
            assert_eq!((status.as_u16(), &body[..]), (200, &b"abc"[..]));
        }
        let seen = server.await.expect("server");
        assert_eq!(seen.len(), 1, "three RPCs, one connection");
        let (from, requests, _) = &seen[0];
        assert_eq!(from.ip(), "127.0.0.1".parse::<IpAddr>().unwrap(), "dialled from the local address");
        for (i, request) in requests.iter().enumerate() {
            assert!(request.starts_with("POST /raft/append HTTP/1.1\r\n"), "{request}");
            let lower = request.to_lowercase();
            assert!(lower.contains(&format!("host: {addr}\r\n")), "{request}");
            assert!(lower.contains("permit-peer-id: 2\r\n"), "{request}");
            assert!(lower.contains("content-type: application/octet-stream\r\n"), "{request}");
            assert!(request.ends_with(&String::from_utf8(vec![i as u8; 5]).unwrap()), "{request:?}");
        }
    }

    #[tokio::test]
    async fn concurrent_rpcs_open_connections_and_at_most_four_stay_idle() {
        // Six RPCs at once, each on a connection of its own; the server answers each once.
        let (addr, server) = serve(6, 1, b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx").await;
        let pool = pool(None);
        let calls = (0..6).map(|_| post(&pool, &addr, "/raft/vote", &[], vec![1]));
        let answers = futures::future::join_all(calls).await;
        assert!(answers.iter().all(|a| a.as_ref().is_ok_and(|(status, _)| status.as_u16() == 200)));
        assert_eq!(server.await.expect("server").len(), 6);
        assert_eq!(pool.idle_count(&addr), pool.limits.idle_max);
    }

    #[tokio::test]
    async fn a_closed_connection_is_replaced_and_a_dead_peer_is_an_error() {
        // Two connections, each closed by the server after one answer.
        let (addr, server) = serve(
            2,
            1,
            b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
        )
        .await;
        let pool = pool(None);
        for _ in 0..2 {
            let (status, body) = post(&pool, &addr, "/raft/vote", &[], vec![1]).await.expect("answer");
            assert_eq!((status.as_u16(), body.len()), (503, 0));
            assert_eq!(pool.idle_count(&addr), 0, "kept a connection the peer closes");
        }
        assert_eq!(server.await.expect("server").len(), 2, "a new connection after each close");
        // The listener is gone: the next RPC fails instead of hanging.
        let error =
            tokio::time::timeout(Duration::from_secs(5), post(&pool, &addr, "/raft/vote", &[], vec![1]))
                .await
                .expect("an error, not a hang");
        assert!(error.is_err());
    }

    #[tokio::test]
    async fn an_idle_connection_the_peer_closed_is_not_an_error() {
        // The peer closes its first connection after one answer, without saying so in it.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let (close_tx, close) = tokio::sync::oneshot::channel::<()>();
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        let server = tokio::spawn(async move {
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx";
            let (mut first, _) = listener.accept().await.expect("accept");
            read_request(&mut first).await;
            first.write_all(answer).await.expect("write");
            // Closed while it waits in the idle list, not together with the answer.
            close.await.expect("test says when");
            drop(first);
            closed_tx.send(()).expect("test waits");
            let (mut second, _) = listener.accept().await.expect("accept");
            read_request(&mut second).await;
            second.write_all(answer).await.expect("write");
            second
        });
        let pool = pool(None);
        post(&pool, &addr, "/raft/append", &[], vec![1]).await.expect("first answer");
        assert_eq!(pool.idle_count(&addr), 1);
        close_tx.send(()).expect("server waits");
        closed.await.expect("the server closed");
        // The FIN reaches this end soon after; the next RPC goes on a new connection either way
        // (found closed when taken, or refused by the connection and sent again).
        tokio::task::yield_now().await;
        let post = post(&pool, &addr, "/raft/append", &[], vec![2]);
        let answer = tokio::time::timeout(Duration::from_secs(5), post)
            .await
            .expect("answered")
            .expect("sent again, on a new connection");
        assert_eq!(&answer.1[..], b"x");
        server.await.expect("server");
    }

    #[tokio::test]
    async fn an_rpc_lost_with_a_reused_connection_is_sent_again_once_on_a_new_one() {
        // The peer answers a first RPC, reads a second on the same connection and closes it
        // unanswered (as a restarting peer may); then answers on a new connection.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = tokio::spawn(async move {
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx";
            let (mut first, _) = listener.accept().await.expect("accept");
            read_request(&mut first).await;
            first.write_all(answer).await.expect("write");
            let lost = read_request(&mut first).await;
            drop(first);
            let (mut second, _) = listener.accept().await.expect("accept");
            let again = read_request(&mut second).await;
            second.write_all(answer).await.expect("write");
            (lost, again, second)
        });
        let pool = pool(None);
        post(&pool, &addr, "/raft/append", &[], vec![1]).await.expect("first answer");
        let post = post(&pool, &addr, "/raft/append", &[], b"second".to_vec());
        let answer = tokio::time::timeout(Duration::from_secs(5), post)
            .await
            .expect("answered")
            .expect("sent again, on a new connection");
        assert_eq!(&answer.1[..], b"x");
        let (lost, again, _) = server.await.expect("server");
        assert!(lost.ends_with("second") && again.ends_with("second"), "{lost:?} {again:?}");
    }

    #[tokio::test]
    async fn a_request_that_may_not_be_resent_is_lost_with_its_connection() {
        // As above, but the request is a forwarded client write: never sent twice.
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let server = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.expect("accept");
            read_request(&mut first).await;
            first.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx").await.expect("write");
            let lost = read_request(&mut first).await;
            drop(first);
            // A second copy would arrive on a new connection within the test's patience.
            let again = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
            (lost, again.is_ok())
        });
        let pool = pool(None);
        send(&pool, &addr, "/v1/x", &[], vec![1], Resend::Never).await.expect("first answer");
        let error =
            send(&pool, &addr, "/v1/x", &[], b"write".to_vec(), Resend::Never).await.expect_err("lost");
        assert!(matches!(error, PeerError::Lost(_)), "{error}");
        let (lost, resent) = server.await.expect("server");
        assert!(lost.ends_with("write"), "{lost:?}");
        assert!(!resent, "a request that may not be resent was sent again");
    }

    #[tokio::test]
    async fn a_peer_that_refuses_connections_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        drop(listener);
        let error = send(&pool(None), &addr, "/v1/x", &[], vec![], Resend::Never).await.expect_err("refused");
        assert!(matches!(error, PeerError::Connect(_)), "{error}");
    }

    #[tokio::test]
    async fn an_oversized_answer_is_refused() {
        let mut answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2000000\r\n\r\n".to_vec();
        answer.resize(answer.len() + 2_000_000, b'a');
        let (addr, _server) = serve(1, 1, answer.leak()).await;
        let error = post(&pool(None), &addr, "/raft/append", &[], vec![]).await.expect_err("a 2 MB answer");
        assert!(error.to_string().contains("length limit"), "{error}");
    }
}
