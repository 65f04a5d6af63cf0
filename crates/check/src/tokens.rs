//! I3, tokens: unique per grant and increasing in real-time order, across all semaphores.

use std::collections::HashMap;

use crate::grant::{grants, Grant, HoldEnds};
use crate::history::{History, OpId, OpKind, Outcome};
use crate::report::{seconds, Invariant, Report, Violation};

/// Checks fencing tokens over every grant of the history.
///
/// - **Unique**: distinct grants carry distinct tokens. Grants are `Ok` acquires grouped by
///   (semaphore, session, token), so an idempotent repeat returning its grant's own token is
///   the same grant; the same token on another semaphore or session is a violation, and so is
///   the same session getting the same token again after an `Ok` release completed in between.
/// - **Real-time order**: if grant `a` was acknowledged before grant `b` was asked for, then
///   `token(b) > token(a)`, on any semaphore (tokens are global). A grant is "asked for" at the
///   first acquire (of any outcome) its session sent for that semaphore since its last release
///   or close: an unknown acquire retried later may have been granted at its first try.
///
/// `checked` counts grants. O(n log n).
///
/// # Examples
///
/// ```
/// use permit_check::{check_tokens, Completion, History, Invocation, Op};
///
/// let mut first = Op::invoked(0, Invocation::acquire(1, "a", "db", 1), 0);
/// first.complete(10, Completion { token: Some(8), ..Completion::ok() });
/// let mut second = Op::invoked(1, Invocation::acquire(2, "b", "jobs", 1), 20);
/// second.complete(30, Completion { token: Some(5), ..Completion::ok() });
/// let history: History = [first, second].into_iter().collect();
///
/// let report = check_tokens(&history);
/// assert_eq!(report.violations[0].ops, vec![0, 1]);
/// ```
pub fn check_tokens(history: &History) -> Report {
    let grants = grants(history);
    let mut report = Report::new(grants.len());
    check_unique(&grants, &mut report);
    check_not_reissued(history, &grants, &mut report);
    check_real_time_order(history, &grants, &mut report);
    report
}

fn check_unique(grants: &[Grant], report: &mut Report) {
    let mut by_token: HashMap<u64, Vec<&Grant>> = HashMap::new();
    for grant in grants {
        by_token.entry(grant.token).or_default().push(grant);
    }
    let mut shared: Vec<(u64, Vec<&Grant>)> =
        by_token.into_iter().filter(|(_, list)| list.len() > 1).collect();
    shared.sort_by_key(|(token, _)| *token);
    for (token, list) in shared {
        let names: Vec<String> = list
            .iter()
            .map(|grant| {
                format!("op {} (semaphore `{}`, session `{}`)", grant.op, grant.semaphore, grant.session)
            })
            .collect();
        report.push(Violation::new(
            Invariant::Tokens,
            list.iter().map(|grant| grant.op).collect(),
            format!("token {token} was granted to distinct grants: {}", names.join(", ")),
        ));
    }
}

/// The same session may see its token again only while it still holds: not after an `Ok`
/// release or close that completed between the two answers.
fn check_not_reissued(history: &History, grants: &[Grant], report: &mut Report) {
    let ends = HoldEnds::new(history, |op| op.is_ok());
    for grant in grants.iter().filter(|grant| grant.acquires.len() > 1) {
        let all_ends = ends.all(grant.session, grant.semaphore);
        for pair in grant.acquires.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let earlier_ack_ns = earlier.complete_or_infinity_ns();
            let between = all_ends
                .iter()
                .find(|end| end.invoke_ns >= earlier_ack_ns && end.complete_ns <= later.invoke_ns);
            if let Some(end) = between {
                report.push(Violation::new(
                    Invariant::Tokens,
                    vec![earlier.id, end.op, later.id],
                    format!(
                        "session `{}` got token {} on `{}` from op {} and again from op {} after op {} \
                         released it (answered {})",
                        grant.session,
                        grant.token,
                        grant.semaphore,
                        earlier.id,
                        later.id,
                        end.op,
                        seconds(end.complete_ns)
                    ),
                ));
            }
        }
    }
}

fn check_real_time_order(history: &History, grants: &[Grant], report: &mut Report) {
    let asked_ns = asked_times(history);
    let ordered: Vec<TokenGrant<u64>> = grants
        .iter()
        .map(|grant| TokenGrant {
            asked: asked_ns.get(&grant.acquires[0].id).copied().unwrap_or(0),
            acked: grant.ack_ns,
            token: grant.token,
        })
        .collect();
    for (earlier, later) in token_order(&ordered) {
        let (earlier, grant, asked_ns) = (&grants[earlier], &grants[later], ordered[later].asked);
        report.push(Violation::new(
            Invariant::Tokens,
            vec![earlier.op, grant.op],
            format!(
                "op {} (semaphore `{}`) got token {} although op {} (semaphore `{}`) got the larger \
                 token {} and was answered at {}, before the grant was asked for at {}",
                grant.op,
                grant.semaphore,
                grant.token,
                earlier.op,
                earlier.semaphore,
                earlier.token,
                seconds(earlier.ack_ns),
                seconds(asked_ns)
            ),
        ));
    }
}

