//! The `keepalive` part: a 3-node cluster keeps `n` sessions alive on the client's schedule.
//!
//! `clients` tasks, each with one kept-alive connection to the leader, create their share of the
//! `n` sessions (TTL `ttl`) and keep every one alive every `ttl / 3`, as `permit-client` does. A
//! task keeps a min-heap of its sessions by due time; while creating it alternates creations
//! with due keepalives, so that neither starves the other on a saturated machine. Session `i` of task `k` (of `c`) has the phase `(i + k / c) / share` of the period
//! from a common start, so the `n` keepalives of a period are spread evenly over it (phases
//! taken from creation times would bunch them into the population's few seconds). Once every session exists, one more period lets the schedule settle,
//! then the measured window starts: the leader's and followers' counters (`/metrics`) and CPU
//! times (`/proc/PID/stat`) are read at both ends of the window, and the keepalives sent in it
//! are timed. At the end every session must still exist (the leader's `permit_sessions` gauge
//! and its expiry counter).
//!
//! With `batch` > 1 a task renews its sessions `batch` at a time: consecutive sessions form a
//! group, the groups take the phases, and each group is one `POST /v1/sessions/keepalive`. The
//! counts are of sessions renewed; the latency and lateness are of requests.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::cpu::CpuWindow;
use crate::server::ServerProcess;
use crate::stats::Samples;

/// What one keepalive run measured over its window.
pub struct KeepaliveRun {
    /// How long the population took.
    pub populate: Duration,
    /// The measured window's real length.
    pub window: Duration,
    /// Sessions renewed (keepalives answered 200, or renewed within a batch) in the window.
    pub keepalives: u64,
    /// Keepalives answered otherwise (over the whole run); all but 404s were retried.
    pub failed: u64,
    /// Latency of the keepalive requests sent in the window.
    pub latency: Samples,
    /// How late keepalives were sent against their schedule, in the window.
    pub lateness: Samples,
    /// Sessions the leader still has at the end (its `permit_sessions` gauge).
    pub sessions_at_end: u64,
    /// Sessions expired (the leader's `permit_sessions_expired_total`) over the whole run.
    pub expired: u64,
    /// ReadIndex rounds and barrier waits in the window (the leader's counters).
    pub rounds: u64,
    pub barrier_waits: u64,
    /// Peer RPCs the leader sent in the window: (appends with entries, heartbeats incl.
    /// ReadIndex confirmations).
    pub leader_sent: (u64, u64),
    /// Peer RPCs (appends + heartbeats) each follower received in the window.
    pub followers_received: Vec<u64>,
    /// CPU in the window as % of one core: leader, each follower, this load generator.
    pub leader_cpu: f64,
    pub followers_cpu: Vec<f64>,
    pub generator_cpu: f64,
}

/// Shared between the coordinator and the client tasks.
#[derive(Default)]
struct Control {
    /// Tasks done creating their sessions.
    populated: AtomicUsize,
    /// Keepalives in the window are timed and counted while set.
    measuring: AtomicBool,
    /// Tasks return once set.
    stop: AtomicBool,
    /// Keepalives not answered 200 (retried unless 404).
    failed: AtomicU64,
}

/// Pause before a keepalive that failed (not with 404) is retried.
const RETRY_PAUSE: Duration = Duration::from_millis(20);

/// What one client task returns: keepalives in the window, their latencies and lateness.
type TaskResult = (u64, Samples, Samples);

/// The client tasks of a run, driven through population, settling, the window and the end.
struct Load {
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<TaskResult>>>,
    control: Arc<Control>,
    clients: usize,
    period: Duration,
}

impl Load {
    /// Starts `clients` tasks creating `n` sessions at `url` and keeping them alive, `batch`
    /// sessions per request.
    fn start(url: &str, n: usize, ttl: Duration, clients: usize, batch: usize) -> Load {
        let period = ttl / 3;
        let control = Arc::new(Control::default());
        let epoch = Instant::now();
        let tasks = (0..clients)
            .map(|k| {
                let share = n / clients + usize::from(k < n % clients);
                let groups = share.div_ceil(batch);
                let schedule = Schedule { epoch, period, share: groups, shift: k as f64 / clients as f64 };
                tokio::spawn(client_task(url.to_owned(), ttl, share, batch, schedule, control.clone()))
            })
            .collect();
        Load { tasks, control, clients, period }
    }

