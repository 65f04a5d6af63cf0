//! The open: reads every segment in order, checks each record (length, CRC, decoding, index:
//! see the module docs), repairs a torn tail of the last segment and refuses corruption before
//! it, makes what it read durable, and moves on the vote of a leader that reported appends early.
//!
//! A disk's bytes are input: what is wrong with them is an error (or a repaired tail), never an
//! assertion. What the open built from them is then asserted as the writes assert it
//! ([`Inner::check`]): the entries in memory are gapless and where the segments say.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;

use openraft::{Entry, LeaderId, Vote};

use super::codec::{decode, parse, peek_index, Parsed, KIND_COMMITTED, KIND_ENTRY};
use super::segment::segment_path;
use super::{Inner, LogError, LogSync, Meta, Segment, EARLY};
use crate::raft::disk::{Disk, Open};
use crate::raft::{LogId, NodeId, TypeConfig};

impl Inner {
    /// Opens the log in `dir` (see the module docs).
    pub(super) fn open(disk: Arc<dyn Disk>, dir: &Path) -> io::Result<Inner> {
        disk.create_dir_all(dir)?;
        let lock = disk.lock(&dir.join("lock")).map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                LogError::Locked { path: dir.join("lock") }.into()
            } else {
                e
            }
        })?;
        let meta = match disk.read(&dir.join("meta")) {
            Ok(bytes) => decode::<Meta>(&bytes).map_err(|e| LogError::in_file(dir.join("meta"), &e))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Meta::default(),
            Err(e) => return Err(e),
        };
        let mut seqs = Vec::new();
        for name in disk.list(dir)? {
            if let Some(seq) = name.strip_suffix(".seg").and_then(|s| u64::from_str_radix(s, 16).ok()) {
                seqs.push(seq);
            }
        }
        seqs.sort_unstable();
        let purged = meta.last_purged.map(|id| id.index);
        let mut inner = Inner {
            disk: disk.clone(),
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
            _lock: lock,
        };
        let mut previous: Option<u64> = None;
        // The highest feature version the entries read so far need: a raise
        // (`SetClusterVersion`) comes before every entry of its version, so an entry that does
        // not decode after one is named with the version to run.
        let mut needs = 1;
        for (n, &seq) in seqs.iter().enumerate() {
            let path = segment_path(dir, seq);
            let file = disk.open(&path, Open::Existing)?;
            let data = file.read_all()?;
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
                                    Err(e) => return Err(undecodable(&path, at, None, needs, &e)),
                                };
                                // Each entry follows the previous one, except across a
                                // purge: a follower that installs a snapshot beyond its log's
                                // end purges up to it and appends after it in this segment.
                                let follows = |p: u64| {
                                    index == p + 1
                                        || (index > p && purged.is_some_and(|q| p <= q && index <= q + 1))
                                };
                                if previous.is_some_and(|p| !follows(p)) {
                                    return Err(LogError::Corrupt {
                                        path,
                                        offset: at as u64,
                                        why: format!(
                                            "entry {index} follows entry {} (corrupt log)",
                                            previous.unwrap_or_default()
                                        ),
                                    }
                                    .into());
                                }
                                previous = Some(index);
                                last_index = Some(index);
                                if purged.is_none_or(|p| index > p) {
                                    let entry = match decode::<Entry<TypeConfig>>(body) {
                                        Ok(entry) if entry.log_id.index == index => entry,
                                        Ok(_) => break Some(format!("inconsistent entry at offset {at}")),
                                        Err(e) => return Err(undecodable(&path, at, Some(index), needs, &e)),
                                    };
                                    if let openraft::EntryPayload::Normal(batch) = &entry.payload {
                                        needs = needs.max(batch.feature_version());
                                    }
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
                    return Err(LogError::Corrupt {
                        path,
                        offset: at as u64,
                        why: format!("{why}, and later segments follow (corrupt log, not a torn tail)"),
                    }
                    .into());
                }
                // A torn tail: zero from the bad record to the last non-zero byte, then sync.
                let end = data.iter().rposition(|b| *b != 0).map_or(at, |p| p + 1);
                tracing::warn!(path = %path.display(), offset = at, bytes = end - at, "{why}: truncating a torn tail");
                file.write_at(&vec![0; end.saturating_sub(at)], at as u64)?;
                file.sync_data()?;
            }
            let allocated = data.len() as u64;
            inner.segments.push(Segment { seq, file, len: at as u64, allocated, last_index });
        }
        // A commit index beyond the log (its entries torn away) is not kept.
        let last = inner.entries.keys().next_back().copied().or(purged);
        if inner.committed.is_some_and(|c| last.is_none_or(|l| c.index > l)) {
            inner.committed = None;
        }
        inner.sync_what_was_read()?;
        inner.durable = inner.last_log_id();
        inner.step_down_if_it_reported_early()?;
        inner.check();
        Ok(inner)
    }

    /// Asserts what the writes keep true of the log read back: the entries in memory are
    /// gapless, each under its own index, after the last purged one, and in a segment that ends
    /// at or after it; the segments are in order and written within their preallocated space;
    /// the commit index hint is within the log and everything read is durable.
    fn check(&self) {
        let purged = self.meta.last_purged.map(|id| id.index);
        let mut previous: Option<&Entry<TypeConfig>> = None;
        for (&index, (entry, seq, offset)) in &self.entries {
            assert_eq!(entry.log_id.index, index, "entry {} kept under index {index}", entry.log_id);
            assert!(purged.is_none_or(|p| index > p), "entry {index} kept after a purge to {purged:?}");
            if let Some(previous) = previous {
                assert!(
                    index == previous.log_id.index + 1 && entry.log_id.leader_id >= previous.log_id.leader_id,
                    "entry {} read after {}",
                    entry.log_id,
                    previous.log_id
                );
            }
            let segment = self.segments.iter().find(|s| s.seq == *seq).expect("an entry's segment is open");
            assert!(*offset < segment.len, "entry {index} at offset {offset} past its segment's records");
            assert!(
                segment.last_index.is_some_and(|last| last >= index),
                "entry {index} past its segment's last"
            );
            previous = Some(entry);
        }
        for pair in self.segments.windows(2) {
            assert!(pair[0].seq < pair[1].seq, "segments out of order");
        }
        for segment in &self.segments {
            assert!(segment.len <= segment.allocated, "segment {} written past its size", segment.seq);
        }
        let last = self.last_log_id();
        assert!(
            self.committed.is_none_or(|c| last.is_some_and(|l| c.index <= l.index)),
            "commit index {:?} beyond the log's end {last:?}",
            self.committed
        );
        assert_eq!(self.durable, last, "an open log is durable to its end");
        assert!(self.unsynced.is_empty(), "an open log has nothing pending");
    }

    /// Makes what the open read durable before the log is used. A process that crashed while
    /// an append's fdatasync ran (or between `meta`'s rename and the directory's fsync) leaves
    /// data in the page cache that is not on the disk, and the open reads it from there: the
    /// node would count those entries as its log (and a leader would count them towards a
    /// quorum) while a power cut could still take them. Only the last segment can hold such
    /// data: a segment is started after the appends before it were synced.
    pub(super) fn sync_what_was_read(&self) -> io::Result<()> {
        if let Some(last) = self.segments.last() {
            last.file.sync_data()?;
        }
        crate::raft::sync_dir_and_its_entry(&*self.disk, &self.dir)
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
    pub(super) fn step_down_if_it_reported_early(&mut self) -> io::Result<()> {
        let (early, node) = match self.disk.read(&self.dir.join(EARLY)) {
            Ok(bytes) => {
                decode::<(u64, NodeId)>(&bytes).map_err(|e| LogError::in_file(self.dir.join(EARLY), &e))?
            }
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
}

/// The error for a record that is whole (its checksum matches) but does not decode: not a torn
/// write, which the checksum catches, but an entry of a newer build (one whose cluster version
/// this build does not speak) or corruption. Dropping it as a torn tail would drop an entry
/// that may be committed, and every one after it.
fn undecodable(
    path: &std::path::Path,
    at: usize,
    index: Option<u64>,
    needs: u32,
    error: &std::io::Error,
) -> std::io::Error {
    let entry = index.map_or_else(|| "an entry".to_owned(), |index| format!("entry {index}"));
    let speaks = crate::raft::version::speaks();
    let run = if needs > speaks {
        format!(
            "the log raised the cluster to feature version {needs} before it, and this build speaks \
             {speaks}: start this node with a build that speaks version {needs} or newer"
        )
    } else {
        format!(
            "a newer build wrote it (this one speaks feature version {speaks}), or the disk \
             corrupted it: start this node with the newest build that ran on it"
        )
    };
    LogError::Corrupt {
        path: path.to_owned(),
        offset: at as u64,
        why: format!("{entry} was written whole (its checksum matches) but does not decode ({error}); {run}"),
    }
    .into()
}
