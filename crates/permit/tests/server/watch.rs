//! Blocking reads: `?index=N&wait_ms=T` returns when the object changed after index N.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::Server;
use crate::Api;

#[tokio::test]
async fn a_blocking_read_returns_on_change_with_a_new_index() {
    let server = Server::start();
    let api = Api::new(&server);
    api.semaphore("w", 1).await;
    let first = api.get("/v1/semaphores/w").await;
    let index = first.index.unwrap();
    assert_eq!(first.body["index"].as_u64(), Some(index));
    let watcher = {
        let api = api.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            (api.get(&format!("/v1/semaphores/w?index={index}&wait_ms=10000")).await, started.elapsed())
        })
    };
    let a = api.session(10_000).await; // Unrelated changes must not end the watch.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!watcher.is_finished(), "an unrelated change woke the watch");
    api.acquire("w", json!({ "session": a })).await;
    let (changed, waited) = watcher.await.unwrap();
    assert!(changed.index.unwrap() > index);
    assert_eq!(changed.body["held"], 1);
    assert!(waited < Duration::from_secs(5));
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
