//! Peer RPC routes (`/raft/*`): postcard-encoded openraft requests from other nodes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::node::Node;

fn decode<T: DeserializeOwned>(body: &Bytes) -> Result<T, (StatusCode, String)> {
    postcard::from_bytes(body).map_err(|e| (StatusCode::BAD_REQUEST, e.to_string()))
}

fn encode<T: Serialize>(value: &T) -> Response {
    match postcard::to_allocvec(value) {
        Ok(bytes) => bytes.into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// AppendEntries (also the leader's heartbeat).
pub async fn append(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    match decode(&body) {
        Ok(request) => encode(&node.raft.append_entries(request).await),
        Err(rejection) => rejection.into_response(),
    }
}

/// RequestVote.
pub async fn vote(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    match decode(&body) {
        Ok(request) => encode(&node.raft.vote(request).await),
        Err(rejection) => rejection.into_response(),
    }
}

/// InstallSnapshot (one chunk).
pub async fn snapshot(State(node): State<Arc<Node>>, body: Bytes) -> Response {
    match decode(&body) {
        Ok(request) => encode(&node.raft.install_snapshot(request).await),
        Err(rejection) => rejection.into_response(),
    }
}
