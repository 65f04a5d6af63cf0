//! `/v1/sessions`: open, keep alive, inspect and close sessions.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use permit_core::limits::SESSION_TTL_MS_DEFAULT;
use permit_core::{validate_session_name, validate_ttl_ms, Command, Kind, Outcome, Refusal, SessionId};
use permit_wire::{
    CreateSessionRequest, ErrorBody, ErrorCode, ErrorDetail, KeepaliveBatchRequest, KeepaliveBatchResponse,
    KeepaliveResponse, KeepaliveResult, ObjectKind, SessionCreated, SessionHold, SessionList, SessionSummary,
    SessionView, SessionWait, KEEPALIVE_BATCH_MAX,
};
use tokio::time::Instant;

use super::app::App;
use super::app::ReplicaState;
use super::extract::{parse_session, Json, Path, Query};
use super::semaphores::{list_limit, ListParams};
use super::watch::StaleParams;
use crate::auth::Caller;
use crate::error::ApiError;
use permit_core::{Access, Resource};

/// Attempts to draw an unused session id; a collision of 128 random bits is a broken RNG.
const SESSION_ID_ATTEMPTS: usize = 3;

/// Open a session.
#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", request_body = CreateSessionRequest,
    responses((status = 201, body = SessionCreated),
              (status = 409, body = ErrorBody, description = "`limit_exceeded`: too many sessions")))]
