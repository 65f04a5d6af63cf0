//! Scenarios: a cluster, workloads, one fault, then every check.
//!
//! Each run: start 3 nodes, warm up, inject the fault, prove that it happened, heal, let the
//! workload run on, stop it, close the clients' sessions, then check the history (well-formed,
//! capacity, tokens, fencing, linearizability for the long-TTL workload, durability against a
//! final read, convergence of the replicas, no acknowledgement from a cut-off node, no permit
//! lost, clean logs). A failed run keeps its history and node logs in the output dir.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use permit_check::{
    check_capacity, check_convergence, check_durability, check_fenced_counter, check_fencing,
    check_linearizability, check_logs, check_minority_acks, check_no_permit_lost, check_queues, check_tokens,
    check_well_formed, ClockAllowance, FinalItem, FinalRead, FreshAcquire, Isolation, QueueFinal, Recorder,
    ReplicaDigest, Report, SearchBudget,
};

use crate::client::Client;
use crate::cluster::{Clock, Cluster};
use crate::resource::Resource;
use crate::workload::{self, Kind, Shared, Workload};

/// The fault a scenario injects.
#[derive(Clone, Debug, PartialEq)]
pub enum Fault {
    /// None: the checkers must pass on a healthy cluster.
    None,
    /// Cut the leader off from both followers (F1).
    IsolateLeader,
    /// Split the leader and one follower (majority) from the other follower (minority) (F2).
    SplitMinority,
    /// `kill -9` the leader, restart it after the fault time (F3).
    KillLeader,
    /// `kill -9` every node, restart them all (F4).
    KillAll,
    /// SIGSTOP the leader past the election timeout, then SIGCONT (F5).
    PauseLeader,
    /// SIGSTOP a follower, then SIGCONT (F5b).
    PauseFollower,
    /// Latency and loss on every peer link (F9).
    Degrade,
    /// Add node 4, then remove the first leader, under traffic (F8).
    Membership,
    /// Cut a follower off until the leader compacts past it, then heal (F10).
    SnapshotCatchUp,
    /// Fill the leader's disk (every node's data dir is on a small tmpfs of its own): it must
    /// fail-stop (refuse work, exit) and lose nothing acknowledged; then free the space and
    /// restart it (F12). Needs root, to mount the tmpfs.
    FullDisk,
    /// Upgrade every node, one at a time, to this build (F11; `upgrade.rs`). The scenario's
    /// cluster starts with the older build that `run` is given.
    RollingUpgrade(PathBuf),
}

/// One scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// Short name, e.g. `F1-isolate-leader`.
    pub name: String,
    /// The fault.
    pub fault: Fault,
    /// The workloads.
    pub workloads: Vec<Workload>,
    /// Clocks of particular nodes (libfaketime).
    pub clocks: Vec<(u64, Clock)>,
    /// How long the fault lasts.
    pub fault_for: Duration,
    /// Warm-up before and run-on after the fault.
    pub settle: Duration,
    /// Server arguments (e.g. a small snapshot interval).
    pub server_args: Vec<String>,
    /// The bug to inject (`PERMIT_INJECT_BUG`), for self-tests.
    pub bug: Option<String>,
    /// Longest the queues' drain may take once the faults stopped: the abandoned sessions'
    /// claims come back after their TTL, and each item takes a claim and an ack.
    pub drain_for: Duration,
}

/// The result of a run.
pub struct Outcome {
    /// Every check, merged.
    pub report: Report,
    /// Operations recorded.
    pub ops: usize,
    /// Where the history and logs are.
    pub dir: PathBuf,
    /// Notes on what happened (fault evidence).
    pub notes: Vec<String>,
}

/// The standard workload mix: churn with TTL 2 s, a fenced counter, long-TTL linearizable.
pub fn standard_workloads() -> Vec<Workload> {
    vec![
        Workload {
            kind: Kind::Churn,
            semaphores: vec![("churn-a".into(), 1), ("churn-b".into(), 3)],
            clients: 4,
            ttl_ms: 2000,
            hold_ms_max: 300,
        },
        Workload {
            kind: Kind::FencedCounter,
            semaphores: vec![("fenced".into(), 1)],
            clients: 3,
            ttl_ms: 2000,
            hold_ms_max: 50,
        },
        Workload {
            kind: Kind::Linearizable,
            semaphores: vec![("lin".into(), 2)],
            clients: 3,
            ttl_ms: 3_600_000,
            hold_ms_max: 0,
        },
    ]
}

