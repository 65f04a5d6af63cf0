//! I9, no acknowledgement from a node cut off from the majority.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::history::{History, OpKind};
use crate::report::{op_summary, seconds, Invariant, Report, Violation};

/// An interval of the fault timeline during which `node` could not reach a majority of the
/// voters, on the recorder's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// The node cut off.
    pub node: u64,
    /// When the cut started (the fault was in place).
    pub from_ns: u64,
    /// When it ended (the heal began).
    pub until_ns: u64,
}

/// Checks that no node answered `Ok` to a call sent and answered entirely while that node was
/// cut off from the majority.
///
/// Every `Ok` call to the service counts (a create, keepalive, acquire, release, close,
/// validate or describe all need a quorum); fenced writes go to the harness and do not. The
/// answering node is [`Op::node`](crate::Op::node). `checked` counts the `Ok` calls that name
/// their node; when isolations were given but no such call exists, nothing was checked and
/// that is a violation.
///
/// # Examples
///
/// ```
/// use permit_check::{check_minority_acks, Completion, History, Invocation, Isolation, Op};
///
/// let mut acquire = Op::invoked(0, Invocation::acquire(1, "a", "db", 1), 2_000);
/// acquire.complete(3_000, Completion { token: Some(9), node: Some(1), ..Completion::ok() });
/// let history: History = [acquire].into_iter().collect();
///
/// let cut = Isolation { node: 1, from_ns: 1_000, until_ns: 9_000 };
/// assert_eq!(check_minority_acks(&history, &[cut]).violations[0].ops, vec![0]);
/// let other = Isolation { node: 2, ..cut };
/// assert!(check_minority_acks(&history, &[other]).is_ok());
/// ```
pub fn check_minority_acks(history: &History, isolations: &[Isolation]) -> Report {
    let merged = merge(isolations);
    let mut report = Report::new(0);
    for op in history.ops().iter().filter(|op| op.is_ok() && !matches!(op.kind, OpKind::FencedWrite { .. })) {
        let (Some(node), Some(complete_ns)) = (op.node, op.complete_ns) else { continue };
        report.checked += 1;
        let Some(intervals) = merged.get(&node) else { continue };
        let containing = intervals.partition_point(|&(from_ns, _)| from_ns <= op.invoke_ns);
        let Some(&(from_ns, until_ns)) = containing.checked_sub(1).map(|at| &intervals[at]) else { continue };
        if complete_ns <= until_ns {
            report.push(Violation::new(
                Invariant::MinorityAck,
                vec![op.id],
                format!(
                    "node {node} acknowledged {} while cut off from the majority ({}..{})",
                    op_summary(op),
                    seconds(from_ns),
                    seconds(until_ns)
                ),
            ));
        }
    }
    if !isolations.is_empty() && report.checked == 0 {
        let message = "no acknowledged call names the node that answered it: nothing checked";
        report.push(Violation::new(Invariant::MinorityAck, Vec::new(), message));
    }
    report
}

/// Each node's intervals, sorted and with overlaps merged.
fn merge(isolations: &[Isolation]) -> BTreeMap<u64, Vec<(u64, u64)>> {
    let mut by_node: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for isolation in isolations {
        by_node.entry(isolation.node).or_default().push((isolation.from_ns, isolation.until_ns));
    }
    for intervals in by_node.values_mut() {
        intervals.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(intervals.len());
        for &(from_ns, until_ns) in intervals.iter() {
            match merged.last_mut() {
                Some(last) if from_ns <= last.1 => last.1 = last.1.max(until_ns),
                _ => merged.push((from_ns, until_ns)),
            }
        }
        *intervals = merged;
    }
    by_node
}
