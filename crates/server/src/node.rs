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
    /// Becomes true when the node starts shutting down; long-polls return early.
    pub shutdown: watch::Receiver<bool>,
    shutdown_tx: watch::Sender<bool>,
}

impl Node {
    /// Opens the data dir and starts Raft and the background tasks. `addr` is the bound address
    /// of the HTTP listener (the node's address in a single-node membership).
    ///
    /// # Errors
    /// When the data dir cannot be opened (or another server has it open) or Raft cannot start.
    pub async fn start(config: Config, addr: SocketAddr) -> anyhow::Result<Arc<Node>> {
        let network = Network::new(Some(addr.ip()), config.tls.as_ref())?;
        Node::start_with(config, addr, network).await
    }

    /// Like [`Node::start`], with another peer network (an in-memory one in simulations).
    ///
    /// # Errors
    /// As [`Node::start`].
    pub async fn start_with<N: RaftNetworkFactory<TypeConfig>>(
        config: Config,
        addr: SocketAddr,
        network: N,
    ) -> anyhow::Result<Arc<Node>> {
        config.validate()?;
        std::fs::create_dir_all(&config.data_dir)?;
        let log_path = config.data_dir.join("raft-log.redb");
        let metrics = Arc::new(Metrics::new());
        let opening = std::time::Instant::now();
        let log_store = LogStore::open(&log_path)
            .map_err(|e| {
                anyhow::anyhow!("cannot open {}: {e} (is another server using it?)", log_path.display())
            })?
            .with_append_histogram(metrics.append_seconds.clone());
        tracing::info!(elapsed_ms = opening.elapsed().as_millis() as u64, "log opened");
        let snapshots = SnapshotStore::open(&config.data_dir.join("snapshots"))?;
        let replica_state = load_replica(&snapshots)?;
        let applied_index = replica_state.last_applied.map_or(0, |id| id.index);
        let clock = Arc::new(LeaderClock::new(replica_state.state.now_ms()));
        let replica = Arc::new(Replica::new(replica_state));
        let notifier = Notifier::new(applied_index);
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
            ..Default::default()
        }
        .validate()?;
        let raft =
            Raft::new(config.node_id, Arc::new(raft_config), network, log_store, state_machine).await?;

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
        let http = crate::tls::peer_client(reqwest::Client::builder(), config.tls.as_ref())?
            .no_proxy()
            .local_address(Some(addr.ip()).filter(|ip| !ip.is_unspecified()))
            .pool_max_idle_per_host(32)
            .build()?;
        Ok(Arc::new(Node {
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
            shutdown,
            shutdown_tx,
        }))
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
        let deadline = tokio::time::Instant::now() + READ_TIMEOUT;
        // A new leader serves reads only once its barrier is applied, so that everything
        // committed before it took over is applied too.
        if self.raft.metrics().borrow().state == openraft::ServerState::Leader {
            let mut leading = self.leading.clone();
            let term = self.raft.metrics().borrow().current_term;
            let ready =
                tokio::time::timeout_at(deadline, leading.wait_for(|l| l.is_some_and(|b| b.term >= term)));
            if ready.await.is_err() {
                return Err(ProposeError::Timeout);
            }
        }
        let confirmed = tokio::time::timeout_at(deadline, self.raft.ensure_linearizable()).await;
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

    /// Starts shutting down: long-polls return, then Raft stops.
    pub async fn shutdown(&self) {
        self.shutdown_tx.send_replace(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.raft.shutdown()).await;
    }
}
