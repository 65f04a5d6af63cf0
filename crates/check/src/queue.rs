//! Q1-Q4, the promises of work queues, over the recorded pushes, claims, acks and nacks and
//! what a final read found in each queue and its dead-letter queue.
//!
//! A claim is a lease of its session: its client relies on the item from the claim's answer
//! until it sends an ack or a nack of it, closes the session, or the session's conservative
//! deadline passes ([`SessionDeadlines`]). A retried claim (same `request_id`) that answers the
//! same item and token is the same claim.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::deadline::{ClockAllowance, SessionDeadlines};
use crate::history::{History, Op, OpId, OpKind, Outcome};
use crate::report::{op_summary, seconds, Invariant, Report, Violation};

/// One item a final read listed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalItem {
    /// The item's id.
    pub id: String,
    /// Its payload, as JSON text in the form the history records.
    pub payload: String,
    /// Its state (`pending`, `delayed`, `claimed`), for messages.
    pub state: String,
}

/// What a linearizable read found in one queue after the run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueFinal {
    /// The queue.
    pub queue: String,
    /// The items still in it, in any state.
    pub items: Vec<FinalItem>,
    /// The items in its dead-letter queue.
    pub dead: Vec<FinalItem>,
    /// Whether consumers drained it after the faults stopped (then it must be empty: Q4).
    pub drained: bool,
    /// When the read was sent (harness ns); pushes after it are not expected in it.
    pub invoke_ns: u64,
}

/// Longest list of items a message quotes.
const QUOTED_MAX: usize = 5;

/// One claim: every `Ok` claim op that answered this item with this token.
struct Claim<'h> {
    item: &'h str,
    token: u64,
    session: &'h str,
    /// The first answer: the client relies on the item from here.
    start_ns: u64,
    /// The first send of a claim op that answered it.
    invoke_ns: u64,
    /// When its client stopped relying on it.
    end_ns: u64,
    op: &'h Op,
}

/// Checks the queue promises for every queue with a final read:
/// - **Q1 push kept**: every `Ok` push's item is, at the end, acked (an ack of it answered `Ok`
///   or unknown), in the dead-letter queue, or still in the queue; and what claims hand out was
///   pushed, with the payload it was pushed with;
/// - **Q2 acked once**: no item has two `Ok` acks, no claim sent after an `Ok` ack of its item
///   took it, and no acked item is still queued or dead;
/// - **Q3 one live claim**: no two claims of one item are relied on at once; a claim of an
///   item answered before another claim of it was sent has the smaller token; a token names
///   one item;
/// - **Q4 drained**: a queue its consumers drained holds nothing.
///
/// A history with queue ops and no final read of their queue, or a queue with no `Ok` push or
/// no `Ok` ack, is reported: the check would have seen nothing. `checked` counts the `Ok`
/// pushes and claims.
///
/// # Examples
///
/// ```
/// use permit_check::{check_queues, ClockAllowance, Completion, History, Invocation, Op, QueueFinal};
///
/// let ms = 1_000_000;
/// let item = |id: &str, payload: &str| Completion {
///     item: Some(id.into()),
///     payload: Some(payload.into()),
///     ..Completion::ok()
/// };
/// let mut ops = Vec::new();
/// let mut session = Op::invoked(0, Invocation::create_session(1, 10_000), 0);
/// session.complete(ms, Completion { session: Some("s".into()), ..Completion::ok() });
/// ops.push(session);
/// let mut push = Op::invoked(1, Invocation::push(2, "jobs", "\"a\""), ms);
/// push.complete(2 * ms, Completion { item: Some("7".into()), ..Completion::ok() });
/// ops.push(push);
/// let mut claim = Op::invoked(2, Invocation::claim(1, "s", "jobs", 99), 3 * ms);
/// claim.complete(4 * ms, Completion { token: Some(5), attempt: Some(1), ..item("7", "\"a\"") });
/// ops.push(claim);
/// let mut ack = Op::invoked(3, Invocation::ack(1, "s", "jobs", "7", 5), 5 * ms);
/// ack.complete(6 * ms, Completion::ok());
/// ops.push(ack);
/// let history: History = ops.into_iter().collect();
///
/// let drained = QueueFinal { queue: "jobs".into(), drained: true, ..QueueFinal::default() };
/// assert!(check_queues(&history, &[drained.clone()], ClockAllowance::default()).is_ok());
///
/// // The same history where the ack never happened: the item vanished.
/// let mut lost: Vec<Op> = history.ops().to_vec();
/// lost.pop();
/// let lost: History = lost.into_iter().collect();
/// let report = check_queues(&lost, &[drained], ClockAllowance::default());
/// assert!(report.violations.iter().any(|v| v.message.contains("item 7")));
/// ```
pub fn check_queues(history: &History, finals: &[QueueFinal], allowance: ClockAllowance) -> Report {
    let mut report = Report::new(0);
    let queues: BTreeSet<&str> =
        history.ops().iter().filter(|op| is_queue_op(op)).map(|op| op.semaphore.as_str()).collect();
    for queue in &queues {
        if !finals.iter().any(|f| f.queue == *queue) {
            report.push(Violation::new(
                Invariant::PushKept,
                Vec::new(),
                format!("queue `{queue}` was used but never read at the end"),
            ));
        }
    }
    let deadlines = SessionDeadlines::new(history, allowance);
    let mut closes: HashMap<&str, Vec<u64>> = HashMap::new();
    for op in history.ops().iter().filter(|op| op.kind == OpKind::CloseSession) {
        closes.entry(op.session.as_str()).or_default().push(op.invoke_ns);
    }
    for times in closes.values_mut() {
        times.sort_unstable();
    }
    for last in finals {
        let ops: Vec<&Op> =
            history.ops().iter().filter(|op| is_queue_op(op) && op.semaphore == last.queue).collect();
        check_queue(&ops, last, &deadlines, &closes, &mut report);
    }
    report
}

