//! A simulated disk for the nodes' Raft logs and snapshots
//! ([`permit_server::raft::disk::Disk`]), in memory,
//! with the storage faults the nemesis injects: power cuts that tear what was not synced,
//! fsyncs that fail, fsyncs that hang, and (for the simulation's self-test) a disk that lies
//! about fsync.
//!
//! It keeps, per file, what reads see (the page cache) and what is durable, with the writes
//! made since the last `sync_data`; and per directory, the names as they are and as they were
//! at its last `sync_dir`. A node crash (a process's) keeps all of it; a power cut keeps the
//! durable part of each file plus a torn part of its unsynced writes, and the names as of each
//! directory's last sync. The writes of a node that was running when the power went are refused
//! from then on: each run of a node mounts the disk ([`SimDisk::mount`]), and a power cut ends
//! every mount made before it.
//!
//! Directories made by `create_dir_all` are durable at once (the log syncs its directory and
//! that directory's entry before it is used). Blocking work runs in place
//! ([`Blocking::InPlace`]): the simulation runs on one thread, and a seed replays the same way.

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use permit_server::raft::disk::{Blocking, Disk, DiskFile, Open, SyncReady};

/// Syncs of segment files remembered for a lying disk to take back.
const LIE_SYNCS_MAX: usize = 64;

/// One node's disk, kept across its restarts.
#[derive(Clone, Default)]
pub struct SimDisk {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    /// Woken when hung fsyncs answer again (disarmed, or by a power cut).
    released: tokio::sync::Notify,
}

#[derive(Default)]
struct State {
    /// Power cuts so far: a mount made before the last one is dead.
    generation: u64,
    /// File names as they are, and as the last sync of their directory left them.
    names: BTreeMap<PathBuf, u64>,
    durable_names: BTreeMap<PathBuf, u64>,
    dirs: BTreeSet<PathBuf>,
    files: BTreeMap<u64, SimFileState>,
    next_inode: u64,
    /// Held locks, with the generation of the mount that holds them.
    locks: BTreeMap<PathBuf, u64>,
    /// The next `sync_data` fails: `Some(true)` with the writes it was to sync left in the file,
    /// `Some(false)` with them gone.
    fail_next_sync: Option<bool>,
    /// Syncs hang ([`Disk::sync_ready`] waits) until disarmed or a power cut.
    hung: bool,
    /// A lying disk: the next power cut also takes back this many of the last syncs of segment
    /// files.
    lie: usize,
    /// The last syncs of segment files, newest last: the file, and what each sync changed
    /// (the bytes it replaced at an offset, and the length before).
    synced: VecDeque<SyncedWrites>,
}

/// One sync of a segment file, as a lying disk can take it back: the file, the bytes each write
/// replaced (at its offset), and the file's durable length before.
type SyncedWrites = (u64, Vec<(u64, Vec<u8>)>, usize);

#[derive(Default)]
struct SimFileState {
    /// The name it was made under (a lying disk lies about segment files only).
    path: PathBuf,
    /// What reads see.
    data: Vec<u8>,
    /// What survives a power cut.
    durable: Vec<u8>,
    /// Writes since the last sync, oldest first: offset and bytes.
    pending: Vec<(u64, Vec<u8>)>,
}

/// Writes `bytes` at `offset` into `image`, extending it with zeros as needed.
fn apply(image: &mut Vec<u8>, offset: u64, bytes: &[u8]) {
    let (at, end) = (offset as usize, offset as usize + bytes.len());
    if image.len() < end {
        image.resize(end, 0);
    }
    image[at..end].copy_from_slice(bytes);
}

/// What a power cut did to the disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PowerCut {
    /// Unsynced writes lost in whole or in part.
    pub torn_writes: usize,
    /// Syncs a lying disk took back.
    pub lied_syncs: usize,
}

impl SimDisk {
    /// A new, empty disk.
    pub fn new() -> SimDisk {
        SimDisk::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().expect("disk lock")
    }

    /// The disk as one run of a node sees it: refused from the next power cut on.
    pub fn mount(&self) -> Arc<dyn Disk> {
        let generation = self.lock().generation;
        Arc::new(Mount { shared: self.shared.clone(), generation })
    }

