//! Consensus: everything that touches openraft. [`consensus::Consensus`] is the seam the rest of
//! the server uses (propose, linearizable reads, lease refresh, status, membership, peer RPC as
//! bytes); behind it are the log store, the state machine adapter, the snapshot store, the peer
//! network, the group-commit proposer, the leadership watcher, the read barrier, the leader
//! clock and the replica.
//!
//! openraft is used only inside this module (the tidy test checks it), so that a move to
//! openraft 0.10 stays local.

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

/// Runs blocking disk work (an fsync) from async code: on a multi-thread runtime the worker hands
/// its other tasks to another thread first; on a current-thread runtime (simulations with paused
/// time) it simply runs.
pub(crate) fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}
