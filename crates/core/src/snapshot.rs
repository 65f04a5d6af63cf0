//! The snapshot format: versioned, deterministic bytes of a [`State`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::semaphore::Semaphore;
use crate::session::{KeySet, Session};
use crate::verify::InvariantViolation;
use crate::{Key, SessionId, State, Token, TokenId};

/// The first byte of every snapshot. Bump it when the layout changes and keep a decoder for
/// every older version that may sit on a disk.
pub const SNAPSHOT_FORMAT_VERSION: u8 = 2;

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

/// Decoded as sorted vectors, which postcard encodes exactly like maps (a length, then the
/// pairs): the maps are then built bottom-up in linear time instead of by a million inserts.
/// Version 2 added session owners and access tokens.
#[derive(Deserialize)]
struct SnapshotV2 {
    sessions: Vec<(SessionId, Session)>,
    objects: Vec<(Key, Semaphore)>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
    tokens: Vec<(TokenId, Token)>,
    root_created: bool,
    ephemeral: Vec<Key>,
}

#[derive(Serialize)]
struct SnapshotV2Ref<'a> {
    sessions: &'a BTreeMap<SessionId, Session>,
    objects: &'a BTreeMap<Key, Semaphore>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
    tokens: &'a BTreeMap<TokenId, Token>,
    root_created: bool,
    ephemeral: &'a std::collections::BTreeSet<Key>,
}

/// Version 1: no tokens, sessions without owners.
#[derive(Deserialize)]
struct SnapshotV1 {
    sessions: Vec<(SessionId, SessionV1)>,
    objects: Vec<(Key, Semaphore)>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
}

#[derive(Deserialize)]
struct SessionV1 {
    name: Option<String>,
    ttl_ms: u64,
    created_index: u64,
    holds: KeySet,
    waits: KeySet,
}

impl From<SnapshotV1> for SnapshotV2 {
    fn from(v1: SnapshotV1) -> SnapshotV2 {
        let sessions = v1
            .sessions
            .into_iter()
            .map(|(id, s)| {
                let SessionV1 { name, ttl_ms, created_index, holds, waits } = s;
                (id, Session { name, ttl_ms, created_index, owner: None, holds, waits })
            })
            .collect();
        SnapshotV2 {
            sessions,
            objects: v1.objects,
            last_token: v1.last_token,
            now_ms: v1.now_ms,
            applied_index: v1.applied_index,
            tokens: Vec::new(),
            root_created: false,
            ephemeral: Vec::new(),
        }
    }
}

