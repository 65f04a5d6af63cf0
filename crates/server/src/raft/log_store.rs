//! The Raft log, vote and commit index in a redb database.
//!
//! redb gives crash-safe, checksummed B-tree commits with one fdatasync each
//! (`Durability::Immediate`, set explicitly), concurrent readers, and no C dependency. Each
//! `append` is one redb transaction, and openraft is told the entries are durable only after that
//! transaction committed: an acknowledged write is always on disk.

// openraft's StorageError is large; it is the error type openraft's traits require.
#![allow(clippy::result_large_err)]

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, OptionalSend, StorageIOError, Vote};
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{LogId, NodeId, StorageError, TypeConfig};
use crate::failstop::FailStop;

/// First byte of every stored log entry and metadata value. Bump when the layout changes.
/// Version 2: `ExpireSessions` carries the term that decided it.
pub const LOG_FORMAT_VERSION: u8 = 2;

/// redb page cache of the log store, in bytes.
const CACHE_BYTES: usize = 32 * 1024 * 1024;

const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("log");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const VOTE: &str = "vote";
const COMMITTED: &str = "committed";
const LAST_PURGED: &str = "last_purged";

/// The log store. Cloning shares the database (clones serve as log readers).
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    path: PathBuf,
    append_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
    /// Told about the first failed write; after it, every write is refused (never retried).
    fail_stop: Option<Arc<FailStop>>,
    /// Faults a simulation injects (never set by `permit serve`).
    faults: Option<Arc<StorageFaults>>,
}

/// Storage faults a simulation injects into a node's redb log, shared across the node's restarts
/// on the same data dir (`Config::storage_faults`; `permit serve` never sets it).
///
/// - A failed fsync: the next append fails as a failed `fdatasync` would, with or without its
///   entries having reached the file first. The store reports it to the fail-stop latch and
///   openraft is told the append failed, so the entries are never acknowledged and the node
///   stops.
/// - A torn tail: appends are written but their flush is never reported (an fsync that hangs,
///   so openraft acknowledges none of them); a power cut then drops that withheld flush and the
///   next open loses a suffix of the stalled entries, as a disk that never made them durable
///   would. Entries acknowledged before the stall are never lost.
#[derive(Default)]
pub struct StorageFaults {
    /// The next append fails: `Some(true)` after its entries reached the file, `Some(false)`
    /// before.
    fail_next_append: std::sync::Mutex<Option<bool>>,
    /// Appends are written, but their flush is withheld.
    stall: std::sync::atomic::AtomicBool,
    /// The withheld flush and the first and last index of its append.
    stalled: std::sync::Mutex<Option<(LogFlushed<TypeConfig>, u64, u64)>>,
    /// After a power cut: the index from which the next open drops the log.
    torn_from: std::sync::Mutex<Option<u64>>,
    /// The last index appended (and acknowledged, unless stalled).
    last_appended: std::sync::atomic::AtomicU64,
    /// A disk that lies about fsync: the next power cut also loses this many acknowledged
    /// entries. Only the simulation's self-test sets it, to show that the checkers catch it.
    lie: std::sync::atomic::AtomicU64,
}

impl Debug for StorageFaults {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StorageFaults")
            .field("fail_next_append", &*self.fail_next_append.lock().expect("faults lock"))
            .field("stall", &self.stall.load(std::sync::atomic::Ordering::Relaxed))
            .field("torn_from", &*self.torn_from.lock().expect("faults lock"))
            .finish_non_exhaustive()
    }
}

impl StorageFaults {
    /// No fault armed.
    pub fn new() -> Arc<StorageFaults> {
        Arc::new(StorageFaults::default())
    }

    /// Makes the next append fail as a failed fsync; `written`: its entries reach the file first.
    pub fn fail_next_append(&self, written: bool) {
        *self.fail_next_append.lock().expect("faults lock") = Some(written);
    }

