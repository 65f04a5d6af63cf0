//! `/v1/elections`: leader election on a capacity-1 semaphore whose hold carries a value.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use permit_core::{
    validate_acquire, validate_election_value, Access, Acquire, Command, Key, Kind, Name, Outcome, Resource,
    Semaphore, SessionId, State as CoreState,
};
use permit_wire::{
    CampaignRequest, CampaignResponse, ElectionList, ElectionView, ErrorBody, LeaderView, ProclaimRequest,
    ReleaseRequest, ReleaseResponse, RevokeRequest, INDEX_HEADER,
};

use super::app::App;
use super::extract::{parse_name, parse_session, Json, Path, Query};
use super::grant::{self, capped_wait, Grant};
use super::semaphores::{list_limit, release_key, ListParams};
use super::watch::{blocking_read, ReadParams};
use crate::auth::Caller;
use crate::error::ApiError;

/// Campaign to lead: the session becomes leader when nobody leads and no earlier candidate waits.
/// Repeating the call is idempotent; by the leader with another value, it publishes that value
/// as a proclaim does (which needs cluster feature version 3).
#[utoipa::path(post, path = "/v1/elections/{name}/campaign", tag = "elections", request_body = CampaignRequest,
    params(("name" = String, Path, description = "Election name: 1-128 bytes of [A-Za-z0-9._:-]")),
    responses((status = 200, body = CampaignResponse, description = "Leader"),
              (status = 202, body = CampaignResponse, description = "Still waiting"),
              (status = 404, body = ErrorBody, description = "`session_not_found`"),
              (status = 409, body = ErrorBody, description = "`unavailable`, `wait_cancelled`, `limit_exceeded`; \
for the leader's campaign with another value, as for a proclaim: `not_leader`, `feature_unavailable`"),
              (status = 429, body = ErrorBody, description = "`limit_exceeded`: a per-token cap (long-polls, \
or objects created: `--objects-per-token-max`); retry after `Retry-After` seconds")))]
pub(crate) async fn campaign(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<CampaignRequest>,
) -> Result<Response, ApiError> {
    let name = parse_name(&name)?;
    let session = parse_session(&request.session)?;
    caller.check_owns(&app, session)?;
    let wait_ms = capped_wait(request.wait_ms);
    let _poll = if wait_ms > 0 { Some(caller.long_poll(&app).await?) } else { None };
    let acquire = Acquire {
        key: Key::election(name),
        session,
        permits: 1,
        wait: wait_ms > 0,
        capacity: None,
        max_hold_ms: None,
        value: Some(request.value.clone()),
    };
    let key = acquire.key.clone();
    validate_acquire(&acquire)?;
    caller.check_objects_cap(&app, &acquire.key).await?;
    // A waiting campaign ends (401) when its token is deleted.
    let grant = grant::acquire(&app, acquire, wait_ms, false, caller.creator(&app), None);
    let grant = if wait_ms > 0 { caller.unless_cut_off(&app, false, grant).await? } else { grant.await? };
    Ok(match grant {
        Grant::Acquired { token, .. } => {
            // A leader that campaigns again with another value publishes it: the campaign found
            // its hold (granted earlier, with the value of then), so the value is proclaimed.
            if published(&app, &key, session, token).is_some_and(|value| value != request.value) {
                proclaim_value(&app, key, session, request.value).await?;
            }
            (StatusCode::OK, axum::Json(CampaignResponse::Leader { token })).into_response()
        }
        Grant::Waiting { position } => {
            (StatusCode::ACCEPTED, axum::Json(CampaignResponse::Waiting { position })).into_response()
        }
    })
}

/// The value that `session` publishes as the leader of `key` with `token`, in the applied state.
fn published(app: &App, key: &Key, session: SessionId, token: u64) -> Option<String> {
    let replica = app.replica().read();
    let hold = replica.state.object(key)?.holders.get(&session).filter(|hold| hold.token == token)?;
    Some(hold.value.clone().unwrap_or_default())
}

/// Proposes that `session`, the leader of `key`, publishes `value`, and answers the leader as
/// the proclaim left it.
async fn proclaim_value(
    app: &App,
    key: Key,
    session: SessionId,
    value: String,
) -> Result<LeaderView, ApiError> {
    validate_election_value(&value)?;
    let command = Command::Proclaim { key, session, value: value.clone() };
    match app.propose(command).await? {
        Outcome::Proclaimed { token, granted_at_ms } => {
            let replica = app.replica().read();
            let now_ms = app.now_ms(replica.state.now_ms());
            Ok(LeaderView {
                session: session.to_string(),
                value,
                token,
                session_name: replica.state.session(session).and_then(|s| s.name.clone()),
                held_ms: now_ms.saturating_sub(granted_at_ms),
            })
        }
        Outcome::Refused(refusal) => Err(refusal.into()),
        other => Err(ApiError::internal(other)),
    }
}

