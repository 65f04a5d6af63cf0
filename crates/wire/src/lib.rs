//! Permit's wire format: the JSON bodies of the HTTP API and its error codes.
//!
//! This crate is shared by `permit-server` and `permit-client` and holds no logic, so that a wire
//! shape never freezes an internal type. Requests reject unknown fields. The HTTP routes, status
//! codes and limits are documented in the OpenAPI spec served at [`OPENAPI_PATH`].
#![deny(missing_docs)]

mod error;
mod policies;
mod queues;

pub use error::{ErrorBody, ErrorCode, ErrorDetail};
pub use policies::*;
pub use queues::*;

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Response header carrying the index (Raft log index) of the object's last change; pass it back
/// as `?index=` to block until the object changes again.
pub const INDEX_HEADER: &str = "permit-index";
/// Request header marking a request a follower forwarded to the leader; a node that receives a
/// forwarded request and is not the leader answers `no_leader` instead of forwarding again. It
/// counts only together with a valid peer credential ([`PEER_AUTH_HEADER`]); without one the
/// server removes it and serves the request as any client's.
pub const FORWARDED_HEADER: &str = "permit-forwarded-by";
/// Peer request header: the id of the node sending a Raft RPC or forwarding a request.
pub const PEER_ID_HEADER: &str = "permit-peer-id";
/// Peer request header: the message's authenticator, hex HMAC-SHA256 under the cluster secret
/// (`permit serve --cluster-secret-file`) over the sender, the receiver, the receiver's nonce,
/// the sender's nonce and counter, the method and path, the body's SHA-256 and the sender's
/// membership claim (see `docs/security.md`, "Peer channel").
pub const PEER_AUTH_HEADER: &str = "permit-peer-auth";
/// Peer request header: `RECEIVER.SENDER.COUNTER` in hex: the receiving node's nonce (it
/// changes on every start of that node; a refusal names the current one in this header), the
/// sending node's nonce, and the sender's message counter toward that receiver.
pub const PEER_NONCE_HEADER: &str = "permit-peer-nonce";
/// Peer request header: lowercase hex SHA-256 of the request body.
pub const PEER_BODY_HEADER: &str = "permit-peer-body";
/// Peer request header on Raft RPCs: the sender's membership, `TERM.NODE.INDEX:ID,ID,...` (the
/// log id of its membership entry and every member), so that a node that missed membership
/// changes can accept the leader it does not know yet.
pub const PEER_MEMBERS_HEADER: &str = "permit-peer-members";
/// Response header naming the node that answered (after forwarding, the leader).
pub const NODE_HEADER: &str = "permit-node";
/// Response header with the URL (`http://host:port`, `https://` on a TLS cluster) of the node
/// that leads, as the answering node knows it; absent while it knows no leader. A client given
/// several endpoints may send its requests to the one this names, which saves the hop a follower
/// forwards them over.
pub const LEADER_HEADER: &str = "permit-leader";
/// Response header with the Raft term of the node that answered.
pub const TERM_HEADER: &str = "permit-raft-term";
/// Path of the OpenAPI spec.
pub const OPENAPI_PATH: &str = "/v1/openapi.json";
/// Default port of `permit serve`.
pub const DEFAULT_PORT: u16 = 7376;
/// Longest long-poll the server holds a request for, in milliseconds; longer `wait_ms` is cut.
pub const WAIT_MS_MAX: u64 = 60_000;
/// Largest request body, in bytes.
pub const BODY_BYTES_MAX: usize = 64 * 1024;
/// Most session ids in one `POST /v1/sessions/keepalive`. A full batch of 32-digit ids is about
/// 36 KiB of JSON, well under [`BODY_BYTES_MAX`].
pub const KEEPALIVE_BATCH_MAX: usize = 1024;

/// `POST /v1/sessions`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSessionRequest {
    /// Time to live after the last keepalive, in ms: 200..=86400000, default 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 200, maximum = 86400000))]
    pub ttl_ms: Option<u64>,
    /// A name for humans (at most 256 bytes), shown by `GET` routes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 256))]
    pub name: Option<String>,
}

/// `201` answer to `POST /v1/sessions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionCreated {
    /// The session id: 32 lowercase hex digits, 128 random bits.
    pub id: String,
    /// The session's TTL in ms.
    pub ttl_ms: u64,
}