    /// Waits until every session exists, then one period more (so that every session has been
    /// kept alive once since); returns how long the population took.
    async fn populated(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        // Bounded far above what populating the default steps takes.
        let deadline = started + Duration::from_secs(600);
        while self.control.populated.load(Ordering::SeqCst) < self.clients {
            if Instant::now() > deadline || self.tasks.iter().any(|task| task.is_finished()) {
                self.control.stop.store(true, Ordering::SeqCst);
                for task in self.tasks.drain(..) {
                    task.await??;
                }
                bail!("the sessions were not created within 600 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let populate = started.elapsed();
        tokio::time::sleep(self.period).await;
        Ok(populate)
    }

    /// Times the keepalives of the next `window`; returns its real length.
    async fn measure(&self, window: Duration) -> Duration {
        let started = Instant::now();
        self.control.measuring.store(true, Ordering::SeqCst);
        tokio::time::sleep(window).await;
        self.control.measuring.store(false, Ordering::SeqCst);
        started.elapsed()
    }

    /// Stops the tasks: keepalives in the window, their latencies and lateness, failures.
    async fn finish(self) -> anyhow::Result<(u64, Samples, Samples, u64)> {
        self.control.stop.store(true, Ordering::SeqCst);
        let (mut keepalives, mut latency, mut lateness) = (0, Samples::default(), Samples::default());
        for task in self.tasks {
            let (count, times, late) = task.await??;
            keepalives += count;
            latency.extend(&times);
            lateness.extend(&late);
        }
        Ok((keepalives, latency, lateness, self.control.failed.load(Ordering::SeqCst)))
    }
}

/// The same load against the benchmark's HTTP floor server (axum, same stack, answering
/// `/v1/sessions` and `.../keepalive` at once): its CPU per keepalive is what one HTTP request
/// costs on this machine before any of Permit's work.
pub struct FloorRun {
    /// Keepalives per second answered in the window.
    pub rate: f64,
    /// Latency of those keepalives.
    pub latency: Samples,
    /// The floor server's CPU, % of one core.
    pub server_cpu: f64,
    /// This load generator's CPU, % of one core.
    pub generator_cpu: f64,
}

/// Runs the keepalive load of `n` sessions against a floor server started from `exe`.
pub async fn floor(
    exe: &std::path::Path,
    n: usize,
    ttl: Duration,
    clients: usize,
    batch: usize,
    window: Duration,
) -> anyhow::Result<FloorRun> {
    let mut command = std::process::Command::new(exe);
    command.arg("--floor-server");
    let server = ServerProcess::spawn(command, exe)?;
    let mut load = Load::start(&server.url, n, ttl, clients, batch);
    load.populated().await?;
    let cpu = CpuWindow::start(vec![server.pid().context("floor pid")?.to_string(), "self".into()])?;
    let measured = load.measure(window).await;
    let percent = cpu.percent(measured)?;
    let (keepalives, latency, _, failed) = load.finish().await?;
    anyhow::ensure!(failed == 0, "the floor server failed {failed} keepalives");
    Ok(FloorRun {
        rate: keepalives as f64 / measured.as_secs_f64(),
        latency,
        server_cpu: percent[0],
        generator_cpu: percent[1],
    })
}

/// Starts a 3-node cluster under `dir` and runs the keepalive workload of `n` sessions on it.
pub async fn run(
    bin: &std::path::Path,
    dir: &std::path::Path,
    n: usize,
    ttl: Duration,
    clients: usize,
    batch: usize,
    window: Duration,
) -> anyhow::Result<KeepaliveRun> {
    let nodes = crate::server::cluster(bin, dir, 3).await?;
    let http = crate::api_client();
    let leader = crate::server::leader(&http, &nodes, Duration::from_secs(10)).await?;
    let url = nodes[leader].url.clone();
    let followers: Vec<&ServerProcess> =
        nodes.iter().enumerate().filter(|(i, _)| *i != leader).map(|(_, node)| node).collect();
    let mut load = Load::start(&url, n, ttl, clients, batch);
    let populate = load.populated().await?;

    let mut pids = vec![nodes[leader].pid().context("leader pid")?.to_string()];
    for follower in &followers {
        pids.push(follower.pid().context("follower pid")?.to_string());
    }
    pids.push("self".into());
    let cpu = CpuWindow::start(pids)?;
    let leader_before = Counters::read(&http, &url).await?;
    let mut followers_before = Vec::new();
    for follower in &followers {
        followers_before.push(Counters::read(&http, &follower.url).await?);
    }
    let measured = load.measure(window).await;
    let percent = cpu.percent(measured)?;
    let leader_after = Counters::read(&http, &url).await?;
    let mut followers_received = Vec::new();
    for (follower, before) in followers.iter().zip(&followers_before) {
        let after = Counters::read(&http, &follower.url).await?;
        followers_received.push(after.received - before.received);
    }
    let (keepalives, latency, lateness, failed) = load.finish().await?;
    Ok(KeepaliveRun {
        populate,
        window: measured,
        keepalives,
        failed,
        latency,
        lateness,
        sessions_at_end: leader_after.sessions,
        expired: leader_after.expired,
        rounds: leader_after.rounds - leader_before.rounds,
        barrier_waits: leader_after.waits - leader_before.waits,
        leader_sent: (
            leader_after.sent_append - leader_before.sent_append,
            leader_after.sent_heartbeat - leader_before.sent_heartbeat,
        ),
        followers_received,
        leader_cpu: percent[0],
        followers_cpu: percent[1..3].to_vec(),
        generator_cpu: percent[3],
    })
}

/// When one task's sessions are due.
struct Schedule {
    /// The common start of every task's phases.
    epoch: Instant,
    period: Duration,
    /// Keepalive groups of this task (its sessions, without batching).
    share: usize,
    /// This task's shift within a session's slot, in [0, 1).
    shift: f64,
}

impl Schedule {
    /// The first keepalive of group `index`, complete at `created`: the next instant after it
    /// at its phase, within one period.
    fn first(&self, index: usize, created: Instant) -> Instant {
        let period = self.period.as_nanos();
        let phase =
            (self.period.as_secs_f64() * (index as f64 + self.shift) / self.share as f64 * 1e9) as u128;
        let since = created.saturating_duration_since(self.epoch).as_nanos() % period;
        let wait = (phase + period - since) % period;
        created + Duration::from_nanos(wait as u64)
    }
}

/// One client: creates its `share` sessions, then keeps them alive every period, `batch` per
/// request, until stopped.
async fn client_task(
    url: String,
    ttl: Duration,
    share: usize,
    batch: usize,
    schedule: Schedule,
    control: Arc<Control>,
) -> anyhow::Result<TaskResult> {
    let period = schedule.period;
    let http = reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(30))
        .build()?;
    let ttl_ms = ttl.as_millis() as u64;
    // (due, group): group `g` is the sessions `ids[g * batch..]`, at most `batch` of them.
    let mut due: BinaryHeap<Reverse<(Instant, usize)>> = BinaryHeap::with_capacity(schedule.share);
    let mut ids: Vec<String> = Vec::with_capacity(share);
    let (mut count, mut times, mut late) = (0u64, Samples::default(), Samples::default());
    let mut announced = false;
    // While creating, creations and due keepalives alternate: on a saturated machine, due
    // keepalives alone would starve the population (it then never ends).
    let mut kept_alive_last = false;
    while !control.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let next_due = due.peek().map(|Reverse((at, _))| *at);
        if ids.len() < share && (kept_alive_last || next_due.is_none_or(|at| at > now)) {
            kept_alive_last = false;
            let answer = http
                .post(format!("{url}/v1/sessions"))
                .json(&serde_json::json!({ "ttl_ms": ttl_ms }))
                .send()
                .await?;
            anyhow::ensure!(answer.status().as_u16() == 201, "create session: {}", answer.status());
            let body: serde_json::Value = answer.json().await?;
            ids.push(body["id"].as_str().context("session id")?.to_owned());
            // A group is kept alive once its last session exists.
            if ids.len().is_multiple_of(batch) || ids.len() == share {
                let group = (ids.len() - 1) / batch;
                due.push(Reverse((schedule.first(group, Instant::now()), group)));
            }
            continue;
        }
        if !announced && ids.len() == share {
            control.populated.fetch_add(1, Ordering::SeqCst);
            announced = true;
        }
        let Some(Reverse((at, group))) = due.pop() else {
            // No session in this task (n < clients): idle until stopped.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        if at > now {
            // Short sleeps, so that a stop is seen within 100 ms.
            tokio::time::sleep((at - now).min(Duration::from_millis(100))).await;
            if Instant::now() < at {
                due.push(Reverse((at, group)));
                continue;
            }
        }
        let sent = Instant::now();
        kept_alive_last = true;
        let members = &ids[group * batch..((group + 1) * batch).min(ids.len())];
        let request = if batch == 1 {
            http.post(format!("{url}/v1/sessions/{}/keepalive", members[0]))
        } else {
            http.post(format!("{url}/v1/sessions/keepalive"))
                .json(&serde_json::json!({ "sessions": members }))
        };
        let answer = request.send().await?;
        let status = answer.status().as_u16();
        let body = answer.bytes().await?;
        let renewed = match status {
            200 if batch == 1 => 1,
            200 => renewed_in(&body, members.len())?,
            _ => 0,
        };
        if (status != 200 || renewed < members.len() as u64)
            && control.failed.fetch_add(1, Ordering::Relaxed) < 5
        {
            eprintln!("  keepalive answered {status}: {}", String::from_utf8_lossy(&body));
        }
        if control.measuring.load(Ordering::Relaxed) && status == 200 {
            count += renewed;
            times.push(sent.elapsed());
            late.push(sent.saturating_duration_since(at));
        }
        match status {
            // The next keepalive a period after this one was due: late keepalives catch up.
            // (Sessions a batch reports gone stay in their group, answered gone again.)
            200 => due.push(Reverse((at + period, group))),
            // Gone: counted by the coordinator (the leader's session count); not retried.
            404 => {}
            // No leader, a timeout: retried soon, as `permit-client` does while in jeopardy.
            _ => due.push(Reverse((Instant::now() + RETRY_PAUSE, group))),
        }
    }
    Ok((count, times, late))
}

/// Sessions a batched keepalive's answer reports renewed, checked to hold `sent` results.
fn renewed_in(body: &[u8], sent: usize) -> anyhow::Result<u64> {
    let answer: serde_json::Value = serde_json::from_slice(body).context("batched keepalive answer")?;
    let results = answer["sessions"].as_array().context("batched keepalive answer without sessions")?;
    anyhow::ensure!(results.len() == sent, "{} results for {sent} ids", results.len());
    Ok(results.iter().filter(|result| result.get("ttl_ms").is_some()).count() as u64)
}

/// The counters of one node the part reads.
struct Counters {
    sessions: u64,
    expired: u64,
    rounds: u64,
    waits: u64,
    sent_append: u64,
    sent_heartbeat: u64,
    /// Appends and heartbeats received.
    received: u64,
}

impl Counters {
    async fn read(http: &reqwest::Client, url: &str) -> anyhow::Result<Counters> {
        let body = http.get(format!("{url}/metrics")).send().await?.text().await?;
        let value = |series: &str| -> anyhow::Result<u64> {
            body.lines()
                .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse::<f64>().ok())
                .map(|v| v as u64)
                .with_context(|| format!("{series} not in /metrics"))
        };
        Ok(Counters {
            sessions: value("permit_sessions")?,
            expired: value("permit_sessions_expired_total")?,
            rounds: value("permit_read_index_rounds_total")?,
            waits: value("permit_read_barrier_waits_total")?,
            sent_append: value("permit_peer_rpcs_sent_total{kind=\"append\"}")?,
            sent_heartbeat: value("permit_peer_rpcs_sent_total{kind=\"heartbeat\"}")?,
            received: value("permit_peer_rpcs_received_total{kind=\"append\"}")?
                + value("permit_peer_rpcs_received_total{kind=\"heartbeat\"}")?,
        })
    }
}
