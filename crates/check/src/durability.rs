//! I5, durability: after crashes and restarts, no acknowledged grant or release is lost.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::deadline::{ClockAllowance, SessionDeadlines};
use crate::grant::{grants, Grant, HoldEnds};
use crate::history::{History, Holder, OpKind, Outcome};
use crate::report::{seconds, Invariant, Report, Violation};

/// The holders of every semaphore, read (linearizably) after the faults healed, e.g. after a
/// full-cluster restart. Times are on the recorder's clock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalRead {
    /// When the first read was sent.
    pub invoke_ns: u64,
    /// When the last answer arrived.
    pub complete_ns: u64,
    /// Every semaphore the history used, with its holders.
    pub holders: BTreeMap<String, Vec<Holder>>,
}

/// Checks a final read against the history.
///
/// - **No acknowledged grant lost**: a grant answered before the read, whose session's
///   conservative deadline (send time of the latest `Ok` create or keepalive answered before
///   the read, plus `ttl · (1 − ε) − δ`) is after the read completed, and that no release or
///   close (other than a failed one) followed, must be listed with its permits and token.
/// - **No acknowledged release lost**: a hold whose `Ok` release or close was sent after its
///   grant was answered and answered before the read must not be listed.
/// - **No phantom holder**: a listed holder's session must have sent an acquire on that
///   semaphore.
///
/// A semaphore with grants but missing from the read is a violation, as is a grant for a
/// session with no `Ok` create. `checked` counts grants plus listed holders.
///
/// # Examples
///
/// ```
/// use std::collections::BTreeMap;
/// use permit_check::{check_durability, ClockAllowance, Completion, FinalRead, History, Invocation, Op};
///
/// let s = 1_000_000_000;
/// let mut create = Op::invoked(0, Invocation::create_session(1, 3_600_000), 0);
/// create.complete(1, Completion { session: Some("a".into()), ..Completion::ok() });
/// let mut acquire = Op::invoked(1, Invocation::acquire(1, "a", "db", 1), 2);
/// acquire.complete(3, Completion { token: Some(4), ..Completion::ok() });
/// let history: History = [create, acquire].into_iter().collect();
///
/// // After a restart the hold is gone although its session still lives: a lost grant.
/// let read = FinalRead { invoke_ns: 10 * s, complete_ns: 11 * s, holders: BTreeMap::from([("db".into(), vec![])]) };
/// let report = check_durability(&history, &read, ClockAllowance::default());
/// assert_eq!(report.violations[0].ops, vec![1]);
/// ```
pub fn check_durability(history: &History, read: &FinalRead, allowance: ClockAllowance) -> Report {
    let grants = grants(history);
    let listed: usize = read.holders.values().map(Vec::len).sum();
    let mut report = Report::new(grants.len() + listed);
    check_grants_kept(history, &grants, read, allowance, &mut report);
    check_releases_kept(history, &grants, read, &mut report);
    report
}

fn check_grants_kept(
    history: &History,
    grants: &[Grant],
    read: &FinalRead,
    allowance: ClockAllowance,
    report: &mut Report,
) {
    let deadlines = SessionDeadlines::new(history, allowance);
    let ends = HoldEnds::new(history, |op| op.outcome != Outcome::Fail);
    let mut reported = BTreeSet::new();
    for grant in grants.iter().filter(|grant| grant.ack_ns < read.invoke_ns) {
        let Some(holders) = read.holders.get(grant.semaphore) else {
            if reported.insert(grant.semaphore) {
                let message = format!("the final read does not cover semaphore `{}`", grant.semaphore);
                report.push(Violation::new(Invariant::WellFormed, vec![grant.op], message));
            }
            continue;
        };
        if deadlines.ttl_ms(grant.session).is_none() {
            if reported.insert(grant.session) {
                let message = format!("session `{}` has no Ok create in the history", grant.session);
                report.push(Violation::new(Invariant::WellFormed, vec![grant.op], message));
            }
            continue;
        }
        let deadline_ns = deadlines.deadline_at(grant.session, read.invoke_ns).unwrap_or(0);
        let ended = ends.first_from(grant.session, grant.semaphore, grant.acquires[0].invoke_ns).is_some();
        if ended || deadline_ns <= read.complete_ns {
            continue;
        }
        let listed = holders.iter().find(|holder| holder.session == grant.session);
        if listed.is_some_and(|holder| holder.token == grant.token && holder.permits == grant.permits) {
            continue;
        }
        let seen = listed.map_or_else(
            || "not listed".to_owned(),
            |holder| format!("listed with {} permit(s) and token {}", holder.permits, holder.token),
        );
        report.push(Violation::new(
            Invariant::Durability,
            vec![grant.op],
            format!(
                "grant op {} ({} permit(s) of `{}` to session `{}`, token {}, answered {}) is {seen} in the \
                 final read, although the session lives until at least {} and nothing released it",
                grant.op,
                grant.permits,
                grant.semaphore,
                grant.session,
                grant.token,
                seconds(grant.ack_ns),
                seconds(deadline_ns)
            ),
        ));
    }
}

fn check_releases_kept(history: &History, grants: &[Grant], read: &FinalRead, report: &mut Report) {
    let ok_ends = HoldEnds::new(history, |op| op.is_ok());
    let by_token: HashMap<(&str, &str, u64), &Grant> =
        grants.iter().map(|grant| ((grant.semaphore, grant.session, grant.token), grant)).collect();
    let asked: HashSet<(&str, &str)> = history
        .ops()
        .iter()
        .filter(|op| op.kind == OpKind::Acquire)
        .map(|op| (op.semaphore.as_str(), op.session.as_str()))
        .collect();
    for (semaphore, holders) in &read.holders {
        for holder in holders {
            let key = (semaphore.as_str(), holder.session.as_str());
            if !asked.contains(&key) {
                let message = format!(
                    "the final read lists session `{}` holding `{semaphore}` (token {}), but it never asked for it",
                    holder.session, holder.token
                );
                report.push(Violation::new(Invariant::Durability, Vec::new(), message));
                continue;
            }
            let Some(grant) = by_token.get(&(key.0, key.1, holder.token)) else { continue };
            let released = ok_ends
                .all(grant.session, grant.semaphore)
                .into_iter()
                .find(|end| end.invoke_ns >= grant.ack_ns && end.complete_ns <= read.invoke_ns);
            if let Some(end) = released {
                report.push(Violation::new(
                    Invariant::Durability,
                    vec![grant.op, end.op],
                    format!(
                        "the final read lists the hold of grant op {} (session `{}` on `{semaphore}`, token {}) \
                         although op {} released it, answered at {}",
                        grant.op,
                        grant.session,
                        grant.token,
                        end.op,
                        seconds(end.complete_ns)
                    ),
                ));
            }
        }
    }
}
