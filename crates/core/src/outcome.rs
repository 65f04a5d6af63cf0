//! What applying a command produced: an [`Outcome`] per command, and [`Effect`]s for the shell.

use serde::{Deserialize, Serialize};

use crate::queue::{ClaimedItem, PushedItem, Settled};
use crate::{Key, Name, SessionId};

/// The result of one command, returned to the client that proposed it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// The session exists now.
    SessionCreated,
    /// The session is closed; its holds were released.
    SessionClosed,
    /// This many of the named sessions existed and are expired now.
    SessionsExpired {
        /// Sessions expired.
        expired: u64,
    },
    /// A semaphore was created with the given capacity.
    SemaphoreCreated,
    /// An existing semaphore's capacity was set.
    SemaphoreUpdated,
    /// The semaphore is gone.
    SemaphoreDeleted,
    /// The session holds the permits (now, or already before this command).
    Acquired {
        /// Permits held.
        permits: u64,
        /// The hold's fencing token.
        token: u64,
    },
    /// The session waits in the queue.
    Waiting {
        /// 1-based position in the queue.
        position: u64,
    },
    /// The session's hold was released or its wait cancelled.
    Released {
        /// Permits released; 0 when the session held nothing (a cancelled wait, or nothing).
        permits: u64,
    },
    /// This many holds ran past their `max_hold_ms` and were released.
    HoldsExpired {
        /// Holds released.
        expired: u64,
    },
    /// The command changed nothing, for this reason.
    Refused(Refusal),
    /// The access token exists now.
    TokenCreated,
    /// The access token is gone, and so are the sessions it had created.
    TokenDeleted {
        /// Sessions closed with it.
        sessions_closed: u64,
    },
    /// The cluster's token salt is set.
    TokenSaltSet,
    /// The cluster's feature version is this now (it was raised, or was this high already).
    ClusterVersionSet {
        /// The cluster's feature version.
        version: u32,
    },
    /// The leader's value is the proclaimed one now; its hold is unchanged.
    Proclaimed {
        /// The leadership's fencing token.
        token: u64,
        /// Leader time at which the leadership began (its tenure is unchanged).
        granted_at_ms: u64,
    },
    /// The queue exists now with the settings.
    QueuePut {
        /// It did not exist before.
        created: bool,
    },
    /// The queue is gone.
    QueueDeleted,
    /// The items are in the queue (or were: duplicates).
    Pushed {
        /// One per pushed item, in order.
        items: Vec<PushedItem>,
    },
    /// The session claimed these items (none: nothing was due, and the claim did not wait).
    Claimed {
        /// The items, in `seq` order.
        items: Vec<ClaimedItem>,
    },
    /// The claim waits for items behind earlier blocked claims.
    ClaimWaiting,
    /// The blocked claim is over (or was already).
    ClaimCancelled,
    /// The item is done and gone.
    Acked,
    /// The item's claim ended; it went here.
    Nacked {
        /// Where it went.
        settled: Settled,
    },
    /// The item is gone.
    ItemRemoved,
    /// This many delayed items became pending.
    ItemsPromoted {
        /// Items moved.
        promoted: u64,
    },
    /// A take was served: the rate granted its permits.
    Taken {
        /// The take's fencing token.
        token: u64,
    },
    /// A take waits in the semaphore's queue for the rate.
    TakeWaiting,
    /// A take's wait was ended at its client's request.
    TakeCancelled {
        /// Whether it was still waiting (false: it was served or its wait ran out before).
        waiting: bool,
    },
    /// Due delays and take waits ended, and what they allowed was granted.
    PoliciesTicked {
        /// Semaphores visited.
        semaphores: u64,
    },
}

