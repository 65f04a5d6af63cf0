//! Sessions that stop keeping alive expire on time, and their holds go to waiters.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::Server;
use crate::Api;

#[tokio::test]
async fn an_expired_session_frees_its_permits_for_the_waiter_once_its_ttl_ran_out() {
    let server = Server::start();
    let api = Api::new(&server);
    let ttl = Duration::from_millis(400);
    // The promise counts from the *send* of the last acknowledged call (here the create).
    let created_at = Instant::now();
    let holder = api.session(ttl.as_millis() as u64).await;
    let waiter = api.session(30_000).await;
    api.acquire("r", json!({ "session": holder, "capacity": 1 })).await;
    let granted = api.acquire("r", json!({ "session": waiter, "wait_ms": 10_000 })).await;
    let waited = created_at.elapsed();
    assert_eq!(granted.status, 200, "{granted:?}");
    // Not before the TTL ran out; how soon after it is the benchmark's W4 (reclaim) figure. The
    // grant within `wait_ms` (not a 202) shows that the expiry itself woke the waiter.
    assert!(waited >= ttl, "granted after {waited:?}, before the TTL ran out");
    let answer = api.post(&format!("/v1/sessions/{holder}/keepalive"), json!(null)).await;
    assert_eq!(answer.code(), "session_not_found");
}

#[tokio::test]
async fn keepalives_keep_a_session_and_its_holds_alive_past_its_ttl() {
    let server = Server::start();
    let api = Api::new(&server);
    let id = api.session(300).await;
    api.acquire("k", json!({ "session": id, "capacity": 1 })).await;
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(1200) {
        let answer = api.post(&format!("/v1/sessions/{id}/keepalive"), json!(null)).await;
        assert_eq!(answer.status, 200, "after {:?}", started.elapsed());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(api.holders("k").await, vec![id]);
}

#[tokio::test]
async fn max_hold_releases_a_hold_while_its_session_lives() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(30_000).await, api.session(30_000).await);
    let started = Instant::now();
    let held = api.acquire("h", json!({ "session": a, "capacity": 1, "max_hold_ms": 300 })).await;
    assert_eq!(held.status, 200);
    let view = api.get("/v1/semaphores/h").await;
    assert!(view.body["holders"][0]["expires_in_ms"].as_u64().unwrap() <= 300);
    // Granted (not 202 after `wait_ms`) while A's session lives: `max_hold_ms` ended A's hold,
    // and not before it was due.
    let granted = api.acquire("h", json!({ "session": b, "wait_ms": 10_000 })).await;
    let waited = started.elapsed();
    assert_eq!(granted.status, 200);
    assert!(waited >= Duration::from_millis(300), "released {waited:?} after the grant, before max_hold_ms");
    assert_eq!(
        api.post(&format!("/v1/sessions/{a}/keepalive"), json!(null)).await.status,
        200,
        "session lives"
    );
}

#[tokio::test]
async fn an_expired_waiter_leaves_the_queue_and_unblocks_those_behind_it() {
    let server = Server::start();
    let api = Api::new(&server);
    api.semaphore("q", 2).await;
    let holder = api.session(30_000).await;
    let big = api.session(300).await;
    let small = api.session(30_000).await;
    api.acquire("q", json!({ "session": holder, "permits": 1 })).await;
    assert_eq!(api.acquire("q", json!({ "session": big, "permits": 2, "wait_ms": 1 })).await.status, 202);
    // Granted, not 202 after `wait_ms`: the head left the queue when its session expired.
    let granted = api.acquire("q", json!({ "session": small, "permits": 1, "wait_ms": 10_000 })).await;
    assert_eq!(granted.status, 200, "granted once the blocked head expired");
}
