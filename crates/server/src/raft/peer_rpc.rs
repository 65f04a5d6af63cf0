//! Peer RPC as bytes in, bytes out: the `/raft/*` routes hand over the authenticated sender
//! (`crate::peer`), its membership claim and the body, and get back the encoded answer or a
//! [`Refusal`]. Checks, in this order, before openraft sees a message:
//! 1. the sender may send it ([`PeerRpc::accepts`], asked before the body is read): a member
//!    of this node's membership, or any authenticated peer while this node is pristine; for a
//!    leader's message (append, snapshot) from a node this node does not know, only while this
//!    node neither leads nor heard from a leader within the longest election timeout, and only
//!    when the sender's claim names a membership newer than this node's that lists it (a member
//!    that missed membership changes must hear from the new leader to learn them);
//! 2. the body decodes;
//! 3. the node id inside the message is the authenticated sender's;
//! 4. no term in it is beyond [`term_limit`] of this node's current term;
//! 5. for a snapshot: chunks arrive in order, and a complete snapshot's state is at the index its
//!    metadata names.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::network::snapshot_transport::{Chunked, SnapshotTransport, Streaming};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
};
use openraft::{CommittedLeaderId, Snapshot, StoredMembership};
use permit_core::State as CoreState;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::bounds::{
    term_limit, PeerMessage, APPEND_BODY_BYTES_MAX, SNAPSHOT_BODY_BYTES_MAX, VOTE_BODY_BYTES_MAX,
};
use super::{LogId, NodeId, Raft, TypeConfig};
use crate::metrics::{PeerRpcCounts, PeerRpcKind};

/// The three peer routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerRoute {
    /// AppendEntries (also the leader's heartbeat).
    Append,
    /// RequestVote.
    Vote,
    /// InstallSnapshot, one chunk.
    Snapshot,
}

impl PeerRoute {
    /// The largest body the route takes.
    pub(crate) fn body_limit(self) -> usize {
        match self {
            PeerRoute::Append => APPEND_BODY_BYTES_MAX,
            PeerRoute::Vote => VOTE_BODY_BYTES_MAX,
            PeerRoute::Snapshot => SNAPSHOT_BODY_BYTES_MAX,
        }
    }

    /// Whether only a leader sends it (see [`PeerMessage::FROM_LEADER`]).
    fn is_from_leader(self) -> bool {
        match self {
            PeerRoute::Append => <AppendEntriesRequest<TypeConfig> as PeerMessage>::FROM_LEADER,
            PeerRoute::Vote => <VoteRequest<NodeId> as PeerMessage>::FROM_LEADER,
            PeerRoute::Snapshot => <InstallSnapshotRequest<TypeConfig> as PeerMessage>::FROM_LEADER,
        }
    }
}

/// Why a peer message was refused before Raft saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The sender may not send it (not a member, or it claims to be another node).
    Forbidden(String),
    /// It does not decode, or carries an absurd term or an inconsistent snapshot.
    Invalid(String),
    /// This node failed to encode its answer or to check a snapshot.
    Internal(String),
}

/// The snapshot a node is receiving, chunk by chunk.
#[derive(Default)]
struct SnapshotReceiver {
    streaming: Option<Streaming<TypeConfig>>,
    /// The id of the snapshot being received and how many bytes of it arrived.
    received: Option<(String, u64)>,
}

/// The receiving end of the peer channel of one node.
pub(crate) struct PeerRpc {
    raft: Raft,
    receiver: tokio::sync::Mutex<SnapshotReceiver>,
    received: PeerRpcCounts,
    /// The longest election timeout: how long a leader's last append counts as "led".
    election_timeout_max: Duration,
    /// When a leader's append was last taken by Raft (not answered with a higher vote).
    led_at: Mutex<Option<Instant>>,
}

impl PeerRpc {
    /// The receiving end for `raft`; every message admitted is counted in `received`.
    pub(crate) fn new(raft: Raft, received: PeerRpcCounts, election_timeout_max: Duration) -> PeerRpc {
        PeerRpc {
            raft,
            receiver: Default::default(),
            received,
            election_timeout_max,
            led_at: Mutex::default(),
        }
    }

