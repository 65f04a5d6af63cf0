//! The history: what the simulated clients sent and what they were told, in real-time order.
//!
//! An operation whose answer was lost (a timeout, a leader change, a crash) has an invoke record
//! and no ack record: its outcome is unknown, and the checker treats it as possibly applied at any
//! later time. Only acknowledged answers carry promises.

use std::fmt;
use std::time::Duration;

use permit_core::{Key, Name, SessionId};
use permit_server::raft::NodeId;

/// A moment of the simulation: simulated time since its start, and the sequence number of the
/// record made then, which orders records made at the same instant. Deadlines computed from a
/// TTL have sequence number 0: they fall before anything recorded at that instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Point {
    /// Simulated time since the simulation started.
    pub at: Duration,
    /// Order of the record among all records; 0 for a computed deadline.
    pub seq: u64,
}

impl Point {
    /// The deadline `ttl_ms` after this point.
    pub fn plus_ms(self, ttl_ms: u64) -> Point {
        Point { at: self.at + Duration::from_millis(ttl_ms), seq: 0 }
    }

    /// The end of time, for reliance that nothing ended.
    pub const END: Point = Point { at: Duration::MAX, seq: u64::MAX };
}

impl fmt::Display for Point {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s#{}", self.at.as_secs_f64(), self.seq)
    }
}

/// Which simulated client made a record. The driver's own final checks use [`DRIVER`].
pub type ClientId = u32;

/// The client id of the driver's own operations (setup and the final capacity check).
pub const DRIVER: ClientId = u32::MAX;

/// One acknowledged hold, as a client saw it in an answer or a read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenHold {
    /// The semaphore.
    pub key: Key,
    /// Permits held.
    pub permits: u64,
    /// Fencing token.
    pub token: u64,
}

/// The answer to an operation, as its client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The session exists.
    SessionCreated,
    /// The keepalive was accepted.
    KeptAlive,
    /// The capacity is set.
    CapacitySet,
    /// Held with this token (now, or already before).
    Acquired {
        /// Permits held.
        permits: u64,
        /// Fencing token.
        token: u64,
    },
    /// Queued.
    Waiting,
    /// The hold was released or the wait cancelled.
    Released {
        /// Permits released.
        permits: u64,
    },
    /// The session is closed.
    Closed,
    /// Refused; nothing changed.
    Refused(String),
    /// The item is in the queue with this id.
    Pushed {
        /// The item's id.
        item: u64,
    },
    /// The claim took this item, or none (nothing was due).
    Claimed(Option<SeenItem>),
    /// The item's ack or nack took effect.
    Settled,
    /// The take was served with this token.
    Taken {
        /// Its fencing token.
        token: u64,
    },
}

/// An item a claim took, as its client was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenItem {
    /// The item's id.
    pub id: u64,
    /// Its payload.
    pub payload: String,
    /// The claim's fencing token.
    pub token: u64,
}

/// An item a final read found, with its state (`pending`, `delayed`, `claimed`, `dead`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedItem {
    /// The item's id.
    pub id: u64,
    /// Its payload.
    pub payload: String,
    /// Its state.
    pub state: &'static str,
}

