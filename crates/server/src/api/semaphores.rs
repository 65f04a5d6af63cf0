//! `/v1/semaphores`: create, inspect, acquire, release, validate, delete.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use permit_core::{
    validate_acquire, validate_capacity, Access, Acquire, Command, Key, Kind, Limit, Name, Outcome, Refusal,
    Resource, Semaphore, SessionId, State as CoreState,
};
use permit_wire::{
    AcquireRequest, AcquireResponse, ErrorBody, ErrorCode, HistorySample, HolderView, PutSemaphoreRequest,
    ReleaseRequest, ReleaseResponse, RevokeRequest, SemaphoreHistory, SemaphoreList, SemaphoreSummary,
    SemaphoreView, ValidateRequest, ValidateResponse, WaiterView, INDEX_HEADER,
};
use serde::Deserialize;

use super::app::App;
use super::extract::{parse_name, parse_session, Json, Path, Query};
use super::grant::{self, capped_wait, Grant};
use super::watch::{blocking_read, ReadParams};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::history::HISTORY_SECONDS;

/// Default and largest page of `GET /v1/semaphores`.
const LIST_LIMIT_DEFAULT: usize = 100;
const LIST_LIMIT_MAX: usize = 1000;

fn index_header(index: u64) -> [(HeaderName, String); 1] {
    [(HeaderName::from_static(INDEX_HEADER), index.to_string())]
}

/// Builds the view of a semaphore from the applied state; `now_ms` is leader time now, and
/// `waited` how long a session has waited on it.
pub(crate) fn view(
    state: &CoreState,
    name: &Name,
    object: &Semaphore,
    now_ms: u64,
    waited: impl Fn(SessionId) -> Option<Duration>,
) -> SemaphoreView {
    let session_name = |id| state.session(id).and_then(|s| s.name.clone());
    SemaphoreView {
        name: name.to_string(),
        capacity: object.capacity,
        held: object.held,
        available: object.available(),
        index: object.modified_index,
        holders: object
            .holders
            .iter()
            .map(|(session, hold)| HolderView {
                session: session.to_string(),
                session_name: session_name(*session),
                permits: hold.permits,
                token: hold.token,
                granted_index: hold.granted_index,
                expires_in_ms: hold.expires_at_ms.map(|at| at.saturating_sub(state.now_ms())),
                held_ms: now_ms.saturating_sub(hold.granted_at_ms),
                group: None,
            })
            .collect(),
        waiters: object
            .queue
            .iter()
            .enumerate()
            .map(|(i, waiter)| WaiterView {
                session: waiter.session.to_string(),
                session_name: session_name(waiter.session),
                permits: waiter.permits,
                position: i as u64 + 1,
                waiting_ms: waited(waiter.session).map(millis),
                group: None,
                take: false,
            })
            .collect(),
        ephemeral: state.is_ephemeral(&Key::semaphore(name.clone())),
        rate: None,
        lock_delay_ms: 0,
        delayed: Vec::new(),
        group_max: None,
        groups: Vec::new(),
    }
}

/// A duration in whole milliseconds.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn read_view(app: &App, name: &Name) -> Result<(SemaphoreView, u64), ApiError> {
    let replica = app.replica().read();
    let object = replica.state.object(&Key::semaphore(name.clone())).ok_or_else(|| {
        ApiError::new(
            ErrorCode::SemaphoreNotFound,
            format!("semaphore {name} not found: {}", crate::error::SEMAPHORE_NOT_FOUND_HINT),
        )
    })?;
    let now_ms = app.now_ms(replica.state.now_ms());
    let key = Key::semaphore(name.clone());
    let view = view(&replica.state, name, object, now_ms, |session| app.observer.waited(&key, session));
    let index = view.index;
    Ok((view, index))
}

