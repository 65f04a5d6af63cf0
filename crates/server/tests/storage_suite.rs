//! openraft's own storage test suite, run against the segment log with Permit's state machine;
//! and the segment log's recovery from a torn or corrupt tail.

use std::sync::Arc;

use openraft::storage::{RaftLogReader, RaftLogStorage};
use openraft::testing::{log_id, StoreBuilder, Suite};
use openraft::{Entry, EntryPayload, StorageError};
use permit_server::notify::Notifier;
use permit_server::raft::log::{LogError, SegmentLog};
use permit_server::raft::replica::Replica;
use permit_server::raft::snapshot_store::SnapshotStore;
use permit_server::raft::state_machine::StateMachine;
use permit_server::raft::TypeConfig;
use tokio::sync::Notify;

fn state_machine(dir: &std::path::Path) -> StateMachine {
    state_machine_of(dir, Arc::default())
}

/// A state machine applying to `replica`.
fn state_machine_of(dir: &std::path::Path, replica: Arc<Replica>) -> StateMachine {
    let snapshots = SnapshotStore::open(&dir.join("snapshots")).expect("snapshot dir");
    StateMachine::new(
        replica,
        Notifier::new(),
        Arc::new(permit_server::observe::Observer::new(Arc::default(), 1000)),
        snapshots,
        Arc::new(Notify::new()),
        // The suite applies entries that no log store holds.
        permit_server::raft::log::LogSync::all_durable(),
        Arc::default(),
    )
}

struct SegmentBuilder;

impl StoreBuilder<TypeConfig, SegmentLog, StateMachine, tempfile::TempDir> for SegmentBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, SegmentLog, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = SegmentLog::open(&dir.path().join("raft-log")).expect("open log");
        let machine = state_machine(dir.path());
        Ok((dir, log, machine))
    }
}

#[test]
fn segment_log_store_and_state_machine_pass_openraft_suite() {
    Suite::test_all(SegmentBuilder).expect("openraft storage suite");
}

fn blank(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry { log_id: log_id(term, 1, index), payload: EntryPayload::Blank }
}

/// Appends durably (openraft's `LogFlushed` callback cannot be built outside openraft; the
/// trait's `append` calls the same method).
async fn append(log: &mut SegmentLog, entries: Vec<Entry<TypeConfig>>) {
    log.append_entries(entries).expect("append");
}

async fn indexes(log: &mut SegmentLog) -> Vec<u64> {
    log.try_get_log_entries(0..u64::MAX).await.expect("read").iter().map(|e| e.log_id.index).collect()
}

fn only_segment(dir: &std::path::Path) -> std::path::PathBuf {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    segments.pop().expect("one")
}

/// An empty segment log in a new temp dir: the dir (kept alive by the caller), the log's path,
/// and the log.
fn fresh_segment_log() -> (tempfile::TempDir, std::path::PathBuf, SegmentLog) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("raft-log");
    let log = SegmentLog::open(&path).expect("open");
    (dir, path, log)
}

/// Writes `entry`'s record into segment `file` after its last record, as the store would
/// (`len: u32 LE | crc32(payload): u32 LE | payload`, the payload a kind byte, 1 for an entry,
/// then the encoded entry).
fn write_record_after_the_last(file: &std::path::Path, entry: &Entry<TypeConfig>) {
    write_body_after_the_last(file, &permit_server::raft::log::codec::encode(entry));
}

/// Writes a record of an encoded entry `body` into segment `file` after its last record.
fn write_body_after_the_last(file: &std::path::Path, body: &[u8]) {
    use std::os::unix::fs::FileExt;
    let data = std::fs::read(file).expect("read segment");
    let mut at = 0;
    while at + 8 <= data.len() {
        let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
        if len == 0 {
            break;
        }
        at += 8 + len;
    }
    let mut payload = vec![1];
    payload.extend(body);
    let mut record = (payload.len() as u32).to_le_bytes().to_vec();
    record.extend(crc32fast::hash(&payload).to_le_bytes());
    record.extend(payload);
    let segment = std::fs::OpenOptions::new().write(true).open(file).expect("open segment");
    segment.write_all_at(&record, at as u64).expect("write record");
}

