use std::time::Duration;

use serde_json::json;

use crate::common::Server;
use crate::observability::Sse;
use crate::Api;

#[tokio::test]
async fn campaign_observe_resign_hands_leadership_to_the_next_candidate() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let nobody = api.get("/v1/elections/scheduler").await;
    assert_eq!((nobody.status, nobody.body["leader"].is_null()), (200, true));

    let won =
        api.post("/v1/elections/scheduler/campaign", json!({ "session": a, "value": "10.0.0.1:80" })).await;
    assert_eq!((won.status, won.body["status"].as_str()), (200, Some("leader")));
    let token_a = won.body["token"].as_u64().unwrap();
    let lost = api
        .post("/v1/elections/scheduler/campaign", json!({ "session": b, "value": "b", "wait_ms": 1 }))
        .await;
    assert_eq!((lost.status, lost.body["position"].as_u64()), (202, Some(1)));

    let view = api.get("/v1/elections/scheduler").await;
    assert_eq!(view.body["leader"]["session"], a.as_str());
    assert_eq!(view.body["leader"]["value"], "10.0.0.1:80");
    assert_eq!(view.body["candidates"], 1);

    assert_eq!(api.post("/v1/elections/scheduler/resign", json!({ "session": a })).await.body["released"], 1);
    let view = api.get("/v1/elections/scheduler").await;
    assert_eq!(view.body["leader"]["session"], b.as_str());
    assert_eq!(view.body["leader"]["value"], "b");
    assert!(view.body["leader"]["token"].as_u64().unwrap() > token_a);

    api.post("/v1/elections/scheduler/resign", json!({ "session": b })).await;
    assert!(api.get("/v1/elections/scheduler").await.body["leader"].is_null());
}

#[tokio::test]
async fn elections_and_semaphores_are_separate_namespaces() {
    let server = Server::start();
    let api = Api::new(&server);
    let a = api.session(10_000).await;
    api.post("/v1/elections/x/campaign", json!({ "session": a, "value": "v" })).await;
    assert_eq!(api.get("/v1/semaphores/x").await.code(), "semaphore_not_found");
    let too_big = "v".repeat(4097);
    let answer = api.post("/v1/elections/y/campaign", json!({ "session": a, "value": too_big })).await;
    assert_eq!((answer.status, answer.code()), (400, "invalid_argument"));
}

/// etcd's `Proclaim`: the leader publishes a new value and keeps its leadership; a GET, a
/// blocked watcher and the event stream see it.
#[tokio::test]
async fn the_leader_proclaims_a_new_value_that_reads_watchers_and_events_see_with_the_same_token() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    let won = api.post("/v1/elections/e/campaign", json!({ "session": a, "value": "10.0.0.1:80" })).await;
    let token = won.body["token"].as_u64().unwrap();
    api.post("/v1/elections/e/campaign", json!({ "session": b, "value": "b", "wait_ms": 1 })).await;
    let index = api.get("/v1/elections/e").await.index.unwrap();
    let watcher = {
        let api = api.clone();
        tokio::spawn(async move { api.get(&format!("/v1/elections/e?index={index}&wait_ms=10000")).await })
    };
    let mut events = Sse::open(&api, "/v1/events?kinds=proclaimed", None).await;

    let proclaimed =
        api.post("/v1/elections/e/proclaim", json!({ "session": a, "value": "10.0.0.2:80" })).await;
    assert_eq!(proclaimed.status, 200, "{proclaimed:?}");
    assert_eq!(
        (
            proclaimed.body["session"].as_str(),
            proclaimed.body["value"].as_str(),
            proclaimed.body["token"].as_u64()
        ),
        (Some(a.as_str()), Some("10.0.0.2:80"), Some(token))
    );
    let woken = watcher.await.unwrap();
    assert!(woken.index.unwrap() > index, "{woken:?}");
    assert_eq!(woken.body["leader"]["value"], "10.0.0.2:80");
    let view = api.get("/v1/elections/e").await.body;
    assert_eq!(view["leader"]["session"], a.as_str());
    assert_eq!(view["leader"]["value"], "10.0.0.2:80");
    assert_eq!(view["leader"]["token"], token, "the same leadership");
    assert_eq!(view["candidates"], 1, "the queue is untouched");
    let frames = events.until("proclaimed", Duration::from_secs(5)).await;
    let event = &frames.last().unwrap().data;
    assert_eq!(
        (event["name"].as_str(), event["session"].as_str(), event["value"].as_str(), event["token"].as_u64()),
        (Some("e"), Some(a.as_str()), Some("10.0.0.2:80"), Some(token))
    );

    // The proclaimed value goes with the leadership: the next leader publishes its own.
    api.post("/v1/elections/e/resign", json!({ "session": a })).await;
    let view = api.get("/v1/elections/e").await.body;
    assert_eq!(
        (view["leader"]["session"].as_str(), view["leader"]["value"].as_str()),
        (Some(b.as_str()), Some("b"))
    );
}