/// `200` answer to `POST /v1/sessions/{id}/keepalive`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct KeepaliveResponse {
    /// The session's TTL in ms: it lives at least this long after the keepalive was sent.
    pub ttl_ms: u64,
}

/// `POST /v1/sessions/keepalive`: keep several sessions alive in one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct KeepaliveBatchRequest {
    /// The session ids: 1 to 1024 (`KEEPALIVE_BATCH_MAX`) of them, each 32 lowercase hex
    /// digits, no id twice.
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 1024))]
    pub sessions: Vec<String>,
}

/// `200` answer to `POST /v1/sessions/keepalive`: one result per requested id, in order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct KeepaliveBatchResponse {
    /// The result of each id, in the order of the request.
    pub sessions: Vec<KeepaliveResult>,
}

/// The result of one session in a batched keepalive: renewed (with its TTL) or refused (with the
/// error the single-session route would have answered).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(untagged)]
pub enum KeepaliveResult {
    /// Renewed: the session lives at least `ttl_ms` after the batch was sent.
    Renewed {
        /// The session id.
        id: String,
        /// The session's TTL in ms.
        ttl_ms: u64,
    },
    /// Not renewed: `session_not_found` (never created, closed, expired) or, with auth,
    /// `permission_denied` (the session belongs to another token).
    Refused {
        /// The session id.
        id: String,
        /// Why, as the single-session route would answer it.
        error: error::ErrorDetail,
    },
}

impl KeepaliveResult {
    /// The session id.
    pub fn id(&self) -> &str {
        match self {
            KeepaliveResult::Renewed { id, .. } | KeepaliveResult::Refused { id, .. } => id,
        }
    }
}

/// Whether an object is a semaphore or an election.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ObjectKind {
    /// A semaphore.
    Semaphore,
    /// An election.
    Election,
}

/// One hold of a session, in `GET /v1/sessions/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionHold {
    /// Semaphore or election.
    pub kind: ObjectKind,
    /// Its name.
    pub name: String,
    /// Permits held.
    pub permits: u64,
    /// Fencing token of the grant.
    pub token: u64,
}

/// One wait of a session, in `GET /v1/sessions/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionWait {
    /// Semaphore or election.
    pub kind: ObjectKind,
    /// Its name.
    pub name: String,
    /// Permits asked for.
    pub permits: u64,
    /// 1-based position in the queue.
    pub position: u64,
}

/// `GET /v1/sessions/{id}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionView {
    /// The session id.
    pub id: String,
    /// Its name, if it was given one.
    pub name: Option<String>,
    /// Its TTL in ms.
    pub ttl_ms: u64,
    /// Its holds.
    pub holds: Vec<SessionHold>,
    /// Its waits.
    pub waits: Vec<SessionWait>,
}

/// One session in `GET /v1/sessions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionSummary {
    /// The session id.
    pub id: String,
    /// Its name, if it was given one.
    pub name: Option<String>,
    /// Its TTL in ms.
    pub ttl_ms: u64,
    /// Time left before it expires without a keepalive, in ms, as the leader counts it.
    pub remaining_ms: Option<u64>,
    /// Objects it holds permits of.
    pub holds: u64,
    /// Objects it waits on.
    pub waits: u64,
}

/// `GET /v1/sessions`: one page of live sessions in id order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SessionList {
    /// The page.
    pub sessions: Vec<SessionSummary>,
    /// Pass as `after` for the next page; absent on the last page.
    pub next_after: Option<String>,
}

/// `PUT /v1/semaphores/{name}`: create a semaphore or set its capacity and policies.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PutSemaphoreRequest {
    /// Capacity in permits: 1..=1000000.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub capacity: u64,
    /// A rate next to the capacity: permits granted (by acquire or take) obey a generic cell
    /// rate algorithm on leader time. Absent keeps the current rate; `null` removes it.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Rate>, nullable))]
    pub rate: Option<Option<Rate>>,
    /// How long the permits of a hold that ends by expiry or revoke stay out of circulation, in
    /// ms: 0..=60000 (0: none). A release returns permits at once. Absent keeps the current value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 60000))]
    pub lock_delay_ms: Option<u64>,
    /// Most permits that the holders of one group (an acquire's `group`) may hold at once:
    /// 1..=1000000. Absent keeps the current cap; `null` removes it.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<u64>, nullable, minimum = 1, maximum = 1000000))]
    pub group_max: Option<Option<u64>>,
}

