//! Permit's state machine: the pure, deterministic core of the service.
//!
//! Everything that changes Permit's state is a [`Command`], carried in a [`Batch`] by one Raft
//! log entry and applied by [`State::apply`]. This crate has no clock, no I/O, no randomness and
//! no async: time arrives as [`Batch::now_ms`], session ids arrive inside
//! [`Command::CreateSession`]. That is what lets every replica reach the same state, lets
//! snapshots be plain bytes, and lets property tests drive the whole logic in memory.
//!
//! The words used here (session, semaphore, permit, hold, waiter, token, election) are defined
//! in `docs/ARCHITECTURE.md`; the promises they make are in `docs/semantics.md`.
#![deny(missing_docs)]

mod acl;
mod command;
mod hex;
pub mod limits;
mod name;
mod outcome;
mod policy;
mod queue;
mod semaphore;
mod session;
mod snapshot;
mod state;
mod verify;
mod wait_queue;

pub use acl::{
    root_rules, validate_token, Access, InvalidTokenId, Resource, Rule, Token, TokenId, ROOT_TOKEN_ID,
};
pub use command::{Acquire, Batch, Command, Creator, FEATURE_VERSION};
pub use name::{InvalidName, Key, Kind, Name};
pub use outcome::{Effect, Event, EventKind, Field, Limit, Outcome, Refusal, WaitEndReason};
pub use policy::{
    validate_group, validate_policy_change, validate_rate, validate_take, Delayed, Policy, PolicyChange, Rate,
};
pub use queue::{
    validate_claim, validate_nack, validate_push, validate_queue_settings, Claim, ClaimedItem, Claimer, Item,
    ItemState, NewItem, Payload, PushedItem, Queue, QueueCounts, QueueSettings, Settled, DEAD_LETTER_SUFFIX,
    QUEUE_MAX_ATTEMPTS_DEFAULT, QUEUE_MAX_ITEMS_DEFAULT,
};
pub use semaphore::{Hold, Semaphore, Waiter};
pub use session::{InvalidSessionId, KeySet, Session, SessionId};
pub use snapshot::{SnapshotError, SnapshotView, SNAPSHOT_FORMAT_VERSION};
pub use state::{
    validate_acquire, validate_capacity, validate_election_value, validate_session_name, validate_ttl_ms,
    State,
};
pub use verify::InvariantViolation;
pub use wait_queue::WaitQueue;

/// Helpers shared by the unit tests of this crate.
#[cfg(test)]
pub(crate) mod test_support {
    use crate::{Acquire, Batch, Command, Key, Outcome, SessionId, State};

    /// Applies `commands` as the next log entry (term 1, leader time = index).
    pub(crate) fn apply_next(state: &mut State, commands: Vec<Command>) -> Vec<Outcome> {
        let index = state.applied_index() + 1;
        state.apply(index, 1, &Batch { now_ms: index, commands }, &mut Vec::new())
    }

    /// A blocking acquire of one permit of `key` (capacity 1 if it creates it) by session `[id; 16]`.
    pub(crate) fn acquire_one(key: &Key, id: u8) -> Acquire {
        Acquire {
            key: key.clone(),
            session: SessionId::from_bytes([id; 16]),
            permits: 1,
            wait: true,
            capacity: Some(1),
            max_hold_ms: None,
            value: None,
        }
    }
}
