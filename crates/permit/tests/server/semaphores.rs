use std::time::Duration;

use serde_json::json;

use crate::common::Server;
use crate::Api;

#[tokio::test]
async fn try_acquire_grants_until_full_then_refuses_without_queueing() {
    let server = Server::start();
    let api = Api::new(&server);
    api.semaphore("db", 3).await;
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let first = api.acquire("db", json!({ "session": a, "permits": 2 })).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body["status"], "acquired");
    assert_eq!(first.body["permits"], 2);
    let refused = api.acquire("db", json!({ "session": b, "permits": 2 })).await;
    assert_eq!((refused.status, refused.code()), (409, "unavailable"));
    let view = api.get("/v1/semaphores/db").await;
    assert_eq!(view.body["waiters"].as_array().unwrap().len(), 0, "a try-acquire is never queued");
    assert_eq!((view.body["held"].as_u64(), view.body["available"].as_u64()), (Some(2), Some(1)));
    let fits = api.acquire("db", json!({ "session": b, "permits": 1 })).await;
    assert_eq!(fits.status, 200);
}

#[tokio::test]
async fn acquire_is_idempotent_per_session_and_semaphore() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let first = api.acquire("m", json!({ "session": a, "capacity": 1 })).await;
    let again = api.acquire("m", json!({ "session": a, "capacity": 1 })).await;
    assert_eq!(first.body, again.body, "same grant, same token");
    let queued = api.acquire("m", json!({ "session": b, "wait_ms": 50 })).await;
    assert_eq!((queued.status, queued.body["status"].as_str()), (202, Some("waiting")));
    assert_eq!(queued.body["position"], 1);
    let requeued = api.acquire("m", json!({ "session": b, "wait_ms": 50 })).await;
    assert_eq!((requeued.status, requeued.body["position"].as_u64()), (202, Some(1)), "same place kept");
    let mismatch = api.acquire("m", json!({ "session": a, "permits": 2 })).await;
    assert_eq!((mismatch.status, mismatch.code()), (409, "permits_mismatch"));
}

#[tokio::test]
async fn blocking_acquire_is_handed_off_on_release_with_a_larger_token() {
    handed_off_on_release(&Server::start()).await;
}

/// The default runs every task (HTTP, the proposer, openraft's core and apply, the waiter's
/// long-poll) on one worker thread, the log's fsync in place on it; `--worker-threads 2` spreads
/// them over two, the fsync blocking one while the other runs the rest.
#[tokio::test]
async fn two_worker_threads_serve_a_handoff() {
    let dir = tempfile::tempdir().unwrap();
    handed_off_on_release(&Server::start_in(dir.path(), "127.0.0.1:0", &["--worker-threads", "2"])).await;
}

