//! Continuous invariant checks on the nodes, run on every change of a node's Raft metrics:
//! - election safety as openraft defines it: a node leads only under its own committed vote, and
//!   each leader id (term, node) has one leader. openraft 0.9 (without its `single-term-leader`
//!   feature) lets two nodes lead in one term, each with its own leader id; the higher one wins
//!   every vote, so that is noted in the trace, not reported;
//! - a node's vote never goes back, across restarts too (it is on disk);
//! - within one run of a node, its applied index never decreases;
//! - every replica passes `State::verify`;
//! - every replica at an applied index has the same state digest as every other replica ever
//!   seen at that index, restarted or not (state machine safety);
//! - within one run of a node, its applied leader time (`State::now_ms`) never decreases; the
//!   leader time each node showed at each index is kept ([`Observer::leader_ms_seen`]) for the
//!   comparison with the committed log ([`crate::applied`]);
//! - no node stops with a fatal error unless the simulation shut it down.
//!
//! It also notes leadership changes in the trace and collects [`EarlyExpiry`]s, which explain
//! lease violations.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::error::Fatal;
use openraft::{ServerState, Vote};
use permit_server::raft::NodeId;
use permit_server::Node;

use crate::early_expiry::{self, EarlyExpiries, EarlyExpiry};
use crate::recorder::Recorder;

/// Watches every node of one simulation.
pub struct Observer {
    recorder: Arc<Recorder>,
    inner: Mutex<ObserverState>,
}

#[derive(Default)]
struct ObserverState {
    /// The leaders seen in each term.
    leaders: BTreeMap<u64, BTreeSet<NodeId>>,
    /// The latest vote each node reported.
    votes: BTreeMap<NodeId, Vote<NodeId>>,
    /// The applied index of each node's current run, with the run's number.
    applied: BTreeMap<NodeId, (u64, u64)>,
    /// The applied leader time of each node's current run, with the run's number.
    leader_ms: BTreeMap<NodeId, (u64, u64)>,
    /// Every (index, leader time) a node showed, with a node that showed it.
    leader_ms_seen: BTreeMap<(u64, u64), NodeId>,
    /// The state digest at each applied index, and the node that first showed it.
    digests: BTreeMap<u64, (u64, NodeId)>,
    /// The largest applied index any node ever reached.
    applied_max: u64,
    /// Runs started per node (1 for the first start).
    runs: BTreeMap<NodeId, u64>,
    /// Nodes that the simulation is shutting down: their fatal `Stopped` is expected.
    stopping: BTreeMap<NodeId, u64>,
    /// Runs into whose storage a fault was injected: a fatal storage error is expected.
    storage_faulted: BTreeMap<NodeId, u64>,
    /// The vote under which each node leads, if it does.
    leading: BTreeMap<NodeId, Vote<NodeId>>,
    /// Sessions that vanished from a leader before their deadline there.
    early_expiries: EarlyExpiries,
    /// Per node: the last snapshot and applied index its metrics showed.
    snapshots: BTreeMap<NodeId, (Option<u64>, u64)>,
    /// Followers that caught up by installing a leader's snapshot.
    snapshot_installs: u64,
}

