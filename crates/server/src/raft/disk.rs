//! The storage I/O of the Raft log (`raft/log/`) and of the snapshot files
//! (`snapshot_store.rs`), behind one narrow trait: [`Disk`] and the files it opens
//! ([`DiskFile`]). The server runs on [`OsDisk`], the operating system's files;
//! the simulation (`crates/sim`, `disk.rs`) runs on a simulated disk that keeps, per file, what
//! was written and what is durable, and injects power cuts, torn tails and failed or hung
//! fsyncs.
//!
//! # The contract: what is durable after which call
//! - A write ([`DiskFile::write_at`], [`DiskFile::allocate`]) changes what reads see at once,
//!   and is durable only once a later [`DiskFile::sync_data`] of the same file returned `Ok`. A
//!   power cut keeps what was durable and may keep any part of the writes since (whole, none,
//!   some sectors of one): the log's open repairs such a torn tail.
//! - A failed `sync_data` makes nothing durable, and the writes it was to sync may be gone from
//!   the file too (the kernel may drop the pages it could not write back): a store latches the
//!   failure and never syncs again.
//! - A name made or changed in a directory ([`Disk::open`] with [`Open::CreateNew`] or
//!   [`Open::Truncate`], [`Disk::rename`], [`Disk::remove`]) is durable only once a later
//!   [`Disk::sync_dir`] of that directory returned `Ok`. Directories made by
//!   [`Disk::create_dir_all`] become durable with a sync of their parent.
//! - [`Disk::sync_ready`] resolves once the disk takes a sync: at once for the operating
//!   system's files (an fsync that hangs there blocks in its call); a simulated disk whose
//!   fsyncs hang resolves it when they answer again, or fails it when it loses power. The log
//!   awaits it before a vote, a truncation or a purge, before an append's fsync (and its write,
//!   when a leader's appends are pending), and before a leader's sync beside replication, so
//!   that a hung disk holds them as a hung fsync would, without blocking the simulation's only
//!   thread. A sync that a write makes on its own way (a new segment, the `early` marker, a
//!   snapshot file) does not wait.
//! - [`Disk::blocking`] says how blocking work runs (the log's fsyncs beside replication,
//!   snapshot files): on other threads, or in place (a simulated disk, on the simulation's one
//!   thread, where runs must be deterministic).

use std::any::Any;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::future::Future;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

/// How a node runs blocking work: the log's fsyncs beside replication, snapshot files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blocking {
    /// On other threads (a blocking thread, a thread of its own, or the worker's after handing
    /// its tasks on with `block_in_place`, which needs a multi-thread runtime): the server's.
    Threads,
    /// In place, on the calling task: a simulated disk's, on the simulation's current-thread
    /// runtime, so that a seed replays the same way.
    InPlace,
}

impl Blocking {
    /// Runs `f`, blocking work, from async code: with [`Blocking::Threads`] the worker hands its
    /// other tasks to another thread first (`block_in_place`); in place otherwise.
    pub fn run<R>(self, f: impl FnOnce() -> R) -> R {
        match self {
            Blocking::Threads => tokio::task::block_in_place(f),
            Blocking::InPlace => f(),
        }
    }
}

/// How [`Disk::open`] opens a file, for reading and writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// A file that exists (`NotFound` otherwise).
    Existing,
    /// A new file (`AlreadyExists` if the name is taken).
    CreateNew,
    /// A new empty file under the name, replacing any file it names.
    Truncate,
}

/// The future of [`Disk::sync_ready`].
pub type SyncReady<'a> = Pin<Box<dyn Future<Output = io::Result<()>> + Send + 'a>>;

/// A disk the log stores its files on (see the module docs for what is durable when).
pub trait Disk: Debug + Send + Sync {
    /// How blocking work runs with this disk.
    fn blocking(&self) -> Blocking;

    /// Makes `dir` and its missing parents.
    ///
    /// # Errors
    /// As `std::fs::create_dir_all`.
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;

    /// Takes `path` (made if missing) exclusively while the returned guard lives: another
    /// process, or another holder in this one, is refused with [`io::ErrorKind::WouldBlock`].
    ///
    /// # Errors
    /// `WouldBlock` when it is held; other I/O failures.
    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>>;

    /// The names in `dir`.
    ///
    /// # Errors
    /// As `std::fs::read_dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;

    /// The content of file `path`.
    ///
    /// # Errors
    /// `NotFound` when there is none; other I/O failures.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;

    /// Opens file `path` for reading and writing.
    ///
    /// # Errors
    /// As [`Open`] says; other I/O failures.
    fn open(&self, path: &Path, how: Open) -> io::Result<Arc<dyn DiskFile>>;