/// Create a semaphore, or set its capacity. Shrinking below what is held keeps the holders;
/// nothing is granted until holdings fit again.
#[utoipa::path(put, path = "/v1/semaphores/{name}", tag = "semaphores", request_body = PutSemaphoreRequest,
    params(("name" = String, Path, description = "Semaphore name: 1-128 bytes of [A-Za-z0-9._:-]")),
    responses((status = 201, body = SemaphoreView, description = "Created"),
              (status = 200, body = SemaphoreView, description = "Capacity set"),
              (status = 409, body = ErrorBody, description = "`limit_exceeded`: too many semaphores"),
              (status = 429, body = ErrorBody, description = "`limit_exceeded`: the token has created \
as many semaphores and elections as `--objects-per-token-max` allows; retry after `Retry-After` seconds")))]
pub(crate) async fn put(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<PutSemaphoreRequest>,
) -> Result<Response, ApiError> {
    let name = parse_name(&name)?;
    validate_capacity(request.capacity)?;
    if request.rate.is_some() || request.lock_delay_ms.is_some() || request.group_max.is_some() {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            "rate, lock_delay_ms and group_max are not served yet",
        ));
    }
    caller.check_objects_cap(&app, &Key::semaphore(name.clone())).await?;
    let (capacity, creator) = (request.capacity, caller.creator(&app));
    let command = match creator {
        Some(creator) => Command::PutSemaphoreBy { name: name.clone(), capacity, creator },
        None => Command::PutSemaphore { name: name.clone(), capacity },
    };
    let status = match app.propose(command).await? {
        Outcome::SemaphoreCreated => StatusCode::CREATED,
        Outcome::SemaphoreUpdated => StatusCode::OK,
        Outcome::Refused(Refusal::LimitExceeded(Limit::ObjectsPerToken)) => {
            return Err(crate::auth::slowly(crate::auth::objects_cap_refusal()).await)
        }
        Outcome::Refused(refusal) => return Err(refusal.into()),
        other => return Err(ApiError::internal(other)),
    };
    let (view, index) = read_view(&app, &name)?;
    Ok((status, index_header(index), axum::Json(view)).into_response())
}

/// A semaphore's capacity, holders and waiters. With `index`, blocks until it changes.
#[utoipa::path(get, path = "/v1/semaphores/{name}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ReadParams),
    responses((status = 200, body = SemaphoreView, headers(("permit-index" = u64))), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Query(params): Query<ReadParams>,
) -> Result<Response, ApiError> {
    let name = parse_name(&name)?;
    let poll = match params.index {
        Some(_) => Some(caller.long_poll(&app).await?),
        None => None,
    };
    let read = blocking_read(&app, Key::semaphore(name.clone()), &params, |app| read_view(app, &name));
    // A blocking read ends when its token is deleted or this node falls out of contact.
    let (view, index) = match poll {
        Some(_) => caller.unless_cut_off(&app, true, read).await?,
        None => read.await?,
    };
    Ok((index_header(index), axum::Json(view)).into_response())
}

/// What this node saw of a semaphore over the last 15 minutes, one sample per second of its own
/// clock: held, capacity, waiters, the most held and the grants of each second. Every node
/// answers from what it applied itself (not forwarded), since it started; it keeps a history
/// for the first `--metrics-names-max` semaphores it tracks (`kept`).
#[utoipa::path(get, path = "/v1/semaphores/{name}/history", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), HistoryParams),
    responses((status = 200, body = SemaphoreHistory, description = "One sample per second, oldest first"),
              (status = 404, body = ErrorBody, description = "`semaphore_not_found`: this node has no such semaphore \
(`not_found`: no route matches, e.g. an empty path segment)")))]
pub(crate) async fn history(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(params): Query<HistoryParams>,
) -> Result<axum::Json<SemaphoreHistory>, ApiError> {
    let name = parse_name(&name)?;
    let seconds = params.seconds.unwrap_or(HISTORY_SECONDS as u64);
    if !(1..=HISTORY_SECONDS as u64).contains(&seconds) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            format!("seconds must be in 1..={HISTORY_SECONDS}"),
        ));
    }
    let key = Key::semaphore(name.clone());
    if app.replica().read().state.object(&key).is_none() {
        return Err(ApiError::new(
            ErrorCode::SemaphoreNotFound,
            format!("semaphore {name} not found: {}", crate::error::SEMAPHORE_NOT_FOUND_HINT),
        ));
    }
    let (kept, now_ms) = app.observer.history(&key);
    let samples = kept
        .as_ref()
        .map(|samples| {
            samples[samples.len().saturating_sub(seconds as usize)..]
                .iter()
                .map(|(at_ms, second)| HistorySample {
                    at_ms: *at_ms,
                    held: second.held.into(),
                    capacity: second.capacity.into(),
                    waiters: second.waiters.into(),
                    held_max: second.held_max.into(),
                    grants: second.grants.into(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(axum::Json(SemaphoreHistory {
        name: name.to_string(),
        now_ms,
        interval_ms: 1000,
        kept: kept.is_some(),
        samples,
    }))
}

/// Query parameters of a semaphore's history.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct HistoryParams {
    /// Only the last this many seconds (the newest samples), default and at most 900.
    #[param(minimum = 1, maximum = 900)]
    pub(crate) seconds: Option<u64>,
}

/// Query parameters of the list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListParams {
    /// Start after this name (for sessions: this session id).
    pub(crate) after: Option<String>,
    /// Page size, default 100, at most 1000.
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<usize>,
    /// Serve from this node's applied state (may be stale).
    #[serde(default)]
    pub(crate) stale: bool,
}

/// The page size a list asks for, checked against [`LIST_LIMIT_MAX`].
pub(crate) fn list_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(LIST_LIMIT_DEFAULT);
    if !(1..=LIST_LIMIT_MAX).contains(&limit) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            format!("limit must be in 1..={LIST_LIMIT_MAX}"),
        ));
    }
    Ok(limit)
}

