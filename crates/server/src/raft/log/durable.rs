//! What the store makes durable, and when: an append in place (written, fdatasynced, then
//! reported), or a leader's append reported before its fsync and synced beside replication
//! (the store's side of the gates in `sync.rs`), and the durable log id that follows both.
//!
//! Asserted where each gate is decided: an early report only by a leader (gate 5), for a batch
//! without a membership entry (gate 3), after the `early` file names its term and with the
//! batch tracked as pending; no write but a leader's append runs with anything pending (gate 4);
//! the durable log id names an entry the log holds and moves back only by a truncation.

use std::io;
use std::sync::Arc;

use openraft::storage::LogFlushed;
use openraft::Entry;

use super::codec::encode;
use super::segment::replace_file;
use super::{Inner, SegmentLog, EARLY, SYNC_STALL};
use crate::raft::disk::{Blocking, DiskFile};
use crate::raft::{LogId, TypeConfig};

/// A leader's append written and not synced: the file to sync, the last log id written, and
/// when it was written.
pub(super) type Written = (Arc<dyn DiskFile>, LogId, std::time::Instant);

impl Inner {
    /// Whether this node leads: its vote is committed, for itself.
    fn leads(&self) -> bool {
        self.meta
            .vote
            .is_some_and(|vote| vote.is_committed() && vote.leader_id().voted_for() == Some(self.sync.id()))
    }

    /// Records, before the first append of term `term` is reported before its fsync, that this
    /// node does so as its leader (see `Inner::step_down_if_it_reported_early`).
    fn note_early_term(&mut self, term: u64) -> io::Result<()> {
        if self.early_term == Some(term) {
            return Ok(());
        }
        // A node leads ever higher terms: the marker never names an older one.
        assert!(self.early_term.is_none_or(|t| term > t), "early term {term} after {:?}", self.early_term);
        replace_file(&*self.disk, &self.dir, EARLY, &encode(&(term, self.sync.id())))?;
        self.early_term = Some(term);
        Ok(())
    }

    /// Whether `id` names an entry of the log: one it holds, or the last purged.
    fn holds(&self, id: LogId) -> bool {
        self.entries.get(&id.index).is_some_and(|(entry, _, _)| entry.log_id == id)
            || self.meta.last_purged == Some(id)
    }

    /// Records that everything written up to `upto` (an entry of the log) is durable. The durable
    /// log id never moves back here (only a truncation moves it back: [`Inner::publish_durable`]).
    pub(super) fn mark_durable(&mut self, upto: Option<LogId>) {
        assert!(
            upto.map(|id| id.index) >= self.durable.map(|id| id.index),
            "the durable log id would move back from {:?} to {upto:?}",
            self.durable
        );
        assert!(upto.is_none_or(|id| self.holds(id)), "durable up to {upto:?}, not an entry of the log");
        self.publish_durable(upto);
    }

    /// Sets the durable log id to `upto` and publishes it: [`Inner::mark_durable`], or a
    /// truncation that moves it back to the log's new end.
    pub(super) fn publish_durable(&mut self, upto: Option<LogId>) {
        self.durable = upto;
        let last = self.last_log_id().map(|id| id.index);
        let upto_index = upto.map(|id| id.index);
        self.unsynced.retain(|(index, _)| Some(*index) > upto_index && Some(*index) <= last);
        self.sync.set_durable(upto);
    }

    /// Syncs what was written and is not durable yet (a leader's appends reported before
    /// their fsync; only the last segment can hold them, see [`Inner::roll`]). Gate 4 of
    /// `sync.rs`: every log write but a leader's append runs it first.
    pub(super) fn sync_written(&mut self) -> io::Result<()> {
        if self.unsynced.is_empty() {
            return Ok(());
        }
        self.sync_last_segment()?;
        assert!(self.unsynced.is_empty(), "gate 4: {:?} still pending", self.unsynced);
        Ok(())
    }

    /// Fdatasyncs the last segment, the only one that can hold records not yet durable, and
    /// records the whole log durable.
    pub(super) fn sync_last_segment(&mut self) -> io::Result<()> {
        if let Some(last) = self.segments.last() {
            last.file.sync_data()?;
        }
        let upto = self.last_log_id();
        self.mark_durable(upto);
        Ok(())
    }
}

