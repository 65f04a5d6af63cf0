//! With `--auth`, a node that no longer applies the cluster's log serves no token-checked
//! route (issue 28, finding 4): its state never learns of a token's deletion, so it would go on
//! serving that token, even to `?stale=true` reads and event streams, for as long as it runs.

use std::time::Duration;

use crate::common::{eventually, Cluster};
use crate::Api;

const ROOT: &str = "cluster-root-secret-0123456789abcdef";

/// A 3-node cluster with `--auth`, its root token bootstrapped, and a token that may read
/// everything (its secret and id).
async fn secured_cluster() -> (Cluster, String, String) {
    let cluster = Cluster::start_secured(3, ROOT, &[]).await;
    let root = Api::with_token(&cluster.nodes[0].url, ROOT);
    let ready = eventually(Duration::from_secs(10), async || {
        root.get("/v1/acl/tokens/self").await.body["id"] == "0".repeat(32)
    })
    .await;
    assert!(ready, "the root token was bootstrapped");
    let (secret, id) = root.create_token("reader", &["semaphore:=read", "session:=write"]).await;
    (cluster, secret, id)
}

/// Whether the server ends the streaming `response` within `timeout`.
async fn ends_within(response: &mut reqwest::Response, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        match tokio::time::timeout_at(deadline, response.chunk()).await {
            Err(_) => return false,
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None) | Err(_)) => return true,
        }
    }
}

#[tokio::test]
async fn a_removed_node_left_running_serves_no_token_and_ends_its_streams() {
    let (cluster, secret, id) = secured_cluster().await;
    let leader = cluster.leader(Duration::from_secs(10)).await.expect("a leader");
    let removed = (0..3).find(|i| *i != leader).unwrap();
    let on_removed = Api::with_token(&cluster.nodes[removed].url, &secret);
    let served = eventually(Duration::from_secs(10), async || {
        on_removed.get("/v1/semaphores?stale=true").await.status == 200
    })
    .await;
    assert!(served, "the follower serves the token's stale reads");
    let mut stream =
        on_removed.http.get(format!("{}/v1/events", on_removed.url)).send().await.expect("stream opened");
    assert_eq!(stream.status(), 200);

    let root = Api::with_token(&cluster.nodes[leader].url, ROOT);
    let gone = root.send("DELETE", &format!("/v1/cluster/members/{}", removed + 1), None).await;
    assert_eq!(gone.status, 204, "{gone:?}");
    // Once it stops hearing from the leader (within the election bound), it refuses the token
    // with a retryable 503 that sends the client elsewhere, and its stream ends.
    let refused = eventually(Duration::from_secs(10), async || {
        let answer = on_removed.get("/v1/semaphores?stale=true").await;
        (answer.status, answer.code()) == (503, "leader_unreachable")
    })
    .await;
    assert!(refused, "the removed node still serves the token");
    assert!(ends_within(&mut stream, Duration::from_secs(5)).await, "its event stream is still open");

    // The token is deleted; the removed node never learns of it, and still refuses it.
    let deleted = root.send("DELETE", &format!("/v1/acl/tokens/{id}"), None).await;
    assert_eq!(deleted.status, 204, "{deleted:?}");
    for path in ["/v1/semaphores?stale=true", "/v1/sessions?stale=true", "/v1/events?kinds=granted"] {
        let answer = on_removed.get(path).await;
        assert_eq!((answer.status, answer.code()), (503, "leader_unreachable"), "{path}: {answer:?}");
    }
    // The members refuse it as deleted.
    let remaining = (0..3).find(|i| *i != removed).unwrap();
    let on_member = Api::with_token(&cluster.nodes[remaining].url, &secret);
    let unknown = eventually(Duration::from_secs(5), async || {
        on_member.get("/v1/semaphores?stale=true").await.status == 401
    })
    .await;
    assert!(unknown, "a member still accepts the deleted token");
}

#[tokio::test]
async fn a_leader_cut_off_from_its_quorum_serves_no_token() {
    let (mut cluster, secret, _) = secured_cluster().await;
    let leader = cluster.leader(Duration::from_secs(10)).await.expect("a leader");
    let api = Api::with_token(&cluster.nodes[leader].url, &secret);
    assert_eq!(api.get("/v1/semaphores?stale=true").await.status, 200);
    let followers: Vec<usize> = (0..3).filter(|i| *i != leader).collect();
    for f in &followers {
        cluster.nodes[*f].pause();
    }
    // Past the election bound the others may have elected a leader and applied deletions it
    // never sees: even a stale read is refused.
    let refused = eventually(Duration::from_secs(10), async || {
        let answer = api.get("/v1/semaphores?stale=true").await;
        (answer.status, answer.code()) == (503, "leader_unreachable")
    })
    .await;
    assert!(refused, "a leader without its quorum still serves the token");
    for f in &followers {
        cluster.nodes[*f].resume();
    }
    let back = eventually(Duration::from_secs(20), async || {
        api.get("/v1/semaphores?stale=true").await.status == 200
    })
    .await;
    assert!(back, "the node serves the token again once it is in contact");
}
