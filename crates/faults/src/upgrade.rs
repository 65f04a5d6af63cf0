//! The rolling upgrade (F11, docs/operations.md *Upgrading*): a cluster started with an older
//! build is upgraded one node at a time, followers first and the leader last, under the
//! scenario's workloads, which the checkers then judge as in every other scenario. Beside them
//! this module checks what an upgrade promises: each step costs at most one failover of
//! unavailability, and a newer feature is refused while an older member remains and works once
//! none does. (A downgrade after the raise is refused at start by versioned builds: the cluster
//! test `versions` shows it with a node that speaks version 1. Builds from before versioning
//! cannot be made to refuse: docs/operations.md, *Rolling back*.)

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::cluster::Cluster;

/// Longest writes may be unavailable during one step: a failover (election timeouts of
/// 0.5-1 s, a vote or two, the new leader's first commit), with room for a loaded machine.
pub const STEP_UNAVAILABLE_MAX: Duration = Duration::from_secs(6);
/// How long a node may take to stop on SIGTERM before it is killed.
const STOP_PATIENCE: Duration = Duration::from_secs(15);
/// The probe semaphore that the revoke checks use (outside the workloads' semaphores, so
/// their checks never see it).
const PROBE: &str = "upgrade-probe";

/// An answer's status and body.
async fn call(
    cluster: &Cluster,
    i: usize,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> Option<(u16, Value)> {
    let method = reqwest::Method::from_bytes(method.as_bytes()).ok()?;
    let mut request = cluster
        .http
        .request(method, format!("{}{path}", cluster.nodes[i].url()))
        .timeout(Duration::from_secs(10));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let answer = request.send().await.ok()?;
    let status = answer.status().as_u16();
    Some((status, answer.json().await.unwrap_or(Value::Null)))
}

/// Successful writes, timed, by a task that writes every 20 ms through whichever node answers.
struct Writes {
    ok_at: Arc<Mutex<Vec<Instant>>>,
    stop: Arc<AtomicBool>,
}

impl Writes {
    fn start(urls: Vec<String>, http: reqwest::Client) -> Writes {
        let (ok_at, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (times, stopped) = (ok_at.clone(), stop.clone());
        tokio::spawn(async move {
            let mut next = 0;
            // Bounded by the stop flag, which `rolling_upgrade` always sets.
            while !stopped.load(Ordering::Relaxed) {
                let url = format!("{}/v1/semaphores/upgrade-availability", urls[next % urls.len()]);
                let put =
                    http.put(url).json(&json!({ "capacity": 1 })).timeout(Duration::from_secs(2)).send();
                match put.await {
                    Ok(answer) if answer.status().is_success() => {
                        times.lock().unwrap().push(Instant::now());
                    }
                    _ => next += 1,
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Writes { ok_at, stop }
    }

    /// The longest stretch without a successful write between `from` and `to`.
    fn longest_gap(&self, from: Instant, to: Instant) -> Duration {
        let times = self.ok_at.lock().unwrap();
        let inside = times.iter().copied().filter(|t| *t > from && *t < to);
        let mut last = from;
        let mut longest = Duration::ZERO;
        for t in inside.chain(std::iter::once(to)) {
            longest = longest.max(t - last);
            last = t;
        }
        longest
    }
}

impl Drop for Writes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits until node `i` answers its health probe with `ok`.
async fn healthy(cluster: &Cluster, i: usize, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if cluster.health(i).await.is_some_and(|h| h["status"] == "ok") {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("node {} was not healthy within {timeout:?} of its upgrade", cluster.nodes[i].id)
}

/// Upgrades every node of `cluster` to `to`, followers first, checking each step; returns
/// notes on what happened.
pub async fn rolling_upgrade(cluster: &mut Cluster, to: &Path) -> anyhow::Result<Vec<String>> {
    let mut notes = Vec::new();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    // A hold outside the workloads, for the revokes.
    let created = call(cluster, leader, "POST", "/v1/sessions", Some(json!({ "ttl_ms": 600_000 }))).await;
    let session =
        created.and_then(|(_, body)| body["id"].as_str().map(str::to_owned)).context("probe session")?;
    let put =
        call(cluster, leader, "PUT", &format!("/v1/semaphores/{PROBE}"), Some(json!({ "capacity": 1 })))
            .await;
    anyhow::ensure!(put.is_some_and(|(status, _)| status < 300), "probe semaphore");
    let acquire = json!({ "session": session });
    let granted =
        call(cluster, leader, "POST", &format!("/v1/semaphores/{PROBE}/acquire"), Some(acquire)).await;
    anyhow::ensure!(granted.is_some_and(|(_, body)| body["status"] == "acquired"), "probe hold");
    let revoke = json!({ "session": session });
    let revoke_path = format!("/v1/semaphores/{PROBE}/revoke");

    let writes = Writes::start(cluster.urls(), cluster.http.clone());
    let order: Vec<usize> = (0..cluster.nodes.len()).filter(|i| *i != leader).chain([leader]).collect();
    for (step, &i) in order.iter().enumerate() {
        let started = Instant::now();
        cluster.upgrade(i, to, STOP_PATIENCE).await?;
        healthy(cluster, i, Duration::from_secs(30)).await?;
        cluster.wait_for_leader(Duration::from_secs(20)).await?;
        // Writes resumed: the gap is measured up to the first write after the step.
        let resumed = Instant::now() + Duration::from_secs(10);
        while writes.ok_at.lock().unwrap().last().is_none_or(|t| *t < started) && Instant::now() < resumed {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let gap = writes.longest_gap(started, Instant::now());
        notes.push(format!(
            "node {} upgraded: writes unavailable at most {} ms",
            cluster.nodes[i].id,
            gap.as_millis()
        ));
        anyhow::ensure!(
            gap <= STEP_UNAVAILABLE_MAX,
            "upgrading node {} left writes unavailable for {gap:?} (more than one failover)",
            cluster.nodes[i].id
        );
        if step + 2 == order.len() {
            // One older member left (the first leader): a new leader refuses the newer
            // feature, naming it, and the view shows each member's version.
            let old = order[step + 1];
            let mut now = cluster.wait_for_leader(Duration::from_secs(10)).await?;
            if now == old {
                cluster.pause(old);
                now = elected_other_than(cluster, old).await?;
                cluster.resume(old);
            }
            // Refused at once; named once the new leader has probed the members (each second).
            let named = format!("node {} (version 1)", cluster.nodes[old].id);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let refused = call(cluster, now, "POST", &revoke_path, Some(revoke.clone())).await;
                let (status, body) = refused.context("revoke on a mixed cluster")?;
                let message = body["error"]["message"].as_str().unwrap_or_default().to_owned();
                anyhow::ensure!(
                    status == 409 && body["error"]["code"] == "feature_unavailable",
                    "a revoke on a mixed cluster: {status} {body}"
                );
                if message.contains(&named) {
                    break;
                }
                anyhow::ensure!(Instant::now() < deadline, "the refusal never named {named}: {message}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let (_, view) = call(cluster, now, "GET", "/v1/cluster", None).await.context("cluster view")?;
            anyhow::ensure!(view["feature_version"] == 1, "a mixed cluster is at version 1: {view}");
            notes.push(format!("mixed cluster: revoke refused naming {named}"));
        }
    }
    drop(writes);

    // Every member speaks this build's version now (2 or newer): the leader raises the cluster,
    // and the revoke works.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
        let view = call(cluster, leader, "GET", "/v1/cluster", None).await.map(|(_, view)| view);
        if view.as_ref().is_some_and(|v| v["feature_version"].as_u64().is_some_and(|v| v >= 2)) {
            break;
        }
        if Instant::now() > deadline {
            bail!("the cluster's version was not raised after the last node: {view:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    let revoked = call(cluster, leader, "POST", &revoke_path, Some(revoke)).await;
    anyhow::ensure!(
        revoked.as_ref().is_some_and(|(status, _)| *status == 200),
        "revoke after the upgrade: {revoked:?}"
    );
    notes.push("after the last node: version raised, revoke works".to_owned());

    Ok(notes)
}

async fn elected_other_than(cluster: &Cluster, old: usize) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        for i in (0..cluster.nodes.len()).filter(|i| *i != old) {
            if cluster.health(i).await.is_some_and(|h| h["raft_role"] == "leader") {
                return Ok(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("no other node was elected while node {} was paused", cluster.nodes[old].id)
}
