//! Hand-made histories, written in milliseconds.

use std::collections::BTreeMap;

use permit_check::{Completion, History, Holder, Invariant, Invocation, Op, OpId, Report, UNAVAILABLE};

/// One millisecond in the recorder's nanoseconds.
pub const MS: u64 = 1_000_000;

/// A history under construction. Every call takes its `(invoke_ms, complete_ms)` and returns
/// the op id, which is the op's position.
#[derive(Default)]
pub struct Script {
    ops: Vec<Op>,
}

impl Script {
    pub fn new() -> Script {
        Script::default()
    }

    pub fn history(&self) -> History {
        self.ops.iter().cloned().collect()
    }

    pub fn create(&mut self, client: u32, session: &str, ttl_ms: u64, at: (u64, u64)) -> OpId {
        let answer = Completion { session: Some(session.to_owned()), ..Completion::ok() };
        self.answered(Invocation::create_session(client, ttl_ms), at, answer)
    }

    pub fn keepalive(&mut self, client: u32, session: &str, at: (u64, u64)) -> OpId {
        self.answered(Invocation::keepalive(client, session), at, Completion::ok())
    }

    pub fn acquire(
        &mut self,
        client: u32,
        session: &str,
        semaphore: &str,
        permits: u64,
        at: (u64, u64),
        token: u64,
    ) -> OpId {
        let answer = Completion { token: Some(token), ..Completion::ok() };
        self.answered(Invocation::acquire(client, session, semaphore, permits), at, answer)
    }

    pub fn unavailable(
        &mut self,
        client: u32,
        session: &str,
        semaphore: &str,
        permits: u64,
        at: (u64, u64),
    ) -> OpId {
        self.answered(
            Invocation::acquire(client, session, semaphore, permits),
            at,
            Completion::fail(UNAVAILABLE),
        )
    }

    pub fn acquire_unknown(
        &mut self,
        client: u32,
        session: &str,
        semaphore: &str,
        permits: u64,
        invoke_ms: u64,
    ) -> OpId {
        self.unanswered(Invocation::acquire(client, session, semaphore, permits), invoke_ms)
    }

    pub fn release(
        &mut self,
        client: u32,
        session: &str,
        semaphore: &str,
        at: (u64, u64),
        released: u64,
    ) -> OpId {
        let answer = Completion { released: Some(released), ..Completion::ok() };
        self.answered(Invocation::release(client, session, semaphore), at, answer)
    }

    pub fn release_unknown(&mut self, client: u32, session: &str, semaphore: &str, invoke_ms: u64) -> OpId {
        self.unanswered(Invocation::release(client, session, semaphore), invoke_ms)
    }

    pub fn close(&mut self, client: u32, session: &str, at: (u64, u64)) -> OpId {
        self.answered(Invocation::close_session(client, session), at, Completion::ok())
    }

    pub fn describe(
        &mut self,
        client: u32,
        semaphore: &str,
        at: (u64, u64),
        holders: &[(&str, u64, u64)],
    ) -> OpId {
        let holders = holders
            .iter()
            .map(|&(session, permits, token)| Holder { session: session.to_owned(), permits, token })
            .collect();
        self.answered(Invocation::describe(client, semaphore), at, Completion { holders, ..Completion::ok() })
    }

    pub fn validate(
        &mut self,
        client: u32,
        semaphore: &str,
        token: u64,
        at: (u64, u64),
        valid: bool,
    ) -> OpId {
        let answer = Completion { valid: Some(valid), ..Completion::ok() };
        self.answered(Invocation::validate(client, semaphore, token), at, answer)
    }

    pub fn write(
        &mut self,
        client: u32,
        session: &str,
        resource: &str,
        token: u64,
        at: (u64, u64),
        accepted: bool,
    ) -> OpId {
        let answer = if accepted { Completion::ok() } else { Completion::fail("stale_token") };
        self.answered(Invocation::fenced_write(client, session, resource, token), at, answer)
    }

    pub fn write_unknown(
        &mut self,
        client: u32,
        session: &str,
        resource: &str,
        token: u64,
        invoke_ms: u64,
    ) -> OpId {
        self.unanswered(Invocation::fenced_write(client, session, resource, token), invoke_ms)
    }

    pub fn push(&mut self, client: u32, queue: &str, payload: &str, at: (u64, u64), item: &str) -> OpId {
        let answer = Completion { item: Some(item.to_owned()), ..Completion::ok() };
        self.answered(Invocation::push(client, queue, payload), at, answer)
    }

    /// A claim that took `item` (with `payload`) under `token`; `request_id` is `token`.
    pub fn claim(
        &mut self,
        client: u32,
        session: &str,
        queue: &str,
        (item, payload, token): (&str, &str, u64),
        at: (u64, u64),
    ) -> OpId {
        let answer = Completion {
            item: Some(item.to_owned()),
            payload: Some(payload.to_owned()),
            token: Some(token),
            attempt: Some(1),
            ..Completion::ok()
        };
        self.answered(Invocation::claim(client, session, queue, token), at, answer)
    }

    pub fn ack(
        &mut self,
        client: u32,
        session: &str,
        queue: &str,
        item: &str,
        token: u64,
        at: (u64, u64),
    ) -> OpId {
        self.answered(Invocation::ack(client, session, queue, item, token), at, Completion::ok())
    }

    pub fn nack(
        &mut self,
        client: u32,
        session: &str,
        queue: &str,
        item: &str,
        token: u64,
        at: (u64, u64),
    ) -> OpId {
        self.answered(Invocation::nack(client, session, queue, item, token), at, Completion::ok())
    }

    /// Marks which node answered op `id`.
    pub fn answered_by(&mut self, id: OpId, node: u64) {
        self.ops[id as usize].node = Some(node);
    }

    fn answered(
        &mut self,
        invocation: Invocation,
        (invoke_ms, complete_ms): (u64, u64),
        answer: Completion,
    ) -> OpId {
        let id = self.ops.len() as OpId;
        let mut op = Op::invoked(id, invocation, invoke_ms * MS);
        op.complete(complete_ms * MS, answer);
        self.ops.push(op);
        id
    }

    fn unanswered(&mut self, invocation: Invocation, invoke_ms: u64) -> OpId {
        let id = self.ops.len() as OpId;
        self.ops.push(Op::invoked(id, invocation, invoke_ms * MS));
        id
    }
}

pub fn capacities(pairs: &[(&str, u64)]) -> BTreeMap<String, u64> {
    pairs.iter().map(|&(name, capacity)| (name.to_owned(), capacity)).collect()
}

/// Asserts the report passed, printing it otherwise.
#[track_caller]
pub fn assert_passes(report: &Report) {
    assert!(report.is_ok(), "expected no violation, got: {report}");
}

/// Asserts exactly one violation, of `invariant`, naming `ops` (in any order).
#[track_caller]
pub fn assert_one_violation(report: &Report, invariant: Invariant, ops: &[OpId]) {
    assert_eq!(report.violations.len(), 1, "expected one violation, got: {report}");
    let violation = &report.violations[0];
    assert_eq!(violation.invariant, invariant, "{report}");
    let mut named = violation.ops.clone();
    named.sort_unstable();
    let mut expected = ops.to_vec();
    expected.sort_unstable();
    assert_eq!(named, expected, "{report}");
}
