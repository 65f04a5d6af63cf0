//! Grants (acknowledged acquires, with idempotent repeats folded in) and the calls that end
//! holds, shared by the capacity, token and durability checkers.

use std::collections::HashMap;

use crate::history::{History, Op, OpId, OpKind};

/// One grant: every `Ok` acquire of one (semaphore, session, token). A repeated acquire by the
/// same session returns its grant's own token, so it is the same grant.
#[derive(Clone, Debug)]
pub(crate) struct Grant<'h> {
    pub semaphore: &'h str,
    pub session: &'h str,
    pub token: u64,
    pub permits: u64,
    /// The earliest completion among the grant's acquires: when a client first knew.
    pub ack_ns: u64,
    /// The acquire answered at `ack_ns`.
    pub op: OpId,
    /// Every `Ok` acquire of the grant, by invoke time.
    pub acquires: Vec<&'h Op>,
}

/// Groups every well-formed `Ok` acquire (with a token and a completion) into grants, sorted
/// by `ack_ns`.
pub(crate) fn grants(history: &History) -> Vec<Grant<'_>> {
    let mut groups: HashMap<(&str, &str, u64), Vec<&Op>> = HashMap::new();
    for op in history.ops() {
        if let (OpKind::Acquire, true, Some(token), Some(_)) =
            (&op.kind, op.is_ok(), op.token, op.complete_ns)
        {
            groups.entry((op.semaphore.as_str(), op.session.as_str(), token)).or_default().push(op);
        }
    }
    let mut grants: Vec<Grant> = groups
        .into_iter()
        .map(|((semaphore, session, token), mut acquires)| {
            acquires.sort_by_key(|op| (op.invoke_ns, op.id));
            let first = acquires.iter().min_by_key(|op| (op.complete_or_infinity_ns(), op.id)).unwrap();
            let (ack_ns, op, permits) = (first.complete_or_infinity_ns(), first.id, first.permits);
            Grant { semaphore, session, token, permits, ack_ns, op, acquires }
        })
        .collect();
    grants.sort_by_key(|grant| (grant.ack_ns, grant.op));
    grants
}

/// A release or session close: a call after which a hold may be gone.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HoldEnd {
    pub invoke_ns: u64,
    pub complete_ns: u64,
    pub op: OpId,
}

/// Releases per (session, semaphore) and closes per session, sorted by invoke time.
#[derive(Debug, Default)]
pub(crate) struct HoldEnds<'h> {
    releases: HashMap<(&'h str, &'h str), Vec<HoldEnd>>,
    closes: HashMap<&'h str, Vec<HoldEnd>>,
}

impl<'h> HoldEnds<'h> {
    /// Indexes the releases and closes that `include` accepts.
    pub fn new(history: &'h History, include: impl Fn(&Op) -> bool) -> HoldEnds<'h> {
        let mut ends = HoldEnds::default();
        for op in history.ops().iter().filter(|op| include(op)) {
            let end =
                HoldEnd { invoke_ns: op.invoke_ns, complete_ns: op.complete_or_infinity_ns(), op: op.id };
            match op.kind {
                OpKind::Release => {
                    ends.releases.entry((op.session.as_str(), op.semaphore.as_str())).or_default().push(end)
                }
                OpKind::CloseSession => ends.closes.entry(op.session.as_str()).or_default().push(end),
                _ => {}
            }
        }
        for list in ends.releases.values_mut().chain(ends.closes.values_mut()) {
            list.sort_by_key(|end| (end.invoke_ns, end.op));
        }
        ends
    }

    /// The first release of `session`'s hold on `semaphore`, or close of `session`, invoked at
    /// or after `t_ns`.
    pub fn first_from(&self, session: &str, semaphore: &str, t_ns: u64) -> Option<HoldEnd> {
        let release = self.releases.get(&(session, semaphore)).and_then(|list| first_from(list, t_ns));
        let close = self.closes.get(session).and_then(|list| first_from(list, t_ns));
        match (release, close) {
            (Some(release), Some(close)) => {
                Some(if close.invoke_ns < release.invoke_ns { close } else { release })
            }
            (release, close) => release.or(close),
        }
    }

    /// Every release of `session`'s hold on `semaphore` and close of `session`, by invoke.
    pub fn all(&self, session: &str, semaphore: &str) -> Vec<HoldEnd> {
        let releases = self.releases.get(&(session, semaphore)).into_iter().flatten();
        let closes = self.closes.get(session).into_iter().flatten();
        let mut all: Vec<HoldEnd> = releases.chain(closes).copied().collect();
        all.sort_by_key(|end| (end.invoke_ns, end.op));
        all
    }
}

fn first_from(list: &[HoldEnd], t_ns: u64) -> Option<HoldEnd> {
    list.get(list.partition_point(|end| end.invoke_ns < t_ns)).copied()
}
