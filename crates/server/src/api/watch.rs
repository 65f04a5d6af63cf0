//! Blocking reads (`?index=N&wait_ms=T`), Consul style: answer when the object's index exceeds N,
//! or when the wait ends.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use super::error::ApiError;
use crate::node::Node;

/// Query parameters of reads.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    /// Block until the object's index is larger than this.
    pub index: Option<u64>,
    /// Longest block, in ms (capped at 60000). Default 0 with no `index`, 60000 with one.
    pub wait_ms: Option<u64>,
    /// Serve from this node's applied state without confirming leadership (may be stale).
    #[serde(default)]
    pub stale: bool,
}

/// Query parameters of reads that do not block.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct StaleParams {
    /// Serve from this node's applied state without confirming leadership (may be stale).
    #[serde(default)]
    pub stale: bool,
}

/// Reads with `read` (which returns the object's view and index) after an optional
/// linearizable barrier, blocking as the parameters ask.
pub async fn blocking_read<T>(
    node: &Node,
    params: &ReadParams,
    read: impl Fn(&Node) -> Result<(T, u64), ApiError>,
) -> Result<(T, u64), ApiError> {
    if !params.stale {
        node.ensure_linearizable().await?;
    }
    let Some(seen) = params.index else { return read(node) };
    let wait_ms = params.wait_ms.unwrap_or(permit_wire::WAIT_MS_MAX).min(permit_wire::WAIT_MS_MAX);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut applied = node.notifier.applied();
    let mut shutdown = node.shutdown.clone();
    loop {
        applied.borrow_and_update();
        let (view, index) = read(node)?;
        if index != seen {
            return Ok((view, index));
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return Ok((view, index)) },
            () = tokio::time::sleep_until(deadline) => return Ok((view, index)),
            _ = shutdown.wait_for(|stopping| *stopping) => return Ok((view, index)),
        }
    }
}
