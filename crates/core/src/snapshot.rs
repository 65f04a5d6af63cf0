//! The snapshot format: versioned, deterministic bytes of a [`State`].

use std::collections::BTreeMap;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};
use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::policy::Policy;
use crate::queue::{Queue, QueueRecord};
use crate::semaphore::Semaphore;
use crate::session::{KeySet, Session};
use crate::verify::InvariantViolation;
use crate::{Key, Name, SessionId, State, Token, TokenId};

/// The first byte of every snapshot. Bump it when the layout changes and keep a decoder for
/// every older version that may sit on a disk.
///
/// Version 4 adds the cluster's feature version. A state whose cluster version is 1 is still
/// written as version 3, which builds from before versioning read: a leader that sends a
/// snapshot to such a member during a rolling upgrade sends bytes it can decode, and a node
/// rolled back to such a build reads its own snapshots.
///
/// Version 5 adds the queues and the last item id. It is written only for a cluster version of
/// 4 or more (queues exist only from there), so every member of a cluster that can receive it
/// reads it; below that, version 4 (or 3) as before.
///
/// Version 6 adds the semaphore policies, for a cluster version of 5 or more.
pub const SNAPSHOT_FORMAT_VERSION: u8 = 6;
/// The format of a state whose cluster version is 4.
const SNAPSHOT_FORMAT_V5: u8 = 5;
/// The first cluster version whose snapshots are written in format 6.
const POLICIES_CLUSTER_VERSION: u32 = 5;
/// The format of a state whose cluster version is 2 or 3.
const SNAPSHOT_FORMAT_V4: u8 = 4;
/// The first cluster version whose snapshots are written in format 5.
const QUEUES_CLUSTER_VERSION: u32 = 4;
/// The format of a state whose cluster version is 1 (see [`SNAPSHOT_FORMAT_VERSION`]).
const SNAPSHOT_FORMAT_V3: u8 = 3;

/// Why bytes are not a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The version byte is not one this build reads.
    #[error(
        "snapshot format version {0} is not one this build reads (1 to {max}): a newer build wrote it, \
         or it is not a snapshot",
        max = SNAPSHOT_FORMAT_VERSION
    )]
    UnsupportedVersion(u8),
    /// The bytes do not decode.
    #[error("snapshot does not decode: {0}")]
    Decode(#[from] postcard::Error),
    /// The decoded state breaks an invariant.
    #[error("snapshot state is inconsistent: {0}")]
    Inconsistent(#[from] InvariantViolation),
}

/// The encoded fields of a [`State`], frozen: a persistent copy that shares its trees with the
/// state it was taken from. Taking one is O(1) ([`State::snapshot_view`]); encoding it
/// ([`SnapshotView::encode`]) walks every session and may run on another thread while the
/// state goes on changing.
#[derive(Clone, Debug)]
pub struct SnapshotView {
    sessions: OrdMap<SessionId, Session>,
    objects: OrdMap<Key, Arc<Semaphore>>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
    tokens: OrdMap<TokenId, Token>,
    root_created: bool,
    ephemeral: OrdSet<Key>,
    creators: OrdMap<Key, TokenId>,
    token_salt: Option<[u8; 32]>,
    cluster_version: u32,
    queues: OrdMap<Name, Arc<Queue>>,
    last_item: u64,
    policies: OrdMap<Key, Arc<Policy>>,
}

/// A map serialized as a map in key order, exactly as serde serializes a `BTreeMap`: postcard
/// writes the length, then the pairs, so the bytes are those of the snapshot written from
/// `BTreeMap`s (the test `maps_decode_from_the_bytes_of_sorted_pairs` holds them to it).
struct InOrder<'a, K, V>(&'a OrdMap<K, V>);

impl<K: Serialize + Ord + Clone, V: Serialize + Clone> Serialize for InOrder<'_, K, V> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

/// The objects in key order, each as its semaphore (not its `Arc`).
struct ObjectsInOrder<'a>(&'a OrdMap<Key, Arc<Semaphore>>);

impl Serialize for ObjectsInOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, object) in self.0 {
            map.serialize_entry(key, &**object)?;
        }
        map.end()
    }
}

