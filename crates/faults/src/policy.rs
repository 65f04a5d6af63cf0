//! The semaphore policy scenario (`PF`): a rated semaphore taken by 16 concurrent clients, and
//! capacity-1 semaphores with a lock-delay whose holds are revoked while a waiter queues, while
//! the leader is killed with `kill -9` twice and each killed node comes back with its wall clock
//! an hour ahead (libfaketime, when `clock_jump`; the monotonic clock untouched). Judged from
//! the clients in real time by `permit_check`'s P1 ([`check_takes_within_rate`]) and P2
//! ([`check_lock_delay`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use permit_check::{check_lock_delay, check_takes_within_rate, Granted, RateLimit, Report, Revoked};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::cluster::{Clock, Cluster};

/// The rated semaphore's rate.
pub const RATE: RateLimit = RateLimit { permits: 20, per_ms: 1000, burst: 5 };
/// The lock-delay of the capacity-1 semaphore.
pub const LOCK_DELAY_MS: u64 = 1000;
/// Concurrent take clients.
pub const TAKERS: u64 = 16;
/// Capacity-1 lock-delayed semaphores, each with its own loop of revoke rounds.
const LEASES: usize = 3;
/// P1's slack, in permits: leader time counts whole ms and the harness measures in ns from
/// sending the `PUT`, so rounding can cost less than one permit; nothing else is allowed.
pub const RATE_SLACK: u64 = 1;
/// Timeout of every call.
const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long the leader stays down after each `kill -9`, and how long the traffic runs before,
/// between and after the kills.
const PHASE: Duration = Duration::from_millis(1500);

/// What one run found.
pub struct Outcome {
    /// P1 and P2.
    pub report: Report,
    /// Takes answered 200, answered 429, and unanswered or failed otherwise.
    pub takes: (usize, usize, usize),
    /// When the rated semaphore's `PUT` was sent, and when each take answered 200 arrived (ns).
    pub taken_ns: (u64, Vec<u64>),
    /// Lock-delay rounds whose revoke and waiter's grant were both acknowledged.
    pub delayed_grants: usize,
    /// What happened, for the summary.
    pub notes: Vec<String>,
    /// Where the node logs are.
    pub dir: PathBuf,
}

/// Takes, revokes and grants as the clients saw them.
#[derive(Default)]
struct Seen {
    taken_ns: Vec<u64>,
    refused: usize,
    lost: usize,
    revokes: Vec<Revoked>,
    grants: Vec<Granted>,
}

/// Runs the scenario with the `permit` binary `bin` under `out`; `clock_jump` restarts the
/// killed nodes with their wall clock an hour ahead (needs libfaketime).
pub async fn run(bin: &Path, out: &Path, seed: u64, clock_jump: bool) -> anyhow::Result<Outcome> {
    let dir = out.join(format!("PF-policies-seed{seed}"));
    let _ = std::fs::remove_dir_all(&dir);
    let mut cluster = Cluster::start(bin, &dir, 3, &[], &[], &[]).await.context("start cluster")?;
    let epoch = Instant::now();
    let ns = move || epoch.elapsed().as_nanos() as u64;
    let http = reqwest::Client::builder().no_proxy().timeout(CALL_TIMEOUT).build()?;
    let urls = cluster.urls();
    let rate = json!({ "permits": RATE.permits, "per_ms": RATE.per_ms, "burst": RATE.burst });
    // The rate is set (with a full burst) no earlier than this.
    let start_ns = ns();
    put_policy(&http, &urls, "api", json!({ "capacity": 1, "rate": rate })).await?;
    for lease in 0..LEASES {
        let body = json!({ "capacity": 1, "lock_delay_ms": LOCK_DELAY_MS });
        put_policy(&http, &urls, &format!("lease{lease}"), body).await?;
    }

    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..TAKERS {
        let rng = StdRng::seed_from_u64(seed ^ (i << 20));
        tasks.push(tokio::spawn(take(
            http.clone(),
            urls.clone(),
            i as usize,
            seen.clone(),
            stop.clone(),
            rng,
            ns,
        )));
    }
    for lease in 0..LEASES {
        let (http, urls, seen, stop) = (http.clone(), urls.clone(), seen.clone(), stop.clone());
        tasks.push(tokio::spawn(revoke_rounds(http, urls, lease, seen, stop, ns)));
    }

    let mut notes = Vec::new();
    tokio::time::sleep(PHASE).await;
    for _ in 0..2 {
        let leader = cluster.wait_for_leader(Duration::from_secs(20)).await.context("a leader")?;
        cluster.kill(leader);
        tokio::time::sleep(PHASE).await;
        let clock = clock_jump.then(|| Clock::WallShift("+1h".into()));
        cluster.restart(leader, clock)?;
        notes.push(format!(
            "killed leader node {}; restarted{}",
            leader + 1,
            if clock_jump { " with its wall clock +1h" } else { "" }
        ));
        cluster.wait_for_leader(Duration::from_secs(20)).await.context("a leader after the restart")?;
        tokio::time::sleep(PHASE).await;
    }
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await?;
    notes.push(format!("node {} leads at the end", leader + 1));
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }
    let seen = std::mem::take(&mut *seen.lock().expect("seen lock"));
    let mut report = check_takes_within_rate(&seen.taken_ns, start_ns, RATE, RATE_SLACK);
    report.merge(check_lock_delay(&seen.revokes, &seen.grants, LOCK_DELAY_MS));
    drop(cluster);
    Ok(Outcome {
        report,
        takes: (seen.taken_ns.len(), seen.refused, seen.lost),
        taken_ns: (start_ns, seen.taken_ns.clone()),
        delayed_grants: seen.grants.len(),
        notes,
        dir,
    })
}

