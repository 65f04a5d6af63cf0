//! I6 to I9: permits come back, replicas converge, minorities stay silent, no panics.

use std::collections::BTreeMap;

use permit_check::{
    check_convergence, check_logs, check_minority_acks, check_no_permit_lost, FreshAcquire, Invariant,
    Isolation, ReplicaDigest,
};

use crate::support::{assert_one_violation, assert_passes, Script, MS};

fn replica(node: u64, applied_index: u64, digest: &str) -> ReplicaDigest {
    ReplicaDigest { node, applied_index, digest: digest.to_owned() }
}

#[test]
fn replicas_at_the_same_index_with_equal_digests_converge() {
    let report = check_convergence(&[replica(1, 80, "aa"), replica(2, 80, "aa"), replica(3, 79, "bb")]);
    assert_passes(&report);
    assert_eq!(report.checked, 2);
}

#[test]
fn divergent_digests_at_one_index_are_a_violation() {
    let report = check_convergence(&[replica(1, 80, "aa"), replica(2, 80, "aa"), replica(3, 80, "cc")]);
    assert_one_violation(&report, Invariant::Convergence, &[]);
    assert!(report.violations[0].message.contains("node 1, node 2 → aa; node 3 → cc"), "{report}");
}

#[test]
fn replicas_that_share_no_index_prove_nothing() {
    assert_eq!(check_convergence(&[replica(1, 80, "aa"), replica(2, 81, "aa")]).violations.len(), 1);
    assert_eq!(check_convergence(&[]).violations.len(), 1);
}

fn acknowledged_by_node_1() -> (Script, Vec<u64>) {
    let mut script = Script::new();
    let inside = script.acquire(1, "a", "db", 1, (1100, 1200), 3);
    let straddling = script.validate(2, "db", 3, (900, 1300), true);
    let after = script.keepalive(1, "a", (1900, 2100));
    let rejected = script.unavailable(3, "c", "db", 1, (1300, 1400));
    for id in [inside, straddling, after, rejected] {
        script.answered_by(id, 1);
    }
    (script, vec![inside, straddling, after, rejected])
}

#[test]
fn an_acknowledgement_from_an_isolated_node_is_a_violation() {
    let (script, ids) = acknowledged_by_node_1();
    let cut = Isolation { node: 1, from_ns: 1000 * MS, until_ns: 2000 * MS };
    let report = check_minority_acks(&script.history(), &[cut]);
    assert_one_violation(&report, Invariant::MinorityAck, &[ids[0]]);
    assert_eq!(report.checked, 3, "the three Ok calls that name their node");
}

#[test]
fn acknowledgements_from_a_node_of_the_majority_pass() {
    let (script, _) = acknowledged_by_node_1();
    let cut = Isolation { node: 2, from_ns: 1000 * MS, until_ns: 2000 * MS };
    assert_passes(&check_minority_acks(&script.history(), &[cut]));
}

#[test]
fn a_fault_timeline_with_no_node_in_the_answers_proves_nothing() {
    let mut script = Script::new();
    script.acquire(1, "a", "db", 1, (1100, 1200), 3);
    let cut = Isolation { node: 1, from_ns: 1000 * MS, until_ns: 2000 * MS };
    assert_eq!(check_minority_acks(&script.history(), &[cut]).violations.len(), 1);
}

#[test]
fn panic_markers_in_a_node_log_are_a_violation() {
    let clean = "INFO permit serve: listening\nINFO became leader\n";
    let panicked = "INFO start\nthread 'main' panicked at crates/server/src/node.rs:10:5\nnote: run with `RUST_BACKTRACE=1`\n";
    assert_passes(&check_logs([("n1", clean), ("n2", clean)]));
    let report = check_logs([("n1", clean), ("n2", panicked)]);
    assert_one_violation(&report, Invariant::LogHygiene, &[]);
    assert!(
        report.violations[0].message.contains("`n2` line 2")
            && report.violations[0].message.contains("line 3")
    );
}

#[test]
fn a_fresh_client_must_get_the_whole_capacity_in_time() {
    let capacities = BTreeMap::from([("db".to_owned(), 1), ("pool".to_owned(), 3), ("jobs".to_owned(), 2)]);
    let fresh = |semaphore: &str, permits_acquired, elapsed_ms: u64| FreshAcquire {
        semaphore: semaphore.to_owned(),
        permits_acquired,
        elapsed_ns: elapsed_ms * MS,
    };
    let all_back = [fresh("db", 1, 10), fresh("pool", 3, 20), fresh("jobs", 2, 5)];
    assert_passes(&check_no_permit_lost(&capacities, &all_back, 10_000 * MS));
    let lost = [fresh("db", 1, 12_000), fresh("pool", 2, 10_000)];
    let report = check_no_permit_lost(&capacities, &lost, 10_000 * MS);
    assert_eq!(report.violations.len(), 3, "slow, short and missing: {report}");
}
