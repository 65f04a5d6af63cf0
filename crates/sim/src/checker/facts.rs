//! What a history establishes: every operation with its answer, when each session is surely
//! alive from its client's point of view, and every grant with the interval it was relied on.

use std::collections::BTreeMap;

use permit_core::{Key, SessionId};

use super::{Rule, Violation};
use crate::history::{Answer, ClientId, Event, History, Operation, Point, SeenHold};

/// One operation and its answer, if one came.
#[derive(Debug, Clone)]
pub struct Op {
    /// When it was sent.
    pub invoked: Point,
    /// Who sent it.
    pub client: ClientId,
    /// What it was.
    pub operation: Operation,
    /// When and what it was answered.
    pub answer: Option<(Point, Answer)>,
}

/// A grant: the first sighting of a token in an answer or a read.
#[derive(Debug, Clone)]
pub struct Grant {
    /// The session holding it.
    pub session: SessionId,
    /// The semaphore.
    pub key: Key,
    /// Permits held.
    pub permits: u64,
    /// Fencing token.
    pub token: u64,
    /// When a client first learned of it.
    pub seen: Point,
    /// A point surely before the grant happened: the earliest sending of an acquire that may
    /// have produced it.
    pub invoked: Point,
    /// When its client stopped relying on it: release or close sent, or `max_hold_ms` passed.
    pub relied_until: Point,
}

/// Facts drawn from one history.
#[derive(Debug, Default)]
pub struct Facts {
    /// Operations by id.
    pub ops: BTreeMap<u64, Op>,
    /// Per session, the merged intervals `[start, end)` in which its client may rely on it:
    /// from an acknowledged create or keepalive to `sent + ttl`, cut at a close.
    pub leases: BTreeMap<SessionId, Vec<(Point, Point)>>,
    /// Ids of the operations of each session, in order.
    pub ops_of_session: BTreeMap<SessionId, Vec<u64>>,
    /// Grants by token.
    pub grants: BTreeMap<u64, Grant>,
    /// Violations found while drawing the facts (conflicting or phantom tokens).
    pub violations: Vec<Violation>,
}

impl Facts {
    /// Draws the facts of `history`.
    pub fn of(history: &History) -> Facts {
        let mut facts = Facts::default();
        facts.collect_ops(history);
        facts.collect_leases();
        facts.collect_grants(history);
        facts
    }

    /// Whether the session's client may rely on it at `point`.
    pub fn lease_holds(&self, session: SessionId, point: Point) -> bool {
        self.leases
            .get(&session)
            .is_some_and(|intervals| intervals.iter().any(|(start, end)| *start < point && point < *end))
    }

    /// The intervals in which the grant is relied on: its own interval within its session's
    /// lease.
    pub fn reliance(&self, grant: &Grant) -> Vec<(Point, Point)> {
        let Some(lease) = self.leases.get(&grant.session) else { return Vec::new() };
        lease
            .iter()
            .map(|(start, end)| ((*start).max(grant.seen), (*end).min(grant.relied_until)))
            .filter(|(start, end)| start < end)
            .collect()
    }

    /// Capacities sent for `key`, with when they were sent.
    pub fn capacities(&self, key: &Key) -> Vec<(Point, u64)> {
        self.ops
            .values()
            .filter_map(|op| match &op.operation {
                Operation::PutSemaphore { key: k, capacity } if k == key => Some((op.invoked, *capacity)),
                _ => None,
            })
            .collect()
    }

    fn collect_ops(&mut self, history: &History) {
        for record in &history.records {
            match &record.event {
                Event::Invoked { op, operation, .. } => {
                    let op_record = Op {
                        invoked: record.point,
                        client: record.client,
                        operation: operation.clone(),
                        answer: None,
                    };
                    if let Some(session) = operation.session() {
                        self.ops_of_session.entry(session).or_default().push(*op);
                    }
                    if self.ops.insert(*op, op_record).is_some() {
                        self.malformed(format!("operation {op} sent twice"));
                    }
                }
                Event::Acked { op, answer } => match self.ops.get_mut(op) {
                    Some(invoked) if invoked.answer.is_none() => {
                        invoked.answer = Some((record.point, answer.clone()));
                    }
                    _ => self.malformed(format!("answer to unknown or answered op {op}")),
                },
                Event::SessionMissing { .. } | Event::Observed { .. } | Event::QueueRead { .. } => {}
            }
        }
    }

    fn collect_leases(&mut self) {
        let mut ttls = BTreeMap::new();
        let mut closes: BTreeMap<SessionId, Point> = BTreeMap::new();
        for op in self.ops.values() {
            match op.operation {
                Operation::CreateSession { session, ttl_ms } => {
                    ttls.insert(session, ttl_ms);
                }
                Operation::CloseSession { session } => {
                    let close = closes.entry(session).or_insert(op.invoked);
                    *close = (*close).min(op.invoked);
                }
                _ => {}
            }
        }
        let mut leases: BTreeMap<SessionId, Vec<(Point, Point)>> = BTreeMap::new();
        for op in self.ops.values() {
            let session = match (&op.operation, &op.answer) {
                (Operation::CreateSession { session, .. }, Some((_, Answer::SessionCreated))) => *session,
                (Operation::Keepalive { session }, Some((_, Answer::KeptAlive))) => *session,
                _ => continue,
            };
            let Some(ttl_ms) = ttls.get(&session) else { continue };
            let (acked, _) = op.answer.as_ref().expect("matched an answer");
            let end = op.invoked.plus_ms(*ttl_ms).min(closes.get(&session).copied().unwrap_or(Point::END));
            if *acked < end {
                leases.entry(session).or_default().push((*acked, end));
            }
        }
        for intervals in leases.values_mut() {
            *intervals = merged(std::mem::take(intervals));
        }
        self.leases = leases;
    }

