//! openraft's storage traits over the segment log: reads from memory, writes through the
//! store's gate and fail-stop latch ([`SegmentLog::write`]), appends in place or early
//! (`durable.rs`).
//!
//! Asserted: what a read returns is gapless and under its own indexes, and a saved vote never
//! goes back to an earlier term.

use std::fmt::Debug;
use std::io;
use std::ops::RangeBounds;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, Entry, ErrorSubject, ErrorVerb, OptionalSend, StorageIOError, Vote};

use super::SegmentLog;
use crate::raft::{LogId, NodeId, StorageError, TypeConfig};

fn io_storage_error(subject: ErrorSubject<NodeId>, verb: ErrorVerb, e: &io::Error) -> StorageError {
    StorageError::IO { source: StorageIOError::new(subject, verb, AnyError::error(e.to_string())) }
}

impl RaftLogReader<TypeConfig> for SegmentLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError> {
        let inner = self.lock();
        let range = (range.start_bound().cloned(), range.end_bound().cloned());
        let entries: Vec<_> = inner.entries.range(range).map(|(_, (entry, _, _))| entry.clone()).collect();
        for pair in entries.windows(2) {
            assert_eq!(pair[1].log_id.index, pair[0].log_id.index + 1, "a read of the log has a gap");
        }
        Ok(entries)
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
        self.disk
            .sync_ready()
            .await
            .map_err(|e| io_storage_error(ErrorSubject::Vote, ErrorVerb::Write, &e))?;
        self.write("vote save", |inner| {
            // openraft saves a vote only when it is not below the one it replaces.
            assert!(
                inner
                    .meta
                    .vote
                    .is_none_or(|saved| vote.leader_id().get_term() >= saved.leader_id().get_term()),
                "vote {vote} saved over {:?}, of a later term",
                inner.meta.vote
            );
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
        if early {
            return self
                .append_early(entries, callback)
                .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e));
        }
        // In place: written, then fdatasynced once the disk takes a sync (what is pending is
        // synced before the write: gate 4), then reported flushed.
        let started = std::time::Instant::now();
        let pending = !self.lock().unsynced.is_empty();
        let result = async {
            if pending {
                self.disk.sync_ready().await?;
            }
            let (file, upto) = self.write_in_place(entries)?;
            self.disk.sync_ready().await?;
            self.sync_in_place(&*file, upto, started)
        }
        .await;
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
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
        self.disk
            .sync_ready()
            .await
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))?;
        self.write("log truncate", |inner| inner.truncate(log_id.index))
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.disk
            .sync_ready()
            .await
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))?;
        self.write("log purge", |inner| inner.purge(log_id))
            .map_err(|e| io_storage_error(ErrorSubject::Logs, ErrorVerb::Write, &e))
    }
}