/// Deserialises a field that is present (as a value or `null`): absent stays `None` through
/// `#[serde(default)]`, `null` becomes `Some(None)`.
fn present<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// A holder in `GET /v1/semaphores/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct HolderView {
    /// The holding session.
    pub session: String,
    /// The session's name, if any.
    pub session_name: Option<String>,
    /// Permits held.
    pub permits: u64,
    /// Fencing token of the grant.
    pub token: u64,
    /// Raft log index of the grant.
    pub granted_index: u64,
    /// Milliseconds left before `max_hold_ms` releases the hold, if the hold has one.
    pub expires_in_ms: Option<u64>,
    /// Milliseconds since the grant, in leader time (as the answering node reads it).
    #[serde(default)]
    pub held_ms: u64,
    /// The group the acquire named, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A waiter in `GET /v1/semaphores/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WaiterView {
    /// The waiting session.
    pub session: String,
    /// The session's name, if any.
    pub session_name: Option<String>,
    /// Permits asked for.
    pub permits: u64,
    /// 1-based position in the queue.
    pub position: u64,
    /// Milliseconds it has waited, by the answering node's clock (counted from when that node
    /// applied the acquire, or loaded the snapshot that held it: a lower bound after a restart).
    #[serde(default)]
    pub waiting_ms: Option<u64>,
    /// The group the acquire named, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// A waiting take (`POST .../take`), not an acquire: it holds nothing once served, and
    /// `session` is the take's own id, not a session's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub take: bool,
}

/// `GET /v1/semaphores/{name}` (and the answer to `PUT`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SemaphoreView {
    /// The semaphore's name.
    pub name: String,
    /// Its capacity in permits.
    pub capacity: u64,
    /// Permits held now (may exceed `capacity` right after a shrink).
    pub held: u64,
    /// Permits free now: `capacity - held - ` the delayed permits, or 0.
    pub available: u64,
    /// Raft log index of the last change (also in the `Permit-Index` header).
    pub index: u64,
    /// Holders, by session id.
    pub holders: Vec<HolderView>,
    /// Waiters in queue order.
    pub waiters: Vec<WaiterView>,
    /// Deleted when its last holder and waiter leave (created by an ephemeral acquire).
    #[serde(default)]
    pub ephemeral: bool,
    /// The rate, with its state now; absent when the semaphore has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<RateView>,
    /// Lock-delay in ms (0: none).
    #[serde(default)]
    pub lock_delay_ms: u64,
    /// Permits of failed holds kept out of circulation by the lock-delay, soonest first.
    #[serde(default)]
    pub delayed: Vec<DelayedPermits>,
    /// The cap of permits per group, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_max: Option<u64>,
    /// Holdings and waiters per group, in group order (groups with neither are absent).
    #[serde(default)]
    pub groups: Vec<GroupView>,
}

/// `GET /v1/semaphores/{name}/history`: what the answering node saw of a semaphore, one sample
/// per second of its own clock, for the last 15 minutes at most (since the node started or the
/// semaphore was created, when that is shorter).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SemaphoreHistory {
    /// The semaphore's name.
    pub name: String,
    /// The answering node's clock when it answered, in ms since the Unix epoch (its wall clock
    /// when it started plus its monotonic clock since, so that a sample's time never moves): a
    /// reader with another clock shifts `at_ms` by the difference.
    pub now_ms: u64,
    /// The length of one sample in ms (1000).
    pub interval_ms: u64,
    /// Whether this node keeps a history of this semaphore: it keeps one for the first
    /// `--metrics-names-max` semaphores it tracks (those with metric series of their own); the
    /// others have none (`samples` is empty).
    pub kept: bool,
    /// Oldest first; the last one is the second in progress.
    pub samples: Vec<HistorySample>,
}

/// One second of a semaphore's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct HistorySample {
    /// The start of the second, by the clock of `now_ms`.
    pub at_ms: u64,
    /// Permits held at the end of the second (for the second in progress: now).
    pub held: u64,
    /// Its capacity at the end of the second.
    pub capacity: u64,
    /// Sessions waiting at the end of the second.
    pub waiters: u64,
    /// The most permits held at any moment of the second.
    pub held_max: u64,
    /// Grants in the second: acquires granted, at once or from the queue.
    pub grants: u64,
}

