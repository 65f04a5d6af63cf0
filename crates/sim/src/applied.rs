//! The committed log, re-applied: the leader time of every grant, take and hold end, for the
//! policy checks ([`crate::checker::policies`]).
//!
//! The log is the one the wire carried ([`crate::router::Router::committed_log`]), read outside
//! the nodes, and is applied here to a fresh `permit_core::State`. Leader time is computed here
//! from the batches, as the promise states it: an entry's time is the largest `Batch::now_ms`
//! of the log up to it. The nodes' own view is compared with it: every leader time a node's
//! replica showed at an index (the observer's record) must be the log's at that index, and the
//! replayed state must end with the digest the nodes had.

use std::collections::BTreeMap;

use permit_core::{Effect, Event, EventKind, Key, State};

/// One policy-relevant event of the log, at its entry's leader time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed {
    /// The log index of the entry.
    pub index: u64,
    /// The entry's leader time.
    pub at_ms: u64,
    /// What happened.
    pub kind: EventKind,
    /// The semaphore.
    pub key: Key,
    /// Permits granted, taken or ended.
    pub permits: u64,
}

/// What the replay of the committed log found.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// Grants (`granted`), takes (`taken`) and hold ends (`released`, `expired`, `revoked`), in
    /// log order.
    pub events: Vec<Timed>,
    /// The leader time at each applied index.
    pub leader_ms: BTreeMap<u64, u64>,
    /// Problems with the log itself (an index never sent).
    pub problems: Vec<String>,
    /// The replayed state.
    pub state: State,
}

/// Applies `log` (index to term and batch; `None` for a blank or membership entry) to a fresh
/// state.
pub fn replay(log: &BTreeMap<u64, (u64, Option<permit_core::Batch>)>) -> Applied {
    let mut applied = Applied::default();
    let mut leader_ms = 0u64;
    let mut expected = 1u64;
    for (index, (term, batch)) in log {
        if *index == 0 {
            // The initial membership, written by each node itself.
            continue;
        }
        if *index != expected {
            applied.problems.push(format!("committed entries {expected}..{index} were never sent"));
            return applied;
        }
        expected = index + 1;
        let Some(batch) = batch else {
            applied.state.skip(*index);
            applied.leader_ms.insert(*index, leader_ms);
            continue;
        };
        leader_ms = leader_ms.max(batch.now_ms);
        applied.leader_ms.insert(*index, leader_ms);
        let mut effects = Vec::new();
        applied.state.apply(*index, *term, batch, &mut effects);
        for effect in effects {
            let Effect::Event(event) = effect else { continue };
            if let Some(timed) = timed(*index, leader_ms, &event) {
                applied.events.push(timed);
            }
        }
    }
    applied
}

fn timed(index: u64, at_ms: u64, event: &Event) -> Option<Timed> {
    let relevant = matches!(
        event.kind,
        EventKind::Granted | EventKind::Taken | EventKind::Released | EventKind::Expired | EventKind::Revoked
    );
    let key = event.key.clone().filter(|_| relevant)?;
    Some(Timed { index, at_ms, kind: event.kind, key, permits: event.permits.unwrap_or(0) })
}