/// The byte offset just past the last non-zero byte of `file` (the written records).
fn written_len(file: &std::path::Path) -> usize {
    let data = std::fs::read(file).expect("read segment");
    data.iter().rposition(|b| *b != 0).map_or(0, |p| p + 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_log_truncates_a_torn_tail_and_refuses_corruption_before_it() {
    let (_dir, path, mut log) = fresh_segment_log();
    append(&mut log, (1..=3).map(|i| blank(1, i)).collect()).await;
    let after_three = written_len(&only_segment(&path));
    append(&mut log, vec![blank(1, 4), blank(1, 5)]).await;
    let after_five = written_len(&only_segment(&path));
    drop(log);

    // A torn tail: the last batch's second record cut in half (its fdatasync never returned).
    let segment = only_segment(&path);
    let mut data = std::fs::read(&segment).expect("read");
    let cut = after_three + (after_five - after_three) * 3 / 4;
    data[cut..after_five].fill(0);
    std::fs::write(&segment, &data).expect("write");
    let mut log = SegmentLog::open(&path).expect("a torn tail is truncated, not refused");
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4]);
    assert_eq!(log.get_log_state().await.expect("state").last_log_id.map(|l| l.index), Some(4));
    // The log goes on after the truncated tail, and the new record survives a reopen.
    append(&mut log, vec![blank(2, 5)]).await;
    drop(log);
    let mut log = SegmentLog::open(&path).expect("reopen");
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4, 5]);
    let last = log.get_log_state().await.expect("state").last_log_id.expect("last");
    assert_eq!((last.leader_id.term, last.index), (2, 5));
    drop(log);

    // A flipped bit in the last record: its CRC fails, it is dropped as a torn tail.
    let mut data = std::fs::read(&segment).expect("read");
    let end = written_len(&segment);
    data[end - 1] ^= 0x40;
    std::fs::write(&segment, &data).expect("write");
    let mut log = SegmentLog::open(&path).expect("open");
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3, 4]);
    drop(log);

    // A corrupt record in a segment that is not the last: refused, never a shorter log.
    let later = path.join(format!("{:016x}.seg", u64::MAX - 1));
    std::fs::write(&later, []).expect("an empty later segment");
    let mut data = std::fs::read(&segment).expect("read");
    data[after_three / 2] ^= 0x01;
    std::fs::write(&segment, &data).expect("write");
    let refused = SegmentLog::open(&path).err().expect("corruption before the tail is refused");
    assert!(refused.to_string().contains("corrupt"), "{refused}");
    assert!(
        matches!(LogError::of(&refused), LogError::Corrupt { path, .. } if path == segment),
        "typed, naming the file: {refused:?}"
    );
}

