//! Snapshot files: the latest snapshot of the state machine, written atomically.
//!
//! Layout: magic `PERMITSN`, format version (1 byte), CRC-32 of the rest (4 bytes LE), meta length
//! (4 bytes LE), the snapshot meta (postcard), then the state bytes (`State::encode_snapshot`).
//! A snapshot is written to a temporary file, fsynced, renamed over the old one, and the directory
//! is fsynced, so a crash leaves either the old snapshot or the new one. The file goes to the
//! disk a chunk at a time as it is written, so that the log's fsyncs wait behind one chunk,
//! not the whole file. Its files are on the log's [`Disk`] (the operating system's, or a
//! simulation's).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::SnapshotMeta;

use super::disk::{Disk, Open, OsDisk};
use super::log::LogError;
use super::NodeId;
use crate::failstop::FailStop;

const MAGIC: &[u8; 8] = b"PERMITSN";
const FILE_FORMAT_VERSION: u8 = 1;
const FILE_NAME: &str = "snapshot.bin";

/// Meta of a snapshot, as openraft defines it.
pub type Meta = SnapshotMeta<NodeId, openraft::BasicNode>;

/// The directory holding the current snapshot.
#[derive(Debug, Clone)]
pub struct SnapshotStore {
    disk: Arc<dyn Disk>,
    dir: PathBuf,
    /// Told about the first failed write; after it, no snapshot is written again.
    fail_stop: Option<Arc<FailStop>>,
}

impl SnapshotStore {
    /// Uses `dir` of the operating system's files, creating it if needed.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn open(dir: &Path) -> std::io::Result<SnapshotStore> {
        SnapshotStore::open_on(OsDisk::shared(), dir)
    }

    /// Uses `dir` of `disk`, creating it if needed.
    ///
    /// # Errors
    /// When the directory cannot be created.
    pub fn open_on(disk: Arc<dyn Disk>, dir: &Path) -> std::io::Result<SnapshotStore> {
        disk.create_dir_all(dir)?;
        // A crash between a save's rename and its directory fsync leaves the new snapshot in
        // the page cache only; the node loads it and purges its log up to it. Sync the
        // directory (and its own entry in the data dir) before either happens.
        super::sync_dir_and_its_entry(&*disk, dir)?;
        Ok(SnapshotStore { disk, dir: dir.to_owned(), fail_stop: None })
    }

    /// Reports write failures to `fail_stop`, and refuses every write once it has failed.
    pub(crate) fn with_fail_stop(mut self, fail_stop: Arc<FailStop>) -> SnapshotStore {
        self.fail_stop = Some(fail_stop);
        self
    }

    /// Writes `meta` and `state` as the current snapshot, durably.
    ///
    /// # Errors
    /// On any I/O failure; the previous snapshot is then still in place. The failure is
    /// reported to the fail-stop latch, and no later save is attempted (a failed fsync is never
    /// retried).
    pub fn save(&self, meta: &Meta, state: &[u8]) -> std::io::Result<()> {
        if self.fail_stop.as_ref().is_some_and(|latch| latch.is_failed()) {
            return Err(std::io::Error::other("refused after an earlier storage failure"));
        }
        let result = self.write(meta, state);
        if let (Err(e), Some(latch)) = (&result, &self.fail_stop) {
            latch.storage("snapshot write", &self.dir.join(FILE_NAME), &LogError::of(e));
        }
        result
    }

    fn write(&self, meta: &Meta, state: &[u8]) -> std::io::Result<()> {
        let bytes = encode(meta, state)?;
        let temp = self.dir.join(format!("{FILE_NAME}.tmp"));
        let file = self.disk.open(&temp, Open::Truncate)?;
        // A chunk at a time, each sent to the disk as it is written, and the one before waited
        // for: the log's fdatasyncs share the disk, and would otherwise wait behind the flush
        // of the whole file (tens of MB at 1 M sessions) at the `sync_all` below.
        let mut previous: Option<(u64, usize)> = None;
        for (at, chunk) in (0u64..).step_by(WRITEBACK_CHUNK).zip(bytes.chunks(WRITEBACK_CHUNK)) {
            file.write_at(chunk, at)?;
            file.write_back(at, chunk.len(), false)?;
            if let Some((at, len)) = previous.replace((at, chunk.len())) {
                file.write_back(at, len, true)?;
            }
        }
        file.sync_all()?;
        drop(file);
        self.disk.rename(&temp, &self.dir.join(FILE_NAME))?;
        self.disk.sync_dir(&self.dir)
    }

    /// Reads the current snapshot, if there is one.
    ///
    /// # Errors
    /// On I/O failure, or when the file is corrupt (bad magic, version or checksum).
    pub fn load(&self) -> std::io::Result<Option<(Meta, Vec<u8>)>> {
        let bytes = match self.disk.read(&self.dir.join(FILE_NAME)) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        decode(&bytes).map(Some)
    }
}

