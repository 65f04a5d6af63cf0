//! Semaphore policies on a 3-node cluster: takes through a follower, and a leader `kill -9`
//! that neither forgets a lock-delay nor lets the new leader grant the spent rate again.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::{eventually, Cluster};
use crate::Api;

#[tokio::test]
async fn a_new_leader_keeps_the_spent_rate_and_the_lock_delay() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(10)).await.expect("a leader");
    let follower = (leader + 1) % 3;
    let via_follower = Api::at(&cluster.nodes[follower].url);
    // A rate of one per minute, burst 2; a lock-delay long enough to outlast the failover.
    let rated = json!({ "capacity": 1, "rate": { "permits": 1, "per_ms": 60_000, "burst": 2 } });
    let put = via_follower.send("PUT", "/v1/semaphores/quota", Some(rated)).await;
    assert_eq!(put.status, 201, "{put:?}");
    let delayed = json!({ "capacity": 1, "lock_delay_ms": 4_000 });
    assert_eq!(via_follower.send("PUT", "/v1/semaphores/lock", Some(delayed)).await.status, 201);
    let take = |api: &Api| {
        let api = api.clone();
        async move { api.post("/v1/semaphores/quota/take", json!({ "wait_ms": 0 })).await }
    };
    // Takes through a follower: the burst, then refusals.
    for _ in 0..2 {
        let taken = take(&via_follower).await;
        assert_eq!(taken.status, 200, "{taken:?}");
    }
    assert_eq!(take(&via_follower).await.code(), "rate_limited");
    // A failed hold on the lock: its permit is delayed.
    let holder = via_follower.session(30_000).await;
    assert_eq!(via_follower.acquire("lock", json!({ "session": holder })).await.status, 200);
    let revoked_at = Instant::now();
    let revoked = via_follower.post("/v1/semaphores/lock/revoke", json!({ "session": holder })).await;
    assert_eq!(revoked.status, 200, "{revoked:?}");

    cluster.nodes[leader].kill9();
    let new_leader = cluster.leader(Duration::from_secs(15)).await.expect("a new leader");
    assert_ne!(new_leader, leader);
    let api = Api::at(&cluster.nodes[new_leader].url);
    // The spent rate is replicated state: the new leader does not grant a burst again.
    let refused = take(&api).await;
    assert_eq!((refused.status, refused.code()), (429, "rate_limited"), "{refused:?}");
    let retry_after = refused.body["error"]["retry_after_ms"].as_u64().unwrap();
    assert!(retry_after > 50_000, "the rate's turn is still about a minute away: {refused:?}");
    // The delay outlives the failover, and ends no earlier than it was due.
    let waiter = api.session(30_000).await;
    let shown = eventually(Duration::from_secs(5), async || {
        api.get("/v1/semaphores/lock").await.body["delayed"][0]["permits"] == 1
    })
    .await;
    assert!(shown, "the new leader shows the delayed permit");
    let granted = api.acquire("lock", json!({ "session": waiter, "wait_ms": 20_000 })).await;
    assert_eq!(granted.status, 200, "{granted:?}");
    assert!(
        revoked_at.elapsed() >= Duration::from_millis(4_000),
        "granted {:?} after the revoke",
        revoked_at.elapsed()
    );
}