    /// Makes the next fsync (`sync_data`) fail; `written`: the writes it was to sync stay in the
    /// file (unsynced), else they are gone from it too.
    pub fn fail_next_sync(&self, written: bool) {
        self.lock().fail_next_sync = Some(written);
    }

    /// From now on fsyncs hang, until [`SimDisk::disarm`] or [`SimDisk::power_cut`].
    pub fn hang_syncs(&self) {
        self.lock().hung = true;
    }

    /// Disarms the faults that have not fired; hung fsyncs answer.
    pub fn disarm(&self) {
        let mut state = self.lock();
        state.fail_next_sync = None;
        state.hung = false;
        drop(state);
        self.shared.released.notify_waiters();
    }

    /// Makes the disk lie about fsync: the next power cut also takes back the last `syncs` syncs
    /// of the log's segment files. Raft cannot survive that; the simulation's self-test uses it
    /// to show that its checkers notice.
    pub fn lie_about_fsync(&self, syncs: usize) {
        self.lock().lie = syncs;
    }

    /// The power goes: every mount made before is refused from now on, and each file keeps its
    /// durable part plus a torn part of its unsynced writes: the first `keep` of them whole, then
    /// one torn (which way depends on `keep` and their count, as sectors reach a disk in any
    /// order): not at all with the writes after it whole, its first half only with the writes
    /// after it whole, or its first half only and none after it. Names are as their directory's
    /// last sync left them. Faults armed are disarmed.
    pub fn power_cut(&self, keep: usize) -> PowerCut {
        let mut state = self.lock();
        state.generation += 1;
        state.locks.clear();
        state.fail_next_sync = None;
        state.hung = false;
        let mut cut = PowerCut::default();
        // A lying disk: syncs taken back, newest first, so the files are as they were before.
        let lie = std::mem::take(&mut state.lie);
        for _ in 0..lie {
            let Some((inode, replaced, len)) = state.synced.pop_back() else { break };
            if let Some(file) = state.files.get_mut(&inode) {
                for (offset, bytes) in replaced.iter().rev() {
                    apply(&mut file.durable, *offset, bytes);
                }
                file.durable.truncate(len);
                cut.lied_syncs += 1;
            }
        }
        state.synced.clear();
        for file in state.files.values_mut() {
            let pending = std::mem::take(&mut file.pending);
            let mut image = std::mem::take(&mut file.durable);
            let count = pending.len();
            for (n, (offset, bytes)) in pending.iter().enumerate() {
                if n < keep {
                    apply(&mut image, *offset, bytes);
                    continue;
                }
                let half = &bytes[..bytes.len() / 2];
                let mode = (keep + count) % 3;
                if n == keep {
                    if mode != 0 {
                        apply(&mut image, *offset, half);
                    }
                    if mode == 2 {
                        cut.torn_writes += count - keep;
                        break;
                    }
                    cut.torn_writes += 1;
                    continue;
                }
                apply(&mut image, *offset, bytes);
            }
            file.data = image.clone();
            file.durable = image;
        }
        state.names = state.durable_names.clone();
        let live: BTreeSet<u64> = state.names.values().copied().collect();
        state.files.retain(|inode, _| live.contains(inode));
        drop(state);
        self.shared.released.notify_waiters();
        cut
    }
}

/// One run's view of a [`SimDisk`] (see [`SimDisk::mount`]).
struct Mount {
    shared: Arc<Shared>,
    generation: u64,
}

impl fmt::Debug for Mount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDisk").field("generation", &self.generation).finish_non_exhaustive()
    }
}

fn not_found(path: &Path) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("{}: no such file (simulated disk)", path.display()))
}

impl Mount {
    /// The disk's state, unless the power went since this mount.
    fn state(&self) -> io::Result<MutexGuard<'_, State>> {
        let state = self.shared.state.lock().expect("disk lock");
        if state.generation != self.generation {
            return Err(io::Error::other("the disk lost power (simulated)"));
        }
        Ok(state)
    }

    fn file(&self, inode: u64) -> Arc<dyn DiskFile> {
        Arc::new(SimFile { shared: self.shared.clone(), generation: self.generation, inode })
    }
}

