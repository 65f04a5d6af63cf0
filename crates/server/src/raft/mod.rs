//! Consensus: everything that touches openraft. [`consensus::Consensus`] is the seam the rest of
//! the server uses (propose, linearizable reads, lease refresh, status, membership, peer RPC as
//! bytes); behind it are the log store, the state machine adapter, the snapshot store, the peer
//! network, the group-commit proposer, the leadership watcher, the read barrier, the leader
//! clock and the replica.
//!
//! openraft is used only inside this module (the tidy test checks it), so that a move to
//! openraft 0.10 stays local.
//!
//! # Log I/O runs in place
//! The log store writes and fdatasyncs on the task that calls it, openraft's core task, and
//! block its worker thread meanwhile (`LogIo`). openraft 0.9 waits for every append (and
//! vote, truncate, purge) to be durable before it does anything else, so nothing of openraft's
//! could run in the meantime. Handing the worker to another thread for the fsync
//! (`block_in_place`) costs a cross-thread wake-up each way, more than the fsync's own stall
//! (`docs/performance.md`, *One worker thread*).
//!
//! The server runs one worker thread by default (`--worker-threads`), so an fsync in place
//! stops every request for its duration: on a healthy disk, less than the cross-thread
//! hand-offs it saves. A disk that turns slow must not stop them for longer, so
//! with one worker a log write that took `SLOW_LOG_IO` or more sends the writes of the next
//! `HAND_OFF_WINDOW` (renewed by every slow one) to another thread first, and the other
//! requests are answered meanwhile. A disk that hangs outright stops the node's requests: its
//! health checks stop answering, so a supervisor restarts it instead of keeping a node that
//! cannot write. With several workers the others answer requests while one is blocked.
//! Snapshot files, which can take seconds, are always written off the worker threads (a thread
//! of their own, or `disk::Blocking::run`).

pub(crate) mod bounds;
pub(crate) mod clock;
pub mod consensus;
pub(crate) mod contact;
pub mod disk;
pub(crate) mod identity;
pub(crate) mod leadership;
pub mod log;
pub(crate) mod membership;
pub(crate) mod network;
pub(crate) mod peer_rpc;
pub mod proposer;
pub(crate) mod read_barrier;
pub mod recover;
pub(crate) mod removal;
pub mod replica;
pub mod runtime;
pub mod snapshot_store;
pub mod state_machine;
pub(crate) mod status;
pub(crate) mod version;

use std::io::Cursor;
use std::time::{Duration, Instant};

use permit_core::{Batch, Outcome};

openraft::declare_raft_types!(
    /// Permit's Raft types: a log entry carries a [`Batch`] of commands and answers with one
    /// [`Outcome`] per command.
    pub TypeConfig:
        D = Batch,
        R = Vec<Outcome>,
        NodeId = u64,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = runtime::PermitRuntime,
);

/// A Raft node of Permit.
pub type Raft = openraft::Raft<TypeConfig>;
/// Node ids are small integers chosen by the operator (`--id`); a single node is node 1.
pub type NodeId = u64;
/// A log id.
pub(crate) type LogId = openraft::LogId<NodeId>;
/// Raft metrics of a node.
pub(crate) type RaftMetrics = openraft::RaftMetrics<NodeId, openraft::BasicNode>;
/// A peer network Raft can run on: the HTTP one (`network::Network`) or a simulation's.
pub trait PeerNetwork: openraft::network::RaftNetworkFactory<TypeConfig> {}
impl<N: openraft::network::RaftNetworkFactory<TypeConfig>> PeerNetwork for N {}
/// A storage error.
pub(crate) type StorageError = openraft::StorageError<NodeId>;

pub(crate) fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Fsyncs directory `dir` of `disk` and the directory that holds it (for `dir`'s own entry, when
/// it was just created): a store's open runs it before it is used (see `log`, `snapshot_store`).
pub(crate) fn sync_dir_and_its_entry(disk: &dyn disk::Disk, dir: &std::path::Path) -> std::io::Result<()> {
    disk.sync_dir(dir)?;
    match dir.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => disk.sync_dir(parent),
        _ => Ok(()),
    }
}

