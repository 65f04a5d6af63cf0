//! I3: tokens are unique and grow in real-time order.

use permit_check::{check_tokens, Invariant};

use crate::support::{assert_one_violation, assert_passes, Script};

#[test]
fn tokens_growing_in_real_time_order_across_semaphores_pass() {
    let mut script = Script::new();
    script.acquire(1, "a", "db", 1, (0, 10), 3);
    script.acquire(2, "b", "jobs", 1, (20, 30), 4);
    script.acquire(1, "a", "jobs", 1, (40, 50), 9);
    let report = check_tokens(&script.history());
    assert_passes(&report);
    assert_eq!(report.checked, 3);
}

#[test]
fn a_smaller_token_after_an_acknowledged_grant_is_a_violation_even_on_another_semaphore() {
    let mut script = Script::new();
    let larger = script.acquire(1, "a", "db", 1, (0, 10), 8);
    let smaller = script.acquire(2, "b", "jobs", 1, (20, 30), 5);
    let report = check_tokens(&script.history());
    assert_one_violation(&report, Invariant::Tokens, &[larger, smaller]);
    assert!(report.violations[0].message.contains("got token 5 although op 0"), "{report}");
}

#[test]
fn concurrent_grants_may_get_their_tokens_in_either_order() {
    let mut script = Script::new();
    script.acquire(1, "a", "db", 1, (0, 30), 8);
    script.acquire(2, "b", "jobs", 1, (10, 20), 5);
    assert_passes(&check_tokens(&script.history()));
}

#[test]
fn a_token_granted_twice_is_a_violation() {
    let mut script = Script::new();
    let first = script.acquire(1, "a", "pool", 1, (0, 10), 4);
    let second = script.acquire(2, "b", "pool", 1, (5, 15), 4);
    assert_one_violation(&check_tokens(&script.history()), Invariant::Tokens, &[first, second]);
}

#[test]
fn the_same_token_on_two_semaphores_is_a_violation() {
    let mut script = Script::new();
    let first = script.acquire(1, "a", "db", 1, (0, 10), 4);
    let second = script.acquire(1, "a", "jobs", 1, (5, 15), 4);
    assert_one_violation(&check_tokens(&script.history()), Invariant::Tokens, &[first, second]);
}

#[test]
fn an_idempotent_repeat_returns_its_grant_token_after_larger_ones() {
    let mut script = Script::new();
    script.acquire(1, "a", "db", 1, (0, 10), 4);
    script.acquire(2, "b", "jobs", 1, (20, 30), 5);
    script.acquire(1, "a", "db", 1, (40, 50), 4);
    assert_passes(&check_tokens(&script.history()));
}

#[test]
fn the_same_token_again_after_an_acknowledged_release_is_a_violation() {
    let mut script = Script::new();
    let first = script.acquire(1, "a", "db", 1, (0, 10), 4);
    let release = script.release(1, "a", "db", (20, 30), 1);
    let again = script.acquire(1, "a", "db", 1, (40, 50), 4);
    assert_one_violation(&check_tokens(&script.history()), Invariant::Tokens, &[first, release, again]);
}

#[test]
fn a_retry_of_an_unknown_acquire_may_return_a_token_older_than_grants_in_between() {
    // The first try was granted token 4 before "b" got 5; its answer was lost and the retry
    // returns the same grant.
    let mut script = Script::new();
    script.acquire_unknown(1, "a", "db", 1, 0);
    script.acquire(2, "b", "jobs", 1, (10, 20), 5);
    script.acquire(1, "a", "db", 1, (30, 40), 4);
    assert_passes(&check_tokens(&script.history()));
}

#[test]
fn a_new_grant_after_a_release_must_beat_tokens_acknowledged_before_it_was_asked() {
    let mut script = Script::new();
    script.acquire_unknown(1, "a", "db", 1, 0);
    script.release(1, "a", "db", (5, 8), 0);
    let larger = script.acquire(2, "b", "jobs", 1, (10, 20), 5);
    let stale = script.acquire(1, "a", "db", 1, (30, 40), 4);
    assert_one_violation(&check_tokens(&script.history()), Invariant::Tokens, &[larger, stale]);
}
