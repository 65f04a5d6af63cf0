//! Blocking reads (`?index=N&wait_ms=T`), Consul style: answer when the object's index exceeds N,
//! or when the wait ends.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

use permit_core::Key;

use super::app::App;
use crate::error::ApiError;

/// Query parameters of reads.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadParams {
    /// Block until the object's index is larger than this.
    pub(crate) index: Option<u64>,
    /// Longest block, in ms (capped at 60000). Default 0 with no `index`, 60000 with one.
    pub(crate) wait_ms: Option<u64>,
    /// Serve from this node's applied state without confirming leadership (may be stale).
    #[serde(default)]
    pub(crate) stale: bool,
}

/// Query parameters of reads that do not block.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct StaleParams {
    /// Serve from this node's applied state without confirming leadership (may be stale).
    #[serde(default)]
    pub(crate) stale: bool,
}

/// Reads object `key` with `read` (which returns its view and index) after an optional
/// linearizable barrier, blocking as the parameters ask. Only a change of `key` wakes the
/// request (`Notifier::watch`), not every apply.
pub(crate) async fn blocking_read<T>(
    app: &App,
    key: Key,
    params: &ReadParams,
    read: impl Fn(&App) -> Result<(T, u64), ApiError>,
) -> Result<(T, u64), ApiError> {
    if !params.stale {
        app.ensure_linearizable().await?;
    }
    let Some(seen) = params.index else { return read(app) };
    let wait_ms = params.wait_ms.unwrap_or(permit_wire::WAIT_MS_MAX).min(permit_wire::WAIT_MS_MAX);
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let subscription = app.notifier.watch(key);
    let mut shutdown = app.shutdown.clone();
    loop {
        // Enabled before the read, so that a change applied between the read and the wait is
        // not missed.
        let changed = subscription.notify().notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (view, index) = read(app)?;
        if index != seen {
            return Ok((view, index));
        }
        tokio::select! {
            biased;
            () = &mut changed => {}
            () = tokio::time::sleep_until(deadline) => return Ok((view, index)),
            _ = shutdown.wait_for(|stopping| *stopping) => return Ok((view, index)),
        }
    }
}
