//! The FIFO queue of waiters of one object.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::semaphore::Waiter;
use crate::SessionId;

/// Waiters in arrival order, with at most one entry per session.
///
/// Order is by a sequence number given at enqueue, so a waiter keeps its place however long it
/// waits and however often its client repeats the acquire. Every operation, including a waiter's
/// position, is O(log n): positions come from a Fenwick tree over the sequence numbers in use.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WaitQueue {
    by_seq: BTreeMap<u64, Waiter>,
    #[serde(skip)]
    seq_of: BTreeMap<SessionId, u64>,
    next_seq: u64,
    #[serde(skip)]
    ranks: Ranks,
}

/// Equality is of the queue itself; the derived indexes are not compared.
impl PartialEq for WaitQueue {
    fn eq(&self, other: &WaitQueue) -> bool {
        self.by_seq == other.by_seq && self.next_seq == other.next_seq
    }
}

impl Eq for WaitQueue {}

impl WaitQueue {
    /// Number of waiters.
    pub fn len(&self) -> usize {
        self.by_seq.len()
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.by_seq.is_empty()
    }

    /// The waiter at the head of the queue.
    pub fn head(&self) -> Option<&Waiter> {
        self.by_seq.values().next()
    }

    /// Waiters in queue order.
    pub fn iter(&self) -> impl Iterator<Item = &Waiter> {
        self.by_seq.values()
    }

    /// Waiters in queue order after the one with sequence number `after` (all, for `None`), with
    /// their sequence numbers.
    pub fn entries_after(&self, after: Option<u64>) -> impl Iterator<Item = (u64, &Waiter)> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.by_seq.range((from, Bound::Unbounded)).map(|(seq, waiter)| (*seq, waiter))
    }

    /// The waiter of `session`, if it waits here.
    pub fn get(&self, session: SessionId) -> Option<&Waiter> {
        self.seq_of.get(&session).and_then(|seq| self.by_seq.get(seq))
    }

    /// 1-based position of `session` in the queue.
    pub fn position(&self, session: SessionId) -> Option<u64> {
        let seq = *self.seq_of.get(&session)?;
        Some(self.ranks.rank(seq))
    }

    /// Appends a waiter at the tail. The caller ensures the session does not wait here yet.
    pub fn push(&mut self, waiter: Waiter) {
        assert!(!self.seq_of.contains_key(&waiter.session), "session already waits here");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.seq_of.insert(waiter.session, seq);
        self.by_seq.insert(seq, waiter);
        let head = *self.by_seq.keys().next().expect("just inserted");
        self.ranks.insert(seq, head, self.by_seq.keys().copied());
    }

    /// Removes and returns the head waiter.
    pub fn pop_head(&mut self) -> Option<Waiter> {
        let (seq, waiter) = self.by_seq.pop_first()?;
        self.seq_of.remove(&waiter.session);
        self.ranks.remove(seq);
        Some(waiter)
    }

    /// Removes the waiter of `session`, wherever it is in the queue.
    pub fn remove(&mut self, session: SessionId) -> Option<Waiter> {
        let seq = self.seq_of.remove(&session)?;
        self.ranks.remove(seq);
        self.by_seq.remove(&seq)
    }

    /// Removes every waiter for which `drop` is true, keeping the order of the others.
    pub fn remove_where(&mut self, mut drop: impl FnMut(&Waiter) -> bool) -> Vec<Waiter> {
        let doomed: Vec<u64> =
            self.by_seq.iter().filter(|(_, waiter)| drop(waiter)).map(|(seq, _)| *seq).collect();
        let mut removed = Vec::with_capacity(doomed.len());
        for seq in doomed {
            let waiter = self.by_seq.remove(&seq).expect("listed above");
            self.seq_of.remove(&waiter.session);
            self.ranks.remove(seq);
            removed.push(waiter);
        }
        removed
    }

    /// Checks a deserialised queue before [`WaitQueue::rebuild_index`], which (like
    /// [`WaitQueue::check`]) assumes what this checks: one waiter per session, sequence numbers
    /// below `next_seq`, and a window of sequence numbers small enough for the rank index.
    ///
    /// # Errors
    /// What is wrong, for a corrupt snapshot.
    pub(crate) fn validate(&self) -> Result<(), &'static str> {
        let mut sessions = std::collections::BTreeSet::new();
        if !self.by_seq.values().all(|waiter| sessions.insert(waiter.session)) {
            return Err("a session waits twice in the queue");
        }
        let Some((&head, _)) = self.by_seq.first_key_value() else { return Ok(()) };
        let (&tail, _) = self.by_seq.last_key_value().expect("not empty");
        if tail >= self.next_seq {
            return Err("a waiter's sequence number is not below the next one");
        }
        if self.next_seq - head > SEQ_WINDOW_MAX {
            return Err("the queue's sequence numbers span too wide a window");
        }
        Ok(())
    }

    /// Rebuilds the derived indexes after deserialisation.
    pub(crate) fn rebuild_index(&mut self) {
        self.seq_of = self.by_seq.iter().map(|(seq, w)| (w.session, *seq)).collect();
        self.ranks = Ranks::default();
        self.ranks.rebuild(self.by_seq.keys().copied(), self.next_seq);
    }

    /// Checks the queue's internal consistency.
    pub(crate) fn check(&self) {
        assert_eq!(self.seq_of.len(), self.by_seq.len(), "one index entry per waiter");
        for (rank, (seq, waiter)) in self.by_seq.iter().enumerate() {
            assert_eq!(self.seq_of.get(&waiter.session), Some(seq), "index matches queue");
            assert!(*seq < self.next_seq, "sequence numbers are issued in order");
            assert_eq!(self.ranks.rank(*seq), rank as u64 + 1, "rank index matches queue");
        }
    }
}

