//! Session deadlines, kept in memory (like etcd's lessor): keepalives are not log writes.
//!
//! Every node tracks the sessions its state machine applied; only the leader refreshes deadlines
//! on keepalive and proposes expiries. When a node becomes leader it extends every deadline to at
//! least `now + ttl` ([`Lessor::promote`]), so a lease never shrinks across a leader change.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use permit_core::SessionId;
use tokio::time::Instant;

/// Deadlines of live sessions, on this node's monotonic clock.
#[derive(Debug, Default)]
pub struct Lessor {
    deadlines: HashMap<SessionId, (Instant, u64)>,
    by_deadline: BTreeSet<(Instant, SessionId)>,
    /// Sessions whose expiry was proposed and not yet applied: keepalives for them fail.
    expiring: HashMap<SessionId, Instant>,
    /// The Raft term in which this node became leader and extended every deadline.
    promoted_term: Option<u64>,
}

impl Lessor {
    /// Tracks a session created by an applied command.
    pub fn on_created(&mut self, id: SessionId, ttl_ms: u64, now: Instant) {
        self.set_deadline(id, now + Duration::from_millis(ttl_ms), ttl_ms);
    }

    /// Forgets a session removed by an applied command.
    pub fn on_removed(&mut self, id: SessionId) {
        if let Some((deadline, _)) = self.deadlines.remove(&id) {
            self.by_deadline.remove(&(deadline, id));
        }
        self.expiring.remove(&id);
    }

    /// Forgets every session (a snapshot replaced the state).
    pub fn clear(&mut self) {
        self.deadlines.clear();
        self.by_deadline.clear();
        self.expiring.clear();
    }

    /// Refreshes a session's deadline to `now + ttl`. Returns false when the session is unknown or
    /// its expiry is already under way: the keepalive must then fail.
    pub fn keepalive(&mut self, id: SessionId, now: Instant) -> bool {
        if self.expiring.contains_key(&id) {
            return false;
        }
        let Some(&(_, ttl_ms)) = self.deadlines.get(&id) else { return false };
        self.set_deadline(id, now + Duration::from_millis(ttl_ms), ttl_ms);
        true
    }

    /// Becomes leader in `term`: every deadline becomes at least `now + ttl`.
    pub fn promote(&mut self, term: u64, now: Instant) {
        let sessions: Vec<(SessionId, u64)> =
            self.deadlines.iter().map(|(id, (_, ttl))| (*id, *ttl)).collect();
        for (id, ttl_ms) in sessions {
            let extended = now + Duration::from_millis(ttl_ms);
            if self.deadlines[&id].0 < extended {
                self.set_deadline(id, extended, ttl_ms);
            }
        }
        self.expiring.clear();
        self.promoted_term = Some(term);
    }

    /// Stops being leader: no more expiries from this node.
    pub fn demote(&mut self) {
        self.promoted_term = None;
        self.expiring.clear();
    }

    /// The term this node leads in, once it extended every deadline.
    pub fn promoted_term(&self) -> Option<u64> {
        self.promoted_term
    }

    /// The earliest deadline among sessions not already expiring.
    pub fn next_deadline(&self) -> Option<Instant> {
        if crate::bugs::is(crate::bugs::Bug::IgnoreTtl) {
            return None;
        }
        self.by_deadline.iter().find(|(_, id)| !self.expiring.contains_key(id)).map(|(deadline, _)| *deadline)
    }

    /// Sessions whose deadline passed by `now` (at most `max`), marked as expiring.
    pub fn take_expired(&mut self, now: Instant, max: usize) -> Vec<SessionId> {
        if crate::bugs::is(crate::bugs::Bug::IgnoreTtl) {
            return Vec::new();
        }
        let due: Vec<SessionId> = self
            .by_deadline
            .iter()
            .take_while(|(deadline, _)| *deadline <= now)
            .filter(|(_, id)| !self.expiring.contains_key(id))
            .take(max)
            .map(|(_, id)| *id)
            .collect();
        for id in &due {
            self.expiring.insert(*id, now);
        }
        due
    }

    /// Undoes `take_expired` for sessions whose expiry could not be proposed.
    pub fn unmark(&mut self, ids: &[SessionId]) {
        for id in ids {
            self.expiring.remove(id);
        }
    }

    /// Time left before the session's deadline, if tracked.
    pub fn remaining(&self, id: SessionId, now: Instant) -> Option<Duration> {
        self.deadlines.get(&id).map(|(deadline, _)| deadline.saturating_duration_since(now))
    }

    fn set_deadline(&mut self, id: SessionId, deadline: Instant, ttl_ms: u64) {
        let deadline = if crate::bugs::is(crate::bugs::Bug::EarlyExpiry) {
            deadline - Duration::from_millis(ttl_ms / 2)
        } else {
            deadline
        };
        if let Some((old, _)) = self.deadlines.insert(id, (deadline, ttl_ms)) {
            self.by_deadline.remove(&(old, id));
        }
        self.by_deadline.insert((deadline, id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u8) -> SessionId {
        SessionId::from_bytes([i; 16])
    }

    #[test]
    fn promotion_extends_but_never_shrinks_deadlines() {
        let t0 = Instant::now();
        let mut lessor = Lessor::default();
        lessor.on_created(id(1), 1000, t0);
        lessor.on_created(id(2), 10_000, t0);
        lessor.promote(2, t0 + Duration::from_millis(500));
        assert_eq!(lessor.remaining(id(1), t0), Some(Duration::from_millis(1500)));
        assert_eq!(lessor.remaining(id(2), t0), Some(Duration::from_millis(10_500)));
    }

    #[test]
    fn expiring_sessions_refuse_keepalives_until_unmarked() {
        let t0 = Instant::now();
        let mut lessor = Lessor::default();
        lessor.on_created(id(1), 200, t0);
        assert!(lessor.take_expired(t0 + Duration::from_millis(199), 10).is_empty());
        assert_eq!(lessor.take_expired(t0 + Duration::from_millis(200), 10), vec![id(1)]);
        assert!(!lessor.keepalive(id(1), t0));
        assert_eq!(lessor.next_deadline(), None);
        lessor.unmark(&[id(1)]);
        assert!(lessor.keepalive(id(1), t0 + Duration::from_millis(300)));
        assert_eq!(lessor.next_deadline(), Some(t0 + Duration::from_millis(500)));
    }
}