/// The queues in name order, each as a [`QueueRecord`] would serialize (its settings, its items
/// in id order, its claimers), read from the queue without copying it.
struct QueuesInOrder<'a>(&'a OrdMap<Name, Arc<Queue>>);

impl Serialize for QueuesInOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, queue) in self.0 {
            map.serialize_entry(name, &QueueRef(queue))?;
        }
        map.end()
    }
}

/// The encoder's view of one queue (for the test that holds it to [`QueueRecord`]'s layout).
#[cfg(test)]
pub(crate) fn queue_ref(queue: &Queue) -> impl Serialize + '_ {
    QueueRef(queue)
}

/// One queue, laid out as [`QueueRecord`].
struct QueueRef<'a>(&'a Queue);

impl Serialize for QueueRef<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let queue = self.0;
        // A struct is its fields in order, as a tuple is (postcard writes nothing between).
        let mut fields = serializer.serialize_tuple(8)?;
        fields.serialize_element(&queue.max_attempts)?;
        fields.serialize_element(&queue.dead_letter)?;
        fields.serialize_element(&queue.max_items)?;
        fields.serialize_element(&queue.created_index)?;
        fields.serialize_element(&queue.modified_index)?;
        fields.serialize_element(&queue.next_seq)?;
        fields.serialize_element(&ItemsInOrder(queue))?;
        fields.serialize_element(&queue.claimers)?;
        fields.end()
    }
}

/// A queue's items in id order, as a map.
struct ItemsInOrder<'a>(&'a Queue);

impl Serialize for ItemsInOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.items.len()))?;
        for (id, item) in self.0.items() {
            map.serialize_entry(&id, item)?;
        }
        map.end()
    }
}

/// The policies in key order, each as its policy (not its `Arc`).
struct PoliciesInOrder<'a>(&'a OrdMap<Key, Arc<Policy>>);

impl Serialize for PoliciesInOrder<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, policy) in self.0 {
            map.serialize_entry(key, &**policy)?;
        }
        map.end()
    }
}

/// A set serialized as a sequence in order, as serde serializes a `BTreeSet`.
struct SetInOrder<'a, K>(&'a OrdSet<K>);

impl<K: Serialize + Ord + Clone> Serialize for SetInOrder<'_, K> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for key in self.0 {
            seq.serialize_element(key)?;
        }
        seq.end()
    }
}

/// Version 3's layout, borrowed from a [`SnapshotView`].
#[derive(Serialize)]
struct SnapshotV3Ref<'a> {
    sessions: InOrder<'a, SessionId, Session>,
    objects: ObjectsInOrder<'a>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
    tokens: InOrder<'a, TokenId, Token>,
    root_created: bool,
    ephemeral: SetInOrder<'a, Key>,
    creators: InOrder<'a, Key, TokenId>,
    token_salt: Option<[u8; 32]>,
}

impl SnapshotView {
    /// Encodes the view: the bytes [`State::encode_snapshot`] gives for the state it was taken
    /// from. Equal states give equal bytes.
    pub fn encode(&self) -> Vec<u8> {
        let view = SnapshotV3Ref {
            sessions: InOrder(&self.sessions),
            objects: ObjectsInOrder(&self.objects),
            last_token: self.last_token,
            now_ms: self.now_ms,
            applied_index: self.applied_index,
            tokens: InOrder(&self.tokens),
            root_created: self.root_created,
            ephemeral: SetInOrder(&self.ephemeral),
            creators: InOrder(&self.creators),
            token_salt: self.token_salt,
        };
        if self.cluster_version <= 1 {
            return postcard::to_extend(&view, vec![SNAPSHOT_FORMAT_V3])
                .expect("encoding to memory cannot fail");
        }
        if self.cluster_version < QUEUES_CLUSTER_VERSION {
            assert!(self.queues.is_empty() && self.last_item == 0, "queues below cluster version 4");
            // Version 4: version 3's fields, then the cluster version (a tuple is its fields in
            // order, with nothing between them).
            return postcard::to_extend(&(view, self.cluster_version), vec![SNAPSHOT_FORMAT_V4])
                .expect("encoding to memory cannot fail");
        }
        let queues = QueuesInOrder(&self.queues);
        if self.cluster_version < POLICIES_CLUSTER_VERSION {
            assert!(self.policies.is_empty(), "semaphore policies below cluster version 5");
            // Version 5: version 4's fields, then the queues and the last item id.
            return postcard::to_extend(
                &(view, self.cluster_version, queues, self.last_item),
                vec![SNAPSHOT_FORMAT_V5],
            )
            .expect("encoding to memory cannot fail");
        }
        // Version 6: version 5's fields, then the policies in key order.
        let policies = PoliciesInOrder(&self.policies);
        postcard::to_extend(
            &(view, self.cluster_version, queues, self.last_item, policies),
            vec![SNAPSHOT_FORMAT_VERSION],
        )
        .expect("encoding to memory cannot fail")
    }