    /// From now on appends are written but never reported flushed, until [`Self::power_cut`].
    pub fn stall_appends(&self) {
        self.stall.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Disarms the faults that have not fired.
    pub fn disarm(&self) {
        *self.fail_next_append.lock().expect("faults lock") = None;
        self.stall.store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes the disk lie about fsync: the next power cut also loses the last `entries`
    /// acknowledged entries. Raft cannot survive that; the simulation's self-test uses it to
    /// show that its checkers notice.
    pub fn lie_about_fsync(&self, entries: u64) {
        self.lie.store(entries, std::sync::atomic::Ordering::Relaxed);
    }

    /// The machine loses power: the withheld flush never comes (openraft's wait for it fails)
    /// and the next open keeps only the first `keep` entries of the stalled append (and loses
    /// acknowledged ones too if the disk lies). Returns the indexes lost, if any.
    pub fn power_cut(&self, keep: u64) -> Option<(u64, u64)> {
        self.disarm();
        let lie = self.lie.swap(0, std::sync::atomic::Ordering::Relaxed);
        let stalled = self.stalled.lock().expect("faults lock").take();
        let (first, last) = match stalled {
            // Dropping the flush fails openraft's wait for it.
            Some((_flushed, first, last)) => (first, last),
            None => {
                let last = self.last_appended.load(std::sync::atomic::Ordering::Relaxed);
                (last.saturating_add(1), last)
            }
        };
        let from = if lie > 0 { first.saturating_sub(lie).max(1) } else { first.saturating_add(keep) };
        if from > last {
            return None;
        }
        *self.torn_from.lock().expect("faults lock") = Some(from);
        Some((from, last))
    }

    fn take_append_failure(&self) -> Option<bool> {
        self.fail_next_append.lock().expect("faults lock").take()
    }
}

fn injected_fsync_error() -> redb::Error {
    redb::Error::Io(std::io::Error::other("injected fsync failure (simulation)"))
}

fn storage_error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: impl std::error::Error) -> StorageError {
    StorageError::IO { source: StorageIOError::new(subject, verb, AnyError::error(e.to_string())) }
}

fn read_logs_error(e: impl std::error::Error) -> StorageError {
    storage_error(ErrorSubject::Logs, ErrorVerb::Read, e)
}

fn write_logs_error(e: impl std::error::Error) -> StorageError {
    storage_error(ErrorSubject::Logs, ErrorVerb::Write, e)
}

/// Encodes a stored log entry or metadata value: [`LOG_FORMAT_VERSION`], then postcard.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_extend(value, vec![LOG_FORMAT_VERSION]).expect("encoding to memory cannot fail")
}

/// Decodes a stored log entry or metadata value: [`LOG_FORMAT_VERSION`], then postcard.
///
/// # Errors
/// When the record is empty, of another version, or not a valid encoding of `T`; never panics,
/// whatever the bytes (the property tests in `tests/decoders.rs` feed it random ones).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, std::io::Error> {
    match bytes.split_first() {
        Some((&LOG_FORMAT_VERSION, body)) => postcard::from_bytes(body).map_err(super::io_error),
        Some((version, _)) => Err(std::io::Error::other(format!("log format version {version} unsupported"))),
        None => Err(std::io::Error::other("empty log record")),
    }
}

impl LogStore {
    /// Opens (or creates) the log database at `path`.
    ///
    /// # Errors
    /// When the file cannot be opened or is not a redb database.
    pub fn open(path: &Path) -> Result<LogStore, redb::Error> {
        // Reads are of recent entries (replication, restart replay): a small cache is enough,
        // and redb's default would let the page cache grow with the log file.
        let db = Database::builder().set_cache_size(CACHE_BYTES).create(path)?;
        let mut txn = db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        txn.open_table(LOG)?;
        txn.open_table(META)?;
        txn.commit()?;
        Ok(LogStore {
            db: Arc::new(db),
            path: path.to_owned(),
            append_seconds: None,
            fail_stop: None,
            faults: None,
        })
    }

    /// Records the duration of every append (one redb commit with its fsync) in `histogram`.
    pub fn with_append_histogram(
        mut self,
        histogram: prometheus_client::metrics::histogram::Histogram,
    ) -> LogStore {
        self.append_seconds = Some(histogram);
        self
    }

    /// Reports write failures to `fail_stop`, and refuses every write once it has failed.
    pub fn with_fail_stop(mut self, fail_stop: Arc<FailStop>) -> LogStore {
        self.fail_stop = Some(fail_stop);
        self
    }

    /// Injects `faults` (a simulation's); first drops the torn tail a power cut left, if any.
    ///
    /// # Errors
    /// When the torn tail cannot be dropped.
    pub fn with_faults(mut self, faults: Arc<StorageFaults>) -> Result<LogStore, redb::Error> {
        let torn_from = faults.torn_from.lock().expect("faults lock").take();
        if let Some(from) = torn_from {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            txn.open_table(LOG)?.retain_in::<u64, _>(from.., |_, _| false)?;
            // The commit index hint is written without an fsync of its own: it goes with the
            // tail (it may point into it if the disk lied).
            txn.open_table(META)?.remove(COMMITTED)?;
            txn.commit()?;
        }
        self.faults = Some(faults);
        Ok(self)
    }

    /// Runs one durable write (a redb commit with its fdatasync). A failure is reported to the
    /// fail-stop latch; once it has failed, no write runs again: a failed fsync is never retried.
    fn write<R>(
        &self,
        operation: &str,
        f: impl FnOnce() -> Result<R, redb::Error>,
    ) -> Result<R, redb::Error> {
        if self.fail_stop.as_ref().is_some_and(|latch| latch.is_failed()) {
            let refused = std::io::Error::other("refused after an earlier storage failure");
            return Err(redb::Error::Io(refused));
        }
        let result = Self::blocking(f);
        if let (Err(e), Some(latch)) = (&result, &self.fail_stop) {
            latch.storage(operation, &self.path, e);
        }
        result
    }

