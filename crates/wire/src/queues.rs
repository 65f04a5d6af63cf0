//! Work queues: `/v1/queues/...`. A queue holds items in `seq` order; a claim hands due items to
//! one session each, as leases bound to that session, with a fencing token per claim.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Largest body of a push, in bytes: a push may carry more than [`crate::BODY_BYTES_MAX`] (up to
/// 1000 items of up to 64 KiB each, in as many pushes as that takes).
pub const QUEUE_PUSH_BODY_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Largest `request_id` of a claim: 2^53 - 1, so that every JSON reader keeps it exact.
pub const CLAIM_REQUEST_ID_MAX: u64 = (1 << 53) - 1;

/// `PUT /v1/queues/{name}`: create a queue or change its settings. Every field is optional; a
/// new queue takes the defaults, an existing one keeps what is not given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PutQueueRequest {
    /// Claims of one item before it moves to the dead-letter queue: 1..=1000, default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub max_attempts: Option<u32>,
    /// The queue that receives items claimed `max_attempts` times without an ack; default
    /// `{name}.dead`. It must not be the queue itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
    /// Most items (pending, delayed and claimed) the queue holds; a push beyond it is refused
    /// with `queue_full`: 1..=10000000, default 1000000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000000))]
    pub max_items: Option<u64>,
}

/// `GET /v1/queues/{name}` (and the answer to `PUT`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct QueueView {
    /// The queue's name.
    pub name: String,
    /// Items due and waiting for a claim.
    pub pending: u64,
    /// Items claimed by a live session and not yet acked or nacked.
    pub claimed: u64,
    /// Items pushed or nacked with a delay that has not passed yet.
    pub delayed: u64,
    /// Claims of one item before it is dead-lettered.
    pub max_attempts: u32,
    /// The dead-letter queue's name; `null` for a dead-letter queue made on the fly (its items
    /// stay, whatever their attempts) and for a queue whose name is too long for `{name}.dead`.
    pub dead_letter: Option<String>,
    /// Most items the queue holds.
    pub max_items: u64,
    /// Sessions blocked in a claim, waiting for an item.
    pub claimers: u64,
    /// How long the oldest pending item has been pending, in leader ms; `null` when none is.
    pub oldest_pending_ms: Option<u64>,
    /// Log index of the queue's last change.
    pub index: u64,
}

/// `GET /v1/queues?after=&limit=`: one page of queues in name order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct QueueList {
    /// The page.
    pub queues: Vec<QueueView>,
    /// Pass as `after` to get the next page; absent on the last page.
    pub next_after: Option<String>,
}

/// One item of a push.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PushItem {
    /// Any JSON value (`null` too), at most 64 KiB encoded; handed back byte for byte to the
    /// claimer.
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: Box<RawValue>,
    /// Keep the item out of claims for this long after the push, in ms: 0..=604800000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 604800000))]
    pub delay_ms: Option<u64>,
    /// Deduplication key (1..=128 bytes): while an item pushed with this key is pending,
    /// delayed or claimed, a push with the same key adds nothing and answers that item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// `POST /v1/queues/{name}/items`: one item (`payload`, `delay_ms`, `key`) or up to 1000 in
/// `items` (and nothing else), appended in order by one log entry. Pushing to a queue that does
/// not exist creates it with the defaults.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct PushRequest {
    /// One item's payload: any JSON value (`null` too), at most 64 KiB encoded.
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: Option<Box<RawValue>>,
    /// One item's delay, as [`PushItem::delay_ms`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 604800000))]
    pub delay_ms: Option<u64>,
    /// One item's deduplication key, as [`PushItem::key`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Several items, in order: 1..=1000 (instead of `payload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<PushItem>>,
}

impl PushRequest {
    /// The items of the push, or why it is not one: exactly one of `payload` and `items`.
    pub fn into_items(self) -> Result<Vec<PushItem>, &'static str> {
        match (self.payload, self.items) {
            (Some(payload), None) => Ok(vec![PushItem { payload, delay_ms: self.delay_ms, key: self.key }]),
            (None, Some(items)) if self.delay_ms.is_none() && self.key.is_none() => Ok(items),
            (None, Some(_)) => Err("with `items`, each item carries its own `delay_ms` and `key`"),
            (Some(_), Some(_)) => Err("a push has `payload` (one item) or `items`, not both"),
            (None, None) => Err("a push needs `payload` (one item) or `items`"),
        }
    }
}

/// A field that is present, whatever its value (`null` too): `Some`.
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Box<RawValue>>, D::Error> {
    Box::<RawValue>::deserialize(deserializer).map(Some)
}

/// One pushed item in the answer to a push.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PushedItem {
    /// The item's id (a string: treat it as opaque).
    pub id: String,
    /// Its place in the queue: grows strictly with every item the queue receives.
    pub seq: u64,
    /// The push added nothing: an item with the same `key` is pending, delayed or claimed, and
    /// this is that item.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duplicate: bool,
}

