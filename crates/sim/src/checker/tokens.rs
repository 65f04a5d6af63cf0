//! Fencing tokens grow in real-time order: a grant acknowledged before an acquire was sent has a
//! smaller token than whatever that acquire was granted. (That a token names one grant is checked
//! while drawing the facts.) The order is the fault suite's ([`permit_check::token_order`]).

use permit_check::{token_order, TokenGrant};

use super::facts::{Facts, Grant};
use super::{Rule, Violation};

/// Violations of the token order.
pub fn check(facts: &Facts) -> Vec<Violation> {
    let grants: Vec<&Grant> = facts.grants.values().collect();
    let ordered: Vec<TokenGrant<_>> = grants
        .iter()
        .map(|grant| TokenGrant { asked: grant.invoked, acked: grant.seen, token: grant.token })
        .collect();
    token_order(&ordered)
        .into_iter()
        .map(|(earlier, later)| {
            let (earlier, later) = (grants[earlier], grants[later]);
            let text = format!(
                "token {} ({} on {}) was acknowledged at {}, before the acquire sent at {} that was \
                 granted the smaller token {} ({} on {})",
                earlier.token,
                earlier.session,
                earlier.key,
                earlier.seen,
                later.invoked,
                later.token,
                later.session,
                later.key
            );
            Violation::new(Rule::TokenOrder, vec![earlier.session, later.session], text)
        })
        .collect()
}