impl SegmentLog {
    /// Whether an append of `entries` may be reported before its fsync: this node leads with
    /// other voters (gate 5 of `sync.rs`), the batch holds no membership entry (gate 3), and no
    /// earlier sync has been pending for [`SYNC_STALL`] (gate 7).
    pub(super) fn may_report_early(&self, inner: &Inner, entries: &[Entry<TypeConfig>]) -> bool {
        inner.leads()
            && inner.sync.overlap()
            && !inner.failed
            && entries.iter().all(|entry| !matches!(entry.payload, openraft::EntryPayload::Membership(_)))
            && inner.unsynced.front().is_none_or(|(_, since)| since.elapsed() < SYNC_STALL)
    }

    /// A leader's append: writes `entries` and reports them flushed at once; they are synced
    /// beside the replication that the report lets openraft start ([`SegmentLog::sync_beside`]).
    pub(super) fn append_early(
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
        {
            // The early report's preconditions, as `append` decided them (`may_report_early`).
            let inner = self.lock();
            assert!(inner.leads(), "gate 5: appends reported early by a node that does not lead");
            let term = inner.meta.vote.map(|vote| vote.leader_id().get_term());
            assert_eq!(inner.early_term, term, "appends reported early before `early` names their term");
            assert!(
                inner.unsynced.back().is_some_and(|(index, _)| *index == upto.index),
                "gate 4: appends reported early but not pending a sync"
            );
        }
        callback.log_io_completed(Ok(()));
        self.sync_beside(file, upto, started);
        Ok(())
    }

