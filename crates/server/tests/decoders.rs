//! Every decoder of bytes that come from disk or from the network returns an error on bad input,
//! never panics: log records, snapshots (the state bytes and the snapshot file) and peer RPC
//! bodies. Each property gets random bytes and mutations (flipped bytes, truncation, insertion)
//! of valid encodings. Some damaged inputs still decode (a flipped bit in a term is another
//! valid term); what is checked is that every decoder returns, and that a snapshot that decodes
//! passed `State::verify`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{
    BasicNode, CommittedLeaderId, Entry, EntryPayload, LogId, Membership, StoredMembership, Vote,
};
use permit_core::{Acquire, Batch, Command, Key, Name, SessionId, State};
use permit_server::raft::log::codec::{decode, LOG_FORMAT_VERSION};
use permit_server::raft::snapshot_store::{Meta, SnapshotStore};
use permit_server::raft::{NodeId, TypeConfig};
use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Cases per property: enough to reach every branch of these small formats, few enough that
/// the file runs in a few seconds in a debug build.
const CASES: u32 = 1024;
/// Longest random input, in bytes.
const RANDOM_BYTES_MAX: usize = 512;

fn log_id(term: u64, index: u64) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn membership() -> Membership<NodeId, BasicNode> {
    let nodes: BTreeMap<NodeId, BasicNode> =
        (1..=3).map(|id| (id, BasicNode::new(format!("127.0.0.1:{}", 7375 + id)))).collect();
    Membership::new(vec![BTreeSet::from([1, 2, 3])], nodes)
}

fn session(n: u8) -> SessionId {
    SessionId::from_bytes([n; 16])
}

/// A batch of every kind of command that carries data.
fn batch() -> Batch {
    let name = Name::new("db.orders").unwrap();
    let acquire = Acquire {
        key: Key::semaphore(name.clone()),
        session: session(1),
        permits: 2,
        wait: true,
        capacity: Some(5),
        max_hold_ms: Some(1_000),
        value: None,
    };
    let queued = Acquire { session: session(2), permits: 4, max_hold_ms: None, ..acquire.clone() };
    let campaign = Acquire {
        key: Key::election(Name::new("leader").unwrap()),
        session: session(2),
        permits: 1,
        wait: false,
        capacity: None,
        max_hold_ms: None,
        value: Some("10.0.0.1:80".to_owned()),
    };
    Batch {
        now_ms: 12_345,
        commands: vec![
            Command::CreateSession { id: session(1), ttl_ms: 10_000, name: Some("worker".to_owned()) },
            Command::CreateSession { id: session(2), ttl_ms: 5_000, name: None },
            Command::PutSemaphore { name: name.clone(), capacity: 5 },
            Command::Acquire(acquire),
            Command::Acquire(queued),
            Command::Acquire(campaign),
            Command::ExpireSessions { ids: vec![session(3)], decided_term: 4 },
            Command::Release { key: Key::semaphore(name), session: session(3) },
        ],
    }
}

fn entries() -> Vec<Entry<TypeConfig>> {
    vec![
        Entry { log_id: log_id(1, 1), payload: EntryPayload::Blank },
        Entry { log_id: log_id(1, 2), payload: EntryPayload::Membership(membership()) },
        Entry { log_id: log_id(2, 3), payload: EntryPayload::Normal(batch()) },
    ]
}

/// A state with sessions, a semaphore with holders and waiters, and an election.
fn state() -> State {
    let mut state = State::default();
    state.apply(1, 1, &batch(), &mut Vec::new());
    state
}

fn snapshot_meta() -> Meta {
    Meta {
        last_log_id: Some(log_id(2, 3)),
        last_membership: StoredMembership::new(Some(log_id(1, 2)), membership()),
        snapshot_id: "2-3-1".to_owned(),
    }
}

/// A log record as the log store writes it.
fn record<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_extend(value, vec![LOG_FORMAT_VERSION]).unwrap()
}

fn postcard<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).unwrap()
}

