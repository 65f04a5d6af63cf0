//! Every limit the state machine enforces, in one place.
//!
//! Limits are enforced inside [`crate::State::apply`] so that every replica refuses the same
//! commands; the server checks the same constants before proposing so that bad input never
//! reaches the log. Each constant names its unit last.

/// Shortest session TTL, in milliseconds. Shorter leases cannot survive one fsync plus one
/// network round trip reliably.
pub const SESSION_TTL_MS_MIN: u64 = 200;
/// Longest session TTL, in milliseconds (one day), as in Consul.
pub const SESSION_TTL_MS_MAX: u64 = 86_400_000;
/// TTL of a session created without one, in milliseconds.
pub const SESSION_TTL_MS_DEFAULT: u64 = 10_000;
/// Longest human-readable session name, in bytes.
pub const SESSION_NAME_BYTES_MAX: usize = 256;
/// Most sessions alive at once. Bounds memory: about 1 KiB per session with one hold.
pub const SESSIONS_MAX: usize = 2_000_000;

/// Longest semaphore or election name, in bytes.
pub const NAME_BYTES_MAX: usize = 128;
/// Largest capacity of a semaphore, in permits.
pub const SEMAPHORE_CAPACITY_MAX: u64 = 1_000_000;
/// Most semaphores and elections that may exist at once.
pub const OBJECTS_MAX: usize = 1_000_000;
/// Most waiters queued on one semaphore or election.
pub const WAITERS_PER_OBJECT_MAX: usize = 100_000;
/// Most holds plus waits that one session may have at once.
pub const KEYS_PER_SESSION_MAX: usize = 10_000;

/// Shortest `max_hold_ms` of a hold, in milliseconds.
pub const MAX_HOLD_MS_MIN: u64 = 100;
/// Longest `max_hold_ms` of a hold, in milliseconds (one week).
pub const MAX_HOLD_MS_MAX: u64 = 604_800_000;

/// Largest value a campaign may publish for its election, in bytes.
pub const ELECTION_VALUE_BYTES_MAX: usize = 4096;

/// Most access tokens that may exist at once.
pub const TOKENS_MAX: usize = 10_000;
/// Most rules one token may carry.
pub const TOKEN_RULES_MAX: usize = 64;
/// Longest token name, in bytes.
pub const TOKEN_NAME_BYTES_MAX: usize = 128;

/// Most queues that may exist at once.
pub const QUEUES_MAX: usize = 100_000;
/// Largest `max_items` of a queue.
pub const QUEUE_ITEMS_MAX: u64 = 10_000_000;
/// Most items in all queues together. Bounds memory: an item costs its payload plus about
/// 200 bytes.
pub const ITEMS_MAX: u64 = 20_000_000;
/// Largest `max_attempts` of a queue.
pub const QUEUE_MAX_ATTEMPTS_MAX: u32 = 1000;
/// Largest payload of one item, in bytes of JSON text.
pub const QUEUE_PAYLOAD_BYTES_MAX: usize = 64 * 1024;
/// Most items in one push (one log entry).
pub const QUEUE_PUSH_ITEMS_MAX: usize = 1000;
/// Most items one claim hands out.
pub const QUEUE_CLAIM_ITEMS_MAX: u32 = 1000;
/// Longest deduplication key of an item, in bytes.
pub const QUEUE_ITEM_KEY_BYTES_MAX: usize = 128;
/// Longest `error` of a nack, in bytes.
pub const QUEUE_ERROR_BYTES_MAX: usize = 1024;
/// Longest delay of a push or nack, and longest `wait_ms` a claim carries, in milliseconds (one
/// week).
pub const QUEUE_DELAY_MS_MAX: u64 = 604_800_000;
/// Most items one session may have claimed from one queue at once.
pub const CLAIMS_PER_SESSION_MAX: usize = 10_000;
/// Most delayed items one `PromoteDueItems` command moves; the driver proposes again for the rest.
pub const PROMOTE_ITEMS_PER_COMMAND_MAX: usize = 4096;

/// Most sessions one `ExpireSessions` command may name, so one log entry stays small.
pub const EXPIRE_SESSIONS_PER_COMMAND_MAX: usize = 1024;
/// Most holds one `ExpireHolds` command releases; the expiry driver proposes again for the rest.
pub const EXPIRE_HOLDS_PER_COMMAND_MAX: usize = 1024;
/// Most commands in one log entry (one group commit).
pub const COMMANDS_PER_BATCH_MAX: usize = 4096;

const _: () = assert!(SESSION_TTL_MS_MIN < SESSION_TTL_MS_DEFAULT);
const _: () = assert!(SESSION_TTL_MS_DEFAULT < SESSION_TTL_MS_MAX);
const _: () = assert!(MAX_HOLD_MS_MIN < MAX_HOLD_MS_MAX);
const _: () = assert!(WAITERS_PER_OBJECT_MAX <= SESSIONS_MAX);
const _: () = assert!(EXPIRE_SESSIONS_PER_COMMAND_MAX <= COMMANDS_PER_BATCH_MAX);
// Sums of permits must never overflow a u64, even with every object at full capacity.
const _: () = assert!((SEMAPHORE_CAPACITY_MAX as u128) * (OBJECTS_MAX as u128) < u64::MAX as u128);

/// Longest lock-delay of a semaphore, in ms.
pub const LOCK_DELAY_MS_MAX: u64 = 60_000;
/// Most permits of a rate's period and of its burst (and of one take).
pub const RATE_PERMITS_MAX: u64 = 1_000_000;
/// Longest period of a rate, in ms (a day).
pub const RATE_PER_MS_MAX: u64 = 86_400_000;
/// Longest group name, in bytes.
pub const GROUP_BYTES_MAX: usize = 64;
/// Longest wait of a take, in leader ms.
pub const TAKE_WAIT_MS_MAX: u64 = 60_000;
/// Most semaphores one `PolicyTick` visits.
pub const POLICY_TICK_KEYS_MAX: usize = 1024;
