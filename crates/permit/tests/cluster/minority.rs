//! A node cut off from the majority acknowledges nothing.

use std::time::Duration;

use serde_json::json;

use crate::common::Cluster;
use crate::{Api, Failover};

#[tokio::test]
async fn a_leader_without_its_quorum_acknowledges_no_grant_release_read_or_keepalive() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(5)).await.unwrap();
    let mut client = Failover::new(&cluster.urls(), leader);
    let (a, b) = (client.session(60_000).await, client.session(60_000).await);
    let token = client.post("/v1/semaphores/p/acquire", json!({ "session": a, "capacity": 2 })).await.body
        ["token"]
        .as_u64()
        .unwrap();
    // Cut the leader off: pause both followers (they keep their sockets but answer nothing).
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    for f in &followers {
        cluster.nodes[*f].pause();
    }
    let api = Api::new(&cluster.nodes[leader]);
    // All at once: each waits for a quorum that cannot answer, until the server gives up.
    let keepalive = format!("/v1/sessions/{a}/keepalive");
    let (acquire, release, validate, read, keepalive, batched, session) = tokio::join!(
        api.post("/v1/semaphores/p/acquire", json!({ "session": b })),
        api.post("/v1/semaphores/p/release", json!({ "session": a })),
        api.post("/v1/semaphores/p/validate", json!({ "token": token })),
        api.get("/v1/semaphores/p"),
        api.post(&keepalive, json!(null)),
        api.post("/v1/sessions/keepalive", json!({ "sessions": [a, b] })),
        api.post("/v1/sessions", json!({})),
    );
    let attempts = [
        ("acquire", acquire),
        ("release", release),
        ("validate", validate),
        ("read", read),
        ("keepalive", keepalive),
        ("batched keepalive", batched),
        ("session", session),
    ];
    for (what, answer) in &attempts {
        assert_eq!(answer.status, 503, "{what} answered without a quorum: {answer:?}");
        assert!(["timeout", "no_leader"].contains(&answer.code()), "{what}: {answer:?}");
    }
    // A stale read is still served locally, and says so by asking for it.
    assert_eq!(api.get("/v1/semaphores/p?stale=true").await.status, 200);
    assert_eq!(api.get(&format!("/v1/sessions/{a}?stale=true")).await.status, 200);
    for f in &followers {
        cluster.nodes[*f].resume();
    }
    // After healing, the cluster serves again and a's hold is intact or released, never doubled.
    let mut client = Failover::new(&cluster.urls(), 0);
    let view = client.get("/v1/semaphores/p").await;
    assert_eq!(view.status, 200);
    assert!(view.body["held"].as_u64().unwrap() <= 2);
}
