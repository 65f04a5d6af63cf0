//! The dashboard's files are served by every node itself, never forwarded to the leader: a
//! follower answers them even while the leader is unreachable.

use std::time::Duration;

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
    // With the two others stopped there is no leader and none can be elected: a forwarded
    // request would wait for one and then fail.
    let (follower, other) = ((leader + 1) % 3, (leader + 2) % 3);
    cluster.nodes[leader].pause();
    cluster.nodes[other].pause();
    let page = Api::at(&cluster.nodes[follower].url).get("/ui/app.js").await;
    assert_eq!(page.status, 200, "{page:?}");
    cluster.nodes[leader].resume();
    cluster.nodes[other].resume();
}
