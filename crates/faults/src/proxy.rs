//! A fault-injecting TCP proxy between Raft peers.
//!
//! Every node's peers reach it through its proxy (the address in the Raft membership), and every
//! node dials from its own loopback address (127.0.X.id), so the proxy knows which node a
//! connection comes from and can cut, slow down or make lossy each directed link separately,
//! without root and without touching the kernel.
//!
//! A cut link stops forwarding in both directions of its connections (bytes queue up, as with
//! packets dropped and retransmitted later), so requests over it time out; new connections are
//! accepted and then stall, like SYNs into a black hole. Loss is modelled as TCP experiences it:
//! a lost segment is retransmitted after a timeout, so a "lost" chunk arrives 200 ms late.
//!
//! While its node is down ([`Proxy::take_down`]) the proxy does not listen, so peers' connections
//! are refused as they are by a dead process. (Accepting them and then closing would look to the
//! peer like a reset after sending: an unknown outcome instead of a provable "nothing was done".)

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Retransmission delay applied to a "lost" chunk.
const RETRANSMIT_DELAY: Duration = Duration::from_millis(200);
/// Largest chunk forwarded at once.
const CHUNK_BYTES: usize = 64 * 1024;

/// What the proxy does to traffic.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rules {
    /// Source addresses whose links into the target are cut.
    pub cut_from: BTreeSet<IpAddr>,
    /// Extra one-way latency range for every chunk.
    pub delay: Option<(Duration, Duration)>,
    /// Probability that a chunk is "lost" (delivered after a retransmission delay).
    pub loss: f64,
    /// Cut every source (the target is isolated from all peers).
    pub cut_all: bool,
}

impl Rules {
    fn cut(&self, source: IpAddr) -> bool {
        self.cut_all || self.cut_from.contains(&source)
    }
}

/// A running proxy in front of one node.
pub struct Proxy {
    /// Address peers dial.
    pub addr: SocketAddr,
    rules: watch::Sender<Rules>,
    target: watch::Sender<Option<SocketAddr>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `listen` (port 0 for an ephemeral one); forwards once a target is set.
    pub async fn start(listen: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(listen).await?;
        let addr = listener.local_addr()?;
        let (rules, rules_rx) = watch::channel(Rules::default());
        let (target, target_rx) = watch::channel(None);
        let task = tokio::spawn(accept_loop(listener, rules_rx, target_rx));
        Ok(Proxy { addr, rules, target, task })
    }

    /// Sets the node the proxy forwards to, and listens again if it was taken down.
    pub fn set_target(&self, target: SocketAddr) {
        self.target.send_replace(Some(target));
    }

    /// The node is down (killed): stop listening until [`Proxy::set_target`], so that connection
    /// attempts are refused.
    pub fn take_down(&self) {
        self.target.send_replace(None);
    }

    /// Changes the rules; connections in progress follow the new rules at once.
    pub fn update(&self, change: impl FnOnce(&mut Rules)) {
        self.rules.send_modify(change);
    }

