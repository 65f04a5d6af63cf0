//! I5: no acknowledged grant or release is lost after faults.

use std::collections::BTreeMap;

use permit_check::{check_durability, ClockAllowance, FinalRead, Holder, Invariant, Report};

use crate::support::{assert_one_violation, assert_passes, Script, MS};

/// Reads at 10 s (answered at 10.1 s) with `holders` on `db` and nothing on `pool`.
fn check(script: &Script, holders: &[(&str, u64, u64)]) -> Report {
    let listed =
        holders.iter().map(|&(session, permits, token)| Holder { session: session.into(), permits, token });
    let read = FinalRead {
        invoke_ns: 10_000 * MS,
        complete_ns: 10_100 * MS,
        holders: BTreeMap::from([("db".to_owned(), listed.collect()), ("pool".to_owned(), Vec::new())]),
    };
    check_durability(&script.history(), &read, ClockAllowance::default())
}

fn sessions(ttl_ms: u64) -> Script {
    let mut script = Script::new();
    script.create(1, "a", ttl_ms, (0, 5));
    script.create(2, "b", ttl_ms, (0, 5));
    script
}

#[test]
fn kept_grants_and_releases_pass() {
    let mut script = sessions(3_600_000);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.acquire(2, "b", "pool", 1, (10, 20), 2);
    script.release(2, "b", "pool", (30, 40), 1);
    let report = check(&script, &[("a", 1, 1)]);
    assert_passes(&report);
    assert_eq!(report.checked, 3);
}

#[test]
fn a_lost_acknowledged_grant_is_a_violation() {
    let mut script = sessions(3_600_000);
    let grant = script.acquire(1, "a", "db", 1, (10, 20), 1);
    let report = check(&script, &[]);
    assert_one_violation(&report, Invariant::Durability, &[grant]);
    assert!(report.violations[0].message.contains("not listed"), "{report}");
}

#[test]
fn a_grant_listed_with_another_token_is_a_violation() {
    let mut script = sessions(3_600_000);
    let grant = script.acquire(1, "a", "db", 1, (10, 20), 1);
    assert_one_violation(&check(&script, &[("a", 1, 9)]), Invariant::Durability, &[grant]);
}

#[test]
fn a_lost_acknowledged_release_is_a_violation() {
    let mut script = sessions(3_600_000);
    let grant = script.acquire(1, "a", "db", 1, (10, 20), 1);
    let release = script.release(1, "a", "db", (30, 40), 1);
    assert_one_violation(&check(&script, &[("a", 1, 1)]), Invariant::Durability, &[grant, release]);
}

#[test]
fn a_grant_whose_session_deadline_passed_may_be_gone() {
    let mut script = sessions(2000);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    assert_passes(&check(&script, &[]));
}

#[test]
fn a_keepalive_before_the_read_keeps_the_grant_required() {
    let mut script = sessions(2000);
    let grant = script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.keepalive(1, "a", (9500, 9510));
    assert_one_violation(&check(&script, &[]), Invariant::Durability, &[grant]);
}

#[test]
fn a_grant_followed_by_an_unknown_release_may_be_listed_or_not() {
    let mut script = sessions(3_600_000);
    script.acquire(1, "a", "db", 1, (10, 20), 1);
    script.release_unknown(1, "a", "db", 30);
    assert_passes(&check(&script, &[]));
    assert_passes(&check(&script, &[("a", 1, 1)]));
}

#[test]
fn an_unknown_acquire_may_show_up_but_a_holder_that_never_asked_may_not() {
    let mut script = sessions(3_600_000);
    script.acquire_unknown(1, "a", "db", 1, 10);
    assert_passes(&check(&script, &[("a", 1, 4)]));
    let report = check(&script, &[("b", 1, 5)]);
    assert_one_violation(&report, Invariant::Durability, &[]);
    assert!(report.violations[0].message.contains("never asked"), "{report}");
}

#[test]
fn a_semaphore_missing_from_the_final_read_is_reported_not_skipped() {
    let mut script = sessions(3_600_000);
    let grant = script.acquire(1, "a", "jobs", 1, (10, 20), 1);
    assert_one_violation(&check(&script, &[]), Invariant::WellFormed, &[grant]);
}