/// The leader publishes a new value and keeps leading (etcd's `Proclaim`): its token and
/// tenure stay, `GET /v1/elections/{name}` and its watchers see the new value, and the event
/// stream says `proclaimed`. Needs cluster feature version 3.
#[utoipa::path(post, path = "/v1/elections/{name}/proclaim", tag = "elections", request_body = ProclaimRequest,
    params(("name" = String, Path, description = "Election name")),
    responses((status = 200, body = LeaderView, description = "The leader, with the new value"),
              (status = 400, body = ErrorBody, description = "`invalid_argument`: the value is too long"),
              (status = 404, body = ErrorBody, description = "`session_not_found`"),
              (status = 409, body = ErrorBody, description = "`not_leader`: the session does not lead; \
`feature_unavailable`: a member runs a build older than version 3")))]
pub(crate) async fn proclaim(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<ProclaimRequest>,
) -> Result<axum::Json<LeaderView>, ApiError> {
    let key = Key::election(parse_name(&name)?);
    let session = parse_session(&request.session)?;
    caller.check_owns(&app, session)?;
    Ok(axum::Json(proclaim_value(&app, key, session, request.value).await?))
}

/// The view of an election from the applied state; `now_ms` is leader time now.
fn view(state: &CoreState, name: &Name, object: Option<&Semaphore>, now_ms: u64) -> ElectionView {
    match object {
        None => ElectionView { name: name.to_string(), leader: None, candidates: 0, index: 0 },
        Some(object) => ElectionView {
            name: name.to_string(),
            leader: object.holders.iter().next().map(|(session, hold)| LeaderView {
                session: session.to_string(),
                value: hold.value.clone().unwrap_or_default(),
                token: hold.token,
                session_name: state.session(*session).and_then(|s| s.name.clone()),
                held_ms: now_ms.saturating_sub(hold.granted_at_ms),
            }),
            candidates: object.queue.len() as u64,
            index: object.modified_index,
        },
    }
}

fn read_view(app: &App, name: &Name) -> (ElectionView, u64) {
    let replica = app.replica().read();
    let now_ms = app.now_ms(replica.state.now_ms());
    let view = view(&replica.state, name, replica.state.object(&Key::election(name.clone())), now_ms);
    let index = view.index;
    (view, index)
}

/// Elections in name order, one page at a time: only those the caller may read. The walk visits
/// only the names under the caller's read rules (see `GET /v1/semaphores`).
#[utoipa::path(get, path = "/v1/elections", tag = "elections", params(ListParams),
    responses((status = 200, body = ElectionList)))]
pub(crate) async fn list(
    State(app): State<Arc<App>>,
    caller: Caller,
    Query(params): Query<ListParams>,
) -> Result<axum::Json<ElectionList>, ApiError> {
    let after = params.after.as_deref().map(parse_name).transpose()?;
    let limit = list_limit(params.limit)?;
    if !params.stale {
        app.ensure_linearizable().await?;
    }
    let prefixes = caller.prefixes(Resource::Election, Access::Read);
    let replica = app.replica().read();
    let now_ms = app.now_ms(replica.state.now_ms());
    let mut page = replica.state.objects_in_prefixes(Kind::Election, &prefixes, after.as_ref());
    let elections: Vec<ElectionView> = page
        .by_ref()
        .filter(|(key, _)| caller.can(Resource::Election, key.name.as_str(), Access::Read))
        .take(limit)
        .map(|(key, object)| view(&replica.state, &key.name, Some(object), now_ms))
        .collect();
    let next_after = match page.next() {
        Some(_) => elections.last().map(|e| e.name.clone()),
        None => None,
    };
    Ok(axum::Json(ElectionList { elections, next_after }))
}

/// The current leader, or `null`. With `index`, blocks until the election changes.
#[utoipa::path(get, path = "/v1/elections/{name}", tag = "elections",
    params(("name" = String, Path, description = "Election name"), ReadParams),
    responses((status = 200, body = ElectionView, headers(("permit-index" = u64)))))]
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
    let read = blocking_read(&app, Key::election(name.clone()), &params, |app| Ok(read_view(app, &name)));
    // A blocking read ends when its token is deleted or this node falls out of contact.
    let (view, index) = match poll {
        Some(_) => caller.unless_cut_off(&app, true, read).await?,
        None => read.await?,
    };
    Ok(([(HeaderName::from_static(INDEX_HEADER), index.to_string())], axum::Json(view)).into_response())
}

/// Resign leadership, or withdraw a waiting candidacy.
#[utoipa::path(post, path = "/v1/elections/{name}/resign", tag = "elections", request_body = ReleaseRequest,
    params(("name" = String, Path, description = "Election name")),
    responses((status = 200, body = ReleaseResponse), (status = 404, body = ErrorBody)))]
pub(crate) async fn resign(
    State(app): State<Arc<App>>,
    caller: Caller,
    Path(name): Path<String>,
    Json(request): Json<ReleaseRequest>,
) -> Result<axum::Json<ReleaseResponse>, ApiError> {
    let key = Key::election(parse_name(&name)?);
    release_key(&app, key, &request.session, Some(&caller)).await
}

/// End another session's leadership or candidacy: an admin's answer to a stuck leader.
#[utoipa::path(post, path = "/v1/elections/{name}/revoke", tag = "elections", request_body = RevokeRequest,
    params(("name" = String, Path, description = "Election name")),
    responses((status = 200, body = ReleaseResponse)))]
pub(crate) async fn revoke(
    State(app): State<Arc<App>>,
    Path(name): Path<String>,
    Json(request): Json<RevokeRequest>,
) -> Result<axum::Json<ReleaseResponse>, ApiError> {
    let key = Key::election(parse_name(&name)?);
    release_key(&app, key, &request.session, None).await
}
