//! Reacts to Raft role changes.
//!
//! A node that becomes leader continues leader time from the log, extends every session's
//! deadline, and commits an empty batch (the *barrier*) before it serves linearizable reads,
//! keepalives or expiries. The barrier matters because openraft 0.9 restores a node that led
//! before a restart as leader at once, without committing anything in its term; until it commits
//! an entry it cannot know what was committed before, and a ReadIndex read could miss an
//! acknowledged write. Once the barrier is applied, everything committed earlier is applied too.
//! A node that stops being leader stops expiring at once.

use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use permit_core::Batch;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::raft::clock::LeaderClock;
use crate::raft::log::LogSync;
use crate::raft::replica::Replica;
use crate::raft::Raft;

/// Longest wait for the barrier to commit before trying again.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause before retrying a barrier that did not commit.
const BARRIER_RETRY: Duration = Duration::from_millis(50);

/// Leadership as the rest of the node sees it: the term this node leads in and the log index of
/// its barrier, once the barrier is committed and applied.
pub(crate) type Leading = Option<Barrier>;

/// A committed leadership barrier.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Barrier {
    /// The Raft term this node leads in.
    pub(crate) term: u64,
    /// Log index of the barrier entry.
    pub(crate) index: u64,
}

/// Watches `raft`'s metrics and publishes this node's leadership (`None` when it does not lead).
pub(crate) fn start(
    raft: Raft,
    replica: Arc<Replica>,
    clock: Arc<LeaderClock>,
    expiry_wake: Arc<Notify>,
    sync: Arc<LogSync>,
) -> watch::Receiver<Leading> {
    let (leading_tx, leading_rx) = watch::channel(None);
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        let mut extended_term = None;
        loop {
            let (leading, term) = {
                let m = metrics.borrow_and_update();
                let leading = m.state == ServerState::Leader;
                // A leader with other voters syncs its appends beside their replication (gate 5
                // of `log::sync`); alone, it has nothing to overlap.
                sync.set_overlap(leading && m.membership_config.membership().voter_ids().nth(1).is_some());
                (leading, m.current_term)
            };
            let published = leading_tx.borrow().map(|b: Barrier| b.term);
            match (leading, published) {
                (true, Some(published)) if published == term => {}
                (true, _) => {
                    if extended_term != Some(term) {
                        let mut replica = replica.write();
                        clock.rebase(replica.state.now_ms());
                        replica.lessor.promote(term, Instant::now());
                        extended_term = Some(term);
                        tracing::info!(term, "became leader; every session deadline extended to now + ttl");
                    }
                    match commit_barrier(&raft, &replica, &clock).await {
                        Some(index) => {
                            tracing::info!(term, index, "leadership barrier committed; serving");
                            leading_tx.send_replace(Some(Barrier { term, index }));
                            expiry_wake.notify_one();
                        }
                        None => {
                            // Still leader? Try again shortly; otherwise the metrics will say.
                            tokio::time::sleep(BARRIER_RETRY).await;
                            continue;
                        }
                    }
                }
                (false, published) => {
                    if published.is_some() || extended_term.is_some() {
                        replica.write().lessor.demote();
                        tracing::info!(term, "no longer leader; expiry stopped");
                        leading_tx.send_replace(None);
                        extended_term = None;
                    }
                }
            }
            if metrics.changed().await.is_err() {
                return; // Raft shut down.
            }
        }
    });
    leading_rx
}

/// Commits an empty batch; returns its log index once applied.
async fn commit_barrier(raft: &Raft, replica: &Replica, clock: &LeaderClock) -> Option<u64> {
    let batch = Batch { now_ms: clock.now_ms(replica.now_ms()), commands: Vec::new() };
    match tokio::time::timeout(BARRIER_TIMEOUT, raft.client_write(batch)).await {
        Ok(Ok(response)) => Some(response.log_id.index),
        _ => None,
    }
}
