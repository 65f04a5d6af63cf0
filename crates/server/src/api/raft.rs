//! Peer RPC routes (`/raft/*`): postcard-encoded Raft messages from other nodes.
//!
//! Served only by a node with a cluster secret. A request is checked in this order, and refused
//! at the first failure:
//! 1. the message's peer headers ([`crate::peer::PeerVerifier::verify_head`]): authentic for this
//!    node and this start of it, and not taken before (`401 unauthenticated`; a message made for
//!    another start gets this start's nonce in `permit-peer-nonce`), before any of the body is
//!    read; and the sender's cluster identity is this node's (`crate::raft::identity`: `409
//!    wrong_cluster`);
//! 2. the sender may send this route ([`PeerRpc::accepts`]: members, and a leader this node does
//!    not know yet under its conditions; `403 permission_denied`);
//! 3. the body fits the route's limit (`413 body_too_large`), arrives within the body timeout
//!    (`408 body_timeout`),
//!    and is the one the message was signed with (`401 unauthenticated`);
//! 4. the message itself ([`crate::raft::peer_rpc`]): it decodes and carries sane terms
//!    (`400 invalid_argument`), and names the credential's node (`403 permission_denied`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use permit_wire::ErrorCode;

use super::app::App;
use super::app::{PeerRoute, PeerRpc, Refusal, CLUSTER_HEADER};
use crate::error::ApiError;
use crate::peer::PeerAuthError;

/// Checks a peer request (steps 1-3 of the module docs), then hands its body to the peer channel.
async fn serve(app: &App, route: PeerRoute, request: Request) -> Result<Vec<u8>, Response> {
    let Some(verifier) = app.peer_verifier.as_ref() else {
        return Err(ApiError::new(ErrorCode::NotFound, "no such route").into_response());
    };
    let path = request.uri().path_and_query().map_or("", |p| p.as_str());
    let head = verifier
        .verify_head(request.method().as_str(), path, request.headers())
        .map_err(|e| refuse_peer(app, &e))?;
    let cluster = request.headers().get(CLUSTER_HEADER).and_then(|v| v.to_str().ok());
    app.identity
        .admit(cluster, || app.status().pristine())
        .map_err(|message| ApiError::new(ErrorCode::WrongCluster, message).into_response())?;
    let rpc: &PeerRpc = app.peer_rpc();
    rpc.accepts(route, head.sender, &head.members)
        .map_err(|message| ApiError::new(ErrorCode::PermissionDenied, message).into_response())?;
    let limit = route.body_limit();
    let body = axum::body::to_bytes(request.into_body(), limit).await.map_err(|error| {
        if crate::listener::is_body_timeout(&error) {
            return ApiError::body_timeout().into_response();
        }
        ApiError::new(
            ErrorCode::BodyTooLarge,
            format!("this peer route takes bodies of at most {limit} bytes"),
        )
        .into_response()
    })?;
    head.check_body(&body).map_err(|e| refuse_peer(app, &e))?;
    rpc.handle(route, head.sender, &body).await.map_err(|refusal| {
        match refusal {
            Refusal::Forbidden(message) => ApiError::new(ErrorCode::PermissionDenied, message),
            Refusal::Invalid(message) => ApiError::new(ErrorCode::InvalidArgument, message),
            Refusal::Internal(message) => ApiError::internal(message),
        }
        .into_response()
    })
}

/// The `401 unauthenticated` answer to a peer message that failed `error`; a message made for
/// another start of this node gets the nonce of this one, to sign it again with.
pub(crate) fn refuse_peer(app: &App, error: &PeerAuthError) -> Response {
    let mut response = ApiError::new(ErrorCode::Unauthenticated, error.to_string()).into_response();
    if let (PeerAuthError::StaleNonce, Some(verifier)) = (error, app.peer_verifier.as_ref()) {
        let (name, value) = verifier.nonce_header();
        response.headers_mut().insert(name, value);
    }
    response
}

fn answer(result: Result<Vec<u8>, Response>) -> Response {
    match result {
        Ok(bytes) => bytes.into_response(),
        Err(refusal) => refusal,
    }
}

/// AppendEntries (also the leader's heartbeat).
pub(crate) async fn append(State(app): State<Arc<App>>, request: Request) -> Response {
    answer(serve(&app, PeerRoute::Append, request).await)
}

/// RequestVote.
pub(crate) async fn vote(State(app): State<Arc<App>>, request: Request) -> Response {
    answer(serve(&app, PeerRoute::Vote, request).await)
}

/// InstallSnapshot (one chunk).
pub(crate) async fn snapshot(State(app): State<Arc<App>>, request: Request) -> Response {
    answer(serve(&app, PeerRoute::Snapshot, request).await)
}
