//! The history checker can fail: a real recorded history passes, and each known kind of bug,
//! planted into a copy of it, is reported.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use permit_check::Invariant;
use permit_core::{EventKind, Key, Name, SessionId};
use permit_sim::applied::{Applied, Timed};
use permit_sim::checker::{self, Facts, Rule};
use permit_sim::history::{Answer, Event, History, Operation, QueuedItem, SeenItem, DRIVER};
use permit_sim::policies;
use permit_sim::{Run, Settings};

/// A fake session planted by the tests; no client draws these bytes.
const FAKE_SESSION: SessionId = SessionId::from_bytes([0xfa; 16]);

/// One short fault-free simulation, shared by every test here.
fn recorded() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        // 20 s: long enough for the slow policy traffic to be refused by the rate and to see
        // holds of the lock-delayed semaphore fail.
        let settings = Settings { simulated: Duration::from_secs(20), faults: false, ..Settings::default() };
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

/// The records of the first acknowledged ack of an item: the index of its answer, the item, the
/// session and the token.
fn acknowledged_ack(history: &History) -> (usize, u64, SessionId, u64) {
    let mut acks = std::collections::BTreeMap::new();
    for (index, record) in history.records.iter().enumerate() {
        match &record.event {
            Event::Invoked {
                op,
                operation: Operation::Settle { session, item, token, ack: true, .. },
                ..
            } => {
                acks.insert(*op, (*item, *session, *token));
            }
            Event::Acked { op, answer: Answer::Settled } if acks.contains_key(op) => {
                let (item, session, token) = acks[op];
                return (index, item, session, token);
            }
            _ => {}
        }
    }
    panic!("a fault-free run acks items")
}

fn queue() -> Name {
    Name::new(permit_sim::queue::QUEUE).expect("valid name")
}

fn assert_reports_queue(history: &History, invariant: Invariant, session: Option<SessionId>) {
    let violations = checker::check(history);
    assert!(
        violations.iter().any(|violation| violation.rule == Rule::Queue(invariant)
            && session.is_none_or(|session| violation.sessions.contains(&session))),
        "expected a {invariant:?} violation involving {session:?}, got {violations:#?}"
    );
}

#[test]
fn an_item_acked_twice_is_reported() {
    let mut history = recorded().history.clone();
    let (index, item, session, token) = acknowledged_ack(&history);
    let again = Operation::Settle { session, queue: queue(), item, token, ack: true };
    history.insert(index + 1, DRIVER, Event::Invoked { op: 1_000_010, node: 0, operation: again });
    history.insert(index + 2, DRIVER, Event::Acked { op: 1_000_010, answer: Answer::Settled });
    assert_reports_queue(&history, Invariant::AckedOnce, Some(session));
}

#[test]
fn a_second_live_claim_of_an_item_is_reported() {
    let mut history = recorded().history.clone();
    let (index, item, _, _) = acknowledged_ack(&history);
    // Right after the claim that the ack settles was answered, while its session relies on
    // it, another session gets the item.
    let claimed = history.records[..index]
        .iter()
        .rposition(|record| matches!(&record.event, Event::Acked { answer: Answer::Claimed(Some(seen)), .. } if seen.id == item))
        .expect("the acked item was claimed");
    let Event::Acked { answer: Answer::Claimed(Some(seen)), .. } = history.records[claimed].event.clone()
    else {
        unreachable!("matched above")
    };
    plant_claim(&mut history, claimed + 1, 1_000_011, seen);
    assert_reports_queue(&history, Invariant::OneLiveClaim, Some(FAKE_SESSION));
}

/// Plants, before `index`, a fake session with a long lease that claims `seen` with a token of
/// its own; its ops are numbered from `op`.
fn plant_claim(history: &mut History, index: usize, op: u64, seen: SeenItem) {
    let events = [
        Event::Invoked {
            op,
            node: 0,
            operation: Operation::CreateSession { session: FAKE_SESSION, ttl_ms: 600_000 },
        },
        Event::Acked { op, answer: Answer::SessionCreated },
        Event::Invoked {
            op: op + 1,
            node: 0,
            operation: Operation::Claim { session: FAKE_SESSION, queue: queue(), request: op },
        },
        Event::Acked { op: op + 1, answer: Answer::Claimed(Some(SeenItem { token: u64::MAX - op, ..seen })) },
    ];
    for (offset, event) in events.into_iter().enumerate() {
        history.insert(index + offset, DRIVER, event);
    }
}

