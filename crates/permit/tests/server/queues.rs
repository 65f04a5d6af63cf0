//! Work queues over HTTP against a real server: push, claim, ack and nack; blocked claims served
//! first come first served the moment an item arrives; claims that end with their session;
//! dead-lettering; durability across a kill -9; bad input; per-prefix access.

use std::time::Duration;

use serde_json::{json, Value};

use crate::auth::{secured, token, ROOT};
use crate::common::{eventually, Server};
use crate::Api;

async fn push(api: &Api, queue: &str, body: Value) -> crate::Answer {
    api.post(&format!("/v1/queues/{queue}/items"), body).await
}

async fn claim(api: &Api, queue: &str, session: &str, max: u32, wait_ms: u64) -> Vec<Value> {
    let answer = api
        .post(
            &format!("/v1/queues/{queue}/claim"),
            json!({ "session": session, "max": max, "wait_ms": wait_ms }),
        )
        .await;
    assert_eq!(answer.status, 200, "{answer:?}");
    answer.body["items"].as_array().cloned().unwrap()
}

async fn settle(
    api: &Api,
    queue: &str,
    verb: &str,
    item: &Value,
    session: &str,
    extra: Value,
) -> crate::Answer {
    let id = item["id"].as_str().unwrap();
    let mut body = json!({ "session": session, "token": item["token"] });
    body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
    api.post(&format!("/v1/queues/{queue}/items/{id}/{verb}"), body).await
}

async fn queue(api: &Api, name: &str) -> Value {
    api.get(&format!("/v1/queues/{name}")).await.body
}

#[tokio::test]
async fn items_are_claimed_in_order_acked_once_and_nacked_back_into_their_place() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let pushed = push(
        &api,
        "jobs",
        json!({ "items": [{ "payload": { "n": 1 } }, { "payload": [2] }, { "payload": null }] }),
    )
    .await;
    assert_eq!(pushed.status, 201, "{pushed:?}");
    let seqs: Vec<u64> =
        pushed.body["items"].as_array().unwrap().iter().map(|i| i["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "seq grows: {seqs:?}");

    let first = claim(&api, "jobs", &a, 2, 0).await;
    assert_eq!(
        first.iter().map(|i| i["payload"].clone()).collect::<Vec<_>>(),
        [json!({ "n": 1 }), json!([2])]
    );
    assert_eq!(first[0]["attempt"], 1);
    let (t0, t1) = (first[0]["token"].as_u64().unwrap(), first[1]["token"].as_u64().unwrap());
    assert!(t0 < t1, "tokens grow");
    // Tokens come from the counter of semaphore grants.
    api.semaphore("s", 1).await;
    let grant = api.acquire("s", json!({ "session": b })).await;
    assert!(grant.body["token"].as_u64().unwrap() > t1, "{grant:?}");

    let view = queue(&api, "jobs").await;
    assert_eq!((view["pending"].as_u64(), view["claimed"].as_u64()), (Some(1), Some(2)), "{view}");

    // Another session cannot settle a's claim, and a stale token cannot either.
    let stolen = settle(&api, "jobs", "ack", &first[0], &b, json!({})).await;
    assert_eq!((stolen.status, stolen.code()), (409, "claim_lost"), "{stolen:?}");
    assert_eq!(settle(&api, "jobs", "ack", &first[0], &a, json!({})).await.status, 200);
    let again = settle(&api, "jobs", "ack", &first[0], &a, json!({})).await;
    assert_eq!((again.status, again.code()), (409, "claim_lost"), "acked once: {again:?}");

    // A nack puts the item back in its seq place: ahead of the third item.
    let nacked = settle(&api, "jobs", "nack", &first[1], &a, json!({ "error": "flaky" })).await;
    assert_eq!((nacked.status, nacked.body["state"].as_str()), (200, Some("pending")), "{nacked:?}");
    let next = claim(&api, "jobs", &b, 1, 0).await;
    assert_eq!((next[0]["id"].clone(), next[0]["attempt"].as_u64()), (first[1]["id"].clone(), Some(2)));
    assert!(next[0]["token"].as_u64().unwrap() > t1);
    let listed = api.get("/v1/queues/jobs/items?state=claimed").await;
    let items = listed.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed:?}");
    assert_eq!(
        (items[0]["session"].as_str(), items[0]["last_error"].as_str()),
        (Some(b.as_str()), Some("flaky"))
    );
}

