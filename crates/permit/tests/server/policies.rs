//! Semaphore policies over HTTP against a real server: a rate beside the capacity (takes and
//! acquires), lock-delay after a failed hold, a cap per group; their events, their survival of a
//! kill -9, and bad input.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{eventually, Server};
use crate::observability::{sample, Sse};
use crate::Api;

async fn put(api: &Api, name: &str, body: Value) -> crate::Answer {
    api.send("PUT", &format!("/v1/semaphores/{name}"), Some(body)).await
}

async fn take(api: &Api, name: &str, body: Value) -> crate::Answer {
    api.post(&format!("/v1/semaphores/{name}/take"), body).await
}

async fn view(api: &Api, name: &str) -> Value {
    api.get(&format!("/v1/semaphores/{name}")).await.body
}

#[tokio::test]
async fn takes_follow_the_burst_then_the_rate_and_a_refusal_says_when_to_come_back() {
    let server = Server::start();
    let api = Api::new(&server);
    // 10 per second, burst 4.
    let created =
        put(&api, "quota", json!({ "capacity": 1, "rate": { "permits": 10, "per_ms": 1000, "burst": 4 } }))
            .await;
    assert_eq!(created.status, 201, "{created:?}");
    assert_eq!(
        created.body["rate"],
        json!({ "permits": 10, "per_ms": 1000, "burst": 4, "available": 4, "next_in_ms": 0 })
    );
    let available = "permit_semaphore_rate_available{semaphore=\"quota\"}";
    assert_eq!(sample(&api, available).await, Some(4.0), "the whole burst at first");
    let mut tokens = Vec::new();
    for _ in 0..4 {
        let taken = take(&api, "quota", json!({})).await;
        assert_eq!((taken.status, taken.body["status"].as_str()), (200, Some("taken")), "{taken:?}");
        tokens.push(taken.body["token"].as_u64().unwrap());
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens grow: {tokens:?}");
    // Spent, but for what refilled since (one permit per 100 ms).
    assert!(sample(&api, available).await.is_some_and(|left| left <= 1.0), "the burst is spent");
    // The fifth within the same 100 ms is refused, with when to come back, in ms and in seconds.
    let refused =
        api.http.post(format!("{}/v1/semaphores/quota/take", api.url)).json(&json!({})).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let retry_after = body["error"]["retry_after_ms"].as_u64().unwrap();
    assert!((1..=100).contains(&retry_after), "{body}");
    // A take that waits is served at the rate's turn, not before.
    let started = Instant::now();
    let waited = take(&api, "quota", json!({ "wait_ms": 5_000 })).await;
    assert_eq!(waited.status, 200, "{waited:?}");
    assert!(waited.body["token"].as_u64().unwrap() > tokens[3]);
    assert!(started.elapsed() < Duration::from_secs(2), "served at its turn, not at the end of its wait");
    // More than the burst can never be taken; a semaphore without a rate takes at once.
    let too_many = take(&api, "quota", json!({ "permits": 5 })).await;
    assert_eq!((too_many.status, too_many.code()), (409, "permits_exceed_capacity"), "{too_many:?}");
    api.semaphore("free", 1).await;
    for _ in 0..20 {
        assert_eq!(take(&api, "free", json!({})).await.status, 200);
    }
    let missing = take(&api, "nope", json!({})).await;
    assert_eq!((missing.status, missing.code()), (404, "semaphore_not_found"));
    let count =
        |result: &str| format!("permit_semaphore_takes_total{{semaphore=\"quota\",result=\"{result}\"}}");
    assert_eq!(sample(&api, &count("taken")).await, Some(5.0));
    assert_eq!(sample(&api, &count("rate_limited")).await, Some(1.0));
}

#[tokio::test]
async fn a_take_that_waits_queues_behind_an_acquire_and_a_timed_out_take_leaves_no_waiter() {
    let server = Server::start();
    let api = Api::new(&server);
    put(&api, "api", json!({ "capacity": 1, "rate": { "permits": 1, "per_ms": 60_000 } })).await;
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    assert_eq!(api.acquire("api", json!({ "session": a })).await.status, 200);
    // b waits for the capacity (and then for the rate, spent for a minute by a's grant).
    let queued = api.acquire("api", json!({ "session": b, "wait_ms": 50 })).await;
    assert_eq!((queued.status, queued.body["position"].as_u64()), (202, Some(1)));
    // A take behind b waits its 300 ms and is refused; it leaves the queue.
    let timed_out = take(&api, "api", json!({ "wait_ms": 300 })).await;
    assert_eq!((timed_out.status, timed_out.code()), (429, "rate_limited"), "{timed_out:?}");
    let waiters = view(&api, "api").await["waiters"].clone();
    assert_eq!(waiters.as_array().map(Vec::len), Some(1), "{waiters}");
    assert_eq!(waiters[0]["session"], b.as_str());
    // Removing the rate serves what waited for it.
    assert_eq!(api.release("api", &a).await.status, 200);
    assert_eq!(put(&api, "api", json!({ "capacity": 1, "rate": null })).await.status, 200);
    assert!(eventually(Duration::from_secs(5), async || api.holders("api").await == [b.clone()]).await);
    assert!(view(&api, "api").await.get("rate").is_none());
}

#[tokio::test]
async fn a_failed_holders_permits_return_after_the_lock_delay_and_a_released_ones_at_once() {
    let server = Server::start();
    let api = Api::new(&server);
    let mut events = Sse::open(&api, "/v1/events?kinds=revoked,delay_ended,granted", None).await;
    assert_eq!(put(&api, "lock", json!({ "capacity": 1, "lock_delay_ms": 700 })).await.status, 201);
    let (a, b, c) = (api.session(10_000).await, api.session(10_000).await, api.session(10_000).await);
    assert_eq!(api.acquire("lock", json!({ "session": a })).await.status, 200);
    // A clean release: the next holder at once.
    assert_eq!(api.release("lock", &a).await.status, 200);
    assert_eq!(api.acquire("lock", json!({ "session": b })).await.status, 200);
    // A revoke is a failure: the permit stays out for the delay, visible as "delayed".
    let revoked_at = Instant::now();
    assert_eq!(api.post("/v1/semaphores/lock/revoke", json!({ "session": b })).await.status, 200);
    let delayed = view(&api, "lock").await;
    assert_eq!(delayed["available"], 0, "{delayed}");
    assert_eq!(delayed["delayed"][0]["permits"], 1, "{delayed}");
    let gauge = "permit_semaphore_delayed_permits{semaphore=\"lock\"}";
    assert_eq!(sample(&api, gauge).await, Some(1.0));
    let try_now = api.acquire("lock", json!({ "session": c })).await;
    assert_eq!((try_now.status, try_now.code()), (409, "unavailable"), "in lock-delay, not free");
    let granted = api.acquire("lock", json!({ "session": c, "wait_ms": 5_000 })).await;
    assert_eq!(granted.status, 200, "{granted:?}");
    assert!(revoked_at.elapsed() >= Duration::from_millis(700), "not a moment before the delay");
    let mut kinds = Vec::new();
    while let Some(frame) = events.next(Duration::from_secs(2)).await {
        kinds.push(frame.event.clone());
        if frame.event == "revoked" {
            assert_eq!(frame.data["delay_ms"], 700, "{:?}", frame.data);
        }
        if kinds.ends_with(&["delay_ended".into(), "granted".into()]) {
            break;
        }
    }
    assert_eq!(kinds, ["granted", "granted", "revoked", "delay_ended", "granted"], "{kinds:?}");
    assert_eq!(sample(&api, gauge).await, Some(0.0));
    // An expired session is a failure too.
    let short = api.session(300).await;
    assert_eq!(api.release("lock", &c).await.status, 200);
    assert_eq!(api.acquire("lock", json!({ "session": short })).await.status, 200);
    assert!(
        eventually(Duration::from_secs(5), async || view(&api, "lock").await["delayed"][0]["permits"] == 1)
            .await,
        "the expired session's permit is delayed"
    );
}

#[tokio::test]
async fn a_group_at_its_cap_is_passed_over_so_another_group_is_not_starved() {
    let server = Server::start();
    let api = Api::new(&server);
    assert_eq!(put(&api, "gpu", json!({ "capacity": 3, "group_max": 2 })).await.status, 201);
    let sessions: Vec<String> = futures::future::join_all((0..4).map(|_| api.session(10_000))).await;
    for s in &sessions[..2] {
        assert_eq!(api.acquire("gpu", json!({ "session": s, "group": "team-a" })).await.status, 200);
    }
    let third = api.acquire("gpu", json!({ "session": sessions[2], "group": "team-a", "wait_ms": 50 })).await;
    assert_eq!(third.status, 202, "team-a is at its cap");
    let other = api.acquire("gpu", json!({ "session": sessions[3], "group": "team-b" })).await;
    assert_eq!(other.status, 200, "team-b is not blocked by team-a's backlog: {other:?}");
    let seen = view(&api, "gpu").await;
    assert_eq!(seen["group_max"], 2);
    assert_eq!(
        seen["groups"],
        json!([
            { "group": "team-a", "held": 2, "holders": 2, "waiters": 1 },
            { "group": "team-b", "held": 1, "holders": 1, "waiters": 0 },
        ])
    );
    assert_eq!(seen["waiters"][0]["group"], "team-a");
    let held = |group: &str| format!("permit_semaphore_group_held{{semaphore=\"gpu\",group=\"{group}\"}}");
    assert_eq!(
        (sample(&api, &held("team-a")).await, sample(&api, &held("team-b")).await),
        (Some(2.0), Some(1.0))
    );
    // team-a's waiter kept its place: it is next when team-a drops below the cap.
    assert_eq!(api.release("gpu", &sessions[3]).await.status, 200);
    assert_eq!(api.holders("gpu").await.len(), 2, "a free permit does not lift team-a's cap");
    assert_eq!(api.release("gpu", &sessions[0]).await.status, 200);
    assert!(
        eventually(Duration::from_secs(5), async || api.holders("gpu").await.contains(&sessions[2])).await
    );
    let bad = api.acquire("gpu", json!({ "session": sessions[3], "group": "no spaces" })).await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_argument"), "{bad:?}");
}

#[tokio::test]
async fn bad_policies_are_refused_and_change_nothing() {
    let server = Server::start();
    let api = Api::new(&server);
    assert_eq!(put(&api, "s", json!({ "capacity": 2, "lock_delay_ms": 10 })).await.status, 201);
    let before = view(&api, "s").await;
    for body in [
        json!({ "capacity": 2, "lock_delay_ms": 60_001 }),
        json!({ "capacity": 2, "rate": { "permits": 0, "per_ms": 1000 } }),
        json!({ "capacity": 2, "rate": { "permits": 1, "per_ms": 0 } }),
        json!({ "capacity": 2, "rate": { "permits": 1, "per_ms": 86_400_001 } }),
        json!({ "capacity": 2, "rate": { "permits": 1, "per_ms": 1000, "burst": 0 } }),
        json!({ "capacity": 2, "group_max": 0 }),
    ] {
        let refused = put(&api, "s", body.clone()).await;
        assert_eq!((refused.status, refused.code()), (400, "invalid_argument"), "{body}: {refused:?}");
    }
    let unknown =
        put(&api, "s", json!({ "capacity": 2, "rate": { "permits": 1, "per_ms": 1, "nope": 1 } })).await;
    assert_eq!(unknown.status, 422, "{unknown:?}");
    let bad_take = take(&api, "s", json!({ "permits": 0 })).await;
    assert_eq!((bad_take.status, bad_take.code()), (400, "invalid_argument"));
    assert_eq!(view(&api, "s").await["index"], before["index"], "nothing was written");
    // A plain PUT keeps the policy; explicit nulls remove it.
    assert_eq!(put(&api, "s", json!({ "capacity": 3 })).await.body["lock_delay_ms"], 10);
    let cleared =
        put(&api, "s", json!({ "capacity": 3, "lock_delay_ms": 0, "rate": null, "group_max": null })).await;
    assert_eq!((cleared.body["lock_delay_ms"].as_u64(), cleared.body.get("group_max")), (Some(0), None));
}

#[tokio::test]
async fn policies_delays_and_the_spent_rate_survive_a_kill_9() {
    let mut server = Server::start();
    let api = Api::new(&server);
    let body = json!({ "capacity": 2, "rate": { "permits": 1, "per_ms": 60_000, "burst": 2 }, "lock_delay_ms": 60_000, "group_max": 1 });
    assert_eq!(put(&api, "kept", body).await.status, 201);
    let a = api.session(10_000).await;
    assert_eq!(api.acquire("kept", json!({ "session": a, "group": "g" })).await.status, 200);
    assert_eq!(api.post("/v1/semaphores/kept/revoke", json!({ "session": a })).await.status, 200);
    let taken = take(&api, "kept", json!({})).await;
    assert_eq!(taken.status, 200);
    server.kill9();
    server.restart();
    let api = Api::new(&server);
    let seen = view(&api, "kept").await;
    assert_eq!(
        (seen["lock_delay_ms"].as_u64(), seen["group_max"].as_u64()),
        (Some(60_000), Some(1)),
        "{seen}"
    );
    assert_eq!(seen["delayed"][0]["permits"], 1, "the delay outlives the restart: {seen}");
    assert_eq!(seen["rate"]["available"], 0, "the spent rate outlives the restart: {seen}");
    let refused = take(&api, "kept", json!({})).await;
    assert_eq!(refused.code(), "rate_limited");
    let b = api.session(10_000).await;
    let later = api.acquire("kept", json!({ "session": b })).await;
    assert!(later.status == 409, "no grant out of a restart's forgetfulness: {later:?}");
    // Tokens still grow past the take's.
    api.semaphore("other", 1).await;
    let grant = api.acquire("other", json!({ "session": b })).await;
    assert!(grant.body["token"].as_u64() > taken.body["token"].as_u64(), "{grant:?} after {taken:?}");
}

#[tokio::test]
async fn a_waiting_take_whose_client_hangs_up_leaves_the_queue_at_once() {
    let server = Server::start();
    let api = Api::new(&server);
    put(&api, "slow", json!({ "capacity": 1, "rate": { "permits": 1, "per_ms": 60_000 } })).await;
    assert_eq!(take(&api, "slow", json!({})).await.status, 200);
    let hung_up = api
        .http
        .post(format!("{}/v1/semaphores/slow/take", api.url))
        .json(&json!({ "wait_ms": 30_000 }))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(hung_up.is_err(), "the client gave up first: {hung_up:?}");
    let left = eventually(Duration::from_secs(5), async || {
        view(&api, "slow").await["waiters"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    assert!(left, "the abandoned take left the queue well before its wait: {}", view(&api, "slow").await);
}
