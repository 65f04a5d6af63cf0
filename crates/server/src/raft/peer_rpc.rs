//! Peer RPC as bytes in, bytes out: the `/raft/*` routes hand over the authenticated sender and
//! the body, and get back the encoded answer or a [`Refusal`]. Checks, in this order, before
//! openraft sees a message:
//! 1. for a vote: the sender is a member of this node's membership, or this node is pristine
//!    ([`PeerRpc::accepts`], asked before the body is read); appends and snapshots are taken
//!    from any authenticated peer (see [`PeerMessage::FROM_LEADER`]);
//! 2. the body decodes;
//! 3. the node id inside the message is the authenticated sender's;
//! 4. no term in it exceeds [`RAFT_TERM_MAX`];
//! 5. for a snapshot: chunks arrive in order, and a complete snapshot's state is at the index its
//!    metadata names.

use openraft::error::{InstallSnapshotError, RaftError};
use openraft::network::snapshot_transport::{Chunked, SnapshotTransport, Streaming};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest};
use openraft::Snapshot;
use permit_core::State as CoreState;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::bounds::{
    PeerMessage, APPEND_BODY_BYTES_MAX, RAFT_TERM_MAX, SNAPSHOT_BODY_BYTES_MAX, VOTE_BODY_BYTES_MAX,
};
use super::{NodeId, Raft, TypeConfig};
use crate::metrics::{PeerRpcCounts, PeerRpcKind};

/// The three peer routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRoute {
    /// AppendEntries (also the leader's heartbeat).
    Append,
    /// RequestVote.
    Vote,
    /// InstallSnapshot, one chunk.
    Snapshot,
}

impl PeerRoute {
    /// The largest body the route takes.
    pub fn body_limit(self) -> usize {
        match self {
            PeerRoute::Append => APPEND_BODY_BYTES_MAX,
            PeerRoute::Vote => VOTE_BODY_BYTES_MAX,
            PeerRoute::Snapshot => SNAPSHOT_BODY_BYTES_MAX,
        }
    }

    /// Whether only a leader sends it, so that it is taken from any authenticated peer (see
    /// [`PeerMessage::FROM_LEADER`]).
    pub fn from_leader(self) -> bool {
        match self {
            PeerRoute::Append => <AppendEntriesRequest<TypeConfig> as PeerMessage>::FROM_LEADER,
            PeerRoute::Vote => <VoteRequest<NodeId> as PeerMessage>::FROM_LEADER,
            PeerRoute::Snapshot => <InstallSnapshotRequest<TypeConfig> as PeerMessage>::FROM_LEADER,
        }
    }
}

/// Why a peer message was refused before Raft saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
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
pub struct PeerRpc {
    raft: Raft,
    receiver: tokio::sync::Mutex<SnapshotReceiver>,
    received: PeerRpcCounts,
}

impl PeerRpc {
    /// The receiving end for `raft`; every message admitted is counted in `received`.
    pub(crate) fn new(raft: Raft, received: PeerRpcCounts) -> PeerRpc {
        PeerRpc { raft, receiver: Default::default(), received }
    }

    /// Whether `peer` may send `route`: always for a leader's messages; for a vote, when it is a
    /// member (voter or learner) of the membership this node knows, or this node is pristine (a
    /// `--join` node waiting to be added accepts any authenticated peer).
    pub fn accepts(&self, route: PeerRoute, peer: NodeId) -> bool {
        if route.from_leader() {
            return true;
        }
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.get_node(&peer).is_some() || membership.nodes().next().is_none()
    }

    /// Handles one message from the authenticated `peer` and returns the encoded answer.
    ///
    /// # Errors
    /// A [`Refusal`] when a check of the module docs fails.
    pub async fn handle(&self, route: PeerRoute, peer: NodeId, body: &[u8]) -> Result<Vec<u8>, Refusal> {
        match route {
            PeerRoute::Append => {
                let rpc = admit::<AppendEntriesRequest<TypeConfig>>(peer, body)?;
                let kind = if rpc.entries.is_empty() { PeerRpcKind::Heartbeat } else { PeerRpcKind::Append };
                self.received.count(kind);
                encode(&self.raft.append_entries(rpc).await)
            }
            PeerRoute::Vote => {
                let rpc = admit::<VoteRequest<NodeId>>(peer, body)?;
                self.received.count(PeerRpcKind::Vote);
                encode(&self.raft.vote(rpc).await)
            }
            PeerRoute::Snapshot => {
                let rpc = admit::<InstallSnapshotRequest<TypeConfig>>(peer, body)?;
                self.received.count(PeerRpcKind::Snapshot);
                match self.receive_chunk(rpc).await? {
                    Ok(answer) => encode(&Ok::<_, RaftError<NodeId, InstallSnapshotError>>(answer)),
                    Err(error) => encode(&Err::<InstallSnapshotResponse<NodeId>, _>(error)),
                }
            }
        }
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

/// Decodes a message and checks its sender and terms (steps 2-4 of the module docs).
fn admit<T: DeserializeOwned + PeerMessage>(peer: NodeId, body: &[u8]) -> Result<T, Refusal> {
    let message: T =
        postcard::from_bytes(body).map_err(|e| Refusal::Invalid(format!("not a peer message: {e}")))?;
    if message.sender() != peer {
        return Err(Refusal::Forbidden(format!("node {peer} sent a message as node {}", message.sender())));
    }
    if message.max_term() > RAFT_TERM_MAX {
        tracing::warn!(peer, term = message.max_term(), "refused a peer message with an absurd term");
        return Err(Refusal::Invalid(format!("terms above {RAFT_TERM_MAX} are refused")));
    }
    Ok(message)
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
