//! The Raft log as an append-only log of segment files, the only log store.
//!
//! Layout of `DATA_DIR/raft-log/`:
//! - `SEQ.seg` (16 hex digits, increasing): records appended in order, up to [`SEGMENT_BYTES`]
//!   each. A segment is preallocated (`fallocate`) [`PREALLOCATE_BYTES`] at a time ahead of its
//!   writes, and the directory fsynced when it is created, so an append mostly writes data
//!   blocks of a file whose size does not change: one `fdatasync` per batch of entries, after
//!   which openraft is told the batch is durable.
//! - `meta`: the vote and the last purged log id, replaced atomically (written to `meta.tmp`,
//!   fdatasynced, renamed, directory fsynced) when either changes; both are rare.
//!
//! A record is `len: u32 LE | crc32(payload): u32 LE | payload`; the payload is a kind byte
//! (entry or commit index) then [`super::log_codec::encode`]d data (format version first). The
//! commit index is a record too, written without an fsync of its own: it becomes durable with
//! the next append (it is a restart hint; losing it loses nothing).
//!
//! Opening reads every segment in order and checks each record's length, CRC, decoding and
//! index: one more than the previous entry's, or at most one past the last purged index when
//! the previous one is purged (a follower that installs a snapshot beyond its log's end purges
//! up to it and appends after it). Space after the last record is zeros (new segments are
//! preallocated, and truncation zeroes what it removes), so zeros followed by written bytes are
//! a bad record too. In the last segment, the first bad record is a torn tail (a batch whose
//! fdatasync never returned, so never acknowledged, of which the disk may have kept any
//! sectors): it and everything after it are zeroed and synced before the log is used. A bad
//! record in an earlier segment, or an index out of sequence, is corruption of acknowledged data:
//! the store refuses to open rather than start with a shorter log. Then the last segment is
//! fdatasynced and the directory fsynced: what the open read may have come from the page cache
//! of a process that crashed during its fsync, and must be on the disk before it is used.
//!
//! The entries after the last purge are also kept in memory (the log between snapshots, at most
//! `--snapshot-logs` entries plus openraft's margin), so reads never touch the disk. Purge drops
//! whole segments whose entries are all purged. Truncation (of uncommitted entries, after a
//! leader change) zeroes the removed records and deletes later segments, with an fsync.

// openraft's StorageError is large; it is the error type openraft's traits require.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, LeaderId, OptionalSend, StorageIOError, Vote};
use serde::{Deserialize, Serialize};
use tokio::runtime::RuntimeFlavor;

use super::log_codec::{decode, encode, LOG_FORMAT_VERSION};
use super::log_sync::{LogSync, SYNC_STALL};
use super::storage_faults::StorageFaults;
use super::{LogId, NodeId, StorageError, TypeConfig};
use crate::failstop::FailStop;

/// Size of a segment; a batch that does not fit starts a new segment.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// A segment is preallocated this much at a time, ahead of its writes (so that a small disk
/// is not taken by empty preallocated space, and a full disk fails an append, not a start).
pub const PREALLOCATE_BYTES: u64 = 1024 * 1024;

const HEADER: usize = 8;
/// The file that names the term in which this node, as leader, reported appends before their
/// fsync (see `Inner::step_down_if_it_reported_early`).
const EARLY: &str = "early";
const KIND_ENTRY: u8 = 1;
const KIND_COMMITTED: u8 = 2;
/// Largest record accepted on open (a length above it is a torn or corrupt header).
const RECORD_MAX: usize = 256 * 1024 * 1024;

/// The log store over segment files. Cloning shares it (clones serve as log readers).
#[derive(Clone)]
pub struct SegmentLog {
    inner: Arc<Mutex<Inner>>,
    dir: PathBuf,
    append_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
    /// Told about the first failed write; after it, every write is refused (never retried).
    fail_stop: Option<Arc<FailStop>>,
    /// Faults a simulation injects (never set by `permit serve`).
    faults: Option<Arc<StorageFaults>>,
    /// Where the durable writes run.
    io: Arc<super::LogIo>,
    /// Held around every write (and so every fdatasync) of the log and the recording of its
    /// outcome, taken before `inner`. A leader's sync runs on a blocking thread beside the core
    /// task's writes (a next write waits here for it); after a failed fdatasync the kernel may
    /// report a later one successful although the pages the first one lost are gone, so no
    /// fdatasync may start until the outcome of the one before it is recorded (a failure
    /// latches the store and nothing is marked durable again).
    gate: Arc<Mutex<()>>,
}

#[derive(Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote<NodeId>>,
    last_purged: Option<LogId>,
}

struct Segment {
    seq: u64,
    /// Shared so that an append can fdatasync without holding the store's lock (readers and
    /// the next batch's write go on meanwhile).
    file: Arc<File>,
    /// Bytes of records written (the rest is zeros).
    len: u64,
    /// Bytes preallocated (the file's size).
    allocated: u64,
    /// Index of the last entry in it, if any.
    last_index: Option<u64>,
}

struct Inner {
    dir: PathBuf,
    meta: Meta,
    committed: Option<LogId>,
    /// Entries after the last purge, with the segment (seq) and offset of their record.
    entries: BTreeMap<u64, (Entry<TypeConfig>, u64, u64)>,
    /// Oldest first; the last one is written to.
    segments: Vec<Segment>,
    /// Set after a failed write: nothing is written again.
    failed: bool,
    /// The last entry known durable (an fdatasync ended after it was written); published to
    /// `sync`. Behind the last entry only after a leader's append reported before its fsync.
    durable: Option<LogId>,
    /// A leader's appends not yet durable, oldest first: the last index of each, and when it
    /// was written.
    unsynced: std::collections::VecDeque<(u64, std::time::Instant)>,
    /// Where `durable` is published (`log_sync`).
    sync: Arc<LogSync>,
    /// The term in which this node last reported appends before their fsync (`early`).
    early_term: Option<u64>,
    /// The simulation's faults (as `SegmentLog::faults`): told what becomes durable.
    faults: Option<Arc<StorageFaults>>,
    /// `raft-log/lock`, held with an exclusive `flock` while the store is open: a second server
    /// on the same data dir is refused.
    _lock: File,
}

