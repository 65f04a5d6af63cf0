//! One Permit node: assembles the consensus layer (`raft`), the long-poll notifier, the expiry
//! driver, the removal watcher and the fail-stop watcher, and holds what the HTTP handlers need.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use permit_core::{Command, Outcome};
use tokio::sync::watch;

use crate::config::Config;
use crate::expiry::ExpiryDriver;
use crate::failstop::FailStop;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::observe::Observer;
use crate::peer::{PeerSigner, PeerVerifier};
use crate::peer_conn::{PeerClient, PeerPool, PoolLimits};
use crate::raft::consensus::Consensus;
use crate::raft::network::LocalView;
use crate::raft::network::Network;
use crate::raft::proposer::ProposeError;
use crate::raft::replica::{Replica, ReplicaState};
use crate::raft::status::Status;
use crate::raft::{NodeId, PeerNetwork};

/// The connections for forwarding to the leader: it must accept one (and finish its TLS
/// handshake) within 1 s; at most 32 wait idle (one per forwarded request in flight, as a
/// follower's clients long-poll through it); an answer is at most 256 MiB (lists can be large;
/// the pool holds it whole).
const FORWARD_POOL: PoolLimits =
    PoolLimits { connect_timeout: Duration::from_secs(1), idle_max: 32, answer_max: 256 << 20 };
/// The connections for health probes: each probe has its own, shorter, timeout; at most 4 wait
/// idle per peer; a health answer is at most 1 MiB (it lists the members).
const PROBE_POOL: PoolLimits =
    PoolLimits { connect_timeout: Duration::from_secs(2), idle_max: 4, answer_max: 1 << 20 };

/// A running node.
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// The address its HTTP API listens on.
    pub addr: SocketAddr,
    /// The replicated log and state.
    pub(crate) consensus: Consensus,
    /// Leader time as this node reads it (ages of holds in the API's views).
    pub(crate) clock: Arc<crate::raft::clock::LeaderClock>,
    /// Long-poll wake-ups.
    pub(crate) notifier: Arc<Notifier>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// The event ring and the per-object metrics, fed as entries apply.
    pub(crate) observer: Arc<Observer>,
    /// The configuration it started with.
    pub(crate) config: Config,
    /// Connections for probing the members' health (`api/cluster.rs`, `raft/removal.rs`).
    pub(crate) prober: PeerPool,
    /// Connections for forwarding requests to the leader (`api/forward.rs`).
    pub(crate) forwarder: PeerPool,
    /// Signs this node's peer messages (Raft RPCs and forwarded requests); none without a
    /// cluster secret.
    pub(crate) peer_signer: Option<Arc<PeerSigner>>,
    /// Checks the peer messages this node receives; none without a cluster secret.
    pub(crate) peer_verifier: Option<PeerVerifier>,
    /// Open long-polls per token, for `--long-polls-per-token-max`.
    pub(crate) long_polls: Arc<crate::auth::LongPolls>,
    /// Becomes true when the node starts shutting down; long-polls return early.
    pub(crate) shutdown: watch::Receiver<bool>,
    shutdown_tx: watch::Sender<bool>,
    /// Set by the first storage failure or unexpected Raft stop; the node then refuses all work
    /// and `serve` exits (see `failstop`).
    pub(crate) fail_stop: Arc<FailStop>,
    /// True while this node is removed from the membership (see `raft::removal`).
    pub(crate) removed: watch::Receiver<bool>,
    /// Whether this node applies the cluster's log now; with `--auth`, token-checked routes
    /// are refused while it does not (see `raft::contact`).
    pub(crate) contact: Arc<crate::raft::contact::Contact>,
    /// Where new session and token ids come from.
    ids: IdSource,
    /// The values of the headers every answer carries (`permit-node`, `permit-term`,
    /// `permit-leader`), built once per term and leader.
    pub(crate) stamps: crate::api::forward::Stamps,
}

/// Where a node draws new session and token ids: the OS-seeded generator, or, in a simulation
/// (`Config::id_seed`), a generator seeded so that a seed replays the same ids.
struct IdSource(Option<std::sync::Mutex<rand::rngs::StdRng>>);

