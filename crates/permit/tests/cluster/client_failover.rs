//! The Rust client and the CLI against a cluster: several endpoints, failover, cluster commands.

use std::process::Command;
use std::time::Duration;

use permit_client::{Client, SessionState};

use crate::common::{permit_bin, Cluster};

#[tokio::test]
async fn a_client_session_survives_the_leader_s_kill_9_through_other_endpoints() {
    let mut cluster = Cluster::start(3, &[]).await;
    let client = Client::with_endpoints(cluster.urls()).unwrap();
    client.put_semaphore("client.failover", 1).await.unwrap();
    // A TTL of five election timeouts: a failover (detection, a vote or two, the new leader's
    // barrier) takes one or two, also when the other cluster tests share the two cores.
    let session = client.session(Duration::from_secs(5)).await.unwrap();
    let first = session.acquire("client.failover", 1).await.unwrap_or_else(|e| panic!("{e}"));
    let leader = cluster.leader(Duration::from_secs(5)).await.unwrap();
    cluster.nodes[leader].kill9();
    // Keepalives move to the surviving nodes before the TTL runs out: the hold stays valid past
    // it.
    let lost = tokio::time::timeout(Duration::from_secs(7), first.lost()).await;
    assert!(lost.is_err(), "the hold was lost during the failover");
    assert_eq!(*session.watch_state().borrow(), SessionState::Alive);
    first.release().await.unwrap();
    let second = session.acquire("client.failover", 1).await.unwrap();
    assert!(second.token() > 0);
    second.release().await.unwrap();
}

/// A claim blocked on the leader when it is killed: the client asks the other endpoints again
/// with the claim's `request_id`, the new leader has the blocked claim in its replicated state,
/// and the first item pushed is answered to it; no second claim takes another item.
#[tokio::test]
async fn a_blocked_claim_rides_out_the_leader_s_kill_9_without_taking_a_second_item() {
    let mut cluster = Cluster::start(3, &[]).await;
    let client = Client::with_endpoints(cluster.urls()).unwrap();
    let ready = crate::common::eventually(Duration::from_secs(15), async || {
        client.cluster().await.is_ok_and(|view| view.feature_version.is_some_and(|v| v >= 4))
    })
    .await;
    assert!(ready, "the cluster runs queues");
    client.put_queue("client.failover.queue", &Default::default()).await.unwrap();
    // As above: a TTL of five election timeouts.
    let session = client.session(Duration::from_secs(5)).await.unwrap();
    let claimer = session.clone();
    let claim = tokio::spawn(async move { claimer.claim("client.failover.queue").await });
    let blocked = crate::common::eventually(Duration::from_secs(10), async || {
        client.get_queue("client.failover.queue").await.is_ok_and(|view| view.claimers == 1)
    })
    .await;
    assert!(blocked, "the claim waits");
    let leader = cluster.leader(Duration::from_secs(5)).await.unwrap();
    cluster.nodes[leader].kill9();
    // Keyed, so that the push is repeated on the next endpoint (a push without keys is sent
    // again only when it certainly was not applied).
    let items = (0..2).map(|n| {
        let options = permit_client::PushOptions { key: Some(format!("item-{n}")), ..Default::default() };
        options.item(&n).unwrap()
    });
    client.push_many("client.failover.queue", items).await.unwrap();
    let item = tokio::time::timeout(Duration::from_secs(15), claim).await.expect("claimed in time").unwrap();
    let item = item.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(item.payload(), "0");
    let view = client.get_queue("client.failover.queue").await.unwrap();
    assert_eq!((view.pending, view.claimed, view.claimers), (1, 1, 0), "{view:?}");
    item.ack().await.unwrap();
}

fn permit(servers: &[String], args: &[&str]) -> (i32, String) {
    let output = Command::new(permit_bin())
        .arg("--server")
        .arg(servers.join(","))
        .args(args)
        .output()
        .expect("run permit");
    let text =
        String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), text)
}

#[tokio::test]
async fn cluster_commands_show_add_and_remove_members() {
    let mut cluster = Cluster::start(3, &[]).await;
    let urls = cluster.urls();
    let (code, text) = permit(&urls, &["cluster", "status"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(text.matches("voter").count(), 3, "{text}");
    assert!(text.contains("(leader)"), "{text}");
    // The cluster's feature version, and each member's version and build (`raft::version`).
    let first = text.lines().next().unwrap_or_default();
    let version = permit_core::FEATURE_VERSION.to_string();
    assert!(first.ends_with(&format!("cluster feature version {version}")), "{text}");
    let versioned =
        |line: &&str| line.split_whitespace().rev().take(2).eq([env!("CARGO_PKG_VERSION"), version.as_str()]);
    assert_eq!(text.lines().filter(|l| l.contains("voter")).filter(versioned).count(), 3, "{text}");

    let joiner = cluster.start_joiner(4);
    let addr = cluster.nodes[joiner].addr.clone();
    let (code, text) = permit(&urls, &["cluster", "add", "4", &addr]);
    assert_eq!(code, 0, "{text}");
    assert!(text.lines().any(|l| l.starts_with("4 ") && l.contains("voter")), "{text}");

    let (code, text) = permit(&urls, &["cluster", "remove", "4"]);
    assert_eq!(code, 0, "{text}");
    let (code, json) = permit(&urls, &["cluster", "status", "--json"]);
    assert_eq!(code, 0, "{json}");
    let view: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(view["members"].as_array().unwrap().len(), 3);
    // The first endpoint down: the CLI moves on to the next.
    cluster.nodes[0].kill9();
    let (code, text) = permit(&urls, &["ls"]);
    assert_eq!(code, 0, "{text}");
}