    /// Syncs `file` up to `upto` (a leader's append, written at `started` and already reported)
    /// beside openraft's core task, as the disk says blocking work runs ([`Blocking`]). On other
    /// threads, a sync still pending after [`SYNC_STALL`] is joined in place (gate 7 of
    /// `sync.rs`).
    pub(super) fn sync_beside(&self, file: Arc<dyn DiskFile>, upto: LogId, started: std::time::Instant) {
        let log = self.clone();
        if self.disk.blocking() == Blocking::InPlace {
            tokio::spawn(async move {
                // A simulated disk, on the simulation's one thread: the append just woke the
                // replication tasks, so let them send first and then fsync in place,
                // deterministically, once the disk takes a sync (a hung one fails it when it
                // loses power: the node is going down, and nothing becomes durable).
                tokio::task::yield_now().await;
                if log.disk.sync_ready().await.is_ok() {
                    log.sync_upto(&*file, upto, started);
                }
            });
            return;
        }
        tokio::spawn(async move {
            // On a blocking thread, so that the worker answers the followers and the clients
            // meanwhile (with one worker, an fsync in place would stall them all).
            let sync = tokio::task::spawn_blocking({
                let log = log.clone();
                move || log.sync_upto(&*file, upto, started)
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
    pub(super) fn write_early(&self, entries: Vec<Entry<TypeConfig>>) -> io::Result<Option<Written>> {
        if entries.is_empty() {
            return Ok(None);
        }
        // Gate 3: a membership entry is synced in place, never reported before its fsync.
        assert!(
            entries.iter().all(|entry| !matches!(entry.payload, openraft::EntryPayload::Membership(_))),
            "gate 3: a membership entry on the early path"
        );
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
    fn sync_upto(&self, file: &dyn DiskFile, upto: LogId, written_at: std::time::Instant) {
        let synced = |inner: &Inner| inner.durable.is_some_and(|durable| durable.index >= upto.index);
        // Held until the outcome is recorded (see `gate`).
        let _gate = self.gate();
        if synced(&self.lock()) {
            return;
        }
        let result = self.io.run(|| file.sync_data());
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

    /// Appends `entries` and returns once they are durable (written and fdatasynced).
    ///
    /// # Errors
    /// When the write or the fdatasync fails (the store then refuses every later write).
    pub fn append_entries(&self, entries: Vec<Entry<TypeConfig>>) -> io::Result<()> {
        let started = std::time::Instant::now();
        let (file, upto) = self.write_in_place(entries)?;
        self.sync_in_place(&*file, upto, started)
    }

    /// The write of an append in place: syncs what is pending first (gate 4 of `sync.rs`), then
    /// writes `entries`; returns the file to fdatasync and the last log id written. The
    /// records are written under the lock, the fdatasync ([`SegmentLog::sync_in_place`]) runs
    /// without it: readers (replication to followers) are not held up by the local fsync.
    /// openraft issues the next append only after this one returned, so batches stay in order.
    /// Both run on openraft's core task, which waits for them anyway ([`crate::raft::LogIo`]).
    pub(super) fn write_in_place(
        &self,
        entries: Vec<Entry<TypeConfig>>,
    ) -> io::Result<(Arc<dyn DiskFile>, Option<LogId>)> {
        self.write("log append", |inner| {
            inner.sync_written()?;
            let file = inner.append(entries)?;
            Ok((file, inner.last_log_id()))
        })
    }

    /// The fdatasync of an append in place, written at `started` up to `upto`
    /// ([`SegmentLog::write_in_place`]); records it durable. The gate is held until the
    /// fdatasync's outcome is recorded.
    pub(super) fn sync_in_place(
        &self,
        file: &dyn DiskFile,
        upto: Option<LogId>,
        started: std::time::Instant,
    ) -> io::Result<()> {
        let _gate = self.gate();
        // A sync beside replication may have failed since the write (see `gate`): nothing is
        // synced, nor marked durable, after a failure.
        let result = if self.lock().failed {
            Err(super::LogError::Refused.into())
        } else {
            self.io.run(|| file.sync_data()).inspect_err(|e| self.failed("log append", &mut self.lock(), e))
        };
        if result.is_ok() {
            let mut inner = self.lock();
            if inner.durable.is_none_or(|durable| upto.is_some_and(|upto| durable.index < upto.index)) {
                inner.mark_durable(upto);
            }
        }
        if let Some(histogram) = &self.append_seconds {
            histogram.observe(started.elapsed().as_secs_f64());
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use openraft::storage::RaftLogStorage;
    use openraft::{CommittedLeaderId, EntryPayload, Membership, Vote};

    use super::*;
    use crate::raft::log::{LogSync, SEGMENT_BYTES};

    fn blank(index: u64) -> Entry<TypeConfig> {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }
    }

    fn durable(sync: &LogSync) -> Option<u64> {
        sync.durable().map(|id| id.index)
    }

    /// A leader's sync runs beside the worker, which answers meanwhile; one pending for
    /// [`SYNC_STALL`] is joined in place, so a disk that hangs stalls the node as an in-place
    /// fsync would (gate 7 of `sync.rs`). The test holds the gate: to the sync, the disk hangs.
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

    /// Gates 4 and 3 of `sync.rs`, and the roll: what a leader wrote without syncing is synced
    /// before a vote, a truncation, a purge, an in-place append or a new segment; a membership
    /// entry is never reported early.
    // A multi-thread runtime, as `permit serve`'s: the operating system's files run blocking
    // work on other threads (`Blocking::Threads`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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
    // A multi-thread runtime, as `permit serve`'s: the operating system's files run blocking
    // work on other threads (`Blocking::Threads`).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
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

        drop(log);

        // Node 2 led (4, 2) and then followed (4, 3), a leader of the same term with a higher id.
        let dir = tempfile::tempdir().expect("temp dir");
        let reopen =
            |sync: &Arc<LogSync>| SegmentLog::open(dir.path()).expect("open").with_sync(sync.clone());
        let mut log = reopen(&sync);
        log.save_vote(&led).await.expect("vote");
        log.write_early(vec![blank(1)]).expect("write");
        let mut followed = Vote::new(4, 3);
        followed.commit();
        log.save_vote(&followed).await.expect("vote");
        drop(log);
        let mut log = reopen(&sync);
        assert_eq!(log.read_vote().await.expect("vote"), Some(followed), "another leader's vote is kept");
    }
}
