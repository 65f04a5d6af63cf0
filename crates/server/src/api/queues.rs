//! `/v1/queues`: create, inspect and delete queues; push, claim, ack and nack items.
//!
//! Every change is a command through the log. A blocked claim is replicated state (the queue's
//! claimers); this module only long-polls for the wake-up the state machine sends when the claim
//! is served, then reads the items the claim took from the applied state.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use permit_core::{
    validate_claim, validate_nack, validate_push, validate_queue_settings, Access, ClaimedItem, Command,
    Item, ItemState as CoreItemState, Key, Limit, Name, NewItem, Outcome, Payload, Queue, QueueSettings,
    Refusal, Resource, SessionId, Settled, State as CoreState,
};
use permit_wire::{
    AckRequest, CancelClaimRequest, ClaimRequest, ClaimResponse, ErrorBody, ErrorCode, ItemList, ItemState,
    ItemView, NackRequest, PushRequest, PushResponse, PushedItem, PutQueueRequest, QueueList, QueueView,
    SettleResponse, INDEX_HEADER,
};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::app::App;
use super::extract::{parse_name, parse_session, Json, Path, Query};
use super::grant::capped_wait;
use super::semaphores::{list_limit, ListParams};
use super::watch::{blocking_read, ReadParams};
use crate::auth::Caller;
use crate::error::ApiError;

fn index_header(index: u64) -> [(HeaderName, String); 1] {
    [(HeaderName::from_static(INDEX_HEADER), index.to_string())]
}

fn queue_not_found(name: &Name) -> ApiError {
    ApiError::new(ErrorCode::QueueNotFound, format!("queue {name} not found (a push creates it)"))
}

/// The view of a queue; `now_ms` is leader time now.
fn view(name: &Name, queue: &Queue, now_ms: u64) -> QueueView {
    let counts = queue.counts();
    QueueView {
        name: name.to_string(),
        pending: counts.pending,
        claimed: counts.claimed,
        delayed: counts.delayed,
        max_attempts: queue.max_attempts,
        dead_letter: queue.dead_letter.as_ref().map(Name::to_string),
        max_items: queue.max_items,
        claimers: counts.claimers,
        oldest_pending_ms: queue.first_pending().map(|item| now_ms.saturating_sub(item.entered_ms)),
        index: queue.modified_index,
    }
}

fn read_view(app: &App, name: &Name) -> Result<(QueueView, u64), ApiError> {
    let replica = app.replica().read();
    let queue = replica.state.queue(name).ok_or_else(|| queue_not_found(name))?;
    let view = view(name, queue, app.now_ms(replica.state.now_ms()));
    let index = view.index;
    Ok((view, index))
}

/// The refusal of a command made on behalf of a token, as the client sees it.
async fn refused(refusal: Refusal) -> ApiError {
    match refusal {
        Refusal::LimitExceeded(Limit::ObjectsPerToken) => {
            crate::auth::slowly(crate::auth::objects_cap_refusal()).await
        }
        refusal => refusal.into(),
    }
}

/// Create a queue, or change its settings (the fields given; a new queue takes the defaults for
/// the others). Needs cluster feature version 4.
#[utoipa::path(put, path = "/v1/queues/{name}", tag = "queues", request_body = PutQueueRequest,
    params(("name" = String, Path, description = "Queue name: 1-128 bytes of [A-Za-z0-9._:-]")),
    responses((status = 201, body = QueueView, description = "Created"),
              (status = 200, body = QueueView, description = "Settings changed"),
              (status = 400, body = ErrorBody, description = "`invalid_argument`: a setting is out of range"),
              (status = 409, body = ErrorBody, description = "`limit_exceeded`: too many queues; \
`feature_unavailable`: a member runs a build older than version 4"),
              (status = 429, body = ErrorBody, description = "`limit_exceeded`: the token has created as many \
objects as `--objects-per-token-max` allows")))]
pub(crate) async fn put(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<PutQueueRequest>,
) -> Result<Response, ApiError> {
    let name = parse_name(&name)?;
    let dead_letter = request.dead_letter.as_deref().map(parse_name).transpose()?;
    let settings =
        QueueSettings { max_attempts: request.max_attempts, dead_letter, max_items: request.max_items };
    validate_queue_settings(&name, &settings)?;
    caller.check_objects_cap(&app, &Key::queue(name.clone())).await?;
    let command = Command::PutQueue { name: name.clone(), settings, creator: caller.creator(&app) };
    let status = match app.propose(command).await? {
        Outcome::QueuePut { created: true } => StatusCode::CREATED,
        Outcome::QueuePut { created: false } => StatusCode::OK,
        Outcome::Refused(refusal) => return Err(refused(refusal).await),
        other => return Err(ApiError::internal(other)),
    };
    let (view, index) = read_view(&app, &name)?;
    Ok((status, index_header(index), axum::Json(view)).into_response())
}

