//! Fencing tokens grow in real-time order: a grant acknowledged before an acquire was sent has a
//! smaller token than whatever that acquire was granted. (That a token names one grant is checked
//! while drawing the facts.)

use super::facts::{Facts, Grant};
use super::{Rule, Violation};

/// Violations of the token order.
pub fn check(facts: &Facts) -> Vec<Violation> {
    let mut by_seen: Vec<&Grant> = facts.grants.values().collect();
    by_seen.sort_by_key(|grant| grant.seen);
    // prefix_max[i]: the grant with the largest token among the first i sightings.
    let mut prefix_max: Vec<Option<&Grant>> = Vec::with_capacity(by_seen.len() + 1);
    prefix_max.push(None);
    for grant in &by_seen {
        let best = match prefix_max.last().copied().flatten() {
            Some(best) if best.token > grant.token => best,
            _ => grant,
        };
        prefix_max.push(Some(best));
    }
    let mut violations = Vec::new();
    for later in &by_seen {
        let before = by_seen.partition_point(|grant| grant.seen < later.invoked);
        if let Some(earlier) = prefix_max[before] {
            if earlier.token >= later.token {
                let text = format!(
                    "token {} ({} on {}) was acknowledged at {}, before the acquire sent at {} \
                     that was granted the smaller token {} ({} on {})",
                    earlier.token,
                    earlier.session,
                    earlier.key,
                    earlier.seen,
                    later.invoked,
                    later.token,
                    later.session,
                    later.key
                );
                let sessions = vec![earlier.session, later.session];
                violations.push(Violation::new(Rule::TokenOrder, sessions, text));
            }
        }
    }
    violations
}
