//! The peer channel: Raft RPCs and forwarded requests only from nodes holding the cluster
//! secret, with the node id they claim, and with sane terms.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, SnapshotMeta, Vote};
use permit_server::peer::ClusterSecret;
use permit_server::raft::TypeConfig;
use serde_json::{json, Value};

use crate::common::{permit_bin, Cluster, Server, CLUSTER_SECRET};
use crate::{Api, Failover};

/// Which credential a forged peer request carries.
#[derive(Clone, Copy)]
enum Credential {
    /// No peer headers.
    None,
    /// A well-formed credential made with the wrong secret, for this node id.
    Forged(u64),
    /// Node `id`'s valid credential.
    Valid(u64),
}

/// POSTs `body` to `path` on `url` with `credential`; the status and the error code (if any).
async fn post_peer(url: &str, path: &str, body: Vec<u8>, credential: Credential) -> (u16, String) {
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut request = http
        .post(format!("{url}{path}"))
        .header("content-type", "application/octet-stream")
        .timeout(Duration::from_secs(10));
    let headers = match credential {
        Credential::None => Vec::new(),
        Credential::Forged(id) => ClusterSecret::new(b"not-the-cluster-secret").unwrap().headers(id).to_vec(),
        Credential::Valid(id) => ClusterSecret::new(CLUSTER_SECRET.as_bytes()).unwrap().headers(id).to_vec(),
    };
    for (name, value) in headers {
        request = request.header(name, value);
    }
    let response = request.body(body).send().await.expect("peer request sent");
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap_or_default();
    let code = serde_json::from_slice::<Value>(&bytes)
        .ok()
        .and_then(|body| body["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default();
    (status, code)
}

fn vote(term: u64, candidate: u64) -> Vec<u8> {
    postcard::to_allocvec(&VoteRequest::<u64>::new(Vote::new(term, candidate), None)).unwrap()
}

/// A heartbeat or append as the leader `leader` in `term`, with one blank entry at `index`.
fn append(term: u64, leader: u64, index: u64) -> Vec<u8> {
    let log_id = LogId::new(CommittedLeaderId::new(term, leader), index);
    let request = AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: vec![Entry { log_id, payload: EntryPayload::Blank }],
        leader_commit: Some(log_id),
    };
    postcard::to_allocvec(&request).unwrap()
}

/// A whole snapshot in one chunk, sent as `leader` in `term`, whose metadata says it ends at
/// log index `index`, with `state` as its bytes.
fn snapshot(term: u64, leader: u64, index: u64, state: Vec<u8>) -> Vec<u8> {
    let request = InstallSnapshotRequest::<TypeConfig> {
        vote: Vote::new_committed(term, leader),
        meta: SnapshotMeta {
            last_log_id: Some(LogId::new(CommittedLeaderId::new(term, leader), index)),
            last_membership: Default::default(),
            snapshot_id: format!("forged-{index}"),
        },
        offset: 0,
        data: state,
        done: true,
    };
    postcard::to_allocvec(&request).unwrap()
}

/// The snapshot of an empty state at applied index 0: format version 1, no sessions, no
/// objects, last token 0, time 0, applied index 0.
const EMPTY_STATE: [u8; 6] = [1, 0, 0, 0, 0, 0];

/// Every node's (term, leader) as its own health answer reports it.
/// Waits (bounded) until every node knows the leader.
async fn terms(cluster: &Cluster) -> Vec<(u64, Option<u64>)> {
    let mut terms = Vec::new();
    for node in &cluster.nodes {
        let api = Api::at(&node.url);
        let healthy = crate::common::eventually(Duration::from_secs(10), async || {
            api.get("/v1/health").await.status == 200
        })
        .await;
        let health = api.get("/v1/health").await;
        assert!(healthy, "{health:?}");
        terms.push((health.body["raft_term"].as_u64().unwrap(), health.body["raft_leader"].as_u64()));
    }
    terms
}

/// A write through every node succeeds (it is forwarded to the leader).
async fn writes_succeed(cluster: &Cluster, name: &str) {
    for (i, node) in cluster.nodes.iter().enumerate() {
        let mut client = Failover::new(std::slice::from_ref(&node.url), 0);
        let session = client.session(60_000).await;
        let path = format!("/v1/semaphores/{name}-{i}/acquire");
        let granted = client.post(&path, json!({ "session": session, "capacity": 1 })).await;
        assert_eq!(granted.status, 200, "write through node {}: {granted:?}", i + 1);
    }
}

#[tokio::test]
async fn a_client_without_the_peer_credential_changes_no_term_and_no_state() {
    let cluster = Cluster::start(3, &[]).await;
    writes_succeed(&cluster, "before").await;
    let before = terms(&cluster).await;
    let (term, leader) = (before[0].0, before[0].1.expect("a leader"));
    let last_index =
        Api::at(&cluster.nodes[0].url).get("/v1/health").await.body["applied_index"].as_u64().unwrap();
    let forged: Vec<(&str, Vec<u8>)> = vec![
        ("/raft/vote", vote(u64::MAX, 9)),
        ("/raft/vote", vote(u64::MAX, 2)),
        ("/raft/vote", vote(term + 50, 1)),
        ("/raft/append", append(u64::MAX, 9, 1)),
        ("/raft/append", append(term + 50, 2, last_index + 1)),
        // The real leader's vote: would put an entry on a follower that is never overwritten.
        ("/raft/append", append(term, leader, last_index + 1)),
        ("/raft/snapshot", vec![0; 56]),
    ];
    for node in &cluster.nodes {
        for (path, body) in &forged {
            for credential in [Credential::None, Credential::Forged(leader), Credential::Forged(2)] {
                let (status, code) = post_peer(&node.url, path, body.clone(), credential).await;
                assert_eq!((status, code.as_str()), (401, "unauthenticated"), "{path} to {}", node.url);
            }
        }
    }
    let after = terms(&cluster).await;
    assert_eq!(after, before, "no node's term or leader moved");
    writes_succeed(&cluster, "after").await;
    // Every node reaches the same state (no forged entry diverged a follower).
    let agree = crate::common::eventually(Duration::from_secs(10), async || {
        let digests = futures::future::join_all(
            cluster
                .nodes
                .iter()
                .map(|node| async move { Api::at(&node.url).get("/v1/debug/digest").await.body }),
        )
        .await;
        let state = |d: &Value| (d["applied_index"].clone(), d["digest"].clone());
        digests.iter().all(|d| state(d) == state(&digests[0]))
    })
    .await;
    assert!(agree, "every node applies the same log to the same state");
}

#[tokio::test]
async fn a_peer_credential_counts_only_for_its_own_member_node_and_sane_terms() {
    let cluster = Cluster::start(3, &[]).await;
    let before = terms(&cluster).await;
    let (term, leader) = (before[0].0, before[0].1.expect("a leader"));
    let follower = if leader == 1 { 2 } else { 1 };
    let url = &cluster.nodes[follower as usize - 1].url;
    let other = (1..=3).find(|id| *id != follower && *id != leader).unwrap();
    // Node `other`'s credential on a vote claiming to be the leader.
    let (status, code) =
        post_peer(url, "/raft/vote", vote(term + 50, leader), Credential::Valid(other)).await;
    assert_eq!((status, code.as_str()), (403, "permission_denied"));
    // A valid credential of a node that is not a member.
    let (status, code) = post_peer(url, "/raft/vote", vote(term + 50, 9), Credential::Valid(9)).await;
    assert_eq!((status, code.as_str()), (403, "permission_denied"));
    // A member's own credential, but a term near u64::MAX, in a vote and in an append.
    for term in [u64::MAX, u64::MAX - 1, (1 << 32) + 1] {
        for (path, body) in [("/raft/vote", vote(term, other)), ("/raft/append", append(term, other, 1))] {
            let (status, code) = post_peer(url, path, body, Credential::Valid(other)).await;
            assert_eq!((status, code.as_str()), (400, "invalid_argument"), "{path} with term {term}");
        }
    }
    // The leader's own credential and vote, but a snapshot whose state disagrees with its
    // metadata, or does not decode: refused before openraft installs it.
    let url_of_follower = url.clone();
    for state in [EMPTY_STATE.to_vec(), vec![1, 0xff]] {
        let body = snapshot(term, leader, 1_000, state);
        let (status, code) =
            post_peer(&url_of_follower, "/raft/snapshot", body, Credential::Valid(leader)).await;
        assert_eq!((status, code.as_str()), (400, "invalid_argument"));
    }
    // A chunk past the bytes received so far is refused (a buffer never grows by a gap).
    let mut request: InstallSnapshotRequest<TypeConfig> =
        postcard::from_bytes(&snapshot(term, leader, 1_000, EMPTY_STATE.to_vec())).unwrap();
    request.offset = 1 << 40;
    let body = postcard::to_allocvec(&request).unwrap();
    let (status, code) = post_peer(&url_of_follower, "/raft/snapshot", body, Credential::Valid(leader)).await;
    assert_eq!((status, code.as_str()), (400, "invalid_argument"));
    // A member's stale vote with its own credential reaches Raft (and changes nothing).
    let (status, _) = post_peer(url, "/raft/vote", vote(term, other), Credential::Valid(other)).await;
    assert_eq!(status, 200);
    assert_eq!(terms(&cluster).await, before, "no node's term or leader moved");
    writes_succeed(&cluster, "credential").await;
}

#[tokio::test]
async fn a_forwarded_header_without_a_peer_credential_is_ignored() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(10)).await.unwrap();
    let follower = &cluster.nodes[(leader + 1) % 3];
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    // Honoured, the header would make the follower answer `leader_unreachable` instead of
    // forwarding; ignored, the follower forwards the write and it succeeds.
    let answer = http
        .post(format!("{}/v1/sessions", follower.url))
        .header("permit-forwarded-by", (leader + 1).to_string())
        .json(&json!({ "ttl_ms": 10_000 }))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 201, "{:?}", answer.text().await);
}