/// A queue's counts and settings. With `index`, blocks until it changes.
#[utoipa::path(get, path = "/v1/queues/{name}", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ReadParams),
    responses((status = 200, body = QueueView, headers(("permit-index" = u64))),
              (status = 404, body = ErrorBody, description = "`queue_not_found`")))]
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
    let read = blocking_read(&app, Key::queue(name.clone()), &params, |app| read_view(app, &name));
    let (view, index) = match poll {
        Some(_) => caller.unless_cut_off(&app, true, read).await?,
        None => read.await?,
    };
    Ok((index_header(index), axum::Json(view)).into_response())
}

/// Queues in name order, one page at a time: only those the caller may read.
#[utoipa::path(get, path = "/v1/queues", tag = "queues", params(ListParams),
    responses((status = 200, body = QueueList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<QueueList>, ApiError> {
    let after = params.after.as_deref().map(parse_name).transpose()?;
    let limit = list_limit(params.limit)?;
    if !params.stale {
        app.ensure_linearizable().await?;
    }
    let replica = app.replica().read();
    let now_ms = app.now_ms(replica.state.now_ms());
    let mut page = replica
        .state
        .queues_after(after.as_ref())
        .filter(|(name, _)| caller.can(Resource::Queue, name.as_str(), Access::Read));
    let queues: Vec<QueueView> =
        page.by_ref().take(limit).map(|(name, queue)| view(name, queue, now_ms)).collect();
    let next_after = match page.next() {
        Some(_) => queues.last().map(|queue| queue.name.clone()),
        None => None,
    };
    Ok(axum::Json(QueueList { queues, next_after }))
}

/// Delete a queue that holds no item and no blocked claim.
#[utoipa::path(delete, path = "/v1/queues/{name}", tag = "queues",
    params(("name" = String, Path, description = "Queue name")),
    responses((status = 204), (status = 404, body = ErrorBody, description = "`queue_not_found`"),
              (status = 409, body = ErrorBody, description = "`queue_busy`: it holds items or blocked claims")))]
pub(crate) async fn delete(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = parse_name(&name)?;
    match app.propose(Command::DeleteQueue { name }).await? {
        Outcome::QueueDeleted => Ok(StatusCode::NO_CONTENT),
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

/// Push one item (`payload`, `delay_ms`, `key`) or up to 1000 (`items`), appended in order by
/// one log entry, all or nothing. Creates the queue with the defaults if it does not exist. An
/// item whose `key` matches a pending, delayed or claimed item adds nothing and answers that
/// item (`duplicate`). Bodies may be up to 4 MiB here.
#[utoipa::path(post, path = "/v1/queues/{name}/items", tag = "queues", request_body = PushRequest,
    params(("name" = String, Path, description = "Queue name")),
    responses((status = 201, body = PushResponse, description = "Pushed (at least one item was added)"),
              (status = 200, body = PushResponse, description = "Every item was a duplicate: nothing added"),
              (status = 400, body = ErrorBody, description = "`invalid_argument`"),
              (status = 409, body = ErrorBody, description = "`queue_full`: the queue holds `max_items`"),
              (status = 413, body = ErrorBody, description = "`payload_too_large`: a payload over 64 KiB; \
`body_too_large`: a body over 4 MiB"),
              (status = 429, body = ErrorBody, description = "`limit_exceeded`")))]
