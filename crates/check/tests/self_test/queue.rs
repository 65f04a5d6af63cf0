//! Q1-Q4: the work queue promises.

use permit_check::{check_queues, ClockAllowance, FinalItem, Invariant, QueueFinal};

use crate::support::{assert_one_violation, assert_passes, Script};

const EXACT: ClockAllowance = ClockAllowance { rate_error: 0.0, margin_ns: 0 };

fn drained() -> QueueFinal {
    QueueFinal { queue: "q".into(), drained: true, ..QueueFinal::default() }
}

/// Two consumers with TTL 1 s sessions; item 1 is pushed, claimed by `a`, nacked, claimed by
/// `b`, acked.
fn nack_then_ack() -> Script {
    let mut script = Script::new();
    script.create(1, "a", 1000, (0, 10));
    script.create(2, "b", 1000, (0, 10));
    script.push(3, "q", "\"x\"", (20, 30), "1");
    script.claim(1, "a", "q", ("1", "\"x\"", 5), (40, 50));
    script.nack(1, "a", "q", "1", 5, (60, 70));
    script.claim(2, "b", "q", ("1", "\"x\"", 8), (80, 90));
    script.ack(2, "b", "q", "1", 8, (100, 110));
    script
}

#[test]
fn a_nacked_item_claimed_again_and_acked_passes() {
    let report = check_queues(&nack_then_ack().history(), &[drained()], EXACT);
    assert_passes(&report);
    assert_eq!(report.checked, 3, "one push and two claims");
}

#[test]
fn a_second_ack_of_one_item_is_a_violation() {
    let mut script = nack_then_ack();
    let again = script.claim(1, "a", "q", ("1", "\"x\"", 12), (120, 130));
    let second = script.ack(1, "a", "q", "1", 12, (140, 150));
    let report = check_queues(&script.history(), &[drained()], EXACT);
    assert_eq!(report.violations.len(), 2, "{report}");
    assert!(report.violations.iter().all(|v| v.invariant == Invariant::AckedOnce), "{report}");
    assert!(report.violations.iter().any(|v| v.ops.contains(&second)), "{report}");
    assert!(report.violations.iter().any(|v| v.ops.contains(&again)), "{report}");
}

#[test]
fn a_claim_while_another_session_still_holds_the_item_is_a_violation() {
    let mut script = Script::new();
    script.create(1, "a", 1000, (0, 10));
    script.create(2, "b", 1000, (0, 10));
    script.push(3, "q", "\"x\"", (20, 30), "1");
    let first = script.claim(1, "a", "q", ("1", "\"x\"", 5), (40, 50));
    // `a` still has 900 ms of lease left when `b` gets the same item.
    let second = script.claim(2, "b", "q", ("1", "\"x\"", 8), (80, 90));
    script.ack(2, "b", "q", "1", 8, (100, 110));
    let report = check_queues(&script.history(), &[drained()], EXACT);
    assert_one_violation(&report, Invariant::OneLiveClaim, &[first, second]);
}

#[test]
fn a_claim_after_the_first_session_lapsed_passes() {
    let mut script = Script::new();
    script.create(1, "a", 1000, (0, 10));
    script.create(2, "b", 10_000, (0, 10));
    script.push(3, "q", "\"x\"", (20, 30), "1");
    script.claim(1, "a", "q", ("1", "\"x\"", 5), (40, 50));
    // `a` vanished; its lease ran out at 1000 ms.
    script.claim(2, "b", "q", ("1", "\"x\"", 8), (1200, 1210));
    script.ack(2, "b", "q", "1", 8, (1300, 1310));
    assert_passes(&check_queues(&script.history(), &[drained()], EXACT));
}

#[test]
fn a_later_claim_with_a_smaller_token_is_a_violation() {
    let mut script = Script::new();
    script.create(1, "a", 1000, (0, 10));
    script.create(2, "b", 1000, (0, 10));
    script.push(3, "q", "\"x\"", (20, 30), "1");
    let first = script.claim(1, "a", "q", ("1", "\"x\"", 9), (40, 50));
    script.nack(1, "a", "q", "1", 9, (60, 70));
    let second = script.claim(2, "b", "q", ("1", "\"x\"", 8), (80, 90));
    script.ack(2, "b", "q", "1", 8, (100, 110));
    let report = check_queues(&script.history(), &[drained()], EXACT);
    assert_one_violation(&report, Invariant::OneLiveClaim, &[first, second]);
}

#[test]
fn an_acknowledged_push_that_vanished_is_a_violation_unless_queued_or_dead() {
    let mut script = nack_then_ack();
    let lost = script.push(3, "q", "\"y\"", (200, 210), "2");
    let history = script.history();
    assert_one_violation(&check_queues(&history, &[drained()], EXACT), Invariant::PushKept, &[lost]);

    let item = FinalItem { id: "2".into(), payload: "\"y\"".into(), state: "pending".into() };
    let queued = QueueFinal { items: vec![item.clone()], drained: false, ..drained() };
    assert_passes(&check_queues(&history, std::slice::from_ref(&queued), EXACT));
    // Still there after a drain: kept, but not drained.
    let report = check_queues(&history, &[QueueFinal { drained: true, ..queued }], EXACT);
    assert_eq!(report.violations.len(), 1, "{report}");
    assert_eq!(report.violations[0].invariant, Invariant::Drained, "{report}");
    // Dead-lettered (a new id there; the payload names it).
    let dead = QueueFinal { dead: vec![FinalItem { id: "9".into(), ..item }], ..drained() };
    assert_passes(&check_queues(&history, &[dead], EXACT));
}

#[test]
fn a_claim_of_something_nobody_pushed_is_a_violation() {
    let mut script = nack_then_ack();
    script.create(4, "c", 1000, (0, 10));
    let forged = script.claim(4, "c", "q", ("7", "\"z\"", 20), (200, 210));
    script.ack(4, "c", "q", "7", 20, (220, 230));
    let report = check_queues(&script.history(), &[drained()], EXACT);
    assert_one_violation(&report, Invariant::PushKept, &[forged]);
}

#[test]
fn a_queue_without_a_final_read_or_traffic_is_reported() {
    let history = nack_then_ack().history();
    assert!(!check_queues(&history, &[], EXACT).is_ok());
    let empty = Script::new().history();
    let report = check_queues(&empty, &[drained()], EXACT);
    assert_eq!(report.violations.len(), 2, "no push and no ack seen: {report}");
}
