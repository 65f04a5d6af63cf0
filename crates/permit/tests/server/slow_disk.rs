//! A slow disk: every log fdatasync takes 500 ms longer (`slow_log_sync`). Requests that do not
//! write are answered while a write waits for its fsync, with two worker threads (the fsync runs
//! in place on openraft's core task and blocks one of them) and with one, the default (the first
//! slow fsync ran in place and stopped every request, the node's first write at startup here;
//! since then the log's writes hand that worker's tasks to another thread first).

use std::time::{Duration, Instant};

use crate::common::Server;
use crate::Api;

/// Longest a read may take while a write waits for the disk: well under the injected 500 ms.
const READ_MAX: Duration = Duration::from_millis(250);

#[tokio::test]
async fn requests_that_do_not_write_are_answered_while_a_log_fsync_is_slow() {
    for workers in ["2", "1"] {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start_with_env(
            &dir.path().join("d"),
            "127.0.0.1:0",
            &["--worker-threads", workers],
            &[("PERMIT_INJECT_BUG", "slow_log_sync")],
        );
        let api = Api::new(&server);
        api.session(60_000).await; // a first write: the node leads and has committed
        let write = tokio::spawn({
            let api = api.clone();
            async move { api.semaphore("slow", 1).await }
        });
        let started = Instant::now();
        let mut reads = 0;
        while !write.is_finished() {
            assert!(started.elapsed() < Duration::from_secs(30), "the write did not end");
            let read = Instant::now();
            let metrics = api.http.get(format!("{}/metrics", api.url)).send().await.unwrap();
            assert_eq!(metrics.status(), 200);
            let health = api.http.get(format!("{}/v1/health/live", api.url)).send().await.unwrap();
            assert_eq!(health.status(), 200);
            assert!(
                read.elapsed() < READ_MAX,
                "{workers} worker(s): a read waited {:?} for the log's fsync",
                read.elapsed()
            );
            reads += 1;
        }
        write.await.unwrap();
        assert!(
            reads >= 5,
            "{workers} worker(s): only {reads} reads while the write waited 500 ms for its fsync"
        );
    }
}