/// A log write (or fsync) that takes this long, on a node with one worker thread, hands the
/// writes of the next [`HAND_OFF_WINDOW`] to another thread (see the module docs). It lies above
/// a healthy disk's fdatasync, even one that waits behind a snapshot file's flush.
const SLOW_LOG_IO: Duration = Duration::from_millis(25);
/// How long log writes are handed off after the last slow one.
const HAND_OFF_WINDOW: Duration = Duration::from_secs(10);

/// Where the log store runs its durable writes: in place on the calling task (openraft's core
/// task), or handed to another thread ([`disk::Blocking::run`]) while the disk is slow on a node
/// with one worker thread. See the module docs. A disk whose blocking work runs in place (the
/// simulation's) always runs them in place.
#[derive(Debug)]
pub(crate) struct LogIo {
    /// Whether blocking work may go to other threads ([`disk::Disk::blocking`]).
    threads: bool,
    slow: Duration,
    window: Duration,
    /// Until when writes are handed off (after a slow one); `None`: in place.
    hand_off_until: std::sync::Mutex<Option<Instant>>,
}

impl LogIo {
    /// For a disk whose blocking work runs as `blocking` says.
    pub(crate) fn new(blocking: disk::Blocking) -> LogIo {
        LogIo {
            threads: blocking == disk::Blocking::Threads,
            ..LogIo::with_limits(SLOW_LOG_IO, HAND_OFF_WINDOW)
        }
    }

    fn with_limits(slow: Duration, window: Duration) -> LogIo {
        LogIo { threads: true, slow, window, hand_off_until: std::sync::Mutex::new(None) }
    }

    /// Runs `f`, one durable log write. Log writes are sequential (openraft issues the next
    /// only after this one returned), so the lock is never contended.
    pub(crate) fn run<R>(&self, f: impl FnOnce() -> R) -> R {
        let one_worker = self.threads
            && tokio::runtime::Handle::try_current().is_ok_and(|h| h.metrics().num_workers() == 1);
        if !one_worker {
            return f();
        }
        let started = Instant::now();
        let handing_off = {
            let mut until = self.lock();
            match *until {
                Some(end) if started < end => true,
                Some(_) => {
                    *until = None;
                    tracing::info!("no slow log write for a while: log writes run in place again");
                    false
                }
                None => false,
            }
        };
        let result = if handing_off { disk::Blocking::Threads.run(f) } else { f() };
        let ended = Instant::now();
        let took = ended - started;
        if took >= self.slow {
            if !handing_off {
                tracing::warn!(
                    took_ms = took.as_millis() as u64,
                    window_s = self.window.as_secs(),
                    "a log write was slow; log writes are handed to another thread while the disk is slow, so that requests are answered meanwhile"
                );
            }
            *self.lock() = Some(ended + self.window);
        }
        result
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.hand_off_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::LogIo;

    /// Runs `io` on a one-worker runtime: the log write waits up to `wait` for a message that
    /// only another task can send. Returns whether it came (the worker was free meanwhile).
    fn other_tasks_run_during(io: &std::sync::Arc<LogIo>, wait: Duration) -> bool {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let io = io.clone();
        runtime.block_on(async move {
            let (sender, receiver) = std::sync::mpsc::channel();
            let write = tokio::spawn(async move { io.run(|| receiver.recv_timeout(wait)) });
            // The only worker is inside `write` by now or soon; this task runs only if it is
            // free (or once `write` returned).
            let other = tokio::spawn(async move { sender.send(()) });
            let received = write.await.expect("the log write ends");
            let _ = other.await;
            received.is_ok()
        })
    }

    /// With one worker a log write runs in place (no other task runs meanwhile) until one is
    /// slow; then the writes of the next window are handed off, and other tasks run during
    /// them; after the window they run in place again.
    #[test]
    fn log_writes_on_one_worker_run_in_place_until_one_is_slow() {
        let window = Duration::from_millis(300);
        let io = std::sync::Arc::new(LogIo::with_limits(Duration::from_millis(50), window));
        // In place: the other task cannot run, so the write waits its whole 100 ms (slow).
        assert!(!other_tasks_run_during(&io, Duration::from_millis(100)), "ran in place");
        // Handed off now: the other task runs while the write waits.
        assert!(other_tasks_run_during(&io, Duration::from_secs(5)), "handed off after a slow write");
        // A fast write does not end the window; the window's end does.
        std::thread::sleep(window);
        assert!(!other_tasks_run_during(&io, Duration::from_millis(20)), "in place again");
    }
}