/// Semaphores in name order, one page at a time: only those the caller may read. The walk visits
/// only the names under the caller's read rules, so its cost follows what the caller may see,
/// not the size of the table.
#[utoipa::path(get, path = "/v1/semaphores", tag = "semaphores", params(ListParams),
    responses((status = 200, body = SemaphoreList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<SemaphoreList>, ApiError> {
    let after = params.after.as_deref().map(parse_name).transpose()?;
    let limit = list_limit(params.limit)?;
    if !params.stale {
        app.ensure_linearizable().await?;
    }
    let prefixes = caller.prefixes(Resource::Semaphore, Access::Read);
    let replica = app.replica().read();
    let mut page = replica.state.objects_in_prefixes(Kind::Semaphore, &prefixes, after.as_ref());
    let semaphores: Vec<SemaphoreSummary> = page
        .by_ref()
        .filter(|(key, _)| caller.can(Resource::Semaphore, key.name.as_str(), Access::Read))
        .take(limit)
        .map(|(key, object)| SemaphoreSummary {
            name: key.name.to_string(),
            capacity: object.capacity,
            held: object.held,
            available: object.available(),
            delayed: 0,
            rated: false,
            holders: object.holders.len() as u64,
            waiters: object.queue.len() as u64,
            oldest_wait_ms: app.observer.oldest_wait(key).map(millis),
            ephemeral: replica.state.is_ephemeral(key),
        })
        .collect();
    let next_after = match page.next() {
        Some(_) => semaphores.last().map(|s| s.name.clone()),
        None => None,
    };
    Ok(axum::Json(SemaphoreList { semaphores, next_after }))
}

/// Delete a semaphore that nobody holds or waits on.
#[utoipa::path(delete, path = "/v1/semaphores/{name}", tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub(crate) async fn delete(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = parse_name(&name)?;
    match app.propose(Command::DeleteSemaphore { name }).await? {
        Outcome::SemaphoreDeleted => Ok(StatusCode::NO_CONTENT),
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

/// Acquire permits. `wait_ms = 0` tries once (409 `unavailable`, nothing queued); `wait_ms > 0`
/// queues in strict FIFO order and long-polls; 202 means still queued, place kept. Repeating the
/// call is idempotent: same grant and token, or same place in the queue.
#[utoipa::path(post, path = "/v1/semaphores/{name}/acquire", tag = "semaphores", request_body = AcquireRequest,
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = AcquireResponse, description = "Acquired"),
              (status = 202, body = AcquireResponse, description = "Still waiting"),
              (status = 404, body = ErrorBody, description = "`session_not_found`, `semaphore_not_found`"),
              (status = 409, body = ErrorBody, description = "`unavailable`, `permits_exceed_capacity`, \
`permits_mismatch`, `wait_cancelled`, `limit_exceeded`"),
              (status = 429, body = ErrorBody, description = "`limit_exceeded`: a per-token cap (long-polls, \
or objects created: `--objects-per-token-max`); retry after `Retry-After` seconds")))]
pub(crate) async fn acquire(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<AcquireRequest>,
) -> Result<Response, ApiError> {
    let name = parse_name(&name)?;
    let session = parse_session(&request.session)?;
    if request.group.is_some() {
        return Err(ApiError::new(ErrorCode::InvalidArgument, "group is not served yet"));
    }
    caller.check_owns(&app, session)?;
    let wait_ms = capped_wait(request.wait_ms);
    let _poll = if wait_ms > 0 { Some(caller.long_poll(&app).await?) } else { None };
    let acquire = Acquire {
        key: Key::semaphore(name),
        session,
        permits: request.permits.unwrap_or(1),
        wait: wait_ms > 0,
        capacity: request.capacity,
        max_hold_ms: request.max_hold_ms,
        value: None,
    };
    validate_acquire(&acquire)?;
    caller.check_objects_cap(&app, &acquire.key).await?;
    // A waiting acquire ends (401) when its token is deleted.
    let grant = grant::acquire(&app, acquire, wait_ms, request.ephemeral, caller.creator(&app));
    let grant = if wait_ms > 0 { caller.unless_cut_off(&app, false, grant).await? } else { grant.await? };
    Ok(match grant {
        Grant::Acquired { permits, token } => {
            (StatusCode::OK, axum::Json(AcquireResponse::Acquired { permits, token })).into_response()
        }
        Grant::Waiting { position } => {
            (StatusCode::ACCEPTED, axum::Json(AcquireResponse::Waiting { position })).into_response()
        }
    })
}

