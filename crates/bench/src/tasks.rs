//! The tasks of a run's clients: joined within a bound, so that a stuck client fails the run
//! instead of hanging it.

use std::time::Duration;

use anyhow::bail;

/// Most that anything of a run waits for its peers (a client for its answers, the run for its
/// clients) before it fails.
pub const STUCK: Duration = Duration::from_secs(120);

/// Waits for `task`, one of the run's `what` clients, bounded by [`STUCK`]; aborts it when that
/// passes.
pub async fn join<T>(task: tokio::task::JoinHandle<anyhow::Result<T>>, what: &str) -> anyhow::Result<T> {
    let abort = task.abort_handle();
    match tokio::time::timeout(STUCK, task).await {
        Ok(joined) => joined?,
        Err(_) => {
            abort.abort();
            bail!("a {what} client did not finish within {STUCK:?}")
        }
    }
}
