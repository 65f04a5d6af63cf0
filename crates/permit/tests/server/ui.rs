//! `/ui`: the dashboard's files (content types, the security headers) and the read-only API
//! additions it uses (`GET /v1/elections`, `held_ms`). The page itself is driven in a real
//! browser by the `dashboard` test target.

use std::time::Duration;

use serde_json::json;

use crate::common::{eventually, Server};
use crate::Api;

#[tokio::test]
async fn the_dashboard_files_are_served_with_their_types_and_a_strict_policy() {
    let server = Server::start();
    permit_client::install_crypto_provider(); // as every client of this suite (each may run alone)
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let files = [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/index.html", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
        ("/ui/favicon.svg", "image/svg+xml"),
        ("/ui/config.json", "application/json"),
    ];
    for (path, content_type) in files {
        let response = http.get(format!("{}{path}", server.url)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], content_type, "{path}");
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(policy.contains("default-src 'none'") && policy.contains("script-src 'self'"), "{policy}");
        assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"), "{policy}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        let body = response.text().await.unwrap();
        assert!(!body.is_empty(), "{path}");
        // Nothing is fetched from elsewhere at run time.
        // (The SVG namespace is a name, not a fetch.)
        let body = body.replace("http://www.w3.org/2000/svg", "");
        assert!(!body.contains("http://") && !body.contains("https://"), "{path} names another origin");
    }
    let html = http.get(format!("{}/ui", server.url)).send().await.unwrap().text().await.unwrap();
    assert!(!html.contains("<script>") && !html.contains("style="), "no inline script or style");

    let api = Api::new(&server);
    let config = json!({ "auth": false, "node_id": 1, "addr": server.addr });
    assert_eq!(api.get("/ui/config.json").await.body, config, "the header names this node and its address");
    let missing = api.get("/ui/../Cargo.toml").await;
    assert_eq!(missing.status, 404, "{missing:?}");
    let missing = api.get("/ui/secret.txt").await;
    assert_eq!((missing.status, missing.code()), (404, "not_found"));
    let post = api.post("/ui", json!({})).await;
    assert_eq!((post.status, post.code()), (405, "method_not_allowed"));
}

#[tokio::test]
async fn elections_are_listed_with_their_leaders_tenure_and_holds_with_their_age() {
    let server = Server::start();
    let api = Api::new(&server);
    let created = api.post("/v1/sessions", json!({ "ttl_ms": 30_000, "name": "worker-1" })).await;
    let session = created.body["id"].as_str().unwrap().to_owned();
    let other = api.session(30_000).await;
    for (name, value) in [("zeta", "z"), ("alpha", "a")] {
        let answer = api
            .post(&format!("/v1/elections/{name}/campaign"), json!({ "session": session, "value": value }))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let candidate = api.clone();
    let waiting = tokio::spawn(async move {
        candidate
            .post(
                "/v1/elections/alpha/campaign",
                json!({ "session": other, "value": "b", "wait_ms": 30_000 }),
            )
            .await
    });
    let queued = eventually(Duration::from_secs(5), async || {
        api.get("/v1/elections/alpha").await.body["candidates"] == 1
    })
    .await;
    assert!(queued, "the second candidate did not queue");
    assert_eq!(api.acquire("gpu", json!({ "session": session, "capacity": 2 })).await.status, 200);

    let list = api.get("/v1/elections").await;
    assert_eq!(list.status, 200, "{list:?}");
    let names: Vec<&str> =
        list.body["elections"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha", "zeta"], "name order; semaphores are not elections");
    let alpha = &list.body["elections"][0];
    assert_eq!(alpha["leader"]["value"], "a");
    assert_eq!(alpha["leader"]["session_name"], "worker-1");
    assert_eq!(alpha["candidates"], 1);
    let page = api.get("/v1/elections?limit=1").await;
    assert_eq!(page.body["next_after"], "alpha");
    let rest = api.get("/v1/elections?after=alpha").await;
    assert_eq!(rest.body["elections"][0]["name"], "zeta");
    assert_eq!(rest.body["next_after"], serde_json::Value::Null);
    let bad = api.get("/v1/elections?limit=0").await;
    assert_eq!((bad.status, bad.code()), (400, "invalid_argument"));

    // Tenure and hold age grow with leader time, without any write in between.
    let first = api.get("/v1/semaphores/gpu").await.body["holders"][0]["held_ms"].as_u64().unwrap();
    let tenure = alpha["leader"]["held_ms"].as_u64().unwrap();
    let grew = eventually(Duration::from_secs(5), async || {
        let held = api.get("/v1/semaphores/gpu").await.body["holders"][0]["held_ms"].as_u64().unwrap();
        let now = api.get("/v1/elections/alpha").await.body["leader"]["held_ms"].as_u64().unwrap();
        held >= first + 300 && now >= tenure + 300
    })
    .await;
    assert!(grew, "held_ms did not grow");
    waiting.abort();
}

#[tokio::test]
async fn waiters_carry_how_long_they_have_waited_and_the_list_the_oldest_wait() {
    let server = Server::start();
    let api = Api::new(&server);
    let holder = api.session(30_000).await;
    let waiter = api.session(30_000).await;
    assert_eq!(api.acquire("one", json!({ "session": holder, "capacity": 1 })).await.status, 200);
    let list = api.get("/v1/semaphores").await;
    assert_eq!(list.body["semaphores"][0]["oldest_wait_ms"], serde_json::Value::Null, "nobody waits");
    let client = api.clone();
    let body = json!({ "session": waiter, "wait_ms": 30_000 });
    let waiting = tokio::spawn(async move { client.acquire("one", body).await });
    let waited = eventually(Duration::from_secs(5), async || {
        let view = api.get("/v1/semaphores/one").await.body;
        let list = api.get("/v1/semaphores").await.body;
        view["waiters"][0]["waiting_ms"].as_u64().is_some_and(|ms| ms >= 300)
            && list["semaphores"][0]["oldest_wait_ms"].as_u64().is_some_and(|ms| ms >= 300)
    })
    .await;
    assert!(waited, "{:?}", api.get("/v1/semaphores/one").await);
    assert_eq!(api.release("one", &holder).await.status, 200);
    assert_eq!(waiting.await.unwrap().status, 200);
    let list = api.get("/v1/semaphores").await;
    assert_eq!(list.body["semaphores"][0]["oldest_wait_ms"], serde_json::Value::Null, "{list:?}");
}
