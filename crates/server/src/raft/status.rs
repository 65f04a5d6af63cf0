//! What a node knows of the cluster, in Permit's own types: its role, the leader, the term, how
//! far its log and state have got, and the membership. Built from openraft's metrics, so that
//! the rest of the server never reads them.

use std::collections::BTreeMap;

use super::{NodeId, RaftMetrics};

/// A node's role in the Raft group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// It leads: it accepts writes.
    Leader,
    /// A voter following a leader (or waiting for one).
    Follower,
    /// A voter asking for votes.
    Candidate,
    /// A member that replicates but does not vote.
    Learner,
    /// The Raft core stopped.
    Shutdown,
}

impl Role {
    /// The role's name in health reports (`leader`, `follower`, ...).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Leader => "leader",
            Role::Follower => "follower",
            Role::Candidate => "candidate",
            Role::Learner => "learner",
            Role::Shutdown => "shutdown",
        }
    }
}

/// One member of the membership this node knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    /// Its node id.
    pub(crate) id: NodeId,
    /// Its HTTP address (`host:port`).
    pub(crate) addr: String,
    /// Whether it votes (a learner does not).
    pub(crate) voter: bool,
}

/// A node's view of the cluster at one moment.
#[derive(Debug, Clone)]
pub(crate) struct Status {
    /// This node's role.
    pub(crate) role: Role,
    /// The current term.
    pub(crate) term: u64,
    /// The leader this node knows, if any.
    pub(crate) leader: Option<NodeId>,
    /// Index of the last entry in this node's log.
    pub(crate) last_log_index: Option<u64>,
    /// Index of the last entry applied to this node's state.
    pub(crate) applied_index: Option<u64>,
    /// Index of the last entry in this node's snapshot.
    pub(crate) snapshot_index: Option<u64>,
    /// Index of the last entry purged from this node's log.
    pub(crate) purged_index: Option<u64>,
    /// The members, by id (empty on a pristine node waiting to be added).
    pub(crate) members: BTreeMap<NodeId, Member>,
    /// On a leader, how far each follower's log is known to match (`None`: nothing yet).
    pub(crate) matched: BTreeMap<NodeId, Option<u64>>,
    /// Why the Raft core stopped, once it did.
    pub(crate) fatal: Option<String>,
}

impl Status {
    /// The status that `metrics` describe.
    pub(crate) fn of(metrics: &RaftMetrics) -> Status {
        let membership = metrics.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| (*id, Member { id: *id, addr: node.addr.clone(), voter: voters.contains(id) }))
            .collect();
        let matched = metrics
            .replication
            .as_ref()
            .map(|r| r.iter().map(|(id, log)| (*id, log.map(|l| l.index))).collect())
            .unwrap_or_default();
        Status {
            role: role_of(metrics.state),
            term: metrics.current_term,
            leader: metrics.current_leader,
            last_log_index: metrics.last_log_index,
            applied_index: metrics.last_applied.map(|id| id.index),
            snapshot_index: metrics.snapshot.map(|id| id.index),
            purged_index: metrics.purged.map(|id| id.index),
            members,
            matched,
            fatal: metrics.running_state.as_ref().err().map(|fatal| fatal.to_string()),
        }
    }

    /// The leader's id and address, when a leader is known and is a member.
    pub(crate) fn leader_member(&self) -> Option<&Member> {
        self.leader.and_then(|id| self.members.get(&id))
    }

    /// Whether this node is pristine: started with `--join` and not added to a cluster yet.
    pub(crate) fn pristine(&self) -> bool {
        self.members.is_empty()
    }
}

fn role_of(state: openraft::ServerState) -> Role {
    match state {
        openraft::ServerState::Leader => Role::Leader,
        openraft::ServerState::Follower => Role::Follower,
        openraft::ServerState::Candidate => Role::Candidate,
        openraft::ServerState::Learner => Role::Learner,
        openraft::ServerState::Shutdown => Role::Shutdown,
    }
}