/// The queue workload: 2 producers, 3 consumers with TTL 2 s, on one queue whose items are
/// dead-lettered after [`QUEUE_MAX_ATTEMPTS`] claims.
pub fn queue_workloads() -> Vec<Workload> {
    vec![Workload {
        kind: Kind::Queue,
        semaphores: vec![("work".into(), 0)],
        clients: workload::QUEUE_PRODUCERS + 3,
        ttl_ms: 2000,
        hold_ms_max: 100,
    }]
}

/// Claims of one item before the queue workload's queue dead-letters it: low, so that faults,
/// nacks and abandoned sessions send some items there.
pub const QUEUE_MAX_ATTEMPTS: u32 = 3;

/// Names of the standard scenarios, for `permit-faults --scenarios`: the semaphore ones
/// (`F..`), then faults under the queue workload (`QF..`). `F12` (a full disk under the
/// semaphore workloads) runs by name only: the failed node's 503s leave the linearizable
/// clients so many open calls that the linearizability search exhausts its budget.
pub const STANDARD: [&str; 21] = [
    "F0", "F1", "F2", "F3", "F4", "F5", "F5b", "F7a", "F7b", "F7c", "F8", "F9", "F10", "QF0", "QF1", "QF2",
    "QF3", "QF4", "QF5", "QF8", "QF12",
];

impl Scenario {
    /// A standard scenario by its short name (`F0` .. `F10`), and whether it must fail the
    /// checks (F7c documents the clock assumption).
    pub fn standard(name: &str) -> Option<(Scenario, bool)> {
        if let Some(fault) = name.strip_prefix('Q') {
            let (mut scenario, must_fail) = Scenario::standard(fault)?;
            if !fault.starts_with('F') || must_fail || scenario.fault == Fault::SnapshotCatchUp {
                return None;
            }
            scenario.name = format!("Q{}", scenario.name);
            scenario.workloads = queue_workloads();
            return Some((scenario, false));
        }
        let (fault, label) = match name {
            "F0" => (Fault::None, "F0-none"),
            "F1" => (Fault::IsolateLeader, "F1-isolate-leader"),
            "F2" => (Fault::SplitMinority, "F2-minority-split"),
            "F3" => (Fault::KillLeader, "F3-kill-leader"),
            "F4" => (Fault::KillAll, "F4-kill-all"),
            "F5" => (Fault::PauseLeader, "F5-pause-leader"),
            "F5b" => (Fault::PauseFollower, "F5b-pause-follower"),
            "F7a" | "F7b" | "F7c" => (Fault::None, name),
            "F8" => (Fault::Membership, "F8-membership"),
            "F9" => (Fault::Degrade, "F9-degrade"),
            "F10" => (Fault::SnapshotCatchUp, "F10-snapshot-catch-up"),
            "F12" => (Fault::FullDisk, "F12-full-disk"),
            _ => return None,
        };
        let mut scenario = Scenario::new(label, fault);
        match name {
            "F7a" => {
                scenario.clocks =
                    vec![(1, Clock::WallShift("+1h".into())), (2, Clock::WallShift("-1h".into()))]
            }
            "F7b" => scenario.clocks = vec![(1, Clock::Rate(1.03))],
            "F7c" => scenario.clocks = vec![(1, Clock::Rate(3.0))],
            "F10" => {
                scenario.server_args = vec!["--snapshot-logs".into(), "100".into()];
                scenario.fault_for = Duration::from_secs(5);
            }
            // Frequent snapshots: the full disk fails the next one (log appends go to space
            // preallocated a MiB at a time, and may not fail for a while).
            "F12" => scenario.server_args = vec!["--snapshot-logs".into(), "100".into()],
            _ => {}
        }
        Some((scenario, name == "F7c"))
    }

    /// A scenario with the standard workloads.
    pub fn new(name: &str, fault: Fault) -> Scenario {
        Scenario {
            name: name.to_owned(),
            fault,
            workloads: standard_workloads(),
            clocks: Vec::new(),
            fault_for: Duration::from_secs(3),
            settle: Duration::from_secs(2),
            server_args: Vec::new(),
            bug: None,
            drain_for: Duration::from_secs(15),
        }
    }

