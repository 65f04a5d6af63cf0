//! `/v1/cluster`: membership. Status, initialise a cluster of `--join` nodes, add a node (as a
//! learner that catches up, then a voter), remove a node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use permit_wire::{
    AddMemberRequest, ClusterView, ErrorBody, ErrorCode, InitClusterRequest, MemberRole, MemberView,
};

use super::app::App;
use super::app::{MembershipError, NodeId};
use super::extract::{Json, Path};
use crate::error::ApiError;

/// Longest wait for a member's health answer in a status.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);
/// Longest wait for a new member's health answer before it is added.
const NEW_MEMBER_PROBE_TIMEOUT: Duration = Duration::from_secs(2);

fn membership_error(error: MembershipError) -> ApiError {
    let code = match &error {
        MembershipError::NotLeader => ErrorCode::NoLeader,
        MembershipError::InProgress(_) => ErrorCode::MembershipChangeInProgress,
        MembershipError::Invalid(_) => ErrorCode::InvalidArgument,
        MembershipError::AlreadyInitialized => ErrorCode::AlreadyInitialized,
        MembershipError::CatchUpTimeout => ErrorCode::Timeout,
        MembershipError::Stopped(_) => ErrorCode::ShuttingDown,
    };
    ApiError::new(code, error.to_string())
}

/// The members, their roles and how far each has got.
#[utoipa::path(get, path = "/v1/cluster", tag = "cluster",
    responses((status = 200, body = ClusterView)))]
pub(crate) async fn status(State(app): State<Arc<App>>) -> Result<axum::Json<ClusterView>, ApiError> {
    Ok(axum::Json(view(&app).await))
}

/// Builds the cluster view from this node's Raft metrics, probing each member's health.
pub(crate) async fn view(app: &App) -> ClusterView {
    let status = app.status();
    let probes = status.members.values().map(|member| async move {
        let health = app.prober.health(&member.addr, PROBE_TIMEOUT).await.map(|(_, health)| health);
        (member.id, member.addr.clone(), health)
    });
    let members = futures::future::join_all(probes)
        .await
        .into_iter()
        .map(|(id, addr, health)| MemberView {
            id,
            addr,
            role: if status.members.get(&id).is_some_and(|m| m.voter) {
                MemberRole::Voter
            } else {
                MemberRole::Learner
            },
            leader: status.leader == Some(id),
            matched_index: status.matched.get(&id).copied().flatten(),
            applied_index: health.as_ref().map(|h| h.applied_index),
            reachable: health.is_some(),
            // A member from before versioning answers without a version: it speaks 1.
            feature_version: health.as_ref().map(|h| h.feature_version.unwrap_or(1)),
            build: health.and_then(|h| h.build),
        })
        .collect();
    let feature_version = Some(app.replica().read().state.cluster_version());
    ClusterView {
        leader: status.leader,
        term: status.term,
        commit_index: status.applied_index,
        feature_version,
        members,
    }
}

/// Initialise a cluster on a pristine node started with `--join`: it becomes a member with
/// the given voters, which must be started with `--join` too.
#[utoipa::path(post, path = "/v1/cluster/init", tag = "cluster", request_body = InitClusterRequest,
    responses((status = 200, body = ClusterView), (status = 409, body = ErrorBody)))]
pub(crate) async fn init(
    State(app): State<Arc<App>>,
    Json(request): Json<InitClusterRequest>,
) -> Result<axum::Json<ClusterView>, ApiError> {
    if request.members.is_empty() || request.members.iter().any(|m| m.id == 0 || m.addr.is_empty()) {
        return Err(ApiError::new(ErrorCode::InvalidArgument, "members need ids > 0 and addresses"));
    }
    let members: BTreeMap<NodeId, String> = request.members.iter().map(|m| (m.id, m.addr.clone())).collect();
    app.init_cluster(&members).await.map_err(membership_error)?;
    Ok(axum::Json(view(&app).await))
}

/// Add a node started with `--join`: it joins as a learner, catches up (by snapshot if it is far
/// behind), then becomes a voter (unless `learner` is set).
#[utoipa::path(post, path = "/v1/cluster/members", tag = "cluster", request_body = AddMemberRequest,
    responses((status = 200, body = ClusterView), (status = 409, body = ErrorBody)))]
