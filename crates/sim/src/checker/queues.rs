//! The queue promises (no acknowledged push lost, no item acked twice, no two live claims of one
//! item, every item acked or dead-lettered after the drain), judged by `permit_check`'s
//! [`check_queues`], the same code that judges the fault suite: the simulation's session and
//! queue calls and its final [`Event::QueueRead`] are turned into a `permit_check` history.
//!
//! An ack that claims next (`Operation::AckAndClaim`) becomes two ops with its times and its
//! answer: an ack, then a claim with its request id (both or neither apply, as the command).
//!
//! Times: a record's simulated time in ns, nudged forward by 1 ns where records share an instant
//! (simulated time moves in whole ms), so that the order of records is kept. Leases are exact
//! here (one clock, no drift): a client relies on a session until `sent + ttl` of its last
//! acknowledged create or keepalive, as [`super::facts`] has it.

use std::collections::BTreeMap;

use permit_check::{
    check_queues, ClockAllowance, Completion, FinalItem, History as CheckHistory, Invocation, Op, OpKind,
    QueueFinal,
};
use permit_core::SessionId;

use super::{Rule, Violation};
use crate::history::{Answer, Event, History, Operation, QueuedItem};

/// Every violation of the queue promises in `history`; none when it has no queue traffic.
pub fn check(history: &History) -> Vec<Violation> {
    let (converted, sessions, finals) = convert(history);
    if finals.is_empty() && !converted.ops().iter().any(|op| op.payload.is_some()) {
        return Vec::new();
    }
    let exact = ClockAllowance { rate_error: 0.0, margin_ns: 0 };
    check_queues(&converted, &finals, exact)
        .violations
        .into_iter()
        .map(|violation| {
            let mut involved: Vec<SessionId> =
                violation.ops.iter().filter_map(|id| sessions.get(id).copied()).collect();
            involved.dedup();
            Violation::new(Rule::Queue(violation.invariant), involved, violation.message)
        })
        .collect()
}

/// The session and queue calls as a `permit_check` history, the session of each op, and the
/// final reads.
fn convert(history: &History) -> (CheckHistory, BTreeMap<u64, SessionId>, Vec<QueueFinal>) {
    let mut ops: Vec<Op> = Vec::new();
    // The ops each recorded operation became (two for an ack that claims next).
    let mut by_op: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    let mut sessions = BTreeMap::new();
    let mut finals = Vec::new();
    let mut last_ns = 0u64;
    for record in &history.records {
        let ns = (record.point.at.as_nanos() as u64).max(last_ns + 1);
        last_ns = ns;
        match &record.event {
            Event::Invoked { op, operation, .. } => {
                for invocation in invocations(record.client, operation) {
                    let id = ops.len() as u64;
                    if let Some(session) = operation.session() {
                        sessions.insert(id, session);
                    }
                    by_op.entry(*op).or_default().push(ops.len());
                    ops.push(Op::invoked(id, invocation, ns));
                }
            }
            Event::Acked { op, answer } => {
                for at in by_op.get(op).into_iter().flatten() {
                    let completion = match (&ops[*at].kind, answer) {
                        // The ack half of an ack that claims next: done when the command was.
                        (OpKind::Ack { .. }, Answer::Claimed(_)) => Completion::ok(),
                        _ => completion(answer, sessions.get(&(*at as u64)).copied()),
                    };
                    ops[*at].complete(ns, completion);
                }
            }
            Event::QueueRead { queue, items, dead, drained } => finals.push(QueueFinal {
                queue: queue.to_string(),
                items: items.iter().map(final_item).collect(),
                dead: dead.iter().map(final_item).collect(),
                drained: *drained,
                invoke_ns: ns,
            }),
            Event::SessionMissing { .. } | Event::Observed { .. } => {}
        }
    }
    (ops.into_iter().collect(), sessions, finals)
}

fn invocations(client: u32, operation: &Operation) -> Vec<Invocation> {
    if let Operation::AckAndClaim { session, queue, item, token, request } = operation {
        let session = session.to_string();
        return vec![
            Invocation::ack(client, &session, queue.as_str(), &item.to_string(), *token),
            Invocation::claim(client, &session, queue.as_str(), *request),
        ];
    }
    invocation(client, operation).into_iter().collect()
}

fn invocation(client: u32, operation: &Operation) -> Option<Invocation> {
    let invocation = match operation {
        Operation::CreateSession { ttl_ms, .. } => Invocation::create_session(client, *ttl_ms),
        Operation::Keepalive { session } => Invocation::keepalive(client, &session.to_string()),
        Operation::CloseSession { session } => Invocation::close_session(client, &session.to_string()),
        Operation::Push { queue, payload } => Invocation::push(client, queue.as_str(), payload),
        Operation::Claim { session, queue, request } => {
            Invocation::claim(client, &session.to_string(), queue.as_str(), *request)
        }
        Operation::Settle { session, queue, item, token, ack: true } => {
            Invocation::ack(client, &session.to_string(), queue.as_str(), &item.to_string(), *token)
        }
        Operation::Settle { session, queue, item, token, ack: false } => {
            Invocation::nack(client, &session.to_string(), queue.as_str(), &item.to_string(), *token)
        }
        Operation::AckAndClaim { .. }
        | Operation::PutSemaphore { .. }
        | Operation::Acquire { .. }
        | Operation::Release { .. }
        | Operation::Revoke { .. }
        | Operation::Take { .. } => return None,
    };
    Some(invocation)
}

/// The answer as a completion; `session` is the op's (a create names its session in the
/// answer, as the HTTP API does).
fn completion(answer: &Answer, session: Option<SessionId>) -> Completion {
    match answer {
        Answer::Refused(why) => Completion::fail(why.clone()),
        Answer::SessionCreated => Completion { session: session.map(|s| s.to_string()), ..Completion::ok() },
        Answer::Pushed { item } => Completion { item: Some(item.to_string()), ..Completion::ok() },
        Answer::Claimed(Some(seen)) => Completion {
            item: Some(seen.id.to_string()),
            payload: Some(seen.payload.clone()),
            token: Some(seen.token),
            ..Completion::ok()
        },
        _ => Completion::ok(),
    }
}

fn final_item(item: &QueuedItem) -> FinalItem {
    FinalItem { id: item.id.to_string(), payload: item.payload.clone(), state: item.state.to_owned() }
}
