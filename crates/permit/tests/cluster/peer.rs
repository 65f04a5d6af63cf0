//! The peer channel: Raft RPCs and forwarded requests only from nodes holding the cluster
//! secret, with the node id they claim, and with sane terms.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId, SnapshotMeta, Vote};
use permit_server::peer::{ClusterSecret, PeerSigner};
use permit_server::raft::TypeConfig;
use serde_json::{json, Value};

use crate::common::{permit_bin, Cluster, Server, CLUSTER_SECRET};
use crate::{Api, Failover};

/// Which credential a forged peer request carries.
#[derive(Clone, Copy)]
enum Credential {
    /// No peer headers.
    None,
    /// A well-formed signature made with the wrong secret, as this node id.
    Forged(u64),
    /// Node `id`'s valid signature.
    Valid(u64),
}

/// The peer headers of `body` POSTed to `path` on node `to` at `url`, with the membership
/// claim `members`, signed by `signer` for the receiver's current nonce.
async fn signed(
    (url, to): (&str, u64),
    path: &str,
    body: &[u8],
    members: &str,
    signer: &PeerSigner,
) -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    let used = signer.sign(to, "POST", path, body, members, &mut headers);
    let mut refusal = reqwest::header::HeaderMap::new();
    refusal.insert("permit-peer-nonce", nonce_of(url).await.parse().unwrap());
    if signer.learn(to, &refusal, used) {
        signer.sign(to, "POST", path, body, members, &mut headers);
    }
    headers
}

/// POSTs `body` to `path` on node `to` at `url` with `credential`; the status and the error
/// code (if any).
async fn post_peer(url: &str, to: u64, path: &str, body: Vec<u8>, credential: Credential) -> (u16, String) {
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let headers = match credential {
        Credential::None => reqwest::header::HeaderMap::new(),
        Credential::Forged(id) => {
            let signer = PeerSigner::new(
                ClusterSecret::new(b"n0t-The-Cluster-Secret-7d1e9c3a5b8f0e2d4c6a").unwrap(),
                id,
            );
            signed((url, to), path, &body, "", &signer).await
        }
        Credential::Valid(id) => {
            let signer = PeerSigner::new(ClusterSecret::new(CLUSTER_SECRET.as_bytes()).unwrap(), id);
            signed((url, to), path, &body, "", &signer).await
        }
    };
    send_peer(&http, url, path, headers, body).await
}

