//! Capacity: at no instant do the holds that clients rely on exceed the semaphore's capacity.
//!
//! Shrinking a capacity keeps the holders, so the bound used is the largest capacity sent for the
//! semaphore up to that instant (sent, not acknowledged: an unanswered resize may have applied).
//! The state machine checks the exact rule (holds granted under the current capacity fit) after
//! every apply. The sweep is the fault suite's ([`permit_check::over_capacity`]).

use std::collections::BTreeMap;

use permit_check::{over_capacity, Reliance};
use permit_core::Key;

use super::facts::{Facts, Grant};
use super::{Rule, Violation};

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
    // In token order (as `grants` comes), so that starts at one point are taken by token.
    let mut relied: Vec<(Reliance<_>, &Grant)> = Vec::new();
    for grant in grants {
        for (start, end) in facts.reliance(grant) {
            relied.push((Reliance { start, end, permits: grant.permits }, grant));
        }
    }
    let reliances: Vec<_> = relied.iter().map(|(reliance, _)| *reliance).collect();
    let mut capacities = facts.capacities(key);
    capacities.sort();
    let capacity_at =
        |point| capacities.iter().take_while(|(sent, _)| *sent < point).map(|(_, capacity)| *capacity).max();
    let overflow = over_capacity(&reliances, capacity_at).into_iter().next()?;
    let point = overflow.at;
    let Some(capacity) = overflow.capacity else {
        let text = format!("{key} held at {point} before any capacity was sent");
        return Some(Violation::new(Rule::Capacity, vec![relied[overflow.started].1.session], text));
    };
    let holders: Vec<&Grant> = overflow.relied.iter().map(|&index| relied[index].1).collect();
    let text = format!(
        "at {point} clients rely on {} permits of {key}, capacity at most {capacity}: {}",
        overflow.held,
        holders
            .iter()
            .map(|g| format!("{} x{} token {} seen {}", g.session, g.permits, g.token, g.seen))
            .collect::<Vec<_>>()
            .join("; ")
    );
    Some(Violation::new(Rule::Capacity, holders.iter().map(|grant| grant.session).collect(), text))
}
