//! This node's copy of the replicated state, shared by the Raft state machine (which writes it)
//! and the HTTP handlers and expiry driver (which read it).
//!
//! Only the consensus layer writes: [`Replica::read`] is public and hands out a shared view,
//! `Replica::write` is crate-private (the state machine applies entries, leadership extends
//! leases, a keepalive refreshes one; the tidy test keeps writers to those places).

use std::ops::Deref;
use std::sync::{Mutex, MutexGuard};

use openraft::{BasicNode, StoredMembership};
use permit_core::State;

use crate::lessor::Lessor;
use crate::raft::{LogId, NodeId};

/// The applied state and everything that must change atomically with it.
#[derive(Debug, Default)]
pub struct ReplicaState {
    /// The state machine.
    pub state: State,
    /// Session deadlines (fed by applied commands and keepalives).
    pub lessor: Lessor,
    /// Id of the last applied log entry.
    pub(crate) last_applied: Option<LogId>,
    /// The last applied membership.
    pub(crate) membership: StoredMembership<NodeId, BasicNode>,
    /// What a restart would re-apply on top of the latest snapshot: the commands applied since
    /// it, a push counting one per item (a clean stop snapshots when it is large: `Consensus::snapshot_before_stop`).
    pub(crate) since_snapshot: u64,
}

impl ReplicaState {
    /// Index of the last applied log entry (0 before the first).
    pub(crate) fn applied_index(&self) -> u64 {
        self.last_applied.map_or(0, |id| id.index)
    }
}

/// The applied state behind one lock. Critical sections are short: an apply, or building one
/// response.
#[derive(Debug, Default)]
pub struct Replica {
    inner: Mutex<ReplicaState>,
}

/// A read-only view of the replica, holding its lock: drop it before any `.await`.
pub struct ReadGuard<'a>(MutexGuard<'a, ReplicaState>);

impl Deref for ReadGuard<'_> {
    type Target = ReplicaState;

    fn deref(&self) -> &ReplicaState {
        &self.0
    }
}

impl Replica {
    /// A replica starting from `state`.
    pub(crate) fn new(state: ReplicaState) -> Replica {
        Replica { inner: Mutex::new(state) }
    }

    /// Locks the state for reading.
    ///
    /// ```no_run
    /// # fn show(replica: &permit_server::raft::replica::Replica) {
    /// let sessions = replica.read().state.session_count();
    /// # }
    /// ```
    pub fn read(&self) -> ReadGuard<'_> {
        ReadGuard(self.write())
    }

    /// Locks the state for writing: for the consensus layer and the lessor's bookkeeping only.
    pub(crate) fn write(&self) -> MutexGuard<'_, ReplicaState> {
        self.inner.lock().expect("replica lock poisoned: a panic while applying")
    }

    /// The largest leader time applied.
    pub(crate) fn now_ms(&self) -> u64 {
        self.read().state.now_ms()
    }
}