/// One semaphore in `GET /v1/semaphores`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SemaphoreSummary {
    /// The semaphore's name.
    pub name: String,
    /// Its capacity.
    pub capacity: u64,
    /// Permits held.
    pub held: u64,
    /// Permits free (capacity less held and delayed permits).
    pub available: u64,
    /// Permits kept out of circulation by the lock-delay.
    #[serde(default)]
    pub delayed: u64,
    /// Whether the semaphore has a rate.
    #[serde(default)]
    pub rated: bool,
    /// Number of holders.
    pub holders: u64,
    /// Number of waiters.
    pub waiters: u64,
    /// Milliseconds the oldest waiter has waited (as `waiting_ms` counts), `null` when none waits.
    #[serde(default)]
    pub oldest_wait_ms: Option<u64>,
    /// Deleted when its last holder and waiter leave.
    #[serde(default)]
    pub ephemeral: bool,
}

/// `GET /v1/semaphores?after=&limit=`: one page of semaphores in name order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SemaphoreList {
    /// The page.
    pub semaphores: Vec<SemaphoreSummary>,
    /// Pass as `after` to get the next page; absent on the last page.
    pub next_after: Option<String>,
}

/// `POST /v1/semaphores/{name}/acquire`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AcquireRequest {
    /// The acquiring session.
    pub session: String,
    /// Permits to acquire: 1..=capacity, default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub permits: Option<u64>,
    /// How long to wait in the queue, in ms; 0 (default) is try-acquire. Capped at 60000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Create the semaphore with this capacity if it does not exist (ignored if it does):
    /// 1..=1000000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub capacity: Option<u64>,
    /// Release the hold this many ms after the grant even if the session lives: 100..=604800000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 100, maximum = 604800000))]
    pub max_hold_ms: Option<u64>,
    /// If this acquire creates the semaphore (with `capacity`), delete it again when its last
    /// holder and waiter leave, so that names made on the fly do not pile up. A later `PUT`
    /// makes it permanent. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ephemeral: bool,
    /// The group this acquire counts against (the semaphore's `group_max`): 1-64 bytes of
    /// `[A-Za-z0-9._:-]`. A session that holds or waits keeps the group it first named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// Answer to an acquire: `200` acquired or `202` waiting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum AcquireResponse {
    /// `200`: the session holds the permits.
    Acquired {
        /// Permits held.
        permits: u64,
        /// Fencing token: larger than every token granted before on any semaphore.
        token: u64,
    },
    /// `202`: still queued when the wait ended; the place is kept. Repeat the call to wait more.
    Waiting {
        /// 1-based position in the queue.
        position: u64,
    },
}

/// `POST /v1/semaphores/{name}/release` and `POST /v1/elections/{name}/resign`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// The session whose hold to release or whose wait to cancel.
    pub session: String,
}

/// `200` answer to a release.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ReleaseResponse {
    /// Permits released; 0 if the session held none (a cancelled wait, or nothing).
    pub released: u64,
}

/// `POST /v1/semaphores/{name}/validate`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ValidateRequest {
    /// The fencing token to check.
    pub token: u64,
}

/// `200` answer to validate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ValidateResponse {
    /// Whether a current hold of the semaphore carries the token.
    pub valid: bool,
    /// The holding session, when valid.
    pub session: Option<String>,
}

/// `POST /v1/elections/{name}/campaign`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CampaignRequest {
    /// The campaigning session.
    pub session: String,
    /// The value to publish while leader (at most 4096 bytes), e.g. the leader's address.
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
    pub value: String,
    /// How long to wait to become leader, in ms; 0 (default) returns at once. Capped at 60000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// `POST /v1/elections/{name}/proclaim`: the leader publishes a new value and keeps leading.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ProclaimRequest {
    /// The leading session.
    pub session: String,
    /// The new value to publish (at most 4096 bytes).
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
    pub value: String,
}

/// Answer to a campaign: `200` leader or `202` waiting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum CampaignResponse {
    /// `200`: the session leads.
    Leader {
        /// Fencing token of the leadership.
        token: u64,
    },
    /// `202`: queued behind the leader and earlier candidates; the place is kept.
    Waiting {
        /// 1-based position among the candidates.
        position: u64,
    },
}