    /// The rules in force.
    pub fn rules(&self) -> Rules {
        self.rules.borrow().clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long the proxy keeps trying to listen on its address again after a take-down.
const REBIND_ATTEMPTS: u32 = 100;
const REBIND_PAUSE: Duration = Duration::from_millis(20);

async fn accept_loop(
    listener: TcpListener,
    rules: watch::Receiver<Rules>,
    mut target: watch::Receiver<Option<SocketAddr>>,
) {
    let addr = listener.local_addr().expect("a bound listener has an address");
    let mut listener = Some(listener);
    let connections = Arc::new(Mutex::new(Vec::<tokio::task::JoinHandle<()>>::new()));
    loop {
        if target.wait_for(Option::is_some).await.is_err() {
            return;
        }
        let current = match listener.take() {
            Some(listener) => listener,
            None => match rebind(addr).await {
                Some(listener) => listener,
                None => return,
            },
        };
        loop {
            let (inbound, source) = tokio::select! {
                accepted = current.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(_) => return,
                },
                down = target.wait_for(Option::is_none) => {
                    if down.is_err() {
                        return;
                    }
                    break;
                }
            };
            let (rules, mut target) = (rules.clone(), target.clone());
            let handle = tokio::spawn(async move {
                let Ok(target) = target.wait_for(Option::is_some).await.map(|t| t.expect("some")) else {
                    return;
                };
                let Ok(outbound) = TcpStream::connect(target).await else { return };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (in_read, in_write) = inbound.into_split();
                let (out_read, out_write) = outbound.into_split();
                let up = pump(in_read, out_write, source.ip(), rules.clone());
                let down = pump(out_read, in_write, source.ip(), rules);
                tokio::select! { () = up => {}, () = down => {} }
            });
            let mut connections = connections.lock().expect("connections lock");
            connections.retain(|c| !c.is_finished());
            connections.push(handle);
        }
        // Down: `current` is dropped here, so new connections are refused.
    }
}

/// Listens on `addr` again (the peers know the proxy by it); `None` if it stays taken.
async fn rebind(addr: SocketAddr) -> Option<TcpListener> {
    for _ in 0..REBIND_ATTEMPTS {
        match TcpListener::bind(addr).await {
            Ok(listener) => return Some(listener),
            Err(e) => {
                tracing::warn!(%addr, error = %e, "proxy could not listen again; retrying");
                tokio::time::sleep(REBIND_PAUSE).await;
            }
        }
    }
    tracing::error!(%addr, "proxy gave up listening again");
    None
}

/// Copies one direction of a connection, obeying the rules for the link from `source`.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    source: IpAddr,
    mut rules: watch::Receiver<Rules>,
) {
    let mut buffer = vec![0u8; CHUNK_BYTES];
    loop {
        // While the link is cut, read nothing: the sender's data waits in the socket buffers.
        if rules.wait_for(|r| !r.cut(source)).await.is_err() {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            _ = rules.wait_for(|r| r.cut(source)) => continue,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let (delay, lost) = {
            let r = rules.borrow();
            let mut rng = rand::rng();
            let delay =
                r.delay.map_or(
                    Duration::ZERO,
                    |(min, max)| {
                        if max > min {
                            rng.random_range(min..max)
                        } else {
                            min
                        }
                    },
                );
            (delay, rng.random_bool(r.loss.clamp(0.0, 1.0)))
        };
        let wait = delay + if lost { RETRANSMIT_DELAY } else { Duration::ZERO };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        if rules.wait_for(|r| !r.cut(source)).await.is_err() {
            return;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A target that answers every connection with `pong` and closes it.
    async fn target() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("target binds");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let _ = stream.write_all(b"pong").await;
            }
        });
        addr
    }

    /// What a connection through the proxy gets: `Ok(bytes read)` or the connect error.
    async fn dial(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect(addr).await?;
        let mut answer = vec![0u8; 4];
        tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut answer))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        Ok(answer)
    }

    /// Dials until `done` holds for the result, at most 50 times 10 ms apart.
    async fn dial_until(addr: SocketAddr, done: impl Fn(&std::io::Result<Vec<u8>>) -> bool) -> bool {
        for _ in 0..50 {
            if done(&dial(addr).await) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn a_node_taken_down_refuses_connections_until_it_is_back() {
        let proxy = Proxy::start("127.0.0.1:0".parse().unwrap()).await.expect("proxy starts");
        proxy.set_target(target().await);
        assert_eq!(dial(proxy.addr).await.expect("forwarded"), b"pong");

        proxy.take_down();
        let refused = |r: &std::io::Result<Vec<u8>>| {
            r.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        };
        assert!(
            dial_until(proxy.addr, refused).await,
            "a down node's proxy must refuse, not accept and reset"
        );

        proxy.set_target(target().await);
        let forwarded = |r: &std::io::Result<Vec<u8>>| r.as_ref().is_ok_and(|bytes| bytes == b"pong");
        assert!(dial_until(proxy.addr, forwarded).await, "the proxy listens again on the same address");
    }
}