impl Disk for Mount {
    fn blocking(&self) -> Blocking {
        Blocking::InPlace
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.state()?.dirs.insert(dir.to_owned());
        Ok(())
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let mut state = self.state()?;
        if state.locks.contains_key(path) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        state.locks.insert(path.to_owned(), self.generation);
        Ok(Box::new(SimLock {
            shared: self.shared.clone(),
            path: path.to_owned(),
            generation: self.generation,
        }))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let state = self.state()?;
        if !state.dirs.contains(dir) {
            return Err(not_found(dir));
        }
        Ok(state
            .names
            .keys()
            .filter(|path| path.parent() == Some(dir))
            .filter_map(|path| path.file_name().map(|name| name.to_string_lossy().into_owned()))
            .collect())
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let state = self.state()?;
        let inode = state.names.get(path).ok_or_else(|| not_found(path))?;
        Ok(state.files[inode].data.clone())
    }

    fn open(&self, path: &Path, how: Open) -> io::Result<Arc<dyn DiskFile>> {
        let mut state = self.state()?;
        let existing = state.names.get(path).copied();
        match how {
            Open::Existing => return existing.map(|inode| self.file(inode)).ok_or_else(|| not_found(path)),
            Open::CreateNew if existing.is_some() => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{}: exists (simulated disk)", path.display()),
                ))
            }
            Open::CreateNew | Open::Truncate => {}
        }
        if !path.parent().is_some_and(|dir| state.dirs.contains(dir)) {
            return Err(not_found(path));
        }
        // A new file under the name (a truncation replaces the file: what it held is gone
        // either way, and the name is durable at the next sync of its directory).
        let inode = state.next_inode;
        state.next_inode += 1;
        state.files.insert(inode, SimFileState { path: path.to_owned(), ..SimFileState::default() });
        state.names.insert(path.to_owned(), inode);
        Ok(self.file(inode))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.state()?;
        let inode = state.names.remove(from).ok_or_else(|| not_found(from))?;
        state.names.insert(to.to_owned(), inode);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        self.state()?.names.remove(path).map(|_| ()).ok_or_else(|| not_found(path))
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut state = self.state()?;
        let state = &mut *state;
        state.durable_names.retain(|path, _| path.parent() != Some(dir));
        for (path, inode) in state.names.iter().filter(|(path, _)| path.parent() == Some(dir)) {
            state.durable_names.insert(path.clone(), *inode);
        }
        // A file no name holds, durable or not, is gone.
        let live: BTreeSet<u64> = state.names.values().chain(state.durable_names.values()).copied().collect();
        state.files.retain(|inode, _| live.contains(inode));
        Ok(())
    }

    fn sync_ready(&self) -> SyncReady<'_> {
        Box::pin(async move {
            loop {
                let released = self.shared.released.notified();
                tokio::pin!(released);
                released.as_mut().enable();
                if !self.state()?.hung {
                    return Ok(());
                }
                released.await;
            }
        })
    }
}

/// A file of a [`Mount`].
struct SimFile {
    shared: Arc<Shared>,
    generation: u64,
    inode: u64,
}

impl fmt::Debug for SimFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimFile").field("inode", &self.inode).finish_non_exhaustive()
    }
}

impl SimFile {
    /// Runs `f` on the file's state, unless the power went since its mount.
    fn with<R>(&self, f: impl FnOnce(&mut State, u64) -> io::Result<R>) -> io::Result<R> {
        let mut state = self.shared.state.lock().expect("disk lock");
        if state.generation != self.generation {
            return Err(io::Error::other("the disk lost power (simulated)"));
        }
        if !state.files.contains_key(&self.inode) {
            return Err(io::Error::other("a file that is gone (simulated disk)"));
        }
        f(&mut state, self.inode)
    }
}

