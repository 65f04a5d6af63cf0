//! Peer RPC routes (`/raft/*`): postcard-encoded openraft requests from other nodes.
//!
//! Served only by a node with a cluster secret. A request is checked in this order, and refused
//! at the first failure, before openraft sees it:
//! 1. the peer credential in the headers (`401 unauthenticated`), before any of the body is read;
//! 2. for a vote: the sender is a member of this node's membership, or this node is pristine
//!    (`403 permission_denied`); appends and snapshots are taken from any authenticated peer
//!    (see [`PeerMessage::FROM_LEADER`]);
//! 3. the body fits the route's limit (`413 body_too_large`) and decodes (`400 invalid_argument`);
//! 4. the node id inside the message is the credential's (`403 permission_denied`);
//! 5. no term in it exceeds [`RAFT_TERM_MAX`] (`400 invalid_argument`);
//! 6. for a snapshot: chunks arrive in order, and a complete snapshot's state is at the index its
//!    metadata names (`400 invalid_argument`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use openraft::error::{InstallSnapshotError, RaftError};
use openraft::network::snapshot_transport::{Chunked, SnapshotTransport, Streaming};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest};
use openraft::Snapshot;
use permit_core::State as CoreState;
use permit_wire::ErrorCode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::ApiError;
use crate::node::Node;
use crate::peer::{authenticate, PeerAuthError};
use crate::raft::bounds::{
    PeerMessage, APPEND_BODY_BYTES_MAX, RAFT_TERM_MAX, SNAPSHOT_BODY_BYTES_MAX, VOTE_BODY_BYTES_MAX,
};
use crate::raft::{NodeId, TypeConfig};

/// The snapshot a node is receiving, chunk by chunk.
#[derive(Default)]
pub struct SnapshotReceiver {
    streaming: Option<Streaming<TypeConfig>>,
    /// The id of the snapshot being received and how many bytes of it arrived.
    received: Option<(String, u64)>,
}

