//! Bounds on what peers send: how far a Raft term may jump, and the body limits of the peer
//! routes.
//!
//! openraft 0.9 computes the next term as `term + 1` without a check when a node starts an
//! election (`Engine::elect` in `engine/engine_impl.rs`), and the vote it then builds is
//! unwrapped: a node that once accepted a term of `u64::MAX` panics on its next election and on
//! every restart. A fixed bound alone is no cure: a cluster pushed to the bound itself could
//! never elect again, since the next election's term would be refused everywhere. So a node
//! refuses any peer message (and any peer answer) carrying a term more than [`TERM_STEP_MAX`]
//! above its own current term, or above [`RAFT_TERM_CEILING`]: one message moves a cluster at
//! most 2^32 terms forward, the next election is always within reach, and reaching the ceiling
//! takes 2^30 such messages, each one authenticated with the cluster secret (`crate::peer`).
//! At one election per 100 ms, 2^32 terms are more than 13 years of continuous elections, so a
//! node partitioned away for any real time still rejoins.

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{RaftLogId, Vote};

use super::{LogId, NodeId, TypeConfig};

/// How far above its own current term a node accepts a term from a peer (2^32). See the module
/// docs.
const TERM_STEP_MAX: u64 = 1 << 32;
/// The largest Raft term a node accepts at all (2^62), far from `u64::MAX`.
const RAFT_TERM_CEILING: u64 = 1 << 62;

/// The largest term a node whose current term is `current` accepts from a peer.
pub(crate) fn term_limit(current: u64) -> u64 {
    current.saturating_add(TERM_STEP_MAX).min(RAFT_TERM_CEILING)
}

/// Largest body of `/raft/vote` (a vote request is a few dozen bytes).
pub(crate) const VOTE_BODY_BYTES_MAX: usize = 64 * 1024;
/// Largest body of `/raft/append`.
pub(crate) const APPEND_BODY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Largest encoded log entry: the proposer cuts a batch once it reaches
/// `crate::raft::proposer::BATCH_BYTES_SOFT_MAX`, and one command adds at most as much again.
pub(crate) const ENTRY_BYTES_MAX: usize = 2 * crate::raft::proposer::BATCH_BYTES_SOFT_MAX;
/// Most entries in one AppendEntries (openraft's `max_payload_entries`): enough that a full
/// request stays under [`APPEND_BODY_BYTES_MAX`] with room for its header.
pub(crate) const APPEND_ENTRIES_MAX: u64 = (APPEND_BODY_BYTES_MAX / ENTRY_BYTES_MAX) as u64 - 1;
/// Size of a snapshot chunk (openraft's `snapshot_max_chunk_size`).
pub(crate) const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// Largest body of `/raft/snapshot`: one chunk plus its metadata (the membership).
pub(crate) const SNAPSHOT_BODY_BYTES_MAX: usize = SNAPSHOT_CHUNK_BYTES + 256 * 1024;

// A full append (with room for its header) fits its body limit, and carries enough entries.
const _: () = assert!((APPEND_ENTRIES_MAX as usize + 1) * ENTRY_BYTES_MAX <= APPEND_BODY_BYTES_MAX);
const _: () = assert!(APPEND_ENTRIES_MAX >= 8);

/// A Raft message between peers: who sent it and the largest term it names.
pub(crate) trait PeerMessage {
    /// Whether only a leader sends it (AppendEntries, InstallSnapshot). A member that was down
    /// while the membership changed does not know the new leader, and must hear from it to learn
    /// the new membership: such a message may come from a node that is not a member yet, under
    /// the conditions of `PeerRpc::accepts`. A vote is taken only from a member.
    const FROM_LEADER: bool;
    /// The node the message says it is from.
    fn sender(&self) -> NodeId;
    /// The largest term anywhere in the message.
    fn max_term(&self) -> u64;
}

fn term_of(log_id: Option<&LogId>) -> u64 {
    log_id.map_or(0, |id| id.leader_id.term)
}

fn vote_term(vote: &Vote<NodeId>) -> u64 {
    vote.leader_id.term
}

impl PeerMessage for VoteRequest<NodeId> {
    const FROM_LEADER: bool = false;

    fn sender(&self) -> NodeId {
        self.vote.leader_id.node_id
    }

    fn max_term(&self) -> u64 {
        vote_term(&self.vote).max(term_of(self.last_log_id.as_ref()))
    }
}

impl PeerMessage for AppendEntriesRequest<TypeConfig> {
    const FROM_LEADER: bool = true;

    fn sender(&self) -> NodeId {
        self.vote.leader_id.node_id
    }

    fn max_term(&self) -> u64 {
        let entries = self.entries.iter().map(|entry| entry.get_log_id().leader_id.term).max();
        vote_term(&self.vote)
            .max(term_of(self.prev_log_id.as_ref()))
            .max(term_of(self.leader_commit.as_ref()))
            .max(entries.unwrap_or(0))
    }
}

impl PeerMessage for InstallSnapshotRequest<TypeConfig> {
    const FROM_LEADER: bool = true;

    fn sender(&self) -> NodeId {
        self.vote.leader_id.node_id
    }

    fn max_term(&self) -> u64 {
        vote_term(&self.vote)
            .max(term_of(self.meta.last_log_id.as_ref()))
            .max(term_of(self.meta.last_membership.log_id().as_ref()))
    }
}

/// The largest term in a peer's answer, so that a node never adopts an absurd term from one.
pub(crate) trait PeerAnswer {
    /// The largest term anywhere in the answer.
    fn max_term(&self) -> u64;
}

impl PeerAnswer for VoteResponse<NodeId> {
    fn max_term(&self) -> u64 {
        vote_term(&self.vote).max(term_of(self.last_log_id.as_ref()))
    }
}

impl PeerAnswer for AppendEntriesResponse<NodeId> {
    fn max_term(&self) -> u64 {
        match self {
            AppendEntriesResponse::Success | AppendEntriesResponse::Conflict => 0,
            AppendEntriesResponse::PartialSuccess(log_id) => term_of(log_id.as_ref()),
            AppendEntriesResponse::HigherVote(vote) => vote_term(vote),
        }
    }
}

impl PeerAnswer for InstallSnapshotResponse<NodeId> {
    fn max_term(&self) -> u64 {
        vote_term(&self.vote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_term_may_step_ahead_by_a_bounded_amount_below_the_ceiling() {
        assert_eq!(term_limit(0), 1 << 32);
        assert_eq!(term_limit(5), 5 + (1 << 32));
        // After the worst message a node accepts, the next election's term is accepted too.
        let worst = term_limit(7);
        assert!(worst < term_limit(worst));
        assert_eq!(term_limit(RAFT_TERM_CEILING - 3), RAFT_TERM_CEILING);
        assert_eq!(term_limit(u64::MAX), RAFT_TERM_CEILING);
    }

    #[test]
    fn a_vote_names_its_candidate_and_term() {
        let request =
            VoteRequest::new(Vote::new(7, 3), Some(LogId::new(openraft::CommittedLeaderId::new(9, 1), 4)));
        assert_eq!(request.sender(), 3);
        assert_eq!(request.max_term(), 9);
    }
}