/// A record written whole (its checksum matches) that does not decode, as an entry of a newer
/// build's command reads to an older one, is refused, never dropped as a torn tail: it may be
/// committed, and so may every entry after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_log_refuses_a_whole_entry_it_cannot_decode() {
    let (_dir, path, mut log) = fresh_segment_log();
    append(&mut log, (1..=3).map(|i| blank(1, i)).collect()).await;
    drop(log);
    let segment = only_segment(&path);
    let batch = permit_core::Batch { now_ms: 0, commands: vec![permit_core::Command::ExpireHolds] };
    let entry: Entry<TypeConfig> = Entry { log_id: log_id(1, 1, 4), payload: EntryPayload::Normal(batch) };
    let mut body = permit_server::raft::log::codec::encode(&entry);
    // `ExpireHolds` carries nothing: the last byte is its variant, now one no build has yet.
    *body.last_mut().expect("encoded") = 0x7f;
    write_body_after_the_last(&segment, &body);
    let written = written_len(&segment);
    let refused = SegmentLog::open(&path).err().expect("an entry that does not decode is refused");
    assert!(matches!(LogError::of(&refused), LogError::Corrupt { .. }), "{refused:?}");
    let message = refused.to_string();
    assert!(message.contains("entry 4") && message.contains("a newer build wrote it"), "{message}");
    assert_eq!(written_len(&segment), written, "nothing was truncated");

    // After a raise of the cluster's version above this build's, the refusal names the
    // version to run.
    let (_dir, path, mut log) = fresh_segment_log();
    append(&mut log, (1..=3).map(|i| blank(1, i)).collect()).await;
    drop(log);
    let segment = only_segment(&path);
    let newer = permit_core::FEATURE_VERSION + 1;
    let raise = permit_core::Batch {
        now_ms: 0,
        commands: vec![permit_core::Command::SetClusterVersion { version: newer }],
    };
    let raised: Entry<TypeConfig> = Entry { log_id: log_id(1, 1, 4), payload: EntryPayload::Normal(raise) };
    write_record_after_the_last(&segment, &raised);
    let batch = permit_core::Batch { now_ms: 0, commands: vec![permit_core::Command::ExpireHolds] };
    let entry: Entry<TypeConfig> = Entry { log_id: log_id(1, 1, 5), payload: EntryPayload::Normal(batch) };
    let mut body = permit_server::raft::log::codec::encode(&entry);
    *body.last_mut().expect("encoded") = 0x7f;
    write_body_after_the_last(&segment, &body);
    let message = SegmentLog::open(&path).err().expect("refused").to_string();
    assert!(message.contains(&format!("a build that speaks version {newer} or newer")), "{message}");
}

/// A second opener of the same log (another server on the data dir) is refused, typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_log_refuses_a_second_opener_as_locked() {
    let (_dir, path, log) = fresh_segment_log();
    let refused = SegmentLog::open(&path).err().expect("locked");
    assert!(
        matches!(LogError::of(&refused), LogError::Locked { path: lock } if lock == path.join("lock")),
        "{refused:?}"
    );
    assert_eq!(refused.to_string(), "it is locked (is another server using this data dir?)");
    drop(log);
    SegmentLog::open(&path).expect("free once the first one is closed");
}

/// A power cut can lose a batch's first sector while a later one reached the disk: the torn
/// record reads as zeros, with the batch's later records still valid after it. They were never
/// acknowledged and must go with it; were they kept on disk, a new entry written over the zeros
/// with the same length would put them back in sequence, and an entry of an old term would
/// come back after one of a newer term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_log_drops_records_after_a_zeroed_one() {
    let (_dir, path, mut log) = fresh_segment_log();
    append(&mut log, (1..=2).map(|i| blank(1, i)).collect()).await;
    let after_two = written_len(&only_segment(&path));
    append(&mut log, (3..=5).map(|i| blank(1, i)).collect()).await;
    let after_five = written_len(&only_segment(&path));
    drop(log);

    // Entry 3's record lost (zeros); entries 4 and 5 intact after it.
    let segment = only_segment(&path);
    let record = (after_five - after_two) / 3;
    let mut data = std::fs::read(&segment).expect("read");
    data[after_two..after_two + record].fill(0);
    std::fs::write(&segment, &data).expect("write");
    let mut log = SegmentLog::open(&path).expect("a torn tail is truncated, not refused");
    assert_eq!(indexes(&mut log).await, vec![1, 2]);
    assert_eq!(written_len(&segment), after_two, "the records after the zeroed one are zeroed too");

    // A new leader's entry 3, as long as the old one: the old 4 and 5 must not follow it.
    append(&mut log, vec![blank(2, 3)]).await;
    drop(log);
    let mut log = SegmentLog::open(&path).expect("reopen");
    assert_eq!(indexes(&mut log).await, vec![1, 2, 3]);
    let last = log.get_log_state().await.expect("state").last_log_id.expect("last");
    assert_eq!((last.leader_id.term, last.index), (2, 3));
}