fn encode<T: Serialize>(value: &T) -> Response {
    match postcard::to_allocvec(value) {
        Ok(bytes) => bytes.into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> ApiError {
    ApiError::new(code, message)
}

/// Checks a peer request (steps 1-5 of the module docs) and decodes its body.
async fn admit<T: DeserializeOwned + PeerMessage>(
    node: &Node,
    request: Request,
    limit: usize,
) -> Result<T, ApiError> {
    let peer = authenticate(node.config.cluster_secret.as_ref(), request.headers()).map_err(|e| match e {
        PeerAuthError::NoSecret => refuse(ErrorCode::NotFound, "no such route"),
        other => refuse(ErrorCode::Unauthenticated, other.to_string()),
    })?;
    if !T::FROM_LEADER && !node.accepts_peer(peer) {
        return Err(refuse(
            ErrorCode::PermissionDenied,
            format!("node {peer} is not a member of this cluster"),
        ));
    }
    let body = axum::body::to_bytes(request.into_body(), limit).await.map_err(|_| {
        refuse(ErrorCode::BodyTooLarge, format!("this peer route takes bodies of at most {limit} bytes"))
    })?;
    let message: T = postcard::from_bytes(&body)
        .map_err(|e| refuse(ErrorCode::InvalidArgument, format!("not a peer message: {e}")))?;
    if message.sender() != peer {
        return Err(refuse(
            ErrorCode::PermissionDenied,
            format!("node {peer} sent a message as node {}", message.sender()),
        ));
    }
    if message.max_term() > RAFT_TERM_MAX {
        tracing::warn!(peer, term = message.max_term(), "refused a peer message with an absurd term");
        return Err(refuse(ErrorCode::InvalidArgument, format!("terms above {RAFT_TERM_MAX} are refused")));
    }
    Ok(message)
}

/// AppendEntries (also the leader's heartbeat).
pub async fn append(State(node): State<Arc<Node>>, request: Request) -> Response {
    match admit::<AppendEntriesRequest<TypeConfig>>(&node, request, APPEND_BODY_BYTES_MAX).await {
        Ok(rpc) => encode(&node.raft.append_entries(rpc).await),
        Err(refusal) => refusal.into_response(),
    }
}

/// RequestVote.
pub async fn vote(State(node): State<Arc<Node>>, request: Request) -> Response {
    match admit::<VoteRequest<NodeId>>(&node, request, VOTE_BODY_BYTES_MAX).await {
        Ok(rpc) => encode(&node.raft.vote(rpc).await),
        Err(refusal) => refusal.into_response(),
    }
}

/// InstallSnapshot (one chunk). Chunks are assembled here rather than in `Raft::install_snapshot`
/// so that a complete snapshot is checked before openraft installs it: a state machine that
/// refused it during the install would stop openraft's core for good.
pub async fn snapshot(State(node): State<Arc<Node>>, request: Request) -> Response {
    let rpc = match admit::<InstallSnapshotRequest<TypeConfig>>(&node, request, SNAPSHOT_BODY_BYTES_MAX).await
    {
        Ok(rpc) => rpc,
        Err(refusal) => return refusal.into_response(),
    };
    match receive_chunk(&node, rpc).await {
        Ok(Ok(answer)) => encode(&Ok::<_, RaftError<NodeId, InstallSnapshotError>>(answer)),
        Ok(Err(error)) => encode(&Err::<InstallSnapshotResponse<NodeId>, _>(error)),
        Err(refusal) => refusal.into_response(),
    }
}

type ChunkResult = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

/// Adds one chunk to the snapshot being received and installs it when it is complete.
async fn receive_chunk(
    node: &Node,
    rpc: InstallSnapshotRequest<TypeConfig>,
) -> Result<ChunkResult, ApiError> {
    let vote = rpc.vote;
    // As `Raft::install_snapshot`: a chunk from a deposed leader is answered with the newer vote
    // and not buffered.
    let my_vote = node.raft.metrics().borrow().vote;
    if vote < my_vote {
        return Ok(Ok(InstallSnapshotResponse { vote: my_vote }));
    }
    let mut receiver = node.snapshot_receiver.lock().await;
    let id = rpc.meta.snapshot_id.clone();
    // A chunk starts a snapshot (offset 0), continues it, or repeats part of it (a retry): a
    // chunk past the received bytes would make the buffer grow by the gap.
    let received = match &receiver.received {
        Some((current, received)) if *current == id => *received,
        _ => 0,
    };
    if rpc.offset > received {
        return Err(refuse(
            ErrorCode::InvalidArgument,
            format!("snapshot chunk at offset {} but only {received} bytes received", rpc.offset),
        ));
    }
    let end = rpc.offset.saturating_add(rpc.data.len() as u64);
    let receiving = &mut *receiver;
    let finished = match Chunked::receive_snapshot(&mut receiving.streaming, &node.raft, rpc).await {
        Ok(finished) => finished,
        Err(error) => {
            receiving.received = None;
            return Ok(Err(error));
        }
    };
    receiving.received = Some((id, received.max(end)));
    let Some(snapshot) = finished else {
        return Ok(Ok(InstallSnapshotResponse { vote: node.raft.metrics().borrow().vote }));
    };
    receiving.received = None;
    drop(receiver);
    let snapshot = check_snapshot(snapshot).await?;
    match node.raft.install_full_snapshot(vote, snapshot).await {
        Ok(answer) => Ok(Ok(answer.into())),
        Err(fatal) => Ok(Err(RaftError::Fatal(fatal))),
    }
}

/// The snapshot back if its state decodes, is consistent, and is at its metadata's index.
async fn check_snapshot(snapshot: Snapshot<TypeConfig>) -> Result<Snapshot<TypeConfig>, ApiError> {
    let Snapshot { meta, snapshot: data } = snapshot;
    let index = meta.last_log_id.map_or(0, |id| id.index);
    let bytes = data.into_inner();
    let checked = tokio::task::spawn_blocking(move || {
        let result = CoreState::decode_snapshot(&bytes).map(|state| state.applied_index());
        (bytes, result)
    })
    .await;
    let (bytes, applied) = checked.map_err(ApiError::internal)?;
    match applied {
        Ok(applied) if applied == index => {
            Ok(Snapshot { meta, snapshot: Box::new(std::io::Cursor::new(bytes)) })
        }
        Ok(applied) => {
            tracing::warn!(applied, index, "refused a snapshot whose state is not at its metadata's index");
            Err(refuse(
                ErrorCode::InvalidArgument,
                format!("snapshot state at index {applied} but its metadata at {index}; refused"),
            ))
        }
        Err(e) => {
            tracing::warn!(error = %e, "refused a snapshot that does not decode");
            Err(refuse(ErrorCode::InvalidArgument, format!("refused a snapshot: {e}")))
        }
    }
}
