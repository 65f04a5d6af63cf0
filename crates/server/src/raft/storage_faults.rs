//! Storage faults a simulation injects into the segment log (`Config::storage_faults`), so the
//! simulation runs it under failed fsyncs and torn tails.

use std::fmt::Debug;
use std::sync::Arc;

use openraft::storage::LogFlushed;

use super::TypeConfig;

/// Storage faults a simulation injects into a node's log store (`raft/log/`), shared
/// across the node's restarts on the same data dir (`Config::storage_faults`; `permit serve`
/// never sets it).
///
/// - A failed fsync: the next append fails as a failed `fdatasync` would, with or without its
///   entries having reached the file first. The store reports it to the fail-stop latch and
///   openraft is told the append failed, so the entries are never acknowledged and the node
///   stops.
/// - A torn tail: appends are written but never synced (an fsync that hangs). An append that
///   waits for its fsync is never reported flushed, so openraft acknowledges none of them; a
///   leader's append reported before its fsync (`log::sync`) is reported, but its sync never
///   ends, so nothing it commits becomes visible. A power cut then drops what was withheld and
///   the next open loses a suffix of the entries written since the last sync, as a disk that
///   never made them durable would. Entries synced before the stall are never lost.
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
    /// The last index written.
    last_written: std::sync::atomic::AtomicU64,
    /// The last index synced (durable).
    last_synced: std::sync::atomic::AtomicU64,
    /// A disk that lies about fsync: the next power cut also loses this many acknowledged
    /// entries. Only the simulation's self-test sets it, to show that the checkers catch it.
    lie: std::sync::atomic::AtomicU64,
    /// Woken when the stall ends (disarmed, or by a power cut).
    released: tokio::sync::Notify,
    /// Power cuts so far.
    cuts: std::sync::atomic::AtomicU64,
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
        self.released.notify_waiters();
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
        self.cuts.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.disarm();
        let lie = self.lie.swap(0, std::sync::atomic::Ordering::Relaxed);
        // Dropping a withheld flush fails openraft's wait for it.
        drop(self.stalled.lock().expect("faults lock").take());
        // What was written since the last sync: an append whose flush was withheld, or a
        // leader's appends reported before a sync that never ended.
        let first = self.last_synced.load(std::sync::atomic::Ordering::Relaxed).saturating_add(1);
        let last = self.last_written.load(std::sync::atomic::Ordering::Relaxed);
        let from = if lie > 0 { first.saturating_sub(lie).max(1) } else { first.saturating_add(keep) };
        if from > last {
            return None;
        }
        *self.torn_from.lock().expect("faults lock") = Some(from);
        Some((from, last))
    }

    /// A store opened with entries up to `last` (0 for none): the open made all of them durable
    /// (`sync_what_was_read`), and a flush withheld from the process before is gone with it.
    pub(super) fn opened(&self, last: u64) {
        drop(self.stalled.lock().expect("faults lock").take());
        self.last_written.store(last, std::sync::atomic::Ordering::Relaxed);
        self.last_synced.store(last, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether an append failure is armed (see [`Self::fail_next_append`]).
    pub(super) fn append_failure_armed(&self) -> bool {
        self.fail_next_append.lock().expect("faults lock").is_some()
    }

    /// Whether the next append fails (`Some(written)`, see [`Self::fail_next_append`]); disarms it.
    pub(super) fn take_append_failure(&self) -> Option<bool> {
        self.fail_next_append.lock().expect("faults lock").take()
    }

    /// The index from which the log must be dropped as it opens (the torn tail of a power cut),
    /// once.
    pub(super) fn take_torn_from(&self) -> Option<u64> {
        self.torn_from.lock().expect("faults lock").take()
    }

    /// An append of entries `span` (first and last index) was written and synced: reports it
    /// flushed to openraft, unless `faults` stall appends, which withholds the report until a
    /// power cut drops it. The log store ends a successful append here.
    pub(super) fn report_appended(
        faults: Option<&StorageFaults>,
        span: Option<(u64, u64)>,
        flushed: LogFlushed<TypeConfig>,
    ) {
        if let (Some(faults), Some((first, last))) = (faults, span) {
            faults.last_written.store(last, std::sync::atomic::Ordering::Relaxed);
            if faults.is_stalled() {
                // The fsync "hangs": the flush is withheld until a power cut drops it.
                *faults.stalled.lock().expect("faults lock") = Some((flushed, first, last));
                return;
            }
            faults.last_synced.store(last, std::sync::atomic::Ordering::Relaxed);
        }
        flushed.log_io_completed(Ok(()));
    }

    /// A leader's append of entries up to `last` was written and is reported flushed before
    /// its fsync (`log::sync`); [`Self::report_synced`] follows once the fsync ends.
    pub(super) fn report_written(faults: Option<&StorageFaults>, last: u64, flushed: LogFlushed<TypeConfig>) {
        if let Some(faults) = faults {
            faults.last_written.store(last, std::sync::atomic::Ordering::Relaxed);
        }
        flushed.log_io_completed(Ok(()));
    }

    /// Everything written up to index `last` is synced.
    pub(super) fn report_synced(faults: Option<&StorageFaults>, last: u64) {
        if let Some(faults) = faults {
            faults.last_synced.store(last, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Waits while fsyncs hang; true when the stall ended with a power cut (the node is going
    /// down: the write that waited must fail, not go on), false when it was disarmed.
    pub(super) async fn wait_while_stalled(&self) -> bool {
        let cuts = self.cuts.load(std::sync::atomic::Ordering::Relaxed);
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.is_stalled() {
                break;
            }
            released.await;
        }
        self.cuts.load(std::sync::atomic::Ordering::Relaxed) != cuts
    }

    /// Whether fsyncs hang (until a power cut).
    pub(super) fn is_stalled(&self) -> bool {
        self.stall.load(std::sync::atomic::Ordering::Relaxed)
    }
}
