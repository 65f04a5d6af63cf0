//! Blocking reads: `?index=N&wait_ms=T` returns when the object changed after index N.

use std::time::{Duration, Instant};

use permit_wire::WAIT_MS_MAX;
use serde_json::json;

use crate::common::Server;
use crate::Api;

/// Bound on a wait here that only a stuck watch reaches: well under [`WAIT_MS_MAX`].
const STUCK: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_blocking_read_returns_on_change_with_a_new_index() {
    let server = Server::start();
    let api = Api::new(&server);
    api.semaphore("w", 1).await;
    let first = api.get("/v1/semaphores/w").await;
    let index = first.index.unwrap();
    assert_eq!(first.body["index"].as_u64(), Some(index));
    // The longest wait there is: a watch that the change did not end would outlast `STUCK`.
    let watcher = {
        let api = api.clone();
        let path = format!("/v1/semaphores/w?index={index}&wait_ms={WAIT_MS_MAX}");
        tokio::spawn(async move { tokio::time::timeout(STUCK, api.get(&path)).await })
    };
    let a = api.session(10_000).await; // Unrelated changes must not end the watch.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!watcher.is_finished(), "an unrelated change woke the watch");
    api.acquire("w", json!({ "session": a })).await;
    let changed = watcher.await.unwrap().expect("the change ended the watch");
    assert!(changed.index.unwrap() > index);
    assert_eq!(changed.body["held"], 1);
}

#[tokio::test]
async fn a_blocking_read_times_out_with_the_same_index() {
    let server = Server::start();
    let api = Api::new(&server);
    api.semaphore("w", 1).await;
    let index = api.get("/v1/semaphores/w").await.index.unwrap();
    let started = Instant::now();
    let answer = api.get(&format!("/v1/semaphores/w?index={index}&wait_ms=200")).await;
    assert_eq!((answer.status, answer.index), (200, Some(index)));
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn an_election_watch_sees_the_leader_change() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    api.post("/v1/elections/e/campaign", json!({ "session": a, "value": "a" })).await;
    api.post("/v1/elections/e/campaign", json!({ "session": b, "value": "b", "wait_ms": 1 })).await;
    let seen = api.get("/v1/elections/e").await;
    let index = seen.index.unwrap();
    let watcher = {
        let api = api.clone();
        tokio::spawn(async move { api.get(&format!("/v1/elections/e?index={index}&wait_ms=10000")).await })
    };
    api.post("/v1/elections/e/resign", json!({ "session": a })).await;
    let changed = watcher.await.unwrap();
    assert_eq!(changed.body["leader"]["value"], "b");
}