fn io_storage_error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: &io::Error) -> StorageError {
    StorageError::IO { source: StorageIOError::new(subject, verb, AnyError::error(e.to_string())) }
}

fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.seg"))
}

/// `fdatasync(2)` (what `sync_data` is on Linux).
fn fdatasync(file: &File) -> io::Result<()> {
    file.sync_data()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `dir/name` with `bytes` atomically and durably: written to `name.tmp`, fdatasynced,
/// renamed over it, and the directory fsynced.
fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
    file.write_all_at(bytes, 0)?;
    fdatasync(&file)?;
    std::fs::rename(&tmp, dir.join(name))?;
    sync_dir(dir)
}

/// Makes `file` at least `bytes` long, allocated (not sparse): the write that follows then
/// changes no size, and a full disk fails here.
fn preallocate(file: &File, bytes: u64) -> io::Result<()> {
    // SAFETY: fallocate on a descriptor owned by `file`; mode 0 allocates and extends the size.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if result == 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
        // A file system without fallocate: a sparse file of the same size.
        return file.set_len(bytes);
    }
    Err(error)
}

/// The index of an encoded entry, read from its leading log id without decoding the rest.
fn peek_index(body: &[u8]) -> Result<u64, io::Error> {
    match body.split_first() {
        Some((&LOG_FORMAT_VERSION, rest)) => {
            postcard::take_from_bytes::<LogId>(rest).map(|(log_id, _)| log_id.index).map_err(super::io_error)
        }
        Some((version, _)) => Err(io::Error::other(format!("log format version {version} unsupported"))),
        None => Err(io::Error::other("empty log record")),
    }
}

fn record(kind: u8, body: &[u8], out: &mut Vec<u8>) {
    let len = (body.len() + 1) as u32;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind]);
    hasher.update(body);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
}

/// One record read back: its kind and body, or where and why reading stopped.
enum Parsed<'a> {
    Record {
        kind: u8,
        body: &'a [u8],
        next: usize,
    },
    /// Zeros: the end of the written part.
    End,
    Bad(String),
}

fn parse(data: &[u8], at: usize) -> Parsed<'_> {
    if at + HEADER > data.len() {
        return if data[at..].iter().all(|b| *b == 0) {
            Parsed::End
        } else {
            Parsed::Bad("torn header".into())
        };
    }
    let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
    if len == 0 && crc == 0 {
        // Zeros end the records only if nothing was written after them: a batch whose first
        // sector never reached the disk, while a later one did, leaves valid records behind a
        // zeroed one. They were never acknowledged; kept, an entry later written over the zeros
        // with the same length would put them back in the log.
        return if data[at..].iter().all(|b| *b == 0) {
            Parsed::End
        } else {
            Parsed::Bad(format!("zeros at offset {at} with records written after them"))
        };
    }
    if len == 0 || len > RECORD_MAX || at + HEADER + len > data.len() {
        return Parsed::Bad(format!("record length {len} at offset {at} runs past the data"));
    }
    let payload = &data[at + HEADER..at + HEADER + len];
    if crc32fast::hash(payload) != crc {
        return Parsed::Bad(format!("CRC mismatch at offset {at}"));
    }
    Parsed::Record { kind: payload[0], body: &payload[1..], next: at + HEADER + len }
}

