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

/// Finding 4: deleting a token did not end its open event streams (they kept streaming grants
/// and election values) nor its blocking reads and waits. Each now ends within a second of the
/// deletion being applied: the stream closes, a long-poll answers 401.
#[tokio::test]
async fn deleting_a_token_ends_its_event_stream_and_long_polls_within_a_second() {
    // Four long-poll places: a fifth long-poll is refused once the four below are open.
    let (server, _temp) = secured(&["--long-polls-per-token-max", "4"]).await;
    let root = Api::with_token(&server.url, ROOT);
    let rules = ["session:=write", "semaphore:=write", "election:=write"];
    let (secret, id) = token(&root, "doomed", &rules).await;
    let doomed = Api::with_token(&server.url, &secret);

    // Root holds the lock and leads the election; the doomed token's session queues behind.
    let holder = root.session(60_000).await;
    assert_eq!(root.acquire("one", json!({ "session": holder, "capacity": 1 })).await.status, 200);
    let campaign = json!({ "session": holder, "value": "root" });
    assert_eq!(root.post("/v1/elections/lead/campaign", campaign).await.status, 200);
    root.semaphore("quiet", 1).await;
    let index = root.get("/v1/semaphores/quiet").await.index.expect("an index");
    let session = doomed.session(60_000).await;

    let mut stream = Sse::open(&doomed, "/v1/events", None).await;
    let spawn = |method: &'static str, path: String, body: Option<serde_json::Value>| {
        let doomed = doomed.clone();
        tokio::spawn(async move {
            // Retried while the probe below holds the last place for a moment.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                let answer = doomed.send(method, &path, body.clone()).await;
                if answer.code() != "limit_exceeded" || tokio::time::Instant::now() > deadline {
                    return answer;
                }
            }
        })
    };
    let acquire = json!({ "session": session, "wait_ms": 30_000 });
    let campaign = json!({ "session": session, "value": "d", "wait_ms": 30_000 });
    let polls = [
        ("acquire", spawn("POST", "/v1/semaphores/one/acquire".into(), Some(acquire))),
        ("campaign", spawn("POST", "/v1/elections/lead/campaign".into(), Some(campaign))),
        ("watch", spawn("GET", format!("/v1/semaphores/quiet?index={index}&wait_ms=30000"), None)),
    ];
    // The stream, the queued acquire and campaign, and the watch hold the four places once a
    // fifth long-poll is refused (a short watch that gets a place answers at once instead).
    let queued = crate::common::eventually(Duration::from_secs(10), async || {
        let waiters = |view: &serde_json::Value| view["waiters"].as_array().map_or(0, Vec::len);
        waiters(&root.get("/v1/semaphores/one").await.body) == 1
            && root.get("/v1/elections/lead").await.body["candidates"] == 1
    })
    .await;
    assert!(queued, "the acquire and the campaign did not queue");
    let probe = format!("/v1/semaphores/quiet?index={index}&wait_ms=1");
    let open = crate::common::eventually(Duration::from_secs(10), async || {
        doomed.get(&probe).await.code() == "limit_exceeded"
    })
    .await;
    assert!(open, "the long-polls did not all open");

    let deleted = root.send("DELETE", &format!("/v1/acl/tokens/{id}"), None).await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    // The leader answers once the deletion is applied: from here, a second at most.
    let applied = tokio::time::Instant::now() + Duration::from_secs(1);
    for (what, poll) in polls {
        let answer = tokio::time::timeout_at(applied, poll).await;
        let answer = answer.unwrap_or_else(|_| panic!("the {what} long-poll still waits")).unwrap();
        assert_eq!((answer.status, answer.code()), (401, "unauthenticated"), "{what}: {answer:?}");
    }
    let left = applied.saturating_duration_since(tokio::time::Instant::now());
    assert!(stream.closed_within(left).await, "the event stream is still open");
    // The lock and the election are untouched: root still holds and leads.
    assert_eq!(root.holders("one").await, vec![holder.clone()]);
    let lead = root.get("/v1/elections/lead").await;
    assert_eq!(lead.body["leader"]["session"], holder.as_str(), "{lead:?}");
}

/// Finding 7 (event fan-out): a stream is woken only for the events it may see, so it sleeps
/// through the others and, woken again, reads from its own first event. A reader of `pub.` that
/// sat through more than a ring's worth of events it may not see still gets the next `pub.`
/// event, and no `missed` frame: it lost nothing it could see. (That idle streams cost a write
/// nothing is `fanout::tests::only_the_streams_that_may_see_an_event_are_woken`.)
#[tokio::test]
async fn a_stream_sleeps_through_events_it_may_not_see_and_misses_none_of_its_own() {
    let ring = permit_server::observe::EVENT_RING_LEN;
    let cap = (2 * ring).to_string();
    let (server, _temp) = secured(&["--sessions-per-token-max", &cap]).await;
    let root = Api::with_token(&server.url, ROOT);
    let reader = Api::with_token(&server.url, &token(&root, "reader", &["semaphore:pub.=read"]).await.0);
    let mut stream = Sse::open(&reader, "/v1/events", None).await;
    // More session creations (one event each) than the ring holds, from a few clients at once.
    let clients = 16;
    let writers: Vec<_> = (0..clients)
        .map(|_| {
            let root = root.clone();
            tokio::spawn(async move {
                for _ in 0..ring / clients + 10 {
                    root.session(600_000).await;
                }
            })
        })
        .collect();
    for writer in writers {
        tokio::time::timeout(Duration::from_secs(120), writer).await.expect("the writers finish").unwrap();
    }
    let session = root.session(60_000).await;
    assert_eq!(root.acquire("pub.b", json!({ "session": session, "capacity": 1 })).await.status, 200);
    let first = stream.next(Duration::from_secs(5)).await.expect("a frame");
    assert_eq!(
        (first.event.as_str(), first.data["name"].as_str()),
        ("capacity_changed", Some("pub.b")),
        "{first:?}"
    );
    let second = stream.next(Duration::from_secs(5)).await.expect("a frame");
    assert_eq!(
        (second.event.as_str(), second.data["name"].as_str()),
        ("granted", Some("pub.b")),
        "{second:?}"
    );
}