/// An operation a client sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Set a semaphore's capacity (setup or resize).
    PutSemaphore {
        /// The semaphore.
        key: Key,
        /// The capacity sent.
        capacity: u64,
    },
    /// Create a session; acknowledged, it lives at least `ttl_ms` after this was sent.
    CreateSession {
        /// The session.
        session: SessionId,
        /// Its TTL.
        ttl_ms: u64,
    },
    /// Keep a session alive; acknowledged, it lives at least its TTL after this was sent.
    Keepalive {
        /// The session.
        session: SessionId,
    },
    /// Acquire permits.
    Acquire {
        /// The session.
        session: SessionId,
        /// The semaphore.
        key: Key,
        /// Permits asked for.
        permits: u64,
        /// Whether it may queue.
        wait: bool,
        /// Its `max_hold_ms`.
        max_hold_ms: Option<u64>,
    },
    /// Release a hold or cancel a wait: the client relies on the hold no more from here on.
    Release {
        /// The session.
        session: SessionId,
        /// The semaphore.
        key: Key,
    },
    /// An admin's revoke of a session's hold (`Command::Revoke`): that hold's client relies on it
    /// no more from here on.
    Revoke {
        /// The session whose hold ends.
        session: SessionId,
        /// The semaphore.
        key: Key,
        /// The token of the hold it means to end.
        token: u64,
    },
    /// Take rate permits without a session (`Command::Take`).
    Take {
        /// The semaphore.
        key: Key,
        /// Permits asked for.
        permits: u64,
        /// How long it may wait in the queue, in leader ms.
        wait_ms: u64,
    },
    /// Close a session: the client relies on nothing of it from here on.
    CloseSession {
        /// The session.
        session: SessionId,
    },
    /// Push one item.
    Push {
        /// The queue.
        queue: Name,
        /// The payload (JSON text, unique in the run).
        payload: String,
    },
    /// Claim at most one item without waiting, as the claim `request` (a retry sends the same).
    Claim {
        /// The claiming session.
        session: SessionId,
        /// The queue.
        queue: Name,
        /// The claim request's id.
        request: u64,
    },
    /// Ack (`ack`) or nack a claimed item: the client relies on its claim no more from here on.
    Settle {
        /// The session that claimed it.
        session: SessionId,
        /// The queue.
        queue: Name,
        /// The item.
        item: u64,
        /// The claim's token.
        token: u64,
        /// Ack (true) or nack.
        ack: bool,
    },
    /// Ack a claimed item and claim the session's next one without waiting, in one command
    /// (`Command::AckAndClaim`), as the claim `request` (a retry sends the same): the client
    /// relies on the acked claim no more from here on.
    AckAndClaim {
        /// The session that claimed it, and claims next.
        session: SessionId,
        /// The queue.
        queue: Name,
        /// The item acked.
        item: u64,
        /// Its claim's token.
        token: u64,
        /// The next claim's request id.
        request: u64,
    },
}

/// Something a client did or was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// An operation was sent.
    Invoked {
        /// Id pairing it with its answer.
        op: u64,
        /// The node it was sent to.
        node: NodeId,
        /// The operation.
        operation: Operation,
    },
    /// An operation was answered.
    Acked {
        /// The operation's id.
        op: u64,
        /// The answer.
        answer: Answer,
    },
    /// An answer said the session does not exist.
    SessionMissing {
        /// The session.
        session: SessionId,
    },
    /// The driver's linearizable read of a queue and its dead-letter queue after the run.
    QueueRead {
        /// The queue.
        queue: Name,
        /// Its items.
        items: Vec<QueuedItem>,
        /// The items of its dead-letter queue.
        dead: Vec<QueuedItem>,
        /// Whether the driver drained it first (then it must be empty).
        drained: bool,
    },
    /// A linearizable read of the session on the leader.
    Observed {
        /// The node that read.
        node: NodeId,
        /// The session.
        session: SessionId,
        /// Whether it exists.
        present: bool,
        /// Its holds.
        holds: Vec<SeenHold>,
    },
}

/// One entry of the history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// When it was recorded.
    pub point: Point,
    /// Who recorded it.
    pub client: ClientId,
    /// What happened.
    pub event: Event,
}

impl fmt::Display for Record {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let client = if self.client == DRIVER { "driver".to_owned() } else { format!("c{}", self.client) };
        write!(f, "{} {client} {:?}", self.point, self.event)
    }
}

/// Every record of one simulation, in order.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// The records, in increasing `point`.
    pub records: Vec<Record>,
}

impl History {
    /// Appends a record at `at`, returning its point.
    pub fn push(&mut self, at: Duration, client: ClientId, event: Event) -> Point {
        if let Some(last) = self.records.last() {
            assert!(at >= last.point.at, "history records are appended in time order");
        }
        let point = Point { at, seq: self.records.len() as u64 + 1 };
        self.records.push(Record { point, client, event });
        point
    }

    /// Inserts a record before `index`, at the time of the record before it, and renumbers the
    /// rest (for the checker's self-test, which tampers with real histories).
    pub fn insert(&mut self, index: usize, client: ClientId, event: Event) {
        let at = index.checked_sub(1).map_or(Duration::ZERO, |before| self.records[before].point.at);
        self.records.insert(index, Record { point: Point { at, seq: 0 }, client, event });
        for (i, record) in self.records.iter_mut().enumerate() {
            record.point.seq = i as u64 + 1;
        }
    }
}

impl Operation {
    /// The session the operation concerns, if any.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Operation::PutSemaphore { .. } | Operation::Push { .. } | Operation::Take { .. } => None,
            Operation::CreateSession { session, .. }
            | Operation::Keepalive { session }
            | Operation::Acquire { session, .. }
            | Operation::Release { session, .. }
            | Operation::Revoke { session, .. }
            | Operation::CloseSession { session }
            | Operation::Claim { session, .. }
            | Operation::Settle { session, .. }
            | Operation::AckAndClaim { session, .. } => Some(*session),
        }
    }
}