/// The first acknowledged ack that claimed an item next: the index of its answer, the item it
/// acked (with its session and token) and the item it claimed.
fn acknowledged_ack_and_claim(history: &History) -> (usize, u64, SessionId, u64, SeenItem) {
    let mut sent = BTreeMap::new();
    for (index, record) in history.records.iter().enumerate() {
        match &record.event {
            Event::Invoked { op, operation: Operation::AckAndClaim { session, item, token, .. }, .. } => {
                sent.insert(*op, (*item, *session, *token));
            }
            Event::Acked { op, answer: Answer::Claimed(Some(next)) } if sent.contains_key(op) => {
                let (item, session, token) = sent[op];
                return (index, item, session, token, next.clone());
            }
            _ => {}
        }
    }
    panic!("a fault-free run acks items with an ack that claims the next")
}

/// The ack half of an ack that claims next counts as an ack: a second ack of its item is
/// reported.
#[test]
fn an_item_acked_by_an_ack_that_claims_and_acked_again_is_reported() {
    let mut history = recorded().history.clone();
    let (index, item, session, token, _) = acknowledged_ack_and_claim(&history);
    let again = Operation::Settle { session, queue: queue(), item, token, ack: true };
    history.insert(index + 1, DRIVER, Event::Invoked { op: 1_000_020, node: 0, operation: again });
    history.insert(index + 2, DRIVER, Event::Acked { op: 1_000_020, answer: Answer::Settled });
    assert_reports_queue(&history, Invariant::AckedOnce, Some(session));
}

/// The claim half of an ack that claims next is a claim: another session's claim of the item it
/// took, while it is relied on, is reported.
#[test]
fn a_second_live_claim_of_an_item_an_ack_claimed_is_reported() {
    let mut history = recorded().history.clone();
    let (index, _, _, _, next) = acknowledged_ack_and_claim(&history);
    plant_claim(&mut history, index + 1, 1_000_021, next);
    assert_reports_queue(&history, Invariant::OneLiveClaim, Some(FAKE_SESSION));
}

#[test]
fn an_acknowledged_push_that_vanished_is_reported() {
    let mut history = recorded().history.clone();
    let (_, item, _, _) = acknowledged_ack(&history);
    // Every ack of the item said `claim_lost`: nothing acked it, and the final read lacks it.
    let acks: Vec<u64> = history
        .records
        .iter()
        .filter_map(|record| match &record.event {
            Event::Invoked { op, operation: Operation::Settle { item: i, ack: true, .. }, .. }
                if *i == item =>
            {
                Some(*op)
            }
            _ => None,
        })
        .collect();
    for record in &mut history.records {
        if let Event::Acked { op, answer } = &mut record.event {
            if acks.contains(op) {
                *answer = Answer::Refused("claim_lost".into());
            }
        }
    }
    assert_reports_queue(&history, Invariant::PushKept, None);
}

#[test]
fn an_item_left_after_the_drain_is_reported() {
    let mut history = recorded().history.clone();
    let read = history
        .records
        .iter_mut()
        .find_map(|record| match &mut record.event {
            Event::QueueRead { items, .. } => Some(items),
            _ => None,
        })
        .expect("the run reads the queue at the end");
    read.push(QueuedItem { id: u64::MAX, payload: "\"planted\"".into(), state: "pending" });
    assert_reports_queue(&history, Invariant::Drained, None);
}

/// The recorded run's committed log, re-applied.
fn applied() -> &'static Applied {
    recorded().applied.as_ref().expect("a fault-free run converges and re-applies its log")
}

fn rated() -> Key {
    Key::semaphore(Name::new(policies::RATED).expect("valid name"))
}

fn delayed() -> Key {
    Key::semaphore(Name::new(policies::DELAYED).expect("valid name"))
}

/// The leader time each node showed at each index, as the log has it (what a correct run shows).
fn seen(applied: &Applied) -> BTreeMap<(u64, u64), u64> {
    applied.leader_ms.iter().map(|(index, ms)| ((*index, *ms), 1)).collect()
}

fn rules(violations: &[checker::Violation]) -> Vec<Rule> {
    violations.iter().map(|violation| violation.rule).collect()
}

