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

/// Reports each episode of `usables` over the constant `capacity` once, when it begins.
fn sweep(semaphore: &str, capacity: u64, usables: Vec<Usable>, report: &mut Report) {
    let reliances: Vec<Reliance<u64>> = usables
        .iter()
        .map(|usable| Reliance { start: usable.start_ns, end: usable.end_ns, permits: usable.grant.permits })
        .collect();
    for overflow in over_capacity(&reliances, |_| Some(capacity)) {
        report.push(overflow_violation(semaphore, capacity, &overflow, &usables));
    }
}

/// An interval `[start, end)` in which a client may rely on `permits` permits of one semaphore,
/// on the clock `T` of the caller's history (nanoseconds in the fault suite, the simulation's
/// points there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reliance<T> {
    /// When the client starts relying on the hold.
    pub start: T,
    /// When it stops (excluded).
    pub end: T,
    /// The permits held.
    pub permits: u64,
}

/// An instant at which the permits relied on exceed the capacity, found by [`over_capacity`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overflow<T> {
    /// The instant: the start of the interval [`Overflow::started`].
    pub at: T,
    /// The permits relied on then.
    pub held: u64,
    /// The capacity then; `None` when none was known yet (itself a violation).
    pub capacity: Option<u64>,
    /// Indexes of every interval relied on then, ascending.
    pub relied: Vec<usize>,
    /// Index of the interval whose start brought the holds over.
    pub started: usize,
}

/// The capacity sweep shared by [`check_capacity`] and the simulation's checker: walks the
/// starts and ends of `reliances` (one semaphore's) in time order and reports each episode in
/// which the permits relied on exceed `capacity_at` (the capacity at an instant; `None`
/// counts as exceeded) once, when it begins.
///
/// Intervals are half-open, so at equal times ends come before starts; starts at equal times
/// are taken in index order. O(n log n) plus a call of `capacity_at` per interval end and
/// start.
///
/// # Examples
///
/// ```
/// use permit_check::{over_capacity, Reliance};
///
/// let reliances = [
///     Reliance { start: 0, end: 10, permits: 1 },
///     Reliance { start: 10, end: 20, permits: 1 },
///     Reliance { start: 15, end: 30, permits: 1 },
/// ];
/// let overflows = over_capacity(&reliances, |_| Some(1));
/// assert_eq!(overflows.len(), 1);
/// assert_eq!((overflows[0].at, overflows[0].held, overflows[0].relied.clone()), (15, 2, vec![1, 2]));
/// ```
pub fn over_capacity<T: Ord + Copy>(
    reliances: &[Reliance<T>],
    mut capacity_at: impl FnMut(T) -> Option<u64>,
) -> Vec<Overflow<T>> {
    let mut events: Vec<(T, bool, usize)> = Vec::with_capacity(reliances.len() * 2);
    for (index, reliance) in reliances.iter().enumerate() {
        events.push((reliance.start, true, index));
        events.push((reliance.end, false, index));
    }
    events.sort_unstable();
    let mut active = BTreeSet::new();
    let mut held: u64 = 0;
    let mut over = false;
    let mut overflows = Vec::new();
    for (at, is_start, index) in events {
        let permits = reliances[index].permits;
        if is_start {
            active.insert(index);
            held += permits;
        } else {
            active.remove(&index);
            held -= permits;
        }
        let capacity = capacity_at(at);
        let exceeded = capacity.is_none_or(|capacity| held > capacity);
        if is_start && exceeded && !over {
            let relied = active.iter().copied().collect();
            overflows.push(Overflow { at, held, capacity, relied, started: index });
        }
        over = exceeded;
    }
    overflows
}

fn overflow_violation(
    semaphore: &str,
    capacity: u64,
    overflow: &Overflow<u64>,
    usables: &[Usable],
) -> Violation {
    let holds: Vec<String> = overflow
        .relied
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
        overflow.relied.iter().map(|&index| usables[index].grant.op).collect(),
        format!(
            "semaphore `{semaphore}` (capacity {capacity}): {} permits usable at {} by {}",
            overflow.held,
            seconds(overflow.at),
            holds.join(", ")
        ),
    )
}
