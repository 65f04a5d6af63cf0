//! The checks after healing: the cluster converges (one leader, every node applied the leader's
//! whole log, restarted nodes included), replicas end identical, nothing applied is lost, and
//! once every TTL passed a fresh session can take each semaphore's full capacity.

use std::time::Duration;

use openraft::ServerState;
use permit_core::{Key, Name, Outcome, SessionId};
use rand::Rng;
use tokio::time::Instant;

use crate::cluster::{Cluster, NODE_IDS};
use crate::gateway::Gateway;
use crate::recorder::Recorder;

/// Pause between looks at the cluster while it converges.
const POLL: Duration = Duration::from_millis(20);

/// Waits until one leader leads every running node and each applied the leader's whole log.
/// Reports a violation and returns false if that takes longer than `patience`.
pub async fn converge(cluster: &Cluster, recorder: &Recorder, patience: Duration) -> bool {
    let deadline = Instant::now() + patience;
    loop {
        match convergence(cluster) {
            Ok(index) => {
                recorder.note(format!("converged at index {index}"));
                return true;
            }
            Err(why) if Instant::now() >= deadline => {
                recorder.violation(format!("no convergence within {patience:?} after healing: {why}"));
                return false;
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// The index every node applied, or why the cluster has not converged.
fn convergence(cluster: &Cluster) -> Result<u64, String> {
    let nodes = cluster.running();
    if nodes.len() != NODE_IDS.len() {
        return Err(format!("nodes down: {:?}", cluster.down()));
    }
    let metrics: Vec<_> =
        nodes.iter().map(|node| node.consensus().raft().metrics().borrow().clone()).collect();
    let leaders: Vec<_> = metrics.iter().filter(|m| m.state == ServerState::Leader).collect();
    let [leader] = leaders.as_slice() else {
        return Err(format!("{} nodes believe they lead", leaders.len()));
    };
    let last = leader.last_log_index.unwrap_or(0);
    for m in &metrics {
        let applied = m.last_applied.map_or(0, |id| id.index);
        if m.current_leader != Some(leader.id) || applied != last {
            return Err(format!(
                "node {} follows {:?} and applied {applied}; node {} leads with log {last}",
                m.id, m.current_leader, leader.id
            ));
        }
    }
    Ok(last)
}

/// Checks that every replica ends with the same state, at an index no smaller than any index
/// any node ever applied (nothing applied was lost, crashed nodes caught up).
pub fn check_replicas_agree(cluster: &Cluster, recorder: &Recorder, applied_max: u64) {
    let states: Vec<(u64, u64, u64)> = cluster
        .running()
        .iter()
        .map(|node| {
            let replica = node.replica().read();
            (node.id, replica.state.applied_index(), replica.state.digest())
        })
        .collect();
    let Some(&(first_id, index, digest)) = states.first() else { return };
    for &(id, other_index, other_digest) in &states[1..] {
        if (other_index, other_digest) != (index, digest) {
            recorder.violation(format!(
                "replicas differ at the end: node {first_id} at {index} ({digest:x}), node {id} at \
                 {other_index} ({other_digest:x})"
            ));
        }
    }
    if index < applied_max {
        recorder
            .violation(format!("replicas end at index {index}, but index {applied_max} was applied before"));
    }
}

/// After every session expired: nothing is held or queued, and a fresh session can take each
/// semaphore's full capacity (no permit is lost forever).
pub async fn check_no_permit_lost(driver: &Gateway, rng: &mut impl Rng, names: &[Name]) {
    let recorder = driver.recorder();
    let session = SessionId::from_bytes(rng.random());
    let mut created = false;
    for _ in 0..5 {
        if let Some(outcome) = driver.create_session(rng, session, 60_000).await {
            created = outcome == Outcome::SessionCreated;
            break;
        }
    }
    if !created {
        recorder.violation("no permit lost: the fresh session could not be created");
        return;
    }
    let Some(capacities) = read_idle_capacities(driver, rng, names, session).await else { return };
    for (name, capacity) in names.iter().zip(capacities) {
        let key = Key::semaphore(name.clone());
        let outcome = driver.acquire(rng, session, &key, capacity, false, None).await;
        if !matches!(outcome, Some(Outcome::Acquired { permits, .. }) if permits == capacity) {
            recorder.violation(format!(
                "no permit lost: a fresh session asking for all {capacity} permits of {key} got {outcome:?}"
            ));
        }
    }
    driver.close(rng, session).await;
}

/// Reads, linearizably, that only `session` is left and nothing is held or queued; returns the
/// capacity of each semaphore.
async fn read_idle_capacities(
    driver: &Gateway,
    rng: &mut impl Rng,
    names: &[Name],
    session: SessionId,
) -> Option<Vec<u64>> {
    let recorder = driver.recorder();
    let Some(node) = driver.leader(rng).await else {
        recorder.violation("no permit lost: no leader");
        return None;
    };
    if let Err(error) = node.ensure_linearizable().await {
        recorder.violation(format!("no permit lost: leader {} cannot read: {error}", node.id));
        return None;
    }
    let replica = node.replica().read();
    let state = &replica.state;
    let others: Vec<String> =
        state.sessions().filter(|(id, _)| **id != session).map(|(id, _)| id.to_string()).collect();
    if !others.is_empty() {
        recorder.violation(format!("sessions outlived every TTL: {}", others.join(", ")));
    }
    let mut capacities = Vec::new();
    for name in names {
        let key = Key::semaphore(name.clone());
        let Some(object) = state.object(&key) else {
            recorder.violation(format!("{key} is gone"));
            return None;
        };
        if object.held != 0 || !object.queue.is_empty() {
            recorder.violation(format!(
                "{key} still has {} permits held and {} waiters after every TTL",
                object.held,
                object.queue.len()
            ));
        }
        capacities.push(object.capacity);
    }
    Some(capacities)
}

/// The driver's clients' sessions, read one last time after healing (the final durability check).
pub async fn read_sessions(gateways: &[(Gateway, Option<SessionId>)], rng: &mut impl Rng) {
    for (gateway, session) in gateways {
        if let Some(session) = session {
            if gateway.observe(rng, *session).await.is_none() {
                gateway.recorder().violation(format!("final read of {session}: no leader could read"));
            }
        }
    }
}