/// Why a command changed nothing. Every variant is something a client can cause; bugs are
/// assertions instead.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Refusal {
    /// The session does not exist (never did, closed, or expired).
    #[error("session not found")]
    SessionNotFound,
    /// A session with this id exists already (a random-id collision).
    #[error("session id already in use")]
    SessionExists,
    /// The semaphore does not exist and the acquire carried no capacity to create it.
    #[error("semaphore not found")]
    SemaphoreNotFound,
    /// A try-acquire found too few free permits or a non-empty queue.
    #[error("not enough free permits, or others are waiting")]
    Unavailable,
    /// More permits were asked for than the semaphore's capacity.
    #[error("{permits} permits asked for, capacity is {capacity}")]
    PermitsExceedCapacity {
        /// Permits asked for.
        permits: u64,
        /// Capacity of the semaphore.
        capacity: u64,
    },
    /// The session already holds or waits for a different number of permits here.
    #[error("session already holds or waits for {existing} permits here, not {requested}")]
    PermitsMismatch {
        /// Permits of the existing hold or wait.
        existing: u64,
        /// Permits asked for now.
        requested: u64,
    },
    /// The semaphore cannot be deleted while it has holders or waiters.
    #[error("semaphore has holders or waiters")]
    SemaphoreBusy,
    /// A value is outside its documented range.
    #[error("{field} is out of range: {reason}")]
    InvalidArgument {
        /// The field at fault.
        field: Field,
        /// What the range is.
        reason: String,
    },
    /// A limit from [`crate::limits`] would be exceeded.
    #[error("limit reached: {0}")]
    LimitExceeded(Limit),
    /// The access token does not exist (never created, or deleted).
    #[error("access token not found")]
    TokenNotFound,
    /// An access token with this id or secret exists already, or the root token was created
    /// before (or, for [`crate::Command::SetTokenSalt`], the salt was set before).
    #[error("access token already exists")]
    TokenExists,
    /// The command needs a newer cluster feature version than the cluster has agreed on (a
    /// member runs an older build).
    #[error("this needs cluster feature version {needs}; the cluster is at version {cluster}")]
    FeatureUnavailable {
        /// The version the command needs.
        needs: u32,
        /// The cluster's version.
        cluster: u32,
    },
    /// A proclaim by a session that does not lead the election (another does, or none).
    #[error("the session does not lead this election")]
    NotLeader,
    /// The queue does not exist.
    #[error("queue not found")]
    QueueNotFound,
    /// The queue holds items or blocked claims and cannot be deleted.
    #[error("the queue holds items or blocked claims")]
    QueueBusy,
    /// The queue holds `max_items` items.
    #[error("the queue is full: it holds its max_items ({max_items})")]
    QueueFull {
        /// The queue's `max_items`.
        max_items: u64,
    },
    /// An item's payload is larger than [`crate::limits::QUEUE_PAYLOAD_BYTES_MAX`].
    #[error("a payload of {bytes} bytes is larger than 65536")]
    PayloadTooLarge {
        /// The payload's size.
        bytes: u64,
    },
    /// The session and token do not own a claim of the item (any more).
    #[error("this session and token do not hold a claim of the item: it ended, or was never theirs")]
    ClaimLost,
    /// The queue has no item with this id.
    #[error("item not found")]
    ItemNotFound,
    /// The semaphore's rate (or earlier waiters) leaves no room for the take now.
    #[error("the semaphore's rate allows this in {retry_after_ms} ms")]
    RateLimited {
        /// Leader ms until the rate would allow it (at least 1).
        retry_after_ms: u64,
    },
}

