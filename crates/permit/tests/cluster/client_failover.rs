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
