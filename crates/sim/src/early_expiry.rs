//! Early expiries: a session that vanishes from a leader's state while that leader's own lessor
//! still gave it a future deadline. Closes aside (which end the client's lease anyway), that is
//! an expiry decided on stale information and applied later: the signature of a bug this
//! simulation found (an `ExpireSessions` decided before a re-election and written after it; see
//! `tests/stale_expiry.rs`). Listed in the trace to explain lease violations.

use std::collections::BTreeMap;
use std::time::Duration;

use permit_core::SessionId;
use permit_server::raft::replica::ReplicaState;
use permit_server::raft::NodeId;
use tokio::time::Instant;

/// A session that vanished early.
#[derive(Debug, Clone)]
pub struct EarlyExpiry {
    /// The session.
    pub session: SessionId,
    /// The leader whose state lost it.
    pub node: NodeId,
    /// How long before its deadline on that leader it vanished.
    pub early_by: Duration,
}

/// What the leaders' lessors promised, and the sessions that vanished before.
#[derive(Debug, Default)]
pub struct EarlyExpiries {
    /// Per node: the run and the deadline of every session at its last look as leader.
    deadlines: BTreeMap<NodeId, (u64, BTreeMap<SessionId, Instant>)>,
    /// Early expiries found so far.
    pub found: Vec<EarlyExpiry>,
}

/// The deadline of every session of a replica, on its node's clock.
pub fn deadlines(replica: &ReplicaState, now: Instant) -> BTreeMap<SessionId, Instant> {
    replica
        .state
        .sessions()
        .filter_map(|(id, _)| replica.lessor.remaining(*id, now).map(|left| (*id, now + left)))
        .collect()
}

impl EarlyExpiries {
    /// Compares a leader's sessions with its previous look; returns the early expiries found.
    /// `deadlines` is `None` when the node does not lead.
    pub fn observe(
        &mut self,
        node: NodeId,
        run: u64,
        deadlines: Option<BTreeMap<SessionId, Instant>>,
        now: Instant,
    ) -> Vec<EarlyExpiry> {
        let Some(current) = deadlines else {
            self.deadlines.remove(&node);
            return Vec::new();
        };
        let mut found = Vec::new();
        if let Some((previous_run, previous)) = self.deadlines.get(&node) {
            if *previous_run == run {
                for (session, deadline) in previous {
                    if !current.contains_key(session) && *deadline > now {
                        found.push(EarlyExpiry { session: *session, node, early_by: *deadline - now });
                    }
                }
            }
        }
        self.deadlines.insert(node, (run, current));
        self.found.extend(found.iter().cloned());
        found
    }
}