async fn handed_off_on_release(server: &Server) {
    let api = Api::new(server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let held = api.acquire("lock", json!({ "session": a, "capacity": 1 })).await;
    let token_a = held.body["token"].as_u64().unwrap();
    let waiter = {
        let api = api.clone();
        let b = b.clone();
        tokio::spawn(async move { api.acquire("lock", json!({ "session": b, "wait_ms": 10_000 })).await })
    };
    // Release only once B is queued, so that the grant has to come from the queue.
    let queued = crate::common::eventually(Duration::from_secs(5), async || {
        api.get("/v1/semaphores/lock").await.body["waiters"].as_array().is_some_and(|w| w.len() == 1)
    })
    .await;
    assert!(queued);
    assert_eq!(api.release("lock", &a).await.body["released"], 1);
    // Granted by the release itself: had the waiter waited out its `wait_ms`, it would be 202.
    let granted = waiter.await.unwrap();
    assert_eq!((granted.status, granted.body["status"].as_str()), (200, Some("acquired")));
    assert!(granted.body["token"].as_u64().unwrap() > token_a);
    assert_eq!(api.holders("lock").await, vec![b]);
}

#[tokio::test]
async fn weighted_fifo_never_lets_small_requests_overtake_a_blocked_head() {
    let server = Server::start();
    let api = Api::new(&server);
    api.semaphore("gpu", 4).await;
    let sessions: Vec<String> = futures_join(&api, 4).await;
    let (s0, s1, s2, s3) = (&sessions[0], &sessions[1], &sessions[2], &sessions[3]);
    assert_eq!(api.acquire("gpu", json!({ "session": s0, "permits": 3 })).await.status, 200);
    // s1 wants all 4 and must wait; s2 wants 1, which is free, but s1 is ahead of it.
    assert_eq!(api.acquire("gpu", json!({ "session": s1, "permits": 4, "wait_ms": 1 })).await.status, 202);
    let s2_wait = api.acquire("gpu", json!({ "session": s2, "permits": 1, "wait_ms": 1 })).await;
    assert_eq!((s2_wait.status, s2_wait.body["position"].as_u64()), (202, Some(2)));
    let s3_try = api.acquire("gpu", json!({ "session": s3, "permits": 1 })).await;
    assert_eq!(s3_try.code(), "unavailable", "a try-acquire does not jump the queue either");
    api.release("gpu", s0).await;
    assert_eq!(api.holders("gpu").await, vec![s1.clone()], "the head got all 4");
    api.release("gpu", s1).await;
    assert_eq!(api.holders("gpu").await, vec![s2.clone()]);
    let waiting = api.acquire("gpu", json!({ "session": s2, "permits": 1 })).await;
    assert_eq!(waiting.status, 200, "the granted waiter's repeat returns its grant");
}

async fn futures_join(api: &Api, n: usize) -> Vec<String> {
    let mut sessions = Vec::new();
    for _ in 0..n {
        sessions.push(api.session(10_000).await);
    }
    sessions
}

#[tokio::test]
async fn release_cancels_a_wait_and_is_idempotent() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    api.acquire("m", json!({ "session": a, "capacity": 1 })).await;
    api.acquire("m", json!({ "session": b, "wait_ms": 1 })).await;
    let cancelled = api.release("m", &b).await;
    assert_eq!((cancelled.status, cancelled.body["released"].as_u64()), (200, Some(0)));
    assert!(api.get("/v1/semaphores/m").await.body["waiters"].as_array().unwrap().is_empty());
    assert_eq!(api.release("m", &b).await.body["released"], 0, "releasing nothing is fine");
    assert_eq!(api.release("never-created", &b).await.body["released"], 0);
    assert_eq!(api.release("m", &a).await.body["released"], 1);
    assert_eq!(api.release("m", &a).await.body["released"], 0);
}

#[tokio::test]
async fn a_cancelled_long_poll_answers_wait_cancelled() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    api.acquire("m", json!({ "session": a, "capacity": 1 })).await;
    let waiter = {
        let (api, b) = (api.clone(), b.clone());
        tokio::spawn(async move { api.acquire("m", json!({ "session": b, "wait_ms": 10_000 })).await })
    };
    assert!(
        crate::common::eventually(Duration::from_secs(5), async || {
            !api.get("/v1/semaphores/m").await.body["waiters"].as_array().unwrap().is_empty()
        })
        .await
    );
    api.release("m", &b).await;
    let answer = waiter.await.unwrap();
    assert_eq!((answer.status, answer.code()), (409, "wait_cancelled"));
}

#[tokio::test]
async fn capacity_grows_grants_waiters_and_shrinks_without_evicting_holders() {
    let server = Server::start();
    let api = Api::new(&server);
    api.semaphore("c", 2).await;
    let s: Vec<String> = futures_join(&api, 4).await;
    for (i, session) in s.iter().enumerate() {
        let answer = api.acquire("c", json!({ "session": session, "wait_ms": 1 })).await;
        assert_eq!(answer.status, if i < 2 { 200 } else { 202 });
    }
    let grown = api.send("PUT", "/v1/semaphores/c", Some(json!({ "capacity": 3 }))).await;
    assert_eq!(grown.status, 200, "resizing answers 200, creating 201");
    assert_eq!(api.holders("c").await.len(), 3, "growing granted the head waiter");
    let shrunk = api.send("PUT", "/v1/semaphores/c", Some(json!({ "capacity": 1 }))).await;
    assert_eq!((shrunk.body["held"].as_u64(), shrunk.body["available"].as_u64()), (Some(3), Some(0)));
    api.release("c", &s[0]).await;
    api.release("c", &s[1]).await;
    assert_eq!(api.holders("c").await, vec![s[2].clone()], "no grant while holdings exceed the capacity");
    api.release("c", &s[2]).await;
    assert_eq!(api.holders("c").await, vec![s[3].clone()], "granted once they fit");
    // A waiter that can never fit is refused when the capacity shrinks under it.
    let big = api.session(10_000).await;
    api.semaphore("c", 5).await;
    assert_eq!(api.acquire("c", json!({ "session": big, "permits": 5, "wait_ms": 1 })).await.status, 202);
    api.semaphore("c", 2).await;
    let view = api.get("/v1/semaphores/c").await;
    assert!(view.body["waiters"].as_array().unwrap().is_empty());
    let refused = api.acquire("c", json!({ "session": big, "permits": 5 })).await;
    assert_eq!((refused.status, refused.code()), (409, "permits_exceed_capacity"));
}

