//! I2: the protected resource accepts no stale token and loses no update.

use permit_check::{check_fenced_counter, check_fencing, check_write_rejected, Invariant};

use crate::support::{assert_one_violation, assert_passes, Script};

#[test]
fn writes_with_growing_or_equal_tokens_pass() {
    let mut script = Script::new();
    script.write(1, "a", "counter", 3, (0, 10), true);
    script.write(1, "a", "counter", 3, (20, 30), true);
    script.write(2, "b", "counter", 5, (40, 50), true);
    script.write(1, "a", "counter", 3, (60, 70), false);
    let report = check_fencing(&script.history());
    assert_passes(&report);
    assert_eq!(report.checked, 3);
}

#[test]
fn a_stale_fenced_write_accepted_is_a_violation() {
    let mut script = Script::new();
    script.write(1, "a", "counter", 3, (0, 10), true);
    let fresh = script.write(2, "b", "counter", 5, (20, 30), true);
    let stale = script.write(1, "a", "counter", 3, (40, 50), true);
    let report = check_fencing(&script.history());
    assert_one_violation(&report, Invariant::Fencing, &[fresh, stale]);
    assert!(report.violations[0].message.contains("token 3"), "{report}");
}

#[test]
fn resources_are_checked_apart_and_overlapping_writes_are_not_compared() {
    let mut script = Script::new();
    script.write(1, "a", "counter-db", 5, (0, 10), true);
    script.write(2, "b", "counter-jobs", 3, (20, 30), true);
    script.write(3, "c", "counter-db", 7, (40, 60), true);
    script.write(1, "a", "counter-db", 5, (50, 70), true);
    assert_passes(&check_fencing(&script.history()));
}

#[test]
fn a_lost_update_on_the_fenced_counter_is_a_violation() {
    let mut script = Script::new();
    script.write(1, "a", "counter", 3, (0, 10), true);
    script.write(2, "b", "counter", 5, (20, 30), true);
    script.write(1, "a", "counter", 3, (40, 50), false);
    let history = script.history();
    assert_passes(&check_fenced_counter(&history, "counter", 2));
    let lost = check_fenced_counter(&history, "counter", 1);
    assert_one_violation(&lost, Invariant::Fencing, &[]);
    assert!(lost.violations[0].message.contains("lost updates"), "{lost}");
    assert!(!check_fenced_counter(&history, "counter", 3).is_ok());
}

#[test]
fn unknown_writes_may_or_may_not_count_on_the_counter() {
    let mut script = Script::new();
    script.write(1, "a", "counter", 3, (0, 10), true);
    script.write_unknown(2, "b", "counter", 5, 20);
    let history = script.history();
    assert_passes(&check_fenced_counter(&history, "counter", 1));
    assert_passes(&check_fenced_counter(&history, "counter", 2));
    assert!(!check_fenced_counter(&history, "counter", 3).is_ok());
}

#[test]
fn the_late_write_of_a_paused_client_must_be_rejected() {
    let mut script = Script::new();
    let rejected = script.write(1, "a", "counter", 3, (0, 10), false);
    let accepted = script.write(2, "b", "counter", 3, (20, 30), true);
    let unknown = script.write_unknown(3, "c", "counter", 3, 40);
    let history = script.history();
    assert_passes(&check_write_rejected(&history, rejected));
    assert_one_violation(&check_write_rejected(&history, accepted), Invariant::Fencing, &[accepted]);
    assert_one_violation(&check_write_rejected(&history, unknown), Invariant::Fencing, &[unknown]);
    assert_one_violation(&check_write_rejected(&history, 99), Invariant::Fencing, &[99]);
}