/// The current leader of an election.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LeaderView {
    /// The leading session.
    pub session: String,
    /// The value it published.
    pub value: String,
    /// Fencing token of its leadership.
    pub token: u64,
    /// The leading session's name, if any.
    #[serde(default)]
    pub session_name: Option<String>,
    /// Milliseconds since it became leader (its tenure), in leader time.
    #[serde(default)]
    pub held_ms: u64,
}

/// `GET /v1/elections/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ElectionView {
    /// The election's name.
    pub name: String,
    /// The leader, or `null` when nobody leads.
    pub leader: Option<LeaderView>,
    /// Number of candidates waiting behind the leader.
    pub candidates: u64,
    /// Raft log index of the last change (also in the `Permit-Index` header); 0 if none exists.
    pub index: u64,
}

/// `GET /v1/elections`: one page of elections in name order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ElectionList {
    /// Elections the caller may read, in name order.
    pub elections: Vec<ElectionView>,
    /// Pass as `after` to get the next page; `null` on the last page.
    pub next_after: Option<String>,
}

/// Why a node is not ready to serve (`GET /v1/health` answers 503 with one of these).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotReady {
    /// No leader is known (an election is in progress, or there is no quorum).
    NoLeader,
    /// This node was removed from the cluster's membership; it no longer campaigns.
    Removed,
    /// This node was started with `--join` and is not a member yet.
    Joining,
    /// Raft stopped on this node (a shutdown, or a fatal error); the process exits.
    Shutdown,
    /// A write to the data dir failed (disk full, I/O error); the process exits.
    StorageError,
    /// The cluster's feature version is above what this node's build speaks (a downgrade, or a
    /// node left behind in an upgrade); the process exits. Start it with a newer build.
    UpgradeNeeded,
    /// A reason this version does not know (sent by a newer server).
    #[serde(other)]
    Unknown,
}

#[cfg(test)]
mod not_ready_tests {
    use super::NotReady;

    #[test]
    fn reasons_round_trip_and_unknown_ones_parse() {
        for reason in NotReady::ALL {
            let text = serde_json::to_string(reason).unwrap();
            assert_eq!(text, format!("\"{}\"", reason.as_str()));
            assert_eq!(&serde_json::from_str::<NotReady>(&text).unwrap(), reason);
        }
        assert_eq!(serde_json::from_str::<NotReady>("\"from_the_future\"").unwrap(), NotReady::Unknown);
    }

    #[test]
    fn storage_error_kinds_round_trip_and_unknown_ones_parse() {
        use super::StorageErrorKind;
        for kind in StorageErrorKind::ALL {
            let text = serde_json::to_string(kind).unwrap();
            assert_eq!(text, format!("\"{}\"", kind.as_str()));
            assert_eq!(&serde_json::from_str::<StorageErrorKind>(&text).unwrap(), kind);
        }
        let future = serde_json::from_str::<StorageErrorKind>("\"from_the_future\"").unwrap();
        assert_eq!(future, StorageErrorKind::Unknown);
    }
}

