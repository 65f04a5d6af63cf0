//! `/v1/health` (readiness), `/v1/health/live` (liveness), `/metrics` and the OpenAPI spec.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use permit_wire::{Health, NotReady, StateDigest, StorageFailure};

use super::app::{App, Role, Status};
use crate::error::ApiError;
use crate::failstop::Failure;

/// Readiness: 200 only when this node can serve (a member that knows a leader, with a live Raft
/// core and a writable data dir); 503 with the `reason` otherwise. For load balancers and
/// Kubernetes readiness probes.
#[utoipa::path(get, path = "/v1/health", tag = "system",
    responses((status = 200, body = Health), (status = 503, body = Health)))]
pub(crate) async fn health(State(app): State<Arc<App>>) -> impl IntoResponse {
    let health = report(&app);
    let status = if health.reason.is_none() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(health))
}

/// Liveness: 200 while the process works (even without a leader, while joining or once removed),
/// 503 once it failed (`storage_error`) or is stopping (`shutdown`): then it exits soon. For
/// Kubernetes liveness probes. The body is the same report as `/v1/health`.
#[utoipa::path(get, path = "/v1/health/live", tag = "system",
    responses((status = 200, body = Health), (status = 503, body = Health)))]
pub(crate) async fn live(State(app): State<Arc<App>>) -> impl IntoResponse {
    let health = report(&app);
    let status = if alive(&health) { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(health))
}

/// Whether `/v1/health` would answer 200 (systemd's `READY=1`, `sd_notify`).
pub(crate) fn is_ready(app: &App) -> bool {
    report(app).reason.is_none()
}

/// Whether `/v1/health/live` would answer 200 (systemd's watchdog, `sd_notify`).
pub(crate) fn is_live(app: &App) -> bool {
    alive(&report(app))
}

/// Liveness: the node has neither failed nor begun to stop.
fn alive(health: &Health) -> bool {
    !matches!(health.reason, Some(NotReady::Shutdown | NotReady::StorageError | NotReady::UpgradeNeeded))
}

/// This node's health report.
fn report(app: &App) -> Health {
    let status = app.status();
    let failure = app.fail_stop.failure();
    let (reason, detail) = match not_ready(app, failure.as_ref(), &status) {
        Some((reason, detail)) => (Some(reason), detail),
        None => (None, None),
    };
    let error = failure.and_then(|failure| {
        let kind = failure.kind?;
        Some(StorageFailure { kind, message: failure.message })
    });
    Health {
        status: if reason.is_none() { "ok" } else { "degraded" }.to_owned(),
        reason,
        detail,
        error,
        members: status.members.keys().copied().collect(),
        node_id: app.id,
        raft_leader: status.leader,
        raft_role: status.role.as_str().to_owned(),
        raft_term: status.term,
        applied_index: status.applied_index.unwrap_or(0),
        snapshot_index: status.snapshot_index.unwrap_or(0),
        feature_version: Some(super::app::speaks()),
        build: Some(super::app::BUILD.to_owned()),
    }
}

/// Why this node cannot serve, with details for humans; `None` when it can.
fn not_ready(app: &App, failure: Option<&Failure>, status: &Status) -> Option<(NotReady, Option<String>)> {
    if let Some(failure) = failure {
        return Some((failure.reason, Some(failure.message.clone())));
    }
    if *app.shutdown.borrow() || status.role == Role::Shutdown {
        return Some((NotReady::Shutdown, None));
    }
    if let Some(fatal) = &status.fatal {
        return Some((NotReady::Shutdown, Some(fatal.clone())));
    }
    if status.pristine() {
        return Some((NotReady::Joining, Some("started with --join; not added to a cluster yet".into())));
    }
    if app.removed() || !status.members.contains_key(&app.id) {
        return Some((NotReady::Removed, Some("removed from the cluster's membership".into())));
    }
    if status.leader.is_none() {
        return Some((NotReady::NoLeader, None));
    }
    None
}

/// Prometheus metrics (text format).
#[utoipa::path(get, path = "/metrics", tag = "system", responses((status = 200, body = String, content_type = "application/openmetrics-text")))]
pub(crate) async fn metrics(State(app): State<Arc<App>>) -> Result<impl IntoResponse, ApiError> {
    // Off the worker threads: a large state's render takes milliseconds, and requests queued
    // behind it on its worker would wait that long (docs/performance.md, *Metrics scrape cost
    // and apply stall*). One at a time, so that a flood of scrapes holds one blocking thread, not
    // one each.
    let turn = app.metrics.renders.clone().acquire_owned().await.map_err(ApiError::internal)?;
    let rendering = app.clone();
    let rendered = tokio::task::spawn_blocking(move || {
        let _turn = turn;
        refresh_gauges(&rendering);
        rendering.metrics.render()
    })
    .await
    .map_err(ApiError::internal)?;
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], rendered))
}

fn refresh_gauges(app: &App) {
    let raft = app.status();
    let g = &app.metrics.gauges;
    g.raft_term.set(raft.term as i64);
    g.raft_is_leader.set(i64::from(raft.role == Role::Leader));
    g.raft_last_log_index.set(raft.last_log_index.unwrap_or(0) as i64);
    g.raft_applied_index.set(raft.applied_index.unwrap_or(0) as i64);
    g.raft_snapshot_index.set(raft.snapshot_index.unwrap_or(0) as i64);
    g.raft_purged_index.set(raft.purged_index.unwrap_or(0) as i64);
    // Under the replica lock: O(1), and O(semaphores with a policy) for the gauges that depend
    // on the clock; everything else is kept up to date as entries apply.
    {
        let replica = app.replica().read();
        g.last_token.set(replica.state.last_token() as i64);
        let now_ms = app.now_ms(replica.state.now_ms());
        app.observer.refresh_policies(&replica.state, now_ms);
    }
    app.observer.refresh();
}

/// This node's applied state as a hash, to check that replicas converge (always local).
#[utoipa::path(get, path = "/v1/debug/digest", tag = "system", responses((status = 200, body = StateDigest)))]
pub(crate) async fn digest(State(app): State<Arc<App>>) -> axum::Json<StateDigest> {
    let replica = app.replica().read();
    let applied_index = replica.applied_index();
    axum::Json(StateDigest { node_id: app.id, applied_index, digest: replica.state.digest() })
}
