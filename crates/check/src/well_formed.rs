//! Whether a history is fit for the checkers.

use std::collections::HashSet;

use crate::history::{History, Op, OpKind, Outcome};
use crate::report::{op_summary, Invariant, Report, Violation};

/// Violations quoted one by one; the rest are counted in a last one.
const VIOLATIONS_QUOTED_MAX: usize = 20;

/// Checks what every other checker assumes of a history: unique op ids; an answered op
/// (`Ok` or `Fail`) has a completion no earlier than its invoke; an acquire names a session,
/// a semaphore and at least one permit; an `Ok` create carries its session id, an `Ok`
/// acquire its token, an `Ok` validate its answer. The other checkers skip ops that break
/// these rules, so run this one first. `checked` counts ops.
///
/// # Examples
///
/// ```
/// use permit_check::{check_well_formed, Completion, History, Invocation, Op};
///
/// let mut granted = Op::invoked(0, Invocation::acquire(1, "a", "db", 1), 0);
/// granted.complete(10, Completion::ok()); // forgot the token
/// let history: History = [granted].into_iter().collect();
/// assert!(check_well_formed(&history).violations[0].message.contains("no token"));
/// ```
pub fn check_well_formed(history: &History) -> Report {
    let mut report = Report::new(history.len());
    let mut ids = HashSet::new();
    let mut problems: Vec<Violation> = Vec::new();
    for op in history.ops() {
        if !ids.insert(op.id) {
            problems.push(Violation::new(
                Invariant::WellFormed,
                vec![op.id],
                format!("op id {} is used twice", op.id),
            ));
        }
        if let Some(problem) = problem(op) {
            let message = format!("{problem}: {}", op_summary(op));
            problems.push(Violation::new(Invariant::WellFormed, vec![op.id], message));
        }
    }
    let more = problems.len().saturating_sub(VIOLATIONS_QUOTED_MAX);
    report.violations.extend(problems.into_iter().take(VIOLATIONS_QUOTED_MAX));
    if more > 0 {
        report.push(Violation::new(
            Invariant::WellFormed,
            Vec::new(),
            format!("and {more} more malformed ops"),
        ));
    }
    report
}

fn problem(op: &Op) -> Option<&'static str> {
    let answered = op.outcome != Outcome::Unknown;
    match op.complete_ns {
        None if answered => return Some("answered but no completion time"),
        Some(complete_ns) if answered && complete_ns < op.invoke_ns => {
            return Some("completed before it was invoked")
        }
        _ => {}
    }
    let ok = op.outcome == Outcome::Ok;
    match op.kind {
        OpKind::CreateSession { .. } if ok && op.session.is_empty() => Some("created session has no id"),
        OpKind::Acquire if op.session.is_empty() || op.semaphore.is_empty() => {
            Some("acquire without session or semaphore")
        }
        OpKind::Acquire if op.permits == 0 => Some("acquire of 0 permits"),
        OpKind::Acquire if ok && op.token.is_none() => Some("granted acquire has no token"),
        OpKind::Release if op.session.is_empty() || op.semaphore.is_empty() => {
            Some("release without session or semaphore")
        }
        OpKind::Keepalive | OpKind::CloseSession if op.session.is_empty() => {
            Some("session call without session")
        }
        OpKind::Validate { .. } if ok && op.valid.is_none() => Some("validate answered without `valid`"),
        OpKind::Validate { .. } | OpKind::Describe if op.semaphore.is_empty() => {
            Some("read without semaphore")
        }
        OpKind::Push if op.semaphore.is_empty() || op.payload.is_none() => {
            Some("push without queue or payload")
        }
        OpKind::Push if ok && op.item.is_none() => Some("acknowledged push has no item id"),
        OpKind::Claim { .. } if op.session.is_empty() || op.semaphore.is_empty() => {
            Some("claim without session or queue")
        }
        OpKind::Claim { .. } if ok && op.item.is_some() && (op.token.is_none() || op.payload.is_none()) => {
            Some("claimed item without token or payload")
        }
        OpKind::Ack { .. } | OpKind::Nack { .. } if op.item.is_none() || op.session.is_empty() => {
            Some("settle without item or session")
        }
        _ => None,
    }
}
