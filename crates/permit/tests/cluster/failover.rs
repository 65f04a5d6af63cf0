//! Leader `kill -9` under load: nothing acknowledged is lost, tokens keep growing, the queue
//! keeps its order, and service resumes (how soon is the benchmark's `failover` figure).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::common::Cluster;
use crate::{Api, Failover};

const WORKERS: usize = 6;
/// TTL of the session whose expiry a new leader must not bring forward.
const TTL: Duration = Duration::from_secs(2);
const SEMAPHORES: usize = 3;

#[derive(Default)]
struct History {
    /// (semaphore, session) -> last acknowledged state: Some(token) held, None released.
    last: BTreeMap<(String, String), Option<u64>>,
    /// Acknowledged grants: (first invoke, ack, token).
    grants: Vec<(Instant, Instant, u64)>,
    ops: usize,
    unknown: u32,
    stop: bool,
}

async fn worker(mut client: Failover, session: String, history: Arc<Mutex<History>>, seed: usize) {
    for step in 0.. {
        if history.lock().unwrap().stop {
            return;
        }
        let name = format!("f{}", (seed + step) % SEMAPHORES);
        let acquire = step % 2 == 0;
        let path = format!("/v1/semaphores/{name}/{}", if acquire { "acquire" } else { "release" });
        let invoked = Instant::now();
        // Retried on unknown outcomes: acquire and release are idempotent per (session, semaphore).
        let (answer, unknown) =
            client.send("POST", &path, Some(json!({ "session": session })), Duration::from_secs(30)).await;
        let acked = Instant::now();
        let mut history = history.lock().unwrap();
        history.ops += 1;
        history.unknown += unknown;
        let key = (name, session.clone());
        match (acquire, answer.status) {
            (true, 200) => {
                let token = answer.body["token"].as_u64().unwrap();
                history.grants.push((invoked, acked, token));
                history.last.insert(key, Some(token));
            }
            (true, 409) => assert_eq!(answer.body["error"]["code"], "unavailable"),
            (false, 200) => {
                history.last.insert(key, None);
            }
            other => panic!("unexpected {other:?}: {}", answer.body),
        }
    }
}

#[tokio::test]
async fn leader_kill_9_under_load_loses_nothing_acknowledged_and_keeps_the_queue() {
    let mut cluster = Cluster::start(3, &[]).await;
    let urls = cluster.urls();
    let mut admin = Failover::new(&urls, 0);
    for i in 0..SEMAPHORES {
        admin
            .send(
                "PUT",
                &format!("/v1/semaphores/f{i}"),
                Some(json!({ "capacity": 2 })),
                Duration::from_secs(10),
            )
            .await;
    }
    // A queue that must keep its order across the failover.
    let holder = admin.session(60_000).await;
    let waiters = [admin.session(60_000).await, admin.session(60_000).await, admin.session(60_000).await];
    admin.post("/v1/semaphores/q/acquire", json!({ "session": holder, "capacity": 1 })).await;
    for w in &waiters {
        let answer = admin.post("/v1/semaphores/q/acquire", json!({ "session": w, "wait_ms": 1 })).await;
        assert_eq!(answer.status, 202);
    }

    let history = Arc::new(Mutex::new(History::default()));
    let mut tasks = Vec::new();
    for i in 0..WORKERS {
        let mut client = Failover::new(&urls, i);
        let session = client.session(60_000).await;
        tasks.push(tokio::spawn(worker(client, session, history.clone(), i)));
    }
    let progress = |n: usize| {
        let history = history.clone();
        async move {
            crate::common::eventually(Duration::from_secs(30), async || history.lock().unwrap().ops >= n)
                .await
        }
    };
    assert!(progress(120).await, "workload runs before the fault");

    let leader = cluster.leader(Duration::from_secs(5)).await.unwrap();
    let ops_at_kill = history.lock().unwrap().ops;
    let killed_at = Instant::now();
    cluster.nodes[leader].kill9();
    let survivor = (leader + 1) % 3;
    let mut probe = Failover::new(&urls[survivor..=survivor], 0);
    let probe_session = probe.session(60_000).await;
    let answer =
        probe.post("/v1/semaphores/probe/acquire", json!({ "session": probe_session, "capacity": 1 })).await;
    let failover = killed_at.elapsed();
    assert_eq!(answer.status, 200);
    println!("failover: leader kill -9 to first acquire through another node took {failover:?}");
    assert!(progress(ops_at_kill + 120).await, "the workload resumed after the failover");
    history.lock().unwrap().stop = true;
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(40), task).await.expect("workers stop").unwrap();
    }

    let history = std::mem::take(&mut *history.lock().unwrap());
    // Every acknowledged grant and release is reflected in the state (linearizable reads).
    for ((name, session), token) in &history.last {
        let view = admin.get(&format!("/v1/semaphores/{name}")).await;
        let held = view.body["holders"].as_array().unwrap().iter().find(|h| h["session"] == session.as_str());
        assert_eq!(held.map(|h| h["token"].as_u64().unwrap()), *token, "{name} {session}");
    }
    // Tokens grow in real-time order: a grant invoked after another was acknowledged has a larger token.
    for a in &history.grants {
        for b in &history.grants {
            if a.1 < b.0 {
                assert!(b.2 > a.2, "token {} acknowledged before token {} was asked for", a.2, b.2);
            }
        }
    }
    assert!(history.grants.len() > 50);
    // The queue kept its order: releasing hands the semaphore down the line.
    let order = admin.get("/v1/semaphores/q").await;
    let queued: Vec<&str> =
        order.body["waiters"].as_array().unwrap().iter().map(|w| w["session"].as_str().unwrap()).collect();
    assert_eq!(queued, waiters.iter().map(String::as_str).collect::<Vec<_>>());
    let mut previous = holder;
    for w in &waiters {
        admin.post("/v1/semaphores/q/release", json!({ "session": previous })).await;
        let view = admin.get("/v1/semaphores/q").await;
        assert_eq!(view.body["holders"][0]["session"], w.as_str());
        previous = w.clone();
    }
    println!("checked {} operations, {} unknown attempts retried", history.ops, history.unknown);
}