impl IdSource {
    fn new(seed: Option<u64>) -> IdSource {
        IdSource(seed.map(|seed| std::sync::Mutex::new(rand::SeedableRng::seed_from_u64(seed))))
    }

    fn draw(&self) -> [u8; 16] {
        match &self.0 {
            Some(seeded) => rand::Rng::random(&mut *seeded.lock().expect("id source lock")),
            None => rand::random(),
        }
    }
}

impl Node {
    /// Opens the data dir and starts Raft and the background tasks. `addr` is the bound address
    /// of the HTTP listener (the node's address in a single-node membership).
    ///
    /// # Errors
    /// When the data dir cannot be opened (or another server has it open) or Raft cannot start.
    pub async fn start(config: Config, addr: SocketAddr) -> anyhow::Result<Arc<Node>> {
        let metrics = Arc::new(Metrics::new());
        let signer =
            config.cluster_secret.clone().map(|secret| Arc::new(PeerSigner::new(secret, config.node_id)));
        let view = Arc::new(LocalView::default());
        let peers = PeerClient::new(Some(addr.ip()), config.tls.as_ref())?;
        let network = Network::new(&peers, signer.clone(), view.clone(), metrics.peer_rpcs_sent.clone());
        let node = Node::assemble(config, addr, network, peers, signer, true, metrics).await?;
        tokio::spawn(crate::raft::network::follow(node.consensus.raft().clone(), view));
        Ok(node)
    }

    /// Like [`Node::start`], with another peer network (an in-memory one in simulations). Such
    /// a node learns of its removal from its own log only: it does not ask the other members'
    /// HTTP health.
    ///
    /// # Errors
    /// As [`Node::start`].
    pub async fn start_with<N: PeerNetwork>(
        config: Config,
        addr: SocketAddr,
        network: N,
    ) -> anyhow::Result<Arc<Node>> {
        let signer =
            config.cluster_secret.clone().map(|secret| Arc::new(PeerSigner::new(secret, config.node_id)));
        let peers = PeerClient::new(Some(addr.ip()), config.tls.as_ref())?;
        Node::assemble(config, addr, network, peers, signer, false, Arc::new(Metrics::new())).await
    }

    async fn assemble<N: PeerNetwork>(
        config: Config,
        addr: SocketAddr,
        network: N,
        peers: PeerClient,
        peer_signer: Option<Arc<PeerSigner>>,
        probe_peers: bool,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<Node>> {
        config.validate()?;
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| anyhow::anyhow!("cannot create the data dir {}: {e}", config.data_dir.display()))?;
        let observer = Arc::new(Observer::new(metrics.clone(), config.metrics_names_max));
        let fail_stop = FailStop::new();
        let notifier = Notifier::new();
        let (consensus, parts) =
            match Consensus::start(&config, addr, network, &metrics, &observer, notifier.clone(), &fail_stop)
                .await
            {
                Ok(started) => started,
                // A fail-stop while starting (an entry that needs a newer build, a failed
                // write) says best what went wrong.
                Err(error) => {
                    return Err(fail_stop.failure().map_or(error, |failure| anyhow::anyhow!(failure.message)))
                }
            };
        let driver = ExpiryDriver {
            replica: consensus.replica().clone(),
            clock: parts.clock.clone(),
            proposer: consensus.proposer().clone(),
            wake: parts.expiry_wake,
            leading: consensus.leading().clone(),
            metrics: metrics.clone(),
        };
        tokio::spawn(driver.run());
        let (shutdown_tx, shutdown) = watch::channel(false);
        consensus.watch_core(shutdown.clone(), fail_stop.clone());
        let prober = peers.pool(PROBE_POOL);
        let forwarder = peers.pool(FORWARD_POOL);
        let (removed_tx, removed) = watch::channel(false);
        let removal = crate::raft::removal::RemovalWatch {
            raft: consensus.raft().clone(),
            id: config.node_id,
            prober: prober.clone(),
            election_timeout_max: Duration::from_millis(config.election_timeout_ms.1),
            removed: removed_tx,
            probe_peers,
        };
        let contact = Arc::new(crate::raft::contact::Contact::new(
            consensus.raft().clone(),
            config.node_id,
            Duration::from_millis(config.election_timeout_ms.1),
            removed.clone(),
        ));
        tokio::spawn(removal.run());
        let peer_verifier =
            config.cluster_secret.clone().map(|secret| PeerVerifier::new(secret, config.node_id));
        if config.auth {
            // Only auth consults it: without tokens, a stale read is every client's own choice.
            tokio::spawn(contact.clone().run());
        }
        let node = Arc::new(Node {
            id: config.node_id,
            ids: IdSource::new(config.id_seed),
            stamps: crate::api::forward::Stamps::new(config.node_id, peers.scheme()),
            addr,
            consensus,
            clock: parts.clock,
            notifier,
            metrics,
            observer,
            config,
            prober,
            forwarder,
            peer_signer,
            peer_verifier,
            long_polls: Arc::default(),
            shutdown,
            shutdown_tx,
            fail_stop,
            removed,
            contact,
        });
        if node.config.auth {
            tokio::spawn(crate::auth::bootstrap_root(node.clone()));
        }
        let agreement = crate::raft::version::Agreement {
            id: node.id,
            raft: node.consensus.raft().clone(),
            replica: node.consensus.replica().clone(),
            proposer: node.consensus.proposer().clone(),
            leading: node.consensus.leading().clone(),
            prober: node.prober.clone(),
            probe_peers,
            versions: node.consensus.versions().clone(),
            shutdown: node.shutdown.clone(),
        };
        tokio::spawn(agreement.run());
        Ok(node)
    }