/// Answer to a push: `201` when it added an item, `200` when every item was a duplicate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PushResponse {
    /// One entry per pushed item, in the order pushed.
    pub items: Vec<PushedItem>,
}

/// `POST /v1/queues/{name}/claim`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The claiming session: its claims end (and the items are pending again) when it ends.
    pub session: String,
    /// Most items to claim: 1..=1000, default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub max: Option<u32>,
    /// How long to wait for an item when none is due, in ms; 0 (default) answers at once.
    /// Capped at 60000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Names this claim (a random number up to 2^53 - 1, unique per session), so that a retry
    /// after a lost answer gets the items the claim took instead of taking more. Without it the
    /// server picks one, and a lost answer's items stay claimed until the session ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 9007199254740991_u64))]
    pub request_id: Option<u64>,
}

/// `POST /v1/queues/{name}/claim/cancel`: ends a blocked claim by its `request_id`, without
/// taking anything.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CancelClaimRequest {
    /// The claiming session.
    pub session: String,
    /// The claim's `request_id`.
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 9007199254740991_u64))]
    pub request_id: u64,
}

/// One claimed item.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ClaimedItem {
    /// The item's id.
    pub id: String,
    /// Its place in the queue.
    pub seq: u64,
    /// The payload, as pushed.
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: Box<RawValue>,
    /// Claims of this item so far, this one included (1 on the first claim).
    pub attempt: u32,
    /// Fencing token of this claim, from the counter of semaphore grants: larger than every
    /// token issued before. Ack and nack need it; a sink that keeps the largest token it saw can
    /// refuse a stale worker's late write.
    pub token: u64,
}

/// `200` answer to a claim: empty `items` when nothing became due within `wait_ms`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ClaimResponse {
    /// The claimed items, in `seq` order.
    pub items: Vec<ClaimedItem>,
}

/// `POST /v1/queues/{name}/items/{id}/ack`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    /// The session that claimed the item.
    pub session: String,
    /// The claim's fencing token.
    pub token: u64,
    /// Claim the session's next items in the same request (a worker's loop in one round trip):
    /// the ack and the claim are applied together or not at all, and the answer's `items` are
    /// what the claim took. Needs cluster feature version 6.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<NextClaim>,
}

/// The claim of an ack that claims next: as a [`ClaimRequest`], by the acking session.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NextClaim {
    /// Most items to claim: 1..=1000, default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000))]
    pub max: Option<u32>,
    /// How long to wait for an item when none is due, in ms; 0 (default) answers at once.
    /// Capped at 60000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Names this claim, as a claim's `request_id` does (not the one of the claim that took the
    /// acked item): a retry after a lost answer gets what it took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 9007199254740991_u64))]
    pub request_id: Option<u64>,
}

/// `POST /v1/queues/{name}/items/{id}/nack`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NackRequest {
    /// The session that claimed the item.
    pub session: String,
    /// The claim's fencing token.
    pub token: u64,
    /// Keep the item out of claims for this long, in ms: 0..=604800000, default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 604800000))]
    pub delay_ms: Option<u64>,
    /// Why the work failed (at most 1024 bytes), kept with the item as `last_error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Where an item stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ItemState {
    /// Due, waiting for a claim.
    Pending,
    /// Out of claims until its delay passes.
    Delayed,
    /// Claimed by a live session.
    Claimed,
    /// Moved to the dead-letter queue (an answer to a nack only).
    Dead,
}

/// `200` answer to an ack or a nack.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SettleResponse {
    /// The item.
    pub id: String,
    /// Where it is now: absent after an ack (it is gone), `pending`, `delayed` or `dead` after
    /// a nack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ItemState>,
    /// After an ack with `claim`: the items that claim took, in `seq` order (empty when none
    /// became due within its `wait_ms`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub items: Option<Vec<ClaimedItem>>,
}

/// One item in `GET /v1/queues/{name}/items`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ItemView {
    /// The item's id.
    pub id: String,
    /// Its place in the queue.
    pub seq: u64,
    /// Where it stands.
    pub state: ItemState,
    /// Claims so far.
    pub attempt: u32,
    /// The claiming session, when claimed.
    pub session: Option<String>,
    /// The current claim's fencing token, when claimed.
    pub token: Option<u64>,
    /// Leader ms since the item entered this queue.
    pub age_ms: u64,
    /// Leader time at which a delayed item becomes due.
    pub due_at_ms: Option<u64>,
    /// Its deduplication key.
    pub key: Option<String>,
    /// Why its last claim ended without an ack (a nack's `error`, or its session's end).
    pub last_error: Option<String>,
    /// The payload.
    #[cfg_attr(feature = "openapi", schema(value_type = serde_json::Value))]
    pub payload: Box<RawValue>,
}

/// `GET /v1/queues/{name}/items?state=&after=&limit=`: one page of items in id order.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ItemList {
    /// The page.
    pub items: Vec<ItemView>,
    /// Pass as `after` (an item id) to get the next page; absent on the last page.
    pub next_after: Option<String>,
}