#[tokio::test]
async fn blocked_claims_are_served_first_come_first_served_the_moment_an_item_arrives() {
    let server = Server::start();
    let api = Api::new(&server);
    let created = api.send("PUT", "/v1/queues/work", Some(json!({}))).await;
    assert_eq!(created.status, 201, "{created:?}");
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let first = tokio::spawn({
        let (api, a) = (api.clone(), a.clone());
        async move { claim(&api, "work", &a, 1, 20_000).await }
    });
    let queued =
        eventually(Duration::from_secs(5), async || queue(&api, "work").await["claimers"] == 1).await;
    assert!(queued, "the first claim waits");
    let second = tokio::spawn({
        let (api, b) = (api.clone(), b.clone());
        async move { claim(&api, "work", &b, 1, 20_000).await }
    });
    let queued =
        eventually(Duration::from_secs(5), async || queue(&api, "work").await["claimers"] == 2).await;
    assert!(queued, "the second claim waits behind it");
    let started = std::time::Instant::now();
    push(&api, "work", json!({ "payload": "one" })).await;
    let got = tokio::time::timeout(Duration::from_secs(5), first).await.expect("answered").unwrap();
    assert_eq!(got[0]["payload"], "one");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "pushed at once, not polled: {:?}",
        started.elapsed()
    );
    assert!(!second.is_finished(), "the second claim still waits");
    push(&api, "work", json!({ "payload": "two" })).await;
    let got = tokio::time::timeout(Duration::from_secs(5), second).await.expect("answered").unwrap();
    assert_eq!(got[0]["payload"], "two");

    // A blocked claim ends by its request_id, taking nothing; so does the same claim sent again
    // with wait_ms 0 (the panic of a handler that expected it to wait).
    for cancel in [true, false] {
        let id = if cancel { 7 } else { 8 };
        let body = json!({ "session": a, "wait_ms": 20_000, "request_id": id });
        let waiting = tokio::spawn({
            let api = api.clone();
            async move { api.post("/v1/queues/work/claim", body).await }
        });
        let queued =
            eventually(Duration::from_secs(5), async || queue(&api, "work").await["claimers"] == 1).await;
        assert!(queued, "the claim waits");
        let ended = if cancel {
            api.post("/v1/queues/work/claim/cancel", json!({ "session": a, "request_id": id })).await
        } else {
            api.post("/v1/queues/work/claim", json!({ "session": a, "wait_ms": 0, "request_id": id })).await
        };
        assert_eq!((ended.status, ended.body["items"].as_array().map(Vec::len)), (200, Some(0)), "{ended:?}");
        assert_eq!(queue(&api, "work").await["claimers"], 0);
        let answered =
            tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").unwrap();
        assert_eq!(answered.body["items"], json!([]), "{answered:?}");
    }

    // A claim that times out takes nothing and leaves no blocked claim behind.
    assert!(claim(&api, "work", &a, 1, 200).await.is_empty());
    assert_eq!(queue(&api, "work").await["claimers"], 0);
    push(&api, "work", json!({ "payload": "three" })).await;
    assert_eq!(queue(&api, "work").await["pending"], 1, "nobody took it");
}