#[tokio::test]
async fn a_proclaim_by_a_session_that_does_not_lead_is_refused_and_changes_nothing() {
    let server = Server::start();
    let api = Api::new(&server);
    let (a, b) = (api.session(10_000).await, api.session(10_000).await);
    api.post("/v1/elections/e/campaign", json!({ "session": a, "value": "a" })).await;
    api.post("/v1/elections/e/campaign", json!({ "session": b, "value": "b", "wait_ms": 1 })).await;
    let mut before = api.get("/v1/elections/e").await;
    let unknown = "00000000000000000000000000000001";
    let cases = [
        ("e", b.as_str(), "b2".to_owned(), 409, "not_leader", "a waiting candidate"),
        ("nobody", a.as_str(), "x".to_owned(), 409, "not_leader", "an election without a leader"),
        ("e", unknown, "x".to_owned(), 404, "session_not_found", "an unknown session"),
        ("e", a.as_str(), "v".repeat(4097), 400, "invalid_argument", "a value too long"),
    ];
    for (name, session, value, status, code, what) in cases {
        let refused = api
            .post(&format!("/v1/elections/{name}/proclaim"), json!({ "session": session, "value": value }))
            .await;
        assert_eq!((refused.status, refused.code()), (status, code), "{what}: {refused:?}");
    }
    let mut after = api.get("/v1/elections/e").await;
    for view in [&mut before.body, &mut after.body] {
        view["leader"].as_object_mut().unwrap().remove("held_ms"); // the tenure goes on
    }
    assert_eq!((after.index, &after.body), (before.index, &before.body), "nothing changed");
    assert!(api.get("/v1/elections/nobody").await.body["leader"].is_null(), "nothing was created");
}

/// A second campaign by the leader with another value publishes it (it used to keep the old
/// one); with the same value, it changes nothing.
#[tokio::test]
async fn a_leader_campaigning_again_with_a_new_value_publishes_it_and_keeps_its_token() {
    let server = Server::start();
    let api = Api::new(&server);
    let a = api.session(10_000).await;
    let campaign =
        |value: &'static str| api.post("/v1/elections/e/campaign", json!({ "session": a, "value": value }));
    let first = campaign("old").await;
    let token = first.body["token"].as_u64().unwrap();
    let again = campaign("new").await;
    assert_eq!(
        (again.status, again.body["status"].as_str(), again.body["token"].as_u64()),
        (200, Some("leader"), Some(token))
    );
    let seen = api.get("/v1/elections/e").await;
    assert_eq!(
        (seen.body["leader"]["value"].as_str(), seen.body["leader"]["token"].as_u64()),
        (Some("new"), Some(token))
    );
    let same = campaign("new").await;
    assert_eq!(same.body["token"].as_u64(), Some(token));
    assert_eq!(api.get("/v1/elections/e").await.index, seen.index, "the same value again changes nothing");
}
