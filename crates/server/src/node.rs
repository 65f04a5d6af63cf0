//! One Permit node: assembles the consensus layer (`raft`), the long-poll notifier, the expiry
//! driver, the removal watcher, the fail-stop watcher and the root-token bootstrap, and builds the
//! `App` that the HTTP layer serves from.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use permit_core::{Command, Outcome};
use tokio::sync::watch;

use crate::api::app::{App, IdSource, Replication, Stamps};
use crate::config::Config;
use crate::expiry::ExpiryDriver;
use crate::failstop::FailStop;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::observe::Observer;
use crate::peer::{PeerSigner, PeerVerifier};
use crate::peer_conn::{PeerClient, PoolLimits};
use crate::raft::consensus::Consensus;
use crate::raft::identity::ClusterIdentity;
use crate::raft::network::LocalView;
use crate::raft::network::Network;
use crate::raft::proposer::ProposeError;
use crate::raft::replica::{Replica, ReplicaState};
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

/// A running node: its HTTP layer's `App`, and what starts and stops it.
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// The address its HTTP API listens on.
    pub addr: SocketAddr,
    /// What the HTTP layer serves from (`api::App`).
    app: Arc<App>,
    /// The replicated log and state.
    consensus: Arc<Consensus>,
    /// Starts the shutdown that the `App`'s receiver (and every long-poll) sees.
    shutdown_tx: watch::Sender<bool>,
}

impl Node {
    /// Opens the data dir and starts Raft and the background tasks. `addr` is the bound address
    /// of the HTTP listener (the node's address in a single-node membership).
    ///
    /// # Errors
    /// When the data dir cannot be opened (or another server has it open) or Raft cannot start.
    pub async fn start(config: Config, addr: SocketAddr) -> anyhow::Result<Arc<Node>> {
        let metrics = Arc::new(Metrics::new());
        if let Some(secret) = &config.cluster_secret {
            secret.count_time_in(metrics.peer_mac_seconds.clone());
        }
        let signer =
            config.cluster_secret.clone().map(|secret| Arc::new(PeerSigner::new(secret, config.node_id)));
        let view = Arc::new(LocalView::default());
        let peers = PeerClient::new(Some(addr.ip()), config.tls.as_ref())?;
        let identity = ClusterIdentity::open(&config.data_dir)?;
        let network = Network::new(
            &peers,
            signer.clone(),
            view.clone(),
            metrics.peer_rpcs_sent.clone(),
            identity.clone(),
        );
        let node = Node::assemble(config, addr, network, peers, signer, true, metrics, identity).await?;
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
        let identity = ClusterIdentity::open(&config.data_dir)?;
        Node::assemble(config, addr, network, peers, signer, false, Arc::new(Metrics::new()), identity).await
    }

    #[allow(clippy::too_many_arguments)] // the parts that `start` and `start_with` build apart
    async fn assemble<N: PeerNetwork>(
        config: Config,
        addr: SocketAddr,
        network: N,
        peers: PeerClient,
        peer_signer: Option<Arc<PeerSigner>>,
        probe_peers: bool,
        metrics: Arc<Metrics>,
        identity: Arc<ClusterIdentity>,
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
        if let Some(after_load) = config.after_load {
            after_load();
        }
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
        let consensus = Arc::new(consensus);
        if config.auth {
            tokio::spawn(crate::bootstrap::bootstrap_root(
                consensus.clone(),
                config.clone(),
                shutdown.clone(),
            ));
        }
        let app = Arc::new(App {
            id: config.node_id,
            addr,
            ids: IdSource::new(config.id_seed),
            stamps: Stamps::new(config.node_id, peers.scheme()),
            replication: Replication::new(consensus.clone(), parts.clock, contact, removed),
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
            fail_stop,
            identity,
        });
        let agreement = crate::raft::version::Agreement {
            id: app.id,
            raft: consensus.raft().clone(),
            replica: consensus.replica().clone(),
            proposer: consensus.proposer().clone(),
            leading: consensus.leading().clone(),
            prober: app.prober.clone(),
            probe_peers,
            versions: consensus.versions().clone(),
            shutdown: app.shutdown.clone(),
        };
        tokio::spawn(agreement.run());
        let node = Arc::new(Node { id: app.id, addr, app, consensus, shutdown_tx });
        Ok(node)
    }

    /// The state the HTTP layer serves from (`api::router`).
    pub(crate) fn app(&self) -> &Arc<App> {
        &self.app
    }

    /// The configuration it started with.
    pub(crate) fn config(&self) -> &Config {
        &self.app.config
    }

    /// The replicated log and state.
    pub fn consensus(&self) -> &Consensus {
        &self.consensus
    }

    /// The applied state (read-only: only the consensus layer writes it).
    pub fn replica(&self) -> &Arc<Replica> {
        self.consensus.replica()
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

    /// A new session id, from this node's id source (random, or seeded in a simulation).
    pub fn new_session_id(&self) -> permit_core::SessionId {
        self.app.new_session_id()
    }

    /// This node's failure, once it failed (it then refuses all work, as the HTTP layer does).
    pub fn failure(&self) -> Option<crate::failstop::Failure> {
        self.app.fail_stop.failure()
    }

    /// Resolves with the failure once this node fails (a storage error, or Raft stopped without
    /// a shutdown); `serve` selects on it to exit non-zero.
    pub async fn fatal(&self) -> crate::failstop::Failure {
        self.app.fail_stop.wait().await
    }

    /// Resolves once the node starts shutting down.
    pub(crate) async fn stopping(&self) {
        let mut shutdown = self.app.shutdown.clone();
        let _ = shutdown.wait_for(|stopping| *stopping).await;
    }

    /// Starts shutting down: long-polls return, then Raft stops.
    pub async fn shutdown(&self) {
        self.shutdown_tx.send_replace(true);
        self.consensus.shutdown().await;
    }

    /// Stops cleanly (on SIGTERM or SIGINT): as [`Node::shutdown`], with a snapshot first when
    /// a restart would otherwise re-apply much of the log ([`Consensus::snapshot_before_stop`]).
    pub async fn stop(&self) {
        self.shutdown_tx.send_replace(true);
        self.consensus.snapshot_before_stop().await;
        self.consensus.shutdown().await;
    }
}