pub(crate) async fn push(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<PushRequest>,
) -> Result<Response, ApiError> {
    let name = parse_name(&name)?;
    let items = request.into_items().map_err(|why| ApiError::new(ErrorCode::InvalidArgument, why))?;
    let items: Vec<NewItem> = items.into_iter().map(new_item).collect();
    validate_push(&items)?;
    caller.check_objects_cap(&app, &Key::queue(name.clone())).await?;
    let command = Command::Push { queue: name, items, creator: caller.creator(&app) };
    let items = match app.propose(command).await? {
        Outcome::Pushed { items } => items,
        Outcome::Refused(refusal) => return Err(refused(refusal).await),
        other => return Err(ApiError::internal(other)),
    };
    let status = if items.iter().all(|item| item.duplicate) { StatusCode::OK } else { StatusCode::CREATED };
    let items = items
        .into_iter()
        .map(|item| PushedItem { id: item.id.to_string(), seq: item.seq, duplicate: item.duplicate })
        .collect();
    Ok((status, axum::Json(PushResponse { items })).into_response())
}

fn new_item(item: permit_wire::PushItem) -> NewItem {
    NewItem {
        payload: item.payload.get().to_owned().into(),
        delay_ms: item.delay_ms.unwrap_or(0),
        key: item.key,
    }
}

/// Claim up to `max` due items, in `seq` order, for a session: each claim lasts until it is
/// acked or nacked, or the session ends (then the item is pending again at once). With none due
/// and `wait_ms > 0`, the claim waits behind earlier blocked claims and is answered the moment
/// items come; `items` is empty when none came in time. `request_id` makes a retry answer the
/// same claim.
#[utoipa::path(post, path = "/v1/queues/{name}/claim", tag = "queues", request_body = ClaimRequest,
    params(("name" = String, Path, description = "Queue name")),
    responses((status = 200, body = ClaimResponse, description = "The claimed items (maybe none)"),
              (status = 400, body = ErrorBody, description = "`invalid_argument`: `max` out of range"),
              (status = 403, body = ErrorBody, description = "`permission_denied`: the session is another token's"),
              (status = 404, body = ErrorBody, description = "`session_not_found`, `queue_not_found`"),
              (status = 429, body = ErrorBody, description = "`limit_exceeded`: too many claims by this \
session, blocked claims on this queue, or long-polls of this token")))]
pub(crate) async fn claim(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<ClaimRequest>,
) -> Result<axum::Json<ClaimResponse>, ApiError> {
    let name = parse_name(&name)?;
    let session = parse_session(&request.session)?;
    caller.check_owns(&app, session)?;
    let claim = ClaimParams::new(&app, request.max, request.wait_ms, request.request_id)?;
    let items = claim_items(&app, &caller, name, session, claim, None).await?;
    Ok(axum::Json(ClaimResponse { items: items.into_iter().map(claimed_item).collect() }))
}

/// A claim's parameters, checked.
#[derive(Clone, Copy)]
struct ClaimParams {
    max: u32,
    /// Capped at the longest long-poll.
    wait_ms: u64,
    request_id: u64,
}

impl ClaimParams {
    /// Checks a claim's fields; picks a `request_id` when the client gave none.
    fn new(
        app: &App,
        max: Option<u32>,
        wait_ms: Option<u64>,
        request_id: Option<u64>,
    ) -> Result<Self, ApiError> {
        let max = max.unwrap_or(1);
        let wait_ms = capped_wait(wait_ms);
        validate_claim(max, wait_ms)?;
        let request_id = match request_id {
            Some(id) if id > permit_wire::CLAIM_REQUEST_ID_MAX => {
                return Err(ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("request_id must be at most {}", permit_wire::CLAIM_REQUEST_ID_MAX),
                ))
            }
            Some(id) => id,
            None => app.new_claim_request_id(),
        };
        Ok(ClaimParams { max, wait_ms, request_id })
    }
}

/// End a blocked claim (a client that stops waiting), by its `request_id`: it takes nothing more,
/// and the answer is what it took before (its items stay claimed; nack them to hand them back).
/// A claim that no longer waits, or never did, is left as it is.
#[utoipa::path(post, path = "/v1/queues/{name}/claim/cancel", tag = "queues", request_body = CancelClaimRequest,
    params(("name" = String, Path, description = "Queue name")),
    responses((status = 200, body = ClaimResponse, description = "What the claim took before it ended"),
              (status = 403, body = ErrorBody, description = "`permission_denied`: the session is another token's"),
              (status = 404, body = ErrorBody, description = "`queue_not_found`")))]
