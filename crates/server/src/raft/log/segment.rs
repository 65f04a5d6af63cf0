//! The segment files: appending records to the last segment (rolling to a new one when full),
//! truncating and purging them, and `meta` (the vote and the last purged log id).
//!
//! Asserted as written: entries are appended in index order, each one after the last the log
//! holds, with no term below it; a write stays within the preallocated space; a truncation
//! keeps every purged entry; a purge never goes back and never drops an entry that is not
//! durable (gate 4 of `sync.rs` synced it first).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::Entry;

use super::codec::{encode, record, KIND_COMMITTED, KIND_ENTRY};
use super::{Inner, Segment, PREALLOCATE_BYTES, SEGMENT_BYTES};
use crate::raft::disk::{Disk, DiskFile, Open};
use crate::raft::{LogId, TypeConfig};

pub(super) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{seq:016x}.seg"))
}

/// Replaces `dir/name` with `bytes` atomically and durably: written to `name.tmp`, fdatasynced,
/// renamed over it, and the directory fsynced.
pub(super) fn replace_file(disk: &dyn Disk, dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let file = disk.open(&tmp, Open::Truncate)?;
    file.write_at(bytes, 0)?;
    file.sync_data()?;
    disk.rename(&tmp, &dir.join(name))?;
    disk.sync_dir(dir)
}

impl Inner {
    /// Starts a new preallocated segment and makes its directory entry durable. The segment
    /// before it is synced first (it may end with a leader's appends reported before their
    /// fsync, or a commit index record), so that only the last segment ever holds records that
    /// are not durable: the open relies on it.
    pub(super) fn roll(&mut self) -> io::Result<()> {
        if !self.segments.is_empty() {
            self.sync_last_segment()?;
        }
        let seq = self.segments.last().map_or(0, |s| s.seq + 1);
        let file = self.disk.open(&segment_path(&self.dir, seq), Open::CreateNew)?;
        file.allocate(PREALLOCATE_BYTES)?;
        file.sync_data()?;
        self.disk.sync_dir(&self.dir)?;
        self.segments.push(Segment { seq, file, len: 0, allocated: PREALLOCATE_BYTES, last_index: None });
        Ok(())
    }

    /// Appends `bytes` (whole records) to the active segment, rolling first when they do not
    /// fit; returns the segment's seq and the offset they start at.
    pub(super) fn write(&mut self, bytes: &[u8], roll_if_full: bool) -> io::Result<(u64, u64)> {
        let full =
            self.segments.last().is_none_or(|s| s.len > 0 && s.len + bytes.len() as u64 > SEGMENT_BYTES);
        if self.segments.is_empty() || (roll_if_full && full) {
            self.roll()?;
        }
        let segment = self.segments.last_mut().expect("a segment");
        let end = segment.len + bytes.len() as u64;
        if end > segment.allocated {
            let allocated = end.div_ceil(PREALLOCATE_BYTES) * PREALLOCATE_BYTES;
            segment.file.allocate(allocated)?;
            segment.allocated = allocated;
        }
        segment.file.write_at(bytes, segment.len)?;
        let at = segment.len;
        segment.len += bytes.len() as u64;
        // Written into preallocated space only: an append changes no file size (one fdatasync).
        assert!(segment.len <= segment.allocated, "a write past the segment's preallocated space");
        Ok((segment.seq, at))
    }