#[tokio::test]
async fn a_single_node_serves_no_raft_routes() {
    let server = Server::start();
    for path in ["/raft/vote", "/raft/append", "/raft/snapshot"] {
        let (status, code) = post_peer(&server.url, path, vote(u64::MAX, 9), Credential::None).await;
        assert_eq!((status, code.as_str()), (404, "not_found"), "{path}");
    }
    let session = Api::new(&server).post("/v1/sessions", json!({ "ttl_ms": 10_000 })).await;
    assert_eq!(session.status, 201, "{session:?}");
}

/// Runs `permit serve ARGS` and waits (bounded) for it to exit; its status and stderr.
fn serve_exit(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    serve_exit_in(&dir.path().join("d"), args)
}

/// Like [`serve_exit`], with the data in `data_dir`.
fn serve_exit_in(data_dir: &std::path::Path, args: &[&str]) -> (Option<i32>, String) {
    let mut child = Command::new(permit_bin())
        .arg("serve")
        .args(["--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("permit serve {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[test]
fn a_cluster_node_without_a_good_secret_refuses_to_start() {
    for args in [&["--id", "1", "--peers", "1=127.0.0.1:7999,2=127.0.0.1:7998"][..], &["--id", "2", "--join"]]
    {
        let (code, stderr) = serve_exit(args);
        assert!(code.is_some_and(|c| c != 0), "{args:?} exited {code:?}");
        assert!(stderr.contains("--cluster-secret-file"), "{stderr}");
        assert!(stderr.contains("head -c 32 /dev/urandom | base64"), "{stderr}");
    }
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "  too short \n").unwrap();
    let (code, stderr) = serve_exit(&["--join", "--cluster-secret-file", short.to_str().unwrap()]);
    assert!(code.is_some_and(|c| c != 0), "exited {code:?}");
    assert!(stderr.contains("fewer than 16"), "{stderr}");
    assert!(!stderr.contains("too short"), "the secret is never printed: {stderr}");
}

/// A node whose data dir belongs to a cluster, restarted without `--join`, `--peers` or the
/// secret, refuses to start rather than run as a member that serves no peer route.
#[tokio::test]
async fn a_cluster_member_restarted_without_the_secret_refuses_to_start() {
    let mut cluster = Cluster::start(3, &[]).await;
    // Node 3 has the membership in its log: it applied the entry after it (the leader's first).
    let node3 = Api::at(&cluster.nodes[2].url);
    let knows = crate::common::eventually(Duration::from_secs(10), async || {
        node3.get("/v1/debug/digest").await.body["applied_index"].as_u64() >= Some(1)
    })
    .await;
    assert!(knows, "node 3 applies the cluster's log");
    cluster.nodes[2].kill9();
    let (code, stderr) = serve_exit_in(&cluster.nodes[2].data_dir, &["--id", "3"]);
    assert!(code.is_some_and(|c| c != 0), "exited {code:?}");
    assert!(stderr.contains("belongs to a cluster") && stderr.contains("--cluster-secret-file"), "{stderr}");
}

/// A member that was down while the membership changed knows neither the new nodes nor the new
/// leader: it must still accept the leader's appends (an authenticated leader whose committed
/// vote is at least its own), or it could never learn the new membership.
#[tokio::test]
async fn a_member_that_missed_membership_changes_follows_a_leader_it_does_not_know() {
    let mut cluster = Cluster::start(3, &[]).await;
    cluster.nodes[2].kill9();
    for id in [4, 5] {
        let joiner = cluster.start_joiner(id);
        let mut admin = Failover::new(&cluster.urls()[..2], 0);
        let added =
            admin.post("/v1/cluster/members", json!({ "id": id, "addr": cluster.nodes[joiner].addr })).await;
        assert_eq!(added.status, 200, "{added:?}");
    }
    let new_urls: Vec<String> = cluster.urls()[3..].to_vec();
    for id in [1, 2] {
        let mut admin = Failover::new(&new_urls, 0);
        let path = format!("/v1/cluster/members/{id}");
        let removed = admin.send("DELETE", &path, None, Duration::from_secs(20)).await.0;
        assert_eq!(removed.status, 204, "{removed:?}");
    }
    cluster.nodes[0].kill9();
    cluster.nodes[1].kill9();
    let mut client = Failover::new(&new_urls, 0);
    let session = client.session(60_000).await;
    cluster.nodes[2].restart();
    let node3 = Api::at(&cluster.nodes[2].url);
    let follows = crate::common::eventually(Duration::from_secs(20), async || {
        let health = node3.get("/v1/health").await.body;
        matches!(health["raft_leader"].as_u64(), Some(4 | 5))
    })
    .await;
    assert!(follows, "node 3 follows the new leader: {:?}", node3.get("/v1/health").await);
    // It applies the log written while it was down (the session's creation).
    let created = Api::at(&new_urls[0]).get("/v1/debug/digest").await.body["applied_index"].as_u64().unwrap();
    let caught_up = crate::common::eventually(Duration::from_secs(20), async || {
        node3.get("/v1/debug/digest").await.body["applied_index"].as_u64() >= Some(created)
    })
    .await;
    assert!(caught_up, "node 3 caught up to index {created}: {:?}", node3.get("/v1/health").await);
    let mut through_node3 = Failover::new(std::slice::from_ref(&cluster.nodes[2].url), 0);
    let kept = through_node3.post(&format!("/v1/sessions/{session}/keepalive"), json!({})).await;
    assert_eq!(kept.status, 200, "{kept:?}");
}

/// `permit_peer_rpcs_{sent,received}_total{kind}` of the node at `url`, as (sent, received).
async fn peer_rpcs(url: &str, kind: &str) -> (u64, u64) {
    let body = Api::at(url).get("/metrics").await.body.as_str().unwrap_or_default().to_owned();
    let series = |name: &str| {
        let prefix = format!("{name}{{kind=\"{kind}\"}} ");
        body.lines().find_map(|line| line.strip_prefix(&prefix)?.trim().parse::<u64>().ok())
    };
    let sent = series("permit_peer_rpcs_sent_total").expect("sent series");
    let received = series("permit_peer_rpcs_received_total").expect("received series");
    (sent, received)
}

#[tokio::test]
async fn peer_rpcs_are_counted_by_kind_where_they_are_sent_and_where_they_arrive() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(5)).await.expect("a leader");
    let urls = cluster.urls();
    let followers: Vec<&String> =
        urls.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, u)| u).collect();
    let (appends_before, _) = peer_rpcs(&urls[leader], "append").await;
    let (heartbeats_before, _) = peer_rpcs(&urls[leader], "heartbeat").await;
    let api = Api::at(&urls[leader]);
    let session = api.session(60_000).await;
    for _ in 0..3 {
        assert_eq!(api.post(&format!("/v1/sessions/{session}/keepalive"), json!(null)).await.status, 200);
    }
    // The session's entry went to both followers; each keepalive's ReadIndex round sent an
    // AppendEntries without entries to both.
    let (appends, _) = peer_rpcs(&urls[leader], "append").await;
    let (heartbeats, _) = peer_rpcs(&urls[leader], "heartbeat").await;
    assert!(appends >= appends_before + 2, "appends sent {appends_before} -> {appends}");
    assert!(heartbeats >= heartbeats_before + 6, "heartbeats sent {heartbeats_before} -> {heartbeats}");
    for follower in followers {
        let received = crate::common::eventually(Duration::from_secs(5), async || {
            peer_rpcs(follower, "append").await.1 >= 1 && peer_rpcs(follower, "heartbeat").await.1 >= 1
        })
        .await;
        assert!(received, "the follower at {follower} counted the leader's appends and heartbeats");
    }
}