    /// A scenario with the queue workload only (`QF..` in [`STANDARD`]).
    pub fn queue(name: &str, fault: Fault) -> Scenario {
        Scenario { workloads: queue_workloads(), ..Scenario::new(name, fault) }
    }

    fn capacities(&self) -> BTreeMap<String, u64> {
        self.workloads
            .iter()
            .filter(|w| w.kind != Kind::Queue)
            .flat_map(|w| w.semaphores.iter().cloned())
            .collect()
    }

    fn queues(&self) -> Vec<String> {
        self.workloads
            .iter()
            .filter(|w| w.kind == Kind::Queue)
            .flat_map(|w| w.semaphores.iter().map(|(name, _)| name.clone()))
            .collect()
    }
}

/// Runs a scenario with the `permit` binary `bin`, keeping artefacts under `out`.
pub async fn run(scenario: &Scenario, bin: &Path, out: &Path, seed: u64) -> anyhow::Result<Outcome> {
    let dir = out.join(format!("{}-seed{seed}", scenario.name));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // The node processes (test builds of permit-server) honour it; this process never sets it.
    let env: Vec<(String, String)> =
        scenario.bug.iter().map(|bug| ("PERMIT_INJECT_BUG".to_owned(), bug.clone())).collect();
    let args: Vec<&str> = scenario.server_args.iter().map(String::as_str).collect();
    // The data dirs `Cluster::start` uses, each on a tmpfs of its own for a full disk; unmounted
    // when the run ends, after the nodes.
    let _tmpfs = match scenario.fault {
        Fault::FullDisk => {
            (1..=3).map(|id| Tmpfs::mount(&dir.join(format!("n{id}")))).collect::<Result<Vec<_>, _>>()?
        }
        _ => Vec::new(),
    };
    let mut cluster =
        Cluster::start(bin, &dir, 3, &scenario.clocks, &args, &env).await.context("start cluster")?;
    let recorder = Arc::new(Recorder::new());
    let resource = Resource::default();
    let stop = Arc::new(AtomicBool::new(false));
    let shared = Shared {
        recorder: recorder.clone(),
        resource: resource.clone(),
        stop: stop.clone(),
        urls: cluster.urls(),
    };
    let capacities = scenario.capacities();
    let admin = cluster.urls()[0].clone();
    for (name, capacity) in &capacities {
        put_semaphore(&cluster.http, &admin, name, *capacity).await?;
    }
    for name in scenario.queues() {
        let body = serde_json::json!({ "max_attempts": QUEUE_MAX_ATTEMPTS });
        put(&cluster.http, &format!("{admin}/v1/queues/{name}"), body).await?;
    }
    let mut tasks = Vec::new();
    for (i, workload) in scenario.workloads.iter().enumerate() {
        tasks.extend(workload::start(workload, &shared, seed + i as u64, 100 * i as u32));
    }
    tokio::time::sleep(scenario.settle).await;

    let mut notes = Vec::new();
    for (i, node) in cluster.nodes.iter().enumerate() {
        if let Clock::WallShift(_) = node.clock {
            notes.push(format!(
                "node {} wall clock off by {}",
                node.id,
                wall_clock_offset(&cluster, i).await?
            ));
        }
    }
    let mut isolations = Vec::new();
    inject(scenario, &mut cluster, &recorder, &mut notes, &mut isolations).await?;
    cluster.wait_for_leader(Duration::from_secs(20)).await.context("a leader after healing")?;
    tokio::time::sleep(scenario.settle).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }
    let queues = scenario.queues();
    if !queues.is_empty() {
        let started = Instant::now();
        let drained = drain(&cluster, &recorder, &queues, scenario.drain_for).await;
        notes.push(format!("queues drained: {drained} items in {:.1}s", started.elapsed().as_secs_f64()));
    }

    let report =
        check(scenario, &cluster, &recorder, &resource, &capacities, &isolations, &mut notes).await?;
    let history = recorder.history();
    if !report.is_ok() || std::env::var_os("PERMIT_FAULTS_KEEP").is_some() {
        history.save(dir.join("history.jsonl"))?;
        std::fs::write(dir.join("report.txt"), format!("{report}\n{}\n", notes.join("\n")))?;
    }
    let ops = history.len();
    drop(cluster);
    if report.is_ok() && std::env::var_os("PERMIT_FAULTS_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(Outcome { report, ops, dir, notes })
}

