use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{eventually, Server};
use crate::Api;

#[tokio::test]
async fn session_lifecycle_create_keepalive_get_close() {
    let server = Server::start();
    let api = Api::new(&server);
    let created = api.post("/v1/sessions", json!({ "ttl_ms": 5000, "name": "worker-1" })).await;
    assert_eq!(created.status, 201);
    let id = created.body["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32, "128-bit id as 32 hex digits");
    assert_eq!(created.body["ttl_ms"], 5000);

    let keepalive = api.post(&format!("/v1/sessions/{id}/keepalive"), json!(null)).await;
    assert_eq!((keepalive.status, keepalive.body["ttl_ms"].as_u64()), (200, Some(5000)));

    api.acquire("s", json!({ "session": id, "capacity": 3, "permits": 2 })).await;
    let view = api.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(view.status, 200);
    assert_eq!(view.body["name"], "worker-1");
    assert_eq!(view.body["holds"][0]["name"], "s");
    assert_eq!(view.body["holds"][0]["permits"], 2);

    let closed = api.send("DELETE", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!(closed.status, 204);
    assert_eq!(api.holders("s").await, Vec::<String>::new(), "closing released the hold");
    for answer in [
        api.post(&format!("/v1/sessions/{id}/keepalive"), json!(null)).await,
        api.get(&format!("/v1/sessions/{id}")).await,
        api.send("DELETE", &format!("/v1/sessions/{id}"), None).await,
    ] {
        assert_eq!((answer.status, answer.code()), (404, "session_not_found"));
    }
}

#[tokio::test]
async fn session_defaults_and_ttl_bounds() {
    let server = Server::start();
    let api = Api::new(&server);
    let created = api.post("/v1/sessions", json!({})).await;
    assert_eq!((created.status, created.body["ttl_ms"].as_u64()), (201, Some(10_000)));
    for ttl in [0u64, 199, 86_400_001, u64::MAX] {
        let answer = api.post("/v1/sessions", json!({ "ttl_ms": ttl })).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_argument"), "ttl {ttl}");
    }
    for ttl in [200u64, 86_400_000] {
        assert_eq!(api.post("/v1/sessions", json!({ "ttl_ms": ttl })).await.status, 201);
    }
    let long_name = "n".repeat(257);
    let answer = api.post("/v1/sessions", json!({ "name": long_name })).await;
    assert_eq!((answer.status, answer.code()), (400, "invalid_argument"));
}

#[tokio::test]
async fn unknown_and_malformed_session_ids_are_not_found() {
    let server = Server::start();
    let api = Api::new(&server);
    for id in ["00000000000000000000000000000000", "zz", "..%2F", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"] {
        let answer = api.post(&format!("/v1/sessions/{id}/keepalive"), json!(null)).await;
        assert_eq!((answer.status, answer.code()), (404, "session_not_found"), "{id}");
    }
    let answer = api.acquire("s", json!({ "session": "nope", "capacity": 1 })).await;
    assert_eq!((answer.status, answer.code()), (404, "session_not_found"));
    let answer =
        api.acquire("s", json!({ "session": "00000000000000000000000000000000", "capacity": 1 })).await;
    assert_eq!((answer.status, answer.code()), (404, "session_not_found"));
    assert_eq!(api.get("/v1/semaphores/s").await.status, 404, "a refused acquire created nothing");
}

#[tokio::test]
async fn sessions_are_listed_in_pages_with_their_time_left() {
    let server = Server::start();
    let api = Api::new(&server);
    let mut ids = Vec::new();
    for i in 0..5 {
        let created = api.post("/v1/sessions", json!({ "ttl_ms": 60_000, "name": format!("w{i}") })).await;
        ids.push(created.body["id"].as_str().unwrap().to_owned());
    }
    api.acquire("s", json!({ "session": ids[0], "capacity": 1 })).await;
    ids.sort();
    let first = api.get("/v1/sessions?limit=3").await;
    assert_eq!(first.status, 200, "{first:?}");
    let page: Vec<&str> =
        first.body["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(page, ids[..3].iter().map(String::as_str).collect::<Vec<_>>());
    let after = first.body["next_after"].as_str().unwrap();
    let second = api.get(&format!("/v1/sessions?limit=3&after={after}")).await;
    let rest = second.body["sessions"].as_array().unwrap();
    assert_eq!(rest.len(), 2);
    assert!(second.body["next_after"].is_null());
    let all = api.get("/v1/sessions").await.body;
    for session in all["sessions"].as_array().unwrap() {
        let left = session["remaining_ms"].as_u64().unwrap();
        assert!(left > 50_000 && left <= 60_000, "{session}");
        assert_eq!(session["ttl_ms"], 60_000);
    }
    let holds: u64 = all["sessions"].as_array().unwrap().iter().map(|s| s["holds"].as_u64().unwrap()).sum();
    assert_eq!(holds, 1);
    for bad in ["/v1/sessions?limit=0", "/v1/sessions?after=nope"] {
        assert_eq!(api.get(bad).await.status, 400, "{bad}");
    }
}

/// `POST /v1/sessions/keepalive` with these ids.
async fn keepalive_batch(api: &Api, ids: &[&str]) -> crate::Answer {
    api.post("/v1/sessions/keepalive", json!({ "sessions": ids })).await
}

/// Keepalives the server counted (renewed sessions, batched or not).
async fn keepalives_counted(api: &Api) -> f64 {
    crate::observability::sample(api, "permit_session_keepalives_total").await.expect("keepalive counter")
}

#[tokio::test]
async fn batched_keepalives_keep_sessions_alive_past_their_ttl_while_an_unrenewed_one_expires() {
    let server = Server::start();
    let api = Api::new(&server);
    let ttl = Duration::from_millis(300);
    let kept = [api.session(300).await, api.session(300).await, api.session(300).await];
    let control = api.session(300).await;
    api.acquire("b", json!({ "session": kept[0], "capacity": 1 })).await;
    let ids: Vec<&str> = kept.iter().map(String::as_str).collect();
    let started = Instant::now();
    let mut batches = 0u32;
    // Several TTLs, renewing every third of one (the pace a client keeps, not a synchronisation).
    while started.elapsed() < ttl * 4 {
        let answer = keepalive_batch(&api, &ids).await;
        assert_eq!(answer.status, 200, "after {:?}: {answer:?}", started.elapsed());
        let results = answer.body["sessions"].as_array().expect("results");
        for (result, id) in results.iter().zip(&ids) {
            assert_eq!(
                (result["id"].as_str(), result["ttl_ms"].as_u64()),
                (Some(*id), Some(300)),
                "{answer:?}"
            );
        }
        assert_eq!(results.len(), ids.len());
        batches += 1;
        tokio::time::sleep(ttl / 3).await;
    }
    assert!(batches >= 4, "{batches} batches");
    assert_eq!(keepalives_counted(&api).await, f64::from(batches) * 3.0, "each renewed session counts once");
    assert_eq!(api.holders("b").await, vec![kept[0].clone()], "the hold lived on");
    // The control session got no keepalive: it expired, and the batch says so for it alone.
    let mut with_control = ids.clone();
    with_control.insert(1, &control);
    let answer = keepalive_batch(&api, &with_control).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let results = answer.body["sessions"].as_array().unwrap();
    assert_eq!(results.len(), 4);
    assert_eq!(results[1]["id"], control.as_str());
    assert_eq!(results[1]["error"]["code"], "session_not_found", "{answer:?}");
    assert!(results[1].get("ttl_ms").is_none());
    for index in [0, 2, 3] {
        assert_eq!(results[index]["ttl_ms"], 300, "{answer:?}");
    }
}

#[tokio::test]
async fn a_batched_keepalive_answers_an_unknown_id_alone_and_renews_the_others() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(30_000).await, api.session(5_000).await);
    let unknown = "0".repeat(32);
    let answer = keepalive_batch(&api, &[&unknown, &a, &b]).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        answer.body,
        json!({ "sessions": [
            { "id": unknown, "error": { "code": "session_not_found",
                "message": "session not found (never created, closed, or expired)" } },
            { "id": a, "ttl_ms": 30_000 },
            { "id": b, "ttl_ms": 5_000 },
        ] })
    );
    assert_eq!(keepalives_counted(&api).await, 2.0);
    // A closed session is refused the same way.
    assert_eq!(api.send("DELETE", &format!("/v1/sessions/{a}"), None).await.status, 204);
    let answer = keepalive_batch(&api, &[&a]).await;
    assert_eq!(
        (answer.status, answer.body["sessions"][0]["error"]["code"].as_str()),
        (200, Some("session_not_found"))
    );
}

