//! The openraft glue: type configuration, log store, state machine adapter and peer network.
//!
//! openraft is used only inside this module, so that a move to openraft 0.10 stays local.

pub mod bounds;
pub mod log_store;
pub mod network;
pub mod snapshot_store;
pub mod state_machine;

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
        AsyncRuntime = openraft::TokioRuntime,
);

/// A Raft node of Permit.
pub type Raft = openraft::Raft<TypeConfig>;
/// Node ids are small integers chosen by the operator (`--id`); a single node is node 1.
pub type NodeId = u64;
/// A log id.
pub type LogId = openraft::LogId<NodeId>;
/// Raft metrics of a node.
pub type RaftMetrics = openraft::RaftMetrics<NodeId, openraft::BasicNode>;
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