/// An ack with `claim` acks the item and claims the next in one request (a worker's loop in one
/// round trip): all or nothing when refused; its claim waits like a claim, is served by the next
/// push, and answers what it took; once applied the ack stands, even if the session ends while
/// the claim waits. A waiting claim (of either kind) answers as soon as its session ends.
#[tokio::test]
async fn an_ack_that_claims_next_acks_and_claims_in_one_request() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    push(&api, "jobs", json!({ "items": [{ "payload": 1 }, { "payload": 2 }] })).await;
    let first = claim(&api, "jobs", &a, 1, 0).await.remove(0);

    // Refused as a whole: a lost claim, a bad claim, a claim's request_id that names the acked
    // item's claim. The item stays claimed.
    let next = |claim: Value| json!({ "claim": claim });
    let stolen = settle(&api, "jobs", "ack", &first, &b, next(json!({}))).await;
    assert_eq!((stolen.status, stolen.code()), (409, "claim_lost"), "{stolen:?}");
    let bad = settle(&api, "jobs", "ack", &first, &a, next(json!({ "max": 0 }))).await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_argument"), "{bad:?}");
    let unknown = settle(&api, "jobs", "ack", &first, &a, next(json!({ "maximum": 1 }))).await;
    assert_eq!((unknown.status, unknown.code()), (422, "invalid_body"), "{unknown:?}");
    let view = queue(&api, "jobs").await;
    assert_eq!((view["pending"].as_u64(), view["claimed"].as_u64()), (Some(1), Some(1)), "{view}");

    let answer = settle(&api, "jobs", "ack", &first, &a, next(json!({ "request_id": 41 }))).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.body["id"], first["id"]);
    let items = answer.body["items"].as_array().cloned().unwrap();
    assert_eq!(items.len(), 1, "{answer:?}");
    let second = items[0].clone();
    assert_eq!((second["payload"].clone(), second["attempt"].as_u64()), (json!(2), Some(1)));
    assert!(second["token"].as_u64() > first["token"].as_u64());
    // A retry after a lost answer answers the same claim; a plain ack of the first item finds it
    // gone.
    let retried = settle(&api, "jobs", "ack", &first, &a, next(json!({ "request_id": 41 }))).await;
    assert_eq!(
        (retried.status, retried.body["items"].clone()),
        (200, json!([second.clone()])),
        "{retried:?}"
    );
    let gone = settle(&api, "jobs", "ack", &first, &a, json!({})).await;
    assert_eq!((gone.status, gone.code()), (409, "claim_lost"), "{gone:?}");
    // The next claim cannot reuse the request_id of the claim that took the item it acks.
    let reuse = settle(&api, "jobs", "ack", &second, &a, next(json!({ "request_id": 41 }))).await;
    assert_eq!((reuse.status, reuse.code()), (400, "invalid_argument"), "{reuse:?}");

    // Nothing pending: the next claim waits, and the push serves it.
    let waiting = tokio::spawn({
        let (api, a, second) = (api.clone(), a.clone(), second.clone());
        async move { settle(&api, "jobs", "ack", &second, &a, next(json!({ "wait_ms": 20_000 }))).await }
    });
    let queued =
        eventually(Duration::from_secs(5), async || queue(&api, "jobs").await["claimers"] == 1).await;
    assert!(queued, "the claim waits");
    let view = queue(&api, "jobs").await;
    assert_eq!((view["pending"].as_u64(), view["claimed"].as_u64()), (Some(0), Some(0)), "acked: {view}");
    push(&api, "jobs", json!({ "payload": 3 })).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").unwrap();
    assert_eq!((answer.status, answer.body["items"][0]["payload"].clone()), (200, json!(3)), "{answer:?}");
    let third = answer.body["items"][0].clone();

    // The session ends while the next claim waits: the ack stood, and the answer says the claim
    // took nothing.
    let waiting = tokio::spawn({
        let (api, a) = (api.clone(), a.clone());
        async move { settle(&api, "jobs", "ack", &third, &a, next(json!({ "wait_ms": 20_000 }))).await }
    });
    let queued =
        eventually(Duration::from_secs(5), async || queue(&api, "jobs").await["claimers"] == 1).await;
    assert!(queued, "the claim waits");
    assert_eq!(api.send("DELETE", &format!("/v1/sessions/{a}"), None).await.status, 204);
    let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").unwrap();
    assert_eq!((answer.status, answer.body["items"].clone()), (200, json!([])), "{answer:?}");
    let view = queue(&api, "jobs").await;
    assert_eq!(
        (view["pending"].as_u64(), view["claimed"].as_u64(), view["claimers"].as_u64()),
        (Some(0), Some(0), Some(0)),
        "{view}"
    );

    // A plain claim of a session that ends answers at once too, that its session is gone.
    let waiting = tokio::spawn({
        let (api, b) = (api.clone(), b.clone());
        async move { api.post("/v1/queues/jobs/claim", json!({ "session": b, "wait_ms": 20_000 })).await }
    });
    let queued =
        eventually(Duration::from_secs(5), async || queue(&api, "jobs").await["claimers"] == 1).await;
    assert!(queued, "the claim waits");
    assert_eq!(api.send("DELETE", &format!("/v1/sessions/{b}"), None).await.status, 204);
    let answer = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("answered").unwrap();
    assert_eq!((answer.status, answer.code()), (404, "session_not_found"), "{answer:?}");
}

