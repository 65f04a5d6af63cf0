//! Whole-cluster restarts and a follower catching up by snapshot.

use std::time::Duration;

use serde_json::json;

use crate::common::Cluster;
use crate::{Api, Failover};

#[tokio::test]
async fn a_full_cluster_restart_keeps_sessions_holds_queues_and_tokens() {
    let mut cluster = Cluster::start(3, &[]).await;
    let mut client = Failover::new(&cluster.urls(), 0);
    let (a, b) = (client.session(60_000).await, client.session(60_000).await);
    let granted = client.post("/v1/semaphores/r/acquire", json!({ "session": a, "capacity": 1 })).await;
    let token = granted.body["token"].as_u64().unwrap();
    assert_eq!(
        client.post("/v1/semaphores/r/acquire", json!({ "session": b, "wait_ms": 1 })).await.status,
        202
    );
    for node in &mut cluster.nodes {
        node.kill9();
    }
    for node in &mut cluster.nodes {
        node.restart();
    }
    cluster.leader(Duration::from_secs(15)).await.expect("the restarted cluster elects a leader");
    let mut client = Failover::new(&cluster.urls(), 1);
    let view = client.get("/v1/semaphores/r").await;
    assert_eq!(view.body["holders"][0]["session"], a.as_str(), "{view:?}");
    assert_eq!(view.body["holders"][0]["token"].as_u64(), Some(token));
    assert_eq!(view.body["waiters"][0]["session"], b.as_str());
    assert_eq!(client.post(&format!("/v1/sessions/{a}/keepalive"), json!(null)).await.status, 200);
    client.post("/v1/semaphores/r/release", json!({ "session": a })).await;
    let next = client.get("/v1/semaphores/r").await;
    assert!(next.body["holders"][0]["token"].as_u64().unwrap() > token);
}

fn gauge(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find(|line| line.starts_with(name) && line[name.len()..].starts_with(' '))
        .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_follower_down_past_log_compaction_catches_up_by_snapshot() {
    let mut cluster = Cluster::start(3, &["--snapshot-logs", "20"]).await;
    let leader = cluster.leader(Duration::from_secs(5)).await.unwrap();
    let follower = (leader + 1) % 3;
    let mut client = Failover::new(&cluster.urls(), leader);
    let session = client.session(120_000).await;
    let follower_api = Api::new(&cluster.nodes[follower]);
    let applied_before = follower_api.get("/v1/health").await.body["applied_index"].as_u64().unwrap();
    cluster.nodes[follower].kill9();
    let leader_api = Api::new(&cluster.nodes[leader]);
    // Write until the leader has compacted its log past what the follower has (bounded).
    let mut purged = 0;
    let mut written = 0;
    while purged <= applied_before + 20 && written < 400 {
        for _ in 0..20 {
            let path = format!("/v1/semaphores/s{written}/acquire");
            let answer = client.post(&path, json!({ "session": session, "capacity": 1 })).await;
            assert_eq!(answer.status, 200);
            written += 1;
        }
        let metrics = leader_api.get("/metrics").await.body.as_str().unwrap_or_default().to_owned();
        purged = gauge(&metrics, "permit_raft_purged_index");
    }
    assert!(
        purged > applied_before,
        "the leader purged its log past the follower ({purged} <= {applied_before})"
    );
    let last = format!("s{}", written - 1);

    cluster.nodes[follower].restart();
    let target = leader_api.get("/v1/health").await.body["applied_index"].as_u64().unwrap();
    let follower_api = Api::new(&cluster.nodes[follower]);
    let caught_up = crate::common::eventually(Duration::from_secs(20), async || {
        follower_api.get("/v1/health").await.body["applied_index"].as_u64() >= Some(target)
    })
    .await;
    assert!(caught_up, "the follower caught up");
    let follower_metrics = follower_api.get("/metrics").await.body.as_str().unwrap_or_default().to_owned();
    assert!(gauge(&follower_metrics, "permit_raft_snapshot_index") >= purged, "it installed a snapshot");
    // Its local (stale) state now has every hold.
    let view = follower_api.get(&format!("/v1/sessions/{session}?stale=true")).await;
    let stale = follower_api.get(&format!("/v1/semaphores/{last}?stale=true")).await;
    assert_eq!(stale.body["holders"][0]["session"], session.as_str(), "{view:?}");

    // It appends after the snapshot, behind the older entries in its log, and must restart from
    // that log: the segment log once refused the jump in indexes as corruption.
    for i in 0..5 {
        let answer = client
            .post(&format!("/v1/semaphores/after{i}/acquire"), json!({ "session": session, "capacity": 1 }))
            .await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let target = leader_api.get("/v1/health").await.body["applied_index"].as_u64().unwrap();
    let appended = crate::common::eventually(Duration::from_secs(10), async || {
        follower_api.get("/v1/health").await.body["applied_index"].as_u64() >= Some(target)
    })
    .await;
    assert!(appended, "the follower applied the entries after the snapshot");
    cluster.nodes[follower].kill9();
    cluster.nodes[follower].restart();
    let follower_api = Api::new(&cluster.nodes[follower]);
    let view = follower_api.get("/v1/semaphores/after4?stale=true").await;
    assert_eq!(view.body["holders"][0]["session"], session.as_str(), "{view:?}");
}

/// The README's way to run a cluster: every node started with `--peers`, in any order; the same
/// commands again after a stop resume it. (The other cluster tests form clusters with `--join`
/// and `/v1/cluster/init`, which needs no port chosen in advance.)
#[tokio::test]
async fn nodes_started_with_peers_in_any_order_form_a_cluster_and_resume_after_a_full_stop() {
    use crate::common::Server;
    // Free ports: bind all three at once, then let the servers take them.
    let listeners: Vec<std::net::TcpListener> =
        (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let addrs: Vec<String> = listeners.iter().map(|l| l.local_addr().unwrap().to_string()).collect();
    drop(listeners);
    let peers = addrs.iter().enumerate().map(|(i, a)| format!("{}={a}", i + 1)).collect::<Vec<_>>().join(",");
    let dir = tempfile::tempdir().unwrap();
    let secret = crate::common::write_cluster_secret(dir.path()).display().to_string();
    let start = |i: usize| {
        let id = (i + 1).to_string();
        let args = ["--id", &id, "--peers", &peers, "--cluster-secret-file", &secret];
        Server::start_in(&dir.path().join(format!("d{id}")), &addrs[i], &args)
    };
    let mut nodes = vec![start(2), start(0), start(1)]; // Any order: node 3 first.
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    let mut client = Failover::new(&urls, 0);
    let session = client.session(60_000).await;
    let granted =
        client.post("/v1/semaphores/peers/acquire", json!({ "session": session, "capacity": 1 })).await;
    assert_eq!(granted.status, 200, "{granted:?}");
    for node in &mut nodes {
        node.kill9();
    }
    for node in &mut nodes {
        node.restart();
    }
    let mut client = Failover::new(&urls, 1);
    let view = client.get("/v1/semaphores/peers").await;
    assert_eq!(view.body["holders"][0]["session"], session.as_str(), "{view:?}");
    let cluster = client.get("/v1/cluster").await;
    assert_eq!(cluster.body["members"].as_array().unwrap().len(), 3);
}
