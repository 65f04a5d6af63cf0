//! The seam between Permit and openraft: one [`Consensus`] per node assembles the log store, the
//! state machine, Raft, the proposer, the leadership watcher and the read barrier, and offers
//! what the rest of the server needs in Permit's own types: propose a command, wait for a
//! linearizable read, refresh a lease, the `Status`, membership changes and the peer channel.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, RaftError};
use openraft::network::RaftNetworkFactory;
use openraft::{BasicNode, SnapshotPolicy};
use permit_core::{Command, Outcome};
use permit_wire::StorageErrorKind;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{watch, Notify};

use super::clock::LeaderClock;
use super::leadership::Leading;
use super::log::{CommitClamp, LogError, LogSync, SegmentLog};
use super::membership::MembershipError;
use super::peer_rpc::PeerRpc;
use super::proposer::{ProposeError, Proposer};
use super::read_barrier::{ReadBarrier, Urgency};
use super::replica::{Replica, ReplicaState};
use super::snapshot_store::SnapshotStore;
use super::state_machine::{load_replica, StateMachine};
use super::status::Status;
use super::{NodeId, Raft, TypeConfig};
use crate::config::Config;
use crate::failstop::{Cause, FailStop};
use crate::metrics::Metrics;
use crate::notify::Notifier;

/// How long a command that needs a newer feature version waits for the raise when no member is
/// known to hold it back (the leader probes members at once as it takes over; a probe times out
/// in half a second).
const VERSION_RAISE_PATIENCE: Duration = Duration::from_secs(2);

/// Longest wait for a quorum to confirm leadership before a linearizable read.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Longest wait for a new learner to catch up before it is promoted.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// The kind of a log error as `/v1/health` names it (see `failstop`). A `Refused` write follows
/// an earlier failure, which the latch recorded first; it counts as I/O.
impl Cause for LogError {
    fn kind(&self) -> StorageErrorKind {
        match self {
            LogError::Full(_) => StorageErrorKind::DiskFull,
            LogError::Io { .. } | LogError::Refused => StorageErrorKind::Io,
            LogError::Corrupt { .. } => StorageErrorKind::Corrupt,
            LogError::Locked { .. } => StorageErrorKind::Locked,
            LogError::UnknownFormat { .. } => StorageErrorKind::UnknownFormat,
        }
    }
}

/// What a started [`Consensus`] hands to the node for its background tasks.
pub(crate) struct Parts {
    /// The leader clock (the expiry driver reads it).
    pub(crate) clock: Arc<LeaderClock>,
    /// Woken when a deadline may have moved earlier.
    pub(crate) expiry_wake: Arc<Notify>,
}

/// The replicated log and state of one node. See the module docs.
pub struct Consensus {
    id: NodeId,
    raft: Raft,
    replica: Arc<Replica>,
    proposer: Proposer,
    leading: watch::Receiver<Leading>,
    reads: Arc<ReadBarrier>,
    read_rounds: Counter,
    read_waits: Counter,
    peer_rpc: PeerRpc,
    sync: Arc<LogSync>,
    versions: Arc<super::version::Versions>,
    /// `--snapshot-logs`: a clean stop snapshots when a restart would re-apply more than this
    /// ([`ReplicaState::since_snapshot`](super::replica::ReplicaState)).
    snapshot_logs: u64,
}

