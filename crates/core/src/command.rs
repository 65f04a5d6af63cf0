//! Commands: the only way the state changes. Each log entry carries one [`Batch`] of them.

use serde::{Deserialize, Serialize};

use crate::policy::PolicyChange;
use crate::queue::{NewItem, QueueSettings};
use crate::{Key, Name, SessionId, Token, TokenId};

/// The commands of one log entry, applied in order, with the proposing leader's clock.
///
/// Batching is group commit: the server gathers the commands of concurrent requests into one
/// entry so that they share one fsync.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The leader's clock when it proposed the batch, in milliseconds of *leader time*: a
    /// monotonic clock that each new leader continues from the largest value in the log, so it
    /// never goes backward and wall-clock jumps do not move it. The state machine takes the
    /// maximum of this and every earlier value, so replicas agree on time without reading a clock.
    pub now_ms: u64,
    /// The commands, applied in order.
    pub commands: Vec<Command>,
}

/// One state change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Opens a session. The id is random, chosen by the proposing server.
    CreateSession {
        /// The new session's id.
        id: SessionId,
        /// Its TTL in milliseconds.
        ttl_ms: u64,
        /// Optional name for humans.
        name: Option<String>,
    },
    /// Closes a session at its client's request: cancels its waits and releases its holds.
    CloseSession {
        /// The session to close.
        id: SessionId,
    },
    /// Expires sessions whose deadline passed on the leader. Unknown ids are skipped.
    ///
    /// The decision holds only for the leadership that made it: applied from a log entry of
    /// another term, the command does nothing. A leader that is replaced or re-elected extends
    /// every deadline when it takes over, so a decision queued before that no longer stands.
    ExpireSessions {
        /// The expired sessions.
        ids: Vec<SessionId>,
        /// The Raft term of the leadership that decided the expiry.
        decided_term: u64,
    },
    /// Creates a semaphore or sets the capacity of an existing one.
    PutSemaphore {
        /// The semaphore.
        name: Name,
        /// Its capacity in permits.
        capacity: u64,
    },
    /// Deletes a semaphore that nobody holds or waits on.
    DeleteSemaphore {
        /// The semaphore.
        name: Name,
    },
    /// Acquires permits of a semaphore or campaigns in an election.
    Acquire(Acquire),
    /// Releases a session's hold on an object, or cancels its wait there.
    Release {
        /// The object.
        key: Key,
        /// The session.
        session: SessionId,
    },
    /// Releases holds whose `max_hold_ms` has run out by the batch's `now_ms`.
    ExpireHolds,
    /// Opens a session that belongs to an access token: only that token may use it, and it
    /// closes when the token is deleted. (Sessions made with auth off use `CreateSession`.)
    CreateOwnedSession {
        /// The new session's id.
        id: SessionId,
        /// Its TTL in milliseconds.
        ttl_ms: u64,
        /// Optional name for humans.
        name: Option<String>,
        /// The token that creates it.
        owner: TokenId,
        /// Refuse if the owner has this many live sessions already (the server's
        /// `--sessions-per-token-max`, carried as a value so that every replica decides alike).
        owner_sessions_max: u64,
    },
    /// Creates an access token. The id and the secret are random, chosen by the server.
    CreateToken {
        /// The new token's id ([`crate::ROOT_TOKEN_ID`] for the bootstrap of the root token).
        id: TokenId,
        /// The token.
        token: Token,
    },
    /// Deletes an access token and closes every session it created.
    DeleteToken {
        /// The token.
        id: TokenId,
    },
    /// Like [`Command::Acquire`]; a semaphore it creates is *ephemeral*: it is deleted when its
    /// last holder and waiter leave (as elections are), unless a `PutSemaphore` made it
    /// permanent meanwhile.
    AcquireEphemeral(Acquire),
    /// Like [`Command::Release`], by an admin for another session: the same change, observed as
    /// a revoke (the event stream and metrics label it so).
    Revoke {
        /// The object.
        key: Key,
        /// The session whose hold or wait ends.
        session: SessionId,
    },
    /// Like [`Command::PutSemaphore`], on behalf of an access token: a semaphore it creates
    /// counts against the token's cap of objects. (Commands made with auth off, and logs
    /// written before the cap existed, use `PutSemaphore`.)
    PutSemaphoreBy {
        /// The semaphore.
        name: Name,
        /// Its capacity in permits.
        capacity: u64,
        /// The token on whose behalf, and its cap.
        creator: Creator,
    },
    /// Like [`Command::Acquire`] (or [`Command::AcquireEphemeral`]), on behalf of an access
    /// token: an object it creates counts against the token's cap of objects.
    AcquireBy {
        /// The acquire or campaign.
        acquire: Acquire,
        /// Whether a semaphore it creates is ephemeral, as with [`Command::AcquireEphemeral`].
        ephemeral: bool,
        /// The token on whose behalf, and its cap.
        creator: Creator,
    },
    /// Sets the cluster's token salt, once: the key of the HMAC-SHA256 under which token secrets
    /// are stored from then on. Drawn at random by the leader that bootstraps the root token (or,
    /// for a cluster made before salts, by the first leader that finds none). A second one is
    /// refused, so that every replica keeps the first.
    SetTokenSalt {
        /// 256 random bits.
        salt: [u8; 32],
        /// The root token, its secret hashed under `salt`, to create in the same step when the
        /// cluster never had one: the bootstrap is one entry, so no moment exists with a salt
        /// and no root. If it cannot be created, nothing changes.
        root: Option<Token>,
    },
    /// Raises the cluster's feature version (docs/operations.md, *Upgrading*): from this entry
    /// on, commands that need `version` may be written. A leader proposes it once every member
    /// (voter and learner) speaks `version` or newer; it never lowers the version. A replica
    /// whose build speaks less than `version` stops before applying it (the server's
    /// `raft::version`): every command that needs `version` comes after this entry in the log.
    SetClusterVersion {
        /// The new version.
        version: u32,
    },
    /// An election's leader publishes a new value (etcd's `Proclaim`): the hold, its token and
    /// its tenure stay; only the session that leads may. Refused with [`crate::Refusal::NotLeader`]
    /// otherwise, and the value is checked as a campaign's is.
    Proclaim {
        /// The election.
        key: Key,
        /// The session that leads it.
        session: SessionId,
        /// The new value (at most [`crate::limits::ELECTION_VALUE_BYTES_MAX`] bytes).
        value: String,
    },
    /// Creates a queue or changes its settings.
    PutQueue {
        /// The queue.
        name: Name,
        /// Its settings; each `None` keeps the current value (or the default, for a new queue).
        settings: QueueSettings,
        /// The token on whose behalf, and its cap of objects (`None` with auth off).
        creator: Option<Creator>,
    },
    /// Deletes a queue that holds no item and no blocked claim.
    DeleteQueue {
        /// The queue.
        name: Name,
    },
    /// Appends items to a queue, in order, creating the queue with the defaults if needed. All
    /// or nothing: a full queue takes none.
    Push {
        /// The queue.
        queue: Name,
        /// The items (1..=[`crate::limits::QUEUE_PUSH_ITEMS_MAX`]).
        items: Vec<NewItem>,
        /// The token on whose behalf, and its cap of objects (`None` with auth off).
        creator: Option<Creator>,
    },
    /// Claims up to `max` due items for `session`, in `seq` order; with none due and
    /// `wait_ms > 0`, queues the claim behind earlier blocked ones until items come or `wait_ms`
    /// of leader time passes. The same `request` again answers the same claim.
    Claim {
        /// The queue.
        queue: Name,
        /// The claiming session.
        session: SessionId,
        /// The claim request's id: unique per session (a client's retry sends the same).
        request: u64,
        /// Most items to claim.
        max: u32,
        /// How long to stay queued for items, in leader ms.
        wait_ms: u64,
    },
    /// Ends a blocked claim (its client stopped waiting); items it took before stay claimed.
    CancelClaim {
        /// The queue.
        queue: Name,
        /// The claiming session.
        session: SessionId,
        /// The claim request.
        request: u64,
    },
    /// Settles a claimed item as done: it is gone.
    Ack {
        /// The queue.
        queue: Name,
        /// The item.
        id: u64,
        /// The session that claimed it.
        session: SessionId,
        /// The claim's fencing token.
        token: u64,
    },
    /// Settles a claimed item as failed: pending again in its `seq` place (after `delay_ms`),
    /// or dead-lettered after `max_attempts` claims.
    Nack {
        /// The queue.
        queue: Name,
        /// The item.
        id: u64,
        /// The session that claimed it.
        session: SessionId,
        /// The claim's fencing token.
        token: u64,
        /// Keep it out of claims this long, in leader ms.
        delay_ms: u64,
        /// Why, kept as the item's `last_error`.
        error: Option<String>,
    },
    /// Removes one item, whatever its state (an admin's cleanup); a claim of it ends.
    RemoveItem {
        /// The queue.
        queue: Name,
        /// The item.
        id: u64,
    },
    /// Moves delayed items whose time came to pending and hands them to blocked claims.
    PromoteDueItems,
    /// Like [`Command::PutSemaphore`] (or [`Command::PutSemaphoreBy`] with a creator), and
    /// changes the semaphore's policy: its rate, lock-delay and group cap.
    PutSemaphorePolicy {
        /// The semaphore.
        name: Name,
        /// Its capacity in permits.
        capacity: u64,
        /// What changes of its policy.
        policy: PolicyChange,
        /// The token on whose behalf, and its cap of objects (`None` with auth off).
        creator: Option<Creator>,
    },
    /// Like [`Command::Acquire`] (or its ephemeral and token forms), counted against `group`
    /// under the semaphore's `group_max`.
    AcquireInGroup {
        /// The acquire.
        acquire: Acquire,
        /// Whether a semaphore it creates is ephemeral.
        ephemeral: bool,
        /// The token on whose behalf, and its cap of objects (`None` with auth off).
        creator: Option<Creator>,
        /// The group.
        group: Name,
    },
    /// Takes `permits` of the semaphore's rate without a session: served at once when the rate
    /// allows and nobody waits before it; otherwise refused, or (with `wait_ms`) queued in the
    /// semaphore's FIFO queue under the id `taker` until served or `wait_ms` of leader time passes.
    Take {
        /// The semaphore.
        name: Name,
        /// The take's id, drawn at random by the proposing server (it stands in the queue where
        /// a session would).
        taker: SessionId,
        /// Permits to take.
        permits: u64,
        /// How long to wait in the queue, in leader ms.
        wait_ms: u64,
    },
    /// Ends a waiting take (its client stopped waiting).
    CancelTake {
        /// The semaphore.
        name: Name,
        /// The take's id.
        taker: SessionId,
    },
    /// Ends the lock-delays and take waits whose time came, and grants what the rate allows now.
    PolicyTick,
    /// [`Command::Ack`] of item `id`, then [`Command::Claim`] for the same session on the same
    /// queue, in one apply: a worker's loop in one command. All or nothing: a refusal of either
    /// part (a lost claim, a claim over its limits) changes nothing.
    AckAndClaim {
        /// The queue.
        queue: Name,
        /// The item acked.
        id: u64,
        /// The session that claimed it, and claims next.
        session: SessionId,
        /// The acked claim's fencing token.
        token: u64,
        /// The next claim's request id: unique per session.
        request: u64,
        /// Most items to claim.
        max: u32,
        /// How long the claim stays queued for items, in leader ms.
        wait_ms: u64,
    },
}