    /// Renames `from` to `to`, replacing `to` (atomically).
    ///
    /// # Errors
    /// As `std::fs::rename`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Removes file `path`.
    ///
    /// # Errors
    /// As `std::fs::remove_file`.
    fn remove(&self, path: &Path) -> io::Result<()>;

    /// Makes the names in `dir` durable (fsync of the directory).
    ///
    /// # Errors
    /// When the sync fails.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;

    /// Resolves once the disk takes a sync (see the module docs).
    fn sync_ready(&self) -> SyncReady<'_> {
        Box::pin(std::future::ready(Ok(())))
    }
}

/// A file a [`Disk`] opened.
pub trait DiskFile: Debug + Send + Sync {
    /// The whole content.
    ///
    /// # Errors
    /// On an I/O failure.
    fn read_all(&self) -> io::Result<Vec<u8>>;

    /// Writes `bytes` at `offset` (not durable until [`DiskFile::sync_data`]).
    ///
    /// # Errors
    /// On an I/O failure (a full disk among them).
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()>;

    /// Makes the file at least `len` bytes long, allocated: a write within that length then
    /// changes no size, and a full disk fails here rather than at that write.
    ///
    /// # Errors
    /// On an I/O failure (a full disk among them).
    fn allocate(&self, len: u64) -> io::Result<()>;

    /// Makes what was written durable (`fdatasync(2)`).
    ///
    /// # Errors
    /// When the sync fails (see the module docs for what is left).
    fn sync_data(&self) -> io::Result<()>;

    /// Makes what was written durable, with all of the file's metadata (`fsync(2)`); as
    /// [`DiskFile::sync_data`] otherwise.
    ///
    /// # Errors
    /// When the sync fails.
    fn sync_all(&self) -> io::Result<()> {
        self.sync_data()
    }

    /// Starts writing `len` bytes at `offset` back to the disk, or with `wait`, waits until they
    /// are (`sync_file_range(2)`): a hint that spreads a large file's flush over its writes, not a
    /// durability barrier (a sync is). Nothing by default.
    ///
    /// # Errors
    /// On an I/O failure.
    fn write_back(&self, offset: u64, len: usize, wait: bool) -> io::Result<()> {
        let _ = (offset, len, wait);
        Ok(())
    }
}

/// The operating system's files.
#[derive(Debug, Clone, Copy, Default)]
pub struct OsDisk;

impl OsDisk {
    /// The operating system's files, as a [`Disk`].
    pub fn shared() -> Arc<dyn Disk> {
        Arc::new(OsDisk)
    }
}

impl Disk for OsDisk {
    fn blocking(&self) -> Blocking {
        Blocking::Threads
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn lock(&self, path: &Path) -> io::Result<Box<dyn Any + Send + Sync>> {
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        // SAFETY: flock on a descriptor owned by `file`; the lock goes with the descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = io::Error::last_os_error();
            return Err(if error.raw_os_error() == Some(libc::EWOULDBLOCK) {
                io::Error::from(io::ErrorKind::WouldBlock)
            } else {
                error
            });
        }
        Ok(Box::new(file))
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        std::fs::read_dir(dir)?
            .map(|item| item.map(|item| item.file_name().to_string_lossy().into_owned()))
            .collect()
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }

    fn open(&self, path: &Path, how: Open) -> io::Result<Arc<dyn DiskFile>> {
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        match how {
            Open::Existing => &mut options,
            Open::CreateNew => options.create_new(true),
            Open::Truncate => options.create(true).truncate(true),
        };
        Ok(Arc::new(OsFile(options.open(path)?)))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }
}

/// A file of [`OsDisk`].
#[derive(Debug)]
struct OsFile(File);

impl DiskFile for OsFile {
    fn read_all(&self) -> io::Result<Vec<u8>> {
        let mut data = vec![0; usize::try_from(self.0.metadata()?.len()).map_err(io::Error::other)?];
        self.0.read_exact_at(&mut data, 0)?;
        Ok(data)
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.0.write_all_at(bytes, offset)
    }

    fn allocate(&self, len: u64) -> io::Result<()> {
        // SAFETY: fallocate on a descriptor owned by `self`; mode 0 allocates and extends the size.
        let result = unsafe { libc::fallocate(self.0.as_raw_fd(), 0, 0, len as libc::off_t) };
        if result == 0 {
            return Ok(());
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
            // A file system without fallocate: a sparse file of the same size.
            return self.0.set_len(len);
        }
        Err(error)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.0.sync_all()
    }

    fn write_back(&self, offset: u64, len: usize, wait: bool) -> io::Result<()> {
        let flags = if wait {
            libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER
        } else {
            libc::SYNC_FILE_RANGE_WRITE
        };
        // SAFETY: the descriptor is open for the call's duration; the call reads no memory of ours.
        let result = unsafe { libc::sync_file_range(self.0.as_raw_fd(), offset as i64, len as i64, flags) };
        if result == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}
