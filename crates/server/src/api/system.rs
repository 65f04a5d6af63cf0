//! `/v1/health` (readiness), `/v1/health/live` (liveness), `/metrics` and the OpenAPI spec.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use openraft::ServerState;
use permit_core::Kind;
use permit_wire::{Health, NotReady, StateDigest};

use crate::metrics::{semaphore_labels, PER_SEMAPHORE_SERIES_MAX};
use crate::node::Node;

/// Readiness: 200 only when this node can serve (a member that knows a leader, with a live Raft
/// core and a writable data dir); 503 with the `reason` otherwise. For load balancers and
/// Kubernetes readiness probes.
#[utoipa::path(get, path = "/v1/health", tag = "system",
    responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn health(State(node): State<Arc<Node>>) -> impl IntoResponse {
    let health = report(&node);
    let status = if health.reason.is_none() { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(health))
}

/// Liveness: 200 while the process works (even without a leader, while joining or once removed),
/// 503 once it failed (`storage_error`) or is stopping (`shutdown`): then it exits soon. For
/// Kubernetes liveness probes. The body is the same report as `/v1/health`.
#[utoipa::path(get, path = "/v1/health/live", tag = "system",
    responses((status = 200, body = Health), (status = 503, body = Health)))]
pub async fn live(State(node): State<Arc<Node>>) -> impl IntoResponse {
    let health = report(&node);
    let dead = matches!(health.reason, Some(NotReady::Shutdown | NotReady::StorageError));
    let status = if dead { StatusCode::SERVICE_UNAVAILABLE } else { StatusCode::OK };
    (status, axum::Json(health))
}

/// This node's health report.
fn report(node: &Node) -> Health {
    let metrics = node.raft.metrics().borrow().clone();
    let role = match metrics.state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    };
    let membership = metrics.membership_config.membership();
    let members: Vec<u64> = membership.nodes().map(|(id, _)| *id).collect();
    let (reason, detail) = match not_ready(node, &metrics) {
        Some((reason, detail)) => (Some(reason), detail),
        None => (None, None),
    };
    Health {
        status: if reason.is_none() { "ok" } else { "degraded" }.to_owned(),
        reason,
        detail,
        members,
        node_id: node.id,
        raft_leader: metrics.current_leader,
        raft_role: role.to_owned(),
        raft_term: metrics.current_term,
        applied_index: metrics.last_applied.map_or(0, |id| id.index),
    }
}

/// Why this node cannot serve, with details for humans; `None` when it can.
fn not_ready(node: &Node, metrics: &crate::raft::RaftMetrics) -> Option<(NotReady, Option<String>)> {
    if let Some(failure) = node.fail_stop.failure() {
        return Some((failure.reason, Some(failure.message)));
    }
    if *node.shutdown.borrow() || metrics.state == ServerState::Shutdown {
        return Some((NotReady::Shutdown, None));
    }
    if let Err(fatal) = &metrics.running_state {
        return Some((NotReady::Shutdown, Some(fatal.to_string())));
    }
    let membership = metrics.membership_config.membership();
    if membership.nodes().next().is_none() {
        return Some((NotReady::Joining, Some("started with --join; not added to a cluster yet".into())));
    }
    if *node.removed.borrow() || membership.get_node(&node.id).is_none() {
        return Some((NotReady::Removed, Some("removed from the cluster's membership".into())));
    }
    if metrics.current_leader.is_none() {
        return Some((NotReady::NoLeader, None));
    }
    None
}

/// Prometheus metrics (text format).
#[utoipa::path(get, path = "/metrics", tag = "system", responses((status = 200, body = String, content_type = "application/openmetrics-text")))]
pub async fn metrics(State(node): State<Arc<Node>>) -> impl IntoResponse {
    refresh_gauges(&node);
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], node.metrics.render())
}

fn refresh_gauges(node: &Node) {
    let raft = node.raft.metrics().borrow().clone();
    let g = &node.metrics.gauges;
    g.raft_term.set(raft.current_term as i64);
    g.raft_is_leader.set(i64::from(raft.state == ServerState::Leader));
    g.raft_last_log_index.set(raft.last_log_index.unwrap_or(0) as i64);
    g.raft_applied_index.set(raft.last_applied.map_or(0, |id| id.index) as i64);
    g.raft_snapshot_index.set(raft.snapshot.map_or(0, |id| id.index) as i64);
    g.raft_purged_index.set(raft.purged.map_or(0, |id| id.index) as i64);
    let replica = node.replica.lock();
    let state = &replica.state;
    g.sessions.set(state.session_count() as i64);
    g.last_token.set(state.last_token() as i64);
    let (mut semaphores, mut holds, mut waiters) = (0, 0, 0);
    g.semaphore_capacity.clear();
    g.semaphore_held.clear();
    g.semaphore_waiters.clear();
    for (key, object) in state.objects_after(Kind::Semaphore, None) {
        if semaphores < PER_SEMAPHORE_SERIES_MAX {
            let labels = semaphore_labels(key.name.as_str());
            g.semaphore_capacity.get_or_create(&labels).set(object.capacity as i64);
            g.semaphore_held.get_or_create(&labels).set(object.held as i64);
            g.semaphore_waiters.get_or_create(&labels).set(object.queue.len() as i64);
        }
        semaphores += 1;
        holds += object.holders.len();
        waiters += object.queue.len();
    }
    let mut elections = 0;
    for (_, object) in state.objects_after(Kind::Election, None) {
        elections += 1;
        holds += object.holders.len();
        waiters += object.queue.len();
    }
    g.semaphores.set(semaphores as i64);
    g.elections.set(elections as i64);
    g.holds.set(holds as i64);
    g.waiters.set(waiters as i64);
}

/// The OpenAPI 3 spec of this API.
pub async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], super::openapi::spec_json())
}

/// This node's applied state as a hash, to check that replicas converge (always local).
#[utoipa::path(get, path = "/v1/debug/digest", tag = "system", responses((status = 200, body = StateDigest)))]
pub async fn digest(State(node): State<Arc<Node>>) -> axum::Json<StateDigest> {
    let replica = node.replica.lock();
    let applied_index = replica.last_applied.map_or(0, |id| id.index);
    axum::Json(StateDigest { node_id: node.id, applied_index, digest: replica.state.digest() })
}
