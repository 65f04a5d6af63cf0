//! Membership changes in Permit's own terms: initialise a cluster, add a learner and wait for it
//! to catch up, promote it to voter, remove a member. openraft's nested error enums end here.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, ChangeMembers, ServerState};

use super::{NodeId, Raft};

/// Why a membership change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MembershipError {
    /// This node does not lead (or stopped leading during the change).
    #[error("leadership moved during the change; check the status and retry")]
    NotLeader,
    /// Another membership change is still being committed.
    #[error("{0}")]
    InProgress(String),
    /// The change is not valid for the current membership.
    #[error("{0}")]
    Invalid(String),
    /// The node is already a member of a cluster (`init` on an initialised node).
    #[error("this node is already a member of a cluster")]
    AlreadyInitialized,
    /// A new learner did not catch up within the patience given.
    #[error("the new member did not catch up in time; it stays a learner")]
    CatchUpTimeout,
    /// The Raft core stopped.
    #[error("{0}")]
    Stopped(String),
}

fn write_error(error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> MembershipError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => MembershipError::NotLeader,
        RaftError::APIError(ClientWriteError::ChangeMembershipError(ChangeMembershipError::InProgress(
            e,
        ))) => MembershipError::InProgress(e.to_string()),
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            MembershipError::Invalid(e.to_string())
        }
        RaftError::Fatal(e) => MembershipError::Stopped(e.to_string()),
    }
}

/// Makes this pristine node a member of a new cluster with `members` (id → address).
pub(crate) async fn init(raft: &Raft, members: &BTreeMap<NodeId, String>) -> Result<(), MembershipError> {
    let members: BTreeMap<NodeId, BasicNode> =
        members.iter().map(|(id, addr)| (*id, BasicNode::new(addr.clone()))).collect();
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Err(MembershipError::AlreadyInitialized),
        Err(RaftError::APIError(InitializeError::NotInMembers(e))) => {
            Err(MembershipError::Invalid(e.to_string()))
        }
        Err(RaftError::Fatal(e)) => Err(MembershipError::Stopped(e.to_string())),
    }
}

/// Adds node `id` at `addr` as a learner and waits up to `patience` for its log to match the
/// leader's (by snapshot if it is far behind).
pub(crate) async fn add_learner(
    raft: &Raft,
    id: NodeId,
    addr: &str,
    patience: Duration,
) -> Result<(), MembershipError> {
    raft.add_learner(id, BasicNode::new(addr), false).await.map_err(write_error)?;
    let caught_up = raft
        .wait(Some(patience))
        .metrics(
            |m| {
                let last = m.last_log_index;
                let matched = m.replication.as_ref().and_then(|r| r.get(&id).copied().flatten());
                m.state != ServerState::Leader || matched.map(|l| l.index) >= last
            },
            "new member caught up",
        )
        .await;
    caught_up.map(|_| ()).map_err(|_| MembershipError::CatchUpTimeout)
}

/// Makes learner `id` a voter.
pub(crate) async fn promote(raft: &Raft, id: NodeId) -> Result<(), MembershipError> {
    let change = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
    raft.change_membership(change, false).await.map_err(write_error)?;
    Ok(())
}

/// Removes member `id` (voter or learner).
pub(crate) async fn remove(raft: &Raft, id: NodeId) -> Result<(), MembershipError> {
    let membership = raft.metrics().borrow().membership_config.membership().clone();
    let change = if membership.voter_ids().any(|voter| voter == id) {
        ChangeMembers::RemoveVoters(BTreeSet::from([id]))
    } else if membership.get_node(&id).is_some() {
        ChangeMembers::RemoveNodes(BTreeSet::from([id]))
    } else {
        return Err(MembershipError::Invalid(format!("node {id} is not a member")));
    };
    raft.change_membership(change, false).await.map_err(write_error)?;
    Ok(())
}