/// The difference between a node's wall clock (its HTTP `date` header) and ours, proving that a
/// faked clock took effect.
async fn wall_clock_offset(cluster: &Cluster, node: usize) -> anyhow::Result<String> {
    let url = format!("{}/v1/health", cluster.nodes[node].url());
    let answer = cluster.http.get(url).timeout(Duration::from_secs(5)).send().await?;
    let date = answer.headers().get("date").and_then(|d| d.to_str().ok()).context("no date header")?;
    let theirs = humantime::parse_rfc3339_weak(&rfc3339_of_http_date(date)?)?;
    let ours = std::time::SystemTime::now();
    let (sign, offset) = match theirs.duration_since(ours) {
        Ok(ahead) => ("+", ahead),
        Err(behind) => ("-", behind.duration()),
    };
    anyhow::ensure!(
        offset > Duration::from_secs(1800),
        "the faked clock did not take effect (offset {offset:?})"
    );
    Ok(format!("{sign}{}s", offset.as_secs()))
}

/// `Thu, 03 Dec 2026 08:00:00 GMT` as `2026-12-03 08:00:00`.
fn rfc3339_of_http_date(date: &str) -> anyhow::Result<String> {
    let parts: Vec<&str> = date.split_whitespace().collect();
    anyhow::ensure!(parts.len() == 6, "unexpected date header {date:?}");
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let month = months.iter().position(|m| *m == parts[2]).context("month")? + 1;
    Ok(format!("{}-{month:02}-{:0>2} {}", parts[3], parts[1], parts[4]))
}

async fn put_semaphore(http: &reqwest::Client, url: &str, name: &str, capacity: u64) -> anyhow::Result<()> {
    put(http, &format!("{url}/v1/semaphores/{name}"), serde_json::json!({ "capacity": capacity })).await
}

async fn put(http: &reqwest::Client, url: &str, body: serde_json::Value) -> anyhow::Result<()> {
    let answer = http.put(url).json(&body).timeout(Duration::from_secs(10)).send().await?;
    anyhow::ensure!(answer.status().is_success(), "PUT {url}: {}", answer.status());
    Ok(())
}

/// Drains the queues as one more consumer, recorded like the others: claims and acks every
/// item until the linearizable counts show none pending, delayed or claimed, for at most
/// `drain_for`. Returns the items it acked.
async fn drain(cluster: &Cluster, recorder: &Arc<Recorder>, queues: &[String], drain_for: Duration) -> usize {
    let mut client = Client::new(9_002, cluster.urls(), 0, recorder.clone());
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(9_002);
    let deadline = Instant::now() + drain_for;
    let mut acked = 0;
    let mut session = None;
    while Instant::now() < deadline {
        let Some(id) = session.clone() else {
            session = client.create_session(drain_for.as_millis() as u64 * 2).await;
            if session.is_none() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            continue;
        };
        let mut idle = true;
        for queue in queues {
            if let Some(item) = workload::claim_one(&mut client, &id, queue, &mut rng).await {
                idle = false;
                if client.ack(&id, queue, &item).await == Some(true) {
                    acked += 1;
                }
            } else if client.last_was_unknown() {
                idle = false;
            }
        }
        if idle && queues_empty(cluster, queues).await {
            break;
        }
    }
    if let Some(id) = session {
        client.close_session(&id).await;
    }
    acked
}

/// Whether a linearizable read of each queue shows nothing pending, delayed or claimed.
async fn queues_empty(cluster: &Cluster, queues: &[String]) -> bool {
    for queue in queues {
        let Ok(view) = get_json(cluster, &format!("/v1/queues/{queue}")).await else { return false };
        if ["pending", "delayed", "claimed"].iter().any(|count| view[count].as_u64() != Some(0)) {
            return false;
        }
    }
    true
}

