//! Tenants of one server with `--auth` (issue 28): what one token can learn of another's
//! sessions, and how soon a deleted token loses what it holds open.

use std::time::Duration;

use serde_json::json;

use crate::auth::{secured, token, ROOT};
use crate::observability::Sse;
use crate::Api;

/// Finding 5: `session:=write` (the README's example) listed every token's sessions, and
/// `GET /v1/sessions/{id}` showed the names and fencing tokens of another tenant's holds on
/// semaphores the caller gets 403 for; its event stream showed their sessions' events.
#[tokio::test]
async fn a_tenant_sees_neither_another_tenants_sessions_nor_their_holds() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let a = Api::with_token(
        &server.url,
        &token(&root, "tenant-a", &["session:=write", "semaphore:a.=write"]).await.0,
    );
    let b = Api::with_token(
        &server.url,
        &token(&root, "tenant-b", &["session:=write", "semaphore:b.=write"]).await.0,
    );
    let mut b_events = Sse::open(&b, "/v1/events", None).await;

    let created = a.post("/v1/sessions", json!({ "ttl_ms": 60_000, "name": "a-worker" })).await;
    assert_eq!(created.status, 201, "{created:?}");
    let a_session = created.body["id"].as_str().unwrap().to_owned();
    let held = a.acquire("a.secret", json!({ "session": a_session, "capacity": 1 })).await;
    assert_eq!(held.status, 200, "{held:?}");
    let fencing = held.body["token"].as_u64().unwrap();
    let b_session = b.session(60_000).await;
    assert_eq!(b.acquire("b.own", json!({ "session": b_session, "capacity": 1 })).await.status, 200);

    // The listing shows b its own session only, fresh or stale.
    for path in ["/v1/sessions", "/v1/sessions?stale=true"] {
        let listed = b.get(path).await;
        assert_eq!(listed.status, 200, "{listed:?}");
        let ids: Vec<&str> =
            listed.body["sessions"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
        assert_eq!(ids, [b_session.as_str()], "{path}: {listed:?}");
    }
    // A's session is refused to b, and the answer names neither the semaphore nor the token.
    for path in [format!("/v1/sessions/{a_session}"), format!("/v1/sessions/{a_session}?stale=true")] {
        let view = b.get(&path).await;
        assert_eq!((view.status, view.code()), (403, "permission_denied"), "{path}: {view:?}");
        let text = view.body.to_string();
        assert!(!text.contains("a.secret") && !text.contains("a-worker"), "{path}: {text}");
    }
    // B's stream: its own session and semaphore, never a's session or hold.
    let frames = b_events.until("granted", Duration::from_secs(5)).await;
    let seen: Vec<(String, Option<String>)> =
        frames.iter().map(|f| (f.event.clone(), f.data["session"].as_str().map(str::to_owned))).collect();
    assert_eq!(seen[0], ("session_created".to_owned(), Some(b_session.clone())), "{seen:?}");
    for frame in &frames {
        let text = frame.data.to_string();
        assert!(!text.contains(&a_session) && !text.contains("a.secret"), "b saw a's event {text}");
    }

    // `session` admin shows every session, but a hold only on an object the caller may read.
    let auditor = Api::with_token(&server.url, &token(&root, "auditor", &["session:=admin"]).await.0);
    let listed = auditor.get("/v1/sessions").await.body;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 2, "{listed}");
    let summary =
        listed["sessions"].as_array().unwrap().iter().find(|s| s["id"] == a_session.as_str()).unwrap();
    assert_eq!(summary["holds"], 0, "the auditor may not read a.secret: {summary}");
    let view = auditor.get(&format!("/v1/sessions/{a_session}")).await;
    assert_eq!(view.status, 200, "{view:?}");
    assert_eq!(view.body["holds"], json!([]), "{view:?}");
    // Root (and a itself) see the hold with its name and fencing token.
    for caller in [&root, &a] {
        let view = caller.get(&format!("/v1/sessions/{a_session}")).await;
        assert_eq!(view.body["holds"][0]["name"], "a.secret", "{view:?}");
        assert_eq!(view.body["holds"][0]["token"], fencing, "{view:?}");
    }
}