/// The feature version this build's commands speak: the highest [`Command::feature_version`].
///
/// - 1: builds from before versioning (they report no version).
/// - 2: [`Command::Revoke`] (older than versioning, but a member that reports no version may be
///   older than it too) and [`Command::SetClusterVersion`].
/// - 3: [`Command::Proclaim`].
/// - 4: work queues ([`Command::PutQueue`] to [`Command::PromoteDueItems`], and tokens with
///   rules on [`crate::Resource::Queue`]).
/// - 5: semaphore policies ([`Command::PutSemaphorePolicy`] to [`Command::PolicyTick`]).
/// - 6: [`Command::AckAndClaim`].
pub const FEATURE_VERSION: u32 = 6;

impl Command {
    /// The cluster feature version a command needs: the version in which it appeared. A new
    /// command needs a new version, so that no member that cannot decode it is ever sent one
    /// (the state machine refuses it below that version; the server refuses it before that).
    pub fn feature_version(&self) -> u32 {
        match self {
            Command::CreateSession { .. }
            | Command::CloseSession { .. }
            | Command::ExpireSessions { .. }
            | Command::PutSemaphore { .. }
            | Command::DeleteSemaphore { .. }
            | Command::Acquire(_)
            | Command::Release { .. }
            | Command::ExpireHolds
            | Command::CreateOwnedSession { .. }
            | Command::DeleteToken { .. }
            | Command::AcquireEphemeral(_)
            | Command::PutSemaphoreBy { .. }
            | Command::AcquireBy { .. } => 1,
            // A token may carry rules on resources newer than the command.
            Command::CreateToken { token, .. } | Command::SetTokenSalt { root: Some(token), .. } => {
                token.feature_version()
            }
            Command::SetTokenSalt { root: None, .. } => 1,
            Command::Revoke { .. } | Command::SetClusterVersion { .. } => 2,
            Command::Proclaim { .. } => 3,
            Command::PutQueue { .. }
            | Command::DeleteQueue { .. }
            | Command::Push { .. }
            | Command::Claim { .. }
            | Command::CancelClaim { .. }
            | Command::Ack { .. }
            | Command::Nack { .. }
            | Command::RemoveItem { .. }
            | Command::PromoteDueItems => 4,
            Command::PutSemaphorePolicy { .. }
            | Command::AcquireInGroup { .. }
            | Command::Take { .. }
            | Command::CancelTake { .. }
            | Command::PolicyTick => 5,
            Command::AckAndClaim { .. } => 6,
        }
    }
}

