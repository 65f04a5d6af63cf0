//! The Raft log as an append-only log of segment files (`--log-store segment`).
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
//! (entry or commit index) then [`super::log_store::encode`]d data (format version first). The
//! commit index is a record too, written without an fsync of its own: it becomes durable with
//! the next append, as with the B-tree store (it is a restart hint; losing it loses nothing).
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
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, OptionalSend, StorageIOError, Vote};
use serde::{Deserialize, Serialize};

use super::log_store::{decode, encode, LOG_FORMAT_VERSION};
use super::storage_faults::StorageFaults;
use super::{LogId, NodeId, StorageError, TypeConfig};
use crate::failstop::FailStop;

/// Size of a segment; a batch that does not fit starts a new segment.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// A segment is preallocated this much at a time, ahead of its writes (so that a small disk
/// is not taken by empty preallocated space, and a full disk fails an append, not a start).
pub const PREALLOCATE_BYTES: u64 = 1024 * 1024;

const HEADER: usize = 8;
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

    /// Starts a new preallocated segment and makes its directory entry durable.
    fn roll(&mut self) -> io::Result<()> {
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
        let tmp = self.dir.join("meta.tmp");
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        file.write_all_at(&encode(&self.meta), 0)?;
        fdatasync(&file)?;
        std::fs::rename(&tmp, self.dir.join("meta"))?;
        sync_dir(&self.dir)
    }

    /// Appends a commit index record (no fsync of its own: durable with the next append).
    fn write_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let mut bytes = Vec::new();
        record(KIND_COMMITTED, &encode(&committed), &mut bytes);
        self.write(&bytes, false).map(|_| ())
    }

    /// Removes entries at and after `index`: zeroes their records and deletes later segments.
    fn truncate(&mut self, index: u64) -> io::Result<()> {
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
        Ok(())
    }

    /// Records `log_id` as purged (durably), forgets the entries up to it, and deletes every
    /// segment but the active one whose entries are all purged.
    fn purge(&mut self, log_id: LogId) -> io::Result<()> {
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
            let dir = self.dir.clone();
            // The only handle: dropping it closes the files and lets go of the directory's lock.
            drop(self);
            self = SegmentLog::open(&dir)?;
            (self.append_seconds, self.fail_stop) = (append_seconds, fail_stop);
            let mut inner = self.lock();
            let last = inner.entries.keys().next_back().copied();
            if let Some(torn) = torn.filter(|torn| last >= Some(*torn)) {
                return Err(io::Error::other(format!(
                    "entry {torn} survived its torn record (last {last:?})"
                )));
            }
            // The commit index hint is written without an fsync of its own: it goes with the
            // tail (it may point into it if the disk lied), as in the redb store.
            if inner.committed.is_some_and(|committed| committed.index >= from) {
                inner.committed = None;
                inner.write_committed(None)?;
                fdatasync(&inner.segments.last().expect("written to").file)?;
            }
            drop(inner);
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
        let result = self.write("log append", |inner| inner.append(entries)).and_then(|file| {
            self.io
                .run(|| {
                    fdatasync(&file)?;
                    if crate::bugs::is(crate::bugs::Bug::SlowLogSync) {
                        std::thread::sleep(crate::bugs::SLOW_LOG_SYNC);
                    }
                    Ok(())
                })
                .inspect_err(|e| self.failed("log append", &mut self.lock(), e))
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
        self.write("vote save", |inner| {
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
        self.write("log truncate", |inner| inner.truncate(log_id.index))
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write("log purge", |inner| inner.purge(log_id))
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }
}