/// A GET from any node that answers 200, or the last error.
async fn get_json(cluster: &Cluster, path: &str) -> anyhow::Result<serde_json::Value> {
    let mut last = anyhow::anyhow!("no node answered {path}");
    for url in cluster.urls() {
        match cluster.http.get(format!("{url}{path}")).timeout(Duration::from_secs(3)).send().await {
            Ok(answer) if answer.status().is_success() => return Ok(answer.json().await?),
            Ok(answer) if answer.status() == 404 => anyhow::bail!("404 {path}"),
            Ok(answer) => last = anyhow::anyhow!("{path}: {}", answer.status()),
            Err(error) => last = error.into(),
        }
    }
    Err(last)
}

/// Every item of `queue` (`None`: the queue does not exist), read linearizably page by page.
async fn read_items(cluster: &Cluster, queue: &str) -> anyhow::Result<Vec<FinalItem>> {
    let mut items = Vec::new();
    let mut after = String::new();
    loop {
        let mut path = format!("/v1/queues/{queue}/items?limit=1000");
        if !after.is_empty() {
            path.push_str(&format!("&after={after}"));
        }
        let page = match get_json(cluster, &path).await {
            Err(error) if error.to_string().starts_with("404") => return Ok(items),
            page => page?,
        };
        for item in page["items"].as_array().into_iter().flatten() {
            items.push(FinalItem {
                id: item["id"].as_str().unwrap_or_default().to_owned(),
                payload: crate::client::payload_text(&item["payload"]),
                state: item["state"].as_str().unwrap_or_default().to_owned(),
            });
        }
        match page["next_after"].as_str() {
            Some(next) => after = next.to_owned(),
            None => return Ok(items),
        }
    }
}