/// Bytes of a snapshot file sent to the disk at a time (see `SnapshotStore::write`).
const WRITEBACK_CHUNK: usize = 1 << 20;

/// The bytes of a snapshot file (also the format of a backup, `GET /v1/snapshot`).
///
/// # Errors
/// When the meta does not encode (never, in practice).
pub fn encode(meta: &Meta, state: &[u8]) -> std::io::Result<Vec<u8>> {
    let meta_bytes = postcard::to_allocvec(meta).map_err(super::io_error)?;
    let meta_len = u32::try_from(meta_bytes.len()).map_err(super::io_error)?;
    let mut body = Vec::with_capacity(4 + meta_bytes.len() + state.len());
    body.extend_from_slice(&meta_len.to_le_bytes());
    body.extend_from_slice(&meta_bytes);
    body.extend_from_slice(state);
    let mut bytes = Vec::with_capacity(13 + body.len());
    bytes.extend_from_slice(MAGIC);
    bytes.push(FILE_FORMAT_VERSION);
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

/// The meta and state bytes of a snapshot file.
///
/// # Errors
/// When the bytes are corrupt (bad magic, version, checksum or meta).
pub fn decode(bytes: &[u8]) -> std::io::Result<(Meta, Vec<u8>)> {
    let corrupt = |what: &str| std::io::Error::other(format!("snapshot file corrupt: {what}"));
    if bytes.len() < 17 || &bytes[..8] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    if bytes[8] != FILE_FORMAT_VERSION {
        return Err(std::io::Error::other(format!(
            "snapshot file format version {} is not the one this build reads ({FILE_FORMAT_VERSION}): a newer \
             build wrote it, or it is corrupt",
            bytes[8]
        )));
    }
    let crc = u32::from_le_bytes(bytes[9..13].try_into().expect("4 bytes"));
    let body = &bytes[13..];
    if crc32fast::hash(body) != crc {
        return Err(corrupt("checksum mismatch"));
    }
    let meta_len = u32::from_le_bytes(body[..4].try_into().expect("4 bytes")) as usize;
    let meta_end =
        4usize.checked_add(meta_len).filter(|end| *end <= body.len()).ok_or_else(|| corrupt("meta"))?;
    let meta: Meta = postcard::from_bytes(&body[4..meta_end]).map_err(super::io_error)?;
    Ok((meta, body[meta_end..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file of several writeback chunks, the last one partial, reads back byte for byte.
    #[test]
    fn a_snapshot_of_several_chunks_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = SnapshotStore::open(dir.path()).unwrap();
        let state: Vec<u8> = (0..WRITEBACK_CHUNK * 3 + 12_345).map(|i| (i % 251) as u8).collect();
        let meta = Meta { snapshot_id: "7-1-42".into(), ..Meta::default() };
        store.save(&meta, &state).unwrap();
        let (loaded_meta, loaded) = store.load().unwrap().expect("a snapshot");
        assert_eq!(loaded_meta, meta);
        assert_eq!(loaded, state);
        let on_disk = std::fs::metadata(dir.path().join(FILE_NAME)).unwrap().len();
        assert_eq!(on_disk, encode(&meta, &state).unwrap().len() as u64);
        assert!(!dir.path().join(format!("{FILE_NAME}.tmp")).exists());
    }
}