impl DiskFile for SimFile {
    fn read_all(&self) -> io::Result<Vec<u8>> {
        self.with(|state, inode| Ok(state.files[&inode].data.clone()))
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.with(|state, inode| {
            let file = state.files.get_mut(&inode).expect("checked");
            apply(&mut file.data, offset, bytes);
            file.pending.push((offset, bytes.to_vec()));
            Ok(())
        })
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        self.with(|state, inode| {
            let file = state.files.get_mut(&inode).expect("checked");
            let from = file.data.len() as u64;
            if len > from {
                let zeros = vec![0; (len - from) as usize];
                apply(&mut file.data, from, &zeros);
                file.pending.push((from, zeros));
            }
            Ok(())
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with(|state, inode| {
            if let Some(written) = state.fail_next_sync.take() {
                let file = state.files.get_mut(&inode).expect("checked");
                if !written {
                    // The kernel dropped the pages it could not write back.
                    file.data = file.durable.clone();
                    file.pending.clear();
                }
                return Err(io::Error::other("injected fsync failure (simulated disk)"));
            }
            let file = state.files.get_mut(&inode).expect("checked");
            let len = file.durable.len();
            let mut replaced = Vec::new();
            for (offset, bytes) in std::mem::take(&mut file.pending) {
                let at = (offset as usize).min(file.durable.len());
                let end = (offset as usize + bytes.len()).min(file.durable.len());
                replaced.push((at as u64, file.durable[at..end].to_vec()));
                apply(&mut file.durable, offset, &bytes);
            }
            let segment = file.path.extension().is_some_and(|ext| ext == "seg");
            if segment && !replaced.is_empty() {
                state.synced.push_back((inode, replaced, len));
                if state.synced.len() > LIE_SYNCS_MAX {
                    state.synced.pop_front();
                }
            }
            Ok(())
        })
    }
}

/// A lock of a [`Mount`]: let go when dropped, unless the power went since (the lock went with
/// it, and may be another run's now).
struct SimLock {
    shared: Arc<Shared>,
    path: PathBuf,
    generation: u64,
}

impl Drop for SimLock {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if state.locks.get(&self.path) == Some(&self.generation) {
            state.locks.remove(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        PathBuf::from("/sim/raft-log")
    }

    /// A disk with `dir()` made, a mount of it, and file `name` in it with `synced` written and
    /// synced, its name synced too.
    fn with_file(name: &str, synced: &[u8]) -> (SimDisk, Arc<dyn Disk>, Arc<dyn DiskFile>) {
        let disk = SimDisk::new();
        let mount = disk.mount();
        mount.create_dir_all(&dir()).unwrap();
        let file = mount.open(&dir().join(name), Open::CreateNew).unwrap();
        file.write_at(synced, 0).unwrap();
        file.sync_data().unwrap();
        mount.sync_dir(&dir()).unwrap();
        (disk, mount, file)
    }

    fn read(disk: &SimDisk, name: &str) -> io::Result<Vec<u8>> {
        disk.mount().read(&dir().join(name))
    }

    #[test]
    fn a_power_cut_keeps_what_was_synced_and_tears_what_was_not() {
        // Three unsynced writes after a synced one; `keep` and their count choose the tear.
        let cases: [(usize, &[u8]); 4] = [
            // (0 + 3) % 3 = 0: the first unsynced write lost whole, the ones after it kept.
            (0, b"SSSS\0\0\0\0bbbbcccc"),
            // (1 + 3) % 3 = 1: the second one's first half only, the one after it kept.
            (1, b"SSSSaaaabb\0\0cccc"),
            // (2 + 3) % 3 = 2: the third one's first half only, nothing after it.
            (2, b"SSSSaaaabbbbcc"),
            // All kept.
            (3, b"SSSSaaaabbbbcccc"),
        ];
        for (keep, expected) in cases {
            let (disk, _mount, file) = with_file("0.seg", b"SSSS");
            for (n, bytes) in [b"aaaa", b"bbbb", b"cccc"].iter().enumerate() {
                file.write_at(*bytes, 4 + 4 * n as u64).unwrap();
            }
            assert_eq!(read(&disk, "0.seg").unwrap(), b"SSSSaaaabbbbcccc", "reads see every write");
            let cut = disk.power_cut(keep);
            assert_eq!(read(&disk, "0.seg").unwrap(), expected, "keep {keep}");
            assert_eq!(cut.torn_writes > 0, keep < 3, "keep {keep}: {cut:?}");
        }
    }

    #[test]
    fn names_are_durable_after_their_directory_is_synced() {
        let (disk, mount, _file) = with_file("meta", b"old");
        let tmp = mount.open(&dir().join("meta.tmp"), Open::Truncate).unwrap();
        tmp.write_at(b"new", 0).unwrap();
        tmp.sync_data().unwrap();
        mount.rename(&dir().join("meta.tmp"), &dir().join("meta")).unwrap();
        mount.open(&dir().join("1.seg"), Open::CreateNew).unwrap();
        assert_eq!(read(&disk, "meta").unwrap(), b"new");
        disk.power_cut(0);
        assert_eq!(read(&disk, "meta").unwrap(), b"old", "the rename was not synced");
        assert_eq!(read(&disk, "1.seg").unwrap_err().kind(), io::ErrorKind::NotFound);

        let mount = disk.mount();
        let tmp = mount.open(&dir().join("meta.tmp"), Open::Truncate).unwrap();
        tmp.write_at(b"new", 0).unwrap();
        tmp.sync_data().unwrap();
        mount.rename(&dir().join("meta.tmp"), &dir().join("meta")).unwrap();
        mount.sync_dir(&dir()).unwrap();
        disk.power_cut(0);
        assert_eq!(read(&disk, "meta").unwrap(), b"new", "synced");
        assert_eq!(disk.mount().list(&dir()).unwrap(), vec!["meta".to_owned()]);
    }

    #[test]
    fn a_failed_fsync_makes_nothing_durable_and_may_drop_the_writes() {
        for written in [true, false] {
            let (disk, _mount, file) = with_file("0.seg", b"SSSS");
            file.write_at(b"aaaa", 4).unwrap();
            disk.fail_next_sync(written);
            assert!(file.sync_data().is_err(), "the armed fsync fails");
            let expected: &[u8] = if written { b"SSSSaaaa" } else { b"SSSS" };
            assert_eq!(read(&disk, "0.seg").unwrap(), expected, "written: {written}");
            disk.power_cut(1);
            assert_eq!(read(&disk, "0.seg").unwrap(), expected, "a sync failed, not a cut: {written}");
        }
    }

    #[test]
    fn a_power_cut_ends_the_mounts_before_it_and_their_locks() {
        let (disk, mount, file) = with_file("0.seg", b"SSSS");
        let lock = mount.lock(&dir().join("lock")).unwrap();
        assert_eq!(disk.mount().lock(&dir().join("lock")).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        disk.power_cut(0);
        assert!(file.write_at(b"late", 4).is_err(), "a write of the run the power cut ended");
        assert!(mount.open(&dir().join("1.seg"), Open::CreateNew).is_err());
        let again = disk.mount().lock(&dir().join("lock")).expect("the lock went with the power");
        drop(lock);
        assert_eq!(disk.mount().lock(&dir().join("lock")).unwrap_err().kind(), io::ErrorKind::WouldBlock);
        drop(again);
        assert_eq!(read(&disk, "0.seg").unwrap(), b"SSSS");
    }

    #[test]
    fn hung_fsyncs_wait_until_disarmed_or_the_power_goes() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let (disk, mount, _file) = with_file("0.seg", b"SSSS");
            mount.sync_ready().await.expect("not hung");
            for cut in [false, true] {
                let mount = disk.mount();
                disk.hang_syncs();
                let waiting = tokio::spawn(async move { mount.sync_ready().await });
                tokio::task::yield_now().await;
                assert!(!waiting.is_finished(), "hung");
                if cut {
                    disk.power_cut(0);
                } else {
                    disk.disarm();
                }
                assert_eq!(waiting.await.unwrap().is_ok(), !cut, "cut: {cut}");
            }
        });
    }

    #[test]
    fn a_lying_disk_takes_back_synced_writes_of_segments() {
        let (disk, _mount, file) = with_file("0.seg", b"SSSS");
        for (n, bytes) in [b"aaaa", b"bbbb", b"cccc"].iter().enumerate() {
            file.write_at(*bytes, 4 + 4 * n as u64).unwrap();
            file.sync_data().unwrap();
        }
        disk.lie_about_fsync(2);
        let cut = disk.power_cut(0);
        assert_eq!(cut.lied_syncs, 2);
        assert_eq!(read(&disk, "0.seg").unwrap(), b"SSSSaaaa");
    }
}
