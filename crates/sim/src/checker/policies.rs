//! The semaphore policy promises (docs/semantics.md, "Semaphore policies"):
//! - **rate**, on leader time ([`rate`]): over any window of leader time of length T, the
//!   permits granted on a rated semaphore (acquires and takes together) are at most
//!   `burst + permits × T / per_ms`;
//! - **lock-delay**, on leader time ([`lock_delay`]): on a capacity-1 semaphore, no grant within
//!   `lock_delay_ms` of leader time after a hold ended by expiry or revoke;
//! - **leader time** ([`leader_time`]): every node's replica showed, at each index, the leader
//!   time of the committed log there (the largest `Batch::now_ms` up to it), so a new leader or a
//!   restarted node never goes back (each node's own time never going back within a run is the
//!   observer's check);
//! - **lock-delay in real time**, from the clients ([`revoke_real_time`]): a grant that follows a
//!   revoked hold is answered no earlier than the revoke's send time plus `lock_delay_ms`.
//!   Leader time cannot outrun the clients' clock: a new leader continues from the largest
//!   applied time and the time of an election does not count. (A rate bound in real time would
//!   need more: a window of real time may hold a longer window of leader time when an earlier
//!   leader's time lagged, so it is not promised and not checked.)
//!
//! The first three judge the committed log as [`crate::applied`] re-applied it, the last the
//! history.

use std::collections::BTreeMap;

use permit_core::{EventKind, Key, Rate};

use super::{Rule, Violation};
use crate::applied::{Applied, Timed};
use crate::history::{Answer, Event, History, Operation, Point};

/// Grants and takes of `key` in `events` that exceed `rate` over some window of leader time.
/// Reports the first window found.
pub fn rate(events: &[Timed], key: &Key, rate: Rate) -> Vec<Violation> {
    let grants = events
        .iter()
        .filter(|event| event.key == *key && matches!(event.kind, EventKind::Granted | EventKind::Taken));
    // With P(j) the permits of grants 0..=j and t(j) their times (non-decreasing, log order),
    // the window from grant i to grant j holds P(j) - P(i-1) permits over t(j) - t(i) ms, and
    // the promise is per_ms × (P(j) - P(i-1)) ≤ burst × per_ms + permits × (t(j) - t(i)).
    // So it suffices to keep, over i ≤ j, the least per_ms × P(i-1) - permits × t(i).
    let (permits, per_ms, burst) =
        (i128::from(rate.permits), i128::from(rate.per_ms), i128::from(rate.burst));
    let mut before = 0i128;
    let mut least: Option<(i128, &Timed)> = None;
    for grant in grants {
        let at = i128::from(grant.at_ms);
        let start = per_ms * before - permits * at;
        if least.is_none_or(|(value, _)| start < value) {
            least = Some((start, grant));
        }
        before += i128::from(grant.permits);
        let end = per_ms * before - permits * at;
        let (value, first) = least.expect("set above");
        if end - value > burst * per_ms {
            let over = (end - value) as f64 / per_ms as f64;
            let text = format!(
                "{key}: from leader time {} ms (index {}) to {} ms (index {}) the grants exceed the burst \
                 of {} plus {}/{} ms by {over:.2} permits",
                first.at_ms, first.index, grant.at_ms, grant.index, rate.burst, rate.permits, rate.per_ms,
            );
            return vec![Violation::new(Rule::Rate, Vec::new(), text)];
        }
    }
    Vec::new()
}

/// Grants of the capacity-1 semaphore `key` within `delay_ms` of leader time after a hold of it
/// ended by expiry or revoke.
pub fn lock_delay(events: &[Timed], key: &Key, delay_ms: u64) -> Vec<Violation> {
    let mut failed: Option<&Timed> = None;
    let mut violations = Vec::new();
    for event in events.iter().filter(|event| event.key == *key) {
        match event.kind {
            EventKind::Expired | EventKind::Revoked => failed = Some(event),
            EventKind::Granted => {
                if let Some(end) = failed.filter(|end| event.at_ms < end.at_ms.saturating_add(delay_ms)) {
                    let text = format!(
                        "{key}: granted at leader time {} ms (index {}), {} ms after a hold {:?} at {} ms \
                         (index {}); the lock-delay is {delay_ms} ms",
                        event.at_ms,
                        event.index,
                        event.at_ms - end.at_ms,
                        end.kind,
                        end.at_ms,
                        end.index
                    );
                    violations.push(Violation::new(Rule::LockDelay, Vec::new(), text));
                }
            }
            _ => {}
        }
    }
    violations
}

/// Indexes at which a node showed another leader time than the committed log's, and problems of
/// the log itself. `seen` maps (index, leader time) to a node that showed it.
pub fn leader_time(applied: &Applied, seen: &BTreeMap<(u64, u64), u64>) -> Vec<Violation> {
    let mut violations: Vec<Violation> = applied
        .problems
        .iter()
        .map(|problem| Violation::new(Rule::Malformed, Vec::new(), problem.clone()))
        .collect();
    for ((index, now_ms), node) in seen {
        let logged = if *index == 0 { Some(0) } else { applied.leader_ms.get(index).copied() };
        if logged.is_some_and(|logged| logged != *now_ms) {
            let text = format!(
                "node {node} showed leader time {now_ms} ms at index {index}, where the committed log \
                 has {} ms",
                logged.unwrap_or(0)
            );
            violations.push(Violation::new(Rule::LeaderTime, Vec::new(), text));
        }
    }
    violations
}

/// Grants of the capacity-1 semaphore `key` answered before `revoke sent + delay_ms`, where the
/// revoke (acknowledged, ending a hold) ended the hold with a smaller token: with one permit, a
/// grant with a larger token came after that hold ended.
pub fn revoke_real_time(history: &History, key: &Key, delay_ms: u64) -> Vec<Violation> {
    // Per op: its invoke point and operation.
    let mut invoked: BTreeMap<u64, (Point, &Operation)> = BTreeMap::new();
    let mut revokes: Vec<(Point, u64)> = Vec::new();
    let mut grants: Vec<(Point, u64, Point)> = Vec::new();
    for record in &history.records {
        match &record.event {
            Event::Invoked { op, operation, .. } => {
                invoked.insert(*op, (record.point, operation));
            }
            Event::Acked { op, answer } => match (invoked.get(op), answer) {
                (Some((sent, Operation::Revoke { key: k, token, .. })), Answer::Released { permits })
                    if k == key && *permits > 0 =>
                {
                    revokes.push((*sent, *token));
                }
                (Some((sent, Operation::Acquire { key: k, .. })), Answer::Acquired { token, .. })
                    if k == key =>
                {
                    grants.push((record.point, *token, *sent));
                }
                _ => {}
            },
            _ => {}
        }
    }
    let mut violations = Vec::new();
    for (revoke_sent, revoked) in &revokes {
        let earliest = revoke_sent.plus_ms(delay_ms);
        for (answered, token, sent) in &grants {
            if token > revoked && *answered < earliest {
                let text = format!(
                    "{key}: token {token} (acquire sent {sent}) answered at {answered}, before {earliest}: the \
                     revoke of token {revoked} was sent at {revoke_sent} and the lock-delay is {delay_ms} ms"
                );
                violations.push(Violation::new(Rule::LockDelay, Vec::new(), text));
            }
        }
    }
    violations
}