pub(crate) async fn cancel_claim(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<CancelClaimRequest>,
) -> Result<axum::Json<ClaimResponse>, ApiError> {
    let name = parse_name(&name)?;
    let session = parse_session(&request.session)?;
    caller.check_owns(&app, session)?;
    let command = Command::CancelClaim { queue: name.clone(), session, request: request.request_id };
    match app.propose(command).await? {
        Outcome::ClaimCancelled => {}
        Outcome::Refused(refusal) => return Err(refusal.into()),
        other => return Err(ApiError::internal(other)),
    }
    let (items, _) = app.replica().read().state.claim_status(&name, session, request.request_id);
    Ok(axum::Json(ClaimResponse { items: items.into_iter().map(claimed_item).collect() }))
}

fn claimed_item(item: ClaimedItem) -> permit_wire::ClaimedItem {
    permit_wire::ClaimedItem {
        id: item.id.to_string(),
        seq: item.seq,
        payload: raw(&item.payload),
        attempt: item.attempt,
        token: item.token,
    }
}

/// A payload as the state machine keeps it: JSON text the server checked when it was pushed.
fn raw(payload: &Payload) -> Box<RawValue> {
    RawValue::from_string(payload.as_str().to_owned())
        .unwrap_or_else(|_| RawValue::from_string("null".into()).expect("valid JSON"))
}

/// Proposes the claim (after the ack of `ack`'s item id and token, in the same command) and, if
/// it waits, long-polls until it is served or `wait_ms` passes (then ends it, and answers what it
/// took by then). Once an ack that claims is applied it stands: a session that ends while the
/// claim waits gets no items rather than an error.
async fn claim_items(
    app: &App,
    caller: &Caller,
    name: Name,
    session: SessionId,
    claim: ClaimParams,
    ack: Option<(u64, u64)>,
) -> Result<Vec<ClaimedItem>, ApiError> {
    let ClaimParams { max, wait_ms, request_id: request } = claim;
    let _poll = if wait_ms > 0 { Some(caller.long_poll(app).await?) } else { None };
    let key = Key::queue(name.clone());
    // Subscribe before proposing, so that a push applied right after the claim is not missed.
    let subscription = (wait_ms > 0).then(|| app.notifier.subscribe(key, session));
    let command = match ack {
        None => Command::Claim { queue: name.clone(), session, request, max, wait_ms },
        Some((id, token)) => {
            Command::AckAndClaim { queue: name.clone(), id, session, token, request, max, wait_ms }
        }
    };
    match app.propose(command).await? {
        Outcome::Claimed { items } => return Ok(items),
        Outcome::ClaimWaiting => {}
        Outcome::Refused(refusal) => return Err(refusal.into()),
        other => return Err(ApiError::internal(other)),
    }
    let Some(subscription) = subscription else {
        // The state machine never leaves a claim with `wait_ms` 0 waiting.
        return Err(ApiError::internal("a claim without wait_ms was left waiting"));
    };
    let waited = async {
        let deadline = Instant::now() + Duration::from_millis(wait_ms);
        let mut shutdown = app.shutdown.clone();
        let answered = subscription
            .wait(deadline, &mut shutdown, || {
                let replica = app.replica().read();
                if replica.state.session(session).is_none() {
                    return Some(match ack {
                        None => Err(ApiError::session_not_found()),
                        Some(_) => Ok(Vec::new()),
                    });
                }
                let (items, waiting) = replica.state.claim_status(&name, session, request);
                (!waiting).then_some(Ok(items))
            })
            .await;
        if let Ok(answer) = answered {
            return answer;
        }
        // Out of time: end the blocked claim, and answer what it took before that.
        match app.propose(Command::CancelClaim { queue: name.clone(), session, request }).await? {
            Outcome::ClaimCancelled | Outcome::Refused(Refusal::QueueNotFound) => {}
            Outcome::Refused(refusal) => return Err(refusal.into()),
            other => return Err(ApiError::internal(other)),
        }
        Ok(app.replica().read().state.claim_status(&name, session, request).0)
    };
    caller.unless_cut_off(app, false, waited).await
}