#[tokio::test]
async fn a_dead_session_s_claims_are_pending_again_and_the_last_attempt_is_dead_lettered() {
    let server = Server::start();
    let api = Api::new(&server);
    let put = api.send("PUT", "/v1/queues/jobs", Some(json!({ "max_attempts": 2 }))).await;
    assert_eq!((put.status, put.body["dead_letter"].as_str()), (201, Some("jobs.dead")), "{put:?}");
    push(&api, "jobs", json!({ "payload": { "job": 7 } })).await;
    let short = api.session(500).await;
    let got = claim(&api, "jobs", &short, 1, 0).await;
    assert_eq!(got[0]["attempt"], 1);
    // The session is not kept alive: it expires, and the item is pending again.
    let back = eventually(Duration::from_secs(5), async || queue(&api, "jobs").await["pending"] == 1).await;
    assert!(back, "pending again when the claiming session expired: {}", queue(&api, "jobs").await);
    let late = settle(&api, "jobs", "ack", &got[0], &short, json!({})).await;
    assert!(matches!(late.code(), "session_not_found" | "claim_lost"), "{late:?}");

    let worker = api.session(10_000).await;
    let again = claim(&api, "jobs", &worker, 1, 0).await;
    assert_eq!(again[0]["attempt"], 2);
    let dead = settle(&api, "jobs", "nack", &again[0], &worker, json!({ "error": "bad input" })).await;
    assert_eq!(dead.body["state"], "dead", "{dead:?}");
    assert_eq!(queue(&api, "jobs").await["pending"], 0);
    let letters = api.get("/v1/queues/jobs.dead/items").await;
    let item = &letters.body["items"][0];
    assert_eq!(
        (item["id"].clone(), item["attempt"].as_u64()),
        (again[0]["id"].clone(), Some(2)),
        "{letters:?}"
    );
    assert_eq!(
        (item["payload"].clone(), item["last_error"].as_str()),
        (json!({ "job": 7 }), Some("bad input"))
    );
    assert!(queue(&api, "jobs.dead").await["dead_letter"].is_null(), "the end of the line");
}

#[tokio::test]
async fn claims_and_items_survive_a_kill_9_with_their_tokens() {
    let mut server = Server::start();
    let api = Api::new(&server);
    let session = api.session(30_000).await;
    push(&api, "jobs", json!({ "items": [{ "payload": 1 }, { "payload": 2, "delay_ms": 600_000 }, { "payload": 3, "key": "k" }] })).await;
    let got = claim(&api, "jobs", &session, 1, 0).await;
    let before = queue(&api, "jobs").await;
    server.kill9();
    server.restart();
    let api = Api::new(&server);
    let after = queue(&api, "jobs").await;
    for field in ["pending", "claimed", "delayed"] {
        assert_eq!(after[field], before[field], "{field}: {before} then {after}");
    }
    // The claim is the session's still, with the same token: the ack settles it.
    let acked = eventually(Duration::from_secs(10), async || {
        settle(&api, "jobs", "ack", &got[0], &session, json!({})).await.status == 200
    })
    .await;
    assert!(acked, "the claim survived the restart");
    let duplicate = push(&api, "jobs", json!({ "payload": 4, "key": "k" })).await;
    assert_eq!((duplicate.status, duplicate.body["items"][0]["duplicate"].as_bool()), (200, Some(true)));
}