/// A follower that installs a snapshot beyond its log's end purges up to the snapshot and goes
/// on appending after it, in the same segment: the jump in indexes is the purge's, not
/// corruption, and the log must reopen (the simulation found a node that could not restart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_log_reopens_after_a_purge_beyond_its_end() {
    let (_dir, path, mut log) = fresh_segment_log();
    append(&mut log, (1..=3).map(|i| blank(1, i)).collect()).await;
    log.purge(log_id(2, 1, 10)).await.expect("purge beyond the end");
    append(&mut log, (11..=12).map(|i| blank(2, i)).collect()).await;
    // A second snapshot beyond the end again: two jumps in one segment.
    log.purge(log_id(3, 1, 20)).await.expect("purge beyond the end");
    append(&mut log, vec![blank(3, 21)]).await;
    drop(log);
    let mut log = SegmentLog::open(&path).expect("a purge's jump is not corruption");
    assert_eq!(indexes(&mut log).await, vec![21]);
    let state = log.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id.map(|l| l.index), Some(20));
    assert_eq!(state.last_log_id.map(|l| l.index), Some(21));
    drop(log);

    // A jump that no purge covers is still corruption. The store asserts that appends are in
    // order, so the out-of-order record is written into the segment directly.
    write_record_after_the_last(&only_segment(&path), &blank(3, 30));
    let refused = SegmentLog::open(&path).err().expect("a jump past the purge is refused");
    assert!(refused.to_string().contains("corrupt"), "{refused}");
}

/// Pages of `path` in the page cache that are not yet on the disk (dirty or under writeback),
/// from `cachestat(2)` (Linux 6.5 and later).
fn unsynced_pages(path: &std::path::Path) -> u64 {
    use std::os::unix::io::AsRawFd;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct CacheStat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The same number on every Linux architecture (the unified syscall table).
    const SYS_CACHESTAT: libc::c_long = 451;
    let file = std::fs::File::open(path).expect("open for cachestat");
    // `len: 0` is to the end of the file.
    let range = Range { off: 0, len: 0 };
    let mut stat = CacheStat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live and of the kernel's layout.
    let result = unsafe {
        libc::syscall(SYS_CACHESTAT, file.as_raw_fd(), &range as *const Range, &mut stat as *mut CacheStat, 0)
    };
    assert_eq!(result, 0, "cachestat({}): {}", path.display(), std::io::Error::last_os_error());
    stat.nr_dirty + stat.nr_writeback
}

/// Leaves `path`'s first `len` bytes as a crash during an fdatasync can: written (the same
/// bytes again) but not yet on the disk. A restarted process reads them from the page cache.
fn rewrite_unsynced(path: &std::path::Path, len: usize) {
    use std::os::unix::fs::FileExt;
    let data = std::fs::read(path).expect("read");
    let file = std::fs::OpenOptions::new().write(true).open(path).expect("open for write");
    file.write_all_at(&data[..len], 0).expect("rewrite");
    assert!(unsynced_pages(path) > 0, "the rewrite left no dirty page in {}", path.display());
}

/// A process that crashed while its fdatasync ran leaves records in the page cache that are not
/// on the disk; the restarted node reads them and would report them as part of its log (a leader
/// counts them towards a quorum) though a power cut can still take them. So the open syncs them
/// before the log is used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_log_makes_what_it_reads_at_open_durable() {
    let (_dir, path, mut log) = fresh_segment_log();
    append(&mut log, (1..=20).map(|i| blank(1, i)).collect()).await;
    drop(log);
    let segment = only_segment(&path);
    rewrite_unsynced(&segment, written_len(&segment));
    let mut log = SegmentLog::open(&path).expect("reopen");
    assert_eq!(unsynced_pages(&segment), 0, "the open left records it read unsynced");
    assert_eq!(indexes(&mut log).await, (1..=20).collect::<Vec<_>>());
}