impl NotReady {
    /// Every known reason.
    pub const ALL: &'static [NotReady] = &[
        NotReady::NoLeader,
        NotReady::Removed,
        NotReady::Joining,
        NotReady::Shutdown,
        NotReady::StorageError,
        NotReady::UpgradeNeeded,
    ];

    /// The reason's text.
    pub fn as_str(&self) -> &'static str {
        match self {
            NotReady::NoLeader => "no_leader",
            NotReady::Removed => "removed",
            NotReady::Joining => "joining",
            NotReady::Shutdown => "shutdown",
            NotReady::StorageError => "storage_error",
            NotReady::UpgradeNeeded => "upgrade_needed",
            NotReady::Unknown => "unknown",
        }
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for NotReady {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(NotReady::ALL.iter().map(NotReady::as_str)))
            .description(Some(
                "Why a node is not ready to serve (`GET /v1/health` answers 503 with one of these); \
                 reasons may be added.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl ToSchema for NotReady {}

/// What kind of storage failure stopped a node (see [`StorageFailure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StorageErrorKind {
    /// The disk is full (`ENOSPC`), or the data dir is over its quota (`EDQUOT`).
    DiskFull,
    /// Another failure of the disk or file system (an `EIO` from `fsync`, for instance).
    Io,
    /// A file holds records that are not what the server wrote.
    Corrupt,
    /// Another process holds the data dir's lock.
    Locked,
    /// A file is of a format version this build does not read.
    UnknownFormat,
    /// A kind this version does not know (sent by a newer server).
    #[serde(other)]
    Unknown,
}

impl StorageErrorKind {
    /// Every known kind.
    pub const ALL: &'static [StorageErrorKind] = &[
        StorageErrorKind::DiskFull,
        StorageErrorKind::Io,
        StorageErrorKind::Corrupt,
        StorageErrorKind::Locked,
        StorageErrorKind::UnknownFormat,
    ];

    /// The kind's text.
    pub fn as_str(&self) -> &'static str {
        match self {
            StorageErrorKind::DiskFull => "disk_full",
            StorageErrorKind::Io => "io",
            StorageErrorKind::Corrupt => "corrupt",
            StorageErrorKind::Locked => "locked",
            StorageErrorKind::UnknownFormat => "unknown_format",
            StorageErrorKind::Unknown => "unknown",
        }
    }
}

#[cfg(feature = "openapi")]
impl utoipa::PartialSchema for StorageErrorKind {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(StorageErrorKind::ALL.iter().map(StorageErrorKind::as_str)))
            .description(Some(
                "What kind of storage failure stopped a node (`GET /v1/health` after `storage_error`); \
                 kinds may be added.",
            ))
            .into()
    }
}

#[cfg(feature = "openapi")]
impl ToSchema for StorageErrorKind {}

/// The storage failure that stopped a node: in `GET /v1/health` with `reason: storage_error`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StorageFailure {
    /// What kind of failure.
    pub kind: StorageErrorKind,
    /// The operation, the file and the error, for humans; may change between versions.
    pub message: String,
}

/// `GET /v1/health` and `GET /v1/health/live`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Health {
    /// `ok` when this node can serve (a member that knows a leader, with a live Raft core and a
    /// writable data dir), `degraded` otherwise.
    pub status: String,
    /// Why the node is not ready; absent when `status` is `ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<NotReady>,
    /// Details for humans (the failed path and OS error, for instance); may change between versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// With `reason: storage_error`, the failure, typed; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StorageFailure>,
    /// This node's id.
    pub node_id: u64,
    /// The Raft leader's node id, if known.
    pub raft_leader: Option<u64>,
    /// This node's Raft role: `leader`, `follower`, `candidate`, `learner` or `shutdown`.
    pub raft_role: String,
    /// The current Raft term.
    pub raft_term: u64,
    /// Raft log index of the last entry applied here.
    pub applied_index: u64,
    /// Raft log index of this node's latest snapshot (0 before its first): a restart replays
    /// the log after it. Absent from servers before 2026-12-05 (read as 0).
    #[serde(default)]
    pub snapshot_index: u64,
    /// The node ids of the membership as this node knows it (voters and learners).
    #[serde(default)]
    pub members: Vec<u64>,
    /// The feature version this node's build speaks (docs/operations.md, *Upgrading*). Absent
    /// from builds before versioning, which speak version 1.
    #[serde(default)]
    pub feature_version: Option<u32>,
    /// This node's build (`permit --version`). Absent from builds before versioning.
    #[serde(default)]
    pub build: Option<String>,
}

/// `POST /v1/cluster/init`: make a pristine node (started with `--join`) the first member of a
/// cluster with these voters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct InitClusterRequest {
    /// Every voter: node id and `HOST:PORT` address.
    pub members: Vec<MemberAddress>,
}

/// A node id with its address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct MemberAddress {
    /// Node id (a positive integer chosen by the operator).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub id: u64,
    /// `HOST:PORT` of its API and peer RPC.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub addr: String,
}

/// A member's role in the Raft group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum MemberRole {
    /// Votes and counts towards the quorum.
    Voter,
    /// Receives the log but does not vote (catching up before promotion).
    Learner,
}