/// An item id from the path: the decimal digits the API hands out. Anything else names no item.
fn parse_item_id(id: &str) -> Result<u64, ApiError> {
    id.parse().ok().filter(|id| *id > 0).ok_or_else(|| {
        ApiError::new(ErrorCode::ItemNotFound, format!("{id:?} is not an item id this server hands out"))
    })
}

/// Ack a claimed item: it is done and gone. Only the claiming session with the claim's token
/// may; otherwise `claim_lost` (the claim ended: session gone, nacked, or claimed again since).
/// With `claim`, the same command then claims for the session as `POST .../claim` does (a
/// worker's loop in one round trip): both or neither, and the answer's `items` are what the
/// claim took. Once applied the ack stands, whatever happens to the claim's wait.
#[utoipa::path(post, path = "/v1/queues/{name}/items/{id}/ack", tag = "queues", request_body = AckRequest,
    params(("name" = String, Path, description = "Queue name"), ("id" = String, Path, description = "Item id")),
    responses((status = 200, body = SettleResponse, description = "Acked (and, with `claim`, the items it took)"),
              (status = 400, body = ErrorBody, description = "`invalid_argument`: the claim's `max` out of range, \
or its `request_id` names the claim of the acked item; nothing changed"),
              (status = 404, body = ErrorBody, description = "`queue_not_found`, `item_not_found` (not an id)"),
              (status = 409, body = ErrorBody, description = "`claim_lost`: nothing changed; \
`feature_unavailable`: `claim` needs cluster feature version 6"),
              (status = 429, body = ErrorBody, description = "`limit_exceeded` (with `claim`): too many claims by \
this session, blocked claims on this queue, or long-polls of this token; nothing changed")))]
pub(crate) async fn ack(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((name, id)): Path<(String, String)>,
    Json(request): Json<AckRequest>,
) -> Result<axum::Json<SettleResponse>, ApiError> {
    let name = parse_name(&name)?;
    let id = parse_item_id(&id)?;
    let session = parse_session(&request.session)?;
    let claim = match &request.claim {
        Some(next) => Some(ClaimParams::new(&app, next.max, next.wait_ms, next.request_id)?),
        None => None,
    };
    caller.check_owns(&app, session)?;
    if crate::bugs::is(crate::bugs::Bug::LostAck) {
        // Answered as an ack whose claim took nothing, without proposing either.
        let items = claim.is_some().then(Vec::new);
        return Ok(axum::Json(SettleResponse { id: id.to_string(), state: None, items }));
    }
    if let Some(claim) = claim {
        let items = claim_items(&app, &caller, name, session, claim, Some((id, request.token))).await?;
        let items = Some(items.into_iter().map(claimed_item).collect());
        return Ok(axum::Json(SettleResponse { id: id.to_string(), state: None, items }));
    }
    match app.propose(Command::Ack { queue: name, id, session, token: request.token }).await? {
        Outcome::Acked => Ok(axum::Json(SettleResponse { id: id.to_string(), state: None, items: None })),
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

/// Nack a claimed item: pending again in its `seq` place (after `delay_ms`), or moved to the
/// dead-letter queue when it was claimed `max_attempts` times. Only the claiming session with
/// the claim's token may; otherwise `claim_lost`.
#[utoipa::path(post, path = "/v1/queues/{name}/items/{id}/nack", tag = "queues", request_body = NackRequest,
    params(("name" = String, Path, description = "Queue name"), ("id" = String, Path, description = "Item id")),
    responses((status = 200, body = SettleResponse, description = "Where the item went"),
              (status = 400, body = ErrorBody, description = "`invalid_argument`: `delay_ms` or `error` too long"),
              (status = 404, body = ErrorBody, description = "`queue_not_found`, `item_not_found` (not an id)"),
              (status = 409, body = ErrorBody, description = "`claim_lost`: nothing changed")))]
