//! Reacts to Raft role changes: a node that becomes leader continues leader time from the log
//! and extends every session's deadline before it may expire anything; a node that stops being
//! leader stops expiring at once.

use std::sync::Arc;

use openraft::ServerState;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::clock::LeaderClock;
use crate::raft::Raft;
use crate::replica::Replica;

/// Watches `raft`'s metrics and publishes the term this node leads in (`None` when it does not).
pub fn start(
    raft: Raft,
    replica: Arc<Replica>,
    clock: Arc<LeaderClock>,
    expiry_wake: Arc<Notify>,
) -> watch::Receiver<Option<u64>> {
    let (leading_tx, leading_rx) = watch::channel(None);
    let mut metrics = raft.metrics();
    tokio::spawn(async move {
        loop {
            let (leading, term) = {
                let m = metrics.borrow_and_update();
                (m.state == ServerState::Leader, m.current_term)
            };
            let promoted = *leading_tx.borrow();
            match (leading, promoted) {
                (true, Some(promoted_term)) if promoted_term == term => {}
                (true, _) => {
                    let mut replica = replica.lock();
                    clock.rebase(replica.state.now_ms());
                    replica.lessor.promote(term, Instant::now());
                    drop(replica);
                    tracing::info!(term, "became leader; every session deadline extended to now + ttl");
                    leading_tx.send_replace(Some(term));
                    expiry_wake.notify_one();
                }
                (false, Some(_)) => {
                    replica.lock().lessor.demote();
                    tracing::info!(term, "no longer leader; expiry stopped");
                    leading_tx.send_replace(None);
                }
                (false, None) => {}
            }
            if metrics.changed().await.is_err() {
                return; // Raft shut down.
            }
        }
    });
    leading_rx
}