    fn read_meta<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StorageError> {
        let txn = self.db.begin_read().map_err(read_logs_error)?;
        let table = txn.open_table(META).map_err(read_logs_error)?;
        let Some(value) = table.get(key).map_err(read_logs_error)? else { return Ok(None) };
        decode(value.value()).map(Some).map_err(read_logs_error)
    }

    fn write_meta<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        durability: Durability,
    ) -> Result<(), redb::Error> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(durability)?;
        txn.open_table(META)?.insert(key, encode(value).as_slice())?;
        txn.commit()?;
        Ok(())
    }

    /// Runs a blocking redb write without stalling the other tasks of this worker thread.
    fn blocking<R>(f: impl FnOnce() -> R) -> R {
        super::blocking(f)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let txn = self.db.begin_read().map_err(read_logs_error)?;
        let table = txn.open_table(LOG).map_err(read_logs_error)?;
        let start = range.start_bound().cloned();
        let end = range.end_bound().cloned();
        let mut entries = Vec::new();
        for row in table.range::<u64>((start, end)).map_err(read_logs_error)? {
            let (_, value) = row.map_err(read_logs_error)?;
            entries.push(decode(value.value()).map_err(read_logs_error)?);
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged_log_id = self.read_meta::<Option<LogId>>(LAST_PURGED)?.flatten();
        let txn = self.db.begin_read().map_err(read_logs_error)?;
        let table = txn.open_table(LOG).map_err(read_logs_error)?;
        let last = match table.last().map_err(read_logs_error)? {
            Some((_, value)) => {
                let entry: Entry<TypeConfig> = decode(value.value()).map_err(read_logs_error)?;
                Some(entry.log_id)
            }
            None => last_purged_log_id,
        };
        Ok(LogState { last_purged_log_id, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.write("vote save", || self.write_meta(VOTE, vote, Durability::Immediate))
            .map_err(|e| storage_error(ErrorSubject::Vote, ErrorVerb::Write, e))
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.read_meta(VOTE)
    }

    /// The commit index is a hint that lets a restart apply the log before a leader is elected;
    /// losing it loses nothing (the leader re-commits), so it is written without an fsync of its
    /// own and becomes durable with the next append.
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.write("commit index save", || self.write_meta(COMMITTED, &committed, Durability::None))
            .map_err(write_logs_error)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.read_meta::<Option<LogId>>(COMMITTED)?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let started = std::time::Instant::now();
        let injected = self.faults.as_ref().and_then(|faults| faults.take_append_failure());
        let mut span = None::<(u64, u64)>;
        let result = self.write("log append", || -> Result<(), redb::Error> {
            if injected == Some(false) {
                return Err(injected_fsync_error());
            }
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            {
                let mut table = txn.open_table(LOG)?;
                for entry in entries {
                    let index = entry.log_id.index;
                    span = Some(span.map_or((index, index), |(first, _)| (first, index)));
                    table.insert(index, encode(&entry).as_slice())?;
                }
            }
            // Durability::Immediate: commit returns after fdatasync.
            txn.commit()?;
            if injected == Some(true) {
                return Err(injected_fsync_error());
            }
            Ok(())
        });
        if let Some(histogram) = &self.append_seconds {
            histogram.observe(started.elapsed().as_secs_f64());
        }
        match result {
            Ok(()) => {
                if let (Some(faults), Some((first, last))) = (&self.faults, span) {
                    faults.last_appended.store(last, std::sync::atomic::Ordering::Relaxed);
                    if faults.stall.load(std::sync::atomic::Ordering::Relaxed) {
                        // The fsync "hangs": the flush is withheld until a power cut drops it.
                        *faults.stalled.lock().expect("faults lock") = Some((callback, first, last));
                        return Ok(());
                    }
                }
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(super::io_error(&e)));
                Err(write_logs_error(e))
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write("log truncate", || -> Result<(), redb::Error> {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            txn.open_table(LOG)?.retain_in::<u64, _>(log_id.index.., |_, _| false)?;
            txn.commit()?;
            Ok(())
        })
        .map_err(write_logs_error)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.write("log purge", || -> Result<(), redb::Error> {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            txn.open_table(META)?.insert(LAST_PURGED, encode(&Some(log_id)).as_slice())?;
            txn.open_table(LOG)?
                .retain_in::<u64, _>((Bound::Unbounded, Bound::Included(log_id.index)), |_, _| false)?;
            txn.commit()?;
            Ok(())
        })
        .map_err(write_logs_error)
    }
}
