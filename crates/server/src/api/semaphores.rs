//! `/v1/semaphores`: create, inspect, acquire, release, validate, delete.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use permit_core::{
    validate_acquire, validate_capacity, validate_group, validate_policy_change, validate_take, Access,
    Acquire, Command, Key, Kind, Limit, Name, Outcome, Policy, PolicyChange, Rate, Refusal, Resource,
    Semaphore, SessionId, State as CoreState,
};
use permit_wire::{
    AcquireRequest, AcquireResponse, DelayedPermits, ErrorBody, ErrorCode, GroupView, HistorySample,
    HolderView, PutSemaphoreRequest, RateView, ReleaseRequest, ReleaseResponse, RevokeRequest,
    SemaphoreHistory, SemaphoreList, SemaphoreSummary, SemaphoreView, TakeRequest, TakeResponse,
    ValidateRequest, ValidateResponse, WaiterView, INDEX_HEADER,
};
use serde::Deserialize;

use super::app::App;
use super::extract::{parse_name, parse_session, Json, Path, Query};
use super::grant::{self, capped_wait, Grant};
use super::watch::{blocking_read, ReadParams};
use crate::auth::Caller;
use crate::error::ApiError;
use crate::history::HISTORY_SECONDS;
use tokio::time::Instant;

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
    let key = Key::semaphore(name.clone());
    let policy = state.policy(&key);
    let group_of = |session| policy.and_then(|p| p.groups.get(&session)).map(|group| group.to_string());
    let delayed = policy.map_or(0, Policy::delayed_permits);
    SemaphoreView {
        name: name.to_string(),
        capacity: object.capacity,
        held: object.held,
        available: object.available().saturating_sub(delayed),
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
                group: group_of(*session),
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
                group: group_of(waiter.session),
                take: policy.is_some_and(|p| p.takers.contains_key(&waiter.session)),
            })
            .collect(),
        ephemeral: state.is_ephemeral(&key),
        rate: policy.and_then(|policy| {
            let rate = policy.rate?;
            let (available, next_in_ms) = policy.rate_state(now_ms)?;
            Some(RateView {
                permits: rate.permits,
                per_ms: rate.per_ms,
                burst: rate.burst,
                available,
                next_in_ms,
            })
        }),
        lock_delay_ms: policy.map_or(0, |policy| policy.lock_delay_ms),
        delayed: policy
            .map(|policy| {
                policy
                    .delayed
                    .iter()
                    .map(|delayed| DelayedPermits {
                        permits: delayed.permits,
                        until_ms: delayed.until_ms,
                        remaining_ms: delayed.until_ms.saturating_sub(now_ms),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        group_max: policy.and_then(|policy| policy.group_max),
        groups: policy.map(|policy| groups(policy, object)).unwrap_or_default(),
    }
}

/// Holdings and waiters per group.
fn groups(policy: &Policy, object: &Semaphore) -> Vec<GroupView> {
    let mut groups: std::collections::BTreeMap<&Name, GroupView> = std::collections::BTreeMap::new();
    for (session, group) in &policy.groups {
        let view = groups.entry(group).or_insert_with(|| GroupView {
            group: group.to_string(),
            held: 0,
            holders: 0,
            waiters: 0,
        });
        if let Some(hold) = object.holders.get(session) {
            view.held += hold.permits;
            view.holders += 1;
        } else {
            view.waiters += 1;
        }
    }
    groups.into_values().collect()
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
    let policy = PolicyChange {
        rate: request.rate.map(|rate| {
            rate.map(|rate| Rate {
                permits: rate.permits,
                per_ms: rate.per_ms,
                burst: rate.burst.unwrap_or(rate.permits),
            })
        }),
        lock_delay_ms: request.lock_delay_ms,
        group_max: request.group_max,
    };
    validate_policy_change(&policy)?;
    caller.check_objects_cap(&app, &Key::semaphore(name.clone())).await?;
    let (capacity, creator) = (request.capacity, caller.creator(&app));
    let command = match creator {
        // Only a put that changes a policy needs the newer command (cluster version 5).
        _ if !policy.is_empty() => {
            Command::PutSemaphorePolicy { name: name.clone(), capacity, policy, creator }
        }
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
    let delayed = |key: &Key| replica.state.policy(key).map_or(0, Policy::delayed_permits);
    let mut page = replica.state.objects_in_prefixes(Kind::Semaphore, &prefixes, after.as_ref());
    let semaphores: Vec<SemaphoreSummary> = page
        .by_ref()
        .filter(|(key, _)| caller.can(Resource::Semaphore, key.name.as_str(), Access::Read))
        .take(limit)
        .map(|(key, object)| SemaphoreSummary {
            name: key.name.to_string(),
            capacity: object.capacity,
            held: object.held,
            available: object.available().saturating_sub(delayed(key)),
            delayed: delayed(key),
            rated: replica.state.policy(key).is_some_and(|policy| policy.rate.is_some()),
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
    let group = request.group.as_deref().map(validate_group).transpose()?;
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
    let grant = grant::acquire(&app, acquire, wait_ms, request.ephemeral, caller.creator(&app), group);
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

/// Take permits of the semaphore's rate, holding nothing: no session needed. `wait_ms = 0`
/// answers at once (429 `rate_limited` with `retry_after_ms` when the rate or earlier waiters
/// leave no room); `wait_ms > 0` waits in the semaphore's FIFO queue, behind earlier acquires
/// and takes, until served or the wait runs out (then 429). A semaphore without a rate takes at
/// once. A retried take is a new take.
#[utoipa::path(post, path = "/v1/semaphores/{name}/take", tag = "semaphores", request_body = TakeRequest,
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = TakeResponse, description = "Taken"),
              (status = 404, body = ErrorBody, description = "`semaphore_not_found`"),
              (status = 409, body = ErrorBody, description = "`permits_exceed_capacity`: more than the rate's \
burst; `limit_exceeded`: too many waiters; `feature_unavailable`: a member runs an older build"),
              (status = 429, body = ErrorBody, description = "`rate_limited`: nothing taken; \
`retry_after_ms` (and `Retry-After`) says when the rate allows it")))]
pub(crate) async fn take(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<TakeRequest>,
) -> Result<axum::Json<TakeResponse>, ApiError> {
    let name = parse_name(&name)?;
    let permits = request.permits.unwrap_or(1);
    let wait_ms = capped_wait(request.wait_ms);
    validate_take(permits, wait_ms)?;
    let _poll = if wait_ms > 0 { Some(caller.long_poll(&app).await?) } else { None };
    let take = take_permits(app.clone(), name, permits, wait_ms);
    let token = if wait_ms > 0 { caller.unless_cut_off(&app, false, take).await? } else { take.await? };
    Ok(axum::Json(TakeResponse::Taken { token }))
}

/// Proposes the take and, if it waits, long-polls until it is served or `wait_ms` passes (then
/// ends it).
async fn take_permits(app: Arc<App>, name: Name, permits: u64, wait_ms: u64) -> Result<u64, ApiError> {
    let key = Key::semaphore(name.clone());
    // The take's place in the queue, where a session would stand: random, as session ids are.
    let taker = SessionId::from_bytes(rand::random());
    let subscription = (wait_ms > 0).then(|| app.notifier.subscribe(key.clone(), taker));
    match app.propose(Command::Take { name: name.clone(), taker, permits, wait_ms }).await? {
        Outcome::Taken { token } => return Ok(token),
        Outcome::TakeWaiting => {}
        Outcome::Refused(refusal) => return Err(refusal.into()),
        other => return Err(ApiError::internal(other)),
    }
    let Some(subscription) = subscription else {
        return Err(ApiError::internal("a take without wait_ms was left waiting"));
    };
    let mut abandoned = AbandonedTake { app: Some(app.clone()), name: name.clone(), taker };
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut shutdown = app.shutdown.clone();
    // `Some(None)`: the wait ended in the state without a token.
    let served = subscription
        .wait(deadline, &mut shutdown, || {
            if let Some(token) = app.notifier.taken(&key, taker) {
                return Some(Some(token));
            }
            let waiting = app
                .replica()
                .read()
                .state
                .object(&key)
                .is_some_and(|object| object.queue.get(taker).is_some());
            (!waiting).then_some(None)
        })
        .await;
    if let Ok(Some(token)) = served {
        abandoned.app = None;
        return Ok(token);
    }
    // Out of time, or the wait ended in the state: end it, unless it was served meanwhile.
    abandoned.app = None;
    if let Some(token) = app.notifier.taken(&key, taker) {
        return Ok(token);
    }
    let ended = app.propose(Command::CancelTake { name, taker }).await;
    if let Some(token) = app.notifier.taken(&key, taker) {
        return Ok(token);
    }
    match ended? {
        Outcome::TakeCancelled { .. } | Outcome::Refused(Refusal::SemaphoreNotFound) => {}
        Outcome::Refused(refusal) => return Err(refusal.into()),
        other => return Err(ApiError::internal(other)),
    }
    let retry_after_ms = {
        let replica = app.replica().read();
        let now_ms = app.now_ms(replica.state.now_ms());
        replica.state.policy(&key).map_or(1, |policy| policy.rate_wait_ms(permits, now_ms).max(1))
    };
    Err(ApiError::rate_limited(
        format!("the rate of {key} did not allow {permits} permits within the wait"),
        retry_after_ms,
    ))
}

/// A waiting take whose request may go away (its client hangs up, the connection drops): unless
/// disarmed (`app` taken), dropping it ends the take, which would otherwise keep its place until
/// its wait ran out and could spend the rate for nobody.
struct AbandonedTake {
    app: Option<Arc<App>>,
    name: Name,
    taker: SessionId,
}

impl Drop for AbandonedTake {
    fn drop(&mut self) {
        // Outside a runtime (the server is going down) there is nothing to end it with, and no
        // one to serve it for: a restart's state keeps it until its wait runs out.
        if let (Some(app), Ok(runtime)) = (self.app.take(), tokio::runtime::Handle::try_current()) {
            let command = Command::CancelTake { name: self.name.clone(), taker: self.taker };
            runtime.spawn(async move {
                if let Err(error) = app.propose(command).await {
                    tracing::debug!(%error, "could not end an abandoned take; its wait ends it");
                }
            });
        }
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
