//! I1, client-visible capacity: the holds clients may rely on never exceed capacity.

use std::collections::{BTreeMap, BTreeSet};

use crate::deadline::{ClockAllowance, SessionDeadlines};
use crate::grant::{grants, Grant, HoldEnds};
use crate::history::History;
use crate::report::{seconds, Invariant, Report, Violation};

/// Checks that at no instant the permits clients may rely on exceed a semaphore's capacity.
///
/// Each grant (an `Ok` acquire; idempotent repeats are the same grant) is usable on
/// `[ack, end)`: from the first answer to the earliest of
/// - the invoke of the session's next release of that semaphore or close of the session,
///   whatever its outcome (the client stops relying when it sends it);
/// - the instant the session lapses for its client: the send time of the latest `Ok` create or
///   keepalive answered by then, plus `ttl · (1 − ε) − δ` (see [`SessionDeadlines`]); a
///   keepalive answered after that instant comes too late to carry the hold on.
///
/// A sweep line over those intervals, per semaphore, reports every instant where the sum of
/// usable permits first exceeds the capacity given in `capacities`. Unknown acquires are not
/// counted: no client relies on them. `checked` counts grants. O(n log n).
///
/// Assumes [`check_well_formed`](crate::check_well_formed) passes; a grant on a semaphore
/// missing from `capacities`, or for a session with no `Ok` create, is itself a violation.
///
/// # Examples
///
/// ```
/// use std::collections::BTreeMap;
/// use permit_check::{check_capacity, ClockAllowance, Completion, History, Invocation, Op};
///
/// let ms = 1_000_000;
/// let mut history = History::new();
/// let mut next_id = 0;
/// let mut call = |invocation, invoke_ms: u64, complete_ms: u64, completion| {
///     let mut op = Op::invoked(next_id, invocation, invoke_ms * ms);
///     op.complete(complete_ms * ms, completion);
///     history.push(op);
///     next_id += 1;
/// };
/// let session = |id: &str| Completion { session: Some(id.into()), ..Completion::ok() };
/// let token = |token| Completion { token: Some(token), ..Completion::ok() };
/// call(Invocation::create_session(1, 1000), 0, 5, session("a"));
/// call(Invocation::create_session(2, 1000), 0, 5, session("b"));
/// call(Invocation::acquire(1, "a", "db", 1), 10, 20, token(1));
/// // "a" never keeps alive: it may rely on its hold until 0 + 1000 · 0.95 − 50 = 900 ms.
/// call(Invocation::acquire(2, "b", "db", 1), 1100, 1110, token(2));
///
/// let capacities = BTreeMap::from([("db".to_owned(), 1)]);
/// let report = check_capacity(&history, &capacities, ClockAllowance::default());
/// assert!(report.is_ok(), "{report}");
/// assert_eq!(report.checked, 2);
/// ```
pub fn check_capacity(
    history: &History,
    capacities: &BTreeMap<String, u64>,
    allowance: ClockAllowance,
) -> Report {
    let deadlines = SessionDeadlines::new(history, allowance);
    let ends = HoldEnds::new(history, |_| true);
    let grants = grants(history);
    let mut report = Report::new(grants.len());
    let mut by_semaphore: BTreeMap<&str, Vec<Usable>> = BTreeMap::new();
    let mut unknown_sessions = BTreeSet::new();
    for grant in &grants {
        match usable(grant, &deadlines, &ends) {
            Some(usable) if usable.end_ns > usable.start_ns => {
                by_semaphore.entry(grant.semaphore).or_default().push(usable)
            }
            Some(_) => {}
            None if unknown_sessions.insert(grant.session) => report.push(Violation::new(
                Invariant::WellFormed,
                vec![grant.op],
                format!(
                    "op {} was granted to session `{}`, which has no Ok create in the history, so \
                     its deadline is unknown",
                    grant.op, grant.session
                ),
            )),
            None => {}
        }
    }
    for (semaphore, usables) in by_semaphore {
        match capacities.get(semaphore) {
            Some(&capacity) => sweep(semaphore, capacity, usables, &mut report),
            None => report.push(Violation::new(
                Invariant::WellFormed,
                vec![usables[0].grant.op],
                format!("no capacity given for semaphore `{semaphore}`"),
            )),
        }
    }
    report
}

/// A grant and the interval on which its client may rely on it.
struct Usable<'g> {
    grant: &'g Grant<'g>,
    start_ns: u64,
    end_ns: u64,
    end_reason: String,
}

fn usable<'g>(grant: &'g Grant<'g>, deadlines: &SessionDeadlines, ends: &HoldEnds) -> Option<Usable<'g>> {
    let lapse_ns = deadlines.lapse_after(grant.session, grant.ack_ns)?;
    let first_invoke_ns = grant.acquires[0].invoke_ns;
    let (end_ns, end_reason) = match ends.first_from(grant.session, grant.semaphore, first_invoke_ns) {
        Some(end) if end.invoke_ns < lapse_ns => (end.invoke_ns, format!("ended by release op {}", end.op)),
        _ => (lapse_ns, "ended by the session deadline".to_owned()),
    };
    Some(Usable { grant, start_ns: grant.ack_ns, end_ns, end_reason })
}

/// Walks the interval ends and starts in time order (ends first at equal times: intervals are
/// half-open) and reports each episode over capacity once, when it begins.
fn sweep(semaphore: &str, capacity: u64, usables: Vec<Usable>, report: &mut Report) {
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(usables.len() * 2);
    for (index, usable) in usables.iter().enumerate() {
        events.push((usable.start_ns, true, index));
        events.push((usable.end_ns, false, index));
    }
    events.sort_unstable();
    let mut active = BTreeSet::new();
    let mut held: u64 = 0;
    let mut over = false;
    for (time_ns, is_start, index) in events {
        let permits = usables[index].grant.permits;
        if !is_start {
            active.remove(&index);
            held -= permits;
            over = held > capacity;
            continue;
        }
        active.insert(index);
        held += permits;
        if held > capacity && !over {
            over = true;
            report.push(over_capacity(semaphore, capacity, held, time_ns, &usables, &active));
        }
    }
}

fn over_capacity(
    semaphore: &str,
    capacity: u64,
    held: u64,
    time_ns: u64,
    usables: &[Usable],
    active: &BTreeSet<usize>,
) -> Violation {
    let holds: Vec<String> = active
        .iter()
        .map(|&index| {
            let usable = &usables[index];
            let grant = usable.grant;
            format!(
                "op {} (session `{}`, {} permit(s), token {}, usable {}..{}, {})",
                grant.op,
                grant.session,
                grant.permits,
                grant.token,
                seconds(usable.start_ns),
                seconds(usable.end_ns),
                usable.end_reason
            )
        })
        .collect();
    Violation::new(
        Invariant::Capacity,
        active.iter().map(|&index| usables[index].grant.op).collect(),
        format!(
            "semaphore `{semaphore}` (capacity {capacity}): {held} permits usable at {} by {}",
            seconds(time_ns),
            holds.join(", ")
        ),
    )
}
