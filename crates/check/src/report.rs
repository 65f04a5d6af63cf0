//! What a checker found.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::history::{Op, OpId, OpKind, Outcome};

/// The invariants of the fault suite (docs: `testing.md` §5.4), plus well-formedness of the
/// history itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Invariant {
    /// The history is usable by the checkers (unique ids, answers where outcomes need them).
    WellFormed,
    /// I1: usable permits never exceed capacity.
    Capacity,
    /// I2: the protected resource accepts no stale token and loses no update.
    Fencing,
    /// I3: tokens are unique and grow in real-time order.
    Tokens,
    /// I4: each semaphore's history is linearizable.
    Linearizability,
    /// I5: acknowledged grants and releases survive faults.
    Durability,
    /// I6: after healing, a fresh client gets the whole capacity.
    NoPermitLost,
    /// I7: replicas at one applied index have one state digest.
    Convergence,
    /// I8: no node log shows a panic.
    LogHygiene,
    /// I9: no node cut off from the majority acknowledges anything.
    MinorityAck,
    /// Q1: no acknowledged push is lost: each is acked, dead-lettered or still queued.
    PushKept,
    /// Q2: no item is acked twice, nor handed out again after its ack.
    AckedOnce,
    /// Q3: no two live claims of one item; a later claim of an item has the larger token.
    OneLiveClaim,
    /// Q4: once faults stop and consumers drain, every item is acked or dead-lettered.
    Drained,
    /// P1: takes answered within the burst plus the rate over the real time since it was set.
    Rate,
    /// P2: a revoked hold's permit is granted no earlier than the revoke plus the lock-delay.
    LockDelay,
}

impl Invariant {
    /// The short label used in messages, e.g. `I1 capacity`.
    pub fn label(self) -> &'static str {
        match self {
            Invariant::WellFormed => "well-formed history",
            Invariant::Capacity => "I1 capacity",
            Invariant::Fencing => "I2 fencing",
            Invariant::Tokens => "I3 tokens",
            Invariant::Linearizability => "I4 linearizability",
            Invariant::Durability => "I5 durability",
            Invariant::NoPermitLost => "I6 no permit lost",
            Invariant::Convergence => "I7 convergence",
            Invariant::LogHygiene => "I8 log hygiene",
            Invariant::MinorityAck => "I9 minority acks",
            Invariant::PushKept => "Q1 push kept",
            Invariant::AckedOnce => "Q2 acked once",
            Invariant::OneLiveClaim => "Q3 one live claim",
            Invariant::Drained => "Q4 drained",
            Invariant::Rate => "P1 rate",
            Invariant::LockDelay => "P2 lock-delay",
        }
    }
}

/// One broken promise, with the ops that show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// The invariant broken.
    pub invariant: Invariant,
    /// The ops involved, in the order the message names them.
    pub ops: Vec<OpId>,
    /// What happened, with times and op ids, for a human.
    pub message: String,
}

impl Violation {
    /// A violation of `invariant` involving `ops`.
    pub fn new(invariant: Invariant, ops: Vec<OpId>, message: impl Into<String>) -> Violation {
        Violation { invariant, ops, message: message.into() }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{}: {}", self.invariant.label(), self.message)
    }
}

/// A checker's result: how much it looked at and what it found.
///
/// `checked` says what the check covered (grants, ops, writes, replicas, logs; each checker's
/// docs say which), so a run can tell a pass from a check that saw nothing.
///
/// # Examples
///
/// ```
/// use permit_check::{Invariant, Report, Violation};
///
/// let mut report = Report::new(3);
/// assert!(report.is_ok());
/// report.merge(Report {
///     checked: 2,
///     violations: vec![Violation::new(Invariant::Tokens, vec![4, 9], "op 9 reused token 12 of op 4")],
/// });
/// assert_eq!(report.checked, 5);
/// assert!(!report.is_ok());
/// assert!(report.to_string().contains("I3 tokens: op 9 reused token 12"));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// How many items the checker examined.
    pub checked: usize,
    /// Everything found wrong; empty means the check passed.
    pub violations: Vec<Violation>,
}

impl Report {
    /// A report of `checked` items and no violation yet.
    pub fn new(checked: usize) -> Report {
        Report { checked, violations: Vec::new() }
    }