/// A clean stop after a few pushes of many items each (a log far shorter than
/// `--snapshot-logs` entries, so no snapshot by the policy) snapshots them: the restart loads
/// every item from it, with acked ones gone and claims still their sessions'.
#[tokio::test]
async fn a_clean_stop_snapshots_many_pushed_items_and_the_restart_serves_them() {
    let temp = tempfile::tempdir().expect("temp dir");
    let args = ["--snapshot-logs", "50"];
    let mut server = Server::start_in(&temp.path().join("data"), "127.0.0.1:0", &args);
    let api = Api::new(&server);
    let session = api.session(30_000).await;
    for batch in 0..3 {
        let items: Vec<Value> = (0..40).map(|i| json!({ "payload": { "n": batch * 40 + i } })).collect();
        assert_eq!(push(&api, "jobs", json!({ "items": items })).await.status, 201);
    }
    let got = claim(&api, "jobs", &session, 3, 0).await;
    assert_eq!(settle(&api, "jobs", "ack", &got[0], &session, json!({})).await.status, 200);
    let before = queue(&api, "jobs").await;
    assert_eq!((before["pending"].as_u64(), before["claimed"].as_u64()), (Some(117), Some(2)), "{before}");
    let snapshot = server.data_dir.join("snapshots").join("snapshot.bin");
    assert!(!snapshot.exists(), "the policy took a snapshot of a log this short");

    let status = server.terminate(Duration::from_secs(30)).expect("the node exits after SIGTERM");
    assert!(status.success(), "{status}");
    assert!(snapshot.exists(), "a clean stop after 120 pushed items took no snapshot");
    server.restart();
    let api = Api::new(&server);
    let after = queue(&api, "jobs").await;
    for field in ["pending", "claimed", "delayed"] {
        assert_eq!(after[field], before[field], "{field}: {before} then {after}");
    }
    // The log up to the snapshot was purged too: the restart holds none of its entries.
    let sample = async |series: &str| crate::observability::sample(&api, series).await.unwrap_or(0.0);
    let (snapshot_index, purged) =
        (sample("permit_raft_snapshot_index").await, sample("permit_raft_purged_index").await);
    assert!(snapshot_index > 0.0 && purged == snapshot_index, "snapshot {snapshot_index}, purged {purged}");
    let page = api.get("/v1/queues/jobs/items?state=pending&limit=1000").await;
    let served: Vec<u64> =
        page.body["items"].as_array().unwrap().iter().map(|i| i["payload"]["n"].as_u64().unwrap()).collect();
    assert_eq!(served, (3..120).collect::<Vec<u64>>(), "every pending item, in seq order");
    let acked = got[0]["id"].as_str().unwrap();
    let gone = api.send("DELETE", &format!("/v1/queues/jobs/items/{acked}"), None).await;
    assert_eq!(gone.status, 404, "the acked item came back: {gone:?}");
    // The other two claims are the session's still, with their tokens.
    for item in &got[1..] {
        assert_eq!(settle(&api, "jobs", "ack", item, &session, json!({})).await.status, 200, "{item}");
    }
    assert_eq!(queue(&api, "jobs").await["claimed"], 0);
}