pub(crate) async fn nack(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path((name, id)): Path<(String, String)>,
    Json(request): Json<NackRequest>,
) -> Result<axum::Json<SettleResponse>, ApiError> {
    let name = parse_name(&name)?;
    let id = parse_item_id(&id)?;
    let session = parse_session(&request.session)?;
    let delay_ms = request.delay_ms.unwrap_or(0);
    validate_nack(delay_ms, request.error.as_deref())?;
    caller.check_owns(&app, session)?;
    let command =
        Command::Nack { queue: name, id, session, token: request.token, delay_ms, error: request.error };
    match app.propose(command).await? {
        Outcome::Nacked { settled } => {
            let state = match settled {
                Settled::Pending => ItemState::Pending,
                Settled::Delayed => ItemState::Delayed,
                Settled::Dead => ItemState::Dead,
            };
            Ok(axum::Json(SettleResponse { id: id.to_string(), state: Some(state), items: None }))
        }
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

/// Remove one item whatever its state (a claim of it ends: its ack or nack gets `claim_lost`).
#[utoipa::path(delete, path = "/v1/queues/{name}/items/{id}", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ("id" = String, Path, description = "Item id")),
    responses((status = 204), (status = 404, body = ErrorBody, description = "`queue_not_found`, `item_not_found`")))]
pub(crate) async fn remove_item(
    State(app): State<Arc<App>>,
    Path((name, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let name = parse_name(&name)?;
    let id = parse_item_id(&id)?;
    match app.propose(Command::RemoveItem { queue: name, id }).await? {
        Outcome::ItemRemoved => Ok(StatusCode::NO_CONTENT),
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

/// Query parameters of the item list.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ItemListParams {
    /// Only items in this state: `pending`, `delayed` or `claimed`.
    pub(crate) state: Option<ItemState>,
    /// Start after this item id.
    pub(crate) after: Option<String>,
    /// Page size, default 100, at most 1000.
    #[param(minimum = 1, maximum = 1000)]
    pub(crate) limit: Option<usize>,
    /// Serve from this node's applied state (may be stale).
    #[serde(default)]
    pub(crate) stale: bool,
}

/// A queue's items in id order (the order they entered Permit), one page at a time, with their
/// state, attempts, claiming session and age.
#[utoipa::path(get, path = "/v1/queues/{name}/items", tag = "queues",
    params(("name" = String, Path, description = "Queue name"), ItemListParams),
    responses((status = 200, body = ItemList), (status = 404, body = ErrorBody, description = "`queue_not_found`")))]
pub(crate) async fn items(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Query(params): Query<ItemListParams>,
) -> Result<axum::Json<ItemList>, ApiError> {
    let name = parse_name(&name)?;
    let limit = list_limit(params.limit)?;
    let after = match params.after.as_deref() {
        Some(after) => parse_item_id(after)?,
        None => 0,
    };
    if params.state == Some(ItemState::Dead) {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            "state is pending, delayed or claimed: dead items are in the dead-letter queue",
        ));
    }
    if !params.stale {
        app.ensure_linearizable().await?;
    }
    let replica = app.replica().read();
    let queue = replica.state.queue(&name).ok_or_else(|| queue_not_found(&name))?;
    let now_ms = app.now_ms(replica.state.now_ms());
    let mut page = queue
        .items()
        .filter(|(id, _)| *id > after)
        .map(|(id, item)| item_view(&replica.state, id, item, now_ms))
        .filter(|view| params.state.is_none_or(|state| view.state == state));
    let items: Vec<ItemView> = page.by_ref().take(limit).collect();
    let next_after = match page.next() {
        Some(_) => items.last().map(|item| item.id.clone()),
        None => None,
    };
    Ok(axum::Json(ItemList { items, next_after }))
}

fn item_view(_state: &CoreState, id: u64, item: &Item, now_ms: u64) -> ItemView {
    let (state, claim, due_at_ms) = match &item.state {
        CoreItemState::Pending => (ItemState::Pending, None, None),
        CoreItemState::Delayed { until_ms } => (ItemState::Delayed, None, Some(*until_ms)),
        CoreItemState::Claimed(claim) => (ItemState::Claimed, Some(*claim), None),
    };
    ItemView {
        id: id.to_string(),
        seq: item.seq,
        state,
        attempt: item.attempt,
        session: claim.map(|claim| claim.session.to_string()),
        token: claim.map(|claim| claim.token),
        age_ms: now_ms.saturating_sub(item.entered_ms),
        due_at_ms,
        key: item.key.clone(),
        last_error: item.last_error.clone(),
        payload: raw(&item.payload),
    }
}
