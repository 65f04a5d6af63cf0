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
//! The log stores write and fdatasync on the task that calls them, openraft's core task, and
//! block its worker thread meanwhile (`log_io`). openraft 0.9 waits for every append (and
//! vote, truncate, purge) to be durable before it does anything else, so nothing of openraft's
//! could run in the meantime; the server's other tasks run on the other worker threads
//! (tokio's default is one per core). Handing the worker to another thread for the fsync
//! (`block_in_place`) cost W2 11-15 % of its throughput on 2 cores (`docs/performance.md`,
//! *Log I/O in place*). With one worker thread (`--worker-threads 1`) it is handed off still,
//! so that a slow disk does not stop every request. Snapshot files, which can take seconds,
//! are always written off the worker threads (a thread of their own, or `blocking`).

pub mod bounds;
pub mod clock;
pub mod consensus;
pub mod leadership;
pub mod log_store;
pub mod membership;
pub mod network;
pub mod peer_rpc;
pub mod proposer;
pub mod read_barrier;
pub mod removal;
pub mod replica;
pub mod runtime;
pub mod segment_log;
pub mod snapshot_store;
pub mod state_machine;
pub mod status;
pub mod storage_faults;

use std::io::Cursor;

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
pub type LogId = openraft::LogId<NodeId>;
/// Raft metrics of a node.
pub type RaftMetrics = openraft::RaftMetrics<NodeId, openraft::BasicNode>;
/// A peer network Raft can run on: the HTTP one ([`network::Network`]) or a simulation's.
pub trait PeerNetwork: openraft::network::RaftNetworkFactory<TypeConfig> {}
impl<N: openraft::network::RaftNetworkFactory<TypeConfig>> PeerNetwork for N {}
/// A storage error.
pub type StorageError = openraft::StorageError<NodeId>;

pub(crate) fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

/// Runs a log store's write and fdatasync from openraft's core task: in place when other worker
/// threads can run the server's tasks meanwhile, else as [`blocking`] does (see the module docs).
pub(crate) fn log_io<R>(f: impl FnOnce() -> R) -> R {
    // A current-thread runtime has one worker too; `blocking` runs `f` in place there.
    let one_worker = tokio::runtime::Handle::try_current().is_ok_and(|h| h.metrics().num_workers() == 1);
    if one_worker {
        blocking(f)
    } else {
        f()
    }
}

/// Runs long blocking disk work (a snapshot file) from async code: on a multi-thread runtime the
/// worker hands its other tasks to another thread first; on a current-thread runtime
/// (simulations with paused time) it simply runs.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::log_io;

    /// With one worker thread, a log fsync that takes long must not stop the server's other
    /// tasks: here the log I/O waits for a message that only another task can send.
    #[test]
    fn log_io_hands_off_the_only_worker_thread() {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).build().expect("a runtime");
        let received = runtime.block_on(async {
            let (sender, receiver) = std::sync::mpsc::channel();
            let io = tokio::spawn(async move { log_io(|| receiver.recv_timeout(Duration::from_secs(2))) });
            // The only worker is inside `io` by now or soon; this task runs only if it is free.
            let other = tokio::spawn(async move { sender.send(()) });
            other.await.expect("the other task runs").expect("sent");
            io.await.expect("the log I/O ends")
        });
        assert_eq!(received, Ok(()));
    }
}
