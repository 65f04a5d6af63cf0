//! Capacity: at no instant do the holds that clients rely on exceed the semaphore's capacity.
//!
//! Shrinking a capacity keeps the holders, so the bound used is the largest capacity sent for the
//! semaphore up to that instant (sent, not acknowledged: an unanswered resize may have applied).
//! The state machine checks the exact rule (holds granted under the current capacity fit) after
//! every apply.

use std::collections::BTreeMap;

use permit_core::Key;

use super::facts::{Facts, Grant};
use super::{Rule, Violation};
use crate::history::Point;

/// Violations of the capacity.
pub fn check(facts: &Facts) -> Vec<Violation> {
    let mut by_key: BTreeMap<&Key, Vec<&Grant>> = BTreeMap::new();
    for grant in facts.grants.values() {
        by_key.entry(&grant.key).or_default().push(grant);
    }
    by_key.into_iter().filter_map(|(key, grants)| check_key(facts, key, &grants)).collect()
}

/// The first instant at which the holds relied on exceed the capacity, if there is one.
fn check_key(facts: &Facts, key: &Key, grants: &[&Grant]) -> Option<Violation> {
    // (point, is_start, grant): at one point, ends come before starts.
    let mut edges: Vec<(Point, bool, &Grant)> = Vec::new();
    for grant in grants {
        for (start, end) in facts.reliance(grant) {
            edges.push((start, true, grant));
            edges.push((end, false, grant));
        }
    }
    edges.sort_by_key(|(point, is_start, grant)| (*point, *is_start, grant.token));
    let mut capacities = facts.capacities(key);
    capacities.sort();
    let mut relied: BTreeMap<u64, &Grant> = BTreeMap::new();
    for (point, is_start, grant) in edges {
        if !is_start {
            relied.remove(&grant.token);
            continue;
        }
        relied.insert(grant.token, grant);
        let held: u64 = relied.values().map(|grant| grant.permits).sum();
        let capacity = capacities.iter().take_while(|(sent, _)| *sent < point).map(|(_, c)| *c).max();
        let Some(capacity) = capacity else {
            let text = format!("{key} held at {point} before any capacity was sent");
            return Some(Violation::new(Rule::Capacity, vec![grant.session], text));
        };
        if held > capacity {
            let holders: Vec<String> = relied
                .values()
                .map(|g| format!("{} x{} token {} seen {}", g.session, g.permits, g.token, g.seen))
                .collect();
            let text = format!(
                "at {point} clients rely on {held} permits of {key}, capacity at most {capacity}: {}",
                holders.join("; ")
            );
            let sessions = relied.values().map(|grant| grant.session).collect();
            return Some(Violation::new(Rule::Capacity, sessions, text));
        }
    }
    None
}