    /// Writes `entries` (not yet synced) and makes them readable; returns the file to
    /// fdatasync before they may be reported durable.
    pub(super) fn append(&mut self, entries: Vec<Entry<TypeConfig>>) -> io::Result<Arc<dyn DiskFile>> {
        // Each entry follows the one before it (the last the log holds, then the batch's own):
        // the open accepts nothing else, and reads count on a gapless log. After a purge past
        // the log's end (a snapshot installed) the next entry follows the purge, which openraft
        // checks and this store does not rely on.
        let mut previous = self.entries.values().next_back().map(|(entry, _, _)| entry.log_id);
        for entry in &entries {
            assert!(
                previous.is_none_or(
                    |p| entry.log_id.index == p.index + 1 && entry.log_id.leader_id >= p.leader_id
                ),
                "entry {} appended after {previous:?}",
                entry.log_id
            );
            previous = Some(entry.log_id);
        }
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

    /// Replaces `meta` (the vote and the last purged log id) atomically and durably.
    pub(super) fn save_meta(&self) -> io::Result<()> {
        replace_file(&*self.disk, &self.dir, "meta", &encode(&self.meta))
    }

    /// Appends a commit index record (no fsync of its own: durable with the next append).
    pub(super) fn write_committed(&mut self, committed: Option<LogId>) -> io::Result<()> {
        let mut bytes = Vec::new();
        record(KIND_COMMITTED, &encode(&committed), &mut bytes);
        self.write(&bytes, false).map(|_| ())
    }

    /// Removes entries at and after `index`: zeroes their records and deletes later segments.
    pub(super) fn truncate(&mut self, index: u64) -> io::Result<()> {
        // Purged entries are committed, and committed entries are never truncated.
        assert!(
            self.meta.last_purged.is_none_or(|purged| index > purged.index),
            "truncation at {index} of purged entries (purged up to {:?})",
            self.meta.last_purged
        );
        self.sync_written()?;
        let Some((_, (_, seq, offset))) = self.entries.range(index..).next() else { return Ok(()) };
        let (seq, offset) = (*seq, *offset);
        let mut removed = false;
        while self.segments.last().is_some_and(|s| s.seq > seq) {
            let segment = self.segments.pop().expect("checked");
            self.disk.remove(&segment_path(&self.dir, segment.seq))?;
            removed = true;
        }
        if removed {
            self.disk.sync_dir(&self.dir)?;
        }
        let segment = self.segments.last_mut().expect("the entry's segment");
        if segment.len > offset {
            segment.file.write_at(&vec![0; (segment.len - offset) as usize], offset)?;
            segment.file.sync_data()?;
            segment.len = offset;
        }
        self.entries.split_off(&index);
        segment.last_index = self.entries.keys().next_back().copied().filter(|_| segment.len > 0);
        if self.committed.is_some_and(|c| c.index >= index) {
            self.committed = self.entries.values().next_back().map(|(e, _, _)| e.log_id);
        }
        // What is left was durable before the truncation (gate 4 synced it): the durable log
        // id moves back to the log's new end, the one write that may move it back.
        let upto = self.last_log_id();
        assert!(
            upto.is_none_or(|u| self.durable.is_some_and(|d| d.index >= u.index)),
            "truncation left entries up to {upto:?} of which only {:?} are durable",
            self.durable
        );
        self.publish_durable(upto);
        Ok(())
    }

    /// Records `log_id` as purged (durably), forgets the entries up to it, and deletes every
    /// segment but the active one whose entries are all purged.
    pub(super) fn purge(&mut self, log_id: LogId) -> io::Result<()> {
        assert!(
            self.meta.last_purged.is_none_or(|purged| purged.index <= log_id.index),
            "a purge back to {log_id} after one to {:?}",
            self.meta.last_purged
        );
        self.sync_written()?;
        // Gate 4 synced what a leader wrote: the purge drops no entry that is not durable (it
        // may go past the log's end: a follower that installs a snapshot purges up to it).
        let last_dropped = self.entries.range(..=log_id.index).next_back().map(|(index, _)| *index);
        assert!(
            last_dropped.is_none_or(|last| self.durable.is_some_and(|d| d.index >= last)),
            "a purge to {log_id} drops entry {last_dropped:?}, not durable (durable: {:?})",
            self.durable
        );
        self.meta.last_purged = Some(log_id);
        self.save_meta()?;
        self.entries = self.entries.split_off(&(log_id.index + 1));
        let keep_from = self.segments.len().saturating_sub(1);
        let mut deleted = 0;
        for segment in &self.segments[..keep_from] {
            if segment.last_index.is_some_and(|last| last > log_id.index) {
                break;
            }
            self.disk.remove(&segment_path(&self.dir, segment.seq))?;
            deleted += 1;
        }
        self.segments.drain(..deleted);
        Ok(())
    }
}