/// Request fields that can be out of range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Field {
    /// `ttl_ms` of a session.
    TtlMs,
    /// `name` of a session.
    SessionName,
    /// `capacity` of a semaphore.
    Capacity,
    /// `permits` of an acquire.
    Permits,
    /// `max_hold_ms` of an acquire.
    MaxHoldMs,
    /// `value` of a campaign.
    Value,
    /// `name` of an access token.
    TokenName,
    /// `rules` of an access token.
    Rules,
    /// `max_attempts` of a queue.
    MaxAttempts,
    /// `max_items` of a queue.
    MaxItems,
    /// `dead_letter` of a queue.
    DeadLetter,
    /// `items` of a push.
    Items,
    /// `payload` of an item.
    Payload,
    /// `delay_ms` of a push or nack.
    DelayMs,
    /// `key` of an item.
    ItemKey,
    /// `max` of a claim.
    Max,
    /// `wait_ms` of a claim.
    WaitMs,
    /// `error` of a nack.
    Error,
    /// `rate` of a semaphore.
    Rate,
    /// `lock_delay_ms` of a semaphore.
    LockDelayMs,
    /// `group_max` of a semaphore.
    GroupMax,
    /// `group` of an acquire.
    Group,
    /// `request_id` of a claim.
    RequestId,
}

impl Field {
    /// The field's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Field::TtlMs => "ttl_ms",
            Field::SessionName => "name",
            Field::Capacity => "capacity",
            Field::Permits => "permits",
            Field::MaxHoldMs => "max_hold_ms",
            Field::Value => "value",
            Field::TokenName => "name",
            Field::Rules => "rules",
            Field::MaxAttempts => "max_attempts",
            Field::MaxItems => "max_items",
            Field::DeadLetter => "dead_letter",
            Field::Items => "items",
            Field::Payload => "payload",
            Field::DelayMs => "delay_ms",
            Field::ItemKey => "key",
            Field::Max => "max",
            Field::WaitMs => "wait_ms",
            Field::Error => "error",
            Field::Rate => "rate",
            Field::LockDelayMs => "lock_delay_ms",
            Field::GroupMax => "group_max",
            Field::Group => "group",
            Field::RequestId => "request_id",
        }
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The limits a command can run into.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Limit {
    /// [`crate::limits::SESSIONS_MAX`].
    #[error("too many sessions")]
    Sessions,
    /// [`crate::limits::OBJECTS_MAX`].
    #[error("too many semaphores and elections")]
    Objects,
    /// [`crate::limits::WAITERS_PER_OBJECT_MAX`].
    #[error("too many waiters on this object")]
    WaitersPerObject,
    /// [`crate::limits::KEYS_PER_SESSION_MAX`].
    #[error("too many holds and waits in this session")]
    KeysPerSession,
    /// [`crate::limits::TOKENS_MAX`].
    #[error("too many access tokens")]
    Tokens,
    /// The per-token session cap the server carried in the command (`--sessions-per-token-max`).
    #[error("this token has as many live sessions as it may")]
    SessionsPerToken,
    /// The per-token object cap the server carried in the command (`--objects-per-token-max`).
    #[error("this token has created as many semaphores, elections and queues as it may")]
    ObjectsPerToken,
    /// [`crate::limits::QUEUES_MAX`].
    #[error("too many queues")]
    Queues,
    /// [`crate::limits::ITEMS_MAX`].
    #[error("too many items in all queues")]
    Items,
    /// [`crate::limits::CLAIMS_PER_SESSION_MAX`].
    #[error("this session has claimed as many items of this queue as it may")]
    ClaimsPerSession,
}

