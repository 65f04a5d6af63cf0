//! I1: usable permits never exceed capacity.

use permit_check::{check_capacity, ClockAllowance, Invariant, Report};

use crate::support::{assert_one_violation, assert_passes, capacities, Script};

/// Capacity 1 on `db`, 2 on `pool`; ε = 5 %, δ = 50 ms (so a 1 s TTL is trusted for 900 ms).
fn check(script: &Script) -> Report {
    check_capacity(&script.history(), &capacities(&[("db", 1), ("pool", 2)]), ClockAllowance::default())
}

/// Session "a" created at 0 ms; session "b" is created `b_created_ms` later, so that its own
/// deadline never ends its hold first.
fn two_sessions(ttl_ms: u64, b_created_ms: u64) -> Script {
    let mut script = Script::new();
    script.create(1, "a", ttl_ms, (0, 5));
    script.create(2, "b", ttl_ms, (b_created_ms, b_created_ms + 5));
    script
}

#[test]
fn double_grant_over_capacity_is_a_violation() {
    let mut script = two_sessions(10_000, 0);
    let first = script.acquire(1, "a", "db", 1, (10, 20), 1);
    let second = script.acquire(2, "b", "db", 1, (30, 40), 2);
    let report = check(&script);
    assert_one_violation(&report, Invariant::Capacity, &[first, second]);
    assert!(report.violations[0].message.contains("2 permits usable at 0.040000s"), "{report}");
    assert_eq!(report.checked, 2);
}

#[test]
fn weighted_grants_within_capacity_pass_and_one_more_permit_does_not() {
    let mut script = two_sessions(10_000, 0);
    script.acquire(1, "a", "pool", 1, (10, 20), 1);
    script.acquire(2, "b", "pool", 1, (10, 20), 2);
    assert_passes(&check(&script));
    script.create(3, "c", 10_000, (0, 5));
    script.acquire(3, "c", "pool", 1, (30, 40), 3);
    assert_eq!(check(&script).violations.len(), 1);
}

#[test]
fn a_hold_used_past_its_conservative_deadline_is_not_counted_after_it() {
    // "a" is paused and never keeps alive: it may rely on its hold until 900 ms only. The server
    // expires it at 1000 ms and grants "b" at 1100 ms.
    let mut script = two_sessions(1000, 1090);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.acquire(2, "b", "db", 1, (1100, 1110), 2);
    assert_passes(&check(&script));
}

#[test]
fn a_regrant_before_the_conservative_deadline_is_a_violation() {
    let mut script = two_sessions(1000, 0);
    let held = script.acquire(1, "a", "db", 1, (10, 20), 1);
    let early = script.acquire(2, "b", "db", 1, (500, 510), 2);
    assert_one_violation(&check(&script), Invariant::Capacity, &[held, early]);
}

#[test]
fn an_acknowledged_keepalive_extends_the_hold_from_its_send_time() {
    let mut script = two_sessions(1000, 1090);
    let held = script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.keepalive(1, "a", (800, 810)); // trusted until 800 + 900 = 1700 ms
    let regrant = script.acquire(2, "b", "db", 1, (1100, 1110), 2);
    assert_one_violation(&check(&script), Invariant::Capacity, &[held, regrant]);
}

#[test]
fn a_keepalive_answered_after_the_deadline_comes_too_late_to_extend_the_hold() {
    let mut script = two_sessions(1000, 1090);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.keepalive(1, "a", (850, 950)); // answered after the 900 ms deadline
    script.acquire(2, "b", "db", 1, (1100, 1110), 2);
    assert_passes(&check(&script));
}

#[test]
fn a_hold_ends_when_its_release_is_sent() {
    let mut script = two_sessions(10_000, 0);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.release(1, "a", "db", (30, 60), 1);
    // Granted while the release was still in flight: fine, "a" stopped relying at 30 ms.
    script.acquire(2, "b", "db", 1, (35, 40), 2);
    assert_passes(&check(&script));
}

#[test]
fn closing_the_session_ends_its_holds() {
    let mut script = two_sessions(10_000, 0);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.close(1, "a", (30, 40));
    script.acquire(2, "b", "db", 1, (50, 60), 2);
    assert_passes(&check(&script));
}

#[test]
fn an_idempotent_repeat_is_the_same_grant() {
    let mut script = two_sessions(10_000, 0);
    script.acquire(1, "a", "db", 1, (10, 20), 7);
    script.acquire(1, "a", "db", 1, (30, 40), 7);
    let report = check(&script);
    assert_passes(&report);
    assert_eq!(report.checked, 1);
}

#[test]
fn unknown_acquires_are_not_counted() {
    let mut script = two_sessions(10_000, 0);
    script.acquire_unknown(1, "a", "db", 1, 10);
    script.acquire(2, "b", "db", 1, (30, 40), 2);
    assert_passes(&check(&script));
}

#[test]
fn a_server_clock_running_3x_fast_shows_as_a_capacity_violation() {
    // A 3× clock expires a 1 s session after 333 ms of harness time and grants it again.
    let mut script = two_sessions(1000, 0);
    let held = script.acquire(1, "a", "db", 1, (10, 20), 1);
    let regrant = script.acquire(2, "b", "db", 1, (340, 350), 2);
    assert_one_violation(&check(&script), Invariant::Capacity, &[held, regrant]);
}

#[test]
fn the_clock_allowance_decides_whether_a_slightly_fast_clock_is_tolerated() {
    // A server clock 4 % fast expires the session at ~962 ms; the client stopped at 900 ms.
    let mut script = two_sessions(1000, 950);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.acquire(2, "b", "db", 1, (962, 970), 2);
    assert_passes(&check(&script));
    let exact = ClockAllowance { rate_error: 0.0, margin_ns: 0 };
    let report = check_capacity(&script.history(), &capacities(&[("db", 1)]), exact);
    assert_eq!(report.violations.len(), 1, "with no allowance the client trusts it until 1000 ms");
}

#[test]
fn a_grant_to_an_unknown_session_or_semaphore_is_reported_not_skipped() {
    let mut script = Script::new();
    let orphan = script.acquire(1, "ghost", "db", 1, (10, 20), 1);
    script.create(2, "b", 10_000, (0, 5));
    let unlisted = script.acquire(2, "b", "elsewhere", 1, (10, 20), 2);
    let report = check(&script);
    assert_eq!(report.violations.len(), 2, "{report}");
    assert!(report.violations.iter().all(|violation| violation.invariant == Invariant::WellFormed));
    assert_eq!(report.violations[0].ops, vec![orphan]);
    assert_eq!(report.violations[1].ops, vec![unlisted]);
}
