//! Bad input gets a typed 4xx and changes nothing.

use serde_json::json;

use crate::common::Server;
use crate::Api;

#[tokio::test]
async fn bad_bodies_get_typed_errors() {
    let server = Server::start();
    let api = Api::new(&server);
    let a = api.session(10_000).await;
    let path = "/v1/semaphores/s/acquire";
    let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("application/json", b"{".to_vec(), 400, "malformed_json"),
        ("application/json", br#"{"session": "a","#.to_vec(), 400, "malformed_json"),
        ("application/json", b"".to_vec(), 400, "malformed_json"),
        ("application/json", br#"{"session": 5}"#.to_vec(), 422, "invalid_body"),
        ("application/json", br#"{"permits": 1}"#.to_vec(), 422, "invalid_body"),
        ("application/json", format!(r#"{{"session":"{a}","bogus":1}}"#).into_bytes(), 422, "invalid_body"),
        (
            "application/json",
            format!(r#"{{"session":"{a}","permits":-1}}"#).into_bytes(),
            422,
            "invalid_body",
        ),
        (
            "application/json",
            format!(r#"{{"session":"{a}","permits":1e3}}"#).into_bytes(),
            422,
            "invalid_body",
        ),
        (
            "application/json",
            format!(r#"{{"session":"{a}","permits":18446744073709551616}}"#).into_bytes(),
            422,
            "invalid_body",
        ),
        ("text/plain", format!(r#"{{"session":"{a}"}}"#).into_bytes(), 415, "unsupported_media_type"),
        ("application/json", vec![b' '; 70 * 1024], 413, "body_too_large"),
        // Deep nesting fails at the first wrong type, long before any recursion limit.
        ("application/json", "[".repeat(10_000).into_bytes(), 422, "invalid_body"),
    ];
    for (content_type, body, status, code) in cases {
        let preview = String::from_utf8_lossy(&body[..body.len().min(60)]).into_owned();
        let answer = api.raw("POST", path, content_type, body).await;
        assert_eq!((answer.status, answer.code()), (status, code), "{content_type} {preview}");
        assert!(answer.body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    assert_eq!(api.get("/v1/semaphores/s").await.status, 404, "nothing was created");
}

#[tokio::test]
async fn out_of_range_numbers_and_bad_names_are_refused() {
    let server = Server::start();
    let api = Api::new(&server);
    let a = api.session(10_000).await;
    api.semaphore("s", 2).await;
    let cases = [
        (json!({ "session": a, "permits": 0 }), 400, "invalid_argument"),
        (json!({ "session": a, "permits": 3 }), 409, "permits_exceed_capacity"),
        (json!({ "session": a, "permits": 1_000_001 }), 400, "invalid_argument"),
        (json!({ "session": a, "max_hold_ms": 99 }), 400, "invalid_argument"),
        (json!({ "session": a, "max_hold_ms": 604_800_001u64 }), 400, "invalid_argument"),
    ];
    for (body, status, code) in cases {
        let answer = api.acquire("s", body.clone()).await;
        assert_eq!((answer.status, answer.code()), (status, code), "{body}");
    }
    for capacity in [0u64, 1_000_001] {
        let answer = api.send("PUT", "/v1/semaphores/t", Some(json!({ "capacity": capacity }))).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_argument"));
        let answer = api.acquire("t", json!({ "session": a, "capacity": capacity })).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_argument"));
    }
    let long = "x".repeat(129);
    for name in ["a%20b", "%C3%A9", "a%2Fb", long.as_str(), "a*b", "%00"] {
        let answer = api.get(&format!("/v1/semaphores/{name}")).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_name"), "{name}");
    }
    let view = api.get("/v1/semaphores/s").await;
    assert_eq!((view.body["held"].as_u64(), view.body["capacity"].as_u64()), (Some(0), Some(2)));
    assert_eq!(api.get("/v1/semaphores?limit=0").await.code(), "invalid_argument");
    assert_eq!(api.get("/v1/semaphores?limit=x").await.code(), "invalid_argument");
    assert_eq!(api.get("/v1/semaphores/s?index=-1").await.code(), "invalid_argument");
}

#[tokio::test]
async fn unknown_routes_and_methods_get_json_errors() {
    let server = Server::start();
    let api = Api::new(&server);
    let answer = api.get("/v2/nothing").await;
    assert_eq!((answer.status, answer.code()), (404, "not_found"));
    let answer = api.send("PATCH", "/v1/semaphores/s", None).await;
    assert_eq!((answer.status, answer.code()), (405, "method_not_allowed"));
}

#[tokio::test]
async fn the_server_survives_garbage_on_every_route() {
    let server = Server::start();
    let api = Api::new(&server);
    let bodies: [&[u8]; 5] =
        [b"null", b"\"x\"", b"{\"session\":null}", b"\xff\xfe", b"{\"session\":\"a\",\"session\":\"b\"}"];
    let routes = [
        ("POST", "/v1/sessions"),
        ("POST", "/v1/sessions/abc/keepalive"),
        ("PUT", "/v1/semaphores/s"),
        ("POST", "/v1/semaphores/s/acquire"),
        ("POST", "/v1/semaphores/s/release"),
        ("POST", "/v1/semaphores/s/validate"),
        ("POST", "/v1/elections/e/campaign"),
        ("POST", "/v1/elections/e/resign"),
        ("POST", "/raft/append"),
        ("POST", "/raft/vote"),
        ("POST", "/raft/snapshot"),
    ];
    for (method, route) in routes {
        for body in bodies {
            let answer = api.raw(method, route, "application/json", body.to_vec()).await;
            assert!((400..500).contains(&answer.status), "{method} {route} {body:?}: {answer:?}");
        }
    }
    assert_eq!(api.get("/v1/health").await.status, 200, "still serving");
}
