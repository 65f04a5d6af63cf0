//! Adding and removing nodes while clients keep working.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::common::Cluster;
use crate::{Api, Failover};

#[tokio::test]
async fn nodes_join_and_leave_under_traffic() {
    let mut cluster = Cluster::start(3, &[]).await;
    let urls = cluster.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let traffic = {
        let (stop, cycles, urls) = (stop.clone(), cycles.clone(), urls.clone());
        tokio::spawn(async move {
            let mut client = Failover::new(&urls, 2);
            let session = client.session(60_000).await;
            while !stop.load(Ordering::Relaxed) {
                let answer = client
                    .post("/v1/semaphores/m/acquire", json!({ "session": session, "capacity": 1 }))
                    .await;
                assert_eq!(answer.status, 200, "{answer:?}");
                let answer = client.post("/v1/semaphores/m/release", json!({ "session": session })).await;
                assert_eq!(answer.status, 200, "{answer:?}");
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let joiner = cluster.start_joiner(4);
    let mut admin = Failover::new(&urls, 0);
    // A member is refused when its address is another member's, or its node has another id.
    for (id, addr) in [(4, cluster.nodes[0].addr.clone()), (5, cluster.nodes[joiner].addr.clone())] {
        let refused = admin.post("/v1/cluster/members", json!({ "id": id, "addr": addr })).await;
        assert_eq!((refused.status, refused.code()), (400, "invalid_argument"), "{refused:?}");
    }
    let added =
        admin.post("/v1/cluster/members", json!({ "id": 4, "addr": cluster.nodes[joiner].addr })).await;
    assert_eq!(added.status, 200, "{added:?}");
    let voters = |view: &serde_json::Value| {
        let mut ids: Vec<u64> = view["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "voter")
            .map(|m| m["id"].as_u64().unwrap())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(voters(&admin.get("/v1/cluster").await.body), vec![1, 2, 3, 4]);
    let before = cycles.load(Ordering::Relaxed);
    // The new node serves the API (forwarding to the leader).
    let new_node = Api::new(&cluster.nodes[joiner]);
    assert_eq!(new_node.get("/v1/semaphores/m").await.status, 200);

    // Remove node 1, whatever its role.
    let removed = admin.send("DELETE", "/v1/cluster/members/1", None, Duration::from_secs(20)).await.0;
    assert_eq!(removed.status, 204, "{removed:?}");
    let mut admin = Failover::new(&urls[1..], 0);
    let view = admin.get("/v1/cluster").await;
    assert_eq!(voters(&view.body), vec![2, 3, 4]);
    let progressed = crate::common::eventually(Duration::from_secs(20), async || {
        cycles.load(Ordering::Relaxed) > before + 20
    })
    .await;
    assert!(progressed, "traffic kept flowing");
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), traffic).await.unwrap().unwrap();
    let unknown = admin.send("DELETE", "/v1/cluster/members/9", None, Duration::from_secs(5)).await.0;
    assert_eq!((unknown.status, unknown.code()), (400, "invalid_argument"));
}
