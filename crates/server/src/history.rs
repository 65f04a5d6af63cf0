//! A semaphore's recent history on this node: one sample per second of the node's own clock, for
//! the last [`HISTORY_SECONDS`], in a ring of fixed size (`GET /v1/semaphores/{name}/history`).
//!
//! The ring is fed by [`crate::observe`] as entries apply (held, capacity, waiters, grants) and
//! is sampled lazily: a second in which nothing happened is written, with the values of the
//! second before and no grants, when the next event or read arrives. So it needs no timer, and
//! an idle semaphore costs nothing but its ring.

/// Seconds a history keeps: 15 minutes.
pub(crate) const HISTORY_SECONDS: usize = 900;

/// One second: the values at its end (for the second in progress, now), the most held during
/// it, and its grants. `u32` fields, saturating: capacity, holds and waiters are capped far
/// below (`permit_core::limits`), and a second with more than 4 billion grants cannot happen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Second {
    /// Permits held.
    pub(crate) held: u32,
    /// Capacity.
    pub(crate) capacity: u32,
    /// Sessions waiting.
    pub(crate) waiters: u32,
    /// The most permits held at any moment of the second.
    pub(crate) held_max: u32,
    /// Acquires granted during the second.
    pub(crate) grants: u32,
}

/// The last [`HISTORY_SECONDS`] seconds of one semaphore. Its memory is fixed at creation:
/// `HISTORY_SECONDS` × `size_of::<Second>()` bytes (18 000) plus a few words.
pub(crate) struct History {
    ring: Box<[Second]>,
    /// The second (of the observer's clock) of the newest sample.
    newest: u64,
    /// Samples recorded, at most [`HISTORY_SECONDS`].
    len: usize,
}

fn narrow(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

impl History {
    /// A history that starts at `second` with these values.
    pub(crate) fn new(second: u64, held: u64, capacity: u64, waiters: u64) -> History {
        let mut ring = vec![Second::default(); HISTORY_SECONDS].into_boxed_slice();
        let (held, capacity, waiters) = (narrow(held), narrow(capacity), narrow(waiters));
        ring[slot(second)] = Second { held, capacity, waiters, held_max: held, grants: 0 };
        History { ring, newest: second, len: 1 }
    }

    /// The newest sample, to be changed: first brings the ring to `second`, each second in
    /// between (at most the whole ring) taking the values of the last one, with no grants. A
    /// `second` older than the newest (it cannot be, the clock is monotonic) changes the newest.
    fn at(&mut self, second: u64) -> &mut Second {
        if second > self.newest {
            let last = self.ring[slot(self.newest)];
            let idle = Second { held_max: last.held, grants: 0, ..last };
            let gap = second - self.newest;
            let from = if gap > HISTORY_SECONDS as u64 {
                second - HISTORY_SECONDS as u64 + 1
            } else {
                self.newest + 1
            };
            for s in from..=second {
                self.ring[slot(s)] = idle;
            }
            self.len = (self.len as u64 + gap).min(HISTORY_SECONDS as u64) as usize;
            self.newest = second;
        }
        &mut self.ring[slot(self.newest)]
    }

    /// Brings the ring to `second` without changing any value (a read, an idle second).
    pub(crate) fn advance(&mut self, second: u64) {
        self.at(second);
    }

    /// The values are these from `second` on (a snapshot was installed).
    pub(crate) fn set(&mut self, second: u64, held: u64, capacity: u64, waiters: u64) {
        let now = self.at(second);
        (now.held, now.capacity, now.waiters) = (narrow(held), narrow(capacity), narrow(waiters));
        now.held_max = now.held_max.max(now.held);
    }

    /// `delta` more (or fewer) permits are held from `second` on.
    pub(crate) fn held(&mut self, second: u64, delta: i64) {
        let now = self.at(second);
        now.held = narrow((i64::from(now.held) + delta).max(0) as u64);
        now.held_max = now.held_max.max(now.held);
    }

    /// An acquire was granted in `second`.
    pub(crate) fn granted(&mut self, second: u64) {
        let now = self.at(second);
        now.grants = now.grants.saturating_add(1);
    }

    /// One more (`1`) or one fewer (`-1`) session waits from `second` on.
    pub(crate) fn waiters(&mut self, second: u64, delta: i64) {
        let now = self.at(second);
        now.waiters = narrow((i64::from(now.waiters) + delta).max(0) as u64);
    }

    /// The capacity is `capacity` from `second` on.
    pub(crate) fn capacity(&mut self, second: u64, capacity: u64) {
        self.at(second).capacity = narrow(capacity);
    }

    /// The samples, oldest first, each with its second.
    pub(crate) fn samples(&self) -> impl Iterator<Item = (u64, Second)> + '_ {
        let oldest = self.newest + 1 - self.len as u64;
        (oldest..=self.newest).map(|s| (s, self.ring[slot(s)]))
    }
}

