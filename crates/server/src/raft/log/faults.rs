//! The simulation's storage faults on the log (`StorageFaults`; `permit serve` never sets them):
//! a power cut's torn tail, torn on disk so that the open's repair is what drops it, an fsync
//! that hangs, and a failed fsync.

use std::io;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use openraft::Entry;

use super::codec::HEADER;
use super::segment::{fdatasync, segment_path, sync_dir};
use super::{Inner, LogError, SegmentLog};
use crate::raft::storage_faults::StorageFaults;
use crate::raft::TypeConfig;

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
                return Err(LogError::Corrupt {
                    path: dir,
                    offset: 0,
                    why: format!("entry {torn} survived its torn record (last {last:?})"),
                }
                .into());
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

    /// Under a simulated fsync that hangs, a write that must sync what is pending first (gate 4
    /// of `sync.rs`) hangs too: until the fault is disarmed (the disk answers again), or a
    /// power cut, after which it fails and the node stops.
    pub(super) async fn wait_if_stalled(&self) -> io::Result<()> {
        let Some(faults) = self.faults.as_ref() else { return Ok(()) };
        if !faults.is_stalled() || self.lock().unsynced.is_empty() {
            return Ok(());
        }
        if faults.wait_while_stalled().await {
            return Err(io::Error::other("power cut while an fsync hung (simulation)"));
        }
        Ok(())
    }

    /// A failed fsync (a simulation's): the entries reach the file first if `written`, and the
    /// failure is latched and reported as a real one would be.
    pub(super) fn inject_fsync_failure(
        &self,
        entries: Vec<Entry<TypeConfig>>,
        written: bool,
    ) -> io::Result<()> {
        self.write("log append", |inner| {
            if written {
                inner.append(entries)?;
            }
            Err(io::Error::other("injected fsync failure (simulation)"))
        })
    }
}