impl Consensus {
    /// Opens the data dir's log and snapshots (restoring `config.restore` first, if set), starts
    /// Raft with `network`, initialises a fresh node (single node, or `--peers`), and starts the
    /// proposer and the leadership watcher.
    ///
    /// # Errors
    /// When the log or snapshots cannot be opened, the data dir belongs to a cluster but there
    /// is no cluster secret, or Raft cannot start.
    pub(crate) async fn start<N: RaftNetworkFactory<TypeConfig>>(
        config: &Config,
        addr: SocketAddr,
        network: N,
        metrics: &Arc<Metrics>,
        observer: &Arc<crate::observe::Observer>,
        notifier: Arc<Notifier>,
        fail_stop: &Arc<FailStop>,
    ) -> anyhow::Result<(Consensus, Parts)> {
        refuse_redb_log(config)?;
        let log_path = config.data_dir.join(crate::config::SEGMENT_LOG);
        let opening = std::time::Instant::now();
        let sync = LogSync::new(config.node_id);
        if let Some(file) = &config.restore {
            let snapshots = SnapshotStore::open_on(config.disk.clone(), &config.data_dir.join("snapshots"))?;
            let root = config.root_token.as_deref().filter(|_| config.auth);
            super::state_machine::restore(
                file,
                &snapshots,
                &log_path,
                config.node_id,
                &addr.to_string(),
                root,
            )?;
        }
        let open_error = |e: io::Error| anyhow::anyhow!("cannot open {}: {e}", log_path.display());
        let log = SegmentLog::open_on(config.disk.clone(), &log_path)
            .map_err(open_error)?
            .with_append_histogram(metrics.append_seconds.clone())
            .with_fail_stop(fail_stop.clone())
            .with_sync(sync.clone());
        tracing::info!(elapsed_ms = opening.elapsed().as_millis() as u64, "log opened");
        let snapshot_dir = config.data_dir.join("snapshots");
        let snapshots = SnapshotStore::open_on(config.disk.clone(), &snapshot_dir)
            .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", snapshot_dir.display()))?
            .with_fail_stop(fail_stop.clone());
        let replica_state = load_replica(&snapshots)
            .map_err(|e| anyhow::anyhow!("cannot load the snapshot in {}: {e:#}", snapshot_dir.display()))?;
        let clock = Arc::new(LeaderClock::new(replica_state.state.now_ms()));
        observer.reset(&replica_state.state);
        let replica = Arc::new(Replica::new(replica_state));
        let expiry_wake = Arc::new(Notify::new());
        let state_machine = StateMachine::new(
            replica.clone(),
            notifier.clone(),
            observer.clone(),
            snapshots,
            expiry_wake.clone(),
            sync.clone(),
            fail_stop.clone(),
        )
        .with_blocking(config.disk.blocking());
        let raft_config = Arc::new(raft_config(config)?);
        let network = CommitClamp::new(network, sync.clone());
        let raft = Raft::new(config.node_id, raft_config, network, log, state_machine).await?;

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

        let leading = super::leadership::start(
            raft.clone(),
            replica.clone(),
            clock.clone(),
            expiry_wake.clone(),
            sync.clone(),
        );
        let proposer =
            Proposer::start(raft.clone(), clock.clone(), replica.clone(), metrics.clone(), notifier);
        let consensus = Consensus {
            id: config.node_id,
            peer_rpc: PeerRpc::new(
                raft.clone(),
                metrics.peer_rpcs_received.clone(),
                Duration::from_millis(config.election_timeout_ms.1),
            ),
            raft,
            replica,
            proposer,
            leading,
            reads: ReadBarrier::new(),
            read_rounds: metrics.read_rounds.clone(),
            read_waits: metrics.read_barrier_waits.clone(),
            sync,
            versions: Arc::default(),
            snapshot_logs: config.snapshot_logs,
        };
        Ok((consensus, Parts { clock, expiry_wake }))
    }

    /// The applied state (read-only outside the consensus layer).
    pub(crate) fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The group-commit proposer.
    pub(crate) fn proposer(&self) -> &Proposer {
        &self.proposer
    }

    /// This node's leadership, once its barrier is committed.
    pub(crate) fn leading(&self) -> &watch::Receiver<Leading> {
        &self.leading
    }

    /// The receiving end of the peer channel.
    pub(crate) fn peer_rpc(&self) -> &PeerRpc {
        &self.peer_rpc
    }

    /// What of this node's log is durable, for the simulation's scenarios only.
    #[doc(hidden)]
    pub fn log_sync(&self) -> &Arc<LogSync> {
        &self.sync
    }

