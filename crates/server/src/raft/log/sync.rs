//! How much of this node's log is durable, and the gates that keep a commit invisible until the
//! leader's own copy of it is.
//!
//! openraft 0.9 replicates a leader's entries only after the leader's log store reports them
//! flushed, so a 3-node write used to be two fsyncs in series: the leader's, then a follower's.
//! A leader with other voters now reports its appends at once (the segment log writes them, and
//! a blocking thread fdatasyncs them beside the replication while the node's worker goes on
//! serving: `durable.rs`), so openraft counts the leader in a quorum before its copy is durable.
//! That is safe only while nothing such a commit decides becomes visible before the leader's
//! fsync ends (Raft thesis §10.2.1: the leader may write its log in parallel with replicating it,
//! as long as it counts itself only once durable). These are the gates, each with its test:
//!
//! 1. The state machine applies an entry only once it is durable here ([`LogSync::wait_durable`]):
//!    no client answer, read, lease or event depends on a non-durable entry.
//! 2. The commit index a leader sends its followers is clamped to its durable log id
//!    ([`CommitClamp`]), so no follower applies an entry that only it and a non-durable leader
//!    hold.
//! 3. A batch that holds a membership entry is synced in place, after everything before it:
//!    openraft moves from a joint configuration to the next as soon as it sees the joint one
//!    committed, which must mean durable on majorities of both.
//! 4. Every log write that is not a leader's own append (a follower's append, truncate, purge,
//!    a vote) first syncs what was written before it: a leader that steps down has its log on
//!    disk before it votes or accepts another leader's entries.
//! 5. Only a leader with other voters reports appends early ([`LogSync::set_overlap`]): a single
//!    node overlaps nothing and keeps the fsync in place.
//! 6. The early path runs in the simulation too (the fsync is a task on its one thread, so runs
//!    stay deterministic: the simulated disk runs blocking work in place), whose power cuts tear
//!    what was written but not synced.
//! 7. A sync that has not ended after [`SYNC_STALL`] is joined in place by the worker, and sends
//!    the next append down the in-place path: the node waits for the disk, the leader's
//!    heartbeats stop and the followers elect another leader, as when an in-place fsync hangs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{InstallSnapshotError, RPCError, RaftError};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use tokio::sync::watch;

use crate::raft::{LogId, NodeId, TypeConfig};

/// How long a leader's early-reported appends may wait for their fsync before the worker and
/// the next append wait for it in place (gate 7): well under the shortest election timeout
/// (500 ms by default), far above a healthy fdatasync, even one that waits behind a snapshot
/// file's flush.
pub const SYNC_STALL: Duration = Duration::from_millis(200);

/// This node's durable log id and whether its appends may be synced beside replication. One
/// per node, shared by the log store (which advances it), the state machine (gate 1), the
/// network (gate 2) and the leadership watcher (gate 5).
#[derive(Debug)]
pub struct LogSync {
    id: NodeId,
    /// The last log id of this node's log known durable (an fsync ended after it was written),
    /// and whether the node stopped (see [`LogSync::close`]).
    durable: watch::Sender<(Option<LogId>, bool)>,
    /// This node leads and has other voters: its appends may be reported before their fsync.
    overlap: AtomicBool,
}

impl LogSync {
    /// Node `id`'s: nothing durable yet (the log store sets what its open read), no overlap.
    pub fn new(id: NodeId) -> Arc<LogSync> {
        Arc::new(LogSync { id, durable: watch::Sender::new((None, false)), overlap: AtomicBool::new(false) })
    }

    /// For a state machine driven without a log (openraft's storage suite applies entries that
    /// no log store holds): every index counts as durable.
    #[doc(hidden)]
    pub fn all_durable() -> Arc<LogSync> {
        let sync = LogSync::new(0);
        sync.set_durable(Some(LogId::new(openraft::CommittedLeaderId::new(u64::MAX, 0), u64::MAX)));
        sync
    }

    /// The node this log belongs to.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The last log id known durable.
    pub fn durable(&self) -> Option<LogId> {
        self.durable.borrow().0
    }

    /// Sets the last durable log id. Only the log store calls it, under its own lock, with the
    /// log id of an entry of its current log (lower than before after a truncation).
    pub(super) fn set_durable(&self, durable: Option<LogId>) {
        self.durable.send_if_modified(|(current, _)| {
            let changed = *current != durable;
            *current = durable;
            changed
        });
    }

