//! Injected I/O errors: the sync shim (`PERMIT_FAIL_SYNC_AFTER`) makes every `fdatasync` and
//! `fsync` fail with `EIO` after the first N. The node answers 503 `storage_error` of kind `io`,
//! exits non-zero without retrying the fsync, and a restart without the shim recovers every
//! acknowledged write. Skipped with a message where `cc` is missing, unless
//! `PERMIT_REQUIRE_CC=1` (CI).

use std::time::Duration;

use super::full_disk::{assert_recovered, write_until_it_stops};
use super::sync_shim;
use crate::common::Server;

/// Syncs that succeed before the shim fails them all: enough to start and serve a while.
const SYNCS_BEFORE_FAILING: &str = "300";
/// Concurrent writers.
const WORKERS: usize = 4;
/// Longest the writers may run before the injected failure must have stopped them.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_failed_fsync_stops_the_node_without_a_retry_and_a_restart_recovers_everything() {
    let temp = tempfile::tempdir().unwrap();
    let Some(shim) = sync_shim::build(temp.path()) else { return };
    let data_dir = temp.path().join("data");
    let log = temp.path().join("failed-syncs.log");
    let (shim, log_path) = (shim.to_str().unwrap().to_owned(), log.to_str().unwrap().to_owned());
    let env = [
        ("LD_PRELOAD", shim.as_str()),
        ("PERMIT_FAIL_SYNC_AFTER", SYNCS_BEFORE_FAILING),
        ("PERMIT_FAIL_SYNC_LOG", log_path.as_str()),
    ];
    let mut server = Server::start_with_env(&data_dir, "127.0.0.1:0", &[], &env);

    let (status, seen, acked) = write_until_it_stops(&mut server, WORKERS, WRITE_TIMEOUT).await;
    let status = status.expect("the node exits after a failed fsync");
    assert!(!status.success(), "a failed node exits non-zero: {status}");
    let (body, retry_after) = seen.storage_error.expect("health answered 503 storage_error before the exit");
    let detail = body["detail"].as_str().unwrap();
    // `raft-log`: the segment log's directory.
    assert!(detail.contains("raft-log") && detail.contains("os error 5"), "{detail}");
    assert_eq!(body["error"]["kind"], "io", "health names the failure's kind: {body}");
    assert!(retry_after.is_some(), "503 carries Retry-After");
    // Never retried: exactly one sync failed (the node wrote nothing after it).
    let failed = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(failed.lines().count(), 1, "a failed fsync is never retried: {failed:?}");

    assert!(!acked.sessions.is_empty(), "some writes were acknowledged before the failure");
    drop(server);
    let restarted = Server::start_in(&data_dir, "127.0.0.1:0", &[]);
    assert_recovered(&restarted, &acked).await;
}
