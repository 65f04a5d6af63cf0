//! One Permit node: assembles the log store, state machine, Raft, proposer, leadership watcher
//! and expiry driver, and offers the operations the HTTP handlers need.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::{BasicNode, SnapshotPolicy};
use permit_core::{Command, Outcome};
use tokio::sync::{watch, Notify};

use crate::clock::LeaderClock;
use crate::config::Config;
use crate::expiry::ExpiryDriver;
use crate::failstop::FailStop;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::proposer::{ProposeError, Proposer};
use crate::raft::log_store::LogStore;
use crate::raft::network::Network;
use crate::raft::snapshot_store::SnapshotStore;
use crate::raft::state_machine::{load_replica, StateMachine};
use crate::raft::{NodeId, Raft, TypeConfig};
use crate::replica::Replica;
use openraft::network::RaftNetworkFactory;

/// Longest wait for a quorum to confirm leadership before a linearizable read.
const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A running node.
pub struct Node {
    /// This node's id.
    pub id: NodeId,
    /// The address its HTTP API listens on.
    pub addr: SocketAddr,
    /// The Raft handle.
    pub raft: Raft,
    /// The applied state.
    pub replica: Arc<Replica>,
    /// Long-poll wake-ups.
    pub notifier: Arc<Notifier>,
    /// Group-commit proposer.
    pub proposer: Proposer,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The configuration it started with.
    pub config: Config,
    /// HTTP client for forwarding requests to the leader and probing members.
    pub http: reqwest::Client,
    /// This node's leadership, once its barrier is committed (see `leadership`).
    pub leading: watch::Receiver<crate::leadership::Leading>,
    /// Batches linearizable reads and keepalives into shared ReadIndex rounds.
    pub reads: Arc<crate::read_barrier::ReadBarrier>,
    /// Open long-polls per token, for `--long-polls-per-token-max`.
    pub long_polls: Arc<crate::auth::LongPolls>,
    /// The snapshot being received from a leader, chunk by chunk (`/raft/snapshot`).
    pub(crate) snapshot_receiver: tokio::sync::Mutex<crate::api::raft::SnapshotReceiver>,
    /// Becomes true when the node starts shutting down; long-polls return early.
    pub shutdown: watch::Receiver<bool>,
    shutdown_tx: watch::Sender<bool>,
    /// Set by the first storage failure or unexpected Raft stop; the node then refuses all work
    /// and `serve` exits (see `failstop`).
    pub fail_stop: Arc<FailStop>,
    /// True while this node is removed from the membership (see `removal`).
    pub removed: watch::Receiver<bool>,
}

impl Node {
    /// Opens the data dir and starts Raft and the background tasks. `addr` is the bound address
    /// of the HTTP listener (the node's address in a single-node membership).
    ///
    /// # Errors
    /// When the data dir cannot be opened (or another server has it open) or Raft cannot start.
    pub async fn start(config: Config, addr: SocketAddr) -> anyhow::Result<Arc<Node>> {
        let network = Network::new(
            Some(addr.ip()),
            config.node_id,
            config.cluster_secret.as_ref(),
            config.tls.as_ref(),
        )?;
        Node::assemble(config, addr, network, true).await
    }

    /// Like [`Node::start`], with another peer network (an in-memory one in simulations). Such
    /// a node learns of its removal from its own log only: it does not ask the other members'
    /// HTTP health.
    ///
    /// # Errors
    /// As [`Node::start`].
    pub async fn start_with<N: RaftNetworkFactory<TypeConfig>>(
        config: Config,
        addr: SocketAddr,
        network: N,
    ) -> anyhow::Result<Arc<Node>> {
        Node::assemble(config, addr, network, false).await
    }

