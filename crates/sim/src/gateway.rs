//! A client's way into the cluster: each operation goes to a node that believes it leads, the
//! way `permit-server`'s HTTP handlers would run it there, and is recorded in the history: sent,
//! then answered, or left unanswered when the node could not say (timeout, leader change, crash).

use std::sync::Arc;
use std::time::Duration;

use permit_core::{
    Acquire, Command, Key, Name, NewItem, Outcome, PolicyChange, QueueSettings, Refusal, SessionId, State,
};
use permit_server::Node;
use rand::Rng;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::history::{Answer, ClientId, Event, Operation, SeenHold, SeenItem};
use crate::recorder::Recorder;

/// Longest a client waits for some node to claim leadership before giving up an operation.
const LEADER_PATIENCE: Duration = Duration::from_secs(2);
/// Pause between looks for a leader.
const LEADER_POLL: Duration = Duration::from_millis(50);

/// What a linearizable read showed of a session.
#[derive(Debug, Clone)]
pub struct Observation {
    /// Whether the session exists.
    pub present: bool,
    /// Its holds.
    pub holds: Vec<SeenHold>,
    /// The semaphores it waits on.
    pub waits: Vec<Key>,
}

/// Runs one client's operations and records them.
#[derive(Clone)]
pub struct Gateway {
    cluster: Arc<Cluster>,
    recorder: Arc<Recorder>,
    client: ClientId,
}

impl Gateway {
    /// The gateway of `client`.
    pub fn new(cluster: Arc<Cluster>, recorder: Arc<Recorder>, client: ClientId) -> Gateway {
        Gateway { cluster, recorder, client }
    }

    /// The recorder.
    pub fn recorder(&self) -> &Recorder {
        &self.recorder
    }

