//! Sessions: a client's liveness, with a TTL, to which its holds and waits belong.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Key, TokenId};

/// A session id: 128 bits from a CSPRNG, chosen by the server before it proposes the session, so
/// that the state machine stays deterministic. Its text form is 32 lowercase hex digits.
///
/// # Examples
/// ```
/// use permit_core::SessionId;
/// let id = SessionId::from_bytes([7; 16]);
/// assert_eq!(id.to_string().parse::<SessionId>(), Ok(id));
/// assert!("not-an-id".parse::<SessionId>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SessionId([u8; 16]);

/// Why a string is not a session id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a session id is 32 lowercase hex digits")]
pub struct InvalidSessionId;

impl SessionId {
    /// The session id made of these bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> SessionId {
        SessionId(bytes)
    }

    /// The id's bytes.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        crate::hex::write(f, &self.0)
    }
}

impl fmt::Debug for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionId({self})")
    }
}

impl FromStr for SessionId {
    type Err = InvalidSessionId;
    fn from_str(text: &str) -> Result<SessionId, InvalidSessionId> {
        crate::hex::parse(text).map(SessionId).ok_or(InvalidSessionId)
    }
}

/// A live session as the state machine knows it.
///
/// The session's deadline is not here: keepalives are not log writes, so the leader keeps
/// deadlines in memory and proposes `ExpireSessions` when one passes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    /// Optional name for humans.
    pub name: Option<String>,
    /// Time to live after the last keepalive, in milliseconds.
    pub ttl_ms: u64,
    /// Log index of the entry that created the session.
    pub created_index: u64,
    /// The token that created the session (`None` when auth was off): only it may use the
    /// session.
    pub owner: Option<TokenId>,
    /// Objects on which this session holds permits.
    pub holds: KeySet,
    /// Objects on which this session waits.
    pub waits: KeySet,
}

/// A small sorted set of keys. Sessions usually hold a handful of objects; a sorted vector costs
/// a few bytes per key where a one-element `BTreeSet` allocates a whole B-tree node. Inserts and
/// removals are O(k) for k keys, bounded by `KEYS_PER_SESSION_MAX`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeySet(Vec<Key>);

impl KeySet {
    /// Adds `key`; false if it was there.
    pub fn insert(&mut self, key: Key) -> bool {
        match self.0.binary_search(&key) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, key);
                true
            }
        }
    }

    /// Removes `key`; false if it was not there.
    pub fn remove(&mut self, key: &Key) -> bool {
        match self.0.binary_search(key) {
            Ok(at) => {
                self.0.remove(at);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether `key` is in the set.
    pub fn contains(&self, key: &Key) -> bool {
        self.0.binary_search(key).is_ok()
    }

    /// Number of keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Keys in order.
    pub fn iter(&self) -> std::slice::Iter<'_, Key> {
        self.0.iter()
    }

    /// Whether the keys are strictly increasing (for invariant checks after decoding).
    pub(crate) fn is_sorted(&self) -> bool {
        self.0.windows(2).all(|w| w[0] < w[1])
    }
}

impl<'a> IntoIterator for &'a KeySet {
    type Item = &'a Key;
    type IntoIter = std::slice::Iter<'a, Key>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl Session {
    /// Holds plus waits of this session.
    pub fn key_count(&self) -> usize {
        self.holds.len() + self.waits.len()
    }
}