#[tokio::test]
async fn a_new_leader_extends_sessions_and_never_expires_them_early() {
    let mut cluster = Cluster::start(3, &[]).await;
    let urls = cluster.urls();
    let mut client = Failover::new(&urls, 0);
    // Keepalive acknowledged just before the kill. A correct new leader gives the session at
    // least now + TTL when it takes over, after the keepalive was sent: no read may find it gone
    // before `sent + TTL`, however long the failover takes.
    let session = client.session(TTL.as_millis() as u64).await;
    client.post("/v1/semaphores/lease/acquire", json!({ "session": session, "capacity": 1 })).await;
    let leader = cluster.leader(Duration::from_secs(5)).await.unwrap();
    let sent = Instant::now();
    let answer = client.post(&format!("/v1/sessions/{session}/keepalive"), json!(null)).await;
    assert_eq!(answer.status, 200);
    cluster.nodes[leader].kill9();
    let mut other = Failover::new(&urls, leader + 1);
    // Read until the session is gone (without keepalives it does expire): every read answered
    // before `sent + TTL` shows the holder, the first that does not was answered after it.
    let mut reads = Vec::new();
    let gone = crate::common::eventually(TTL + Duration::from_secs(10), async || {
        let view = other.get("/v1/semaphores/lease").await;
        let answered = sent.elapsed();
        let Some(holders) = view.body["holders"].as_array() else { return false };
        assert!(holders.is_empty() || holders[0]["session"] == session.as_str(), "{view:?}");
        reads.push(answered);
        holders.is_empty()
    })
    .await;
    assert!(gone, "the session expired eventually ({} reads)", reads.len());
    let expired_by = reads.last().unwrap();
    assert!(*expired_by >= TTL, "a read {expired_by:?} after the keepalive found the session expired");
}

#[tokio::test]
async fn a_follower_forwards_a_batched_keepalive_to_the_leader() {
    let cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(5)).await.unwrap();
    let api = Api::new(&cluster.nodes[(leader + 1) % 3]);
    let (a, b) = (api.session(30_000).await, api.session(20_000).await);
    let answer = api.post("/v1/sessions/keepalive", json!({ "sessions": [a, "0".repeat(32), b] })).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let results = &answer.body["sessions"];
    assert_eq!((results[0]["id"].as_str(), results[0]["ttl_ms"].as_u64()), (Some(a.as_str()), Some(30_000)));
    assert_eq!(results[1]["error"]["code"], "session_not_found", "{answer:?}");
    assert_eq!((results[2]["id"].as_str(), results[2]["ttl_ms"].as_u64()), (Some(b.as_str()), Some(20_000)));
    // The leader renewed them (keepalives are answered by the leader only).
    let raw =
        reqwest::get(format!("{}/metrics", cluster.nodes[leader].url)).await.unwrap().text().await.unwrap();
    assert!(
        raw.lines().any(|line| line == "permit_session_keepalives_total 2"),
        "the leader counted 2 renewals"
    );
}