    /// Log index of the last batch applied to the state the view was taken from.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }
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

impl SnapshotV1 {
    /// The sessions, with no owner, and the rest of version 3's fields, with no tokens.
    fn upgrade(self) -> (Vec<(SessionId, Session)>, SnapshotV3Rest) {
        let sessions = self
            .sessions
            .into_iter()
            .map(|(id, s)| {
                let SessionV1 { name, ttl_ms, created_index, holds, waits } = s;
                (id, Session { name, ttl_ms, created_index, owner: None, holds, waits })
            })
            .collect();
        let rest = SnapshotV3Rest {
            objects: self.objects,
            last_token: self.last_token,
            now_ms: self.now_ms,
            applied_index: self.applied_index,
            tokens: Vec::new(),
            root_created: false,
            ephemeral: Vec::new(),
            creators: Vec::new(),
            token_salt: None,
        };
        (sessions, rest)
    }
}

impl State {
    /// Encodes the state. Equal states give equal bytes.
    pub fn encode_snapshot(&self) -> Vec<u8> {
        self.snapshot_view().encode()
    }

    /// A frozen copy of what a snapshot encodes, in O(1): the persistent maps are shared, and
    /// a later change to this state copies only what it touches. The shell takes it under its
    /// lock and encodes it outside.
    ///
    /// # Examples
    /// ```
    /// use permit_core::State;
    /// let state = State::default();
    /// let view = state.snapshot_view();
    /// assert_eq!(view.encode(), state.encode_snapshot());
    /// ```
    pub fn snapshot_view(&self) -> SnapshotView {
        SnapshotView {
            sessions: self.sessions.clone(),
            objects: self.objects.clone(),
            last_token: self.last_token,
            now_ms: self.now_ms,
            applied_index: self.applied_index,
            tokens: self.tokens.clone(),
            root_created: self.root_created,
            ephemeral: self.ephemeral.clone(),
            creators: self.creators.clone(),
            token_salt: self.token_salt,
            cluster_version: self.cluster_version,
            queues: self.queues.clone(),
            last_item: self.last_item,
            policies: self.policies.clone(),
        }
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
        let mut cluster_version = 0;
        let mut queues: Vec<(Name, QueueRecord)> = Vec::new();
        let mut last_item = 0;
        let mut policies: Vec<(Key, Policy)> = Vec::new();
        let ((sessions, sessions_per_owner), v3) = match version {
            1 => {
                let (sessions, rest) = postcard::from_bytes::<SnapshotV1>(body)?.upgrade();
                (build_sessions([sessions])?, rest)
            }
            2 => {
                let (sessions, rest) = decode_streamed::<SnapshotV2Rest>(body)?;
                (sessions, rest.upgrade())
            }
            SNAPSHOT_FORMAT_V3 => decode_streamed::<SnapshotV3Rest>(body)?,
            SNAPSHOT_FORMAT_V4 => {
                let (sessions, SnapshotV4Rest(rest, version)) = decode_streamed::<SnapshotV4Rest>(body)?;
                if !(2..QUEUES_CLUSTER_VERSION).contains(&version) {
                    // Written only for these versions: another one is not a snapshot we wrote.
                    return Err(InvariantViolation(format!(
                        "cluster version {version} in a version 4 snapshot"
                    ))
                    .into());
                }
                cluster_version = version;
                (sessions, rest)
            }
            SNAPSHOT_FORMAT_V5 => {
                let (sessions, SnapshotV5Rest(rest, version, queue_records, items)) =
                    decode_streamed::<SnapshotV5Rest>(body)?;
                if version != QUEUES_CLUSTER_VERSION {
                    return Err(InvariantViolation(format!(
                        "cluster version {version} in a version 5 snapshot"
                    ))
                    .into());
                }
                cluster_version = version;
                queues = queue_records;
                last_item = items;
                (sessions, rest)
            }
            SNAPSHOT_FORMAT_VERSION => {
                let (sessions, SnapshotV6Rest(rest, version, queue_records, items, policy_records)) =
                    decode_streamed::<SnapshotV6Rest>(body)?;
                if version < POLICIES_CLUSTER_VERSION {
                    return Err(InvariantViolation(format!(
                        "cluster version {version} in a version 6 snapshot"
                    ))
                    .into());
                }
                cluster_version = version;
                queues = queue_records;
                last_item = items;
                policies = policy_records;
                (sessions, rest)
            }
            other => return Err(SnapshotError::UnsupportedVersion(other)),
        };
        let mut state = State {
            sessions,
            objects: sorted_map(
                v3.objects.into_iter().map(|(key, object)| (key, Arc::new(object))).collect(),
                "object",
            )?,
            hold_deadlines: Default::default(),
            last_token: v3.last_token,
            now_ms: v3.now_ms,
            applied_index: v3.applied_index,
            tokens: sorted_map(v3.tokens, "token")?,
            token_ids_by_secret: Default::default(),
            sessions_per_owner,
            root_created: v3.root_created,
            ephemeral: Default::default(),
            creators: sorted_map(v3.creators, "creator")?,
            created_by: Default::default(),
            token_salt: v3.token_salt,
            cluster_version,
            queues: Default::default(),
            last_item,
            queued_items: 0,
            items_due: Default::default(),
            queue_sessions: Default::default(),
            policies: Default::default(),
            policy_due: Default::default(),
            policy_due_at: Default::default(),
        };
        if let Some(pair) = queues.windows(2).find(|pair| pair[0].0 >= pair[1].0) {
            return Err(
                InvariantViolation(format!("queue {} out of order in the snapshot", pair[1].0)).into()
            );
        }
        for (name, record) in queues {
            if record.items.windows(2).any(|pair| pair[0].0 >= pair[1].0) {
                return Err(
                    InvariantViolation(format!("queue {name}: items out of order in the snapshot")).into()
                );
            }
            let queue = record.into_queue();
            state.index_queue(&name, &queue);
            state.queues.insert(name, Arc::new(queue));
        }
        if let Some(pair) = v3.ephemeral.windows(2).find(|pair| pair[0] >= pair[1]) {
            return Err(
                InvariantViolation(format!("ephemeral {} out of order in the snapshot", pair[1])).into()
            );
        }
        state.ephemeral = v3.ephemeral.into_iter().collect();
        for (id, token) in &state.tokens {
            state.token_ids_by_secret.insert(token.secret_hash, *id);
        }
        for (key, token) in &state.creators {
            state.created_by.entry(*token).or_default().insert(key.clone());
        }
        // Freshly decoded, every object is unshared: `make_mut` does not copy.
        let keys: Vec<Key> = state.objects.keys().cloned().collect();
        for key in &keys {
            let object = state.objects.get_mut(key).map(Arc::make_mut).expect("listed above");
            object.queue.validate().map_err(|what| InvariantViolation(format!("{key}: {what}")))?;
            object.queue.rebuild_index();
            for (session, hold) in &object.holders {
                if let Some(deadline) = hold.expires_at_ms {
                    state.hold_deadlines.insert((deadline, key.clone(), *session));
                }
            }
        }
        let policies = sorted_map(policies, "policy")?;
        for key in policies.keys() {
            if !state.objects.contains_key(key) {
                return Err(InvariantViolation(format!("{key}: a policy without its semaphore")).into());
            }
        }
        state.policies = policies.into_iter().map(|(key, policy)| (key, Arc::new(policy))).collect();
        state.reindex_policies();
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
fn sorted_map<K: Ord + Clone + std::fmt::Display, V: Clone>(
    pairs: Vec<(K, V)>,
    what: &str,
) -> Result<OrdMap<K, V>, InvariantViolation> {
    if let Some(pair) = pairs.windows(2).find(|pair| pair[0].0 >= pair[1].0) {
        return Err(InvariantViolation(format!("{what} {} out of order in the snapshot", pair[1].0)));
    }
    Ok(pairs.into_iter().collect())
}

/// The sessions map and the count of sessions per owner, built from pairs arriving in chunks
/// that must be in strictly increasing id order.
type SessionsBuilt = (OrdMap<SessionId, Session>, BTreeMap<TokenId, u64>);

/// How many decoded sessions travel to the map builder at a time.
const SESSION_CHUNK: usize = 4096;

/// Builds the sessions map from chunks of pairs; an id out of order is a corrupt snapshot.
fn build_sessions(
    chunks: impl IntoIterator<Item = Vec<(SessionId, Session)>>,
) -> Result<SessionsBuilt, InvariantViolation> {
    let mut map = OrdMap::new();
    let mut per_owner = BTreeMap::new();
    let mut last: Option<SessionId> = None;
    let mut out_of_order = None;
    for chunk in chunks {
        for (id, session) in chunk {
            if out_of_order.is_some() {
                continue; // drain the sender; the error is already decided
            }
            if last.is_some_and(|last| last >= id) {
                out_of_order = Some(id);
                continue;
            }
            last = Some(id);
            if let Some(owner) = session.owner {
                *per_owner.entry(owner).or_default() += 1;
            }
            map.insert(id, session);
        }
    }
    match out_of_order {
        Some(id) => Err(InvariantViolation(format!("session {id} out of order in the snapshot"))),
        None => Ok((map, per_owner)),
    }
}

/// Version 4 after the sessions: version 3's, then the cluster's feature version.
#[derive(Deserialize)]
struct SnapshotV4Rest(SnapshotV3Rest, u32);

/// Version 5 after the sessions: version 4's fields, then the queues (in name order) and the
/// last item id.
#[derive(Deserialize)]
struct SnapshotV5Rest(SnapshotV3Rest, u32, Vec<(Name, QueueRecord)>, u64);

/// Version 6 after the sessions: version 5's fields, then the semaphore policies (in key order).
#[derive(Deserialize)]
struct SnapshotV6Rest(SnapshotV3Rest, u32, Vec<(Name, QueueRecord)>, u64, Vec<(Key, Policy)>);

/// Decodes version 2, 3 or 4 (whose fields after the sessions are `Rest`) with the sessions
/// streamed to a second thread in chunks, which builds their persistent map while this one goes
/// on decoding: `imbl` has no bulk build from sorted pairs, so the map costs one insert per
/// session, and this overlaps those inserts with the decoding of the sessions after them.
fn decode_streamed<Rest: for<'de> Deserialize<'de>>(
    body: &[u8],
) -> Result<(SessionsBuilt, Rest), SnapshotError> {
    let (sender, receiver) = std::sync::mpsc::sync_channel::<Vec<(SessionId, Session)>>(8);
    let (built, rest) = std::thread::scope(|scope| {
        let builder = scope.spawn(move || build_sessions(receiver));
        let mut deserializer = postcard::Deserializer::from_bytes(body);
        let decoded = SessionsInto(sender)
            .deserialize(&mut deserializer)
            .and_then(|()| Rest::deserialize(&mut deserializer));
        // The sender was moved into the visitor and dropped with it: the builder's loop ends.
        let built = match builder.join() {
            Ok(built) => built,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        (built, decoded)
    });
    let rest = rest?;
    Ok((built?, rest))
}

/// Version 2 after its first field, the sessions (a map, encoded as its length and then the
/// pairs; postcard writes a struct's fields one after the other, with nothing between them).
/// Version 2 added session owners and access tokens.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SnapshotV2Rest {
    objects: Vec<(Key, Semaphore)>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
    tokens: Vec<(TokenId, Token)>,
    root_created: bool,
    ephemeral: Vec<Key>,
}

impl SnapshotV2Rest {
    /// Version 3's fields: no object has a recorded creator (none counts against a token's
    /// cap), and the cluster has no token salt yet (its tokens keep their plain SHA-256).
    fn upgrade(self) -> SnapshotV3Rest {
        let SnapshotV2Rest { objects, last_token, now_ms, applied_index, tokens, root_created, ephemeral } =
            self;
        SnapshotV3Rest {
            objects,
            last_token,
            now_ms,
            applied_index,
            tokens,
            root_created,
            ephemeral,
            creators: Vec::new(),
            token_salt: None,
        }
    }
}

/// Version 3 after the sessions: version 2's fields, then the creator of each object created on
/// behalf of a token (in key order) and the cluster's token salt.
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct SnapshotV3Rest {
    objects: Vec<(Key, Semaphore)>,
    last_token: u64,
    now_ms: u64,
    applied_index: u64,
    tokens: Vec<(TokenId, Token)>,
    root_created: bool,
    ephemeral: Vec<Key>,
    creators: Vec<(Key, TokenId)>,
    token_salt: Option<[u8; 32]>,
}

/// Decodes the sessions sequence (encoded as a map: its length, then the pairs) and sends the
/// pairs to the map builder in chunks.
struct SessionsInto(std::sync::mpsc::SyncSender<Vec<(SessionId, Session)>>);

impl<'de> DeserializeSeed<'de> for SessionsInto {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for SessionsInto {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a sequence of (session id, session) pairs")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut chunk = Vec::with_capacity(SESSION_CHUNK);
        while let Some(pair) = seq.next_element::<(SessionId, Session)>()? {
            chunk.push(pair);
            if chunk.len() == SESSION_CHUNK {
                // A send fails only if the builder panicked; its panic is re-raised after.
                let _ = self.0.send(std::mem::replace(&mut chunk, Vec::with_capacity(SESSION_CHUNK)));
            }
        }
        if !chunk.is_empty() {
            let _ = self.0.send(chunk);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Batch, Command};

    fn state_with_sessions(count: u8) -> State {
        let commands = (1..=count)
            .map(|i| Command::CreateSession { id: SessionId::from_bytes([i; 16]), ttl_ms: 1000, name: None })
            .collect();
        let mut state = State::default();
        state.apply(1, 1, &Batch { now_ms: 5, commands }, &mut Vec::new());
        state
    }

    fn state_with_many_sessions(count: usize) -> State {
        let commands = (1..=count as u128)
            .map(|i| Command::CreateSession {
                id: SessionId::from_bytes(i.to_be_bytes()),
                ttl_ms: 1000,
                name: None,
            })
            .collect();
        let mut state = State::default();
        state.apply(1, 1, &Batch { now_ms: 5, commands }, &mut Vec::new());
        state
    }

    fn raw_bytes(state: &State, order: impl Fn(&mut Vec<(SessionId, Session)>)) -> Vec<u8> {
        let mut sessions: Vec<_> = state.sessions.iter().map(|(id, s)| (*id, s.clone())).collect();
        order(&mut sessions);
        // A tuple is encoded as its fields one after the other, like the snapshot's struct.
        let raw = (
            sessions,
            SnapshotV3Rest {
                objects: state.objects.iter().map(|(k, o)| (k.clone(), (**o).clone())).collect(),
                last_token: state.last_token,
                now_ms: state.now_ms,
                applied_index: state.applied_index,
                tokens: state.tokens.iter().map(|(id, t)| (*id, t.clone())).collect(),
                root_created: state.root_created,
                ephemeral: state.ephemeral.iter().cloned().collect(),
                creators: state.creators.iter().map(|(k, t)| (k.clone(), *t)).collect(),
                token_salt: state.token_salt,
            },
        );
        postcard::to_extend(&raw, vec![SNAPSHOT_FORMAT_V3]).unwrap()
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

    /// A state with a token, a session it owns and an object that session holds, as a cluster
    /// made before version 3 had it: no creators recorded, no token salt.
    fn state_with_a_token() -> State {
        let owner = TokenId::from_bytes([4; 16]);
        let token = Token { name: "old".into(), secret_hash: [5; 32], rules: crate::root_rules() };
        let session = SessionId::from_bytes([6; 16]);
        let mut state = State::default();
        let commands = vec![
            Command::CreateToken { id: owner, token },
            Command::CreateOwnedSession {
                id: session,
                ttl_ms: 1000,
                name: None,
                owner,
                owner_sessions_max: 9,
            },
            Command::Acquire(crate::Acquire {
                key: Key::semaphore(crate::Name::new("db").unwrap()),
                session,
                permits: 1,
                wait: false,
                capacity: Some(2),
                max_hold_ms: None,
                value: None,
            }),
            Command::PutSemaphore { name: crate::Name::new("idle").unwrap(), capacity: 3 },
        ];
        state.apply(1, 1, &Batch { now_ms: 5, commands }, &mut Vec::new());
        state
    }

    #[test]
    fn a_version_2_snapshot_still_decodes_without_creators_or_salt() {
        let state = state_with_a_token();
        // Version 2's bytes, as a data dir or backup written before version 3 holds them.
        let v2 = (
            state.sessions.iter().map(|(id, s)| (*id, s.clone())).collect::<Vec<_>>(),
            SnapshotV2Rest {
                objects: state.objects.iter().map(|(k, o)| (k.clone(), (**o).clone())).collect(),
                last_token: state.last_token,
                now_ms: state.now_ms,
                applied_index: state.applied_index,
                tokens: state.tokens.iter().map(|(id, t)| (*id, t.clone())).collect(),
                root_created: state.root_created,
                ephemeral: state.ephemeral.iter().cloned().collect(),
            },
        );
        let bytes = postcard::to_extend(&v2, vec![2]).unwrap();
        let decoded = State::decode_snapshot(&bytes).unwrap();
        assert_eq!(decoded, state);
        assert_eq!(decoded.token_salt(), None);
        assert_eq!(decoded.objects_created_by(TokenId::from_bytes([4; 16])), 0);
        assert!(decoded.token_by_secret(&[5; 32]).is_some(), "the old token's plain hash still finds it");
        // Written again, it is version 3 (its cluster version is 1), and reads back the same.
        let v3 = decoded.encode_snapshot();
        assert_eq!(v3[0], SNAPSHOT_FORMAT_V3);
        assert_ne!(v3, bytes);
        assert_eq!(State::decode_snapshot(&v3).unwrap(), state);
    }

    /// A state at cluster version 1 is written as version 3, byte for byte what builds from
    /// before versioning write (so they read it); a raised one as version 4, which keeps it.
    #[test]
    fn the_cluster_version_is_kept_and_version_1_states_stay_in_format_3() {
        let mut state = state_with_a_token();
        let v3 = state.encode_snapshot();
        assert_eq!(v3[0], SNAPSHOT_FORMAT_V3);
        assert_eq!(v3, raw_bytes(&state, |_| {}), "the bytes of format 3, as older builds write them");
        let raise = |version| Batch { now_ms: 6, commands: vec![Command::SetClusterVersion { version }] };
        state.apply(2, 1, &raise(2), &mut Vec::new());
        assert_eq!(state.cluster_version(), 2);
        let v4 = state.encode_snapshot();
        assert_eq!(v4[0], SNAPSHOT_FORMAT_V4);
        let decoded = State::decode_snapshot(&v4).unwrap();
        assert_eq!(decoded, state);
        assert_eq!(decoded.cluster_version(), 2);
        // Format 4 with a version that was never raised is not a snapshot this build wrote.
        let mut lowered = v4.clone();
        *lowered.last_mut().unwrap() = 1;
        assert!(matches!(State::decode_snapshot(&lowered), Err(SnapshotError::Inconsistent(_))));
        // Never lowered; equal versions are equal states.
        let mut again = state.clone();
        again.apply(3, 1, &raise(1), &mut Vec::new());
        assert_eq!(again.cluster_version(), 2);
        // From version 4 on (queues), format 5; a format 4 snapshot claiming version 4 is not
        // one this build wrote.
        state.apply(4, 1, &raise(4), &mut Vec::new());
        let v5 = state.encode_snapshot();
        assert_eq!(v5[0], SNAPSHOT_FORMAT_V5);
        assert_eq!(State::decode_snapshot(&v5).unwrap(), state);
        let mut v4_claiming_4 = v4.clone();
        *v4_claiming_4.last_mut().unwrap() = 4;
        assert!(matches!(State::decode_snapshot(&v4_claiming_4), Err(SnapshotError::Inconsistent(_))));
        // From version 5 on (semaphore policies), format 6, with a policy that round-trips.
        state.apply(5, 1, &raise(5), &mut Vec::new());
        let name = crate::Name::new("api").unwrap();
        let change = crate::PolicyChange {
            rate: Some(Some(crate::Rate { permits: 10, per_ms: 1000, burst: 5 })),
            lock_delay_ms: Some(500),
            group_max: Some(Some(2)),
        };
        let put = Command::PutSemaphorePolicy { name, capacity: 4, policy: change, creator: None };
        let outcomes = state.apply(6, 1, &Batch { now_ms: 7, commands: vec![put] }, &mut Vec::new());
        assert_eq!(outcomes, vec![crate::Outcome::SemaphoreCreated]);
        let v6 = state.encode_snapshot();
        assert_eq!(v6[0], SNAPSHOT_FORMAT_VERSION);
        assert_eq!(State::decode_snapshot(&v6).unwrap(), state);
        assert!(State::decode_snapshot(&v5).is_ok(), "format 5 still reads");
    }

    #[test]
    fn a_creator_that_names_a_missing_object_or_a_deleted_token_is_a_corrupt_snapshot() {
        let mut state = state_with_a_token();
        let db = Key::semaphore(crate::Name::new("db").unwrap());
        let owner = TokenId::from_bytes([4; 16]);
        for (key, token) in [
            (db.clone(), TokenId::from_bytes([8; 16])),
            (Key::semaphore(crate::Name::new("gone").unwrap()), owner),
        ] {
            let mut bad = state.clone();
            bad.creators.insert(key.clone(), token);
            bad.created_by.entry(token).or_default().insert(key);
            assert!(matches!(
                State::decode_snapshot(&bad.encode_snapshot()),
                Err(SnapshotError::Inconsistent(_))
            ));
        }
        state.creators.insert(db.clone(), owner);
        state.created_by.entry(owner).or_default().insert(db);
        state.token_salt = Some([3; 32]);
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);
    }

    #[test]
    fn maps_decode_from_the_bytes_of_sorted_pairs() {
        let state = state_with_sessions(3);
        assert_eq!(raw_bytes(&state, |_| {}), state.encode_snapshot());
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);
    }

    #[test]
    fn a_view_keeps_the_state_it_was_taken_from_while_the_state_changes() {
        let mut state = state_with_sessions(3);
        let acquire = |session: u8| crate::Acquire {
            key: Key::semaphore(crate::Name::new("db").unwrap()),
            session: SessionId::from_bytes([session; 16]),
            permits: 1,
            wait: true,
            capacity: Some(1),
            max_hold_ms: None,
            value: None,
        };
        let batch = |commands| Batch { now_ms: 6, commands };
        state.apply(2, 1, &batch(vec![Command::Acquire(acquire(1))]), &mut Vec::new());
        let frozen = state.clone();
        let view = state.snapshot_view();
        // Change every map the view shares: a waiter and a hold on the shared object, a new
        // session, a closed one.
        state.apply(3, 1, &batch(vec![Command::Acquire(acquire(2))]), &mut Vec::new());
        let new = SessionId::from_bytes([9; 16]);
        let commands = vec![
            Command::CreateSession { id: new, ttl_ms: 1000, name: None },
            Command::CloseSession { id: SessionId::from_bytes([1; 16]) },
        ];
        state.apply(4, 1, &batch(commands), &mut Vec::new());
        assert_eq!(view.applied_index(), 2);
        assert_eq!(view.encode(), frozen.encode_snapshot(), "the view did not move");
        assert_ne!(state.encode_snapshot(), frozen.encode_snapshot());
        assert_eq!(State::decode_snapshot(&view.encode()).unwrap(), frozen);
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
    fn sessions_spanning_several_chunks_round_trip_and_a_swap_across_a_chunk_edge_is_caught() {
        let n = 2 * SESSION_CHUNK + 7;
        let state = state_with_many_sessions(n);
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);
        let swapped = raw_bytes(&state, |sessions| sessions.swap(SESSION_CHUNK - 1, SESSION_CHUNK));
        match State::decode_snapshot(&swapped) {
            Err(SnapshotError::Inconsistent(violation)) => assert!(violation.0.contains("out of order")),
            other => panic!("expected an inconsistent snapshot, got {other:?}"),
        }
        let bytes = state.encode_snapshot();
        for cut in [bytes.len() / 2, bytes.len() - 1] {
            assert!(
                matches!(State::decode_snapshot(&bytes[..cut]), Err(SnapshotError::Decode(_))),
                "cut at {cut}"
            );
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