#[tokio::test]
async fn bad_input_is_refused_with_a_typed_error_and_changes_nothing() {
    let server = Server::start();
    let api = Api::new(&server);
    let session = api.session(10_000).await;
    api.send("PUT", "/v1/queues/small", Some(json!({ "max_items": 2 }))).await;
    let big = "x".repeat(64 * 1024);
    let cases = [
        (push(&api, "small", json!({ "payload": big })).await, 413, "payload_too_large"),
        (
            push(&api, "small", json!({ "items": [{ "payload": 1 }, { "payload": 2 }, { "payload": 3 }] }))
                .await,
            409,
            "queue_full",
        ),
        (push(&api, "small", json!({})).await, 400, "invalid_argument"),
        (push(&api, "small", json!({ "payload": 1, "items": [] })).await, 400, "invalid_argument"),
        (
            push(&api, "small", json!({ "payload": 1, "delay_ms": 700_000_000 })).await,
            400,
            "invalid_argument",
        ),
        (push(&api, "small", json!({ "payload": 1, "colour": "red" })).await, 422, "invalid_body"),
        (push(&api, "bad/name", json!({ "payload": 1 })).await, 404, "not_found"),
        (
            api.post("/v1/queues/small/claim", json!({ "session": session, "max": 0 })).await,
            400,
            "invalid_argument",
        ),
        (api.post("/v1/queues/none/claim", json!({ "session": session })).await, 404, "queue_not_found"),
        (
            api.post("/v1/queues/small/items/9/ack", json!({ "session": session, "token": 1 })).await,
            409,
            "claim_lost",
        ),
        (
            api.post("/v1/queues/small/items/x/ack", json!({ "session": session, "token": 1 })).await,
            404,
            "item_not_found",
        ),
        (
            api.send("PUT", "/v1/queues/small", Some(json!({ "max_attempts": 0 }))).await,
            400,
            "invalid_argument",
        ),
        (
            api.send("PUT", "/v1/queues/small", Some(json!({ "dead_letter": "small" }))).await,
            400,
            "invalid_argument",
        ),
        (api.get("/v1/queues/none").await, 404, "queue_not_found"),
    ];
    for (answer, status, code) in &cases {
        assert_eq!((answer.status, answer.code()), (*status, *code), "{answer:?}");
    }
    let view = queue(&api, "small").await;
    assert_eq!((view["pending"].as_u64(), view["max_attempts"].as_u64()), (Some(0), Some(5)), "{view}");
    // A whole push of 1000 items of 2 KiB, beyond the 64 KiB of other bodies, is taken.
    let items: Vec<Value> = (0..1000).map(|n| json!({ "payload": format!("{n:02048}") })).collect();
    let many = push(&api, "bulk", json!({ "items": items })).await;
    assert_eq!((many.status, many.body["items"].as_array().map(Vec::len)), (201, Some(1000)));
    // Busy: a queue with items is not deleted; an empty one is.
    let busy = api.send("DELETE", "/v1/queues/bulk", None).await;
    assert_eq!((busy.status, busy.code()), (409, "queue_busy"));
    assert_eq!(api.send("DELETE", "/v1/queues/small", None).await.status, 204);
}

#[tokio::test]
async fn queue_rules_grant_by_prefix_and_root_reaches_queues_without_a_rule() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let (secret, _) = token(&root, "worker", &["queue:jobs.=write", "session:=write"]).await;
    let worker = Api::with_token(&server.url, &secret);
    let session = worker.session(10_000).await;
    assert_eq!(push(&worker, "jobs.a", json!({ "payload": 1 })).await.status, 201);
    assert_eq!(claim(&worker, "jobs.a", &session, 1, 0).await.len(), 1);
    let other = push(&worker, "billing", json!({ "payload": 1 })).await;
    assert_eq!((other.status, other.code()), (403, "permission_denied"), "{other:?}");
    let configure = worker.send("PUT", "/v1/queues/jobs.a", Some(json!({ "max_attempts": 3 }))).await;
    assert_eq!((configure.status, configure.code()), (403, "permission_denied"), "admin only: {configure:?}");
    // The root token's stored rules predate queues; it may do everything by its id.
    assert_eq!(root.send("PUT", "/v1/queues/billing", Some(json!({}))).await.status, 201);
    let listed = worker.get("/v1/queues").await;
    let names: Vec<&str> =
        listed.body["queues"].as_array().unwrap().iter().filter_map(|q| q["name"].as_str()).collect();
    assert_eq!(names, ["jobs.a"], "a list shows only what the caller may read");
}