    /// A node that believes it leads, waiting up to `LEADER_PATIENCE` for one.
    pub async fn leader(&self, rng: &mut impl Rng) -> Option<Arc<Node>> {
        let deadline = Instant::now() + LEADER_PATIENCE;
        loop {
            if let Some(node) = self.cluster.pick_leader(rng) {
                return Some(node);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(LEADER_POLL).await;
        }
    }

    /// Sends `command` to a leader; `None` when no leader was found or the outcome is unknown.
    async fn propose(&self, rng: &mut impl Rng, operation: Operation, command: Command) -> Option<Outcome> {
        let node = self.leader(rng).await?;
        let session = operation.session();
        let op = self.recorder.invoke(self.client, node.id, operation);
        match node.propose(command).await {
            Ok(outcome) => {
                self.recorder.ack(self.client, op, self.answer_of(&outcome));
                if let (Outcome::Refused(Refusal::SessionNotFound), Some(session)) = (&outcome, session) {
                    self.recorder.record(self.client, Event::SessionMissing { session });
                }
                Some(outcome)
            }
            Err(error) => {
                self.recorder.note(format!(
                    "client {} op {op} on node {}: unknown outcome: {error}",
                    self.client, node.id
                ));
                None
            }
        }
    }

    fn answer_of(&self, outcome: &Outcome) -> Answer {
        match outcome {
            Outcome::SessionCreated => Answer::SessionCreated,
            Outcome::SessionClosed => Answer::Closed,
            Outcome::SemaphoreCreated | Outcome::SemaphoreUpdated => Answer::CapacitySet,
            Outcome::Acquired { permits, token } => Answer::Acquired { permits: *permits, token: *token },
            Outcome::Waiting { .. } | Outcome::TakeWaiting => Answer::Waiting,
            Outcome::Taken { token } => Answer::Taken { token: *token },
            Outcome::Released { permits } => Answer::Released { permits: *permits },
            Outcome::Refused(refusal) => Answer::Refused(refusal.to_string()),
            Outcome::Pushed { items } if items.len() == 1 => Answer::Pushed { item: items[0].id },
            Outcome::Claimed { items } if items.len() <= 1 => {
                Answer::Claimed(items.first().map(|item| SeenItem {
                    id: item.id,
                    payload: item.payload.to_string(),
                    token: item.token,
                }))
            }
            Outcome::Acked | Outcome::Nacked { .. } => Answer::Settled,
            other => {
                self.recorder
                    .violation(format!("client {} got an outcome it cannot cause: {other:?}", self.client));
                Answer::Refused(format!("{other:?}"))
            }
        }
    }

    /// Creates or resizes a semaphore.
    pub async fn put_semaphore(&self, rng: &mut impl Rng, name: &Name, capacity: u64) -> Option<Outcome> {
        let operation = Operation::PutSemaphore { key: Key::semaphore(name.clone()), capacity };
        self.propose(rng, operation, Command::PutSemaphore { name: name.clone(), capacity }).await
    }

    /// Creates or resizes a semaphore and changes its policy; recorded as the capacity it sets
    /// (the capacity checker's bound).
    pub async fn put_semaphore_policy(
        &self,
        rng: &mut impl Rng,
        name: &Name,
        capacity: u64,
        policy: PolicyChange,
    ) -> Option<Outcome> {
        let operation = Operation::PutSemaphore { key: Key::semaphore(name.clone()), capacity };
        let command = Command::PutSemaphorePolicy { name: name.clone(), capacity, policy, creator: None };
        self.propose(rng, operation, command).await
    }

    /// Takes rate permits, waiting in the queue up to `wait_ms` (as `POST .../take`, without its
    /// long-poll: a take that queues is answered [`Answer::Waiting`] and served in the log).
    pub async fn take(&self, rng: &mut impl Rng, name: &Name, permits: u64, wait_ms: u64) -> Option<Outcome> {
        let operation = Operation::Take { key: Key::semaphore(name.clone()), permits, wait_ms };
        // The take's place in the queue, drawn as a session id is (the server draws it at random).
        let taker = self.new_session_id(rng);
        self.propose(rng, operation, Command::Take { name: name.clone(), taker, permits, wait_ms }).await
    }

    /// Revokes `session`'s hold of `key` (which the caller saw granted with `token`), as an admin.
    pub async fn revoke(
        &self,
        rng: &mut impl Rng,
        session: SessionId,
        key: &Key,
        token: u64,
    ) -> Option<Outcome> {
        let operation = Operation::Revoke { session, key: key.clone(), token };
        self.propose(rng, operation, Command::Revoke { key: key.clone(), session }).await
    }

    /// A new session id, drawn as the HTTP API does: by a node that believes it leads (from its
    /// seeded id source), else by `rng`.
    pub fn new_session_id(&self, rng: &mut impl Rng) -> SessionId {
        match self.cluster.pick_leader(rng) {
            Some(node) => node.new_session_id(),
            None => SessionId::from_bytes(rng.random()),
        }
    }

    /// Creates a session.
    pub async fn create_session(
        &self,
        rng: &mut impl Rng,
        session: SessionId,
        ttl_ms: u64,
    ) -> Option<Outcome> {
        let operation = Operation::CreateSession { session, ttl_ms };
        self.propose(rng, operation, Command::CreateSession { id: session, ttl_ms, name: None }).await
    }

    /// Acquires permits of an existing semaphore.
    pub async fn acquire(
        &self,
        rng: &mut impl Rng,
        session: SessionId,
        key: &Key,
        permits: u64,
        wait: bool,
        max_hold_ms: Option<u64>,
    ) -> Option<Outcome> {
        let operation = Operation::Acquire { session, key: key.clone(), permits, wait, max_hold_ms };
        let acquire =
            Acquire { key: key.clone(), session, permits, wait, capacity: None, max_hold_ms, value: None };
        self.propose(rng, operation, Command::Acquire(acquire)).await
    }

    /// Releases a hold or cancels a wait.
    pub async fn release(&self, rng: &mut impl Rng, session: SessionId, key: &Key) -> Option<Outcome> {
        let operation = Operation::Release { session, key: key.clone() };
        self.propose(rng, operation, Command::Release { key: key.clone(), session }).await
    }

    /// Creates a queue whose items are dead-lettered after `max_attempts` claims. Setup, not a
    /// client's call: not recorded. `None` when no leader was found or the outcome is unknown.
    pub async fn put_queue(&self, rng: &mut impl Rng, name: &Name, max_attempts: u32) -> Option<Outcome> {
        let node = self.leader(rng).await?;
        let settings = QueueSettings { max_attempts: Some(max_attempts), ..QueueSettings::default() };
        node.propose(Command::PutQueue { name: name.clone(), settings, creator: None }).await.ok()
    }

    /// Pushes one item.
    pub async fn push(&self, rng: &mut impl Rng, queue: &Name, payload: String) -> Option<Outcome> {
        let item = NewItem { payload: payload.clone().into(), delay_ms: 0, key: None };
        let command = Command::Push { queue: queue.clone(), items: vec![item], creator: None };
        self.propose(rng, Operation::Push { queue: queue.clone(), payload }, command).await
    }

    /// Claims at most one item without waiting, as the claim `request`.
    pub async fn claim(
        &self,
        rng: &mut impl Rng,
        session: SessionId,
        queue: &Name,
        request: u64,
    ) -> Option<Outcome> {
        let operation = Operation::Claim { session, queue: queue.clone(), request };
        let command = Command::Claim { queue: queue.clone(), session, request, max: 1, wait_ms: 0 };
        self.propose(rng, operation, command).await
    }

    /// Acks (`ack`) or nacks (pending again at once) a claimed item.
    pub async fn settle(
        &self,
        rng: &mut impl Rng,
        session: SessionId,
        queue: &Name,
        item: &SeenItem,
        ack: bool,
    ) -> Option<Outcome> {
        let (id, token, queue) = (item.id, item.token, queue.clone());
        let command = match ack {
            true => Command::Ack { queue: queue.clone(), id, session, token },
            false => Command::Nack { queue: queue.clone(), id, session, token, delay_ms: 0, error: None },
        };
        self.propose(rng, Operation::Settle { session, queue, item: id, token, ack }, command).await
    }

    /// Acks a claimed item and claims the session's next one without waiting, as the claim
    /// `request`, in one command.
    pub async fn ack_and_claim(
        &self,
        rng: &mut impl Rng,
        session: SessionId,
        queue: &Name,
        item: &SeenItem,
        request: u64,
    ) -> Option<Outcome> {
        let (id, token, queue) = (item.id, item.token, queue.clone());
        let command =
            Command::AckAndClaim { queue: queue.clone(), id, session, token, request, max: 1, wait_ms: 0 };
        self.propose(rng, Operation::AckAndClaim { session, queue, item: id, token, request }, command).await
    }

    /// Closes a session.
    pub async fn close(&self, rng: &mut impl Rng, session: SessionId) -> Option<Outcome> {
        self.propose(rng, Operation::CloseSession { session }, Command::CloseSession { id: session }).await
    }

    /// Keeps a session alive as `POST /v1/sessions/{id}/keepalive` does: confirm leadership with
    /// a quorum, then refresh the deadline in the lessor. `Some(false)`: the session is gone;
    /// `None`: unknown.
    pub async fn keepalive(&self, rng: &mut impl Rng, session: SessionId) -> Option<bool> {
        let node = self.leader(rng).await?;
        let op = self.recorder.invoke(self.client, node.id, Operation::Keepalive { session });
        let refreshed = node
            .with_lease_authority(|replica| {
                // As the server's handler: the lessor tracks exactly the applied sessions.
                replica.lessor.keepalive(session, Instant::now()).is_some()
            })
            .await;
        let kept = match refreshed {
            Ok(kept) => kept,
            Err(error) => {
                self.recorder
                    .note(format!("client {} keepalive {op} on node {}: {error}", self.client, node.id));
                return None;
            }
        };
        if kept {
            self.recorder.ack(self.client, op, Answer::KeptAlive);
        } else {
            self.recorder.ack(self.client, op, Answer::Refused(Refusal::SessionNotFound.to_string()));
            self.recorder.record(self.client, Event::SessionMissing { session });
        }
        Some(kept)
    }

    /// Reads a session on a leader, linearizably (`GET /v1/sessions/{id}`); `None` when no leader
    /// could confirm its leadership.
    pub async fn observe(&self, rng: &mut impl Rng, session: SessionId) -> Option<Observation> {
        let node = self.leader(rng).await?;
        if let Err(error) = node.ensure_linearizable().await {
            self.recorder.note(format!("client {} read on node {}: {error}", self.client, node.id));
            return None;
        }
        let observation = read_session(&node.replica().read().state, session);
        let event = Event::Observed {
            node: node.id,
            session,
            present: observation.present,
            holds: observation.holds.clone(),
        };
        self.recorder.record(self.client, event);
        Some(observation)
    }
}

/// A session's holds and waits in `state`.
pub fn read_session(state: &State, session: SessionId) -> Observation {
    let Some(found) = state.session(session) else {
        return Observation { present: false, holds: Vec::new(), waits: Vec::new() };
    };
    let holds = found
        .holds
        .iter()
        .map(|key| {
            let object = state.object(key).expect("a held object exists");
            let hold = &object.holders[&session];
            SeenHold { key: key.clone(), permits: hold.permits, token: hold.token }
        })
        .collect();
    Observation { present: true, holds, waits: found.waits.iter().cloned().collect() }
}
