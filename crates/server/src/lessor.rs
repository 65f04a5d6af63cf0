//! Session deadlines, kept in memory (like etcd's lessor): keepalives are not log writes.
//!
//! Every node tracks the sessions its state machine applied; only the leader refreshes deadlines
//! on keepalive and proposes expiries. When a node becomes leader it extends every deadline to at
//! least `now + ttl` (`Lessor::promote`), so a lease never shrinks across a leader change.

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
    pub(crate) fn on_created(&mut self, id: SessionId, ttl_ms: u64, now: Instant) {
        self.set_deadline(id, now + Duration::from_millis(ttl_ms), ttl_ms);
    }

    /// Forgets a session removed by an applied command.
    pub(crate) fn on_removed(&mut self, id: SessionId) {
        if let Some((deadline, _)) = self.deadlines.remove(&id) {
            self.by_deadline.remove(&(deadline, id));
        }
        self.expiring.remove(&id);
    }

    /// Tracks exactly `sessions` (id, ttl), every deadline `now + ttl`: a snapshot replaced the
    /// state. Builds both indexes in bulk.
    pub(crate) fn reset(&mut self, sessions: impl ExactSizeIterator<Item = (SessionId, u64)>, now: Instant) {
        self.deadlines = HashMap::with_capacity(sessions.len());
        for (id, ttl_ms) in sessions {
            let deadline = adjusted(now + Duration::from_millis(ttl_ms), ttl_ms);
            self.deadlines.insert(id, (deadline, ttl_ms));
        }
        self.rebuild_order();
        self.expiring.clear();
    }

    fn rebuild_order(&mut self) {
        let mut order: Vec<(Instant, SessionId)> =
            self.deadlines.iter().map(|(id, (deadline, _))| (*deadline, *id)).collect();
        order.sort_unstable();
        // From sorted input the set is built bottom-up in linear time.
        self.by_deadline = order.into_iter().collect();
    }

    /// Refreshes a session's deadline to `now + ttl` and returns its TTL. Returns `None` when the
    /// session is unknown (the lessor tracks exactly the applied state's sessions) or its expiry
    /// is already under way: the keepalive must then fail.
    pub fn keepalive(&mut self, id: SessionId, now: Instant) -> Option<u64> {
        if self.expiring.contains_key(&id) {
            return None;
        }
        let &(_, ttl_ms) = self.deadlines.get(&id)?;
        self.set_deadline(id, now + Duration::from_millis(ttl_ms), ttl_ms);
        Some(ttl_ms)
    }

    /// Becomes leader in `term`: every deadline becomes at least `now + ttl`.
    ///
    /// One pass over the sessions and one bulk rebuild of the deadline order, not a re-insert per
    /// session: a new leader serves nothing until it is done.
    pub(crate) fn promote(&mut self, term: u64, now: Instant) {
        for (deadline, ttl_ms) in self.deadlines.values_mut() {
            let extended = now + Duration::from_millis(*ttl_ms);
            if *deadline < extended {
                *deadline = adjusted(extended, *ttl_ms);
            }
        }
        self.rebuild_order();
        self.expiring.clear();
        self.promoted_term = Some(term);
    }

    /// Stops being leader: no more expiries from this node.
    pub(crate) fn demote(&mut self) {
        self.promoted_term = None;
        self.expiring.clear();
    }

    /// The term this node leads in, once it extended every deadline.
    pub(crate) fn promoted_term(&self) -> Option<u64> {
        self.promoted_term
    }

    /// The earliest deadline among sessions not already expiring.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        if crate::bugs::is(crate::bugs::Bug::IgnoreTtl) {
            return None;
        }
        self.by_deadline.iter().find(|(_, id)| !self.expiring.contains_key(id)).map(|(deadline, _)| *deadline)
    }

    /// Sessions whose deadline passed by `now` (at most `max`), marked as expiring.
    pub(crate) fn take_expired(&mut self, now: Instant, max: usize) -> Vec<SessionId> {
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
    pub(crate) fn unmark(&mut self, ids: &[SessionId]) {
        for id in ids {
            self.expiring.remove(id);
        }
    }

    /// Time left before the session's deadline, if tracked.
    pub fn remaining(&self, id: SessionId, now: Instant) -> Option<Duration> {
        self.deadlines.get(&id).map(|(deadline, _)| deadline.saturating_duration_since(now))
    }

    fn set_deadline(&mut self, id: SessionId, deadline: Instant, ttl_ms: u64) {
        let deadline = adjusted(deadline, ttl_ms);
        if let Some((old, _)) = self.deadlines.insert(id, (deadline, ttl_ms)) {
            self.by_deadline.remove(&(old, id));
        }
        self.by_deadline.insert((deadline, id));
    }
}

/// `deadline`, or half a TTL earlier under the injected `EarlyExpiry` bug.
fn adjusted(deadline: Instant, ttl_ms: u64) -> Instant {
    if crate::bugs::is(crate::bugs::Bug::EarlyExpiry) {
        deadline - Duration::from_millis(ttl_ms / 2)
    } else {
        deadline
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
        assert_eq!(lessor.keepalive(id(1), t0), None);
        assert_eq!(lessor.next_deadline(), None);
        lessor.unmark(&[id(1)]);
        assert_eq!(lessor.keepalive(id(1), t0 + Duration::from_millis(300)), Some(200));
        assert_eq!(lessor.next_deadline(), Some(t0 + Duration::from_millis(500)));
    }

    #[test]
    fn reset_tracks_exactly_the_given_sessions_in_deadline_order() {
        let t0 = Instant::now();
        let mut lessor = Lessor::default();
        lessor.on_created(id(9), 50, t0);
        assert_eq!(lessor.take_expired(t0 + Duration::from_millis(50), 10), vec![id(9)]);
        lessor.reset([(id(1), 3000), (id(2), 1000), (id(3), 2000)].into_iter(), t0);
        assert_eq!(lessor.remaining(id(9), t0), None, "sessions not in the snapshot are forgotten");
        assert_eq!(lessor.next_deadline(), Some(t0 + Duration::from_millis(1000)));
        let due = lessor.take_expired(t0 + Duration::from_millis(2500), 10);
        assert_eq!(due, vec![id(2), id(3)], "earliest deadline first");
        assert_eq!(lessor.keepalive(id(1), t0 + Duration::from_millis(2500)), Some(3000));
        assert_eq!(lessor.next_deadline(), Some(t0 + Duration::from_millis(5500)));
    }

    #[test]
    fn promotion_keeps_the_deadline_order_consistent() {
        let t0 = Instant::now();
        let mut lessor = Lessor::default();
        for i in 1..=50u8 {
            lessor.on_created(id(i), 200 + 10 * u64::from(i), t0);
        }
        lessor.keepalive(id(1), t0 + Duration::from_millis(5000));
        lessor.promote(3, t0 + Duration::from_millis(100));
        // id(1)'s keepalive deadline (5200 ms) is later than its extension: it stays.
        assert_eq!(lessor.remaining(id(1), t0), Some(Duration::from_millis(5210)));
        assert_eq!(lessor.next_deadline(), Some(t0 + Duration::from_millis(320)));
        let due = lessor.take_expired(t0 + Duration::from_millis(10_000), 100);
        let mut expected: Vec<SessionId> = (2..=50u8).map(id).collect();
        expected.push(id(1));
        assert_eq!(due, expected);
    }
}