/// Release the session's hold, or cancel its wait. Releasing nothing is not an error.
#[utoipa::path(post, path = "/v1/semaphores/{name}/release", tag = "semaphores", request_body = ReleaseRequest,
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = ReleaseResponse), (status = 404, body = ErrorBody)))]
pub(crate) async fn release(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<ReleaseRequest>,
) -> Result<axum::Json<ReleaseResponse>, ApiError> {
    let key = Key::semaphore(parse_name(&name)?);
    release_key(&app, key, &request.session, Some(&caller)).await
}

/// End another session's hold (or wait) on the semaphore: an admin's answer to a stuck holder.
/// The session lives on; its client sees the hold gone at its next call.
#[utoipa::path(post, path = "/v1/semaphores/{name}/revoke", tag = "semaphores", request_body = RevokeRequest,
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = ReleaseResponse)))]
pub(crate) async fn revoke(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Json(request): Json<RevokeRequest>,
) -> Result<axum::Json<ReleaseResponse>, ApiError> {
    let key = Key::semaphore(parse_name(&name)?);
    release_key(&app, key, &request.session, None).await
}

/// Releases `session`'s hold or wait on `key` (shared with elections' resign and the revokes).
/// With a `caller`, the session must be the caller's; `None` is an admin's revoke.
pub(crate) async fn release_key(
    app: &App,
    key: Key,
    session: &str,
    caller: Option<&Caller>,
) -> Result<axum::Json<ReleaseResponse>, ApiError> {
    let session = parse_session(session)?;
    if let Some(caller) = caller {
        caller.check_owns(app, session)?;
    }
    let command = match caller {
        Some(_) => Command::Release { key, session },
        None => Command::Revoke { key, session },
    };
    match app.propose(command).await? {
        Outcome::Released { permits } => Ok(axum::Json(ReleaseResponse { released: permits })),
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

/// Whether a current holder of the semaphore carries this token (a linearizable read, like
/// Chubby's CheckSequencer): a resource that cannot store tokens can still reject stale holders.
#[utoipa::path(post, path = "/v1/semaphores/{name}/validate", tag = "semaphores", request_body = ValidateRequest,
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = ValidateResponse)))]
pub(crate) async fn validate(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Json(request): Json<ValidateRequest>,
) -> Result<axum::Json<ValidateResponse>, ApiError> {
    let key = Key::semaphore(parse_name(&name)?);
    app.ensure_linearizable().await?;
    let replica = app.replica().read();
    let holder = replica.state.object(&key).and_then(|object| object.holder_of_token(request.token));
    Ok(axum::Json(ValidateResponse { valid: holder.is_some(), session: holder.map(|s| s.to_string()) }))
}