    fn collect_grants(&mut self, history: &History) {
        for record in &history.records {
            let sightings: Vec<(SessionId, SeenHold)> = match &record.event {
                Event::Acked { op, answer: Answer::Acquired { permits, token } } => {
                    match self.ops.get(op).map(|op| &op.operation) {
                        Some(Operation::Acquire { session, key, .. }) => {
                            vec![(*session, SeenHold { key: key.clone(), permits: *permits, token: *token })]
                        }
                        _ => {
                            self.malformed(format!("op {op} answered Acquired is no acquire"));
                            continue;
                        }
                    }
                }
                Event::Observed { session, holds, .. } => {
                    holds.iter().map(|hold| (*session, hold.clone())).collect()
                }
                _ => continue,
            };
            for (session, hold) in sightings {
                self.sight(session, hold, record.point);
            }
        }
    }

    /// Records a sighting of a hold; the first sighting of a token makes a grant.
    fn sight(&mut self, session: SessionId, hold: SeenHold, seen: Point) {
        if let Some(grant) = self.grants.get(&hold.token) {
            if (grant.session, &grant.key, grant.permits) != (session, &hold.key, hold.permits) {
                let text = format!(
                    "token {} seen for {session} on {} ({} permits) at {seen}, but it was granted to {} on \
                     {} ({} permits) at {}",
                    hold.token, hold.key, hold.permits, grant.session, grant.key, grant.permits, grant.seen
                );
                let sessions = vec![session, grant.session];
                self.violations.push(Violation::new(Rule::TokenIdentity, sessions, text));
            }
            return;
        }
        let candidates = self.candidates(session, &hold, seen);
        let Some(invoked) = candidates.iter().map(|op| op.invoked).min() else {
            let text = format!(
                "token {} seen for {session} on {} at {seen}, but no acquire of that session could have \
                 granted it",
                hold.token, hold.key
            );
            self.violations.push(Violation::new(Rule::TokenIdentity, vec![session], text));
            return;
        };
        let max_hold_end = candidates
            .iter()
            .filter_map(|op| match op.operation {
                Operation::Acquire { max_hold_ms: Some(ms), .. } => Some(op.invoked.plus_ms(ms)),
                _ => None,
            })
            .min()
            .unwrap_or(Point::END);
        let released = self
            .session_ops(session)
            .filter(|op| op.invoked > seen)
            .filter(|op| match &op.operation {
                Operation::Release { session: s, key } | Operation::Revoke { session: s, key, .. } => {
                    *s == session && *key == hold.key
                }
                Operation::CloseSession { session: s } => *s == session,
                _ => false,
            })
            .map(|op| op.invoked)
            .min()
            .unwrap_or(Point::END);
        let grant = Grant {
            session,
            key: hold.key,
            permits: hold.permits,
            token: hold.token,
            seen,
            invoked,
            relied_until: released.min(max_hold_end),
        };
        self.grants.insert(grant.token, grant);
    }

    fn malformed(&mut self, text: String) {
        self.violations.push(Violation::new(Rule::Malformed, Vec::new(), text));
    }

    fn session_ops(&self, session: SessionId) -> impl Iterator<Item = &Op> {
        let ids = self.ops_of_session.get(&session).map_or(&[][..], Vec::as_slice);
        ids.iter().map(|id| &self.ops[id])
    }

    /// The acquires of `session` on the hold's semaphore, sent before `seen`, that may have
    /// produced this hold: every one except those answered, before `seen`, with a refusal or
    /// another grant.
    fn candidates(&self, session: SessionId, hold: &SeenHold, seen: Point) -> Vec<&Op> {
        self.session_ops(session)
            .filter(|op| op.invoked < seen)
            .filter(|op| matches!(&op.operation, Operation::Acquire { key, .. } if *key == hold.key))
            .filter(|op| match &op.answer {
                None => true,
                Some((acked, _)) if *acked >= seen => true,
                Some((_, Answer::Waiting)) => true,
                Some((_, Answer::Acquired { token, .. })) => *token == hold.token,
                Some(_) => false,
            })
            .collect()
    }
}

/// Sorts and merges overlapping or touching intervals.
fn merged(mut intervals: Vec<(Point, Point)>) -> Vec<(Point, Point)> {
    intervals.sort();
    let mut out: Vec<(Point, Point)> = Vec::with_capacity(intervals.len());
    for (start, end) in intervals {
        match out.last_mut() {
            Some((_, last_end)) if start <= *last_end => *last_end = (*last_end).max(end),
            _ => out.push((start, end)),
        }
    }
    out
}
