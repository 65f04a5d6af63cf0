//! Peer RPC routes (`/raft/*`): postcard-encoded Raft messages from other nodes.
//!
//! Served only by a node with a cluster secret. A request is checked in this order, and refused
//! at the first failure:
//! 1. the peer credential in the headers (`401 unauthenticated`), before any of the body is read;
//! 2. the sender may send this route ([`PeerRpc::accepts`]: votes only from members;
//!    `403 permission_denied`);
//! 3. the body fits the route's limit (`413 body_too_large`);
//! 4. the message itself ([`crate::raft::peer_rpc`]): it decodes and carries sane terms
//!    (`400 invalid_argument`), and names the credential's node (`403 permission_denied`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use permit_wire::ErrorCode;

use super::error::ApiError;
use crate::node::Node;
use crate::peer::{authenticate, PeerAuthError};
use crate::raft::peer_rpc::{PeerRoute, PeerRpc, Refusal};

/// Checks a peer request (steps 1-3 of the module docs), then hands its body to the peer channel.
async fn serve(node: &Node, route: PeerRoute, request: Request) -> Result<Vec<u8>, ApiError> {
    let peer = authenticate(node.config.cluster_secret.as_ref(), request.headers()).map_err(|e| match e {
        PeerAuthError::NoSecret => ApiError::new(ErrorCode::NotFound, "no such route"),
        other => ApiError::new(ErrorCode::Unauthenticated, other.to_string()),
    })?;
    let rpc: &PeerRpc = node.consensus.peer_rpc();
    if !rpc.accepts(route, peer) {
        return Err(ApiError::new(
            ErrorCode::PermissionDenied,
            format!("node {peer} is not a member of this cluster"),
        ));
    }
    let limit = route.body_limit();
    let body = axum::body::to_bytes(request.into_body(), limit).await.map_err(|_| {
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("this peer route takes bodies of at most {limit} bytes"),
        )
    })?;
    rpc.handle(route, peer, &body).await.map_err(|refusal| match refusal {
        Refusal::Forbidden(message) => ApiError::new(ErrorCode::PermissionDenied, message),
        Refusal::Invalid(message) => ApiError::new(ErrorCode::InvalidArgument, message),
        Refusal::Internal(message) => ApiError::internal(message),
    })
}

fn answer(result: Result<Vec<u8>, ApiError>) -> Response {
    match result {
        Ok(bytes) => bytes.into_response(),
        Err(refusal) => refusal.into_response(),
    }
}

/// AppendEntries (also the leader's heartbeat).
pub async fn append(State(node): State<Arc<Node>>, request: Request) -> Response {
    answer(serve(&node, PeerRoute::Append, request).await)
}

/// RequestVote.
pub async fn vote(State(node): State<Arc<Node>>, request: Request) -> Response {
    answer(serve(&node, PeerRoute::Vote, request).await)
}

/// InstallSnapshot (one chunk).
pub async fn snapshot(State(node): State<Arc<Node>>, request: Request) -> Response {
    answer(serve(&node, PeerRoute::Snapshot, request).await)
}
