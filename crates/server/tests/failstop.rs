//! A Raft core that stops without a shutdown fails the node (health `shutdown`, `serve` exits);
//! a shutdown does not. An open error names the path and the cause. `after_load` runs once a
//! start.

use std::time::Duration;

use permit_server::{Config, Node};
use permit_wire::NotReady;

fn config(dir: &std::path::Path) -> Config {
    Config { data_dir: dir.to_owned(), ..Config::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raft_core_that_stops_on_its_own_fails_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path()), "127.0.0.1:1".parse().unwrap()).await.unwrap();
    let early = tokio::time::timeout(Duration::from_millis(50), node.fatal()).await;
    assert!(early.is_err(), "failed before the core stopped: {early:?}");
    node.consensus().raft().shutdown().await.unwrap();
    let failure = tokio::time::timeout(Duration::from_secs(5), node.fatal()).await.expect("the node fails");
    assert_eq!(failure.reason, NotReady::Shutdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_is_not_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(config(dir.path()), "127.0.0.1:1".parse().unwrap()).await.unwrap();
    node.shutdown().await;
    let failed = tokio::time::timeout(Duration::from_millis(500), node.fatal()).await;
    assert!(failed.is_err(), "a shutdown was taken for a failure: {failed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_errors_name_the_path_and_blame_another_server_only_for_a_lock() {
    let dir = tempfile::tempdir().unwrap();
    let first = Node::start(config(dir.path()), "127.0.0.1:1".parse().unwrap()).await.unwrap();
    let locked = Node::start(config(dir.path()), "127.0.0.1:2".parse().unwrap()).await.err().unwrap();
    let text = locked.to_string();
    assert!(text.contains("raft-log") && text.contains("another server"), "{text}");
    first.shutdown().await;

    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let error = Node::start(config(&file), "127.0.0.1:3".parse().unwrap()).await.err().unwrap();
    let text = error.to_string();
    assert!(text.contains("not-a-dir") && !text.contains("another server"), "{text}");
}

static LOADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn count_load() {
    LOADS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_load_runs_once_per_start_before_the_node_is_handed_over() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config { after_load: Some(count_load), ..config(dir.path()) };
    for start in 1..=2 {
        let node = Node::start(config.clone(), "127.0.0.1:1".parse().unwrap()).await.unwrap();
        assert_eq!(LOADS.load(std::sync::atomic::Ordering::SeqCst), start, "start {start}");
        node.shutdown().await;
    }
}
