//! The history checker: a pure function from a [`History`] to the violations it shows.
//!
//! It checks what a client of Permit may rely on, from acknowledged answers only:
//! - **tokens** ([`tokens`]): a token names one grant; a grant acknowledged before another acquire
//!   was sent has the smaller token;
//! - **capacity** ([`capacity`]): at no instant do the holds that clients rely on exceed the
//!   largest capacity sent for the semaphore so far;
//! - **leases** ([`leases`]): a session is never reported missing while its lease holds, and a
//!   linearizable read of a session shows every hold its client relies on, with its token;
//! - **queues** ([`queues`]): no acknowledged push lost, no item acked twice, no two live claims
//!   of one item, every item acked or dead-lettered once the driver drained the queue
//!   (`permit_check::check_queues`);
//! - **policies** ([`policies`]): a grant that follows a revoked hold of the lock-delayed
//!   semaphore is answered no earlier than the revoke's send time plus the lock-delay. The rate,
//!   the lock-delay and leader time are judged on leader time, over the committed log
//!   ([`crate::applied`], [`check_applied`]).
//!
//! A client relies on a hold from the answer (or read) that first showed it until it sends a
//! release or a close, until `acquire sent + max_hold_ms`, and only while its session's lease
//! holds: from an acknowledged create or keepalive until `sent + ttl`.
//!
//! [`facts`] draws those intervals from the simulation's history, which is richer than the fault
//! suite's (reads of sessions, resizes, `max_hold_ms`, an exact clock); the capacity sweep and
//! the token order over them are `permit_check`'s, the same code that judges the fault suite.

pub mod capacity;
pub mod facts;
pub mod leases;
pub mod policies;
pub mod queues;
pub mod tokens;

use std::fmt;

use std::collections::BTreeMap;

use permit_core::{Key, Name, SessionId};

use crate::applied::Applied;
use crate::history::History;
use crate::policies as traffic;

pub use facts::Facts;

/// The rule a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The history itself is malformed (a bug of the recorder).
    Malformed,
    /// A token names two grants, or appears without an acquire that could have granted it.
    TokenIdentity,
    /// A grant acknowledged before an acquire was sent has the larger token.
    TokenOrder,
    /// Clients rely on more permits than the capacity.
    Capacity,
    /// A session was reported missing while its lease holds.
    Lease,
    /// A read lacks a hold its client relies on.
    Durability,
    /// A queue promise is broken (`permit_check`'s Q1-Q4).
    Queue(permit_check::Invariant),
    /// More permits granted in a window of leader time than the rate allows.
    Rate,
    /// A grant within the lock-delay after a hold ended by expiry or revoke.
    LockDelay,
    /// A node showed another leader time than the committed log's at some index.
    LeaderTime,
}

/// One broken rule, with the sessions involved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub rule: Rule,
    /// The sessions involved.
    pub sessions: Vec<SessionId>,
    /// What happened, in one sentence.
    pub text: String,
}

impl Violation {
    /// A violation of `rule` involving `sessions`.
    pub fn new(rule: Rule, sessions: Vec<SessionId>, text: String) -> Violation {
        Violation { rule, sessions, text }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.rule, self.text)
    }
}

/// Every violation `history` shows.
pub fn check(history: &History) -> Vec<Violation> {
    let facts = Facts::of(history);
    let mut violations = facts.violations.clone();
    violations.extend(tokens::check(&facts));
    violations.extend(capacity::check(&facts));
    violations.extend(leases::check(history, &facts));
    violations.extend(queues::check(history));
    violations.extend(policies::revoke_real_time(history, &delayed_key(), traffic::LOCK_DELAY_MS));
    violations
}

/// Every violation of the policy promises on leader time in the replayed committed log
/// `applied`; `seen` is the leader time each node showed at each index (the observer's).
pub fn check_applied(applied: &Applied, seen: &BTreeMap<(u64, u64), u64>) -> Vec<Violation> {
    let rated = Key::semaphore(Name::new(traffic::RATED).expect("a valid name"));
    let mut violations = policies::leader_time(applied, seen);
    violations.extend(policies::rate(&applied.events, &rated, traffic::RATE));
    violations.extend(policies::lock_delay(&applied.events, &delayed_key(), traffic::LOCK_DELAY_MS));
    violations
}

fn delayed_key() -> Key {
    Key::semaphore(Name::new(traffic::DELAYED).expect("a valid name"))
}