/// One grant as the token order sees it, on the clock `T` of the caller's history (nanoseconds
/// in the fault suite, the simulation's points there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenGrant<T> {
    /// When it was asked for: no later than the sending of the acquire that produced it.
    pub asked: T,
    /// When a client first knew of it.
    pub acked: T,
    /// Its fencing token.
    pub token: u64,
}

/// The real-time order of tokens, shared by [`check_tokens`] and the simulation's checker: a
/// grant acknowledged before another was asked for has the smaller token.
///
/// Returns `(earlier, later)` index pairs into `grants`, in order of asking: for every grant
/// whose token is smaller than the largest token acknowledged strictly before it was asked
/// for, the grant with that largest token (the first acknowledged, among equal tokens) and
/// it. Equal tokens are not an order violation (uniqueness is checked apart). O(n log n).
///
/// # Examples
///
/// ```
/// use permit_check::{token_order, TokenGrant};
///
/// let grants = [
///     TokenGrant { asked: 0, acked: 10, token: 8 },
///     TokenGrant { asked: 20, acked: 30, token: 5 },
///     TokenGrant { asked: 5, acked: 40, token: 6 },
/// ];
/// // The second was asked for after the first was acknowledged; the third was not.
/// assert_eq!(token_order(&grants), vec![(0, 1)]);
/// ```
pub fn token_order<T: Ord + Copy>(grants: &[TokenGrant<T>]) -> Vec<(usize, usize)> {
    let mut by_acked: Vec<usize> = (0..grants.len()).collect();
    by_acked.sort_by_key(|&index| (grants[index].acked, index));
    let mut by_asked: Vec<usize> = (0..grants.len()).collect();
    by_asked.sort_by_key(|&index| (grants[index].asked, index));
    // Advance through the acknowledgements as the asks go by, keeping the largest token so far.
    let mut acknowledged = 0;
    let mut largest: Option<usize> = None;
    let mut violations = Vec::new();
    for later in by_asked {
        let asked = grants[later].asked;
        while acknowledged < by_acked.len() && grants[by_acked[acknowledged]].acked < asked {
            let candidate = by_acked[acknowledged];
            if largest.is_none_or(|largest| grants[candidate].token > grants[largest].token) {
                largest = Some(candidate);
            }
            acknowledged += 1;
        }
        if let Some(earlier) = largest.filter(|&earlier| grants[later].token < grants[earlier].token) {
            violations.push((earlier, later));
        }
    }
    violations
}

/// An acquire or release of one (session, semaphore): invoke time, whether it is an acquire,
/// and its op.
type SessionCall = (u64, bool, OpId);

/// For every acquire, the invoke time of the first acquire of its (session, semaphore) since
/// the last release or close sent before it (one that failed does not count).
fn asked_times(history: &History) -> HashMap<OpId, u64> {
    let mut calls: HashMap<(&str, &str), Vec<SessionCall>> = HashMap::new();
    let mut closes: HashMap<&str, Vec<u64>> = HashMap::new();
    for op in history.ops() {
        match op.kind {
            OpKind::Acquire => calls.entry((op.session.as_str(), op.semaphore.as_str())).or_default().push((
                op.invoke_ns,
                true,
                op.id,
            )),
            // A release that failed released nothing.
            OpKind::Release if op.outcome != Outcome::Fail => calls
                .entry((op.session.as_str(), op.semaphore.as_str()))
                .or_default()
                .push((op.invoke_ns, false, op.id)),
            OpKind::CloseSession if op.outcome != Outcome::Fail => {
                closes.entry(op.session.as_str()).or_default().push(op.invoke_ns)
            }
            _ => {}
        }
    }
    let mut asked_ns = HashMap::new();
    for ((session, _), mut list) in calls {
        // A close ends every hold of the session: it is a release of each semaphore.
        list.extend(
            closes.get(session).into_iter().flatten().map(|&invoke_ns| (invoke_ns, false, OpId::MAX)),
        );
        // Releases sort before acquires sent at the same instant.
        list.sort_unstable();
        let mut run_start_ns = None;
        for (invoke_ns, is_acquire, id) in list {
            if !is_acquire {
                run_start_ns = None;
                continue;
            }
            asked_ns.insert(id, *run_start_ns.get_or_insert(invoke_ns));
        }
    }
    asked_ns
}