/// Widest window of sequence numbers (from the head's to the next one) that a snapshot may
/// hold: the rank index has two counters per number in the window, so a live queue this wide
/// would already hold 8 GiB of them. A wider one is a corrupt snapshot.
const SEQ_WINDOW_MAX: u64 = 1 << 30;

/// Ranks of sequence numbers: a Fenwick (binary indexed) tree counting the sequence numbers in
/// use within a window `[base, base + len)`. The window slides forward as the head leaves; it is
/// rebuilt (O(n)) only when it runs out of room, which doubles it, so each operation is
/// amortised O(log n).
#[derive(Clone, Debug, Default)]
struct Ranks {
    base: u64,
    tree: Vec<u32>,
}

impl Ranks {
    /// Number of sequence numbers in use that are ≤ `seq`.
    fn rank(&self, seq: u64) -> u64 {
        let mut i = (seq - self.base) as usize + 1;
        let mut sum = 0u64;
        while i > 0 {
            sum += u64::from(self.tree[i - 1]);
            i &= i - 1;
        }
        sum
    }

    fn add(&mut self, seq: u64, delta: i32) {
        let mut i = (seq - self.base) as usize + 1;
        while i <= self.tree.len() {
            self.tree[i - 1] = self.tree[i - 1].checked_add_signed(delta).expect("rank counts stay in range");
            i += i & i.wrapping_neg();
        }
    }

    /// Adds `seq` (the new tail); `head` is the smallest sequence number in use and `all` every
    /// one in use (including `seq`), for a rebuild.
    fn insert(&mut self, seq: u64, head: u64, all: impl Iterator<Item = u64>) {
        if seq < self.base || seq - self.base >= self.tree.len() as u64 {
            // Slide the window to start at the head, with room for twice the queue.
            let in_use: Vec<u64> = all.collect();
            let room = (2 * (seq - head + 1)).max(16);
            self.base = head;
            self.tree = vec![0; room as usize];
            for s in in_use {
                self.add(s, 1);
            }
        } else {
            self.add(seq, 1);
        }
    }

    fn remove(&mut self, seq: u64) {
        self.add(seq, -1);
    }

    fn rebuild(&mut self, in_use: impl Iterator<Item = u64>, next_seq: u64) {
        let in_use: Vec<u64> = in_use.collect();
        self.base = in_use.first().copied().unwrap_or(next_seq);
        let span = next_seq.saturating_sub(self.base);
        self.tree = vec![0; (2 * span).max(16) as usize];
        for seq in in_use {
            self.add(seq, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(i: u8) -> Waiter {
        Waiter {
            session: SessionId::from_bytes([i; 16]),
            permits: 1,
            max_hold_ms: None,
            value: None,
            enqueued_index: 0,
        }
    }

    #[test]
    fn positions_follow_the_queue_through_pushes_pops_and_removals() {
        let mut queue = WaitQueue::default();
        for round in 0..50u8 {
            for i in 0..5u8 {
                queue.push(waiter(round.wrapping_mul(5).wrapping_add(i)));
            }
            queue.pop_head();
            if round % 3 == 0 {
                let middle = queue.iter().nth(queue.len() / 2).map(|w| w.session);
                queue.remove(middle.unwrap());
            }
            queue.check();
        }
        let mut restored: WaitQueue = postcard::from_bytes(&postcard::to_allocvec(&queue).unwrap()).unwrap();
        restored.rebuild_index();
        restored.check();
        let sessions: Vec<SessionId> = queue.iter().map(|w| w.session).collect();
        for (i, session) in sessions.iter().enumerate() {
            assert_eq!(restored.position(*session), Some(i as u64 + 1));
        }
    }

    #[test]
    fn a_corrupt_deserialised_queue_is_refused_before_its_index_is_built() {
        let queue = |seqs: &[(u64, u8)], next_seq: u64| WaitQueue {
            by_seq: seqs.iter().map(|(seq, i)| (*seq, waiter(*i))).collect(),
            next_seq,
            ..WaitQueue::default()
        };
        assert!(queue(&[], 0).validate().is_ok());
        assert!(queue(&[(3, 1), (7, 2)], 8).validate().is_ok());
        assert!(queue(&[(3, 1), (7, 1)], 8).validate().is_err(), "a session twice");
        assert!(queue(&[(3, 1), (8, 2)], 8).validate().is_err(), "a number not below next_seq");
        assert!(queue(&[(0, 1)], u64::MAX).validate().is_err(), "too wide a window");
    }
}