    /// Whether `peer`, whose membership claim (`permit-peer-members`) is `claim`, may send
    /// `route` (check 1 of the module docs).
    ///
    /// # Errors
    /// Why not, for a `403 permission_denied`.
    pub(crate) fn accepts(&self, route: PeerRoute, peer: NodeId, claim: &str) -> Result<(), String> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let stored = &metrics.membership_config;
        let membership = stored.membership();
        if membership.get_node(&peer).is_some() || membership.nodes().next().is_none() {
            return Ok(());
        }
        let refused = || Err(format!("node {peer} is not a member of this cluster"));
        if !route.is_from_leader() {
            return refused();
        }
        let led = self
            .led_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < self.election_timeout_max);
        if metrics.state == openraft::ServerState::Leader || led {
            return refused();
        }
        match parse_claim(claim) {
            Some((log_id, members))
                if Some(&log_id) > stored.log_id().as_ref() && members.contains(&peer) =>
            {
                Ok(())
            }
            _ => refused(),
        }
    }

    /// Handles one message from the authenticated `peer` and returns the encoded answer.
    ///
    /// # Errors
    /// A [`Refusal`] when a check of the module docs fails.
    pub(crate) async fn handle(
        &self,
        route: PeerRoute,
        peer: NodeId,
        body: &[u8],
    ) -> Result<Vec<u8>, Refusal> {
        match route {
            PeerRoute::Append => {
                let rpc = admit::<AppendEntriesRequest<TypeConfig>>(peer, body, self.term())?;
                let kind = if rpc.entries.is_empty() { PeerRpcKind::Heartbeat } else { PeerRpcKind::Append };
                self.received.count(kind);
                let answer = self.raft.append_entries(rpc).await;
                if matches!(&answer, Ok(answer) if !matches!(answer, AppendEntriesResponse::HigherVote(_))) {
                    *self.led_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                }
                encode(&answer)
            }
            PeerRoute::Vote => {
                let rpc = admit::<VoteRequest<NodeId>>(peer, body, self.term())?;
                self.received.count(PeerRpcKind::Vote);
                encode(&self.raft.vote(rpc).await)
            }
            PeerRoute::Snapshot => {
                let rpc = admit::<InstallSnapshotRequest<TypeConfig>>(peer, body, self.term())?;
                self.received.count(PeerRpcKind::Snapshot);
                match self.receive_chunk(rpc).await? {
                    Ok(answer) => encode(&Ok::<_, RaftError<NodeId, InstallSnapshotError>>(answer)),
                    Err(error) => encode(&Err::<InstallSnapshotResponse<NodeId>, _>(error)),
                }
            }
        }
    }

    /// This node's current term.
    fn term(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// Adds one chunk to the snapshot being received and installs it when it is complete.
    /// Chunks are assembled here rather than in `Raft::install_snapshot` so that a complete
    /// snapshot is checked before openraft installs it: a state machine that refused it during
    /// the install would stop openraft's core for good.
    async fn receive_chunk(&self, rpc: InstallSnapshotRequest<TypeConfig>) -> Result<ChunkResult, Refusal> {
        let vote = rpc.vote;
        // As `Raft::install_snapshot`: a chunk from a deposed leader is answered with the newer
        // vote and not buffered.
        let my_vote = self.raft.metrics().borrow().vote;
        if vote < my_vote {
            return Ok(Ok(InstallSnapshotResponse { vote: my_vote }));
        }
        let mut receiver = self.receiver.lock().await;
        let id = rpc.meta.snapshot_id.clone();
        // A chunk starts a snapshot (offset 0), continues it, or repeats part of it (a retry): a
        // chunk past the received bytes would make the buffer grow by the gap.
        let received = match &receiver.received {
            Some((current, received)) if *current == id => *received,
            _ => 0,
        };
        if rpc.offset > received {
            return Err(Refusal::Invalid(format!(
                "snapshot chunk at offset {} but only {received} bytes received",
                rpc.offset
            )));
        }
        let end = rpc.offset.saturating_add(rpc.data.len() as u64);
        let receiving = &mut *receiver;
        let finished = match Chunked::receive_snapshot(&mut receiving.streaming, &self.raft, rpc).await {
            Ok(finished) => finished,
            Err(error) => {
                receiving.received = None;
                return Ok(Err(error));
            }
        };
        receiving.received = Some((id, received.max(end)));
        let Some(snapshot) = finished else {
            return Ok(Ok(InstallSnapshotResponse { vote: self.raft.metrics().borrow().vote }));
        };
        receiving.received = None;
        drop(receiver);
        let snapshot = check_snapshot(snapshot).await?;
        match self.raft.install_full_snapshot(vote, snapshot).await {
            Ok(answer) => Ok(Ok(answer.into())),
            Err(fatal) => Ok(Err(RaftError::Fatal(fatal))),
        }
    }
}