/// Valid log records: each entry, the vote and the log ids of the metadata table.
fn valid_records() -> Vec<Vec<u8>> {
    let mut records: Vec<Vec<u8>> = entries().iter().map(record).collect();
    records.push(record(&Vote::new_committed(7, 2u64)));
    records.push(record(&Some(log_id(2, 3))));
    records
}

/// Valid peer RPC bodies: a vote, an append (and a heartbeat), a snapshot chunk.
fn valid_rpc_bodies() -> Vec<Vec<u8>> {
    let vote = VoteRequest::new(Vote::new(3, 2u64), Some(log_id(2, 3)));
    let append = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        prev_log_id: Some(log_id(1, 0)),
        entries: entries(),
        leader_commit: Some(log_id(2, 2)),
    };
    let heartbeat = AppendEntriesRequest::<TypeConfig> { entries: Vec::new(), ..append.clone() };
    let snapshot = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(3, 1),
        meta: snapshot_meta(),
        offset: 0,
        data: state().encode_snapshot(),
        done: true,
    };
    vec![postcard(&vote), postcard(&append), postcard(&heartbeat), postcard(&snapshot)]
}

/// How to damage a valid encoding.
#[derive(Debug, Clone)]
enum Mutation {
    /// XOR the byte at this position (modulo the length) with a non-zero mask.
    Flip(usize, u8),
    /// Keep only this many bytes (modulo the length + 1).
    Truncate(usize),
    /// Insert a byte at this position (modulo the length + 1).
    Insert(usize, u8),
    /// Set the byte at this position to 0xFF (huge varints and lengths).
    Saturate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..).prop_map(|(at, mask)| Mutation::Flip(at, mask)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert(at, byte)),
        any::<usize>().prop_map(Mutation::Saturate),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = bytes.len();
        match *mutation {
            Mutation::Flip(at, mask) if len > 0 => bytes[at % len] ^= mask,
            Mutation::Saturate(at) if len > 0 => bytes[at % len] = 0xFF,
            Mutation::Truncate(keep) => bytes.truncate(keep % (len + 1)),
            Mutation::Insert(at, byte) => bytes.insert(at % (len + 1), byte),
            _ => {}
        }
    }
    bytes
}

/// One valid encoding out of `valid`, damaged by one to four mutations.
fn mutated(valid: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    let count = valid.len();
    (0..count, proptest::collection::vec(mutation(), 1..=4))
        .prop_map(move |(i, mutations)| mutate(valid[i].clone(), &mutations))
}

fn random_bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..=RANDOM_BYTES_MAX)
}

/// Random bytes that start like a valid encoding (the version byte), to get past the first check.
fn versioned_random_bytes(version: u8) -> impl Strategy<Value = Vec<u8>> {
    random_bytes().prop_map(move |mut bytes| {
        bytes.insert(0, version);
        bytes
    })
}

/// Decodes `bytes` as every log record type; the result does not matter, only that it returns.
fn decode_as_every_record(bytes: &[u8]) {
    let _ = decode::<Entry<TypeConfig>>(bytes);
    let _ = decode::<Vote<NodeId>>(bytes);
    let _ = decode::<Option<LogId<NodeId>>>(bytes);
}

/// Decodes `bytes` as every peer RPC body, as the `/raft/*` routes do.
fn decode_as_every_rpc(bytes: &[u8]) {
    fn rpc<T: DeserializeOwned>(bytes: &[u8]) {
        let _ = postcard::from_bytes::<T>(bytes);
    }
    rpc::<VoteRequest<NodeId>>(bytes);
    rpc::<AppendEntriesRequest<TypeConfig>>(bytes);
    rpc::<InstallSnapshotRequest<TypeConfig>>(bytes);
}

/// Writes `bytes` as the snapshot file and loads it, then decodes the state it holds (as a
/// restart does).
fn load_snapshot_file(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("snapshot.bin"), bytes).unwrap();
    if let Ok(Some((_, state))) = SnapshotStore::open(dir.path()).unwrap().load() {
        let _ = State::decode_snapshot(&state);
    }
}