    /// Whether no violation was found.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Adds another report's counts and violations to this one.
    pub fn merge(&mut self, other: Report) {
        self.checked += other.checked;
        self.violations.extend(other.violations);
    }

    /// Records a violation.
    pub fn push(&mut self, violation: Violation) {
        self.violations.push(violation);
    }
}

impl fmt::Display for Report {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "checked {}, {} violation(s)", self.checked, self.violations.len())?;
        for violation in &self.violations {
            write!(formatter, "\n  {violation}")?;
        }
        Ok(())
    }
}

/// Formats a harness time for messages: seconds with microsecond precision, `+inf` for an
/// unknown completion.
pub(crate) fn seconds(ns: u64) -> String {
    if ns == u64::MAX {
        return "+inf".to_owned();
    }
    format!("{}.{:06}s", ns / 1_000_000_000, (ns % 1_000_000_000) / 1_000)
}

/// One op in a line, for messages: `op 12 (client 3: acquire 2 of `db` by `a` → ok token 5,
/// 1.000000s..1.200000s)`.
pub(crate) fn op_summary(op: &Op) -> String {
    let call = match &op.kind {
        OpKind::CreateSession { ttl_ms } => format!("create session ttl {ttl_ms} ms"),
        OpKind::Keepalive => format!("keepalive of `{}`", op.session),
        OpKind::Acquire => format!("acquire {} of `{}` by `{}`", op.permits, op.semaphore, op.session),
        OpKind::Release => format!("release of `{}` by `{}`", op.semaphore, op.session),
        OpKind::Validate { token } => format!("validate token {token} on `{}`", op.semaphore),
        OpKind::Describe => format!("describe `{}`", op.semaphore),
        OpKind::CloseSession => format!("close session `{}`", op.session),
        OpKind::FencedWrite { token } => format!("write to `{}` with token {token}", op.semaphore),
        OpKind::Push => {
            format!("push of {} to queue `{}`", op.payload.as_deref().unwrap_or("?"), op.semaphore)
        }
        OpKind::Claim { request_id } => {
            format!("claim {request_id} of queue `{}` by `{}`", op.semaphore, op.session)
        }
        OpKind::Ack { token } | OpKind::Nack { token } => format!(
            "{} of item {} of `{}` by `{}` with token {token}",
            if matches!(op.kind, OpKind::Ack { .. }) { "ack" } else { "nack" },
            op.item.as_deref().unwrap_or("?"),
            op.semaphore,
            op.session
        ),
    };
    let mut answer = match op.outcome {
        Outcome::Ok => "ok".to_owned(),
        Outcome::Fail => format!("fail {}", op.detail.as_deref().unwrap_or("")),
        Outcome::Unknown => "unknown".to_owned(),
    };
    if let Some(token) = op.token {
        answer.push_str(&format!(" token {token}"));
    }
    if let Some(released) = op.released {
        answer.push_str(&format!(" released {released}"));
    }
    if let Some(valid) = op.valid {
        answer.push_str(&format!(" valid {valid}"));
    }
    if matches!(op.kind, OpKind::Push | OpKind::Claim { .. }) && op.outcome == Outcome::Ok {
        match (&op.item, &op.payload) {
            (Some(item), Some(payload)) if matches!(op.kind, OpKind::Claim { .. }) => {
                answer.push_str(&format!(" item {item} ({payload}) attempt {}", op.attempt.unwrap_or(0)))
            }
            (Some(item), _) => answer.push_str(&format!(" item {item}")),
            (None, _) => answer.push_str(" nothing"),
        }
    }
    if matches!(op.kind, OpKind::Describe) && op.outcome == Outcome::Ok {
        let holders: Vec<String> = op
            .holders
            .iter()
            .map(|holder| format!("`{}`: {} (token {})", holder.session, holder.permits, holder.token))
            .collect();
        answer.push_str(&format!(" holders [{}]", holders.join(", ")));
    }
    format!(
        "op {} (client {}: {call} → {answer}, {}..{})",
        op.id,
        op.client,
        seconds(op.invoke_ns),
        seconds(op.complete_or_infinity_ns())
    )
}
