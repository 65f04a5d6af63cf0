//! The expiry driver: on the leader, proposes `ExpireSessions` when a session's deadline passes,
//! `ExpireHolds` when a hold's `max_hold_ms` runs out, `PromoteDueItems` when a delayed queue
//! item comes due, and `PolicyTick` when a semaphore's lock-delay ends, a take's wait runs out
//! or the rate's turn of a waiter comes.
//!
//! The timer is armed at the earliest deadline (not a coarse poll), so expiry fires within a few
//! milliseconds of it, plus one commit.

use std::sync::Arc;
use std::time::Duration;

use permit_core::limits::EXPIRE_SESSIONS_PER_COMMAND_MAX;
use permit_core::{Command, Outcome};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::raft::clock::LeaderClock;
use crate::raft::proposer::Proposer;
use crate::raft::replica::Replica;

/// Pause after a failed proposal, or a due deadline with nothing to propose, so that the
/// driver does not spin.
const RETRY_DELAY: Duration = Duration::from_millis(20);

/// What the driver needs.
pub(crate) struct ExpiryDriver {
    /// The node's replica.
    pub(crate) replica: Arc<Replica>,
    /// The leader-time clock.
    pub(crate) clock: Arc<LeaderClock>,
    /// The proposer.
    pub(crate) proposer: Proposer,
    /// Poked when a deadline may have moved earlier.
    pub(crate) wake: Arc<Notify>,
    /// This node's leadership, once its barrier is applied.
    pub(crate) leading: watch::Receiver<crate::raft::leadership::Leading>,
    /// Counters.
    pub(crate) metrics: Arc<Metrics>,
}

impl ExpiryDriver {
    /// Runs until the node shuts down.
    pub(crate) async fn run(mut self) {
        // Whether the last pass found its deadline passed but could propose nothing (this node's
        // promotion lags its published leadership, or nothing was due after all). Sleeping until
        // that same past deadline again would spin: on a real clock a busy core, under the
        // simulator's paused clock a livelock (time only advances when every task waits). So
        // the next deadline is then at least a moment away, unless something changes first.
        let mut stalled = false;
        loop {
            if self.leading.borrow_and_update().is_none() {
                if self.leading.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let mut next = self.next_deadline();
            if stalled {
                next = next.map(|at| at.max(Instant::now() + RETRY_DELAY));
            }
            let sleep = async {
                match next {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = sleep => stalled = !self.expire_due().await,
                () = self.wake.notified() => stalled = false,
                changed = self.leading.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    stalled = false;
                }
            }
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let replica = self.replica.write();
        let session = replica.lessor.next_deadline();
        let hold = replica.state.next_hold_deadline_ms().map(|ms| self.clock.instant_of(ms));
        let item = replica.state.next_item_due_ms().map(|ms| self.clock.instant_of(ms));
        let policy = replica.state.next_policy_due_ms().map(|ms| self.clock.instant_of(ms));
        session.into_iter().chain(hold).chain(item).chain(policy).min()
    }

    /// Proposes the expiries that are due; false when it proposed nothing.
    async fn expire_due(&mut self) -> bool {
        // The decision belongs to this leadership: if the command is written in another term
        // (it waited in the proposer's queue across a re-election), it does nothing.
        let Some(decided_term) = self.leading.borrow().map(|barrier| barrier.term) else { return false };
        let (sessions, holds_due, items_due, policies_due) = {
            let mut replica = self.replica.write();
            if replica.lessor.promoted_term() != Some(decided_term) {
                return false;
            }
            let sessions = replica.lessor.take_expired(Instant::now(), EXPIRE_SESSIONS_PER_COMMAND_MAX);
            let now_ms = self.clock.now_ms(replica.state.now_ms());
            let holds_due = replica.state.next_hold_deadline_ms().is_some_and(|at| at <= now_ms);
            let items_due = replica.state.next_item_due_ms().is_some_and(|at| at <= now_ms);
            let policies_due = replica.state.next_policy_due_ms().is_some_and(|at| at <= now_ms);
            (sessions, holds_due, items_due, policies_due)
        };
        if !sessions.is_empty() {
            tracing::debug!(count = sessions.len(), "expiring sessions");
            match self.proposer.propose(Command::ExpireSessions { ids: sessions.clone(), decided_term }).await
            {
                Ok(Outcome::SessionsExpired { .. }) => {}
                Ok(other) => tracing::error!(?other, "unexpected outcome of ExpireSessions"),
                Err(error) => {
                    tracing::warn!(%error, "could not propose session expiry");
                    self.replica.write().lessor.unmark(&sessions);
                    tokio::time::sleep(RETRY_DELAY).await;
                }
            }
        }
        if holds_due {
            match self.proposer.propose(Command::ExpireHolds).await {
                Ok(Outcome::HoldsExpired { expired }) => self.metrics.holds_expired(expired),
                Ok(other) => tracing::error!(?other, "unexpected outcome of ExpireHolds"),
                Err(error) => {
                    tracing::warn!(%error, "could not propose hold expiry");
                    tokio::time::sleep(RETRY_DELAY).await;
                }
            }
        }
        if items_due {
            // Delayed items exist only from cluster version 4 on, so the command is never gated.
            match self.proposer.propose(Command::PromoteDueItems).await {
                Ok(Outcome::ItemsPromoted { .. }) => {}
                Ok(other) => tracing::error!(?other, "unexpected outcome of PromoteDueItems"),
                Err(error) => {
                    tracing::warn!(%error, "could not propose the promotion of due items");
                    tokio::time::sleep(RETRY_DELAY).await;
                }
            }
        }
        if policies_due {
            // Policies exist only from cluster version 5 on, so the command is never gated.
            match self.proposer.propose(Command::PolicyTick).await {
                Ok(Outcome::PoliciesTicked { .. }) => {}
                Ok(other) => tracing::error!(?other, "unexpected outcome of PolicyTick"),
                Err(error) => {
                    tracing::warn!(%error, "could not propose a policy tick");
                    tokio::time::sleep(RETRY_DELAY).await;
                }
            }
        }
        !sessions.is_empty() || holds_due || items_due || policies_due
    }
}
