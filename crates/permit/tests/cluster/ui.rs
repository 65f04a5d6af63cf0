//! The dashboard's files are served by every node itself, never forwarded to the leader: a
//! follower answers them even while the leader is unreachable.

use std::time::{Duration, Instant};

use crate::common::Cluster;
use crate::Api;

#[tokio::test]
async fn every_node_serves_the_dashboard_itself_even_without_a_leader() {
    let mut cluster = Cluster::start(3, &[]).await;
    for (i, node) in cluster.nodes.iter().enumerate() {
        let config = Api::at(&node.url).get("/ui/config.json").await;
        assert_eq!(config.status, 200, "{config:?}");
        assert_eq!(config.body["node_id"], i as u64 + 1, "node {} answered for another node", i + 1);
    }
    let leader = cluster.leader(Duration::from_secs(10)).await.expect("a leader");
    cluster.nodes[leader].pause();
    let follower = (leader + 1) % 3;
    let started = Instant::now();
    let page = Api::at(&cluster.nodes[follower].url).get("/ui/app.js").await;
    // A forwarded request would wait for a leader (3 s) and then fail.
    assert_eq!(page.status, 200, "{page:?}");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    cluster.nodes[leader].resume();
}
