//! Fail-stop: a node whose storage failed, or whose Raft core stopped on its own, refuses all
//! work at once and then exits the process non-zero, so that a supervisor restarts it.
//!
//! A failed fsync is never retried: after a failed `fdatasync` the kernel may have dropped the
//! dirty pages, so a second fsync that succeeds proves nothing (PostgreSQL's "fsyncgate"). The
//! only safe recovery is a restart that reads back what is really on disk; everything
//! acknowledged was fsynced before it was acknowledged, so a restart loses nothing.
//!
//! The durability path (log append, vote save, purge, truncate, snapshot write) reports its
//! first error with `FailStop::storage`; a watcher of the Raft metrics reports a core that
//! stopped without a shutdown with `FailStop::stopped` (`raft::consensus`). The HTTP layer refuses every request
//! but the health probes once `FailStop::failure` is set, and `serve` exits after
//! `FAILSTOP_LINGER`, long enough for probes to see the 503.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use permit_wire::{NotReady, StorageErrorKind};
use tokio::sync::watch;

/// How long a failed node keeps answering 503 (so probes and clients see why) before it exits.
pub(crate) const FAILSTOP_LINGER: Duration = Duration::from_secs(2);

/// Why a node stopped serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The health reason: [`NotReady::StorageError`] or [`NotReady::Shutdown`].
    pub reason: NotReady,
    /// One line naming the path and the error.
    pub message: String,
    /// With [`NotReady::StorageError`], what kind of storage failure (`/v1/health` shows it).
    pub kind: Option<StorageErrorKind>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// A storage error as the latch records it: its message, and its kind for `/v1/health`. The
/// storage layer's typed error implements it (`raft::log::LogError`), so that this latch stays
/// below the storage that reports to it.
pub(crate) trait Cause: fmt::Display {
    /// What kind of storage failure it is.
    fn kind(&self) -> StorageErrorKind;
}

/// The node's fail-stop latch: set once, by the first failure, never cleared.
#[derive(Debug)]
pub struct FailStop {
    failure: watch::Sender<Option<Failure>>,
}

impl Default for FailStop {
    fn default() -> FailStop {
        FailStop { failure: watch::channel(None).0 }
    }
}

impl FailStop {
    /// A latch that has not failed.
    pub(crate) fn new() -> Arc<FailStop> {
        Arc::new(FailStop::default())
    }

    /// Records a storage error of `operation` on `path`; the first failure wins and is logged.
    pub(crate) fn storage(&self, operation: &str, path: &Path, error: &dyn Cause) {
        let message = format!("{operation} of {} failed: {error}", path.display());
        self.set(Failure { reason: NotReady::StorageError, message, kind: Some(error.kind()) });
    }

    /// Records that the cluster's feature version is above this build's (`raft::version`).
    pub(crate) fn upgrade_needed(&self, message: String) {
        self.set(Failure { reason: NotReady::UpgradeNeeded, message, kind: None });
    }

    /// Records that the Raft core stopped although no shutdown was asked for.
    pub(crate) fn stopped(&self, why: &str) {
        self.set(Failure { reason: NotReady::Shutdown, message: format!("raft stopped: {why}"), kind: None });
    }

    fn set(&self, failure: Failure) {
        let first = self.failure.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(failure.clone());
            true
        });
        if first {
            tracing::error!(
                reason = ?failure.reason,
                "fail-stop: {}; refusing all requests and exiting (restart once the cause is fixed)",
                failure.message
            );
        }
    }

    /// The failure, once there is one.
    pub(crate) fn failure(&self) -> Option<Failure> {
        self.failure.borrow().clone()
    }

    /// True once a failure was recorded.
    pub(crate) fn is_failed(&self) -> bool {
        self.failure.borrow().is_some()
    }

    /// Resolves with the first failure.
    pub(crate) async fn wait(&self) -> Failure {
        let mut receiver = self.failure.subscribe();
        loop {
            if let Some(failure) = receiver.borrow_and_update().clone() {
                return failure;
            }
            if receiver.changed().await.is_err() {
                // The sender lives in `self`, so this cannot happen; never resolve.
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Full;

    impl fmt::Display for Full {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("No space left on device (os error 28)")
        }
    }

    impl Cause for Full {
        fn kind(&self) -> StorageErrorKind {
            StorageErrorKind::DiskFull
        }
    }

    #[tokio::test]
    async fn the_first_failure_wins_and_wakes_the_waiters() {
        let latch = FailStop::new();
        assert!(!latch.is_failed());
        let waiter = tokio::spawn({
            let latch = latch.clone();
            async move { latch.wait().await }
        });
        latch.storage("log append", Path::new("/data/raft-log"), &Full);
        latch.stopped("the core stopped after it");
        let failure = waiter.await.unwrap();
        assert_eq!(failure.reason, NotReady::StorageError);
        assert_eq!(failure.kind, Some(StorageErrorKind::DiskFull));
        assert_eq!(
            failure.message,
            "log append of /data/raft-log failed: No space left on device (os error 28)"
        );
        assert_eq!(latch.failure(), Some(failure));
    }
}