    /// Waits until the entry at `index` is durable (gate 1).
    ///
    /// # Errors
    /// [`Stopped`] when the node stops first ([`LogSync::close`]): an entry whose sync never
    /// ended (a failed or hung disk) must not hold the state machine, and the log reader it
    /// keeps, after the node is gone.
    pub async fn wait_durable(&self, index: u64) -> Result<(), Stopped> {
        let durable_at = |d: &Option<LogId>| d.is_some_and(|d| d.index >= index);
        let mut durable = self.durable.subscribe();
        // The sender lives as long as `self`: `wait_for` cannot fail while it is borrowed.
        let seen = durable.wait_for(|(d, closed)| *closed || durable_at(d)).await.map(|seen| *seen);
        match seen {
            Ok((d, _)) if durable_at(&d) => Ok(()),
            _ => Err(Stopped),
        }
    }

    /// The node stopped: every wait for durability ends with [`Stopped`].
    pub fn close(&self) {
        self.durable.send_modify(|(_, closed)| *closed = true);
    }

    /// Whether a leader's appends may be reported before their fsync (gate 5).
    pub fn overlap(&self) -> bool {
        self.overlap.load(Ordering::Relaxed)
    }

    /// Set by the leadership watcher: this node leads with other voters. It only chooses the
    /// faster path; the gates hold either way.
    pub fn set_overlap(&self, overlap: bool) {
        self.overlap.store(overlap, Ordering::Relaxed);
    }

    /// `leader_commit` clamped to the durable log id (gate 2).
    pub fn clamp_commit(&self, leader_commit: Option<LogId>) -> Option<LogId> {
        let durable = self.durable();
        let clamped = leader_commit.min(durable);
        assert!(
            clamped.is_none_or(|c| durable.is_some_and(|d| c.index <= d.index)),
            "gate 2: commit index {clamped:?} sent beyond the durable {durable:?}"
        );
        clamped
    }
}

/// The node stopped before an entry it waited for was durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the node stopped before the entry was durable on it")]
pub struct Stopped;

/// A network factory whose clients clamp the commit index of every AppendEntries to the
/// leader's durable log id (gate 2). It wraps the HTTP network and the simulation's alike.
pub struct CommitClamp<N> {
    inner: N,
    sync: Arc<LogSync>,
}

impl<N> CommitClamp<N> {
    /// Wraps `inner`; `sync` is this node's.
    pub fn new(inner: N, sync: Arc<LogSync>) -> CommitClamp<N> {
        CommitClamp { inner, sync }
    }
}

impl<N: RaftNetworkFactory<TypeConfig>> RaftNetworkFactory<TypeConfig> for CommitClamp<N> {
    type Network = ClampedClient<N::Network>;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> ClampedClient<N::Network> {
        ClampedClient { inner: self.inner.new_client(target, node).await, sync: self.sync.clone() }
    }
}

/// A client of [`CommitClamp`].
pub struct ClampedClient<C> {
    inner: C,
    sync: Arc<LogSync>,
}

impl<C: RaftNetwork<TypeConfig>> RaftNetwork<TypeConfig> for ClampedClient<C> {
    async fn append_entries(
        &mut self,
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        rpc.leader_commit = self.sync.clamp_commit(rpc.leader_commit);
        self.inner.append_entries(rpc, option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.inner.install_snapshot(rpc, option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.inner.vote(rpc, option).await
    }

    fn backoff(&self) -> Backoff {
        self.inner.backoff()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(openraft::CommittedLeaderId::new(term, 1), index)
    }

    #[test]
    fn the_commit_index_is_clamped_to_the_durable_log_id() {
        let sync = LogSync::new(1);
        assert_eq!(sync.clamp_commit(Some(log_id(1, 5))), None, "nothing durable: nothing committed");
        sync.set_durable(Some(log_id(1, 3)));
        assert_eq!(sync.clamp_commit(Some(log_id(1, 5))), Some(log_id(1, 3)));
        assert_eq!(sync.clamp_commit(Some(log_id(1, 2))), Some(log_id(1, 2)));
        assert_eq!(sync.clamp_commit(None), None);
    }

    #[tokio::test]
    async fn waiting_for_durability_ends_once_the_index_is_durable() {
        let sync = LogSync::new(1);
        sync.set_durable(Some(log_id(1, 3)));
        tokio::time::timeout(Duration::from_secs(5), sync.wait_durable(3))
            .await
            .expect("index 3 is durable")
            .expect("not stopped");
        let waiting = tokio::spawn({
            let sync = sync.clone();
            async move { sync.wait_durable(5).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "index 5 is not durable yet");
        sync.set_durable(Some(log_id(1, 4)));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "index 5 is not durable yet");
        sync.set_durable(Some(log_id(1, 5)));
        let waited =
            tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").expect("no panic");
        assert_eq!(waited, Ok(()));

        let waiting = tokio::spawn({
            let sync = sync.clone();
            async move { sync.wait_durable(9).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "index 9 is not durable");
        sync.close();
        let waited =
            tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").expect("no panic");
        assert_eq!(waited, Err(Stopped), "a stopped node's waits end");
    }
}