/// A change the shell must react to: wake a long-poll, arm an expiry timer.
///
/// Effects describe what `apply` did; they carry no decisions, so the shell may drop them on a
/// follower and the state stays the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// A session was created.
    SessionCreated {
        /// The session.
        id: SessionId,
        /// Its TTL in milliseconds.
        ttl_ms: u64,
    },
    /// A session is gone (closed or expired).
    SessionRemoved {
        /// The session.
        id: SessionId,
    },
    /// A session's wait on an object ended: granted, cancelled, or refused.
    WaitEnded {
        /// The object.
        key: Key,
        /// The session.
        session: SessionId,
    },
    /// An object changed (watchers wake).
    ObjectChanged {
        /// The object.
        key: Key,
    },
    /// A hold with a `max_hold_ms` deadline was granted (the expiry timer may need re-arming).
    HoldDeadlineSet {
        /// Leader time of the deadline.
        expires_at_ms: u64,
    },
    /// Something an observer may want to see (the event stream, per-object metrics).
    Event(Box<Event>),
    /// A try-acquire (`wait: false`) found too few free permits or a non-empty queue.
    TryAcquireRefused {
        /// The object.
        key: Key,
    },
    /// An object was deleted (an explicit delete, or an idle election or ephemeral semaphore).
    ObjectRemoved {
        /// The object.
        key: Key,
    },
    /// A delayed item is due at this leader time (the promotion timer may need re-arming).
    ItemDueSet {
        /// Leader time of the earliest due item.
        due_ms: u64,
    },
    /// A waiting take was served (its long-poll reads the token here: a take holds nothing in
    /// the state to read it from).
    Taken {
        /// The semaphore.
        key: Key,
        /// The take's id.
        taker: SessionId,
        /// Its fencing token.
        token: u64,
    },
    /// A semaphore's policy has something due at this leader time (the timer may need
    /// re-arming).
    PolicyDueSet {
        /// Leader time.
        at_ms: u64,
    },
}

/// What happened, for observers. The shell numbers events and adds the log index and leader
/// time of the entry that caused them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A session was opened.
    SessionCreated,
    /// A session expired (its TTL ran out on the leader).
    SessionExpired,
    /// A session was closed by its client (or its token was deleted).
    SessionClosed,
    /// An acquire or campaign joined an object's queue.
    Queued,
    /// Permits were granted (at once, or to a waiter from the queue).
    Granted,
    /// A hold was released by its session (or its session was closed).
    Released,
    /// A wait ended without a grant.
    WaitEnded,
    /// A hold ended because its session expired, or its `max_hold_ms` ran out.
    Expired,
    /// A hold (or wait) was ended by an admin's revoke.
    Revoked,
    /// A semaphore was created or its capacity was set.
    CapacityChanged,
    /// An election's leader changed (or it has none now).
    LeaderChanged,
    /// An election's leader published a new value ([`crate::Command::Proclaim`]); the leader,
    /// its token and its tenure are unchanged.
    Proclaimed,
    /// An item entered a queue by a push.
    Pushed,
    /// An item was claimed.
    Claimed,
    /// A claimed item was acked: it is gone.
    Acked,
    /// A claim ended without an ack: nacked, or its session ended.
    Nacked,
    /// An item claimed `max_attempts` times moved to its dead-letter queue.
    Dead,
    /// A take was served by the semaphore's rate.
    Taken,
    /// A take was refused by the semaphore's rate, or its wait for the rate ran out.
    RateLimited,
    /// Permits that the lock-delay kept out of circulation returned.
    DelayEnded,
}

impl EventKind {
    /// Every kind, in documentation order.
    pub const ALL: [EventKind; 20] = [
        EventKind::SessionCreated,
        EventKind::SessionExpired,
        EventKind::SessionClosed,
        EventKind::Queued,
        EventKind::Granted,
        EventKind::Released,
        EventKind::WaitEnded,
        EventKind::Expired,
        EventKind::Revoked,
        EventKind::CapacityChanged,
        EventKind::LeaderChanged,
        EventKind::Proclaimed,
        EventKind::Pushed,
        EventKind::Claimed,
        EventKind::Acked,
        EventKind::Nacked,
        EventKind::Dead,
        EventKind::Taken,
        EventKind::RateLimited,
        EventKind::DelayEnded,
    ];

