//! Semaphore policies: a rate next to the capacity, lock-delay, per-group caps, and
//! `POST /v1/semaphores/{name}/take`.

use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// A rate: at most `burst` permits at once, `permits` per `per_ms` sustained (a generic cell
/// rate algorithm on leader time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Rate {
    /// Permits per `per_ms`: 1..=1000000.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub permits: u64,
    /// The period, in ms: 1..=86400000 (a day).
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86400000))]
    pub per_ms: u64,
    /// Most permits granted at once after a quiet spell: 1..=1000000, default `permits`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub burst: Option<u64>,
}

/// A semaphore's rate in `GET /v1/semaphores/{name}`, with its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct RateView {
    /// Permits per `per_ms`.
    pub permits: u64,
    /// The period, in ms.
    pub per_ms: u64,
    /// Most permits granted at once.
    pub burst: u64,
    /// Permits the rate would grant now (0..=`burst`), in leader time as the answering node
    /// reads it.
    pub available: u64,
    /// Milliseconds until the rate allows one more permit; 0 when `available` > 0.
    pub next_in_ms: u64,
}

/// Permits of a failed hold (ended by expiry or revoke) that the lock-delay keeps out of
/// circulation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct DelayedPermits {
    /// The permits.
    pub permits: u64,
    /// Leader time at which they return (the hold's end plus `lock_delay_ms`).
    pub until_ms: u64,
    /// Milliseconds until then, as the answering node reads leader time.
    pub remaining_ms: u64,
}

/// One group of a semaphore: what its holders hold and how many of its acquires wait.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct GroupView {
    /// The group.
    pub group: String,
    /// Permits its holders hold.
    pub held: u64,
    /// Its holders.
    pub holders: u64,
    /// Its waiting acquires.
    pub waiters: u64,
}

/// `POST /v1/semaphores/{name}/take`: take permits of the semaphore's rate, holding nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TakeRequest {
    /// Permits to take: 1..=the rate's `burst`, default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1000000))]
    pub permits: Option<u64>,
    /// How long to wait for the rate, in ms, in the semaphore's FIFO queue; 0 (default) answers
    /// at once. Capped at 60000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// `200` answer to a take.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TakeResponse {
    /// The rate granted the permits.
    Taken {
        /// Fencing token of the take: from the same counter as grants, larger than every
        /// token before it.
        token: u64,
    },
}