    async fn assemble<N: RaftNetworkFactory<TypeConfig>>(
        config: Config,
        addr: SocketAddr,
        network: N,
        probe_peers: bool,
    ) -> anyhow::Result<Arc<Node>> {
        config.validate()?;
        std::fs::create_dir_all(&config.data_dir)
            .map_err(|e| anyhow::anyhow!("cannot create the data dir {}: {e}", config.data_dir.display()))?;
        let log_path = config.data_dir.join("raft-log.redb");
        let metrics = Arc::new(Metrics::new());
        let fail_stop = FailStop::new();
        let opening = std::time::Instant::now();
        if let Some(file) = &config.restore {
            let snapshots = SnapshotStore::open(&config.data_dir.join("snapshots"))?;
            crate::raft::state_machine::restore(
                file,
                &snapshots,
                &log_path,
                config.node_id,
                &addr.to_string(),
            )?;
        }
        let log_store = LogStore::open(&log_path)
            .map_err(|e| open_error(&log_path, &e))?
            .with_append_histogram(metrics.append_seconds.clone())
            .with_fail_stop(fail_stop.clone());
        tracing::info!(elapsed_ms = opening.elapsed().as_millis() as u64, "log opened");
        let snapshot_dir = config.data_dir.join("snapshots");
        let snapshots = SnapshotStore::open(&snapshot_dir)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", snapshot_dir.display()))?
            .with_fail_stop(fail_stop.clone());
        let replica_state = load_replica(&snapshots)
            .map_err(|e| anyhow::anyhow!("cannot load the snapshot in {}: {e:#}", snapshot_dir.display()))?;
        let clock = Arc::new(LeaderClock::new(replica_state.state.now_ms()));
        let replica = Arc::new(Replica::new(replica_state));
        let notifier = Notifier::new();
        let expiry_wake = Arc::new(Notify::new());
        let state_machine =
            StateMachine::new(replica.clone(), notifier.clone(), snapshots, expiry_wake.clone());

        let raft_config = openraft::Config {
            cluster_name: "permit".to_owned(),
            heartbeat_interval: config.heartbeat_ms,
            election_timeout_min: config.election_timeout_ms.0,
            election_timeout_max: config.election_timeout_ms.1,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_logs),
            max_in_snapshot_log_to_keep: config.snapshot_logs.min(1000),
            purge_batch_size: config.snapshot_logs.min(256),
            install_snapshot_timeout: 10_000,
            max_payload_entries: crate::raft::bounds::APPEND_ENTRIES_MAX,
            snapshot_max_chunk_size: crate::raft::bounds::SNAPSHOT_CHUNK_BYTES as u64,
            ..Default::default()
        }
        .validate()?;
        let raft =
            Raft::new(config.node_id, Arc::new(raft_config), network, log_store, state_machine).await?;

        if config.cluster_secret.is_none() && has_other_members(&raft, config.node_id).await? {
            let _ = raft.shutdown().await;
            anyhow::bail!(
                "this node's data dir belongs to a cluster; peers need --cluster-secret-file: {}",
                crate::peer::SECRET_HOWTO
            );
        }
        if !config.join && !raft.is_initialized().await? {
            let members: BTreeMap<NodeId, BasicNode> = if config.peers.is_empty() {
                BTreeMap::from([(config.node_id, BasicNode::new(addr.to_string()))])
            } else {
                config.peers.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect()
            };
            // Every node of a fresh cluster writes the same first entry (the membership at log
            // index 0), so their logs agree; the first election picks one leader. On a restart
            // the node is initialised already and `--peers` is not used.
            raft.initialize(members).await?;
        }