impl Inner {
    fn open(dir: &Path) -> io::Result<Inner> {
        std::fs::create_dir_all(dir)?;
        let lock =
            OpenOptions::new().read(true).write(true).create(true).truncate(false).open(dir.join("lock"))?;
        // SAFETY: flock on a descriptor owned by `lock`.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                io::Error::other("it is locked (is another server using this data dir?)")
            } else {
                error
            });
        }
        let meta = match std::fs::read(dir.join("meta")) {
            Ok(bytes) => decode::<Meta>(&bytes)
                .map_err(|e| io::Error::other(format!("{}: {e}", dir.join("meta").display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let mut seqs = Vec::new();
        for item in std::fs::read_dir(dir)? {
            let name = item?.file_name();
            let name = name.to_string_lossy();
            if let Some(seq) = name.strip_suffix(".seg").and_then(|s| u64::from_str_radix(s, 16).ok()) {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        let purged = meta.last_purged.map(|id| id.index);
        let mut inner = Inner {
            dir: dir.to_owned(),
            meta,
            committed: None,
            entries: BTreeMap::new(),
            segments: vec![],
            failed: false,
            durable: None,
            unsynced: std::collections::VecDeque::new(),
            sync: LogSync::new(0),
            early_term: None,
            faults: None,
            _lock: lock,
        };
        let mut previous: Option<u64> = None;
        for (n, &seq) in seqs.iter().enumerate() {
            let path = segment_path(dir, seq);
            let mut file = OpenOptions::new().read(true).write(true).open(&path)?;
            let mut data = Vec::new();
            file.read_to_end(&mut data)?;
            let last_segment = n + 1 == seqs.len();
            let mut at = 0;
            let mut last_index = None;
            let bad = loop {
                match parse(&data, at) {
                    Parsed::End => break None,
                    Parsed::Bad(why) => break Some(why),
                    Parsed::Record { kind, body, next } => {
                        match kind {
                            KIND_ENTRY => {
                                // The log id leads the encoding: purged entries (most of a
                                // segment that awaits deletion) are not decoded in full.
                                let index = match peek_index(body) {
                                    Ok(index) => index,
                                    Err(e) => break Some(format!("undecodable entry at offset {at}: {e}")),
                                };
                                // Each entry follows the previous one, except across a
                                // purge: a follower that installs a snapshot beyond its log's
                                // end purges up to it and appends after it in this segment.
                                let follows = |p: u64| {
                                    index == p + 1
                                        || (index > p && purged.is_some_and(|q| p <= q && index <= q + 1))
                                };
                                if previous.is_some_and(|p| !follows(p)) {
                                    return Err(io::Error::other(format!(
                                        "{}: entry {index} follows entry {} (corrupt log)",
                                        path.display(),
                                        previous.unwrap_or_default()
                                    )));
                                }
                                previous = Some(index);
                                last_index = Some(index);
                                if purged.is_none_or(|p| index > p) {
                                    let entry = match decode::<Entry<TypeConfig>>(body) {
                                        Ok(entry) if entry.log_id.index == index => entry,
                                        Ok(_) => break Some(format!("inconsistent entry at offset {at}")),
                                        Err(e) => {
                                            break Some(format!("undecodable entry at offset {at}: {e}"))
                                        }
                                    };
                                    inner.entries.insert(index, (entry, seq, at as u64));
                                }
                            }
                            KIND_COMMITTED => match decode::<Option<LogId>>(body) {
                                Ok(committed) => inner.committed = committed,
                                Err(e) => {
                                    break Some(format!("undecodable commit index at offset {at}: {e}"))
                                }
                            },
                            other => break Some(format!("unknown record kind {other} at offset {at}")),
                        }
                        at = next;
                    }
                }
            };
            if let Some(why) = bad {
                if !last_segment {
                    return Err(io::Error::other(format!(
                        "{}: {why}, and later segments follow (corrupt log, not a torn tail)",
                        path.display()
                    )));
                }
                // A torn tail: zero from the bad record to the last non-zero byte, then sync.
                let end = data.iter().rposition(|b| *b != 0).map_or(at, |p| p + 1);
                tracing::warn!(path = %path.display(), offset = at, bytes = end - at, "{why}: truncating a torn tail");
                file.write_all_at(&vec![0; end.saturating_sub(at)], at as u64)?;
                fdatasync(&file)?;
            }
            let allocated = data.len() as u64;
            inner.segments.push(Segment { seq, file: Arc::new(file), len: at as u64, allocated, last_index });
        }
        // A commit index beyond the log (its entries torn away) is not kept.
        let last = inner.entries.keys().next_back().copied().or(purged);
        if inner.committed.is_some_and(|c| last.is_none_or(|l| c.index > l)) {
            inner.committed = None;
        }
        inner.sync_what_was_read()?;
        inner.durable = inner.last_log_id();
        inner.step_down_if_it_reported_early()?;
        Ok(inner)
    }

    /// Makes what the open read durable before the log is used. A process that crashed while
    /// an append's fdatasync ran (or between `meta`'s rename and the directory's fsync) leaves
    /// data in the page cache that is not on the disk, and the open reads it from there: the
    /// node would count those entries as its log (and a leader would count them towards a
    /// quorum) while a power cut could still take them. Only the last segment can hold such
    /// data: a segment is started after the appends before it were synced.
    fn sync_what_was_read(&self) -> io::Result<()> {
        if let Some(last) = self.segments.last() {
            fdatasync(&last.file)?;
        }
        super::sync_dir_and_its_entry(&self.dir)
    }

    fn last_log_id(&self) -> Option<LogId> {
        self.entries.values().next_back().map(|(e, _, _)| e.log_id).or(self.meta.last_purged)
    }

    /// A leader that reported appends before their fsync in its term may have sent its
    /// followers entries that a power cut then took from its own log. openraft 0.9 restores a
    /// node whose saved vote is its own committed one as leader of that term at once, and it
    /// would write new entries under log ids its followers already hold for others: two entries
    /// with one log id, which Raft's log matching cannot tell apart. So the open moves such a
    /// vote on to the next term, voted for itself but not committed (what a candidate saves
    /// before it campaigns): the node starts as a follower and a new term is elected, whose
    /// leader holds every entry a majority has. `early` names the leader id (term and node) under
    /// which this node reported early; only a vote committed to that same leader id is demoted
    /// (openraft's leader ids are (term, node): a node that led a term may follow another
    /// leader of the same term afterwards, whose committed vote it must keep).
    fn step_down_if_it_reported_early(&mut self) -> io::Result<()> {
        let (early, node) = match std::fs::read(self.dir.join(EARLY)) {
            Ok(bytes) => decode::<(u64, NodeId)>(&bytes)
                .map_err(|e| io::Error::other(format!("{}: {e}", self.dir.join(EARLY).display())))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        let led = LeaderId::new(early, node);
        if self.meta.vote.is_some_and(|vote| vote.is_committed() && *vote.leader_id() == led) {
            // Not back to an uncommitted vote of the same term (a vote never goes back): on to
            // the next term, voted for itself, as a candidate does before it campaigns.
            let own = Vote::new(early + 1, node);
            tracing::info!(
                term = early,
                "this node led its term with appends reported before their fsync: it starts as a follower"
            );
            self.meta.vote = Some(own);
            self.save_meta()?;
        }
        Ok(())
    }

    /// Records, before the first append of term `term` is reported before its fsync, that this
    /// node does so as its leader (see [`Inner::step_down_if_it_reported_early`]).
    fn note_early_term(&mut self, term: u64) -> io::Result<()> {
        if self.early_term == Some(term) {
            return Ok(());
        }
        replace_file(&self.dir, EARLY, &encode(&(term, self.sync.id())))?;
        self.early_term = Some(term);
        Ok(())
    }

    /// Records that everything written up to `upto` (an entry of the log) is durable.
    fn mark_durable(&mut self, upto: Option<LogId>) {
        let raises = upto.map(|id| id.index) > self.durable.map(|id| id.index);
        if raises && self.faults.as_ref().is_some_and(|faults| faults.is_stalled()) {
            // A simulated fsync that hangs never ends: nothing becomes durable meanwhile.
            return;
        }
        if let Some(upto) = upto {
            StorageFaults::report_synced(self.faults.as_deref(), upto.index);
        }
        self.durable = upto;
        let last = self.last_log_id().map(|id| id.index);
        let upto_index = upto.map(|id| id.index);
        self.unsynced.retain(|(index, _)| Some(*index) > upto_index && Some(*index) <= last);
        self.sync.set_durable(upto);
    }

    /// Syncs what was written and is not durable yet (a leader's appends reported before
    /// their fsync; only the last segment can hold them, see [`Inner::roll`]). Gate 4 of
    /// `log_sync`: every log write but a leader's append runs it first.
    fn sync_written(&mut self) -> io::Result<()> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        self.sync_last_segment()
    }

    /// Fdatasyncs the last segment, the only one that can hold records not yet durable, and
    /// records the whole log durable.
    fn sync_last_segment(&mut self) -> io::Result<()> {
        if let Some(last) = self.segments.last() {
            fdatasync(&last.file)?;
        }
        let upto = self.last_log_id();
        self.mark_durable(upto);
        Ok(())
    }

    /// Starts a new preallocated segment and makes its directory entry durable. The segment
    /// before it is synced first (it may end with a leader's appends reported before their
    /// fsync, or a commit index record), so that only the last segment ever holds records that
    /// are not durable: the open and `tear` rely on it.
    fn roll(&mut self) -> io::Result<()> {
        if !self.segments.is_empty() {
            self.sync_last_segment()?;
        }
        let seq = self.segments.last().map_or(0, |s| s.seq + 1);
        let path = segment_path(&self.dir, seq);
        let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path)?;
        preallocate(&file, PREALLOCATE_BYTES)?;
        fdatasync(&file)?;
        sync_dir(&self.dir)?;
        self.segments.push(Segment {
            seq,
            file: Arc::new(file),
            len: 0,
            allocated: PREALLOCATE_BYTES,
            last_index: None,
        });
        Ok(())
    }

    /// Appends `bytes` (whole records) to the active segment, rolling first when they do not
    /// fit; returns the segment's seq and the offset they start at.
    fn write(&mut self, bytes: &[u8], roll_if_full: bool) -> io::Result<(u64, u64)> {
        let full =
            self.segments.last().is_none_or(|s| s.len > 0 && s.len + bytes.len() as u64 > SEGMENT_BYTES);
        if self.segments.is_empty() || (roll_if_full && full) {
            self.roll()?;
        }
        let segment = self.segments.last_mut().expect("a segment");
        let end = segment.len + bytes.len() as u64;
        if end > segment.allocated {
            let allocated = end.div_ceil(PREALLOCATE_BYTES) * PREALLOCATE_BYTES;
            preallocate(&segment.file, allocated)?;
            segment.allocated = allocated;
        }
        segment.file.write_all_at(bytes, segment.len)?;
        let at = segment.len;
        segment.len += bytes.len() as u64;
        Ok((segment.seq, at))
    }

    /// Writes `entries` (not yet synced) and makes them readable; returns the file to
    /// fdatasync before they may be reported durable.
    fn append(&mut self, entries: Vec<Entry<TypeConfig>>) -> io::Result<Arc<File>> {
        let mut bytes = Vec::with_capacity(entries.len() * 128);
        let mut offsets = Vec::with_capacity(entries.len());
        for entry in &entries {
            offsets.push(bytes.len() as u64);
            record(KIND_ENTRY, &encode(entry), &mut bytes);
        }
        let (seq, at) = self.write(&bytes, true)?;
        let segment = self.segments.last_mut().expect("a segment");
        if let Some(last) = entries.last() {
            segment.last_index = Some(last.log_id.index);
        }
        let file = segment.file.clone();
        for (entry, offset) in entries.into_iter().zip(offsets) {
            self.entries.insert(entry.log_id.index, (entry, seq, at + offset));
        }
        Ok(file)
    }

    fn save_meta(&self) -> io::Result<()> {
        replace_file(&self.dir, "meta", &encode(&self.meta))
    }

    /// Appends a commit index record (no fsync of its own: durable with the next append).
    fn write_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let mut bytes = Vec::new();
        record(KIND_COMMITTED, &encode(&committed), &mut bytes);
        self.write(&bytes, false).map(|_| ())
    }

    /// Removes entries at and after `index`: zeroes their records and deletes later segments.
    fn truncate(&mut self, index: u64) -> io::Result<()> {
        self.sync_written()?;
        let Some((_, (_, seq, offset))) = self.entries.range(index..).next() else { return Ok(()) };
        let (seq, offset) = (*seq, *offset);
        let mut removed = false;
        while self.segments.last().is_some_and(|s| s.seq > seq) {
            let segment = self.segments.pop().expect("checked");
            std::fs::remove_file(segment_path(&self.dir, segment.seq))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        let segment = self.segments.last_mut().expect("the entry's segment");
        if segment.len > offset {
            segment.file.write_all_at(&vec![0; (segment.len - offset) as usize], offset)?;
            fdatasync(&segment.file)?;
            segment.len = offset;
        }
        self.entries.split_off(&index);
        segment.last_index = self.entries.keys().next_back().copied().filter(|_| segment.len > 0);
        if self.committed.is_some_and(|c| c.index >= index) {
            self.committed = self.entries.values().next_back().map(|(e, _, _)| e.log_id);
        }
        let upto = self.last_log_id();
        self.mark_durable(upto);
        Ok(())
    }

    /// Records `log_id` as purged (durably), forgets the entries up to it, and deletes every
    /// segment but the active one whose entries are all purged.
    fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        self.sync_written()?;
        self.meta.last_purged = Some(log_id);
        self.save_meta()?;
        self.entries = self.entries.split_off(&(log_id.index + 1));
        let keep_from = self.segments.len().saturating_sub(1);
        let mut deleted = 0;
        for segment in &self.segments[..keep_from] {
            if segment.last_index.is_some_and(|last| last > log_id.index) {
                break;
            }
            std::fs::remove_file(segment_path(&self.dir, segment.seq))?;
            deleted += 1;
        }
        self.segments.drain(..deleted);
        Ok(())
    }
}

/// Tears the log at entry `from` as a power cut can: some sectors of an unsynced write reach
/// the disk and others do not. Which ones depends on `from`: the whole record zeroed with the
/// records after it intact (its first sector lost), its second half zeroed with the records
/// after it intact, or everything from its middle on zeroed (a clean prefix). Later segments
/// are deleted (a segment is created only after the appends before it were durable). Returns
/// the index of the first entry torn (the first at or after `from` that the log holds), if any.
fn tear(inner: &Inner, from: u64) -> io::Result<Option<u64>> {
    let Some((&index, (_, seq, offset))) = inner.entries.range(from..).next() else { return Ok(None) };
    let (seq, at) = (*seq, *offset as usize);
    for segment in inner.segments.iter().filter(|s| s.seq > seq) {
        std::fs::remove_file(segment_path(&inner.dir, segment.seq))?;
    }
    let segment = inner.segments.iter().find(|s| s.seq == seq).expect("the entry's segment");
    let mut data = vec![0; segment.len as usize];
    segment.file.read_exact_at(&mut data, 0)?;
    let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
    let (record_end, middle) = (at + HEADER + len, at + HEADER + len / 2);
    let torn = match from % 3 {
        0 => at..record_end,
        1 => middle..record_end,
        _ => middle..data.len(),
    };
    // A range that is zeros already (the record's second half) would leave the record whole.
    let torn = if data[torn.clone()].iter().any(|b| *b != 0) { torn } else { at..record_end };
    data[torn].fill(0);
    segment.file.write_all_at(&data, 0)?;
    fdatasync(&segment.file)?;
    sync_dir(&inner.dir)?;
    Ok(Some(index))
}

impl SegmentLog {
    /// Opens (or creates) the segment log in `dir`, truncating a torn tail.
    ///
    /// # Errors
    /// When the directory cannot be read or written, or the log is corrupt before its tail.
    pub fn open(dir: &Path) -> io::Result<SegmentLog> {
        let inner = Inner::open(dir)?;
        Ok(SegmentLog {
            inner: Arc::new(Mutex::new(inner)),
            dir: dir.to_owned(),
            append_seconds: None,
            fail_stop: None,
            io: Arc::default(),
            gate: Arc::default(),
            faults: None,
        })
    }

    /// Injects `faults` (a simulation's). First, if a power cut left a torn tail, tears it on
    /// disk as a power cut can (see `tear`) and opens the log again, so that the recovery in
    /// [`SegmentLog::open`] is what drops it; the open must leave none of the torn entries.
    ///
    /// # Errors
    /// When the files cannot be torn or reopened, or the reopened log still holds the first
    /// torn entry.
    pub fn with_faults(mut self, faults: Arc<StorageFaults>) -> io::Result<SegmentLog> {
        if let Some(from) = faults.take_torn_from() {
            let torn = tear(&self.lock(), from)?;
            let (append_seconds, fail_stop) = (self.append_seconds.take(), self.fail_stop.take());
            let sync = self.lock().sync.clone();
            let dir = self.dir.clone();
            // The only handle: dropping it closes the files and lets go of the directory's lock.
            drop(self);
            self = SegmentLog::open(&dir)?.with_sync(sync);
            (self.append_seconds, self.fail_stop) = (append_seconds, fail_stop);
            let mut inner = self.lock();
            let last = inner.entries.keys().next_back().copied();
            if let Some(torn) = torn.filter(|torn| last >= Some(*torn)) {
                return Err(io::Error::other(format!(
                    "entry {torn} survived its torn record (last {last:?})"
                )));
            }
            // The commit index hint is written without an fsync of its own: it goes with the
            // tail (it may point into it if the disk lied).
            if inner.committed.is_some_and(|committed| committed.index >= from) {
                inner.committed = None;
                inner.write_committed(None)?;
                fdatasync(&inner.segments.last().expect("written to").file)?;
            }
            drop(inner);
        }
        {
            let mut inner = self.lock();
            faults.opened(inner.last_log_id().map_or(0, |id| id.index));
            inner.faults = Some(faults.clone());
        }
        self.faults = Some(faults);
        Ok(self)
    }

    /// Records the duration of every append (the write and its fdatasync) in `histogram`.
    pub fn with_append_histogram(
        mut self,
        histogram: prometheus_client::metrics::histogram::Histogram,
    ) -> SegmentLog {
        self.append_seconds = Some(histogram);
        self
    }

    /// Reports write failures to `fail_stop`, and refuses every write once it has failed.
    pub fn with_fail_stop(mut self, fail_stop: Arc<FailStop>) -> SegmentLog {
        self.fail_stop = Some(fail_stop);
        self
    }

    /// Publishes what is durable to `sync`, and reports a leader's appends before their fsync
    /// when `sync` allows it (see `log_sync`). Without it the log has a `LogSync` of its own
    /// that never allows it.
    pub fn with_sync(self, sync: Arc<LogSync>) -> SegmentLog {
        {
            let mut inner = self.lock();
            sync.set_durable(inner.durable);
            inner.sync = sync;
        }
        self
    }

    /// Whether an append of `entries` may be reported before its fsync: this node leads with
    /// other voters (gate 5 of `log_sync`), the batch holds no membership entry (gate 3), and no
    /// earlier sync has been pending for [`SYNC_STALL`] (gate 7).
    fn may_report_early(&self, inner: &Inner, entries: &[Entry<TypeConfig>]) -> bool {
        let leads = inner
            .meta
            .vote
            .is_some_and(|vote| vote.is_committed() && vote.leader_id().voted_for() == Some(inner.sync.id()));
        leads
            && inner.sync.overlap()
            && !inner.failed
            && entries.iter().all(|entry| !matches!(entry.payload, openraft::EntryPayload::Membership(_)))
            && inner.unsynced.front().is_none_or(|(_, since)| since.elapsed() < SYNC_STALL)
    }

    /// A leader's append: writes `entries` and reports them flushed at once; they are synced
    /// beside the replication that the report lets openraft start ([`SegmentLog::sync_beside`]).
    fn append_early(
        &self,
        entries: Vec<Entry<TypeConfig>>,
        callback: LogFlushed<TypeConfig>,
    ) -> io::Result<()> {
        let (file, upto, started) = match self.write_early(entries) {
            Ok(Some(written)) => written,
            Ok(None) => {
                callback.log_io_completed(Ok(()));
                return Ok(());
            }
            Err(e) => {
                callback.log_io_completed(Err(io::Error::new(e.kind(), e.to_string())));
                return Err(e);
            }
        };
        StorageFaults::report_written(self.faults.as_deref(), upto.index, callback);
        self.sync_beside(file, upto, started);
        Ok(())
    }

    /// Syncs `file` up to `upto` (a leader's append, written at `started` and already reported)
    /// beside openraft's core task. A sync still pending after [`SYNC_STALL`] is joined in
    /// place (gate 7 of `log_sync`).
    fn sync_beside(&self, file: Arc<File>, upto: LogId, started: std::time::Instant) {
        let log = self.clone();
        let on_threads = tokio::runtime::Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread;
        tokio::spawn(async move {
            if !on_threads {
                // The simulation's one thread: the append just woke the replication tasks, so
                // let them send first and then fsync in place, deterministically.
                tokio::task::yield_now().await;
                log.sync_upto(&file, upto, started);
                return;
            }
            // On a blocking thread, so that the worker answers the followers and the clients
            // meanwhile (with one worker, an fsync in place would stall them all).
            let sync = tokio::task::spawn_blocking({
                let log = log.clone();
                move || log.sync_upto(&file, upto, started)
            });
            if tokio::time::timeout(SYNC_STALL, sync).await.is_err() {
                // Gate 7 without a next append: a sync still pending after SYNC_STALL is
                // joined in place, as an in-place fsync would be. The worker then waits for the
                // disk, the heartbeats stop, and the followers elect another leader.
                tracing::warn!(
                    index = upto.index,
                    "a log sync is pending for {SYNC_STALL:?}: waiting for the disk"
                );
                drop(log.gate());
            }
        });
    }

    /// Writes `entries` without syncing them; returns the file to sync, the last log id written
    /// and when. `None` for no entries.
    fn write_early(
        &self,
        entries: Vec<Entry<TypeConfig>>,
    ) -> io::Result<Option<(Arc<File>, LogId, std::time::Instant)>> {
        if entries.is_empty() {
            return Ok(None);
        }
        let started = std::time::Instant::now();
        self.write("log append", |inner| {
            let term = inner.meta.vote.map(|vote| vote.leader_id().get_term()).unwrap_or_default();
            inner.note_early_term(term)?;
            let file = inner.append(entries)?;
            let upto = inner.last_log_id();
            if let Some(upto) = upto {
                inner.unsynced.push_back((upto.index, started));
            }
            Ok(upto.map(|upto| (file, upto, started)))
        })
    }

    /// Syncs `file`, the segment that ends with entry `upto`, and records `upto` durable unless
    /// it is already, or no longer in the log. A failure is latched as any failed write is: the
    /// node fail-stops, and what was not durable never becomes visible.
    fn sync_upto(&self, file: &File, upto: LogId, written_at: std::time::Instant) {
        if self.faults.as_ref().is_some_and(|faults| faults.is_stalled()) {
            // A simulated fsync that hangs: it never ends, and a power cut tears what it held.
            return;
        }
        let synced = |inner: &Inner| inner.durable.is_some_and(|durable| durable.index >= upto.index);
        // Held until the outcome is recorded (see `gate`).
        let _gate = self.gate();
        if synced(&self.lock()) {
            return;
        }
        let result = self.io.run(|| {
            fdatasync(file)?;
            if crate::bugs::is(crate::bugs::Bug::SlowLogSync) {
                std::thread::sleep(crate::bugs::SLOW_LOG_SYNC);
            }
            Ok(())
        });
        let mut inner = self.lock();
        if inner.failed {
            return;
        }
        if let Err(e) = result {
            self.failed("log sync", &mut inner, &e);
            return;
        }
        if let Some(histogram) = &self.append_seconds {
            histogram.observe(written_at.elapsed().as_secs_f64());
        }
        let in_log = inner.entries.get(&upto.index).is_some_and(|(entry, _, _)| entry.log_id == upto);
        if in_log && !synced(&inner) {
            inner.mark_durable(Some(upto));
        }
    }

    /// Under a simulated fsync that hangs, a write that must sync what is pending first (gate 4
    /// of `log_sync`) hangs too: until the fault is disarmed (the disk answers again), or a
    /// power cut, after which it fails and the node stops.
    async fn wait_if_stalled(&self) -> io::Result<()> {
        let Some(faults) = self.faults.as_ref() else { return Ok(()) };
        if !faults.is_stalled() || self.lock().unsynced.is_empty() {
            return Ok(());
        }
        if faults.wait_while_stalled().await {
            return Err(io::Error::other("power cut while an fsync hung (simulation)"));
        }
        Ok(())
    }

    /// Appends `entries` and returns once they are durable (written and fdatasynced).
    ///
    /// # Errors
    /// When the write or the fdatasync fails (the store then refuses every later write).
    pub fn append_entries(&self, entries: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        let started = std::time::Instant::now();
        if let Some(written) = self.faults.as_ref().and_then(|faults| faults.take_append_failure()) {
            return self.inject_fsync_failure(entries, written);
        }
        // The records are written under the lock, the fdatasync runs without it: readers
        // (replication to followers) are not held up by the local fsync. openraft issues the
        // next append only after this one returned, so batches stay in order. Both run on
        // openraft's core task, which waits for them anyway ([`super::LogIo`]).
        // The gate is held until the fdatasync's outcome is recorded.
        let _gate = self.gate();
        let result = self
            .write_gated("log append", |inner| {
                inner.sync_written()?;
                let file = inner.append(entries)?;
                Ok((file, inner.last_log_id()))
            })
            .and_then(|(file, upto)| {
                self.io
                    .run(|| {
                        fdatasync(&file)?;
                        if crate::bugs::is(crate::bugs::Bug::SlowLogSync) {
                            std::thread::sleep(crate::bugs::SLOW_LOG_SYNC);
                        }
                        Ok(())
                    })
                    .inspect_err(|e| self.failed("log append", &mut self.lock(), e))?;
                let mut inner = self.lock();
                if inner.durable.is_none_or(|durable| upto.is_some_and(|upto| durable.index < upto.index)) {
                    inner.mark_durable(upto);
                }
                Ok(())
            });
        if let Some(histogram) = &self.append_seconds {
            histogram.observe(started.elapsed().as_secs_f64());
        }
        result
    }

    /// A failed fsync (a simulation's): the entries reach the file first if `written`, and the
    /// failure is latched and reported as a real one would be.
    fn inject_fsync_failure(&self, entries: Vec<Entry<TypeConfig>>, written: bool) -> io::Result<()> {
        self.write("log append", |inner| {
            if written {
                inner.append(entries)?;
            }
            Err(io::Error::other("injected fsync failure (simulation)"))
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Latches a failed write: reported to the fail-stop latch, and no write runs again.
    fn failed(&self, operation: &str, inner: &mut Inner, e: &io::Error) {
        inner.failed = true;
        if let Some(latch) = &self.fail_stop {
            latch.storage(operation, &self.dir, e);
        }
    }

    /// Runs one durable write. A failure is reported to the fail-stop latch and latched here:
    /// once a write failed, no write runs again (a failed fsync is never retried).
    /// It runs on the calling task ([`super::LogIo`]).
    fn write<R>(&self, operation: &str, f: impl FnOnce(&mut Inner) -> io::Result<R>) -> io::Result<R> {
        let _gate = self.gate();
        self.write_gated(operation, f)
    }

    /// The gate (see [`SegmentLog::gate`]); poisoning is ignored, as for `inner`.
    fn gate(&self) -> MutexGuard<'_, ()> {
        self.gate.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`SegmentLog::write`], for a caller that holds the gate.
    fn write_gated<R>(&self, operation: &str, f: impl FnOnce(&mut Inner) -> io::Result<R>) -> io::Result<R> {
        self.io.run(|| {
            let mut inner = self.lock();
            if inner.failed || self.fail_stop.as_ref().is_some_and(|latch| latch.is_failed()) {
                return Err(io::Error::other("refused after an earlier storage failure"));
            }
            let result = f(&mut inner);
            if let Err(e) = &result {
                self.failed(operation, &mut inner, e);
            }
            result
        })
    }
}

impl RaftLogReader<TypeConfig> for SegmentLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let inner = self.lock();
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        Ok(inner.entries.range(range).map(|(_, (entry, _, _))| entry.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for SegmentLog {
    type LogReader = SegmentLog;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let inner = self.lock();
        Ok(LogState { last_purged_log_id: inner.meta.last_purged, last_log_id: inner.last_log_id() })
    }

    async fn get_log_reader(&mut self) -> SegmentLog {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.wait_if_stalled()
            .await
            .map_err(|e| io_storage_error(ErrorSubject::Vote, ErrorVerb::Write, &e))?;
        self.write("vote save", |inner| {
            inner.sync_written()?;
            let previous = inner.meta.vote.replace(*vote);
            let saved = inner.save_meta();
            if saved.is_err() {
                inner.meta.vote = previous;
            }
            saved
        })
        .map_err(|e| io_storage_error(ErrorSubject::Vote, ErrorVerb::Write, &e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.lock().meta.vote)
    }

    /// Written as a record without an fsync of its own: durable with the next append.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.write("commit index save", |inner| {
            inner.committed = committed;
            if inner.segments.is_empty() {
                return Ok(());
            }
            inner.write_committed(committed)
        })
        .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.lock().committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        let early = {
            let inner = self.lock();
            self.may_report_early(&inner, &entries)
        };
        let armed = self.faults.as_ref().is_some_and(|faults| faults.append_failure_armed());
        if early && !armed {
            return self
                .append_early(entries, callback)
                .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e));
        }
        if let Err(e) = self.wait_if_stalled().await {
            let error = io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e);
            callback.log_io_completed(Err(e));
            return Err(error);
        }
        let span =
            entries.first().zip(entries.last()).map(|(first, last)| (first.log_id.index, last.log_id.index));
        match self.append_entries(entries) {
            Ok(_) => {
                StorageFaults::report_appended(self.faults.as_deref(), span, callback);
                Ok(())
            }
            Err(e) => {
                let error = io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e);
                callback.log_io_completed(Err(e));
                Err(error)
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.wait_if_stalled()
            .await
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))?;
        self.write("log truncate", |inner| inner.truncate(log_id.index))
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.wait_if_stalled()
            .await
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))?;
        self.write("log purge", |inner| inner.purge(log_id))
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::{CommittedLeaderId, EntryPayload, Membership};

    use super::*;

    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }
    }

    fn durable(sync: &LogSync) -> Option<u64> {
        sync.durable().map(|id| id.index)
    }

    /// A leader's sync runs beside the worker, which answers meanwhile; one pending for
    /// [`SYNC_STALL`] is joined in place, so a disk that hangs stalls the node as an in-place
    /// fsync would (gate 7 of `log_sync`). The test holds the gate: to the sync, the disk hangs.
    #[test]
    fn a_leaders_sync_runs_beside_the_worker_until_it_stalls() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("a runtime");
        let dir = tempfile::tempdir().expect("temp dir");
        let sync = LogSync::new(1);
        let log = SegmentLog::open(dir.path()).expect("open").with_sync(sync.clone());
        // Whether a task spawned now runs on the one worker within `wait`. The test thread waits
        // outside the runtime: while the worker is blocked, no timer of the runtime fires.
        let worker_answers = |wait: Duration| {
            let (tx, rx) = std::sync::mpsc::channel();
            runtime.spawn(async move { tx.send(()).ok() });
            rx.recv_timeout(wait).is_ok()
        };
        let _runtime = runtime.enter();
        let (file, upto, started) = log.write_early(vec![blank(1)]).expect("write").expect("written");
        let hung_disk = log.gate();
        log.sync_beside(file, upto, started);
        for _ in 0..3 {
            // Within SYNC_STALL all three: (40 + 5) ms each at most.
            assert!(
                worker_answers(Duration::from_millis(40)),
                "the worker answers while the sync is pending"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(durable(&sync), None);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while worker_answers(Duration::from_millis(50)) {
            assert!(std::time::Instant::now() < deadline, "the pending sync was never joined in place");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(durable(&sync), None, "the disk still hangs");
        drop(hung_disk);
        assert!(worker_answers(Duration::from_secs(10)), "the worker is free once the disk answers");
        assert_eq!(durable(&sync), Some(1), "synced");
    }

    /// Gates 4 and 3 of `log_sync`, and the roll: what a leader wrote without syncing is synced
    /// before a vote, a truncation, a purge, an in-place append or a new segment; a membership
    /// entry is never reported early.
    #[tokio::test]
    async fn writes_that_are_not_a_leaders_append_sync_what_is_pending_first() {
        let dir = tempfile::tempdir().expect("temp dir");
        let sync = LogSync::new(1);
        let mut log = SegmentLog::open(dir.path()).expect("open").with_sync(sync.clone());
        let batch = |indexes: std::ops::RangeInclusive<u64>| indexes.map(blank).collect::<Vec<_>>();

        log.write_early(batch(1..=3)).expect("write");
        assert_eq!(durable(&sync), None, "written, not synced");
        log.save_vote(&Vote::new(2, 2)).await.expect("vote");
        assert_eq!(durable(&sync), Some(3), "a vote syncs what a leader wrote first");
        assert!(log.lock().unsynced.is_empty(), "nothing pending");

        log.write_early(batch(4..=6)).expect("write");
        assert_eq!(durable(&sync), Some(3));
        log.truncate(LogId::new(CommittedLeaderId::new(1, 1), 6)).await.expect("truncate");
        assert_eq!(durable(&sync), Some(5), "synced, then truncated back to the last entry kept");

        log.write_early(batch(6..=7)).expect("write");
        log.purge(LogId::new(CommittedLeaderId::new(1, 1), 2)).await.expect("purge");
        assert_eq!(durable(&sync), Some(7), "a purge syncs first");

        log.write_early(batch(8..=8)).expect("write");
        log.append_entries(batch(9..=9)).expect("in-place append");
        assert_eq!(durable(&sync), Some(9), "an in-place append syncs what was pending, then itself");

        // A batch too big for the segment rolls to a new one; the old one is synced first.
        log.write_early(batch(10..=10)).expect("write");
        let big = Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), 11),
            payload: EntryPayload::Normal(permit_core::Batch {
                now_ms: 0,
                commands: vec![
                    permit_core::Command::PutSemaphore {
                        name: permit_core::Name::new("x".repeat(permit_core::limits::NAME_BYTES_MAX))
                            .expect("name"),
                        capacity: 1
                    };
                    SEGMENT_BYTES as usize / permit_core::limits::NAME_BYTES_MAX
                ],
            }),
        };
        log.write_early(vec![big]).expect("write a segment's worth");
        assert_eq!(log.lock().segments.len(), 2, "rolled");
        assert_eq!(durable(&sync), Some(10), "the segment before the roll is synced");

        // Gate 3 and gate 5: only a leader's batch without a membership entry, with overlap on.
        let early =
            |log: &SegmentLog, entries: &[Entry<TypeConfig>]| log.may_report_early(&log.lock(), entries);
        assert!(!early(&log, &batch(12..=12)), "vote (2, 2) is not this node's");
        let mut own = Vote::new(3, 1);
        own.commit();
        log.save_vote(&own).await.expect("vote");
        assert!(!early(&log, &batch(12..=12)), "overlap is off");
        sync.set_overlap(true);
        assert!(early(&log, &batch(12..=12)), "a leader with other voters");
        let membership = Entry {
            log_id: LogId::new(CommittedLeaderId::new(3, 1), 12),
            payload: EntryPayload::Membership(Membership::new(vec![[1, 2, 3].into()], None)),
        };
        assert!(!early(&log, &[blank(12), membership]), "a membership entry syncs in place");
        log.lock().unsynced.push_back((12, std::time::Instant::now() - SYNC_STALL));
        assert!(!early(&log, &batch(12..=12)), "a sync pending too long (gate 7)");
    }

    /// A node that led a term with appends reported early starts its next run as a follower of
    /// no one, its vote moved on to the next term (see `Inner::step_down_if_it_reported_early`);
    /// a committed vote for another leader of that term is kept.
    #[tokio::test]
    async fn a_leader_that_reported_early_starts_again_as_a_follower() {
        let dir = tempfile::tempdir().expect("temp dir");
        let reopen =
            |sync: &Arc<LogSync>| SegmentLog::open(dir.path()).expect("open").with_sync(sync.clone());
        let sync = LogSync::new(2);
        let mut log = reopen(&sync);
        let mut led = Vote::new(4, 2);
        led.commit();
        log.save_vote(&led).await.expect("vote");
        log.write_early(vec![blank(1)]).expect("write");
        drop(log);
        let mut log = reopen(&sync);
        assert_eq!(
            log.read_vote().await.expect("vote"),
            Some(Vote::new(5, 2)),
            "on to the next term, not led"
        );
        assert!(log.read_vote().await.expect("vote") > Some(led), "a vote never goes back");

        // Node 2 led (4, 2) and then followed (4, 3), a leader of the same term with a higher id.
        let mut followed = Vote::new(4, 3);
        followed.commit();
        log.save_vote(&followed).await.expect("vote");
        drop(log);
        let mut log = reopen(&sync);
        assert_eq!(log.read_vote().await.expect("vote"), Some(followed), "another leader's vote is kept");
    }
}