pub(crate) async fn create(
    State(app): State<Arc<App>>,
    caller: Caller,
    Json(request): Json<CreateSessionRequest>,
) -> Result<impl IntoResponse, ApiError> {
    let ttl_ms = request.ttl_ms.unwrap_or(SESSION_TTL_MS_DEFAULT);
    validate_ttl_ms(ttl_ms)?;
    validate_session_name(request.name.as_deref())?;
    caller.require(Resource::Session, request.name.as_deref().unwrap_or(""), Access::Write)?;
    if let Some(owner) = caller.token_id() {
        // Refused here without a log write when the cap is clearly reached; `apply` decides
        // the close cases (concurrent creations) the same way on every replica.
        let max = app.config.sessions_per_token_max;
        if app.replica().read().state.sessions_of(owner) >= max {
            let refusal = permit_core::Refusal::LimitExceeded(permit_core::Limit::SessionsPerToken);
            return Err(crate::auth::slowly(refusal.into()).await);
        }
    }
    for _ in 0..SESSION_ID_ATTEMPTS {
        let id = app.new_session_id();
        let name = request.name.clone();
        let command = match caller.token_id() {
            None => Command::CreateSession { id, ttl_ms, name },
            Some(owner) => Command::CreateOwnedSession {
                id,
                ttl_ms,
                name,
                owner,
                owner_sessions_max: app.config.sessions_per_token_max,
            },
        };
        match app.propose(command).await? {
            Outcome::SessionCreated => {
                return Ok((StatusCode::CREATED, axum::Json(SessionCreated { id: id.to_string(), ttl_ms })));
            }
            Outcome::Refused(Refusal::SessionExists) => continue,
            Outcome::Refused(
                refusal @ permit_core::Refusal::LimitExceeded(permit_core::Limit::SessionsPerToken),
            ) => return Err(crate::auth::slowly(refusal.into()).await),
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
pub(crate) async fn keepalive(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<axum::Json<KeepaliveResponse>, ApiError> {
    let id = parse_session(&id)?;
    // Confirm leadership first: a deposed leader must not promise a deadline its successor will
    // not honour. The successor extended every deadline when it took over, before this point.
    let ttl_ms = app.with_lease_authority(|replica| renew(replica, &caller, id, Instant::now())).await??;
    app.metrics.keepalive();
    Ok(axum::Json(KeepaliveResponse { ttl_ms }))
}

/// Renews session `id` for `caller` from `now`, under a confirmed lease authority: its TTL in
/// ms, or why not (`permission_denied`, `session_not_found`). Both keepalive routes use it.
fn renew(replica: &mut ReplicaState, caller: &Caller, id: SessionId, now: Instant) -> Result<u64, ApiError> {
    caller.owns(&replica.state, id)?;
    // The lessor tracks exactly the applied sessions, with their TTLs: no lookup in the state
    // is needed.
    replica.lessor.keepalive(id, now).ok_or_else(ApiError::session_not_found)
}

/// Keep several sessions alive in one request: each renewed session lives at least its `ttl_ms`
/// after this request was sent, exactly as with one keepalive per session.
///
/// The answer has one result per id, in order: renewed with its `ttl_ms`, or refused with the
/// error the single-session route would give (`session_not_found`; `permission_denied` for a
/// session of another token). An empty list, more than 1024 ids, a malformed id or a repeated id
/// refuse the whole request (`invalid_argument`) and renew nothing.
#[utoipa::path(post, path = "/v1/sessions/keepalive", tag = "sessions", request_body = KeepaliveBatchRequest,
    responses((status = 200, body = KeepaliveBatchResponse),
              (status = 400, body = ErrorBody,
               description = "`invalid_argument`: no ids, more than 1024, a malformed or a repeated id; nothing renewed")))]
pub(crate) async fn keepalive_batch(
    State(app): State<Arc<App>>,
    caller: Caller,
    Json(request): Json<KeepaliveBatchRequest>,
) -> Result<axum::Json<KeepaliveBatchResponse>, ApiError> {
    if crate::bugs::is(crate::bugs::Bug::NoKeepaliveBatch) {
        // What a server older than this route answers (the path matches `/v1/sessions/{id}`).
        return Err(ApiError::new(ErrorCode::MethodNotAllowed, "this route does not take this method"));
    }
    let ids = parse_batch(&request.sessions)?;
    // One leadership confirmation for the whole batch, with the single keepalive's reasoning: a
    // deposed leader must not promise a deadline its successor will not honour, and the
    // successor extended every deadline when it took over, before this point. Every deadline
    // is set from a clock read after the request arrived, so after it was sent.
    let (results, renewed) = app
        .with_lease_authority(|replica| {
            let now = Instant::now();
            let mut renewed = 0u64;
            let results: Vec<KeepaliveResult> = ids
                .iter()
                .zip(&request.sessions)
                .map(|(&id, text)| match renew(replica, &caller, id, now) {
                    Ok(ttl_ms) => {
                        renewed += 1;
                        KeepaliveResult::Renewed { id: text.clone(), ttl_ms }
                    }
                    Err(error) => KeepaliveResult::Refused {
                        id: text.clone(),
                        error: ErrorDetail {
                            code: error.code,
                            message: error.message,
                            retry_after_ms: error.retry_after_ms,
                        },
                    },
                })
                .collect();
            (results, renewed)
        })
        .await?;
    app.metrics.keepalive_batch(ids.len() as u64, renewed);
    Ok(axum::Json(KeepaliveBatchResponse { sessions: results }))
}

/// The ids of a batched keepalive, or the `invalid_argument` that refuses the whole batch.
fn parse_batch(texts: &[String]) -> Result<Vec<SessionId>, ApiError> {
    let invalid = |message: String| ApiError::new(ErrorCode::InvalidArgument, message);
    if texts.is_empty() || texts.len() > KEEPALIVE_BATCH_MAX {
        return Err(invalid(format!(
            "sessions must list 1..={KEEPALIVE_BATCH_MAX} session ids, not {}",
            texts.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(texts.len());
    texts
        .iter()
        .enumerate()
        .map(|(index, text)| {
            let id: SessionId = text.parse().map_err(|_| {
                invalid(format!("sessions[{index}] is not a session id (32 hex digits): {text:?}"))
            })?;
            if !seen.insert(id) {
                return Err(invalid(format!("sessions[{index}] repeats session {id}")));
            }
            Ok(id)
        })
        .collect()
}

/// A session's holds and waits. With `--auth`: the caller's own session, or another token's
/// with `session` admin on its name; holds and waits show only objects the caller may read.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), StaleParams),
    responses((status = 200, body = SessionView), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(params): Query<StaleParams>,
) -> Result<axum::Json<SessionView>, ApiError> {
    let id = parse_session(&id)?;
    if !params.stale {
        app.ensure_linearizable().await?;
    }
    let replica = app.replica().read();
    // Another token's session only with `session` admin on its name; holds and waits only on
    // objects the caller may read (their names and fencing tokens are the object's data).
    caller.owns_or(&replica.state, id, Access::Admin)?;
    let session = replica.state.session(id).ok_or_else(ApiError::session_not_found)?;
    // A session's holds and waits are on semaphores and elections only (queue claims are
    // the queue's items, listed there).
    let kind = |kind: Kind| match kind {
        Kind::Semaphore | Kind::Queue => ObjectKind::Semaphore,
        Kind::Election => ObjectKind::Election,
    };
    let holds = session
        .holds
        .iter()
        .filter(|key| caller.reads(key))
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
        .filter(|key| caller.reads(key))
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

/// Live sessions in id order, one page at a time: name, TTL, time left, holds and waits. With
/// `--auth`, only the caller's own sessions, and others' only with `session` admin on their
/// name; holds and waits count only objects the caller may read.
#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", params(ListParams),
    responses((status = 200, body = SessionList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<SessionList>, ApiError> {
    let after = params.after.as_deref().map(str::parse::<SessionId>).transpose().map_err(|_| {
        ApiError::new(permit_wire::ErrorCode::InvalidArgument, "after must be a session id (32 hex digits)")
    })?;
    let limit = list_limit(params.limit)?;
    if !params.stale {
        app.ensure_linearizable().await?;
    }
    let now = Instant::now();
    let replica = app.replica().read();
    let visible = |(_, session): &(&SessionId, &permit_core::Session)| {
        caller.sees_session(session.owner, session.name.as_deref())
    };
    let mut page = replica.state.sessions_after(after).filter(visible);
    let sessions: Vec<SessionSummary> = page
        .by_ref()
        .take(limit)
        .map(|(id, session)| SessionSummary {
            id: id.to_string(),
            name: session.name.clone(),
            ttl_ms: session.ttl_ms,
            remaining_ms: replica.lessor.remaining(*id, now).map(|left| left.as_millis() as u64),
            holds: session.holds.iter().filter(|key| caller.reads(key)).count() as u64,
            waits: session.waits.iter().filter(|key| caller.reads(key)).count() as u64,
        })
        .collect();
    let next_after = page.next().and(sessions.last().map(|s| s.id.clone()));
    Ok(axum::Json(SessionList { sessions, next_after }))
}

/// Close a session: its waits are cancelled and its holds released.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses((status = 204), (status = 404, body = ErrorBody)))]
pub(crate) async fn close(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id = parse_session(&id)?;
    caller.owns_or(&app.replica().read().state, id, Access::Admin)?;
    match app.propose(Command::CloseSession { id }).await? {
        Outcome::SessionClosed => Ok(StatusCode::NO_CONTENT),
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}