/// This node's wall clock, in ms since the Unix epoch (0 before 1970).
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)
        .map_or(0, |since| u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
}

fn slot(second: u64) -> usize {
    (second % HISTORY_SECONDS as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(history: &History) -> Vec<(u64, u32, u32, u32, u32, u32)> {
        history.samples().map(|(s, v)| (s, v.held, v.capacity, v.waiters, v.held_max, v.grants)).collect()
    }

    #[test]
    fn a_second_keeps_its_last_values_its_peak_and_its_grants() {
        let mut history = History::new(10, 0, 3, 0);
        history.held(10, 2);
        history.granted(10);
        history.held(10, 1);
        history.granted(10);
        history.held(10, -2);
        history.waiters(10, 1);
        history.capacity(10, 5);
        assert_eq!(values(&history), [(10, 1, 5, 1, 3, 2)]);
    }

    #[test]
    fn idle_seconds_repeat_the_last_values_without_grants() {
        let mut history = History::new(100, 0, 4, 0);
        history.held(100, 3);
        history.granted(100);
        history.waiters(100, 2);
        // Nothing happens for two seconds; a release in the third.
        history.held(103, -1);
        assert_eq!(
            values(&history),
            [(100, 3, 4, 2, 3, 1), (101, 3, 4, 2, 3, 0), (102, 3, 4, 2, 3, 0), (103, 2, 4, 2, 3, 0)]
        );
        // A read brings idle seconds in too.
        history.advance(105);
        assert_eq!(values(&history).last(), Some(&(105, 2, 4, 2, 2, 0)));
        assert_eq!(history.samples().count(), 6);
    }

    #[test]
    fn the_ring_holds_the_last_fifteen_minutes_and_no_more() {
        let mut history = History::new(0, 0, 1, 0);
        for second in 0..2_000u64 {
            history.held(second, if second % 2 == 0 { 1 } else { -1 });
            history.granted(second);
            let samples = values(&history);
            assert!(samples.len() <= HISTORY_SECONDS);
            assert_eq!(samples.last().map(|s| s.0), Some(second));
        }
        // Wrapped twice: the oldest sample is 15 minutes before the newest, each in order.
        let samples = values(&history);
        assert_eq!(samples.len(), HISTORY_SECONDS);
        assert_eq!(samples[0].0, 2_000 - HISTORY_SECONDS as u64);
        assert!(samples.windows(2).all(|w| w[1].0 == w[0].0 + 1));
        assert!(samples.iter().all(|s| s.5 == 1 && s.1 == u32::from(s.0 % 2 == 0)));
        assert_eq!(history.ring.len(), HISTORY_SECONDS, "the ring never grows");
    }

    #[test]
    fn a_gap_longer_than_the_ring_leaves_only_idle_seconds() {
        let mut history = History::new(5, 2, 2, 1);
        history.granted(5);
        history.advance(5 + 10 * HISTORY_SECONDS as u64);
        let samples = values(&history);
        assert_eq!(samples.len(), HISTORY_SECONDS);
        assert!(samples.iter().all(|s| (s.1, s.2, s.3, s.5) == (2, 2, 1, 0)), "{:?}", &samples[..3]);
        assert_eq!(samples[0].0, 5 + 9 * HISTORY_SECONDS as u64 + 1);
    }

    #[test]
    fn counts_never_go_below_zero() {
        let mut history = History::new(0, 0, 1, 0);
        history.held(0, -5);
        history.waiters(0, -1);
        assert_eq!(values(&history), [(0, 0, 1, 0, 0, 0)]);
    }
}