impl State {
    /// Encodes the state. Equal states give equal bytes.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        let view = SnapshotV2Ref {
            sessions: &self.sessions,
            objects: &self.objects,
            last_token: self.last_token,
            now_ms: self.now_ms,
            applied_index: self.applied_index,
            tokens: &self.tokens,
            root_created: self.root_created,
            ephemeral: &self.ephemeral,
        };
        postcard::to_extend(&view, vec![SNAPSHOT_FORMAT_VERSION]).expect("encoding to memory cannot fail")
    }

    /// Decodes a snapshot and checks its invariants.
    ///
    /// # Errors
    /// [`SnapshotError`] when the bytes are not a snapshot of a consistent state.
    ///
    /// # Examples
    /// ```
    /// use permit_core::State;
    /// let state = State::default();
    /// let bytes = state.encode_snapshot();
    /// assert_eq!(State::decode_snapshot(&bytes).unwrap(), state);
    /// assert!(State::decode_snapshot(&bytes[..1]).is_err());
    /// ```
    pub fn decode_snapshot(bytes: &[u8]) -> Result<State, SnapshotError> {
        let state = State::decode_unchecked(bytes)?;
        state.verify()?;
        Ok(state)
    }

    /// Like [`State::decode_snapshot`], and runs `alongside` on the decoded state while the
    /// invariants are checked on a second thread: a restart builds its in-memory indexes in the
    /// time the check takes. The state and `alongside`'s result are returned only if the state
    /// is consistent.
    ///
    /// # Errors
    /// As [`State::decode_snapshot`].
    ///
    /// # Examples
    /// ```
    /// use permit_core::State;
    /// let bytes = State::default().encode_snapshot();
    /// let (state, sessions) = State::decode_snapshot_with(&bytes, |s| s.session_count()).unwrap();
    /// assert_eq!(sessions, 0);
    /// assert_eq!(state, State::default());
    /// ```
    pub fn decode_snapshot_with<R: Send>(
        bytes: &[u8],
        alongside: impl FnOnce(&State) -> R + Send,
    ) -> Result<(State, R), SnapshotError> {
        let state = State::decode_unchecked(bytes)?;
        let (checked, result) = std::thread::scope(|scope| {
            let check = scope.spawn(|| state.verify());
            let result = alongside(&state);
            (check.join(), result)
        });
        match checked {
            Ok(checked) => checked?,
            Err(panic) => std::panic::resume_unwind(panic),
        }
        Ok((state, result))
    }

    fn decode_unchecked(bytes: &[u8]) -> Result<State, SnapshotError> {
        let (&version, body) = bytes.split_first().ok_or(SnapshotError::UnsupportedVersion(0))?;
        let v2: SnapshotV2 = match version {
            1 => postcard::from_bytes::<SnapshotV1>(body)?.into(),
            SNAPSHOT_FORMAT_VERSION => postcard::from_bytes(body)?,
            other => return Err(SnapshotError::UnsupportedVersion(other)),
        };
        let mut state = State {
            sessions: sorted_map(v2.sessions, "session")?,
            objects: sorted_map(v2.objects, "object")?,
            hold_deadlines: Default::default(),
            last_token: v2.last_token,
            now_ms: v2.now_ms,
            applied_index: v2.applied_index,
            tokens: sorted_map(v2.tokens, "token")?,
            token_ids_by_secret: Default::default(),
            sessions_per_owner: Default::default(),
            root_created: v2.root_created,
            ephemeral: Default::default(),
        };
        if let Some(pair) = v2.ephemeral.windows(2).find(|pair| pair[0] >= pair[1]) {
            return Err(
                InvariantViolation(format!("ephemeral {} out of order in the snapshot", pair[1])).into()
            );
        }
        state.ephemeral = v2.ephemeral.into_iter().collect();
        for (id, token) in &state.tokens {
            state.token_ids_by_secret.insert(token.secret_sha256, *id);
        }
        for session in state.sessions.values() {
            if let Some(owner) = session.owner {
                *state.sessions_per_owner.entry(owner).or_default() += 1;
            }
        }
        for (key, object) in &mut state.objects {
            object.queue.validate().map_err(|what| InvariantViolation(format!("{key}: {what}")))?;
            object.queue.rebuild_index();
            for (session, hold) in &object.holders {
                if let Some(deadline) = hold.expires_at_ms {
                    state.hold_deadlines.insert((deadline, key.clone(), *session));
                }
            }
        }
        Ok(state)
    }

    /// A 64-bit digest of the snapshot bytes (FNV-1a), to compare replicas cheaply.
    pub fn digest(&self) -> u64 {
        self.encode_snapshot()
            .iter()
            .fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(*byte)).wrapping_mul(0x100_0000_01b3))
    }
}