type ChunkResult = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, Refusal> {
    postcard::to_allocvec(value).map_err(|e| Refusal::Internal(e.to_string()))
}

/// Decodes a message and checks its sender and terms (steps 2-4 of the module docs), on a node
/// whose current term is `term`.
fn admit<T: DeserializeOwned + PeerMessage>(peer: NodeId, body: &[u8], term: u64) -> Result<T, Refusal> {
    let message: T =
        postcard::from_bytes(body).map_err(|e| Refusal::Invalid(format!("not a peer message: {e}")))?;
    if message.sender() != peer {
        return Err(Refusal::Forbidden(format!("node {peer} sent a message as node {}", message.sender())));
    }
    let limit = term_limit(term);
    if message.max_term() > limit {
        tracing::warn!(peer, term = message.max_term(), limit, "refused a peer message with an absurd term");
        return Err(Refusal::Invalid(format!("terms above {limit} are refused by this node")));
    }
    Ok(message)
}

/// The membership claim of a node whose membership is `stored` (`permit-peer-members`):
/// `TERM.NODE.INDEX:ID,ID,...`, the log id of its membership entry and every member (voters and
/// learners); `""` before it has one.
pub(crate) fn claim_of(stored: &StoredMembership<NodeId, openraft::BasicNode>) -> String {
    let Some(log_id) = stored.log_id() else { return String::new() };
    let members: Vec<String> = stored.membership().nodes().map(|(id, _)| id.to_string()).collect();
    format!("{}.{}.{}:{}", log_id.leader_id.term, log_id.leader_id.node_id, log_id.index, members.join(","))
}

/// The log id and members of a membership claim, or `None` when it is not one.
fn parse_claim(claim: &str) -> Option<(LogId, Vec<NodeId>)> {
    let (log_id, members) = claim.split_once(':')?;
    let mut parts = log_id.split('.').map(str::parse::<u64>);
    let (term, node, index) = (parts.next()?.ok()?, parts.next()?.ok()?, parts.next()?.ok()?);
    if parts.next().is_some() {
        return None;
    }
    let members = members.split(',').map(str::parse).collect::<Result<Vec<NodeId>, _>>().ok()?;
    Some((LogId::new(CommittedLeaderId::new(term, node), index), members))
}

/// The snapshot back if its state decodes, is consistent, and is at its metadata's index.
async fn check_snapshot(snapshot: Snapshot<TypeConfig>) -> Result<Snapshot<TypeConfig>, Refusal> {
    let Snapshot { meta, snapshot: data } = snapshot;
    let index = meta.last_log_id.map_or(0, |id| id.index);
    let bytes = data.into_inner();
    let checked = tokio::task::spawn_blocking(move || {
        let result = CoreState::decode_snapshot(&bytes).map(|state| state.applied_index());
        (bytes, result)
    })
    .await;
    let (bytes, applied) = checked.map_err(|e| Refusal::Internal(e.to_string()))?;
    match applied {
        Ok(applied) if applied == index => {
            Ok(Snapshot { meta, snapshot: Box::new(std::io::Cursor::new(bytes)) })
        }
        Ok(applied) => {
            tracing::warn!(applied, index, "refused a snapshot whose state is not at its metadata's index");
            Err(Refusal::Invalid(format!(
                "snapshot state at index {applied} but its metadata at {index}; refused"
            )))
        }
        Err(e) => {
            tracing::warn!(error = %e, "refused a snapshot that does not decode");
            Err(Refusal::Invalid(format!("refused a snapshot: {e}")))
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::{BasicNode, Membership};

    use super::*;

    #[test]
    fn a_membership_claim_reads_back_and_refuses_anything_else() {
        let nodes: std::collections::BTreeMap<NodeId, BasicNode> =
            [(3, BasicNode::new("a")), (4, BasicNode::new("b"))].into_iter().collect();
        let membership = Membership::new(vec![[3].into_iter().collect()], nodes);
        let log_id = LogId::new(CommittedLeaderId::new(7, 4), 120);
        let claim = claim_of(&StoredMembership::new(Some(log_id), membership));
        assert_eq!(claim, "7.4.120:3,4");
        assert_eq!(parse_claim(&claim), Some((log_id, vec![3, 4])));
        assert_eq!(claim_of(&StoredMembership::default()), "");
        for bad in ["", "7.4:3", "7.4.120.1:3", "7.4.120:", "7.4.120:3,x", "7.4.120"] {
            assert_eq!(parse_claim(bad), None, "{bad}");
        }
    }
}
