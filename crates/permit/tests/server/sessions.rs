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