/// A valid snapshot file, as `SnapshotStore::save` writes it (once: it fsyncs).
fn valid_snapshot_file() -> Vec<u8> {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(dir.path()).unwrap();
        store.save(&snapshot_meta(), &state().encode_snapshot()).unwrap();
        std::fs::read(dir.path().join("snapshot.bin")).unwrap()
    })
    .clone()
}

/// A snapshot file whose body is `body` under a correct header and checksum: it reaches the meta
/// and state decoders, where a random file stops at the checksum.
fn snapshot_file_with_body(body: &[u8]) -> Vec<u8> {
    let valid = valid_snapshot_file();
    let mut file = valid[..9].to_vec();
    file.extend_from_slice(&crc32fast::hash(body).to_le_bytes());
    file.extend_from_slice(body);
    file
}

#[test]
fn the_valid_encodings_decode() {
    for bytes in valid_records().iter().take(3) {
        decode::<Entry<TypeConfig>>(bytes).unwrap();
    }
    let [vote, append, heartbeat, snapshot] = &valid_rpc_bodies()[..] else { unreachable!() };
    postcard::from_bytes::<VoteRequest<NodeId>>(vote).unwrap();
    postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(append).unwrap();
    postcard::from_bytes::<AppendEntriesRequest<TypeConfig>>(heartbeat).unwrap();
    postcard::from_bytes::<InstallSnapshotRequest<TypeConfig>>(snapshot).unwrap();
    assert_eq!(State::decode_snapshot(&state().encode_snapshot()).unwrap(), state());
    assert!(state().session_count() == 2, "the test state has sessions");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("snapshot.bin"), valid_snapshot_file()).unwrap();
    let (meta, bytes) = SnapshotStore::open(dir.path()).unwrap().load().unwrap().unwrap();
    assert_eq!(meta, snapshot_meta());
    assert_eq!(State::decode_snapshot(&bytes).unwrap(), state());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_log_records_never_panic(bytes in prop_oneof![
        random_bytes(),
        versioned_random_bytes(LOG_FORMAT_VERSION),
    ]) {
        decode_as_every_record(&bytes);
    }

    #[test]
    fn damaged_log_records_never_panic(bytes in mutated(valid_records())) {
        decode_as_every_record(&bytes);
    }

    #[test]
    fn random_snapshots_never_panic(bytes in prop_oneof![
        random_bytes(),
        versioned_random_bytes(permit_core::SNAPSHOT_FORMAT_VERSION),
        // The previous format, which every build still reads.
        versioned_random_bytes(2),
    ]) {
        let _ = State::decode_snapshot(&bytes);
    }

    #[test]
    fn damaged_snapshots_are_refused_or_consistent(
        bytes in mutated(vec![state().encode_snapshot(), State::default().encode_snapshot()]),
    ) {
        // A damaged snapshot that still decodes passed `State::verify`: it is consistent.
        let _ = State::decode_snapshot(&bytes);
    }

    #[test]
    fn random_or_damaged_snapshot_files_never_panic(
        bytes in prop_oneof![random_bytes(), mutated(vec![valid_snapshot_file()])],
    ) {
        load_snapshot_file(&bytes);
    }

    #[test]
    fn snapshot_files_with_a_valid_checksum_over_damaged_bodies_never_panic(
        body in prop_oneof![random_bytes(), mutated(vec![valid_snapshot_file()[13..].to_vec()])],
    ) {
        load_snapshot_file(&snapshot_file_with_body(&body));
    }

    #[test]
    fn random_peer_rpc_bodies_never_panic(bytes in random_bytes()) {
        decode_as_every_rpc(&bytes);
    }

    #[test]
    fn damaged_peer_rpc_bodies_never_panic(bytes in mutated(valid_rpc_bodies())) {
        decode_as_every_rpc(&bytes);
    }
}