/// POSTs `body` to `path` at `url` with `headers`; the status and the error code (if any).
async fn send_peer(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
) -> (u16, String) {
    let response = http
        .post(format!("{url}{path}"))
        .header("content-type", "application/octet-stream")
        .headers(headers)
        .timeout(Duration::from_secs(10))
        .body(body)
        .send()
        .await
        .expect("peer request sent");
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
    for (i, node) in cluster.nodes.iter().enumerate() {
        for (path, body) in &forged {
            for credential in [Credential::None, Credential::Forged(leader), Credential::Forged(2)] {
                let to = i as u64 + 1;
                let (status, code) = post_peer(&node.url, to, path, body.clone(), credential).await;
                assert_eq!((status, code.as_str()), (401, "unauthenticated"), "{path} to {}", node.url);
            }
        }
    }
    let after = terms(&cluster).await;
    assert_eq!(after, before, "no node's term or leader moved");
    writes_succeed(&cluster, "after").await;
    // Every node reaches the same state (no forged entry diverged a follower).
    assert!(replicas_agree(&cluster).await, "every node applies the same log to the same state");
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
        post_peer(url, follower, "/raft/vote", vote(term + 50, leader), Credential::Valid(other)).await;
    assert_eq!((status, code.as_str()), (403, "permission_denied"));
    // A valid credential of a node that is not a member.
    let (status, code) =
        post_peer(url, follower, "/raft/vote", vote(term + 50, 9), Credential::Valid(9)).await;
    assert_eq!((status, code.as_str()), (403, "permission_denied"));
    // A member's own credential, but a term near u64::MAX, or more than 2^32 above the node's, in
    // a vote and in an append.
    for term in [u64::MAX, u64::MAX - 1, term + (1 << 32) + 1] {
        for (path, body) in [("/raft/vote", vote(term, other)), ("/raft/append", append(term, other, 1))] {
            let (status, code) = post_peer(url, follower, path, body, Credential::Valid(other)).await;
            assert_eq!((status, code.as_str()), (400, "invalid_argument"), "{path} with term {term}");
        }
    }
    // The leader's own credential and vote, but a snapshot whose state disagrees with its
    // metadata, or does not decode: refused before openraft installs it.
    let url_of_follower = url.clone();
    for state in [EMPTY_STATE.to_vec(), vec![1, 0xff]] {
        let body = snapshot(term, leader, 1_000, state);
        let (status, code) =
            post_peer(&url_of_follower, follower, "/raft/snapshot", body, Credential::Valid(leader)).await;
        assert_eq!((status, code.as_str()), (400, "invalid_argument"));
    }
    // A chunk past the bytes received so far is refused (a buffer never grows by a gap).
    let mut request: InstallSnapshotRequest<TypeConfig> =
        postcard::from_bytes(&snapshot(term, leader, 1_000, EMPTY_STATE.to_vec())).unwrap();
    request.offset = 1 << 40;
    let body = postcard::to_allocvec(&request).unwrap();
    let (status, code) =
        post_peer(&url_of_follower, follower, "/raft/snapshot", body, Credential::Valid(leader)).await;
    assert_eq!((status, code.as_str()), (400, "invalid_argument"));
    // A member's stale vote with its own credential reaches Raft (and changes nothing).
    let (status, _) =
        post_peer(url, follower, "/raft/vote", vote(term, other), Credential::Valid(other)).await;
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
        let (status, code) = post_peer(&server.url, 1, path, vote(u64::MAX, 9), Credential::None).await;
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
        // Removing the leader hands leadership over: until the new leader commits the last
        // change, another answers `membership_change_in_progress` (bounded retries).
        let deadline = Instant::now() + Duration::from_secs(20);
        let removed = loop {
            let removed = admin.send("DELETE", &path, None, Duration::from_secs(20)).await.0;
            let in_progress = removed.body["error"]["code"] == "membership_change_in_progress";
            if !in_progress || Instant::now() >= deadline {
                break removed;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
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

/// Seconds the node at `url` spent on peer authenticators (`permit_peer_mac_seconds_total`).
async fn peer_mac_seconds(url: &str) -> f64 {
    let body = Api::at(url).get("/metrics").await.body.as_str().unwrap_or_default().to_owned();
    let value = body.lines().find_map(|line| line.strip_prefix("permit_peer_mac_seconds_total "));
    value.and_then(|v| v.trim().parse().ok()).expect("the peer_mac_seconds series")
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
    // The session's entry went to both followers (the commit needed one of them: the other's
    // append may still be on its way); each keepalive's ReadIndex round sent an AppendEntries
    // without entries to both.
    let sent = crate::common::eventually(Duration::from_secs(5), async || {
        peer_rpcs(&urls[leader], "append").await.0 >= appends_before + 2
    })
    .await;
    let (appends, _) = peer_rpcs(&urls[leader], "append").await;
    assert!(sent, "appends sent {appends_before} -> {appends}");
    let (heartbeats, _) = peer_rpcs(&urls[leader], "heartbeat").await;
    assert!(heartbeats >= heartbeats_before + 6, "heartbeats sent {heartbeats_before} -> {heartbeats}");
    // Signing them and checking them took time, counted where it was spent (the benchmark
    // prices the authenticators against the nodes' CPU with it).
    for url in &urls {
        let seconds = peer_mac_seconds(url).await;
        assert!(seconds > 0.0 && seconds < 60.0, "{url}: {seconds} s on authenticators");
    }
    for follower in followers {
        let received = crate::common::eventually(Duration::from_secs(5), async || {
            peer_rpcs(follower, "append").await.1 >= 1 && peer_rpcs(follower, "heartbeat").await.1 >= 1
        })
        .await;
        assert!(received, "the follower at {follower} counted the leader's appends and heartbeats");
    }
}

/// The nonce of the node at `url`'s current start, as anyone can learn it: from its refusal of a
/// peer request signed for another start.
async fn nonce_of(url: &str) -> String {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let signer = PeerSigner::new(ClusterSecret::new(b"Any0ne-Can-Ask-This-3f9a1c7e5b2d8f4a6c0e").unwrap(), 9);
    let mut headers = reqwest::header::HeaderMap::new();
    signer.sign(1, "POST", "/raft/vote", b"", "", &mut headers);
    let answer = http.post(format!("{url}/raft/vote")).headers(headers).send().await.unwrap();
    assert_eq!(answer.status(), 401);
    answer.headers()["permit-peer-nonce"].to_str().unwrap().to_owned()
}

/// One request a fake node received: its path, headers and body.
type Captured = (String, Vec<(String, String)>, Vec<u8>);

/// A fake node at a loopback address the test controls, as an attacker would run one: it
/// answers `GET /v1/health` with `health` and refuses every peer request with 401 naming
/// `nonce` as its own (the nonce of the node it wants messages for), recording them.
async fn fake_node(health: Value, nonce: String) -> (String, tokio::sync::mpsc::UnboundedReceiver<Captured>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (captured, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let (captured, health, nonce) = (captured.clone(), health.clone(), nonce.clone());
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 65536];
                let head_end = loop {
                    if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        break end + 4;
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                    if buffer.len() > 1 << 20 {
                        return;
                    }
                };
                let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
                let mut lines = head.split("\r\n");
                let path = lines.next().unwrap_or_default().split(' ').nth(1).unwrap_or_default().to_owned();
                let headers: Vec<(String, String)> = lines
                    .filter_map(|line| line.split_once(':'))
                    .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
                    .collect();
                let length: usize = headers
                    .iter()
                    .find(|(name, _)| name == "content-length")
                    .and_then(|(_, value)| value.parse().ok())
                    .unwrap_or(0)
                    .min(16 << 20);
                while buffer.len() < head_end + length {
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = buffer[head_end..head_end + length].to_vec();
                let answer = if path == "/v1/health" {
                    let body = health.to_string();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                } else {
                    let _ = captured.send((path, headers, body));
                    format!("HTTP/1.1 401 Unauthorized\r\npermit-peer-nonce: {nonce}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                };
                let _ = stream.write_all(answer.as_bytes()).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (addr, receiver)
}

/// Every node's applied index and state digest agree (bounded wait).
async fn replicas_agree(cluster: &Cluster) -> bool {
    crate::common::eventually(Duration::from_secs(10), async || {
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
    .await
}

/// Finding: a `cluster`-admin token added a learner at an address it controlled, captured the
/// leader's peer credential from the appends it was sent, and used it to put a forged entry on a
/// follower. Now a message is signed for its receiver, route and body: the learner's capture,
/// even made under the follower's own nonce, is refused by the follower as it is and with any
/// other body.
#[tokio::test]
async fn a_learner_s_captured_peer_messages_are_good_for_nothing_else() {
    let cluster = Cluster::start(3, &[]).await;
    writes_succeed(&cluster, "before").await;
    let leader = cluster.leader(Duration::from_secs(10)).await.unwrap();
    let follower = (leader + 1) % 3;
    let follower_url = cluster.nodes[follower].url.clone();
    // The worst case: the fake learner claims the follower's nonce as its own.
    let mut health = Api::at(&cluster.nodes[leader].url).get("/v1/health").await.body;
    health["node_id"] = json!(7);
    let (fake_addr, mut captured) = fake_node(health, nonce_of(&follower_url).await).await;
    let leader_url = cluster.nodes[leader].url.clone();
    let adding = tokio::spawn(async move {
        let mut admin = Failover::new(std::slice::from_ref(&leader_url), 0);
        admin.post("/v1/cluster/members", json!({ "id": 7, "addr": fake_addr, "learner": true })).await
    });
    // The leader learns the fake's nonce from its first refusal and signs its appends for it.
    let capture = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let (path, headers, body) = captured.recv().await.expect("the fake node runs");
            let nonce = headers.iter().find(|(name, _)| name == "permit-peer-nonce").map(|(_, v)| v.clone());
            if path == "/raft/append" && nonce.is_some_and(|n| !n.starts_with("0000000000000000")) {
                return (headers, body);
            }
        }
    })
    .await;
    let (headers, body) = capture.expect("the leader sent the fake learner a signed append");
    adding.abort();
    let mut replayed = reqwest::header::HeaderMap::new();
    for (name, value) in &headers {
        if name.starts_with("permit-") {
            replayed.insert(
                reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
    }
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let term = terms(&cluster).await[leader].0;
    let last_index = Api::at(&follower_url).get("/v1/health").await.body["applied_index"].as_u64().unwrap();
    let forged = append(term, leader as u64 + 1, last_index + 1);
    for (what, body) in [("as captured", body.clone()), ("with a forged entry", forged)] {
        let (status, code) = send_peer(&http, &follower_url, "/raft/append", replayed.clone(), body).await;
        assert_eq!((status, code.as_str()), (401, "unauthenticated"), "the capture {what}");
    }
    let before = terms(&cluster).await;
    writes_succeed(&cluster, "after").await;
    assert_eq!(terms(&cluster).await, before, "no node's term or leader moved");
    assert!(replicas_agree(&cluster).await, "every node applies the same log to the same state");
}

/// Finding: one forged heartbeat at the highest term a node accepted (2^32) moved the cluster
/// there, and no election could ever pass again (the next term was refused everywhere, and votes
/// are durable). Now a term may only step 2^32 above the receiver's: after the worst message a
/// member may send, the cluster still elects, through a leader's death and a restart of every
/// node.
#[tokio::test]
async fn after_the_worst_term_a_member_may_send_the_cluster_still_elects_through_restarts() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(10)).await.unwrap();
    let follower = (leader + 1) % 3;
    let other = (leader + 2) % 3;
    let (term, _) = terms(&cluster).await[follower];
    let worst = term + (1 << 32);
    // A heartbeat as member `other` at the highest term the follower accepts, and one above it.
    let sender = other as u64 + 1;
    let to = follower as u64 + 1;
    let heartbeat = |term: u64| {
        let request = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(term, sender),
            prev_log_id: None,
            entries: Vec::new(),
            leader_commit: None,
        };
        postcard::to_allocvec(&request).unwrap()
    };
    let url = cluster.nodes[follower].url.clone();
    let (status, code) =
        post_peer(&url, to, "/raft/append", heartbeat(worst + 1), Credential::Valid(sender)).await;
    assert_eq!((status, code.as_str()), (400, "invalid_argument"), "a step beyond 2^32");
    let (status, _) = post_peer(&url, to, "/raft/append", heartbeat(worst), Credential::Valid(sender)).await;
    assert_eq!(status, 200, "the worst message a member may send reaches Raft");
    let moved = crate::common::eventually(Duration::from_secs(20), async || {
        let terms = terms(&cluster).await;
        terms.iter().all(|(t, leader)| *t > worst && leader.is_some())
    })
    .await;
    assert!(moved, "the cluster elects a leader above the pushed term: {:?}", terms(&cluster).await);
    writes_succeed(&cluster, "pushed").await;
    // The leader dies; then every node restarts.
    let leader = cluster.leader(Duration::from_secs(10)).await.unwrap();
    cluster.nodes[leader].kill9();
    let survivors: Vec<String> =
        cluster.nodes.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, n)| n.url.clone()).collect();
    let mut client = Failover::new(&survivors, 0);
    let session = client.session(60_000).await;
    assert!(!session.is_empty());
    for node in &mut cluster.nodes {
        node.kill9();
    }
    for node in &mut cluster.nodes {
        node.restart();
    }
    assert!(cluster.leader(Duration::from_secs(20)).await.is_some(), "a leader after every node restarted");
    writes_succeed(&cluster, "restarted").await;
    assert!(terms(&cluster).await.iter().all(|(t, _)| *t > worst));
}

/// Finding: a node holding the secret but not a member (a removed node left running) deposed
/// the leader with one heartbeat at a higher term. Now a leader, and a follower that hears from
/// its leader, take nothing from a non-member, whatever membership it claims.
#[tokio::test]
async fn a_removed_node_holding_the_secret_cannot_depose_the_leader() {
    let mut cluster = Cluster::start(3, &[]).await;
    let joiner = cluster.start_joiner(4);
    let mut admin = Failover::new(&cluster.urls()[..3], 0);
    let added =
        admin.post("/v1/cluster/members", json!({ "id": 4, "addr": cluster.nodes[joiner].addr })).await;
    assert_eq!(added.status, 200, "{added:?}");
    let removed = admin.send("DELETE", "/v1/cluster/members/4", None, Duration::from_secs(20)).await.0;
    assert_eq!(removed.status, 204, "{removed:?}");
    let members = &cluster.nodes[..3];
    let before = {
        let mut before = Vec::new();
        for node in members {
            let health = Api::at(&node.url).get("/v1/health").await.body;
            before.push((health["raft_term"].as_u64().unwrap(), health["raft_leader"].as_u64()));
        }
        before
    };
    let (term, leader) = (before[0].0, before[0].1.expect("a leader"));
    // Node 4's own (stale) membership claim, and a made-up newer one that lists it.
    let claims = [String::new(), format!("{term}.{leader}.1:1,2,3,4"), format!("{}.4.999999:4", term + 100)];
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let signer = PeerSigner::new(ClusterSecret::new(CLUSTER_SECRET.as_bytes()).unwrap(), 4);
    let heartbeat = postcard::to_allocvec(&AppendEntriesRequest::<TypeConfig> {
        vote: Vote::new_committed(term + 5, 4),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    })
    .unwrap();
    for (i, node) in members.iter().enumerate() {
        for claim in &claims {
            let to = i as u64 + 1;
            let headers = signed((&node.url, to), "/raft/append", &heartbeat, claim, &signer).await;
            let (status, code) =
                send_peer(&http, &node.url, "/raft/append", headers, heartbeat.clone()).await;
            assert_eq!((status, code.as_str()), (403, "permission_denied"), "node {to}, claim {claim:?}");
        }
    }
    let mut after = Vec::new();
    for node in members {
        let health = Api::at(&node.url).get("/v1/health").await.body;
        after.push((health["raft_term"].as_u64().unwrap(), health["raft_leader"].as_u64()));
    }
    assert_eq!(after, before, "no member's term or leader moved");
}
