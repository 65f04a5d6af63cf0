//! openraft's own storage test suite, run against the redb log store and Permit's state machine.

use std::sync::Arc;

use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use permit_server::notify::Notifier;
use permit_server::raft::log_store::LogStore;
use permit_server::raft::replica::Replica;
use permit_server::raft::snapshot_store::SnapshotStore;
use permit_server::raft::state_machine::StateMachine;
use permit_server::raft::TypeConfig;
use tokio::sync::Notify;

struct RedbBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for RedbBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(&dir.path().join("raft-log.redb")).expect("open log");
        let snapshots = SnapshotStore::open(&dir.path().join("snapshots")).expect("snapshot dir");
        let machine = StateMachine::new(
            Arc::new(Replica::default()),
            Notifier::new(),
            snapshots,
            Arc::new(Notify::new()),
        );
        Ok((dir, log, machine))
    }
}

#[test]
fn redb_log_store_and_state_machine_pass_openraft_suite() {
    Suite::test_all(RedbBuilder).expect("openraft storage suite");
}
