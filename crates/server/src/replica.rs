//! This node's copy of the replicated state, shared by the Raft state machine (which writes it)
//! and the HTTP handlers and expiry driver (which read it).

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
    pub last_applied: Option<LogId>,
    /// The last applied membership.
    pub membership: StoredMembership<NodeId, BasicNode>,
}

/// The applied state behind one lock. Critical sections are short: an apply, or building one
/// response.
#[derive(Debug, Default)]
pub struct Replica {
    inner: Mutex<ReplicaState>,
}

impl Replica {
    /// A replica starting from `state`.
    pub fn new(state: ReplicaState) -> Replica {
        Replica { inner: Mutex::new(state) }
    }

    /// Locks the state.
    pub fn lock(&self) -> MutexGuard<'_, ReplicaState> {
        self.inner.lock().expect("replica lock poisoned: a panic while applying")
    }

    /// The largest leader time applied.
    pub fn now_ms(&self) -> u64 {
        self.lock().state.now_ms()
    }
}
