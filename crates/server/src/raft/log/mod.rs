//! The Raft log as an append-only log of segment files, the only log store. One concern a file:
//!
//! - `codec.rs`: the record codec (a record's framing, and the versioned encoding of what it holds);
//! - `segment.rs`: the segment files (append, roll, truncate, purge, `meta`);
//! - `open.rs`: the open, and the repair of a torn tail;
//! - `sync.rs`: the node's durable log id and the gates of the leader's early fsync;
//! - `durable.rs`: what the store makes durable when, in place or beside replication (the store's
//!   side of those gates);
//! - `storage.rs`: openraft's storage traits over all of it;
//! - `error.rs`: the typed storage errors ([`LogError`]).
//!
//! Every file operation goes through a [`Disk`] (`raft/disk.rs`): the operating system's files
//! for `permit serve`, a simulated disk with power cuts, torn tails and failed or hung fsyncs
//! for the simulation (`crates/sim`). The store knows nothing of the simulation: what it writes,
//! syncs and reports is the same on both.
//!
//! Its invariants are asserted in release builds (`assert!`): what must hold when a record, an
//! entry, the durable log id, a purge or the vote is written, and again when it is read back;
//! and each gate of the early fsync where it is decided. A failed assertion is a bug in the store
//! or in openraft's use of it, never bad input: a disk's corruption is an error, not a panic.
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
//! (entry or commit index) then [`codec::encode`]d data (format version first). The
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

pub mod codec;
mod durable;
mod error;
mod open;
mod segment;
mod storage;
pub mod sync;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::{Entry, Vote};
use serde::{Deserialize, Serialize};

pub use self::error::LogError;
pub use self::sync::{ClampedClient, CommitClamp, LogSync, Stopped, SYNC_STALL};
use super::disk::{Disk, DiskFile, OsDisk};
use super::{LogId, NodeId, TypeConfig};
use crate::failstop::FailStop;

/// Size of a segment; a batch that does not fit starts a new segment.
pub const SEGMENT_BYTES: u64 = 16 * 1024 * 1024;
/// A segment is preallocated this much at a time, ahead of its writes (so that a small disk
/// is not taken by empty preallocated space, and a full disk fails an append, not a start).
pub const PREALLOCATE_BYTES: u64 = 1024 * 1024;

/// The file that names the term in which this node, as leader, reported appends before their
/// fsync (see `Inner::step_down_if_it_reported_early`).
const EARLY: &str = "early";

/// The log store over segment files. Cloning shares it (clones serve as log readers).
#[derive(Clone)]
pub struct SegmentLog {
    inner: Arc<Mutex<Inner>>,
    dir: PathBuf,
    append_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
    /// Told about the first failed write; after it, every write is refused (never retried).
    fail_stop: Option<Arc<FailStop>>,
    /// Where the files are.
    disk: Arc<dyn Disk>,
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
    file: Arc<dyn DiskFile>,
    /// Bytes of records written (the rest is zeros).
    len: u64,
    /// Bytes preallocated (the file's size).
    allocated: u64,
    /// Index of the last entry in it, if any.
    last_index: Option<u64>,
}

struct Inner {
    disk: Arc<dyn Disk>,
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
    /// Where `durable` is published (`sync.rs`).
    sync: Arc<LogSync>,
    /// The term in which this node last reported appends before their fsync (`early`).
    early_term: Option<u64>,
    /// `raft-log/lock`, held ([`Disk::lock`]) while the store is open: a second server on the
    /// same data dir is refused.
    _lock: Box<dyn std::any::Any + Send + Sync>,
}

impl Inner {
    fn last_log_id(&self) -> Option<LogId> {
        self.entries.values().next_back().map(|(e, _, _)| e.log_id).or(self.meta.last_purged)
    }
}

impl SegmentLog {
    /// Opens (or creates) the segment log in `dir` of the operating system's files, truncating
    /// a torn tail.
    ///
    /// # Errors
    /// When the directory cannot be read or written, or the log is corrupt before its tail.
    pub fn open(dir: &Path) -> io::Result<SegmentLog> {
        SegmentLog::open_on(OsDisk::shared(), dir)
    }

    /// Opens (or creates) the segment log in `dir` of `disk`, truncating a torn tail.
    ///
    /// # Errors
    /// When the directory cannot be read or written, or the log is corrupt before its tail.
    pub fn open_on(disk: Arc<dyn Disk>, dir: &Path) -> io::Result<SegmentLog> {
        let inner = Inner::open(disk.clone(), dir)?;
        Ok(SegmentLog {
            inner: Arc::new(Mutex::new(inner)),
            dir: dir.to_owned(),
            append_seconds: None,
            fail_stop: None,
            io: Arc::new(super::LogIo::new(disk.blocking())),
            gate: Arc::default(),
            disk,
        })
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
    /// when `sync` allows it (see `sync.rs`). Without it the log has a `LogSync` of its own
    /// that never allows it.
    pub fn with_sync(self, sync: Arc<LogSync>) -> SegmentLog {
        {
            let mut inner = self.lock();
            sync.set_durable(inner.durable);
            inner.sync = sync;
        }
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Latches a failed write: reported to the fail-stop latch, and no write runs again.
    fn failed(&self, operation: &str, inner: &mut Inner, e: &io::Error) {
        inner.failed = true;
        if let Some(latch) = &self.fail_stop {
            latch.storage(operation, &self.dir, &LogError::of(e));
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
                return Err(LogError::Refused.into());
            }
            let result = f(&mut inner);
            if let Err(e) = &result {
                self.failed(operation, &mut inner, e);
            }
            result
        })
    }
}
