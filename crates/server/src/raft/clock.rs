//! Leader time: the clock whose readings the leader puts in every batch (`Batch::now_ms`).
//!
//! Leader time is monotonic across the whole log: a node that becomes leader continues from the
//! largest time its state machine has applied and advances it with its own monotonic clock. Wall
//! clock jumps do not move it, and it stands still while there is no leader, so `max_hold_ms`
//! deadlines can only move later, never earlier.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The leader-time clock of one node.
#[derive(Debug)]
pub(crate) struct LeaderClock {
    base: Mutex<(u64, Instant)>,
}

impl LeaderClock {
    /// A clock reading `applied_ms` now.
    pub(crate) fn new(applied_ms: u64) -> LeaderClock {
        LeaderClock { base: Mutex::new((applied_ms, Instant::now())) }
    }

    /// Continues from `applied_ms` (the state machine's largest time), as a new leader does.
    pub(crate) fn rebase(&self, applied_ms: u64) {
        *self.base.lock().expect("clock lock") = (applied_ms, Instant::now());
    }

    /// Leader time now; never less than `applied_ms`.
    pub(crate) fn now_ms(&self, applied_ms: u64) -> u64 {
        let (base_ms, base_at) = *self.base.lock().expect("clock lock");
        let elapsed = u64::try_from(base_at.elapsed().as_millis()).unwrap_or(u64::MAX);
        base_ms.saturating_add(elapsed).max(applied_ms)
    }

    /// The local instant at which leader time reaches `at_ms`.
    pub(crate) fn instant_of(&self, at_ms: u64) -> Instant {
        let (base_ms, base_at) = *self.base.lock().expect("clock lock");
        base_at + Duration::from_millis(at_ms.saturating_sub(base_ms))
    }
}