/// One member in `GET /v1/cluster`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct MemberView {
    /// Node id.
    pub id: u64,
    /// Address.
    pub addr: String,
    /// Voter or learner.
    pub role: MemberRole,
    /// Whether it is the Raft leader.
    pub leader: bool,
    /// Last log index the leader knows this member has (the leader's replication view).
    pub matched_index: Option<u64>,
    /// Last log index this member applied, as it reported it (absent if unreachable).
    pub applied_index: Option<u64>,
    /// Whether the member answered its health check just now.
    pub reachable: bool,
    /// The feature version its build speaks, as it answered (1 for a build from before
    /// versioning; absent if unreachable).
    pub feature_version: Option<u32>,
    /// Its build, as it answered (absent if unreachable or from before versioning).
    pub build: Option<String>,
}

/// `GET /v1/cluster`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ClusterView {
    /// The Raft leader's node id, or `null`.
    pub leader: Option<u64>,
    /// The current Raft term.
    pub term: u64,
    /// Last committed log index known to the answering node.
    pub commit_index: Option<u64>,
    /// The cluster's feature version, as applied on the answering node: the lowest its members
    /// spoke when the leader last raised it. Absent from builds before versioning.
    #[serde(default)]
    pub feature_version: Option<u32>,
    /// Members, voters and learners.
    pub members: Vec<MemberView>,
}

/// `POST /v1/cluster/members`: add a node (started with `--join`) as a learner, wait until it
/// caught up, then make it a voter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AddMemberRequest {
    /// The new node's id (a positive integer).
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub id: u64,
    /// Its `HOST:PORT`; a Permit node started with `--join` must answer there with this id.
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub addr: String,
    /// Keep it a learner (non-voting) instead of promoting it.
    #[serde(default)]
    pub learner: bool,
}

/// `GET /v1/debug/digest`: this node's applied state, hashed, to compare replicas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StateDigest {
    /// The answering node.
    pub node_id: u64,
    /// Raft log index of the last entry applied.
    pub applied_index: u64,
    /// FNV-1a hash of the state's snapshot bytes at that index.
    pub digest: u64,
}

/// Request header carrying a client's credential: `Authorization: Bearer SECRET`.
pub const AUTHORIZATION_SCHEME: &str = "Bearer";

/// What an access rule grants access to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AclResource {
    /// Semaphores, by name.
    Semaphore,
    /// Elections, by name.
    Election,
    /// Sessions, by the session's name (`""` when it has none).
    Session,
    /// Access tokens (prefix `""`).
    Acl,
    /// Membership, cluster status, debug routes and metrics (prefix `""`).
    Cluster,
    /// Work queues, by name.
    Queue,
}

/// How much an access rule grants; each level includes the ones before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AclAccess {
    /// GET, watch, validate.
    Read,
    /// Acquire, release, campaign, resign with the token's own sessions; create on acquire.
    Write,
    /// Write, plus set capacity, delete, and revoke another session's hold.
    Admin,
}

/// One access rule: `access` to every name of `resource` that starts with `prefix`. For a name,
/// the matching rule with the longest prefix decides.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AclRule {
    /// What kind of thing.
    pub resource: AclResource,
    /// Names that start with this; `""` matches every name.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 128))]
    pub prefix: String,
    /// How much.
    pub access: AclAccess,
}

/// `POST /v1/acl/tokens`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    /// A name for humans, 1-128 bytes.
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 128))]
    pub name: String,
    /// The grants (at most 64).
    #[cfg_attr(feature = "openapi", schema(max_items = 64))]
    pub rules: Vec<AclRule>,
}

/// An access token, without its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TokenView {
    /// The token's public id (32 hex digits); the root token's is all zeros.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its grants.
    pub rules: Vec<AclRule>,
    /// Live sessions it created.
    pub sessions: u64,
}

/// `201` answer to `POST /v1/acl/tokens`: the only time the secret is shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TokenCreated {
    /// The token's public id.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The secret to send as `Authorization: Bearer SECRET`. Only its hash is stored.
    pub secret: String,
    /// Its grants.
    pub rules: Vec<AclRule>,
}

/// `GET /v1/acl/tokens`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct TokenList {
    /// Every token, ordered by id.
    pub tokens: Vec<TokenView>,
}

/// `POST /v1/semaphores/{name}/revoke` and `POST /v1/elections/{name}/revoke`: an admin ends
/// another session's hold (or wait) on the object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RevokeRequest {
    /// The session whose hold to end.
    pub session: String,
}