/// Sets a semaphore's capacity and policy, retrying across nodes for up to 20 s (a fresh cluster
/// accepts policies once its leader raised the cluster's feature version).
async fn put_policy(http: &reqwest::Client, urls: &[String], name: &str, body: Value) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = String::new();
    for node in 0.. {
        if Instant::now() >= deadline {
            break;
        }
        let url = format!("{}/v1/semaphores/{name}", urls[node % urls.len()]);
        match http.put(url).json(&body).send().await {
            Ok(answer) if answer.status().is_success() => return Ok(()),
            Ok(answer) => last = format!("{}: {}", answer.status(), answer.text().await.unwrap_or_default()),
            Err(error) => last = error.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("PUT {name} with its policy: {last}")
}

/// One take client: takes one permit (now and then waiting up to 500 ms in the queue), and
/// after a refusal or an error pauses 10-60 ms; moves to another node after an error.
async fn take(
    http: reqwest::Client,
    urls: Vec<String>,
    mut node: usize,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    mut rng: StdRng,
    ns: impl Fn() -> u64,
) {
    while !stop.load(Ordering::Relaxed) {
        let wait_ms = if rng.random_bool(0.2) { 500 } else { 0 };
        let url = format!("{}/v1/semaphores/api/take", urls[node % urls.len()]);
        let answer = http.post(url).json(&json!({ "permits": 1, "wait_ms": wait_ms })).send().await;
        let status = answer.as_ref().map(|answer| answer.status().as_u16()).ok();
        let answered_ns = ns();
        {
            let mut seen = seen.lock().expect("seen lock");
            match status {
                Some(200) => seen.taken_ns.push(answered_ns),
                Some(429) => seen.refused += 1,
                _ => seen.lost += 1,
            }
        }
        if status != Some(200) {
            if status != Some(429) {
                node += 1;
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(10..=60))).await;
        }
    }
}

/// Rounds on the lock-delayed semaphore until `stop`: a holder acquires it, a waiter queues for
/// it, an admin revokes the holder; the waiter's grant must come no earlier than the revoke's
/// send time plus the lock-delay. Each round ends by closing both sessions (no delay).
async fn revoke_rounds(
    http: reqwest::Client,
    urls: Vec<String>,
    lease: usize,
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    ns: impl Fn() -> u64 + Clone + Send + 'static,
) {
    let mut node = lease;
    while !stop.load(Ordering::Relaxed) {
        node += 1;
        let base = urls[node % urls.len()].clone();
        let (Some(holder), Some(waiter)) = (session(&http, &base).await, session(&http, &base).await) else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let acquire = |session: &str, wait_ms: u64| {
            http.post(format!("{base}/v1/semaphores/lease{lease}/acquire"))
                .json(&json!({ "session": session, "wait_ms": wait_ms }))
                .timeout(Duration::from_millis(wait_ms) + CALL_TIMEOUT)
                .send()
        };
        let held = match acquire(&holder, 0).await {
            Ok(answer) if answer.status() == 200 => {
                answer.json::<Value>().await.ok().and_then(|b| b["token"].as_u64())
            }
            _ => None,
        };
        if let Some(token) = held {
            // The waiter's answer time is taken as it arrives, whatever the revoke is doing.
            let waiting = {
                let (request, ns) = (acquire(&waiter, 2 * LOCK_DELAY_MS + 2000), ns.clone());
                let semaphore = format!("lease{lease}");
                tokio::spawn(async move {
                    let answer = request.await.ok()?;
                    let answered_ns = ns();
                    let body = answer.json::<Value>().await.ok()?;
                    match body["status"].as_str() {
                        Some("acquired") => {
                            Some(Granted { semaphore, answered_ns, token: body["token"].as_u64()? })
                        }
                        _ => None,
                    }
                })
            };
            tokio::time::sleep(Duration::from_millis(100)).await;
            let sent_ns = ns();
            let revoke = http
                .post(format!("{base}/v1/semaphores/lease{lease}/revoke"))
                .json(&json!({ "session": holder }))
                .send()
                .await;
            // Acknowledged, and it ended the hold (`released` 1): the waiter's grant comes after it.
            let released = match revoke {
                Ok(answer) if answer.status().is_success() => {
                    answer.json::<Value>().await.ok().and_then(|body| body["released"].as_u64())
                }
                _ => None,
            };
            if released == Some(1) {
                seen.lock().expect("seen lock").revokes.push(Revoked {
                    semaphore: format!("lease{lease}"),
                    sent_ns,
                    token,
                });
            }
            if let Ok(Some(grant)) = waiting.await {
                seen.lock().expect("seen lock").grants.push(grant);
            }
        }
        for session in [holder, waiter] {
            let _ = http.delete(format!("{base}/v1/sessions/{session}")).send().await;
        }
    }
}

/// A session with a 10 s TTL on `base`.
async fn session(http: &reqwest::Client, base: &str) -> Option<String> {
    let answer =
        http.post(format!("{base}/v1/sessions")).json(&json!({ "ttl_ms": 10_000 })).send().await.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    answer.json::<Value>().await.ok()?["id"].as_str().map(str::to_owned)
}