impl Observer {
    /// An observer reporting to `recorder`.
    pub fn new(recorder: Arc<Recorder>) -> Arc<Observer> {
        Arc::new(Observer { recorder, inner: Mutex::new(ObserverState::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, ObserverState> {
        self.inner.lock().expect("observer lock")
    }

    /// Starts watching a freshly started run of node `id`.
    pub fn watch(self: &Arc<Observer>, id: NodeId, node: &Arc<Node>) {
        let run = {
            let mut state = self.lock();
            let run = state.runs.entry(id).or_insert(0);
            *run += 1;
            let run = *run;
            state.applied.insert(id, (run, 0));
            run
        };
        let observer = self.clone();
        let mut metrics = node.consensus().raft().metrics();
        let replica = node.replica().clone();
        tokio::spawn(async move {
            loop {
                let snapshot = metrics.borrow_and_update().clone();
                observer.observe_metrics(id, run, &snapshot);
                observer.observe_replica(id, run, &replica, snapshot.state == ServerState::Leader);
                if metrics.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Marks the current run of `id` as being shut down by the simulation.
    pub fn stopping(&self, id: NodeId) {
        let mut state = self.lock();
        let run = state.runs.get(&id).copied().unwrap_or(0);
        state.stopping.insert(id, run);
    }

    /// Marks the current run of `id` as having a storage fault injected.
    pub fn storage_fault(&self, id: NodeId) {
        let mut state = self.lock();
        let run = state.runs.get(&id).copied().unwrap_or(0);
        state.storage_faulted.insert(id, run);
    }

    /// The largest applied index any node ever reached.
    pub fn applied_max(&self) -> u64 {
        self.lock().applied_max
    }

    /// Every (index, leader time) some node's replica showed, with a node that showed it.
    pub fn leader_ms_seen(&self) -> BTreeMap<(u64, u64), NodeId> {
        self.lock().leader_ms_seen.clone()
    }

    /// The state digest the nodes showed at `index`, if one was seen there.
    pub fn digest_at(&self, index: u64) -> Option<u64> {
        self.lock().digests.get(&index).map(|(digest, _)| *digest)
    }

    /// Sessions that vanished from a leader's state before their deadline there.
    pub fn early_expiries(&self) -> Vec<EarlyExpiry> {
        self.lock().early_expiries.found.clone()
    }

    /// How many times a follower caught up by installing a snapshot.
    pub fn snapshot_installs(&self) -> u64 {
        self.lock().snapshot_installs
    }

    /// Terms that had a leader.
    pub fn terms_led(&self) -> usize {
        self.lock().leaders.len()
    }

    fn observe_metrics(
        &self,
        id: NodeId,
        run: u64,
        metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
    ) {
        let mut violations = Vec::new();
        let mut notes = Vec::new();
        {
            let mut state = self.lock();
            match &metrics.running_state {
                Err(Fatal::Stopped) if state.stopping.get(&id) == Some(&run) => {}
                Err(Fatal::StorageError(_)) if state.storage_faulted.get(&id) == Some(&run) => {}
                Err(fatal) => violations.push(format!("node {id} (run {run}) stopped: {fatal}")),
                Ok(()) => {}
            }
            if let Some(index) = installed_snapshot(&mut state.snapshots, id, metrics) {
                state.snapshot_installs += 1;
                notes.push(format!("node {id} caught up by installing a snapshot at index {index}"));
            }
            let vote = metrics.vote;
            if let Some(known) = state.votes.insert(id, vote) {
                if vote < known {
                    violations.push(format!("node {id} (run {run}) went back from vote {known} to {vote}"));
                }
            }
            let leads = metrics.state == ServerState::Leader;
            match (leads, state.leading.get(&id)) {
                (true, Some(known)) if *known == vote => {}
                (true, _) => {
                    notes.push(format!("node {id} leads under vote {vote}"));
                    state.leading.insert(id, vote);
                }
                (false, Some(_)) => {
                    notes.push(format!("node {id} no longer leads ({:?}, vote {vote})", metrics.state));
                    state.leading.remove(&id);
                }
                (false, None) => {}
            }
            if leads {
                if vote.leader_id().voted_for() != Some(id) || !vote.is_committed() {
                    violations.push(format!("node {id} (run {run}) leads under vote {vote}"));
                }
                let term = vote.leader_id().get_term();
                let leaders = state.leaders.entry(term).or_default();
                if leaders.insert(id) && leaders.len() > 1 {
                    notes.push(format!(
                        "term {term} has leaders {leaders:?} (openraft leader ids are (term, node))"
                    ));
                }
            }
        }
        for note in notes {
            self.recorder.note(note);
        }
        for violation in violations {
            self.recorder.violation(violation);
        }
    }

    fn observe_replica(
        &self,
        id: NodeId,
        run: u64,
        replica: &permit_server::raft::replica::Replica,
        leads: bool,
    ) {
        let last_checked = self.lock().applied.get(&id).filter(|(r, _)| *r == run).map(|(_, index)| *index);
        let now = tokio::time::Instant::now();
        let (index, now_ms, digest, verified) = {
            let replica = replica.read();
            let deadlines = leads.then(|| early_expiry::deadlines(&replica, now));
            let early = self.lock().early_expiries.observe(id, run, deadlines, now);
            for early in early {
                self.recorder.note(format!(
                    "node {id} leads and lost {} {:?} before its deadline there",
                    early.session, early.early_by
                ));
            }
            let index = replica.state.applied_index();
            if last_checked == Some(index) && index != 0 {
                return;
            }
            (index, replica.state.now_ms(), replica.state.digest(), replica.state.verify())
        };
        let mut violations = Vec::new();
        if let Err(violation) = verified {
            violations.push(format!("node {id} at index {index}: state invalid: {violation}"));
        }
        {
            let mut state = self.lock();
            if let Some((current_run, applied)) = state.applied.get_mut(&id) {
                if *current_run == run {
                    if index < *applied {
                        violations.push(format!(
                            "node {id} (run {run}) went back from applied index {applied} to {index}"
                        ));
                    }
                    *applied = (*applied).max(index);
                }
            }
            if let Some((current_run, leader_ms)) = state.leader_ms.get_mut(&id) {
                if *current_run == run && now_ms < *leader_ms {
                    violations.push(format!(
                        "node {id} (run {run}) went back from leader time {leader_ms} to {now_ms} ms"
                    ));
                }
            }
            let latest = state.leader_ms.get(&id).filter(|(r, _)| *r == run).map_or(0, |(_, ms)| *ms);
            state.leader_ms.insert(id, (run, latest.max(now_ms)));
            state.leader_ms_seen.entry((index, now_ms)).or_insert(id);
            state.applied_max = state.applied_max.max(index);
            let (expected, first) = *state.digests.entry(index).or_insert((digest, id));
            if expected != digest {
                violations.push(format!(
                    "node {id} at index {index} has state digest {digest:x}, node {first} had {expected:x}"
                ));
            }
        }
        for violation in violations {
            self.recorder.violation(violation);
        }
    }
}

/// The index of the snapshot a follower just installed, if it did: its snapshot changed and its
/// applied index jumped from below that snapshot straight to it.
fn installed_snapshot(
    seen: &mut BTreeMap<NodeId, (Option<u64>, u64)>,
    id: NodeId,
    metrics: &openraft::RaftMetrics<NodeId, openraft::BasicNode>,
) -> Option<u64> {
    let snapshot = metrics.snapshot.map(|id| id.index);
    let applied = metrics.last_applied.map_or(0, |id| id.index);
    let (previous_snapshot, previous_applied) = seen.insert(id, (snapshot, applied)).unwrap_or((None, 0));
    let index = snapshot?;
    let jumped = previous_snapshot != snapshot && previous_applied < index && applied == index;
    (jumped && metrics.state != ServerState::Leader).then_some(index)
}