        let leading =
            crate::leadership::start(raft.clone(), replica.clone(), clock.clone(), expiry_wake.clone());
        let proposer = Proposer::start(raft.clone(), clock.clone(), replica.clone(), metrics.clone());
        let driver = ExpiryDriver {
            replica: replica.clone(),
            clock,
            proposer: proposer.clone(),
            wake: expiry_wake,
            leading: leading.clone(),
            metrics: metrics.clone(),
        };
        tokio::spawn(driver.run());
        let (shutdown_tx, shutdown) = watch::channel(false);
        crate::failstop::watch_core(raft.clone(), shutdown.clone(), fail_stop.clone());
        let http = crate::tls::peer_client(reqwest::Client::builder(), config.tls.as_ref())?
            .no_proxy()
            .local_address(Some(addr.ip()).filter(|ip| !ip.is_unspecified()))
            .pool_max_idle_per_host(32)
            .build()?;
        let (removed_tx, removed) = watch::channel(false);
        let removal = crate::removal::RemovalWatch {
            raft: raft.clone(),
            id: config.node_id,
            http: http.clone(),
            election_timeout_max: Duration::from_millis(config.election_timeout_ms.1),
            removed: removed_tx,
            probe_peers,
        };
        tokio::spawn(removal.run());
        let node = Arc::new(Node {
            id: config.node_id,
            addr,
            raft,
            replica,
            notifier,
            proposer,
            metrics,
            config,
            leading,
            http,
            reads: crate::read_barrier::ReadBarrier::new(),
            long_polls: Arc::default(),
            snapshot_receiver: Default::default(),
            shutdown,
            shutdown_tx,
            fail_stop,
            removed,
        });
        if node.config.auth {
            tokio::spawn(crate::auth::bootstrap_root(node.clone()));
        }
        Ok(node)
    }

    /// Whether `peer` may ask this node for its vote: it is a member (voter or learner) of the
    /// membership this node knows, or this node is pristine (no membership yet: a `--join` node
    /// waiting to be added accepts any authenticated peer).
    pub fn accepts_peer(&self, peer: NodeId) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.get_node(&peer).is_some() || membership.nodes().next().is_none()
    }

    /// The URL scheme peers are reached with (`https` when this node has TLS).
    pub fn peer_scheme(&self) -> &'static str {
        crate::tls::peer_scheme(self.config.tls.as_ref())
    }

    /// Proposes a command and waits until it is applied.
    ///
    /// # Errors
    /// [`ProposeError`] when it cannot be committed by this node.
    pub async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        self.proposer.propose(command).await
    }

    /// Waits until a read of the local state is linearizable: this node confirmed with a quorum
    /// that it still leads, and applied everything committed before the read began (ReadIndex).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead or cannot reach a quorum.
    pub async fn ensure_linearizable(&self) -> Result<(), ProposeError> {
        if crate::bugs::is(crate::bugs::Bug::StaleReads) {
            return Ok(());
        }
        self.metrics.read_barrier_waits.inc();
        let (raft, leading, rounds) =
            (self.raft.clone(), self.leading.clone(), self.metrics.read_rounds.clone());
        self.reads
            .wait(move || {
                rounds.inc();
                confirm_leadership(raft.clone(), leading.clone())
            })
            .await
    }

    /// Confirms with a quorum that this node leads (as [`Node::ensure_linearizable`]), then runs
    /// `refresh` on the replica, but only if the lessor still leads in the term that was
    /// confirmed. A keepalive goes through here: a node that stepped down (or was re-elected)
    /// between the confirmation and the refresh must not promise a lease, since an expiry it
    /// decided before stepping down may still be in its log.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead, or no longer in the confirmed term.
    pub async fn with_lease_authority<R>(
        &self,
        refresh: impl FnOnce(&mut crate::replica::ReplicaState) -> R,
    ) -> Result<R, ProposeError> {
        let term = self.raft.metrics().borrow().current_term;
        self.ensure_linearizable().await?;
        let mut replica = self.replica.lock();
        if replica.lessor.promoted_term() != Some(term) {
            return Err(ProposeError::NotLeader { leader: None });
        }
        Ok(refresh(&mut replica))
    }

    /// The leader's id and address, waiting up to `patience` for one to be known.
    pub async fn leader(&self, patience: Duration) -> Option<(NodeId, String)> {
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            {
                let m = metrics.borrow_and_update();
                if let Some(leader) = m.current_leader {
                    let addr =
                        m.membership_config.membership().get_node(&leader).map(|node| node.addr.clone());
                    if let Some(addr) = addr {
                        return Some((leader, addr));
                    }
                }
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }

    /// Resolves with the failure once this node fails (a storage error, or Raft stopped without
    /// a shutdown); `serve` selects on it to exit non-zero.
    pub async fn fatal(&self) -> crate::failstop::Failure {
        self.fail_stop.wait().await
    }

    /// Starts shutting down: long-polls return, then Raft stops.
    pub async fn shutdown(&self) {
        self.shutdown_tx.send_replace(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.raft.shutdown()).await;
    }
}

/// One ReadIndex round: this node confirms with a quorum that it still leads and applies
/// everything committed before the round began.
async fn confirm_leadership(
    raft: Raft,
    leading: watch::Receiver<crate::leadership::Leading>,
) -> Result<(), ProposeError> {
    let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
    // A new leader serves reads only once its barrier is applied, so that everything
    // committed before it took over is applied too.
    if raft.metrics().borrow().state == openraft::ServerState::Leader {
        let mut leading = leading;
        let term = raft.metrics().borrow().current_term;
        let ready =
            tokio::time::timeout_at(deadline, leading.wait_for(|l| l.is_some_and(|b| b.term >= term)));
        if ready.await.is_err() {
            return Err(ProposeError::Timeout);
        }
    }
    let confirmed = tokio::time::timeout_at(deadline, raft.ensure_linearizable()).await;
    let Ok(confirmed) = confirmed else { return Err(ProposeError::Timeout) };
    match confirmed {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
            Err(ProposeError::NotLeader {
                leader: forward.leader_id.zip(forward.leader_node.map(|node| node.addr)),
            })
        }
        Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(_))) => {
            Err(ProposeError::NotLeader { leader: None })
        }
        Err(RaftError::Fatal(_)) => Err(ProposeError::ShuttingDown),
    }
}

/// Whether Raft's membership names a node other than `me` (the data dir belongs to a cluster).
/// Asked of Raft's core, which has loaded the log (its metrics may not have yet).
async fn has_other_members(raft: &Raft, me: NodeId) -> anyhow::Result<bool> {
    let others = raft
        .with_raft_state(move |state| {
            state.membership_state.effective().membership().nodes().any(|(id, _)| *id != me)
        })
        .await?;
    Ok(others)
}

/// The error for a log database that cannot be opened: it names the path and the cause, and
/// suggests another server only when the file is locked.
fn open_error(path: &std::path::Path, error: &redb::Error) -> anyhow::Error {
    match error {
        redb::Error::DatabaseAlreadyOpen => anyhow::anyhow!(
            "cannot open {}: it is locked (is another server using this data dir?)",
            path.display()
        ),
        _ => anyhow::anyhow!("cannot open {}: {error}", path.display()),
    }
}