/// Every durable write of the segment log returns with its file on the disk: an append, a
/// truncation and a vote save leave no page of theirs dirty (checked with `cachestat(2)`). A
/// kill -9 keeps the page cache, so only this shows a missing fdatasync; the simulation's power
/// cuts follow the flush callbacks, not the page cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segment_log_writes_return_with_their_files_synced() {
    let (_dir, path, mut log) = fresh_segment_log();
    append(&mut log, (1..=50).map(|i| blank(1, i)).collect()).await;
    let segment = only_segment(&path);
    assert_eq!(unsynced_pages(&segment), 0, "an append returned before its fdatasync");
    log.truncate(log_id(1, 1, 30)).await.expect("truncate");
    assert_eq!(unsynced_pages(&segment), 0, "a truncation returned before its fdatasync");
    assert_eq!(indexes(&mut log).await, (1..30).collect::<Vec<_>>());
    log.save_vote(&openraft::Vote::new(2, 1)).await.expect("save vote");
    assert_eq!(unsynced_pages(&path.join("meta")), 0, "a vote save returned before its fdatasync");
    log.purge(log_id(1, 1, 10)).await.expect("purge");
    assert_eq!(unsynced_pages(&path.join("meta")), 0, "a purge returned before its fdatasync");
}

/// A snapshot save returns with its file's pages written (its chunked writeback waits for
/// them). The page cache cannot show the `sync_all` that follows (the inode and the device's
/// cache).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_save_returns_with_its_pages_written() {
    let dir = tempfile::tempdir().expect("temp dir");
    let snapshots = SnapshotStore::open(&dir.path().join("snapshots")).expect("snapshot dir");
    let meta =
        permit_server::raft::snapshot_store::Meta { snapshot_id: "1-1-9".into(), ..Default::default() };
    let state: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    snapshots.save(&meta, &state).expect("save snapshot");
    let file = dir.path().join("snapshots").join("snapshot.bin");
    assert_eq!(unsynced_pages(&file), 0, "a snapshot save returned with pages not yet written");
}

/// The payload of a pushed item that the log holds in memory, after an append and after a
/// reopen (decoded from the segment), is the allocation the applied item holds: a pending item's
/// payload is in memory once, not once in the log and once in the state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_item_shares_its_payload_with_the_log_entry() {
    use openraft::storage::RaftStateMachine;
    use permit_core::{Batch, Command, Name, NewItem, FEATURE_VERSION};

    let payloads = |entries: &[Entry<TypeConfig>]| -> Vec<permit_core::Payload> {
        entries
            .iter()
            .flat_map(|entry| match &entry.payload {
                EntryPayload::Normal(batch) => batch.commands.clone(),
                _ => Vec::new(),
            })
            .flat_map(|command| match command {
                Command::Push { items, .. } => items.into_iter().map(|item| item.payload).collect(),
                _ => Vec::new(),
            })
            .collect()
    };
    let (dir, path, mut log) = fresh_segment_log();
    let queue = Name::new("jobs").expect("name");
    let push = |n: u64| Command::Push {
        queue: queue.clone(),
        items: vec![NewItem { payload: format!("{{\"n\":{n}}}").into(), delay_ms: 0, key: None }],
        creator: None,
    };
    let first =
        Batch { now_ms: 1, commands: vec![Command::SetClusterVersion { version: FEATURE_VERSION }, push(1)] };
    append(&mut log, vec![Entry { log_id: log_id(1, 1, 1), payload: EntryPayload::Normal(first) }]).await;
    drop(log);
    let mut log = SegmentLog::open(&path).expect("reopen");
    let second = Batch { now_ms: 2, commands: vec![push(2)] };
    append(&mut log, vec![Entry { log_id: log_id(1, 1, 2), payload: EntryPayload::Normal(second) }]).await;

    let replica = Arc::new(Replica::default());
    let mut machine = state_machine_of(dir.path(), replica.clone());
    // As openraft applies: what the log reader returns.
    machine.apply(log.try_get_log_entries(1..=2).await.expect("read")).await.expect("apply");
    let kept = payloads(&log.try_get_log_entries(1..=2).await.expect("read"));
    assert_eq!(kept.len(), 2);
    let read = replica.read();
    let items: Vec<_> =
        read.state.queue(&queue).expect("queue").items().map(|(_, item)| item.payload.clone()).collect();
    assert_eq!(items.len(), 2);
    for (item, entry) in items.iter().zip(&kept) {
        assert_eq!(item, entry);
        assert!(item.shares(entry), "the state holds a copy of {entry}");
    }
}
