//! Permit's history recorder and checkers: the judge of the fault suite and of the simulation.
//!
//! The fault harness runs real server processes, injects faults, and has its client tasks
//! record every call into one [`Recorder`]: what was asked ([`Invocation`]), when it was sent
//! and answered on one monotonic clock, and what came back ([`Completion`]: `ok`, `fail`, or
//! `unknown` for a timeout, whose effect may happen at any later time or never). The result is
//! a [`History`] of [`Op`]s, saved as JSON lines so a failed run can be checked again.
//!
//! The checkers are pure functions over a history (and, for some, what the harness observed
//! at the end), one per invariant of the test plan (`testing.md` §5.4). Each returns a
//! [`Report`] whose violations name op ids and times:
//!
//! | invariant | checker |
//! |---|---|
//! | history usable | [`check_well_formed`] |
//! | I1 capacity over time | [`check_capacity`] |
//! | I2 fencing | [`check_fencing`], [`check_fenced_counter`], [`check_write_rejected`] |
//! | I3 tokens | [`check_tokens`] |
//! | I4 linearizability | [`check_linearizability`] |
//! | I5 durability | [`check_durability`] |
//! | I6 no permit lost | [`check_no_permit_lost`] |
//! | I7 convergence | [`check_convergence`] |
//! | I8 log hygiene | [`check_logs`] |
//! | I9 no minority acks | [`check_minority_acks`] |
//! | Q1-Q4 queues: no acknowledged push lost, acked once, one live claim, drained | [`check_queues`] |
//! | P1 rate, P2 lock-delay, in real time | [`check_takes_within_rate`], [`check_lock_delay`] |
//!
//! The simulation (`permit-sim`) records a richer history of its own (reads of sessions,
//! resizes, `max_hold_ms`, one clock of simulated points) and draws from it the intervals its
//! clients rely on; it feeds them into the same two algorithms the fault suite's capacity and
//! token checkers run on: [`over_capacity`] (the sweep over relied-on holds) and
//! [`token_order`] (tokens in real-time order), generic over the history's clock.
//!
//! Checkers are built to be sound for the service: a correct server never makes them report
//! a violation, whatever the timing, so where the history leaves a doubt (an unknown outcome,
//! overlapping calls) they give the server the benefit of it. The other side of that promise
//! is that a check that could not finish or saw nothing is reported, never passed silently.
//!
//! This crate does no I/O besides [`History::save`] and [`History::load`], runs no async code
//! and depends on no other Permit crate: the wire words it records (tokens, error codes,
//! holders) are plain values.
#![deny(missing_docs)]

mod availability;
mod call;
mod capacity;
mod convergence;
mod deadline;
mod durability;
mod fencing;
mod grant;
mod history;
mod linearizability;
mod logs;
mod minority;
mod policy;
mod queue;
mod recorder;
mod report;
mod tokens;
mod well_formed;

pub use availability::{check_no_permit_lost, FreshAcquire};
pub use call::{Completion, Invocation};
pub use capacity::{check_capacity, over_capacity, Overflow, Reliance};
pub use convergence::{check_convergence, ReplicaDigest};
pub use deadline::{ClockAllowance, SessionDeadlines};
pub use durability::{check_durability, FinalRead};
pub use fencing::{check_fenced_counter, check_fencing, check_write_rejected};
pub use history::{History, HistoryError, Holder, Op, OpId, OpKind, Outcome, UNAVAILABLE};
pub use linearizability::{check_linearizability, SearchBudget};
pub use logs::{check_logs, PANIC_MARKERS};
pub use minority::{check_minority_acks, Isolation};
pub use policy::{check_lock_delay, check_takes_within_rate, Granted, RateLimit, Revoked};
pub use queue::{check_queues, FinalItem, QueueFinal};
pub use recorder::{OpHandle, Recorder};
pub use report::{Invariant, Report, Violation};
pub use tokens::{check_tokens, token_order, TokenGrant};
pub use well_formed::check_well_formed;