    /// The replicated log and state.
    pub fn consensus(&self) -> &Consensus {
        &self.consensus
    }

    /// The applied state (read-only: only the consensus layer writes it).
    pub fn replica(&self) -> &Arc<Replica> {
        self.consensus.replica()
    }

    /// This node's view of the cluster now.
    pub(crate) fn status(&self) -> Status {
        self.consensus.status()
    }

    /// Proposes a command and waits until it is applied.
    ///
    /// # Errors
    /// [`ProposeError`] when it cannot be committed by this node.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        self.consensus.propose(command).await
    }

    /// Waits until a read of the local state is linearizable (see
    /// `Consensus::ensure_linearizable`).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead or cannot reach a quorum.
    pub async fn ensure_linearizable(&self) -> Result<(), ProposeError> {
        self.consensus.ensure_linearizable().await
    }

    /// Runs `refresh` on the replica under a confirmed lease authority (see
    /// `Consensus::with_lease_authority`).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead, or no longer in the confirmed term.
    pub async fn with_lease_authority<R>(
        &self,
        refresh: impl FnOnce(&mut ReplicaState) -> R,
    ) -> Result<R, ProposeError> {
        self.consensus.with_lease_authority(refresh).await
    }

    /// The leader's id and address, waiting up to `patience` for one to be known.
    pub(crate) async fn leader(&self, patience: Duration) -> Option<(NodeId, String)> {
        self.consensus.leader(patience).await
    }

    /// A new session id, from this node's id source (random, or seeded in a simulation).
    pub fn new_session_id(&self) -> permit_core::SessionId {
        permit_core::SessionId::from_bytes(self.ids.draw())
    }

    /// A new token id, from this node's id source.
    pub(crate) fn new_token_id(&self) -> permit_core::TokenId {
        permit_core::TokenId::from_bytes(self.ids.draw())
    }

    /// This node's failure, once it failed (it then refuses all work, as the HTTP layer does).
    pub fn failure(&self) -> Option<crate::failstop::Failure> {
        self.fail_stop.failure()
    }

    /// Resolves with the failure once this node fails (a storage error, or Raft stopped without
    /// a shutdown); `serve` selects on it to exit non-zero.
    pub async fn fatal(&self) -> crate::failstop::Failure {
        self.fail_stop.wait().await
    }

    /// Starts shutting down: long-polls return, then Raft stops.
    pub async fn shutdown(&self) {
        self.shutdown_tx.send_replace(true);
        self.consensus.shutdown().await;
    }
}
