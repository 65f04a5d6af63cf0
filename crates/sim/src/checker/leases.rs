//! Leases and durability: while a client's lease holds, its session exists, and a linearizable
//! read of it shows every hold the client relies on, with the token it was acknowledged with.

use std::collections::BTreeMap;

use permit_core::SessionId;

use super::facts::{Facts, Grant};
use super::{Rule, Violation};
use crate::history::{Event, History};

/// Violations of leases and of acknowledged holds.
pub fn check(history: &History, facts: &Facts) -> Vec<Violation> {
    let mut grants_of: BTreeMap<SessionId, Vec<&Grant>> = BTreeMap::new();
    for grant in facts.grants.values() {
        grants_of.entry(grant.session).or_default().push(grant);
    }
    let mut violations = Vec::new();
    for record in &history.records {
        let point = record.point;
        match &record.event {
            Event::SessionMissing { session } | Event::Observed { session, present: false, .. }
                if facts.lease_holds(*session, point) =>
            {
                let text = format!("{session} was reported missing at {point} while its lease holds");
                violations.push(Violation::new(Rule::Lease, vec![*session], text));
            }
            Event::Observed { session, present: true, holds, .. } => {
                let grants = grants_of.get(session).map_or(&[][..], Vec::as_slice);
                let relied = grants.iter().filter(|grant| {
                    facts.reliance(grant).iter().any(|(start, end)| *start < point && point < *end)
                });
                for grant in relied {
                    let found = holds.iter().any(|hold| {
                        (&hold.key, hold.permits, hold.token) == (&grant.key, grant.permits, grant.token)
                    });
                    if !found {
                        let text = format!(
                            "a read of {session} at {point} lacks its hold on {} (token {}, {} \
                             permits, acknowledged at {}), which its client relies on",
                            grant.key, grant.token, grant.permits, grant.seen
                        );
                        violations.push(Violation::new(Rule::Durability, vec![*session], text));
                    }
                }
            }
            _ => {}
        }
    }
    violations
}