#[test]
fn a_recorded_log_passes_the_policy_checks_and_exercised_them() {
    let applied = applied();
    let violations = checker::check_applied(applied, &seen(applied));
    assert!(violations.is_empty(), "{violations:#?}");
    let count = |key: &Key, kind: EventKind| {
        applied.events.iter().filter(|event| event.key == *key && event.kind == kind).count()
    };
    assert!(count(&rated(), EventKind::Taken) > 0, "{:#?}", applied.events);
    let ended_by_failure = count(&delayed(), EventKind::Revoked) + count(&delayed(), EventKind::Expired);
    assert!(ended_by_failure > 0 && count(&delayed(), EventKind::Granted) > 1, "{:#?}", applied.events);
    let refused = recorded().history.records.iter().any(|record| {
        matches!(&record.event, Event::Acked { answer: Answer::Refused(why), .. } if why.contains("rate"))
    });
    assert!(refused, "the rate never refused a take: the checks would judge a rate that never binds");
}

/// One permit more than the rate allowed is caught: the real takes spend the rate up to its
/// bound somewhere, so one more take planted at the time of some real one breaks it.
#[test]
fn one_grant_beyond_the_rate_is_reported() {
    let applied = applied();
    let positions: Vec<usize> = (0..applied.events.len())
        .filter(|at| applied.events[*at].key == rated() && applied.events[*at].kind == EventKind::Taken)
        .collect();
    let caught = positions.iter().filter(|at| {
        let mut events = applied.events.clone();
        events.insert(**at + 1, events[**at].clone());
        rules(&checker::policies::rate(&events, &rated(), policies::RATE)) == [Rule::Rate]
    });
    assert!(caught.count() > 0, "no extra take at the time of a real one broke the rate");
}

/// A grant one ms inside the lock-delay after a failed hold is reported; one at its end is not.
#[test]
fn a_grant_within_the_lock_delay_is_reported() {
    let applied = applied();
    let at = applied
        .events
        .iter()
        .position(|event| {
            event.key == delayed() && matches!(event.kind, EventKind::Revoked | EventKind::Expired)
        })
        .expect("a hold of the lock-delayed semaphore failed");
    let ended = applied.events[at].clone();
    let mut early = applied.events.clone();
    let grant =
        Timed { kind: EventKind::Granted, at_ms: ended.at_ms + policies::LOCK_DELAY_MS - 1, ..ended.clone() };
    early.insert(at + 1, grant.clone());
    let violations = checker::policies::lock_delay(&early, &delayed(), policies::LOCK_DELAY_MS);
    assert_eq!(rules(&violations), [Rule::LockDelay], "{violations:#?}");
    let mut on_time = applied.events.clone();
    on_time.insert(at + 1, Timed { at_ms: grant.at_ms + 1, ..grant });
    assert!(checker::policies::lock_delay(&on_time, &delayed(), policies::LOCK_DELAY_MS).is_empty());
}

/// A node that showed a leader time other than the log's at some index is reported.
#[test]
fn a_node_whose_leader_time_went_back_is_reported() {
    let applied = applied();
    let mut seen = seen(applied);
    let (index, ms) = applied.leader_ms.iter().rev().find(|(_, ms)| **ms > 0).expect("time passed");
    seen.insert((*index, ms - 1), 2);
    assert_eq!(rules(&checker::check_applied(applied, &seen)), [Rule::LeaderTime]);
}

/// A grant of the lock-delayed semaphore answered before the revoke of the hold before it was
/// sent plus the lock-delay is reported from the history.
#[test]
fn a_grant_answered_within_the_lock_delay_after_a_revoke_is_reported() {
    let mut history = recorded().history.clone();
    let mut revokes = std::collections::BTreeMap::new();
    let answered = history.records.iter().enumerate().find_map(|(index, record)| match &record.event {
        Event::Invoked { op, operation: Operation::Revoke { key, token, .. }, .. } if *key == delayed() => {
            revokes.insert(*op, *token);
            None
        }
        Event::Acked { op, answer: Answer::Released { permits: 1 } } => {
            revokes.get(op).map(|token| (index, *token))
        }
        _ => None,
    });
    let (index, token) = answered.expect("a fault-free run revokes a hold of the lock-delayed semaphore");
    plant_grant(&mut history, index + 1, &delayed(), 1, token + 1_000_000);
    let violations = checker::check(&history);
    assert!(violations.iter().any(|violation| violation.rule == Rule::LockDelay), "{violations:#?}");
}