#[tokio::test]
async fn acquire_creates_a_semaphore_only_with_a_capacity_and_never_resizes_it() {
    let server = Server::start();
    let api = Api::new(&server);
    let a = api.session(10_000).await;
    let missing = api.acquire("new", json!({ "session": a })).await;
    assert_eq!((missing.status, missing.code()), (404, "semaphore_not_found"));
    let hint = missing.body["error"]["message"].as_str().unwrap();
    assert!(hint.contains("set-capacity") && hint.contains("\"capacity\""), "a 404 says what to do: {hint}");
    assert_eq!(api.acquire("new", json!({ "session": a, "capacity": 2 })).await.status, 200);
    let b = api.session(10_000).await;
    api.acquire("new", json!({ "session": b, "capacity": 7 })).await;
    assert_eq!(api.get("/v1/semaphores/new").await.body["capacity"], 2, "an existing capacity wins");
}

#[tokio::test]
async fn validate_answers_whether_a_token_belongs_to_a_current_holder() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let first =
        api.acquire("v", json!({ "session": a, "capacity": 1 })).await.body["token"].as_u64().unwrap();
    let valid = api.post("/v1/semaphores/v/validate", json!({ "token": first })).await;
    assert_eq!(
        (valid.body["valid"].as_bool(), valid.body["session"].as_str()),
        (Some(true), Some(a.as_str()))
    );
    api.release("v", &a).await;
    let second = api.acquire("v", json!({ "session": b })).await.body["token"].as_u64().unwrap();
    assert!(second > first);
    let stale = api.post("/v1/semaphores/v/validate", json!({ "token": first })).await;
    assert_eq!(stale.body["valid"], false, "a superseded token is rejected");
    assert_eq!(api.post("/v1/semaphores/v/validate", json!({ "token": second })).await.body["valid"], true);
    assert_eq!(
        api.post("/v1/semaphores/other/validate", json!({ "token": second })).await.body["valid"],
        false
    );
}

#[tokio::test]
async fn delete_only_when_idle_and_list_pages_in_name_order() {
    let server = Server::start();
    let api = Api::new(&server);
    for name in ["b", "a", "c.x", "c:y"] {
        api.semaphore(name, 1).await;
    }
    let a = api.session(10_000).await;
    api.acquire("a", json!({ "session": a })).await;
    let busy = api.send("DELETE", "/v1/semaphores/a", None).await;
    assert_eq!((busy.status, busy.code()), (409, "semaphore_busy"));
    assert_eq!(api.send("DELETE", "/v1/semaphores/b", None).await.status, 204);
    assert_eq!(api.send("DELETE", "/v1/semaphores/b", None).await.code(), "semaphore_not_found");
    let page = api.get("/v1/semaphores?limit=2").await;
    let names: Vec<&str> =
        page.body["semaphores"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "c.x"]);
    assert_eq!(page.body["semaphores"][0]["held"], 1);
    let next = api.get(&format!("/v1/semaphores?after={}", page.body["next_after"].as_str().unwrap())).await;
    assert_eq!(next.body["semaphores"][0]["name"], "c:y");
    assert!(next.body["next_after"].is_null());
}

#[tokio::test]
async fn an_ephemeral_semaphore_is_deleted_when_its_last_holder_leaves_and_a_put_keeps_it() {
    let server = Server::start();
    let api = Api::new(&server);
    let a = api.session(10_000).await;
    let granted = api.acquire("tmp.job", json!({ "session": a, "capacity": 2, "ephemeral": true })).await;
    assert_eq!(granted.status, 200, "{granted:?}");
    let first_token = granted.body["token"].as_u64().unwrap();
    assert_eq!(api.get("/v1/semaphores/tmp.job").await.body["ephemeral"], true);
    assert_eq!(api.release("tmp.job", &a).await.status, 200);
    assert_eq!(api.get("/v1/semaphores/tmp.job").await.code(), "semaphore_not_found", "idle: deleted");
    let again = api.acquire("tmp.job", json!({ "session": a, "capacity": 2, "ephemeral": true })).await;
    assert!(again.body["token"].as_u64().unwrap() > first_token, "recreating a name never repeats a token");
    api.semaphore("tmp.job", 2).await;
    assert_eq!(api.release("tmp.job", &a).await.status, 200);
    let kept = api.get("/v1/semaphores/tmp.job").await;
    assert_eq!(
        (kept.status, kept.body["ephemeral"].as_bool()),
        (200, Some(false)),
        "a PUT made it permanent"
    );
}
