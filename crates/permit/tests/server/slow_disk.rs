//! A slow disk: while a write waits for its log fsync, requests that do not write are answered,
//! with two worker threads (the fsync runs in place on openraft's core task and blocks one of
//! them) and with one, the default (once a log write was slow, the next ones hand that worker's
//! tasks to another thread first: see `raft/mod.rs`).
//!
//! The sync shim holds the fsyncs (`PERMIT_HOLD_SYNC_DIR`) until the test lets them go, so
//! nothing here depends on the machine's speed: a read that waited for the held fsync would not
//! be answered before the test released it.

use std::path::Path;
use std::time::Duration;

use super::sync_shim;
use crate::common::Server;
use crate::Api;

/// How long the first write's fsync is held: well past the server's threshold for a slow log
/// write (25 ms), so that the next writes are handed off on a one-worker node. A sleep lasts
/// at least this long on any machine.
const SLOW_SYNC: Duration = Duration::from_millis(250);
/// Reads of each kind asked for, and each answered, while the write's fsync is held.
const READS: usize = 5;
/// Bound on any one wait here; reached only when something is stuck behind a held fsync.
const STUCK: Duration = Duration::from_secs(30);

/// Runs `write` with every fsync held from the start (`hold` exists) until `while_held` returned,
/// and returns `while_held`'s result once the write ended (successfully).
async fn with_held_sync<T>(
    gate: &Path,
    write: tokio::task::JoinHandle<()>,
    while_held: impl AsyncFnOnce(&tokio::task::JoinHandle<()>) -> T,
) -> T {
    let (hold, held) = (gate.join("hold"), gate.join("held"));
    let reached = crate::common::eventually(STUCK, async || held.exists()).await;
    assert!(reached, "the write never reached its fsync");
    let result = while_held(&write).await;
    std::fs::remove_file(&hold).unwrap();
    tokio::time::timeout(STUCK, write).await.expect("the write ends once its fsync ran").unwrap();
    std::fs::remove_file(&held).unwrap();
    result
}

#[tokio::test]
async fn requests_that_do_not_write_are_answered_while_a_log_fsync_is_slow() {
    let temp = tempfile::tempdir().unwrap();
    let Some(shim) = sync_shim::build(temp.path()) else { return };
    for workers in ["2", "1"] {
        let gate = temp.path().join(format!("gate-{workers}"));
        std::fs::create_dir(&gate).unwrap();
        let env = [("LD_PRELOAD", shim.to_str().unwrap()), ("PERMIT_HOLD_SYNC_DIR", gate.to_str().unwrap())];
        let data_dir = temp.path().join(format!("data-{workers}"));
        let server = Server::start_with_env(&data_dir, "127.0.0.1:0", &["--worker-threads", workers], &env);
        let api = Api::new(&server);
        api.session(60_000).await; // a first write: the node leads and has committed

        // A slow write: its fsync is held for SLOW_SYNC.
        std::fs::write(gate.join("hold"), b"").unwrap();
        let slow = tokio::spawn({
            let api = api.clone();
            async move {
                api.session(60_000).await;
            }
        });
        with_held_sync(&gate, slow, async |_| tokio::time::sleep(SLOW_SYNC).await).await;

        // The next write's fsync is held until every read was answered.
        std::fs::write(gate.join("hold"), b"").unwrap();
        let write = tokio::spawn({
            let api = api.clone();
            async move { api.semaphore("slow", 1).await }
        });
        with_held_sync(&gate, write, async |write| {
            for _ in 0..READS {
                for path in ["/metrics", "/v1/health/live"] {
                    let read = api.http.get(format!("{}{path}", api.url)).timeout(STUCK).send().await;
                    let status = read.map(|r| r.status().as_u16());
                    assert!(
                        matches!(status, Ok(200)),
                        "{workers} worker(s): GET {path} while a log fsync is held: {status:?}"
                    );
                }
            }
            assert!(!write.is_finished(), "{workers} worker(s): a write was answered before its fsync");
        })
        .await;
    }
}