pub(crate) async fn add(
    State(app): State<Arc<App>>,
    Json(request): Json<AddMemberRequest>,
) -> Result<axum::Json<ClusterView>, ApiError> {
    if request.id == 0 || request.addr.is_empty() {
        return Err(ApiError::new(ErrorCode::InvalidArgument, "a member needs an id > 0 and an address"));
    }
    if app.config.cluster_secret.is_none() {
        return Err(ApiError::new(
            ErrorCode::InvalidArgument,
            format!(
                "this node has no cluster secret, so peers would refuse it: {}",
                crate::peer::SECRET_HOWTO
            ),
        ));
    }
    // Rule 2 of `raft::version`: the version check and the change under one lock that raises
    // take too, on a linearizable read of the cluster's version.
    let _changes = app.versions().changes.lock().await;
    app.ensure_linearizable().await?;
    check_new_member(&app, &request).await?;
    app.add_member(request.id, &request.addr, request.learner).await.map_err(membership_error)?;
    Ok(axum::Json(view(&app).await))
}

/// Refuses a member whose address is another member's (this node's included) or whose node
/// answers with another id. Replicating to a node's own address as to a learner makes openraft
/// panic on an assertion (the API fuzzer found it), and a wrong address would only time out.
async fn check_new_member(app: &App, request: &AddMemberRequest) -> Result<(), ApiError> {
    let invalid = |message: String| Err(ApiError::new(ErrorCode::InvalidArgument, message));
    for member in app.status().members.values() {
        let id = member.id;
        if member.addr == request.addr && id != request.id {
            return invalid(format!("{} is the address of node {id}", request.addr));
        }
        if id == request.id && member.addr != request.addr {
            return invalid(format!("node {id} is a member at {}; remove it first", member.addr));
        }
    }
    let probe = app.prober.health(&request.addr, NEW_MEMBER_PROBE_TIMEOUT);
    let health = probe.await.map(|(_, health)| health);
    let cluster = app.replica().read().state.cluster_version();
    match health {
        Some(health) if health.node_id == request.id && health.feature_version.unwrap_or(1) < cluster => {
            Err(ApiError::new(
                ErrorCode::FeatureUnavailable,
                format!(
                    "node {} speaks feature version {}, and the cluster is at version {cluster}: \
                     start it with a build that speaks version {cluster} or newer",
                    request.id,
                    health.feature_version.unwrap_or(1)
                ),
            ))
        }
        Some(health) if health.node_id == request.id => Ok(()),
        Some(health) => {
            invalid(format!("the node at {} is node {}, not {}", request.addr, health.node_id, request.id))
        }
        None => invalid(format!("no Permit node answers at {}: start it with --join first", request.addr)),
    }
}

/// Remove a node from the cluster (voter or learner). Removing the leader makes another lead.
#[utoipa::path(delete, path = "/v1/cluster/members/{id}", tag = "cluster",
    params(("id" = u64, Path, description = "Node id")),
    responses((status = 204), (status = 409, body = ErrorBody)))]
pub(crate) async fn remove(
    State(app): State<Arc<App>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let id: NodeId =
        id.parse().map_err(|_| ApiError::new(ErrorCode::InvalidArgument, "node ids are integers"))?;
    app.remove_member(id).await.map_err(membership_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// A consistent backup of the whole state (sessions, semaphores, holds, queues, elections,
/// tokens and the fencing-token counter) as of a linearizable read: the bytes of a snapshot
/// file. `permit serve --restore FILE` starts a new cluster from it. Needs `cluster` admin (it
/// holds session ids and token hashes).
#[utoipa::path(get, path = "/v1/snapshot", tag = "cluster",
    responses((status = 200, description = "The backup", content_type = "application/octet-stream", body = Vec<u8>)))]
pub(crate) async fn snapshot(State(app): State<Arc<App>>) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    app.ensure_linearizable().await?;
    let backup = app.backup();
    let bytes = tokio::task::spawn_blocking(move || backup.encode())
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)?;
    Ok(([(axum::http::header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
