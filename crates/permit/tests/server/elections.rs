use serde_json::json;

use crate::common::Server;
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