    /// The openraft handle, for the simulation's in-memory network and its observers only.
    #[doc(hidden)]
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// Proposes a command and waits until it is applied.
    ///
    /// # Errors
    /// [`ProposeError`] when it cannot be committed by this node.
    ///
    /// A command that needs a newer feature version than the cluster's is refused here, before
    /// anything is written (rule 1 of `raft::version`); a raise is never refused.
    pub(crate) async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        let needs = command.feature_version();
        if needs > 1 && !matches!(command, Command::SetClusterVersion { .. }) {
            let cluster = self.replica.read().state.cluster_version();
            if needs > cluster {
                let older = self.versions.older_than(needs);
                // No member is known to hold the version back: the raise is on its way (a new
                // leader proposes it as it takes over, so a fresh node's first requests meet
                // this). Wait for it a moment rather than refuse.
                if !older.is_empty() || !self.version_raised_to(needs).await {
                    let cluster = self.replica.read().state.cluster_version();
                    let older = self.versions.older_than(needs);
                    return Err(ProposeError::FeatureUnavailable { needs, cluster, older });
                }
            }
        }
        self.proposer.propose(command).await
    }

    /// Whether the cluster's version reaches `needs` within [`VERSION_RAISE_PATIENCE`].
    async fn version_raised_to(&self, needs: u32) -> bool {
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + VERSION_RAISE_PATIENCE;
        loop {
            if self.replica.read().state.cluster_version() >= needs {
                return true;
            }
            if !matches!(tokio::time::timeout_at(deadline, metrics.changed()).await, Ok(Ok(()))) {
                return self.replica.read().state.cluster_version() >= needs;
            }
        }
    }

    /// What the leader knows of the members' feature versions (`raft::version`).
    pub(crate) fn versions(&self) -> &Arc<super::version::Versions> {
        &self.versions
    }

    /// This node's view of the cluster now.
    pub(crate) fn status(&self) -> Status {
        Status::of(&self.raft.metrics().borrow())
    }

    /// Whether this node is the leader it knows of and a member: what [`Consensus::leader`]
    /// would answer with this node's id, without building a [`Status`] (every request a leader
    /// serves asks this first).
    pub(crate) fn leads(&self) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        metrics.current_leader == Some(self.id)
            && metrics.membership_config.membership().get_node(&self.id).is_some()
    }

    /// The current term and the leader this node knows with its address, read together
    /// (what every answer's headers name). `f` runs while Raft's metrics are borrowed, which
    /// holds up their next update: keep it short.
    pub(crate) fn term_and_leader<R>(&self, f: impl FnOnce(u64, Option<(NodeId, &str)>) -> R) -> R {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let leader = metrics.current_leader.and_then(|leader| {
            let node = metrics.membership_config.membership().get_node(&leader)?;
            Some((leader, node.addr.as_str()))
        });
        f(metrics.current_term, leader)
    }

    /// The current term (cheaper than a whole [`Status`]).
    pub(crate) fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Waits until a read of the local state is linearizable: this node confirmed with a quorum
    /// that it still leads, and applied everything committed before the read began (ReadIndex).
    /// Reads that arrive while a round is in flight share the next one.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead or cannot reach a quorum.
    pub(crate) async fn ensure_linearizable(&self) -> Result<(), ProposeError> {
        self.confirm(Urgency::Now).await
    }

    /// A ReadIndex round that started after this call: at once for a read, within
    /// [`LAZY_ROUND_SPACING`](super::read_barrier::LAZY_ROUND_SPACING) of the previous round for a keepalive.
    async fn confirm(&self, urgency: Urgency) -> Result<(), ProposeError> {
        if crate::bugs::is(crate::bugs::Bug::StaleReads) {
            return Ok(());
        }
        self.read_waits.inc();
        let (raft, leading, rounds) = (self.raft.clone(), self.leading.clone(), self.read_rounds.clone());
        self.reads
            .wait(urgency, move || {
                rounds.inc();
                confirm_leadership(raft.clone(), leading.clone())
            })
            .await
    }

    /// Confirms with a quorum that this node leads (as [`Consensus::ensure_linearizable`]),
    /// then runs `refresh` on the replica, but only if the lessor still leads in the term that
    /// was confirmed. A keepalive goes through here: a node that stepped down (or was
    /// re-elected) between the confirmation and the refresh must not promise a lease, since an
    /// expiry it decided before stepping down may still be in its log.
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead, or no longer in the confirmed term.
    pub(crate) async fn with_lease_authority<R>(
        &self,
        refresh: impl FnOnce(&mut ReplicaState) -> R,
    ) -> Result<R, ProposeError> {
        let term = self.term();
        // A keepalive's round may wait for the spacing of lazy rounds; it still starts after
        // the keepalive arrived, so the lease guarantee is the same.
        self.confirm(Urgency::Lazy).await?;
        let mut replica = self.replica.write();
        if replica.lessor.promoted_term() != Some(term) {
            return Err(ProposeError::NotLeader { leader: None });
        }
        Ok(refresh(&mut replica))
    }

    /// The leader's id and address, waiting up to `patience` for one to be known.
    pub(crate) async fn leader(&self, patience: Duration) -> Option<(NodeId, String)> {
        let mut metrics = self.raft.metrics();
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            if let Some(leader) = Status::of(&metrics.borrow_and_update()).leader_member() {
                return Some((leader.id, leader.addr.clone()));
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => continue,
                _ => return None,
            }
        }
    }

    /// Makes this pristine node a member of a new cluster with `members` (id → address).
    ///
    /// # Errors
    /// [`MembershipError::AlreadyInitialized`] on a member, or another refusal.
    pub(crate) async fn init_cluster(
        &self,
        members: &BTreeMap<NodeId, String>,
    ) -> Result<(), MembershipError> {
        super::membership::init(&self.raft, members).await
    }

    /// Adds node `id` at `addr`: as a learner that catches up, then (unless `learner`) a voter.
    ///
    /// # Errors
    /// A [`MembershipError`] when this node does not lead, another change is in progress, or
    /// the learner does not catch up within [`CATCH_UP_TIMEOUT`].
    pub(crate) async fn add_member(
        &self,
        id: NodeId,
        addr: &str,
        learner: bool,
    ) -> Result<(), MembershipError> {
        super::membership::add_learner(&self.raft, id, addr, CATCH_UP_TIMEOUT).await?;
        if !learner {
            super::membership::promote(&self.raft, id).await?;
        }
        Ok(())
    }

    /// Removes member `id` (voter or learner).
    ///
    /// # Errors
    /// A [`MembershipError`] when it is not a member or the change is refused.
    pub(crate) async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        super::membership::remove(&self.raft, id).await
    }

    /// Records in `fail_stop` a Raft core that stops with a fatal error while `shutdown` is
    /// still false, so that the node does not linger as a zombie.
    pub(crate) fn watch_core(&self, shutdown: watch::Receiver<bool>, fail_stop: Arc<FailStop>) {
        let mut metrics = self.raft.metrics();
        tokio::spawn(async move {
            loop {
                let fatal = match &metrics.borrow_and_update().running_state {
                    Ok(()) => None,
                    Err(fatal) => Some(fatal.to_string()),
                };
                let stopped = match fatal {
                    Some(fatal) => Some(fatal),
                    None => metrics.changed().await.err().map(|_| "the raft core is gone".to_owned()),
                };
                if let Some(why) = stopped {
                    if !*shutdown.borrow() {
                        fail_stop.stopped(&why);
                    }
                    return;
                }
            }
        });
    }

    /// Stops Raft (waiting at most five seconds).
    pub(crate) async fn shutdown(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.raft.shutdown()).await;
        // Then a state machine still waiting for an entry to become durable (a disk that failed
        // or hung under it) gives up, and drops its log reader (and the log's directory lock).
        self.sync.close();
    }

    /// A restart re-applies the log after the latest snapshot, an apply and an event per
    /// command and per pushed item. The snapshot policy counts entries, and a log of few
    /// entries can carry many items (a push holds up to 1000): when what a restart would
    /// re-apply exceeds `--snapshot-logs`, a clean stop takes a snapshot of everything applied
    /// and purges the log up to it, waiting at most [`STOP_SNAPSHOT_WAIT`] for both, so that
    /// the restart loads it instead. Entries committed meanwhile stay in the log and are
    /// re-applied as usual; a snapshot that fails or does not finish in time leaves the previous
    /// one, and the log, as they were.
    pub(crate) async fn snapshot_before_stop(&self) {
        let (since, applied) = {
            let replica = self.replica.read();
            (replica.since_snapshot, replica.last_applied)
        };
        let Some(applied) = applied.filter(|_| since > self.snapshot_logs) else { return };
        let started = tokio::time::Instant::now();
        let deadline = started + STOP_SNAPSHOT_WAIT;
        let mut taken = false;
        // A trigger while a snapshot is being built is dropped, and that one may end below
        // `applied`: trigger again until one covers it.
        while !taken && tokio::time::Instant::now() < deadline {
            if self.raft.trigger().snapshot().await.is_err() {
                break;
            }
            let wait = STOP_SNAPSHOT_RETRIGGER.min(deadline - tokio::time::Instant::now());
            taken = self
                .raft
                .wait(Some(wait))
                .metrics(
                    |m| m.snapshot.is_some_and(|s| s.index >= applied.index),
                    "a snapshot before stopping",
                )
                .await
                .is_ok();
        }
        // The log up to the snapshot goes too, not just to the margin kept for lagging
        // followers: the restart would otherwise hold its entries in memory beside the state
        // decoded from the snapshot (the payloads of their items twice, none shared). A
        // follower behind it later catches up from a snapshot.
        let purged = taken
            && self.raft.trigger().purge_log(applied.index).await.is_ok()
            && self
                .raft
                .wait(Some(deadline.saturating_duration_since(tokio::time::Instant::now())))
                .metrics(|m| m.purged.is_some_and(|p| p.index >= applied.index), "a purge before stopping")
                .await
                .is_ok();
        tracing::info!(
            index = applied.index,
            since_snapshot = since,
            taken,
            purged,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshot before stopping"
        );
    }
}

