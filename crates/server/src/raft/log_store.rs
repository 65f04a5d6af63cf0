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

use super::log_sync::LogSync;
pub use super::storage_faults::StorageFaults;
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
    /// Where the durable writes run.
    io: Arc<super::LogIo>,
    /// Where the last durable log id is published (`log_sync`; every append here is durable
    /// when it returns).
    sync: Arc<LogSync>,
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
        // A durable commit before the log is used: it also syncs what a process that crashed
        // during an fsync left in the page cache only, which the open read from there.
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
            io: Arc::default(),
            sync: LogSync::new(0),
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

    /// Publishes the last durable log id to `sync` (`log_sync`): the last entry, since every
    /// append here returns once durable.
    ///
    /// # Errors
    /// When the log cannot be read.
    pub fn with_sync(mut self, sync: Arc<LogSync>) -> Result<LogStore, StorageError> {
        sync.set_durable(self.last_log_id()?);
        self.sync = sync;
        Ok(self)
    }

    fn last_log_id(&self) -> Result<Option<LogId>, StorageError> {
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
        Ok(last)
    }

    /// Injects `faults` (a simulation's); first drops the torn tail a power cut left, if any.
    ///
    /// # Errors
    /// When the torn tail cannot be dropped.
    pub fn with_faults(mut self, faults: Arc<StorageFaults>) -> Result<LogStore, redb::Error> {
        let torn_from = faults.take_torn_from();
        if let Some(from) = torn_from {
            let mut txn = self.db.begin_write()?;
            txn.set_durability(Durability::Immediate)?;
            txn.open_table(LOG)?.retain_in::<u64, _>(from.., |_, _| false)?;
            // The commit index hint is written without an fsync of its own: it goes with the
            // tail (it may point into it if the disk lied).
            txn.open_table(META)?.remove(COMMITTED)?;
            txn.commit()?;
        }
        let last = self.last_log_id().map_err(|e| redb::Error::Io(std::io::Error::other(e.to_string())))?;
        faults.opened(last.map_or(0, |id| id.index));
        self.faults = Some(faults);
        Ok(self)
    }

    /// Runs one durable write (a redb commit with its fdatasync), in place on the calling task
    /// ([`super::LogIo`]). A failure is reported to the fail-stop latch; once it has
    /// failed, no write runs again: a failed fsync is never retried.
    fn write<R>(
        &self,
        operation: &str,
        f: impl FnOnce() -> Result<R, redb::Error>,
    ) -> Result<R, redb::Error> {
        if self.fail_stop.as_ref().is_some_and(|latch| latch.is_failed()) {
            let refused = std::io::Error::other("refused after an earlier storage failure");
            return Err(redb::Error::Io(refused));
        }
        let result = self.io.run(f);
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
        Ok(LogState { last_purged_log_id, last_log_id: self.last_log_id()? })
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
        let mut last = None;
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
                    last = Some(entry.log_id);
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
                if last.is_some() {
                    self.sync.set_durable(last);
                }
                StorageFaults::report_appended(self.faults.as_deref(), span, callback);
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
        .map_err(write_logs_error)?;
        self.sync.set_durable(self.last_log_id()?);
        Ok(())
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
