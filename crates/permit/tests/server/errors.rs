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
async fn bodies_that_are_not_json_objects_are_invalid() {
    let server = Server::start();
    let api = Api::new(&server);
    // serde reads an array as a struct's fields in order: `[]` was a session with defaults.
    for body in ["[]", "[5000]", r#"[5000, "x"]"#, "5", "null", r#""x""#, "true"] {
        for (method, path) in [("POST", "/v1/sessions"), ("PUT", "/v1/semaphores/s")] {
            let answer = api.raw(method, path, "application/json", body.as_bytes().to_vec()).await;
            assert_eq!((answer.status, answer.code()), (422, "invalid_body"), "{method} {path} {body}");
        }
    }
    assert_eq!(api.get("/v1/semaphores/s").await.status, 404, "nothing was created");
    let metrics = api.get("/metrics").await.body.as_str().unwrap_or_default().to_owned();
    assert!(metrics.lines().any(|line| line == "permit_sessions 0"), "no session was created: {metrics}");
}

#[tokio::test]
async fn path_segments_that_are_not_utf8_get_typed_errors() {
    let server = Server::start();
    let api = Api::new(&server);
    for path in ["/v1/sessions/%FF", "/v1/semaphores/%C3", "/v1/elections/%FF%FE"] {
        let answer = api.get(path).await;
        assert_eq!((answer.status, answer.code()), (400, "invalid_argument"), "{path}");
    }
}

#[tokio::test]
async fn a_node_cannot_be_added_at_its_own_address_or_at_an_empty_port() {
    let server = Server::start();
    let api = Api::new(&server);
    // Replicating to itself as a learner made openraft panic and the node abort (API fuzzing).
    let own = api.post("/v1/cluster/members", json!({ "id": 2, "addr": server.addr })).await;
    assert_eq!((own.status, own.code()), (400, "invalid_argument"), "{own:?}");
    let port = server.addr.rsplit_once(':').unwrap().1;
    let alias =
        api.post("/v1/cluster/members", json!({ "id": 2, "addr": format!("localhost:{port}") })).await;
    assert_eq!((alias.status, alias.code()), (400, "invalid_argument"), "{alias:?}");
    let nobody = api.post("/v1/cluster/members", json!({ "id": 2, "addr": "127.0.0.1:1" })).await;
    assert_eq!((nobody.status, nobody.code()), (400, "invalid_argument"), "{nobody:?}");
    assert_eq!(api.get("/v1/health").await.status, 200, "the node still serves");
    let view = api.get("/v1/cluster").await;
    assert_eq!(view.body["members"].as_array().map(Vec::len), Some(1), "{view:?}");
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
    // A method without an access rule is not served, whatever axum routes (it answers HEAD with
    // a GET route's handler): `Allow` names the methods that have one.
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    for (method, path, allow) in [
        (reqwest::Method::HEAD, "/v1/semaphores/s", "GET,PUT,DELETE"),
        (reqwest::Method::PATCH, "/v1/semaphores/s", "GET,PUT,DELETE"),
        (reqwest::Method::HEAD, "/v1/health", "GET"),
        (reqwest::Method::GET, "/v1/queues/q/claim", "POST"),
    ] {
        let answer = http.request(method.clone(), format!("{}{path}", server.url)).send().await.unwrap();
        assert_eq!(answer.status(), 405, "{method} {path}");
        assert_eq!(
            answer.headers().get("allow").and_then(|v| v.to_str().ok()),
            Some(allow),
            "{method} {path}"
        );
    }
}

#[tokio::test]
async fn a_push_takes_bodies_up_to_4_mib_and_every_other_route_up_to_64_kib() {
    let server = Server::start();
    let api = Api::new(&server);
    let padded = |json: &str, bytes: usize| format!("{json}{}", " ".repeat(bytes - json.len())).into_bytes();
    let cases = [
        ("POST", "/v1/queues/q/items", padded(r#"{"payload": 1}"#, 70 * 1024), 201, "<no error code>"),
        (
            "POST",
            "/v1/queues/q/items",
            padded(r#"{"payload": 2}"#, 4 * 1024 * 1024 + 1),
            413,
            "body_too_large",
        ),
        ("PUT", "/v1/queues/q", padded(r#"{"max_attempts": 3}"#, 70 * 1024), 413, "body_too_large"),
        ("POST", "/v1/sessions", padded(r#"{"ttl_ms": 5000}"#, 70 * 1024), 413, "body_too_large"),
        ("POST", "/v1/sessions", padded(r#"{"ttl_ms": 5000}"#, 60 * 1024), 201, "<no error code>"),
    ];
    for (method, path, body, status, code) in cases {
        let size = body.len();
        let answer = api.raw(method, path, "application/json", body).await;
        assert_eq!((answer.status, answer.code()), (status, code), "{method} {path} with {size} bytes");
    }
    let queue = api.get("/v1/queues/q").await;
    assert_eq!((queue.body["pending"].as_u64(), queue.body["max_attempts"].as_u64()), (Some(1), Some(5)));
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
