//! Names of semaphores and elections, and the [`Key`] that identifies either.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::limits::NAME_BYTES_MAX;

/// A validated semaphore or election name: 1 to [`NAME_BYTES_MAX`] bytes of `[A-Za-z0-9._:-]`.
///
/// Names have no `/` so that they sit in one URL path segment; use `.` or `:` for hierarchy.
///
/// # Examples
/// ```
/// use permit_core::Name;
/// assert!(Name::new("db.orders").is_ok());
/// assert!(Name::new("a/b").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct Name(String);

/// Serialized as its text, without the copy that `#[serde(into = "String")]` would make (a
/// snapshot serializes every name of every hold).
impl Serialize for Name {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Why a string is not a valid [`Name`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a name is 1 to {NAME_BYTES_MAX} bytes of A-Z, a-z, 0-9, '.', '_', ':' and '-'")]
pub struct InvalidName;

impl Name {
    /// Validates `text` as a name.
    ///
    /// # Errors
    /// [`InvalidName`] when `text` is empty, longer than [`NAME_BYTES_MAX`] bytes, or holds a
    /// byte outside `[A-Za-z0-9._:-]`.
    pub fn new(text: impl Into<String>) -> Result<Name, InvalidName> {
        let text = text.into();
        let valid_byte = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-');
        if text.is_empty() || text.len() > NAME_BYTES_MAX || !text.as_bytes().iter().all(valid_byte) {
            return Err(InvalidName);
        }
        Ok(Name(text))
    }

    /// A name that sorts before every valid name, for range bounds. Never stored.
    pub(crate) fn below_all() -> Name {
        Name(String::new())
    }

    /// Any text as a name, for range bounds only. Never stored.
    pub(crate) fn bound(text: String) -> Name {
        Name(text)
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Name {
    type Error = InvalidName;
    fn try_from(text: String) -> Result<Name, InvalidName> {
        Name::new(text)
    }
}

impl From<Name> for String {
    fn from(name: Name) -> String {
        name.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// The kinds of named object. They live in separate namespaces: a semaphore, an election and a
/// queue may share a name.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub enum Kind {
    /// A counting semaphore with a capacity set by clients.
    Semaphore,
    /// A leader election: a capacity-1 semaphore whose hold carries the leader's value.
    Election,
    /// A work queue (it holds items, not permits: it is never in a session's holds or waits).
    Queue,
}

/// Identifies one semaphore, election or queue.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize, Deserialize)]
pub struct Key {
    /// Which namespace.
    pub kind: Kind,
    /// The name within it.
    pub name: Name,
}

impl Key {
    /// The key of the semaphore called `name`.
    pub fn semaphore(name: Name) -> Key {
        Key { kind: Kind::Semaphore, name }
    }

    /// The key of the election called `name`.
    pub fn election(name: Name) -> Key {
        Key { kind: Kind::Election, name }
    }

    /// The key of the queue called `name`.
    pub fn queue(name: Name) -> Key {
        Key { kind: Kind::Queue, name }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            Kind::Semaphore => write!(f, "semaphore {}", self.name),
            Kind::Election => write!(f, "election {}", self.name),
            Kind::Queue => write!(f, "queue {}", self.name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_accept_the_documented_alphabet_only() {
        assert!(Name::new("a").is_ok());
        assert!(Name::new("db.orders:eu-1_x").is_ok());
        assert!(Name::new("x".repeat(NAME_BYTES_MAX)).is_ok());
        for bad in ["", "a/b", "a b", "é", "a\n", "../x", "a%2F"] {
            assert_eq!(Name::new(bad), Err(InvalidName), "{bad:?}");
        }
        assert_eq!(Name::new("x".repeat(NAME_BYTES_MAX + 1)), Err(InvalidName));
    }
}
