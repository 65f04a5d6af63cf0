//! I2, fencing: the protected resource accepts no stale token and loses no update.
//!
//! The harness's resource is named by [`Op::semaphore`](crate::Op::semaphore) of each
//! [`OpKind::FencedWrite`]; `Ok` means it accepted the write (an increment of its counter),
//! `Fail` that it rejected the token as stale.

use std::collections::BTreeMap;

use crate::history::{History, Op, OpId, OpKind, Outcome};
use crate::report::{seconds, Invariant, Report, Violation};

/// Checks that every write a resource accepted carries a token at least as large as every
/// token it accepted before.
///
/// "Before" is real-time order: accepted write `a` precedes `b` when `a` completed before `b`
/// was invoked. Recording a write's invoke and completion inside the resource's critical
/// section makes this exactly the resource's own order; recorded outside it, concurrent writes
/// are simply not compared. `checked` counts accepted writes. O(n log n).
///
/// # Examples
///
/// ```
/// use permit_check::{check_fencing, Completion, History, Invocation, Op};
///
/// let mut fresh = Op::invoked(0, Invocation::fenced_write(1, "b", "counter", 7), 0);
/// fresh.complete(10, Completion::ok());
/// // A paused holder with the superseded token 6 writes later, and the resource takes it.
/// let mut stale = Op::invoked(1, Invocation::fenced_write(2, "a", "counter", 6), 20);
/// stale.complete(30, Completion::ok());
/// let history: History = [fresh, stale].into_iter().collect();
///
/// assert_eq!(check_fencing(&history).violations[0].ops, vec![0, 1]);
/// ```
pub fn check_fencing(history: &History) -> Report {
    let mut by_resource: BTreeMap<&str, Vec<(&Op, u64)>> = BTreeMap::new();
    for op in history.ops().iter().filter(|op| op.is_ok() && op.complete_ns.is_some()) {
        if let OpKind::FencedWrite { token } = op.kind {
            by_resource.entry(op.semaphore.as_str()).or_default().push((op, token));
        }
    }
    let mut report = Report::new(by_resource.values().map(Vec::len).sum());
    for (resource, writes) in by_resource {
        check_resource(resource, writes, &mut report);
    }
    report
}

fn check_resource(resource: &str, mut by_complete: Vec<(&Op, u64)>, report: &mut Report) {
    by_complete.sort_by_key(|(op, _)| (op.complete_or_infinity_ns(), op.id));
    let mut by_invoke = by_complete.clone();
    by_invoke.sort_by_key(|(op, _)| (op.invoke_ns, op.id));
    let mut completed = 0;
    let mut largest: Option<(&Op, u64)> = None;
    for (write, token) in by_invoke {
        while completed < by_complete.len()
            && by_complete[completed].0.complete_or_infinity_ns() < write.invoke_ns
        {
            let candidate = by_complete[completed];
            if largest.is_none_or(|(_, largest_token)| candidate.1 > largest_token) {
                largest = Some(candidate);
            }
            completed += 1;
        }
        let Some((earlier, earlier_token)) = largest.filter(|(_, largest_token)| token < *largest_token)
        else {
            continue;
        };
        report.push(Violation::new(
            Invariant::Fencing,
            vec![earlier.id, write.id],
            format!(
                "resource `{resource}` accepted op {} (session `{}`, token {token}) at {} after it had \
                 accepted the larger token {earlier_token} from op {} (session `{}`) at {}",
                write.id,
                write.session,
                seconds(write.complete_or_infinity_ns()),
                earlier.id,
                earlier.session,
                seconds(earlier.complete_or_infinity_ns())
            ),
        ));
    }
}

/// Checks the fenced counter for lost updates: its final value, read by the harness after the
/// run, must equal the number of increments the resource accepted.
///
/// Writes with an unknown outcome may or may not have been applied, so with `u` of them the
/// value must lie in `accepted..=accepted + u`. `checked` counts the resource's writes.
///
/// # Examples
///
/// ```
/// use permit_check::{check_fenced_counter, Completion, History, Invocation, Op};
///
/// let mut write = Op::invoked(0, Invocation::fenced_write(1, "a", "counter", 3), 0);
/// write.complete(10, Completion::ok());
/// let history: History = [write].into_iter().collect();
///
/// assert!(check_fenced_counter(&history, "counter", 1).is_ok());
/// assert!(!check_fenced_counter(&history, "counter", 0).is_ok());
/// ```
pub fn check_fenced_counter(history: &History, resource: &str, final_value: u64) -> Report {
    let writes: Vec<&Op> = history
        .ops()
        .iter()
        .filter(|op| matches!(op.kind, OpKind::FencedWrite { .. }) && op.semaphore == resource)
        .collect();
    let accepted = writes.iter().filter(|op| op.is_ok()).count() as u64;
    let unknown = writes.iter().filter(|op| op.outcome == Outcome::Unknown).count() as u64;
    let mut report = Report::new(writes.len());
    let message = if final_value < accepted {
        format!(
            "resource `{resource}` lost updates: it accepted {accepted} increments but reads {final_value}"
        )
    } else if final_value > accepted + unknown {
        format!(
            "resource `{resource}` reads {final_value}, more than its {accepted} accepted increments \
             plus {unknown} of unknown outcome"
        )
    } else {
        return report;
    };
    report.push(Violation::new(Invariant::Fencing, Vec::new(), message));
    report
}

/// Checks that one specific write was rejected, e.g. the write a client paused past its TTL
/// (`SIGSTOP`) sends when it resumes. An unknown outcome does not prove the rejection and is a
/// violation too. `checked` is 1.
///
/// # Examples
///
/// ```
/// use permit_check::{check_write_rejected, Completion, History, Invocation, Op};
///
/// let mut late = Op::invoked(0, Invocation::fenced_write(1, "a", "counter", 3), 0);
/// late.complete(10, Completion::fail("stale_token"));
/// let history: History = [late].into_iter().collect();
///
/// assert!(check_write_rejected(&history, 0).is_ok());
/// assert!(!check_write_rejected(&history, 1).is_ok()); // no such op
/// ```
pub fn check_write_rejected(history: &History, write: OpId) -> Report {
    let mut report = Report::new(1);
    let found = history.ops().iter().find(|op| op.id == write);
    let message = match found {
        None => format!("op {write} is not in the history"),
        Some(op) if !matches!(op.kind, OpKind::FencedWrite { .. }) => {
            format!("op {write} is not a fenced write")
        }
        Some(op) => match op.outcome {
            Outcome::Fail => return report,
            Outcome::Ok => format!(
                "resource `{}` accepted op {write} (session `{}`, {:?}) that had to be rejected",
                op.semaphore, op.session, op.kind
            ),
            Outcome::Unknown => format!("op {write} has an unknown outcome: its rejection is not proven"),
        },
    };
    report.push(Violation::new(Invariant::Fencing, vec![write], message));
    report
}
