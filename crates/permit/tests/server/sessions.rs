use serde_json::json;

use crate::common::Server;
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