#[tokio::test]
async fn metrics_and_the_event_stream_follow_every_item() {
    use crate::observability::{sample, Sse};
    let server = Server::start();
    let api = Api::new(&server);
    let mut events = Sse::open(&api, "/v1/events?kinds=pushed,claimed,acked,nacked,dead", None).await;
    let session = api.session(10_000).await;
    api.send("PUT", "/v1/queues/m", Some(json!({ "max_attempts": 1 }))).await;
    push(
        &api,
        "m",
        json!({ "items": [{ "payload": 1 }, { "payload": 2 }, { "payload": 3, "delay_ms": 600_000 }] }),
    )
    .await;
    let got = claim(&api, "m", &session, 2, 0).await;
    assert_eq!(settle(&api, "m", "ack", &got[0], &session, json!({})).await.status, 200);
    assert_eq!(
        settle(&api, "m", "nack", &got[1], &session, json!({ "error": "no" })).await.body["state"],
        "dead"
    );

    let gauge = |state: &'static str| {
        let api = api.clone();
        async move { sample(&api, &format!("permit_queue_items{{queue=\"m\",state=\"{state}\"}}")).await }
    };
    assert_eq!(
        (gauge("pending").await, gauge("delayed").await, gauge("claimed").await),
        (Some(0.0), Some(1.0), Some(0.0))
    );
    let dead = sample(&api, "permit_queue_items{queue=\"m.dead\",state=\"pending\"}").await;
    assert_eq!(dead, Some(1.0), "the dead letter is pending in m.dead");
    for (event, count) in [("pushed", 3.0), ("claimed", 2.0), ("acked", 1.0), ("nacked", 1.0), ("dead", 1.0)]
    {
        let series = format!("permit_queue_events_total{{queue=\"m\",event=\"{event}\"}}");
        assert_eq!(sample(&api, &series).await, Some(count), "{series}");
    }
    // A queue's series count from zero once it exists: m.dead has acked nothing yet.
    let unacked = sample(&api, "permit_queue_events_total{queue=\"m.dead\",event=\"acked\"}").await;
    assert_eq!(unacked, Some(0.0));
    assert_eq!(sample(&api, "permit_queue_processing_seconds_count{queue=\"m\"}").await, Some(1.0));
    // One claim took two items: each item's wait is a sample.
    assert_eq!(sample(&api, "permit_queue_claim_wait_seconds_count{queue=\"m\"}").await, Some(2.0));
    assert_eq!(sample(&api, "permit_queues").await, Some(2.0));

    let frames = events.until("dead", Duration::from_secs(5)).await;
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(kinds, ["pushed", "pushed", "pushed", "claimed", "claimed", "acked", "nacked", "dead"]);
    let acked = &frames[5].data;
    assert_eq!((acked["object_kind"].as_str(), acked["name"].as_str()), (Some("queue"), Some("m")));
    assert_eq!(
        (acked["item"].clone(), acked["token"].clone()),
        (got[0]["id"].clone(), got[0]["token"].clone())
    );
    assert_eq!(
        (frames[7].data["dead_letter"].as_str(), frames[7].data["error"].as_str()),
        (Some("m.dead"), Some("no"))
    );
}

/// A claim named by `request_id` is answered again, not repeated: a retry after a lost answer
/// gets the same items; a repeat without a wait while the claim still waits ends it, taking
/// nothing (it used to fail the server).
#[tokio::test]
async fn a_repeated_claim_request_answers_the_same_claim() {
    let server = Server::start();
    let api = Api::new(&server);
    let session = api.session(10_000).await;
    push(&api, "retries", json!({ "items": [{ "payload": 1 }, { "payload": 2 }] })).await;
    let ask = |request_id: u64, wait_ms: u64| {
        let (api, session) = (api.clone(), session.clone());
        async move {
            let body = json!({ "session": session, "wait_ms": wait_ms, "request_id": request_id });
            api.post("/v1/queues/retries/claim", body).await
        }
    };
    let first = ask(7, 0).await;
    let again = ask(7, 0).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body, again.body, "the same claim, not a second item");
    assert_eq!(queue(&api, "retries").await["claimed"], 1);

    let other = ask(8, 0).await;
    settle(&api, "retries", "ack", &first.body["items"][0], &session, json!({})).await;
    settle(&api, "retries", "ack", &other.body["items"][0], &session, json!({})).await;
    let waiting = tokio::spawn(ask(9, 10_000));
    assert!(
        eventually(Duration::from_secs(10), async || queue(&api, "retries").await["claimers"] == 1).await
    );
    let repeat = ask(9, 0).await;
    assert_eq!((repeat.status, repeat.body["items"].as_array().map(Vec::len)), (200, Some(0)), "{repeat:?}");
    assert_eq!(queue(&api, "retries").await["claimers"], 0, "the claim waits no more");
    let ended = waiting.await.unwrap();
    assert_eq!((ended.status, ended.body["items"].clone()), (200, json!([])), "{ended:?}");
    push(&api, "retries", json!({ "payload": 3 })).await;
    assert_eq!(queue(&api, "retries").await["pending"], 1, "nobody took it");
}
