//! The FIFO queue of waiters of one object.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::semaphore::Waiter;
use crate::SessionId;

/// Waiters in arrival order, with at most one entry per session.
///
/// Order is by a sequence number given at enqueue, so a waiter keeps its place however long it
/// waits and however often its client repeats the acquire.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaitQueue {
    by_seq: BTreeMap<u64, Waiter>,
    #[serde(skip)]
    seq_of: BTreeMap<SessionId, u64>,
    next_seq: u64,
}

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

    /// The waiter of `session`, if it waits here.
    pub fn get(&self, session: SessionId) -> Option<&Waiter> {
        self.seq_of.get(&session).and_then(|seq| self.by_seq.get(seq))
    }

    /// 1-based position of `session` in the queue.
    pub fn position(&self, session: SessionId) -> Option<u64> {
        let seq = *self.seq_of.get(&session)?;
        Some(self.by_seq.range(..seq).count() as u64 + 1)
    }

    /// Appends a waiter at the tail. The caller ensures the session does not wait here yet.
    pub fn push(&mut self, waiter: Waiter) {
        assert!(!self.seq_of.contains_key(&waiter.session), "session already waits here");
        let seq = self.next_seq;
        self.next_seq += 1;
        self.seq_of.insert(waiter.session, seq);
        self.by_seq.insert(seq, waiter);
    }

    /// Removes and returns the head waiter.
    pub fn pop_head(&mut self) -> Option<Waiter> {
        let (_, waiter) = self.by_seq.pop_first()?;
        self.seq_of.remove(&waiter.session);
        Some(waiter)
    }

    /// Removes the waiter of `session`, wherever it is in the queue.
    pub fn remove(&mut self, session: SessionId) -> Option<Waiter> {
        let seq = self.seq_of.remove(&session)?;
        self.by_seq.remove(&seq)
    }

    /// Removes every waiter for which `drop` is true, keeping the order of the others.
    pub fn remove_where(&mut self, mut drop: impl FnMut(&Waiter) -> bool) -> Vec<Waiter> {
        let doomed: Vec<u64> =
            self.by_seq.iter().filter(|(_, waiter)| drop(waiter)).map(|(seq, _)| *seq).collect();
        doomed
            .into_iter()
            .filter_map(|seq| self.by_seq.remove(&seq))
            .inspect(|waiter| {
                self.seq_of.remove(&waiter.session);
            })
            .collect()
    }

    /// Rebuilds the derived session index after deserialisation.
    pub(crate) fn rebuild_index(&mut self) {
        self.seq_of = self.by_seq.iter().map(|(seq, w)| (w.session, *seq)).collect();
    }

    /// Checks the queue's internal consistency.
    pub(crate) fn check(&self) {
        assert_eq!(self.seq_of.len(), self.by_seq.len(), "one index entry per waiter");
        for (seq, waiter) in &self.by_seq {
            assert_eq!(self.seq_of.get(&waiter.session), Some(seq), "index matches queue");
            assert!(*seq < self.next_seq, "sequence numbers are issued in order");
        }
    }
}