#[tokio::test]
async fn a_bad_batched_keepalive_is_refused_whole_and_renews_nothing() {
    let server = Server::start();
    let api = Api::new(&server);
    let session = api.session(30_000).await;
    let other = api.session(30_000).await;
    let remaining = async |api: &Api| {
        let list = api.get("/v1/sessions").await;
        let entry =
            list.body["sessions"].as_array().unwrap().iter().find(|s| s["id"] == session.as_str()).cloned();
        entry.unwrap()["remaining_ms"].as_u64().unwrap()
    };
    // Let the deadline move away from a fresh renewal, so that one would show.
    let before = remaining(&api).await;
    assert!(eventually(Duration::from_secs(5), async || remaining(&api).await + 50 < before).await);
    let lowered = remaining(&api).await;
    let too_many: Vec<String> = (0..=permit_wire::KEEPALIVE_BATCH_MAX).map(|i| format!("{i:032x}")).collect();
    let mut too_many_with_session = too_many.clone();
    too_many_with_session[0] = session.clone();
    let cases: Vec<(&str, serde_json::Value)> = vec![
        ("empty list", json!({ "sessions": [] })),
        ("too many ids", json!({ "sessions": too_many_with_session })),
        ("malformed id", json!({ "sessions": [session, "not-a-session"] })),
        ("upper-case id", json!({ "sessions": [session, other.to_uppercase()] })),
        ("repeated id", json!({ "sessions": [session, other, session] })),
    ];
    for (case, body) in cases {
        let answer = api.post("/v1/sessions/keepalive", body).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_argument"), "{case}: {answer:?}");
        assert!(answer.body["error"]["message"].as_str().unwrap().contains("sessions"), "{case}: {answer:?}");
    }
    for (case, body) in [
        ("no sessions field", json!({})),
        ("unknown field", json!({ "sessions": [session], "ttl_ms": 5 })),
        ("ids not strings", json!({ "sessions": [1, 2] })),
        ("an array body", json!([session])),
    ] {
        let answer = api.post("/v1/sessions/keepalive", body).await;
        assert_eq!((answer.status, answer.code()), (422, "invalid_body"), "{case}: {answer:?}");
    }
    let answer =
        api.raw("POST", "/v1/sessions/keepalive", "application/json", b"{\"sessions\": [".to_vec()).await;
    assert_eq!((answer.status, answer.code()), (400, "malformed_json"), "{answer:?}");
    // The largest batch fits the body limit.
    let full: Vec<String> = too_many[..permit_wire::KEEPALIVE_BATCH_MAX].to_vec();
    let answer = api.post("/v1/sessions/keepalive", json!({ "sessions": full })).await;
    assert_eq!(answer.status, 200, "a full batch of unknown ids: {:?}", answer.body["error"]);
    assert_eq!(answer.body["sessions"].as_array().unwrap().len(), permit_wire::KEEPALIVE_BATCH_MAX);
    // Nothing was renewed by any of them.
    assert_eq!(keepalives_counted(&api).await, 0.0);
    assert!(remaining(&api).await <= lowered, "a refused batch renewed the session");
    // The path now names the batch route: other methods on it are 405, not a session lookup.
    let answer = api.get("/v1/sessions/keepalive").await;
    assert_eq!(answer.status, 405, "{answer:?}");
}
