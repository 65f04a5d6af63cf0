//! One semaphore or election: its capacity, its holds and its FIFO queue of waiters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::wait_queue::WaitQueue;
use crate::SessionId;

/// A session's permits on one object, with the fencing token of the grant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Number of permits held.
    pub permits: u64,
    /// Fencing token of the grant: unique, and larger than every token granted before it.
    pub token: u64,
    /// Log index of the entry whose apply granted the hold.
    pub granted_index: u64,
    /// Leader time (see [`crate::Batch::now_ms`]) at which the hold was granted.
    pub granted_at_ms: u64,
    /// Leader time after which the hold is released even if its session lives (`max_hold_ms`).
    pub expires_at_ms: Option<u64>,
    /// The value published by an election's leader; `None` for semaphores.
    pub value: Option<String>,
}

/// A queued acquire that has not been granted yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    /// The waiting session.
    pub session: SessionId,
    /// Permits it asks for.
    pub permits: u64,
    /// `max_hold_ms` to apply once granted.
    pub max_hold_ms: Option<u64>,
    /// Value to publish once granted (elections).
    pub value: Option<String>,
    /// Log index of the entry that queued it.
    pub enqueued_index: u64,
}

/// A semaphore or an election (an election is a semaphore of capacity 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Semaphore {
    /// Most permits that may be granted at once.
    pub capacity: u64,
    /// Permits held now: the sum of `holders[*].permits`. May exceed `capacity` only after the
    /// capacity shrank below what was held; no grant happens until holdings fit again.
    pub held: u64,
    /// Holds by session.
    pub holders: BTreeMap<SessionId, Hold>,
    /// The FIFO queue of waiters.
    pub queue: WaitQueue,
    /// The largest token issued when the capacity was last set: holds with a larger token were
    /// granted under the current capacity.
    pub capacity_set_token: u64,
    /// Log index of the entry that created the object.
    pub created_index: u64,
    /// Log index of the last entry that changed the object (watch index).
    pub modified_index: u64,
}

impl Semaphore {
    /// A new object with no holds or waiters.
    pub fn new(capacity: u64, index: u64, last_token: u64) -> Semaphore {
        Semaphore {
            capacity,
            held: 0,
            holders: BTreeMap::new(),
            queue: WaitQueue::default(),
            capacity_set_token: last_token,
            created_index: index,
            modified_index: index,
        }
    }

    /// Permits that could be granted now (0 while over capacity).
    pub fn available(&self) -> u64 {
        self.capacity.saturating_sub(self.held)
    }

    /// Whether `permits` more would fit under the capacity.
    pub fn fits(&self, permits: u64) -> bool {
        self.held + permits <= self.capacity
    }

    /// Whether nothing is held and nobody waits.
    pub fn is_idle(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    /// The session holding `token`, if a current hold carries it.
    pub fn holder_of_token(&self, token: u64) -> Option<SessionId> {
        // Holders are few (at most `capacity`, usually a handful), so a scan beats an index that
        // every grant and release would have to maintain.
        self.holders.iter().find(|(_, hold)| hold.token == token).map(|(session, _)| *session)
    }
}
