//! The history checker can fail: a real recorded history passes, and each known kind of bug,
//! planted into a copy of it, is reported.

use std::sync::OnceLock;
use std::time::Duration;

use permit_core::{Key, Name, SessionId};
use permit_sim::checker::{self, Facts, Rule};
use permit_sim::history::{Answer, Event, History, Operation, DRIVER};
use permit_sim::{Run, Settings};

/// A fake session planted by the tests; no client draws these bytes.
const FAKE_SESSION: SessionId = SessionId::from_bytes([0xfa; 16]);

/// One short fault-free simulation, shared by every test here.
fn recorded() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let settings =
            Settings { simulated: Duration::from_secs(10), clients: 5, faults: false, lying_disk: false };
        let run = permit_sim::run(42, &settings);
        assert!(!run.failed(), "{}", run.report());
        run
    })
}

/// The index of the record at which the grant with `token` was first seen.
fn index_of_sighting(history: &History, facts: &Facts, token: u64) -> usize {
    let seen = facts.grants[&token].seen;
    history.records.iter().position(|record| record.point == seen).expect("the sighting is recorded")
}

/// A grant that some client relies on for a while, and the index of its sighting.
fn relied_grant(history: &History) -> (usize, permit_sim::checker::facts::Grant) {
    let facts = Facts::of(history);
    let grant = facts
        .grants
        .values()
        .find(|grant| facts.reliance(grant).first().is_some_and(|(start, _)| *start == grant.seen))
        .expect("a fault-free run relies on some grant")
        .clone();
    (index_of_sighting(history, &facts, grant.token), grant)
}

/// Plants, before `index`, a fake session with a long lease that acquires `permits` of `key`
/// and is told `token`.
fn plant_grant(history: &mut History, index: usize, key: &Key, permits: u64, token: u64) {
    let events = [
        Event::Invoked {
            op: 1_000_001,
            node: 0,
            operation: Operation::CreateSession { session: FAKE_SESSION, ttl_ms: 600_000 },
        },
        Event::Acked { op: 1_000_001, answer: Answer::SessionCreated },
        Event::Invoked {
            op: 1_000_002,
            node: 0,
            operation: Operation::Acquire {
                session: FAKE_SESSION,
                key: key.clone(),
                permits,
                wait: false,
                max_hold_ms: None,
            },
        },
        Event::Acked { op: 1_000_002, answer: Answer::Acquired { permits, token } },
    ];
    for (offset, event) in events.into_iter().enumerate() {
        history.insert(index + offset, DRIVER, event);
    }
}

fn assert_reports(history: &History, rule: Rule, session: SessionId) {
    let violations = checker::check(history);
    assert!(
        violations.iter().any(|violation| violation.rule == rule && violation.sessions.contains(&session)),
        "expected a {rule:?} violation involving {session}, got {violations:#?}"
    );
}

#[test]
fn a_recorded_history_passes_the_checker() {
    let violations = checker::check(&recorded().history);
    assert!(violations.is_empty(), "{violations:#?}");
}

#[test]
fn a_grant_over_capacity_is_reported() {
    let mut history = recorded().history.clone();
    let (index, grant) = relied_grant(&history);
    let facts = Facts::of(&history);
    let capacity_max =
        facts.capacities(&grant.key).iter().map(|(_, capacity)| *capacity).max().expect("sent");
    plant_grant(&mut history, index + 1, &grant.key, capacity_max, u64::MAX - 1);
    assert_reports(&history, Rule::Capacity, FAKE_SESSION);
}

#[test]
fn a_token_smaller_than_one_acknowledged_before_is_reported() {
    let mut history = recorded().history.clone();
    let (index, _) = relied_grant(&history);
    let key = Key::semaphore(Name::new("planted").expect("valid name"));
    history.insert(
        index + 1,
        DRIVER,
        Event::Invoked {
            op: 1_000_000,
            node: 0,
            operation: Operation::PutSemaphore { key: key.clone(), capacity: 1 },
        },
    );
    // Token 0 is below every token ever granted, so below the grant acknowledged just before.
    plant_grant(&mut history, index + 2, &key, 1, 0);
    assert_reports(&history, Rule::TokenOrder, FAKE_SESSION);
}

#[test]
fn a_token_given_to_two_holders_is_reported() {
    let mut history = recorded().history.clone();
    let (index, grant) = relied_grant(&history);
    plant_grant(&mut history, index + 1, &grant.key, 1, grant.token);
    assert_reports(&history, Rule::TokenIdentity, FAKE_SESSION);
}

#[test]
fn a_read_that_lost_an_acknowledged_hold_is_reported() {
    let mut history = recorded().history.clone();
    let facts = Facts::of(&history);
    let lossy = history.records.iter_mut().find(|record| match &record.event {
        Event::Observed { session, holds, .. } => holds.iter().any(|hold| {
            let grant = &facts.grants[&hold.token];
            grant.session == *session
                && facts
                    .reliance(grant)
                    .iter()
                    .any(|(start, end)| *start < record.point && record.point < *end)
        }),
        _ => false,
    });
    let Some(record) = lossy else { panic!("a fault-free run reads a relied-on hold") };
    let Event::Observed { session, holds, .. } = &mut record.event else { unreachable!("matched above") };
    let session = *session;
    holds.clear();
    assert_reports(&history, Rule::Durability, session);
}

#[test]
fn a_session_missing_while_its_lease_holds_is_reported() {
    let mut history = recorded().history.clone();
    let (index, grant) = relied_grant(&history);
    history.insert(index + 1, DRIVER, Event::SessionMissing { session: grant.session });
    assert_reports(&history, Rule::Lease, grant.session);
}
