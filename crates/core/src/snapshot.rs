//! The snapshot format: versioned, deterministic bytes of a [`State`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::semaphore::Semaphore;
use crate::session::Session;
use crate::verify::InvariantViolation;
use crate::{Key, SessionId, State};

/// The first byte of every snapshot. Bump it when the layout changes and keep a decoder for
/// every older version that may sit on a disk.
pub const SNAPSHOT_FORMAT_VERSION: u8 = 1;

/// Why bytes are not a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The version byte is not one this build reads.
    #[error("snapshot format version {0} is not supported")]
    UnsupportedVersion(u8),
    /// The bytes do not decode.
    #[error("snapshot does not decode: {0}")]
    Decode(#[from] postcard::Error),
    /// The decoded state breaks an invariant.
    #[error("snapshot state is inconsistent: {0}")]
    Inconsistent(#[from] InvariantViolation),
}

#[derive(Serialize, Deserialize)]
struct SnapshotV1 {
    sessions: BTreeMap<SessionId, Session>,
    objects: BTreeMap<Key, Semaphore>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
}

#[derive(Serialize)]
struct SnapshotV1Ref<'a> {
    sessions: &'a BTreeMap<SessionId, Session>,
    objects: &'a BTreeMap<Key, Semaphore>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
}

impl State {
    /// Encodes the state. Equal states give equal bytes.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let view = SnapshotV1Ref {
            sessions: &self.sessions,
            objects: &self.objects,
            last_token: self.last_token,
            now_ms: self.now_ms,
            applied_index: self.applied_index,
        };
        let mut bytes = vec![SNAPSHOT_FORMAT_VERSION];
        postcard::to_io(&view, &mut bytes).expect("encoding to memory cannot fail");
        bytes
    }

    /// Decodes a snapshot and checks its invariants.
    ///
    /// # Errors
    /// [`SnapshotError`] when the bytes are not a snapshot of a consistent state.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let (&version, body) = bytes.split_first().ok_or(SnapshotError::UnsupportedVersion(0))?;
        if version != SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion(version));
        }
        let v1: SnapshotV1 = postcard::from_bytes(body)?;
        let mut state = State {
            sessions: v1.sessions,
            objects: v1.objects,
            hold_deadlines: Default::default(),
            last_token: v1.last_token,
            now_ms: v1.now_ms,
            applied_index: v1.applied_index,
        };
        for (key, object) in &mut state.objects {
            object.queue.rebuild_index();
            for (session, hold) in &object.holders {
                if let Some(deadline) = hold.expires_at_ms {
                    state.hold_deadlines.insert((deadline, key.clone(), *session));
                }
            }
        }
        state.verify()?;
        Ok(state)
    }

    /// A 64-bit digest of the snapshot bytes (FNV-1a), to compare replicas cheaply.
    pub fn digest(&self) -> u64 {
        self.encode_snapshot()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3))
    }
}
