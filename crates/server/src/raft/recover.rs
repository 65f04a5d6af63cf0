//! Lost-quorum recovery (`permit recover`, docs/operations.md *Lost quorum*): one surviving
//! node's data becomes a new single-node cluster.
//!
//! The node's log keeps everything it holds (what it committed, and entries it had that were
//! not yet committed, which its first leadership commits); after it comes one membership entry
//! with this node alone as a voter, in a term above any the node saw. The data dir gets a new
//! cluster identity (`raft/identity.rs`): members of the cluster before the recovery are
//! refused if they come back, with a message that says why, and nodes added later take the new
//! identity when they join.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use openraft::storage::{RaftLogReaderExt, RaftLogStorage, RaftLogStorageExt};
use openraft::{BasicNode, CommittedLeaderId, Entry, EntryPayload, Membership, Vote};

use super::identity::ClusterIdentity;
use super::log::SegmentLog;
use super::snapshot_store::SnapshotStore;
use super::{LogId, NodeId};

/// What a recovery kept and made.
#[derive(Debug)]
pub struct Recovered {
    /// The node that the data dir now makes a single-node cluster of.
    pub id: NodeId,
    /// Its address in the new membership.
    pub addr: String,
    /// Index of the last entry the node held: everything up to it is kept.
    pub last_kept: u64,
    /// The commit index the node had recorded (what it knew was committed; entries after it
    /// may have been committed too).
    pub committed: Option<u64>,
    /// The new membership entry's index and term.
    pub membership: LogId,
    /// The new cluster identity.
    pub cluster: String,
}

/// Turns the data dir `data_dir` of node `id` into a single-node cluster of that node at `addr`
/// (default: its address in the last membership it knew).
///
/// # Errors
/// When the data dir holds no log, a server is using it (its lock is taken), the node is not
/// in the membership and no address is given, or a read or write fails.
pub async fn recover(data_dir: &Path, id: NodeId, addr: Option<&str>) -> anyhow::Result<Recovered> {
    let log_path = data_dir.join(crate::config::SEGMENT_LOG);
    anyhow::ensure!(
        log_path.is_dir(),
        "{} holds no Permit data (no {})",
        data_dir.display(),
        log_path.display()
    );
    let mut log = SegmentLog::open(&log_path).map_err(|e| match super::log::LogError::of(&e) {
        super::log::LogError::Locked { .. } => {
            anyhow::anyhow!("a server is using {}: stop it before you recover its data", data_dir.display())
        }
        _ => anyhow::anyhow!("cannot open {}: {e}", log_path.display()),
    })?;
    let snapshots = SnapshotStore::open(&data_dir.join("snapshots"))?;
    let snapshot = snapshots.load()?.map(|(meta, _)| meta);
    let state = log.get_log_state().await?;
    let vote = log.read_vote().await?;
    let committed = log.read_committed().await?.map(|id| id.index);
    let last = state.last_log_id.or_else(|| snapshot.as_ref().and_then(|meta| meta.last_log_id));
    let last = last.context("the data dir holds no log entry and no snapshot: nothing to recover")?;

    let addr = match addr {
        Some(addr) => addr.to_owned(),
        None => last_membership(&mut log, state.last_purged_log_id, last, snapshot.as_ref())
            .await?
            .and_then(|nodes| nodes.get(&id).map(|node| node.addr.clone()))
            .with_context(|| {
                format!("node {id} is not in the last membership of this data dir: give its address")
            })?,
    };
    let term = vote.map_or(0, |vote| vote.leader_id().term).max(last.leader_id.term) + 1;
    let membership_id = LogId::new(CommittedLeaderId::new(term, id), last.index + 1);
    let membership =
        Membership::new(vec![BTreeSet::from([id])], BTreeMap::from([(id, BasicNode::new(&addr))]));
    // The vote first: a log entry's term may not be above the vote's.
    log.save_vote(&Vote::new(term, id)).await?;
    let entry = Entry { log_id: membership_id, payload: EntryPayload::Membership(membership) };
    log.blocking_append([entry]).await?;
    drop(log);
    let cluster = ClusterIdentity::create(data_dir)?;
    Ok(Recovered { id, addr, last_kept: last.index, committed, membership: membership_id, cluster })
}

/// The nodes of the last membership in the log (from `last` back to the purge point), else of
/// the snapshot's.
async fn last_membership(
    log: &mut SegmentLog,
    purged: Option<LogId>,
    last: LogId,
    snapshot: Option<&super::snapshot_store::Meta>,
) -> anyhow::Result<Option<BTreeMap<NodeId, BasicNode>>> {
    let first = purged.map_or(0, |id| id.index + 1);
    if first <= last.index {
        let entries = log.get_log_entries(first..=last.index).await?;
        for entry in entries.iter().rev() {
            if let EntryPayload::Membership(membership) = &entry.payload {
                return Ok(Some(membership.nodes().map(|(id, node)| (*id, node.clone())).collect()));
            }
        }
    }
    Ok(snapshot.map(|meta| {
        meta.last_membership.membership().nodes().map(|(id, node)| (*id, node.clone())).collect()
    }))
}