    /// The kind's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::SessionCreated => "session_created",
            EventKind::SessionExpired => "session_expired",
            EventKind::SessionClosed => "session_closed",
            EventKind::Queued => "queued",
            EventKind::Granted => "granted",
            EventKind::Released => "released",
            EventKind::WaitEnded => "wait_ended",
            EventKind::Expired => "expired",
            EventKind::Revoked => "revoked",
            EventKind::CapacityChanged => "capacity_changed",
            EventKind::LeaderChanged => "leader_changed",
            EventKind::Proclaimed => "proclaimed",
            EventKind::Pushed => "pushed",
            EventKind::Claimed => "claimed",
            EventKind::Acked => "acked",
            EventKind::Nacked => "nacked",
            EventKind::Dead => "dead",
            EventKind::Taken => "taken",
            EventKind::RateLimited => "rate_limited",
            EventKind::DelayEnded => "delay_ended",
        }
    }

    /// The kind called `name` on the wire.
    pub fn parse(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }

    /// Whether the event is about a session rather than an object.
    pub fn is_session(self) -> bool {
        matches!(self, EventKind::SessionCreated | EventKind::SessionExpired | EventKind::SessionClosed)
    }
}

/// Why a wait ended without a grant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitEndReason {
    /// The client gave up (reserved: the server keeps a queued place when a long-poll times out,
    /// and a client that stops waiting releases, which is `Cancelled`).
    Timeout,
    /// Released by its session, revoked, or refused because the capacity shrank below it.
    Cancelled,
    /// Its session was closed or expired.
    SessionEnded,
}

impl WaitEndReason {
    /// The reason's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitEndReason::Timeout => "timeout",
            WaitEndReason::Cancelled => "cancelled",
            WaitEndReason::SessionEnded => "session_ended",
        }
    }
}

/// One observable change. Fields that do not apply to the kind are `None`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// What happened.
    pub kind: EventKind,
    /// The object, for object events.
    pub key: Option<Key>,
    /// The session concerned (for `leader_changed`: the new leader's, absent without one).
    pub session: Option<SessionId>,
    /// That session's name, if it has one.
    pub session_name: Option<String>,
    /// Session events (`session_created`, `session_expired`, `session_closed`): the token that
    /// created the session, when auth was on (the event stream shows them to that token, and
    /// to `session` admins, only).
    pub session_owner: Option<crate::TokenId>,
    /// Permits granted, held, released or asked for.
    pub permits: Option<u64>,
    /// The hold's fencing token.
    pub token: Option<u64>,
    /// `capacity_changed`: the new capacity.
    pub capacity: Option<u64>,
    /// `leader_changed`: the new leader's value; `proclaimed`: the leader's new value.
    pub value: Option<String>,
    /// `wait_ended`: why.
    pub reason: Option<WaitEndReason>,
    /// Hold ends (`released`, `expired`, `revoked`): how long the hold lasted, in leader ms.
    pub held_ms: Option<u64>,
    /// `granted`: whether the grant went to a queued waiter (rather than at once).
    pub from_queue: bool,
    /// Queue events: the item's id.
    pub item: Option<u64>,
    /// `claimed`, `acked`, `nacked`, `dead`: the item's claims so far.
    pub attempt: Option<u32>,
    /// `nacked`, `dead`: why the last claim ended.
    pub error: Option<String>,
    /// `pushed`: the item's delay, when it has one; `expired`, `revoked`: the semaphore's
    /// lock-delay, when the hold's permits stay out of circulation that long.
    pub delay_ms: Option<u64>,
    /// `dead`: the dead-letter queue it moved to.
    pub dead_letter: Option<Name>,
    /// `claimed`: how long the item had been in the queue, in leader ms.
    pub waited_ms: Option<u64>,
}

impl Event {
    /// An event of `kind` with no fields set.
    pub fn new(kind: EventKind) -> Event {
        Event {
            kind,
            key: None,
            session: None,
            session_name: None,
            session_owner: None,
            permits: None,
            token: None,
            capacity: None,
            value: None,
            reason: None,
            held_ms: None,
            from_queue: false,
            item: None,
            attempt: None,
            error: None,
            delay_ms: None,
            dead_letter: None,
            waited_ms: None,
        }
    }
}
