//! Sessions: a client's liveness, with a TTL, to which its holds and waits belong.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Key;

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
        for byte in self.0 {
            write!(f, "{byte:02x}")?;
        }
        Ok(())
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
        let digits = text.as_bytes();
        if digits.len() != 32 {
            return Err(InvalidSessionId);
        }
        let nibble = |d: u8| match d {
            b'0'..=b'9' => Ok(d - b'0'),
            b'a'..=b'f' => Ok(d - b'a' + 10),
            _ => Err(InvalidSessionId),
        };
        let mut bytes = [0u8; 16];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = nibble(digits[2 * i])? << 4 | nibble(digits[2 * i + 1])?;
        }
        Ok(SessionId(bytes))
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
    /// Objects on which this session holds permits.
    pub holds: BTreeSet<Key>,
    /// Objects on which this session waits.
    pub waits: BTreeSet<Key>,
}

impl Session {
    /// Holds plus waits of this session.
    pub fn key_count(&self) -> usize {
        self.holds.len() + self.waits.len()
    }
}
