//! `--auth` on a 3-node cluster: init with the root secret, and revocation seen by every node.

use std::time::Duration;

use serde_json::json;

use crate::common::{eventually, Cluster};
use crate::Api;

const ROOT: &str = "cluster-root-secret-0123456789abcdef";

#[tokio::test]
async fn deleting_a_token_ends_its_sessions_and_frees_their_permits_on_every_node() {
    let cluster = Cluster::start_secured(3, ROOT, &[]).await;
    let roots: Vec<Api> = cluster.nodes.iter().map(|n| Api::with_token(&n.url, ROOT)).collect();
    let ready = eventually(Duration::from_secs(10), async || {
        roots[0].get("/v1/acl/tokens/self").await.body["id"] == "0".repeat(32)
    })
    .await;
    assert!(ready, "the root token was bootstrapped");

    let rules = json!([
        { "resource": "semaphore", "prefix": "", "access": "write" },
        { "resource": "session", "prefix": "", "access": "write" },
    ]);
    let doomed = roots[1].post("/v1/acl/tokens", json!({ "name": "doomed", "rules": rules })).await;
    assert_eq!(doomed.status, 201, "{doomed:?}");
    let (secret, id) = (doomed.body["secret"].as_str().unwrap(), doomed.body["id"].as_str().unwrap());
    let other = roots[2].post("/v1/acl/tokens", json!({ "name": "other", "rules": rules })).await;
    let other_secret = other.body["secret"].as_str().unwrap();

    // The doomed token holds the only permit, through a follower; another token queues behind.
    let doomed_api = Api::with_token(&cluster.nodes[1].url, secret);
    let session = doomed_api.session(60_000).await;
    let held = doomed_api.acquire("one", json!({ "session": session, "capacity": 1 })).await;
    assert_eq!(held.status, 200, "{held:?}");
    let other_api = Api::with_token(&cluster.nodes[2].url, other_secret);
    let waiter = other_api.session(60_000).await;
    let queued = {
        let other_api = other_api.clone();
        let waiter = waiter.clone();
        tokio::spawn(async move {
            other_api.acquire("one", json!({ "session": waiter, "wait_ms": 20_000 })).await
        })
    };

    // Queued before the deletion: a semaphore the deleted token made that nobody uses any more
    // would be deleted with it.
    let queued_first = eventually(Duration::from_secs(10), async || {
        let view = roots[0].get("/v1/semaphores/one").await.body;
        view["waiters"].as_array().is_some_and(|waiters| waiters.len() == 1)
    })
    .await;
    assert!(queued_first, "the other token's acquire was not queued");
    let deleted = roots[0].send("DELETE", &format!("/v1/acl/tokens/{id}"), None).await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert_eq!(queued.await.unwrap().status, 200, "the waiter behind the revoked holder was granted");
    for node in &cluster.nodes {
        let stale = Api::with_token(&node.url, secret);
        // Every node applies the deletion: the token is refused there even for a local read,
        // and its session is gone from the node's own state.
        let refused = eventually(Duration::from_secs(5), async || {
            stale.get("/v1/semaphores/one?stale=true").await.status == 401
        })
        .await;
        assert!(refused, "node at {} still accepts the deleted token", node.url);
        let root = Api::with_token(&node.url, ROOT);
        let view = root.get("/v1/semaphores/one?stale=true").await.body;
        let holders: Vec<&str> =
            view["holders"].as_array().unwrap().iter().map(|h| h["session"].as_str().unwrap()).collect();
        assert_eq!(holders, [waiter.as_str()], "on {}", node.url);
    }
}