impl Batch {
    /// The highest feature version a command of the batch needs (1 for none).
    pub fn feature_version(&self) -> u32 {
        let needs = self.commands.iter().map(Command::feature_version).max().unwrap_or(1);
        // A raise needs the version it raises to: a replica that speaks less must not apply it.
        let raises = self.commands.iter().filter_map(|command| match command {
            Command::SetClusterVersion { version } => Some(*version),
            _ => None,
        });
        raises.fold(needs, u32::max)
    }
}

/// The access token on whose behalf a command may create a semaphore or an election, with the
/// most objects it may have created that still exist (the server's `--objects-per-token-max`,
/// carried as a value so that every replica decides alike).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Creator {
    /// The token.
    pub token: TokenId,
    /// Refuse a creation when the token has created this many objects that still exist.
    pub objects_max: u64,
}

/// An acquire or a campaign.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Acquire {
    /// The object; for an election the permits are 1 and the capacity is 1.
    pub key: Key,
    /// The acquiring session.
    pub session: SessionId,
    /// Permits asked for.
    pub permits: u64,
    /// Queue the request when it cannot be granted at once (`false`: try-acquire).
    pub wait: bool,
    /// Capacity with which to create the semaphore if it does not exist.
    pub capacity: Option<u64>,
    /// Release the hold this long after the grant even if the session lives.
    pub max_hold_ms: Option<u64>,
    /// Value to publish when granted (elections only).
    pub value: Option<String>,
}
