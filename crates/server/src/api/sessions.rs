//! `/v1/sessions`: open, keep alive, inspect and close sessions.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use permit_core::limits::SESSION_TTL_MS_DEFAULT;
use permit_core::{validate_session_name, validate_ttl_ms, Command, Kind, Outcome, Refusal, SessionId};
use permit_wire::{
    CreateSessionRequest, ErrorBody, KeepaliveResponse, ObjectKind, SessionCreated, SessionHold, SessionView,
    SessionWait,
};
use tokio::time::Instant;

use super::error::ApiError;
use super::extract::{parse_session, Json, Path, Query};
use super::watch::StaleParams;
use crate::node::Node;

/// Attempts to draw an unused session id; a collision of 128 random bits is a broken RNG.
const SESSION_ID_ATTEMPTS: usize = 3;

/// Open a session.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = CreateSessionRequest,
    responses((status = 201, body = SessionCreated),
              (status = 409, body = ErrorBody, description = "`limit_exceeded`: too many sessions")))]
pub async fn create(
    State(node): State<Arc<Node>>,
    Json(request): Json<CreateSessionRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let ttl_ms = request.ttl_ms.unwrap_or(SESSION_TTL_MS_DEFAULT);
    validate_ttl_ms(ttl_ms)?;
    validate_session_name(request.name.as_deref())?;
    for _ in 0..SESSION_ID_ATTEMPTS {
        let id = SessionId::from_bytes(rand::random());
        let command = Command::CreateSession { id, ttl_ms, name: request.name.clone() };
        match node.propose(command).await? {
            Outcome::SessionCreated => {
                return Ok((StatusCode::CREATED, axum::Json(SessionCreated { id: id.to_string(), ttl_ms })));
            }
            Outcome::Refused(Refusal::SessionExists) => continue,
            Outcome::Refused(refusal) => return Err(refusal.into()),
            other => return Err(ApiError::internal(other)),
        }
    }
    Err(ApiError::internal("session id collisions"))
}

/// Keep a session alive: it lives at least `ttl_ms` after this request was sent.
#[utoipa::path(post, path = "/v1/sessions/{id}/keepalive", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 200, body = KeepaliveResponse), (status = 404, body = ErrorBody)))]
pub async fn keepalive(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
) -> Result<axum::Json<KeepaliveResponse>, ApiError> {
    let id = parse_session(&id)?;
    // Confirm leadership first: a deposed leader must not promise a deadline its successor will
    // not honour. The successor extended every deadline when it took over, before this point.
    node.ensure_linearizable().await?;
    let mut replica = node.replica.lock();
    let ttl_ms = replica.state.session(id).ok_or_else(ApiError::session_not_found)?.ttl_ms;
    if !replica.lessor.keepalive(id, Instant::now()) {
        return Err(ApiError::session_not_found());
    }
    Ok(axum::Json(KeepaliveResponse { ttl_ms }))
}

/// A session's holds and waits.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), StaleParams),
    responses((status = 200, body = SessionView), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(node): State<Arc<Node>>,
    Path(id): Path<String>,
    Query(params): Query<StaleParams>,
) -> Result<axum::Json<SessionView>, ApiError> {
    let id = parse_session(&id)?;
    if !params.stale {
        node.ensure_linearizable().await?;
    }
    let replica = node.replica.lock();
    let session = replica.state.session(id).ok_or_else(ApiError::session_not_found)?;
    let kind = |kind: Kind| match kind {
        Kind::Semaphore => ObjectKind::Semaphore,
        Kind::Election => ObjectKind::Election,
    };
    let holds = session
        .holds
        .iter()
        .filter_map(|key| {
            let hold = replica.state.object(key)?.holders.get(&id)?;
            Some(SessionHold {
                kind: kind(key.kind),
                name: key.name.to_string(),
                permits: hold.permits,
                token: hold.token,
            })
        })
        .collect();
    let waits = session
        .waits
        .iter()
        .filter_map(|key| {
            let queue = &replica.state.object(key)?.queue;
            Some(SessionWait {
                kind: kind(key.kind),
                name: key.name.to_string(),
                permits: queue.get(id)?.permits,
                position: queue.position(id)?,
            })
        })
        .collect();
    Ok(axum::Json(SessionView {
        id: id.to_string(),
        name: session.name.clone(),
        ttl_ms: session.ttl_ms,
        holds,
        waits,
    }))
}

/// Close a session: its waits are cancelled and its holds released.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub async fn close(State(node): State<Arc<Node>>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    let id = parse_session(&id)?;
    match node.propose(Command::CloseSession { id }).await? {
        Outcome::SessionClosed => Ok(StatusCode::NO_CONTENT),
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}