/// The final read of each queue and of its dead-letter queue, retried while no node answers.
async fn final_queue_reads(
    cluster: &Cluster,
    recorder: &Recorder,
    queues: &[String],
) -> anyhow::Result<Vec<QueueFinal>> {
    let mut finals = Vec::new();
    for queue in queues {
        let invoke_ns = recorder.now_ns();
        let mut read = None;
        for _ in 0..FINAL_ATTEMPTS {
            let both = async {
                let items = read_items(cluster, queue).await?;
                let dead = read_items(cluster, &format!("{queue}{DEAD_LETTER_SUFFIX}")).await?;
                anyhow::Ok((items, dead))
            };
            match both.await {
                Ok(found) => {
                    read = Some(found);
                    break;
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
        let (items, dead) = read.with_context(|| format!("final read of queue {queue}"))?;
        finals.push(QueueFinal { queue: queue.clone(), items, dead, drained: true, invoke_ns });
    }
    Ok(finals)
}

/// Size of each node's tmpfs in the full-disk scenario.
const TMPFS_SIZE: &str = "64m";

/// A tmpfs mounted on a node's data dir, unmounted (lazily) when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        let output = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={TMPFS_SIZE}"), "tmpfs"])
            .arg(path)
            .output()
            .context("run mount")?;
        anyhow::ensure!(
            output.status.success(),
            "cannot mount a tmpfs on {} (the full-disk scenario needs root): {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
        Ok(Tmpfs { path: path.to_owned() })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Writes `path` until its file system is full; returns the bytes written.
fn fill(path: &Path) -> anyhow::Result<u64> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    // Bounded by the tmpfs's size; ends at the first ENOSPC.
    while file.write_all(&chunk).is_ok() {
        written += chunk.len() as u64;
    }
    let _ = file.flush();
    Ok(written)
}

/// Suffix of a queue's default dead-letter queue.
const DEAD_LETTER_SUFFIX: &str = ".dead";

/// Injects the scenario's fault, proves it happened, and heals.
async fn inject(
    scenario: &Scenario,
    cluster: &mut Cluster,
    recorder: &Recorder,
    notes: &mut Vec<String>,
    isolations: &mut Vec<Isolation>,
) -> anyhow::Result<()> {
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await?;
    let leader_id = cluster.nodes[leader].id;
    let follower = (leader + 1) % 3;
    let started_ns = recorder.now_ns();
    match scenario.fault {
        Fault::None => tokio::time::sleep(scenario.fault_for).await,
        Fault::IsolateLeader => {
            cluster.isolate(leader);
            let new = elected_other_than(cluster, leader, scenario.fault_for).await?;
            notes.push(format!(
                "node {leader_id} isolated; node {} was elected on the majority side",
                cluster.nodes[new].id
            ));
            tokio::time::sleep(scenario.fault_for).await;
            isolations.push(Isolation { node: leader_id, from_ns: started_ns, until_ns: recorder.now_ns() });
            cluster.heal();
        }
        Fault::SplitMinority => {
            let minority = (leader + 2) % 3;
            cluster.partition(&[vec![leader, follower], vec![minority]]);
            tokio::time::sleep(scenario.fault_for).await;
            let term = |h: Option<serde_json::Value>| h.and_then(|h| h["raft_term"].as_u64());
            notes.push(format!(
                "node {} in the minority (term {:?}); majority leader node {leader_id}",
                cluster.nodes[minority].id,
                term(cluster.health(minority).await)
            ));
            isolations.push(Isolation {
                node: cluster.nodes[minority].id,
                from_ns: started_ns,
                until_ns: recorder.now_ns(),
            });
            cluster.heal();
        }
        Fault::KillLeader => {
            cluster.kill(leader);
            let new = elected_other_than(cluster, leader, Duration::from_secs(10)).await?;
            notes.push(format!("node {leader_id} killed; node {} took over", cluster.nodes[new].id));
            tokio::time::sleep(scenario.fault_for).await;
            cluster.restart(leader, None)?;
        }
        Fault::KillAll => {
            for i in 0..3 {
                cluster.kill(i);
            }
            notes.push("every node killed".into());
            tokio::time::sleep(Duration::from_millis(500)).await;
            for i in 0..3 {
                cluster.restart(i, None)?;
            }
        }
        Fault::PauseLeader => {
            cluster.pause(leader);
            let new = elected_other_than(cluster, leader, Duration::from_secs(10)).await?;
            notes.push(format!("node {leader_id} paused; node {} was elected", cluster.nodes[new].id));
            tokio::time::sleep(scenario.fault_for).await;
            isolations.push(Isolation { node: leader_id, from_ns: started_ns, until_ns: recorder.now_ns() });
            cluster.resume(leader);
        }
        Fault::PauseFollower => {
            cluster.pause(follower);
            notes.push(format!("follower node {} paused", cluster.nodes[follower].id));
            tokio::time::sleep(scenario.fault_for).await;
            cluster.resume(follower);
        }
        Fault::Degrade => {
            cluster.degrade((Duration::from_millis(20), Duration::from_millis(80)), 0.3);
            notes.push("20-80 ms latency and 30% loss on every peer link".into());
            tokio::time::sleep(scenario.fault_for).await;
            cluster.heal();
        }
        Fault::Membership => {
            notes.push(membership_change(cluster, leader).await?);
        }
        Fault::FullDisk => {
            let ballast = cluster.nodes[leader].data_dir.join("ballast");
            let filled = fill(&ballast)?;
            let deadline = Instant::now() + Duration::from_secs(20);
            while !cluster.has_exited(leader) {
                if Instant::now() > deadline {
                    bail!("the fault did not happen: node {leader_id} still runs on a full disk");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let new = elected_other_than(cluster, leader, Duration::from_secs(10)).await?;
            let log = std::fs::read_to_string(&cluster.nodes[leader].log).unwrap_or_default();
            let why = log.lines().find(|line| line.contains("os error 28")).unwrap_or("no ENOSPC in its log");
            notes.push(format!(
                "node {leader_id}'s disk filled ({} MiB of ballast); it exited; node {} took over; {}",
                filled >> 20,
                cluster.nodes[new].id,
                why.trim()
            ));
            tokio::time::sleep(scenario.fault_for).await;
            std::fs::remove_file(&ballast)?;
            cluster.restart(leader, None)?;
        }
        Fault::RollingUpgrade(ref to) => {
            notes.extend(crate::upgrade::rolling_upgrade(cluster, to).await?);
        }
        Fault::SnapshotCatchUp => {
            cluster.isolate(follower);
            let applied =
                |h: Option<serde_json::Value>| h.and_then(|h| h["applied_index"].as_u64()).unwrap_or(0);
            let behind = applied(cluster.health(follower).await);
            let deadline = Instant::now() + scenario.fault_for * 4;
            let mut purged = 0;
            while purged <= behind && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                purged = purged_index(cluster, leader).await;
            }
            if purged <= behind {
                bail!("the leader did not compact past the cut-off follower ({purged} <= {behind})");
            }
            isolations.push(Isolation {
                node: cluster.nodes[follower].id,
                from_ns: started_ns,
                until_ns: recorder.now_ns(),
            });
            cluster.heal();
            let target = applied(cluster.health(leader).await);
            let deadline = Instant::now() + Duration::from_secs(20);
            while applied(cluster.health(follower).await) < target {
                if Instant::now() > deadline {
                    bail!("the follower did not catch up");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            notes.push(format!(
                "follower cut off at index {behind}; leader compacted to {purged}; caught up by snapshot"
            ));
        }
    }
    Ok(())
}

async fn elected_other_than(cluster: &Cluster, old: usize, timeout: Duration) -> anyhow::Result<usize> {
    let deadline = Instant::now() + timeout.max(Duration::from_secs(5));
    while Instant::now() < deadline {
        for i in (0..3).filter(|i| *i != old) {
            if let Some(health) = cluster.health(i).await {
                if health["raft_role"] == "leader" {
                    return Ok(i);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the fault did not happen: no other node was elected")
}

async fn purged_index(cluster: &Cluster, node: usize) -> u64 {
    let url = format!("{}/metrics", cluster.nodes[node].url());
    let Ok(answer) = cluster.http.get(url).timeout(Duration::from_secs(2)).send().await else { return 0 };
    let text = answer.text().await.unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("permit_raft_purged_index "))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

async fn membership_change(cluster: &mut Cluster, leader: usize) -> anyhow::Result<String> {
    // The leader leaves while serving, then rejoins as a learner and is promoted again.
    let leader_id = cluster.nodes[leader].id;
    cluster.admin(leader, "DELETE", &format!("/v1/cluster/members/{leader_id}"), None).await.ok();
    let other = (leader + 1) % 3;
    // The survivors elect a new leader first: until then the view is refused (503), as it is
    // while the removal is still being committed. Retry, bounded in time.
    let mut voters = 0;
    for _ in 0..MEMBERSHIP_ATTEMPTS {
        if let Ok(view) = cluster.admin(other, "GET", "/v1/cluster", None).await {
            voters =
                view["members"].as_array().map_or(0, |m| m.iter().filter(|m| m["role"] == "voter").count());
            if voters == 2 {
                break;
            }
        }
        tokio::time::sleep(MEMBERSHIP_PAUSE).await;
    }
    if voters != 2 {
        bail!("the fault did not happen: {voters} voters after removing node {leader_id}");
    }
    let addr = cluster.proxies[leader].addr.to_string();
    // Add it back (its data dir still holds the old log): it catches up as a learner, then votes.
    cluster.restart(leader, None)?;
    let body = serde_json::json!({ "id": leader_id, "addr": addr });
    // Retry only answers that prove nothing was done.
    let nothing_done = |e: &anyhow::Error| {
        let e = e.to_string();
        e.contains("leader_unreachable") || e.contains("membership_change_in_progress")
    };
    for attempt in 1..=MEMBERSHIP_ATTEMPTS {
        match cluster.admin(other, "POST", "/v1/cluster/members", Some(body.clone())).await {
            Err(e) if nothing_done(&e) && attempt < MEMBERSHIP_ATTEMPTS => {
                tokio::time::sleep(MEMBERSHIP_PAUSE).await
            }
            added => {
                added?;
                break;
            }
        }
    }
    Ok(format!("node {leader_id} (leader) removed while serving, then added back"))
}

/// How often, and how far apart, F8 retries a membership call that the cluster refused.
const MEMBERSHIP_ATTEMPTS: u32 = 100;
const MEMBERSHIP_PAUSE: Duration = Duration::from_millis(100);

/// Runs every checker.
async fn check(
    scenario: &Scenario,
    cluster: &Cluster,
    recorder: &Recorder,
    resource: &Resource,
    capacities: &BTreeMap<String, u64>,
    isolations: &[Isolation],
    notes: &mut Vec<String>,
) -> anyhow::Result<Report> {
    let allowance = ClockAllowance::default();
    let history = recorder.history();
    let mut report = check_well_formed(&history);
    report.merge(check_capacity(&history, capacities, allowance));
    report.merge(check_tokens(&history));
    report.merge(check_fencing(&history));
    for workload in scenario.workloads.iter().filter(|w| w.kind == Kind::FencedCounter) {
        for (name, _) in &workload.semaphores {
            report.merge(check_fenced_counter(&history, name, resource.value(name)));
        }
    }
    let linearizable: BTreeMap<String, u64> = scenario
        .workloads
        .iter()
        .filter(|w| w.kind == Kind::Linearizable)
        .flat_map(|w| w.semaphores.iter().cloned())
        .collect();
    if !linearizable.is_empty() {
        let only: permit_check::History = history
            .ops()
            .iter()
            .filter(|op| linearizable.contains_key(&op.semaphore) || op.semaphore.is_empty())
            .cloned()
            .collect();
        let budget = SearchBudget { steps_max: 50_000_000, time_max: Duration::from_secs(60) };
        report.merge(check_linearizability(&only, &linearizable, budget));
    }
    // Final read for durability, through a fresh client.
    let mut reader = Client::new(9_000, cluster.urls(), 0, Arc::new(Recorder::new()));
    let invoke_ns = recorder.now_ns();
    let mut holders = BTreeMap::new();
    for name in capacities.keys() {
        let mut read = None;
        for _ in 0..FINAL_ATTEMPTS {
            read = reader.describe(name).await;
            if read.is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        holders.insert(name.clone(), read.with_context(|| format!("final read of {name}"))?);
    }
    let read = FinalRead { invoke_ns, complete_ns: recorder.now_ns(), holders };
    report.merge(check_durability(&history, &read, allowance));
    report.merge(check_minority_acks(&history, isolations));
    let queues = scenario.queues();
    if !queues.is_empty() {
        let finals = final_queue_reads(cluster, recorder, &queues).await?;
        let count = |kind: fn(&permit_check::OpKind) -> bool| {
            history.ops().iter().filter(|op| op.is_ok() && kind(&op.kind) && op.item.is_some()).count()
        };
        notes.push(format!(
            "{} pushes, {} claims, {} acks acknowledged; {} items dead-lettered",
            count(|kind| *kind == permit_check::OpKind::Push),
            count(|kind| matches!(kind, permit_check::OpKind::Claim { .. })),
            count(|kind| matches!(kind, permit_check::OpKind::Ack { .. })),
            finals.iter().map(|f| f.dead.len()).sum::<usize>()
        ));
        report.merge(check_queues(&history, &finals, allowance));
    }
    // No permit lost: once every session of the run is gone, a fresh client takes everything.
    let fresh = fresh_acquires(cluster, capacities).await?;
    let within = Duration::from_secs(15).as_nanos() as u64;
    report.merge(check_no_permit_lost(capacities, &fresh, within));
    let digests: Vec<ReplicaDigest> = cluster
        .converged_digests(Duration::from_secs(10))
        .await
        .into_iter()
        .map(|(node, applied_index, digest)| ReplicaDigest {
            node,
            applied_index,
            digest: format!("{digest:016x}"),
        })
        .collect();
    report.merge(check_convergence(&digests));
    let logs: Vec<(String, String)> =
        cluster.logs().into_iter().map(|(id, text)| (format!("node-{id}"), text)).collect();
    report.merge(check_logs(logs.iter().map(|(name, text)| (name.as_str(), text.as_str()))));
    Ok(report)
}

/// Attempts of a final call before the check gives up (250 ms apart).
const FINAL_ATTEMPTS: usize = 40;

async fn fresh_acquires(
    cluster: &Cluster,
    capacities: &BTreeMap<String, u64>,
) -> anyhow::Result<Vec<FreshAcquire>> {
    let mut fresh = Vec::new();
    let mut client = Client::new(9_001, cluster.urls(), 0, Arc::new(Recorder::new()));
    let mut session = None;
    for _ in 0..FINAL_ATTEMPTS {
        session = client.create_session(60_000).await;
        if session.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let session = session.context("fresh session")?;
    for (name, capacity) in capacities {
        let started = Instant::now();
        let mut acquired = 0;
        while started.elapsed() < Duration::from_secs(15) {
            if client.acquire(&session, name, *capacity).await.is_some() {
                acquired = *capacity;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        fresh.push(FreshAcquire {
            semaphore: name.clone(),
            permits_acquired: acquired,
            elapsed_ns: started.elapsed().as_nanos() as u64,
        });
        client.release(&session, name).await;
    }
    Ok(fresh)
}