fn is_queue_op(op: &Op) -> bool {
    matches!(op.kind, OpKind::Push | OpKind::Claim { .. } | OpKind::Ack { .. } | OpKind::Nack { .. })
}

fn check_queue(
    ops: &[&Op],
    last: &QueueFinal,
    deadlines: &SessionDeadlines,
    closes: &HashMap<&str, Vec<u64>>,
    report: &mut Report,
) {
    let queue = last.queue.as_str();
    // Q1's inputs: what was pushed.
    let mut pushed: BTreeMap<&str, &Op> = BTreeMap::new();
    let mut payloads: BTreeSet<&str> = BTreeSet::new();
    for op in ops.iter().filter(|op| op.kind == OpKind::Push) {
        if let Some(payload) = &op.payload {
            payloads.insert(payload);
        }
        if let (Outcome::Ok, Some(item)) = (op.outcome, &op.item) {
            pushed.insert(item, op);
        }
    }
    report.checked += pushed.len();
    if pushed.is_empty() {
        report.push(Violation::new(
            Invariant::PushKept,
            Vec::new(),
            format!("no push to `{queue}` was acknowledged: the check saw nothing"),
        ));
    }

    // Acks, nacks: when each claim's client let go of it, and which acks took effect.
    let mut settles: HashMap<(&str, &str, u64), u64> = HashMap::new();
    let mut acks: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    let mut acked_or_maybe: BTreeSet<&str> = BTreeSet::new();
    for op in ops {
        let (OpKind::Ack { token } | OpKind::Nack { token }) = op.kind else { continue };
        let Some(item) = op.item.as_deref() else { continue };
        let at = settles.entry((op.session.as_str(), item, token)).or_insert(op.invoke_ns);
        *at = (*at).min(op.invoke_ns);
        if matches!(op.kind, OpKind::Ack { .. }) {
            match op.outcome {
                Outcome::Ok => {
                    acks.entry(item).or_default().push(op);
                    acked_or_maybe.insert(item);
                }
                Outcome::Unknown => {
                    acked_or_maybe.insert(item);
                }
                Outcome::Fail => {}
            }
        }
    }
    if acks.is_empty() {
        report.push(Violation::new(
            Invariant::AckedOnce,
            Vec::new(),
            format!("no ack on `{queue}` was acknowledged: the check saw nothing"),
        ));
    }

    // Claims, one per (item, token).
    let mut claims: BTreeMap<(&str, u64), Claim> = BTreeMap::new();
    let mut token_items: HashMap<u64, &Op> = HashMap::new();
    for op in ops.iter().filter(|op| matches!(op.kind, OpKind::Claim { .. }) && op.is_ok()) {
        let (Some(item), Some(token), Some(complete_ns)) = (op.item.as_deref(), op.token, op.complete_ns)
        else {
            continue;
        };
        report.checked += 1;
        match token_items.get(&token) {
            Some(other) if other.item.as_deref() != Some(item) => report.push(Violation::new(
                Invariant::OneLiveClaim,
                vec![other.id, op.id],
                format!(
                    "token {token} names claims of two items: {} and {}",
                    op_summary(other),
                    op_summary(op)
                ),
            )),
            Some(_) => {}
            None => {
                token_items.insert(token, op);
            }
        }
        let claim = claims.entry((item, token)).or_insert(Claim {
            item,
            token,
            session: &op.session,
            start_ns: complete_ns,
            invoke_ns: op.invoke_ns,
            end_ns: 0,
            op,
        });
        claim.start_ns = claim.start_ns.min(complete_ns);
        claim.invoke_ns = claim.invoke_ns.min(op.invoke_ns);
        // Q1: handed out as pushed.
        let payload = op.payload.as_deref().unwrap_or_default();
        match pushed.get(item) {
            Some(push) if push.payload.as_deref() != Some(payload) => report.push(Violation::new(
                Invariant::PushKept,
                vec![push.id, op.id],
                format!(
                    "item {item} was pushed as {} and handed out as {payload}: {}",
                    op_summary(push),
                    op_summary(op)
                ),
            )),
            None if !payloads.contains(payload) => report.push(Violation::new(
                Invariant::PushKept,
                vec![op.id],
                format!("a claim handed out {payload}, which nobody pushed: {}", op_summary(op)),
            )),
            _ => {}
        }
    }
    for claim in claims.values_mut() {
        let settled = settles.get(&(claim.session, claim.item, claim.token)).copied().unwrap_or(u64::MAX);
        let closed = closes
            .get(claim.session)
            .and_then(|times| times.iter().find(|t| **t >= claim.start_ns).copied())
            .unwrap_or(u64::MAX);
        let lapse = deadlines.lapse_after(claim.session, claim.start_ns).unwrap_or(claim.start_ns);
        claim.end_ns = settled.min(closed).min(lapse);
    }

    // Q3 over the claims of each item.
    let mut by_item: BTreeMap<&str, Vec<&Claim>> = BTreeMap::new();
    for claim in claims.values() {
        by_item.entry(claim.item).or_default().push(claim);
    }
    for list in by_item.values_mut() {
        list.sort_by_key(|claim| (claim.start_ns, claim.token));
        for (at, a) in list.iter().enumerate() {
            for b in &list[at + 1..] {
                let overlap = a.start_ns < a.end_ns
                    && b.start_ns < b.end_ns
                    && b.start_ns < a.end_ns
                    && a.start_ns < b.end_ns;
                if overlap {
                    report.push(Violation::new(
                        Invariant::OneLiveClaim,
                        vec![a.op.id, b.op.id],
                        format!(
                            "item {} was claimed twice at once: relied on {}..{} by {} and {}..{} by {}",
                            a.item,
                            seconds(a.start_ns),
                            seconds(a.end_ns),
                            op_summary(a.op),
                            seconds(b.start_ns),
                            seconds(b.end_ns),
                            op_summary(b.op)
                        ),
                    ));
                }
                for (earlier, later) in [(a, b), (b, a)] {
                    if earlier.start_ns < later.invoke_ns && later.token <= earlier.token {
                        report.push(Violation::new(
                            Invariant::OneLiveClaim,
                            vec![earlier.op.id, later.op.id],
                            format!(
                                "item {}'s later claim has token {} after token {}: {} then {}",
                                a.item,
                                later.token,
                                earlier.token,
                                op_summary(earlier.op),
                                op_summary(later.op)
                            ),
                        ));
                    }
                }
            }
        }
    }

    // Q2: one ack, and nothing after it.
    for (item, list) in &acks {
        if list.len() > 1 {
            let ids = list.iter().map(|op| op.id).collect();
            let quoted: Vec<String> = list.iter().take(QUOTED_MAX).map(|op| op_summary(op)).collect();
            report.push(Violation::new(
                Invariant::AckedOnce,
                ids,
                format!("item {item} was acked {} times: {}", list.len(), quoted.join("; ")),
            ));
        }
        let first_ack_ns = list.iter().filter_map(|op| op.complete_ns).min().unwrap_or(u64::MAX);
        for claim in by_item.get(item).into_iter().flatten() {
            if claim.invoke_ns > first_ack_ns {
                report.push(Violation::new(
                    Invariant::AckedOnce,
                    vec![list[0].id, claim.op.id],
                    format!(
                        "item {item} was handed out again after its ack: {} then {}",
                        op_summary(list[0]),
                        op_summary(claim.op)
                    ),
                ));
            }
        }
    }
    let dead_payloads: BTreeSet<&str> = last.dead.iter().map(|item| item.payload.as_str()).collect();
    for found in last.items.iter().chain(&last.dead) {
        if let Some(list) = acks.get(found.id.as_str()) {
            report.push(Violation::new(
                Invariant::AckedOnce,
                vec![list[0].id],
                format!(
                    "item {} ({}) is still {} after its ack: {}",
                    found.id,
                    found.payload,
                    found.state,
                    op_summary(list[0])
                ),
            ));
        }
    }

    // Q1: every acknowledged push is accounted for.
    let queued: BTreeSet<&str> = last.items.iter().map(|item| item.id.as_str()).collect();
    let mut lost = Vec::new();
    for (item, push) in &pushed {
        let payload = push.payload.as_deref().unwrap_or_default();
        let kept = acked_or_maybe.contains(item) || queued.contains(item) || dead_payloads.contains(payload);
        if !kept {
            lost.push(*push);
        }
    }
    if !lost.is_empty() {
        let quoted: Vec<String> = lost.iter().take(QUOTED_MAX).map(|op| op_summary(op)).collect();
        report.push(Violation::new(
            Invariant::PushKept,
            lost.iter().map(|op| op.id).collect::<Vec<OpId>>(),
            format!(
                "{} acknowledged push(es) to `{queue}` are gone (never acked, not in the queue nor its \
                 dead-letter queue): {}",
                lost.len(),
                quoted.join("; ")
            ),
        ));
    }

    // Q4.
    if last.drained && !last.items.is_empty() {
        let quoted: Vec<String> = last
            .items
            .iter()
            .take(QUOTED_MAX)
            .map(|item| format!("item {} ({}) {}", item.id, item.payload, item.state))
            .collect();
        report.push(Violation::new(
            Invariant::Drained,
            Vec::new(),
            format!(
                "`{queue}` still holds {} item(s) after the consumers drained it: {}",
                last.items.len(),
                quoted.join(", ")
            ),
        ));
    }
}