/// Longest a clean stop waits for its snapshot ([`Consensus::snapshot_before_stop`]).
const STOP_SNAPSHOT_WAIT: Duration = Duration::from_secs(5);
/// How often a clean stop triggers its snapshot again while it waits.
const STOP_SNAPSHOT_RETRIGGER: Duration = Duration::from_millis(500);

/// openraft's configuration from Permit's.
fn raft_config(config: &Config) -> anyhow::Result<openraft::Config> {
    let raft_config = openraft::Config {
        cluster_name: "permit".to_owned(),
        heartbeat_interval: config.heartbeat_ms,
        election_timeout_min: config.election_timeout_ms.0,
        election_timeout_max: config.election_timeout_ms.1,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_logs),
        max_in_snapshot_log_to_keep: config.snapshot_logs.min(1000),
        purge_batch_size: config.snapshot_logs.min(256),
        install_snapshot_timeout: 10_000,
        max_payload_entries: super::bounds::APPEND_ENTRIES_MAX,
        snapshot_max_chunk_size: super::bounds::SNAPSHOT_CHUNK_BYTES as u64,
        ..Default::default()
    };
    Ok(raft_config.validate()?)
}

/// One ReadIndex round: this node confirms with a quorum that it still leads and applies
/// everything committed before the round began.
async fn confirm_leadership(raft: Raft, leading: watch::Receiver<Leading>) -> Result<(), ProposeError> {
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

/// Refuses a data dir whose log the redb log store of earlier versions wrote
/// ([`crate::config::REDB_LOG`]): this version reads the segment log only, and opening the
/// data dir with an empty one would lose every acknowledged write. The error gives the commands
/// that move its state over: a backup taken from the old version, restored by this one.
///
/// # Errors
/// When `config.data_dir` holds a redb log.
fn refuse_redb_log(config: &Config) -> anyhow::Result<()> {
    let dir = &config.data_dir;
    if !dir.join(crate::config::REDB_LOG).exists() {
        return Ok(());
    }
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let mut server = config.listen;
    if server.ip().is_unspecified() {
        server.set_ip(if server.is_ipv4() {
            [127, 0, 0, 1].into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let auth = if config.auth { " --auth-token SECRET_OF_A_CLUSTER_ADMIN_TOKEN" } else { "" };
    let ca = if config.tls.is_some() { " --ca-file CA_OF_YOUR_CERTIFICATES.pem" } else { "" };
    let (dir_word, aside) =
        (shell_word(&dir.display().to_string()), shell_word(&format!("{}.redb", dir.display())));
    anyhow::bail!(
        "{dir} holds a Raft log written by the redb log store ({redb}), which this version of \
         permit does not read (it keeps its log in {segment}/ only). Move its state with a backup:\n\
         1. with the previous version of permit serving this data dir, save a backup:\n   \
         permit --server {scheme}://{server}{auth}{ca} snapshot save permit-backup.bin\n\
         2. stop that server and keep its data dir aside:\n   \
         mv {dir_word} {aside}\n\
         3. with this version, start a new single node from the backup (with your other flags, but \
         not --peers or --join; add the other nodes back with `permit cluster add`):\n   \
         permit serve --data-dir {dir_word} --restore permit-backup.bin",
        dir = dir.display(),
        redb = crate::config::REDB_LOG,
        segment = crate::config::SEGMENT_LOG,
    )
}

/// `word` as one shell word: as it is when it needs no quoting, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "/._-+:=@%,".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::shell_word;

    #[test]
    fn a_path_in_the_redb_refusal_is_one_shell_word() {
        assert_eq!(shell_word("/var/lib/permit-data"), "/var/lib/permit-data");
        assert_eq!(shell_word("/srv/my data/it's"), r"'/srv/my data/it'\''s'");
        assert_eq!(shell_word(""), "''");
    }
}
