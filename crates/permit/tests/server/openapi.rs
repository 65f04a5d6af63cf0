//! The served spec is the committed `docs/openapi.json`, and it documents every client route.

use crate::common::Server;
use crate::Api;

#[tokio::test]
async fn the_served_spec_is_the_committed_one_and_lists_every_route() {
    let server = Server::start();
    let api = Api::new(&server);
    let served = api.get("/v1/openapi.json").await;
    assert_eq!(served.status, 200);
    let committed_path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/openapi.json");
    let committed: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(committed_path).unwrap()).unwrap();
    assert_eq!(
        served.body, committed,
        "docs/openapi.json is out of date: run `cargo test -p permit-server openapi`"
    );
    let paths = served.body["paths"].as_object().unwrap();
    for route in [
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/keepalive",
        "/v1/sessions/keepalive",
        "/v1/semaphores",
        "/v1/semaphores/{name}",
        "/v1/semaphores/{name}/acquire",
        "/v1/semaphores/{name}/release",
        "/v1/semaphores/{name}/validate",
        "/v1/elections/{name}",
        "/v1/elections/{name}/campaign",
        "/v1/elections/{name}/resign",
        "/v1/health",
        "/v1/health/live",
        "/metrics",
    ] {
        assert!(paths.contains_key(route), "{route} missing from the spec");
    }
    let codes = served.body["components"]["schemas"]["ErrorCode"]["enum"].as_array().unwrap();
    assert_eq!(codes.len(), permit_wire::ErrorCode::ALL.len());
}