/// The map of `pairs`, which must be in strictly increasing key order as encoded: anything else
/// is a corrupt snapshot, not something to repair silently.
fn sorted_map<K: Ord + std::fmt::Display, V>(
    pairs: Vec<(K, V)>,
    what: &str,
) -> Result<BTreeMap<K, V>, InvariantViolation> {
    if let Some(pair) = pairs.windows(2).find(|pair| pair[0].0 >= pair[1].0) {
        return Err(InvariantViolation(format!("{what} {} out of order in the snapshot", pair[1].0)));
    }
    Ok(pairs.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, Command};

    /// The snapshot layout with the maps as plain vectors, to write bytes the encoder never would.
    #[derive(Serialize)]
    struct Raw {
        sessions: Vec<(SessionId, Session)>,
        objects: Vec<(Key, Semaphore)>,
        last_token: u64,
        now_ms: u64,
        applied_index: u64,
        tokens: Vec<(TokenId, Token)>,
        root_created: bool,
        ephemeral: Vec<Key>,
    }

    fn state_with_sessions(count: u8) -> State {
        let commands = (1..=count)
            .map(|i| Command::CreateSession { id: SessionId::from_bytes([i; 16]), ttl_ms: 1000, name: None })
            .collect();
        let mut state = State::default();
        state.apply(1, 1, &Batch { now_ms: 5, commands }, &mut Vec::new());
        state
    }

    fn raw_bytes(state: &State, order: impl Fn(&mut Vec<(SessionId, Session)>)) -> Vec<u8> {
        let mut sessions: Vec<_> = state.sessions.iter().map(|(id, s)| (*id, s.clone())).collect();
        order(&mut sessions);
        let raw = Raw {
            sessions,
            objects: state.objects.iter().map(|(k, o)| (k.clone(), o.clone())).collect(),
            last_token: state.last_token,
            now_ms: state.now_ms,
            applied_index: state.applied_index,
            tokens: state.tokens.iter().map(|(id, t)| (*id, t.clone())).collect(),
            root_created: state.root_created,
            ephemeral: state.ephemeral.iter().cloned().collect(),
        };
        postcard::to_extend(&raw, vec![SNAPSHOT_FORMAT_VERSION]).unwrap()
    }

    /// A version 1 session: name, ttl, created index, holds, waits.
    type RawSessionV1 = (Option<String>, u64, u64, KeySet, KeySet);

    /// Version 1's layout, as a disk written before tokens existed holds it.
    #[derive(Serialize)]
    struct RawV1 {
        sessions: Vec<(SessionId, RawSessionV1)>,
        objects: Vec<(Key, Semaphore)>,
        last_token: u64,
        now_ms: u64,
        applied_index: u64,
    }

    #[test]
    fn a_version_1_snapshot_still_decodes_with_unowned_sessions() {
        let state = state_with_sessions(2);
        let v1 = RawV1 {
            sessions: state
                .sessions
                .iter()
                .map(|(id, s)| {
                    (*id, (s.name.clone(), s.ttl_ms, s.created_index, s.holds.clone(), s.waits.clone()))
                })
                .collect(),
            objects: Vec::new(),
            last_token: state.last_token,
            now_ms: state.now_ms,
            applied_index: state.applied_index,
        };
        let bytes = postcard::to_extend(&v1, vec![1]).unwrap();
        let decoded = State::decode_snapshot(&bytes).unwrap();
        assert_eq!(decoded, state);
        assert!(decoded.sessions().all(|(_, s)| s.owner.is_none()));
        assert!(matches!(State::decode_snapshot(&[9]), Err(SnapshotError::UnsupportedVersion(9))));
    }

    #[test]
    fn maps_decode_from_the_bytes_of_sorted_pairs() {
        let state = state_with_sessions(3);
        assert_eq!(raw_bytes(&state, |_| {}), state.encode_snapshot());
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);
    }

    #[test]
    fn unsorted_or_repeated_sessions_are_a_corrupt_snapshot() {
        let state = state_with_sessions(3);
        let reversed = raw_bytes(&state, |sessions| sessions.reverse());
        let repeated = raw_bytes(&state, |sessions| sessions[1] = sessions[0].clone());
        for bytes in [reversed, repeated] {
            match State::decode_snapshot(&bytes) {
                Err(SnapshotError::Inconsistent(violation)) => assert!(violation.0.contains("out of order")),
                other => panic!("expected an inconsistent snapshot, got {other:?}"),
            }
            assert!(State::decode_snapshot_with(&bytes, |_| ()).is_err());
        }
    }

    #[test]
    fn decode_with_runs_alongside_and_still_rejects_inconsistent_states() {
        let mut state = state_with_sessions(2);
        let acquire = crate::Acquire {
            key: Key::semaphore(crate::Name::new("db").unwrap()),
            session: SessionId::from_bytes([1; 16]),
            permits: 1,
            wait: false,
            capacity: Some(1),
            max_hold_ms: None,
            value: None,
        };
        state.apply(2, 1, &Batch { now_ms: 6, commands: vec![Command::Acquire(acquire)] }, &mut Vec::new());
        let (decoded, count) =
            State::decode_snapshot_with(&state.encode_snapshot(), State::session_count).unwrap();
        assert_eq!((decoded, count), (state.clone(), 2));
        state.last_token = 0; // the hold's token is now from the future
        let bytes = state.encode_snapshot();
        assert!(matches!(State::decode_snapshot(&bytes), Err(SnapshotError::Inconsistent(_))));
        assert!(matches!(State::decode_snapshot_with(&bytes, |_| ()), Err(SnapshotError::Inconsistent(_))));
    }
}
