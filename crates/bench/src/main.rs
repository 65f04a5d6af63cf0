//! `permit-bench`: measures Permit against the machine's floors in one run and prints one table.
//!
//! ```sh
//! cargo build --release -p permit -p permit-bench
//! target/release/permit-bench            # everything but the 1M-session run
//! target/release/permit-bench --only big # 1M sessions with one hold each
//! target/release/permit-bench --only snap # W1 while 1M sessions are snapshotted
//! target/release/permit-bench --only keepalive # 3 nodes keep 10 k, then 100 k sessions alive
//! target/release/permit-bench --only queue     # Q1, Q2 against Redis streams and beanstalkd
//! target/release/permit-bench --only queue-big # memory per pending item; restart with 1M items
//! target/release/permit-bench --only take      # T1: take throughput against Redis GCRA
//! target/release/permit-bench --only take-accuracy # 60 s at 100/s, burst 10, from 32 clients
//! ```
//! Every figure is a median over `--runs` runs; ratios are to floors measured in the same run.

mod api;
mod auth;
mod beanstalk;
mod cpu;
mod floors;
mod golang;
mod http1;
mod keepalive;
mod python;
mod queues;
mod redis;
mod server;
mod snap;
mod stats;
mod take;
mod tasks;
mod tls;
mod workloads;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use crate::cpu::CpuWindow;
use crate::server::ServerProcess;
use crate::stats::{median, Samples};

/// Benchmark of Permit against the machine's floors.
#[derive(Parser)]
#[command(name = "permit-bench")]
struct Args {
    /// Runs per measurement; medians are reported.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Length of each timed workload run.
    #[arg(long, default_value_t = 3000)]
    duration_ms: u64,
    /// Parts to run: floors,w1,tls,w2,w3,w4,python,go,redis,single,auth,cluster,scale,failover,
    /// queue,take,take-accuracy,big,queue-big,scrape,snap,keepalive,client (default: all but
    /// take-accuracy, big, queue-big, scrape, snap, keepalive and client).
    /// `client` runs the HTTP floor, W1 and W2 through each `--client`, alternating. `tls` runs W1 over HTTPS on a
    /// second node, alternating with plain HTTP runs. `python` runs the Python client's W1/W2
    /// driver (threads and asyncio) in alternation with the Rust driver's W1/W2 runs on the same
    /// server; `go` does the same with the Go client's driver (`clients/go/cmd/permit-bench-go`,
    /// built with `go build`). `redis` runs W1 and W2 against redis-server with appendfsync always, alternating
    /// with Permit runs; `single` runs W1 and W2 on a new single node of this build and of each
    /// `--compare-bin`, alternating. `snap` runs W1 while a node of `--snap-n` sessions snapshots.
    /// `keepalive` starts a 3-node cluster per `--keepalive-n` step and keeps that many sessions
    /// alive on the client's schedule (every TTL / 3) for `--keepalive-ms`. `queue` runs Q1 and
    /// Q2 on a single node, a 3-node cluster, Redis streams (appendfsync always) and beanstalkd
    /// (`-b DIR -f0`), alternating; `queue-big` measures a node's memory per pending 1 KiB item
    /// (`--queue-mem-n`) and its restart with `--queue-restart-n` pending items. `take` runs T1
    /// (32 clients taking from a rate that never binds) on a single node, a 3-node cluster (via
    /// its leader) and Redis' GCRA script (appendfsync always), alternating; `take-accuracy`
    /// has 32 clients take as fast as they can at 100/s, burst 10, for `--accuracy-secs`.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Length of the `take-accuracy` run, in seconds.
    #[arg(long, default_value_t = 60)]
    accuracy_secs: u64,
    /// Sessions (and semaphores) in the small scale step; the large step is 10x.
    #[arg(long, default_value_t = 10_000)]
    scale_n: usize,
    /// Sessions, each with one hold, in the `big` part.
    #[arg(long, default_value_t = 1_000_000)]
    big_n: usize,
    /// Python interpreter for the `python` part (default: the repository's `.ci/venv-python`,
    /// else `python3`); it needs httpx.
    #[arg(long)]
    python: Option<PathBuf>,
    /// Go toolchain for the `go` part (default: `go` on the PATH), which builds the Go client's
    /// driver.
    #[arg(long)]
    go: Option<PathBuf>,
    /// Sessions (each with one hold, over a tenth as many semaphores) in the `scrape` part's steps.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000")]
    scrape_n: Vec<usize>,
    /// A second `permit` binary (e.g. main's) that the `scrape` part measures on the same data,
    /// alternating with `--permit-bin`, and the `keepalive` part runs on a cluster of its own
    /// before this one's: a before/after comparison in one run.
    #[arg(long)]
    before_bin: Option<PathBuf>,
    /// Sessions, each with one hold, in the `snap` part (W1 acquires while the node snapshots
    /// them).
    #[arg(long, default_value_t = 1_000_000)]
    snap_n: usize,
    /// `--snapshot-logs` of the `snap` part's node: a snapshot every this many log entries.
    #[arg(long, default_value_t = 2000)]
    snap_logs: u64,
    /// Length of the `snap` part's W1 run.
    #[arg(long, default_value_t = 15_000)]
    snap_ms: u64,
    /// Sessions in the `keepalive` part's steps (a fresh 3-node cluster each).
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    keepalive_n: Vec<usize>,
    /// The `keepalive` part's session TTL; each session is kept alive every TTL / 3.
    #[arg(long, default_value_t = 10_000)]
    keepalive_ttl_ms: u64,
    /// Length of the `keepalive` part's measured window (3 TTLs or more show sessions surviving
    /// several periods; the default keeps the part short).
    #[arg(long, default_value_t = 30_000)]
    keepalive_ms: u64,
    /// Client tasks (each one connection to the leader) of the `keepalive` part.
    #[arg(long, default_value_t = 256)]
    keepalive_clients: usize,
    /// Sessions per keepalive request in the `keepalive` part: 1 sends one
    /// `POST /v1/sessions/{id}/keepalive` per session; N > 1 renews each task's sessions N at a
    /// time with `POST /v1/sessions/keepalive` (at most 1024).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1024))]
    keepalive_batch: u64,
    /// Pending 1 KiB items whose resident memory the `queue-big` part measures.
    #[arg(long, default_value_t = 100_000)]
    queue_mem_n: usize,
    /// Pending items (32 bytes each) on the node the `queue-big` part restarts.
    #[arg(long, default_value_t = 1_000_000)]
    queue_restart_n: usize,
    /// The `permit` binary (default: next to this one).
    #[arg(long)]
    permit_bin: Option<PathBuf>,
    /// The `single` part also runs these other `permit` binaries (comma-separated; e.g. a build
    /// before a change), alternating with this one: before/after in one run. The
    /// `cluster` part starts a 3-node cluster of each and alternates its runs over all clusters.
    #[arg(long, value_delimiter = ',')]
    compare_bin: Vec<PathBuf>,
    /// The HTTP client of the workloads and the HTTP floor: `thin` (one connection read and
    /// written by the calling task, as thin as the `redis` part's RESP client) or `reqwest`
    /// (what `permit-client` uses; its connection task adds a wake-up each way). The `client` part
    /// measures both, alternating.
    #[arg(long, value_enum, default_value = "thin")]
    client: api::ClientKind,
    /// Run W1-W4 against this running server instead of a fresh one (e.g. to profile it); the
    /// `queue` part then runs Q1 and Q2 against it alone, without the peers.
    #[arg(long)]
    url: Option<String>,
    /// Where data dirs go (default: a temp dir under target/).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Keep the data dirs after the run (their path is printed), e.g. to time restarts by hand.
    #[arg(long)]
    keep_data: bool,
    /// Internal: serve the HTTP floor.
    #[arg(long, hide = true)]
    floor_server: bool,
}

/// One line of the report.
struct Row {
    name: String,
    value: String,
    target: String,
    verdict: &'static str,
}

#[derive(Default)]
struct Report {
    rows: Vec<Row>,
}

impl Report {
    fn add(&mut self, name: &str, value: String, target: Option<(String, bool)>) {
        let (target, verdict) = match target {
            Some((text, true)) => (text, "ok"),
            Some((text, false)) => (text, "MISSED"),
            None => (String::new(), ""),
        };
        println!("  {name:<48} {value:>18}  {target}  {verdict}");
        self.rows.push(Row { name: name.to_owned(), value, target, verdict });
    }

    fn print_markdown(&self) {
        println!("\n| measurement | value | target | |\n|---|---:|---|---|");
        for row in &self.rows {
            println!("| {} | {} | {} | {} |", row.name, row.value, row.target, row.verdict);
        }
    }
}

/// Installs rustls' `ring` crypto provider as the process default unless one is installed:
/// reqwest is built with `rustls-no-provider`, and every client it builds needs one.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// An HTTP client like the benchmark's clients: keep-alive, no proxy, nodelay.
pub fn api_client() -> reqwest::Client {
    install_crypto_provider();
    reqwest::Client::builder().no_proxy().tcp_nodelay(true).build().expect("client builds")
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.floor_server {
        return floors::serve_floor();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

fn wants(args: &Args, part: &str) -> bool {
    if args.only.is_empty() {
        !["take-accuracy", "big", "queue-big", "scrape", "snap", "keepalive", "client"].contains(&part)
    } else {
        args.only.iter().any(|p| p == part)
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let bin = args.permit_bin.clone().unwrap_or_else(|| exe.with_file_name("permit"));
    anyhow::ensure!(
        bin.exists(),
        "{} not found: build it with `cargo build --release -p permit`",
        bin.display()
    );
    if wants(&args, "queue") {
        // Before anything runs: the queue part needs both peers.
        for peer in ["redis-server", "beanstalkd"] {
            let found = std::process::Command::new(peer).arg("-v").output();
            anyhow::ensure!(
                found.is_ok(),
                "the queue part needs {peer}: install it with crates/bench/redis/setup.sh"
            );
        }
    }
    let base = match &args.data_dir {
        Some(dir) => dir.clone(),
        None => exe.parent().and_then(|p| p.parent()).context("target dir")?.join("bench-data"),
    };
    std::fs::create_dir_all(&base)?;
    let work = tempfile::tempdir_in(&base)?;
    let duration = Duration::from_millis(args.duration_ms);
    let mut report = Report::default();
    api::set_client_kind(args.client);
    println!(
        "permit-bench: {} runs of {:?}; binary {}; client {:?}",
        args.runs,
        duration,
        bin.display(),
        args.client
    );

    // Floors.
    let mut floor_command = std::process::Command::new(&exe);
    floor_command.arg("--floor-server");
    let floor = ServerProcess::spawn(floor_command, &exe).context("floor server")?;
    let (mut http_p50, mut http_rate, mut fsync_p50) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.runs {
        let (single, rate) = floors::http_floor(&floor.url, duration).await?;
        http_p50.push(single.p50());
        http_rate.push(rate);
        fsync_p50.push(floors::fsync_floor(work.path(), 500)?.p50());
    }
    drop(floor);
    let (http_p50, http_rate, fsync_p50) = (median(&http_p50), median(&http_rate), median(&fsync_p50));
    println!("floors");
    report.add("HTTP round trip, 1 client, p50", format!("{http_p50:.3} ms"), None);
    report.add("HTTP round trips, 32 clients", format!("{http_rate:.0} /s"), None);
    report.add("fdatasync of a 4 KiB append, p50", format!("{fsync_p50:.3} ms"), None);
    // Issue 12's bound for W2 (capacity 4): a permit changes hands at most once per durable
    // write and round trip, so cycles/s <= 4 / (fsync p50 + HTTP p50).
    let handoff_bound = 4.0 / ((fsync_p50 + http_p50) / 1000.0);

    if wants(&args, "client") {
        client_rows(&mut report, &exe, &bin, work.path(), &args, duration).await?;
    }

    if ["w1", "tls", "w2", "w3", "w4", "python", "go", "redis"].iter().any(|part| wants(&args, part)) {
        let node = match &args.url {
            Some(_) => None,
            None => Some(ServerProcess::start(&bin, "127.0.0.1:0", &work.path().join("single"), &[])?),
        };
        let url = args.url.clone().unwrap_or_else(|| node.as_ref().expect("started").url.clone());
        if wants(&args, "w1") {
            let (mut rate, mut acq50, mut acq99, mut rel50, mut rel99) =
                (vec![], vec![], vec![], vec![], vec![]);
            for run in 0..args.runs {
                let w1 = workloads::uncontended(&url, &format!("w1-{run}"), duration).await?;
                rate.push(w1.cycles_per_second);
                acq50.push(w1.acquire.p50());
                acq99.push(w1.acquire.p99());
                rel50.push(w1.release.p50());
                rel99.push(w1.release.p99());
            }
            println!("W1 uncontended (single node)");
            let target = http_p50 + fsync_p50 + 0.05;
            let a50 = median(&acq50);
            report.add("W1 cycles", format!("{:.0} /s", median(&rate)), None);
            report.add(
                "W1 acquire p50",
                format!("{a50:.3} ms"),
                Some((format!("<= HTTP p50 + fsync p50 + 0.05 = {target:.3} ms"), a50 <= target)),
            );
            report.add("W1 acquire p99", format!("{:.3} ms", median(&acq99)), None);
            report.add("W1 release p50", format!("{:.3} ms", median(&rel50)), None);
            report.add("W1 release p99", format!("{:.3} ms", median(&rel99)), None);
        }
        if wants(&args, "tls") {
            tls_rows(&mut report, &bin, work.path(), &url, &args, duration).await?;
        }
        if wants(&args, "w2") {
            contended_rows(
                &mut report,
                "W2 (single node)",
                std::slice::from_ref(&url),
                &args,
                duration,
                handoff_bound,
                node.as_ref().and_then(ServerProcess::pid),
            )
            .await?;
        }
        if wants(&args, "redis") {
            redis_rows(&mut report, work.path(), &url, &args, duration).await?;
        }
        if wants(&args, "w3") {
            let mut all = Samples::default();
            for run in 0..args.runs {
                all.extend(&workloads::handoff(&url, &format!("w3-{run}"), 200).await?);
            }
            println!("W3 handoff (single node)");
            report.add("W3 handoff p50", format!("{:.3} ms", all.p50()), None);
            let p99 = all.p99();
            report.add("W3 handoff p99", format!("{p99:.3} ms"), Some(("<= 0.2 ms".into(), p99 <= 0.2)));
        }
        if wants(&args, "python") {
            python_rows(&mut report, &url, &args, duration).await?;
        }
        if wants(&args, "go") {
            go_rows(&mut report, work.path(), &url, &args, duration).await?;
        }
        if wants(&args, "w4") {
            let ttl = Duration::from_secs(2);
            let samples = workloads::reclaim(&url, "w4", ttl, args.runs).await?;
            let over = samples.p50() - ttl.as_secs_f64() * 1e3;
            println!("W4 reclaim (single node)");
            report.add(
                "W4 reclaim after TTL 2 s, p50 over the TTL",
                format!("{over:.1} ms"),
                Some(("<= 20 ms".into(), over <= 20.0)),
            );
        }
    }

    if wants(&args, "single") {
        single_rows(&mut report, &bin, work.path(), &args, duration).await?;
    }

    if wants(&args, "auth") {
        let cost = auth::measure(&bin, work.path(), args.runs, duration).await?;
        println!("auth (single node, plain and --auth servers in alternation)");
        let w1_ratio = cost.w1_auth_p50 / cost.w1_plain_p50;
        report.add("W1 acquire p50, no auth", format!("{:.3} ms", cost.w1_plain_p50), None);
        report.add(
            "W1 acquire p50, --auth",
            format!("{:.3} ms ({w1_ratio:.2}x)", cost.w1_auth_p50),
            Some(("<= 1.05x no auth".into(), w1_ratio <= 1.05)),
        );
        report.add("W2 cycles, no auth", format!("{:.0} /s", cost.w2_plain_rate), None);
        report.add(
            "W2 cycles, --auth",
            format!("{:.0} /s ({:.2}x)", cost.w2_auth_rate, cost.w2_auth_rate / cost.w2_plain_rate),
            None,
        );
        let flooded = cost.w1_flooded_p50 / cost.w1_auth_p50;
        report.add(
            "W1 acquire p50 while 32 clients of another token flood sessions",
            format!("{:.3} ms ({flooded:.2}x)", cost.w1_flooded_p50),
            Some(("<= 2x unloaded".into(), flooded <= 2.0)),
        );
        report.add(
            "  flood requests (session creations, then 429s at the cap)",
            format!("{:.0} /s", cost.flood_requests_per_second),
            None,
        );
    }

    if wants(&args, "cluster") || wants(&args, "failover") {
        let mut nodes = server::cluster(&bin, &work.path().join("cluster"), 3).await?;
        if wants(&args, "cluster") {
            let mut others = Vec::new();
            for (i, other) in args.compare_bin.iter().enumerate() {
                let dir = work.path().join(format!("cluster-compare{i}"));
                others.push((other.display().to_string(), server::cluster(other, &dir, 3).await?));
            }
            let mut clusters: Vec<(String, &[ServerProcess])> = vec![(String::new(), &nodes)];
            clusters.extend(others.iter().map(|(label, nodes)| (format!(", {label}"), nodes.as_slice())));
            cluster_rows(&mut report, &clusters, &args, duration, handoff_bound).await?;
        }
        if wants(&args, "failover") {
            let trials = args.runs.max(5);
            let samples = workloads::failover(&mut nodes, trials).await?;
            println!("failover ({trials} trials)");
            let p50 = samples.p50();
            report.add(
                &format!("failover: leader kill -9 to first acquire, p50 of {trials}"),
                format!("{p50:.0} ms"),
                Some(("<= 2000 ms".into(), p50 <= 2000.0)),
            );
            report.add("failover: worst trial", format!("{:.0} ms", samples.quantile_ms(1.0)), None);
        }
    }

    if wants(&args, "queue") {
        queue_rows(&mut report, &bin, work.path(), &args, duration).await?;
    }
    if wants(&args, "take") {
        take_rows(&mut report, &bin, work.path(), &args, duration, http_rate).await?;
    }
    if wants(&args, "take-accuracy") {
        take_accuracy_rows(&mut report, &bin, work.path(), &args).await?;
    }
    if wants(&args, "scale") {
        scale_rows(&mut report, &bin, work.path(), args.scale_n, args.runs).await?;
    }
    if wants(&args, "big") {
        big_rows(&mut report, &bin, work.path(), args.big_n).await?;
    }
    if wants(&args, "queue-big") {
        queue_big_rows(&mut report, &bin, work.path(), &args).await?;
    }
    if wants(&args, "scrape") {
        let mut bins = vec![("after", bin.clone())];
        if let Some(before) = &args.before_bin {
            bins.insert(0, ("before", before.clone()));
        }
        for &n in &args.scrape_n {
            scrape_rows(&mut report, &bins, work.path(), n, args.runs).await?;
        }
    }
    if wants(&args, "snap") {
        snap_rows(&mut report, &bin, work.path(), &args).await?;
    }
    if wants(&args, "keepalive") {
        let mut bins = vec![("after", bin.clone())];
        if let Some(before) = &args.before_bin {
            bins.insert(0, ("before", before.clone()));
        }
        for &n in &args.keepalive_n {
            keepalive_rows(&mut report, &bins, work.path(), n, &args).await?;
        }
    }
    report.print_markdown();
    if args.keep_data {
        println!("data dirs kept in {}", work.keep().display());
    }
    Ok(())
}

/// The Python client's W1 and W2 (threads, asyncio) next to the Rust driver's, runs alternating
/// on the same server so that the ratios compare like with like.
async fn python_rows(report: &mut Report, url: &str, args: &Args, duration: Duration) -> anyhow::Result<()> {
    let driver = match python::Driver::find(args.python.as_deref()) {
        Ok(driver) => driver,
        Err(error) => {
            println!("python: skipped ({error:#})");
            return Ok(());
        }
    };
    let modes = ["threads", "asyncio"];
    let (mut rust_w1, mut rust_w1_rate, mut rust_w2, mut rust_w2_rate) = (vec![], vec![], vec![], vec![]);
    let mut py_w1: Vec<Vec<python::DriverRun>> = vec![vec![], vec![]];
    let mut py_w2: Vec<Vec<python::DriverRun>> = vec![vec![], vec![]];
    for run in 0..args.runs {
        let w1 = workloads::uncontended(url, &format!("pyr-w1-{run}"), duration).await?;
        rust_w1.push(w1.acquire.p50());
        rust_w1_rate.push(w1.cycles_per_second);
        for (i, mode) in modes.iter().enumerate() {
            py_w1[i].push(driver.run(url, "w1", mode, &format!("py-w1-{mode}-{run}"), duration).await?);
        }
        let w2 = workloads::contended(
            std::slice::from_ref(&url.to_owned()),
            &format!("pyr-w2-{run}"),
            32,
            duration,
        )
        .await?;
        rust_w2.push(w2.wait.p50());
        rust_w2_rate.push(w2.cycles_per_second);
        for (i, mode) in modes.iter().enumerate() {
            py_w2[i].push(driver.run(url, "w2", mode, &format!("py-w2-{mode}-{run}"), duration).await?);
        }
    }
    println!("Python client (single node, runs alternating with the Rust driver)");
    let (r1, r1_rate) = (median(&rust_w1), median(&rust_w1_rate));
    report.add("W1 acquire p50, Rust driver (same run)", format!("{r1:.3} ms"), None);
    report.add("W1 cycles, Rust driver (same run)", format!("{r1_rate:.0} /s"), None);
    for (i, mode) in modes.iter().enumerate() {
        let p50 = median(&py_w1[i].iter().map(|r| r.p50_ms).collect::<Vec<_>>());
        let p99 = median(&py_w1[i].iter().map(|r| r.p99_ms).collect::<Vec<_>>());
        let rate = median(&py_w1[i].iter().map(|r| r.cycles_per_second).collect::<Vec<_>>());
        report.add(
            &format!("W1 acquire p50, Python {mode}"),
            format!("{p50:.3} ms ({:.2}x)", p50 / r1),
            None,
        );
        report.add(&format!("W1 acquire p99, Python {mode}"), format!("{p99:.3} ms"), None);
        report.add(
            &format!("W1 cycles, Python {mode}"),
            format!("{rate:.0} /s ({:.2}x)", rate / r1_rate),
            None,
        );
    }
    let (r2, r2_rate) = (median(&rust_w2), median(&rust_w2_rate));
    report.add("W2 cycles, 32 clients, Rust driver (same run)", format!("{r2_rate:.0} /s"), None);
    report.add("W2 wait p50, Rust driver (same run)", format!("{r2:.3} ms"), None);
    for (i, mode) in modes.iter().enumerate() {
        let rate = median(&py_w2[i].iter().map(|r| r.cycles_per_second).collect::<Vec<_>>());
        let p50 = median(&py_w2[i].iter().map(|r| r.p50_ms).collect::<Vec<_>>());
        report.add(
            &format!("W2 cycles, 32 {mode}, Python"),
            format!("{rate:.0} /s ({:.2}x)", rate / r2_rate),
            None,
        );
        report.add(&format!("W2 wait p50, 32 {mode}, Python"), format!("{p50:.3} ms"), None);
    }
    Ok(())
}

/// The Go client's W1 and W2 next to the Rust driver's, runs alternating on the same server so
/// that the ratios compare like with like.
async fn go_rows(
    report: &mut Report,
    work: &std::path::Path,
    url: &str,
    args: &Args,
    duration: Duration,
) -> anyhow::Result<()> {
    let driver = match golang::Driver::build(args.go.as_deref(), work) {
        Ok(driver) => driver,
        Err(error) => {
            println!("go: skipped ({error:#})");
            return Ok(());
        }
    };
    let (mut rust_w1, mut rust_w1_rate, mut rust_w2, mut rust_w2_rate) = (vec![], vec![], vec![], vec![]);
    let (mut go_w1, mut go_w2) = (vec![], vec![]);
    for run in 0..args.runs {
        let w1 = workloads::uncontended(url, &format!("gor-w1-{run}"), duration).await?;
        rust_w1.push(w1.acquire.p50());
        rust_w1_rate.push(w1.cycles_per_second);
        go_w1.push(driver.run(url, "w1", &format!("go-w1-{run}"), duration).await?);
        let w2 = workloads::contended(
            std::slice::from_ref(&url.to_owned()),
            &format!("gor-w2-{run}"),
            32,
            duration,
        )
        .await?;
        rust_w2.push(w2.wait.p50());
        rust_w2_rate.push(w2.cycles_per_second);
        go_w2.push(driver.run(url, "w2", &format!("go-w2-{run}"), duration).await?);
    }
    println!("Go client (single node, runs alternating with the Rust driver)");
    let (r1, r1_rate) = (median(&rust_w1), median(&rust_w1_rate));
    report.add("W1 acquire p50, Rust driver (same run as Go)", format!("{r1:.3} ms"), None);
    report.add("W1 cycles, Rust driver (same run as Go)", format!("{r1_rate:.0} /s"), None);
    let p50 = median(&go_w1.iter().map(|r| r.p50_ms).collect::<Vec<_>>());
    let p99 = median(&go_w1.iter().map(|r| r.p99_ms).collect::<Vec<_>>());
    let rate = median(&go_w1.iter().map(|r| r.cycles_per_second).collect::<Vec<_>>());
    report.add("W1 acquire p50, Go", format!("{p50:.3} ms ({:.2}x)", p50 / r1), None);
    report.add("W1 acquire p99, Go", format!("{p99:.3} ms"), None);
    report.add("W1 cycles, Go", format!("{rate:.0} /s ({:.2}x)", rate / r1_rate), None);
    let (r2, r2_rate) = (median(&rust_w2), median(&rust_w2_rate));
    report.add("W2 cycles, 32 clients, Rust driver (same run as Go)", format!("{r2_rate:.0} /s"), None);
    report.add("W2 wait p50, Rust driver (same run as Go)", format!("{r2:.3} ms"), None);
    let rate = median(&go_w2.iter().map(|r| r.cycles_per_second).collect::<Vec<_>>());
    let p50 = median(&go_w2.iter().map(|r| r.p50_ms).collect::<Vec<_>>());
    report.add("W2 cycles, 32 goroutines, Go", format!("{rate:.0} /s ({:.2}x)", rate / r2_rate), None);
    report.add("W2 wait p50, 32 goroutines, Go", format!("{p50:.3} ms"), None);
    Ok(())
}

/// W1 over HTTPS (a second node with a test certificate) against W1 over plain HTTP, runs
/// alternating so that both see the same machine; the TLS cost on acquire p50.
async fn tls_rows(
    report: &mut Report,
    bin: &std::path::Path,
    work: &std::path::Path,
    plain_url: &str,
    args: &Args,
    duration: Duration,
) -> anyhow::Result<()> {
    let files = tls::TestPki::create(&work.join("tls"))?;
    let node = ServerProcess::start(bin, "127.0.0.1:0", &work.join("single-tls"), &files.serve_args())?;
    let (mut plain, mut secure) = (vec![], vec![]);
    for run in 0..args.runs {
        plain.push(workloads::uncontended(plain_url, &format!("w1p-{run}"), duration).await?.acquire.p50());
        secure.push(workloads::uncontended(&node.url, &format!("w1t-{run}"), duration).await?.acquire.p50());
    }
    let (plain, secure) = (median(&plain), median(&secure));
    let cost = (secure / plain - 1.0) * 100.0;
    println!("W1 over TLS (single node, runs alternating with plain HTTP)");
    report.add("W1 acquire p50, plain HTTP (same run as TLS)", format!("{plain:.3} ms"), None);
    report.add(
        "W1 acquire p50, HTTPS (TLS 1.3, kept-alive connection)",
        format!("{secure:.3} ms ({cost:+.1} %)"),
        Some(("<= plain + 15 %".into(), cost <= 15.0)),
    );
    Ok(())
}

/// W1 and W2 on a new single node of `bin` and of each `--compare-bin`, runs alternating so all
/// see the same machine.
async fn single_rows(
    report: &mut Report,
    bin: &std::path::Path,
    work: &std::path::Path,
    args: &Args,
    duration: Duration,
) -> anyhow::Result<()> {
    let start =
        |bin: &std::path::Path, dir: &str| ServerProcess::start(bin, "127.0.0.1:0", &work.join(dir), &[]);
    let mut nodes = vec![("this build".to_owned(), start(bin, "single-this")?)];
    for (i, other) in args.compare_bin.iter().enumerate() {
        nodes.push((other.display().to_string(), start(other, &format!("single-compare{i}"))?));
    }
    let (mut w1, mut w2) = (vec![vec![]; nodes.len()], vec![vec![]; nodes.len()]);
    for run in 0..args.runs {
        for (i, (_, node)) in nodes.iter().enumerate() {
            let url = node.url.clone();
            w1[i].push(workloads::uncontended(&url, &format!("w1s-{run}"), duration).await?.acquire.p50());
            w2[i].push(
                workloads::contended(&[url], &format!("w2s-{run}"), 32, duration).await?.cycles_per_second,
            );
        }
    }
    println!("single nodes of each build (runs alternating)");
    let (r1, r2) = (median(&w1[0]), median(&w2[0]));
    for (i, (label, _)) in nodes.iter().enumerate() {
        let (a, b) = (median(&w1[i]), median(&w2[i]));
        report.add(
            &format!("W1 acquire p50, {label}"),
            format!("{a:.3} ms ({:.2}x this build)", a / r1),
            None,
        );
        report.add(&format!("W2 cycles, {label}"), format!("{b:.0} /s ({:.2}x this build)", b / r2), None);
    }
    Ok(())
}

/// The benchmark's two HTTP clients (`--client`) against one single node and the floor server,
/// runs alternating: the HTTP floor, W1 and W2 through each, and the ratios thin/reqwest.
async fn client_rows(
    report: &mut Report,
    exe: &std::path::Path,
    bin: &std::path::Path,
    work: &std::path::Path,
    args: &Args,
    duration: Duration,
) -> anyhow::Result<()> {
    let mut floor_command = std::process::Command::new(exe);
    floor_command.arg("--floor-server");
    let floor = ServerProcess::spawn(floor_command, exe).context("floor server")?;
    let node = ServerProcess::start(bin, "127.0.0.1:0", &work.join("client"), &[])?;
    let kinds = [api::ClientKind::Thin, api::ClientKind::Reqwest];
    let mut figures = [[vec![], vec![], vec![]], [vec![], vec![], vec![]]];
    for run in 0..args.runs {
        for (kind, figures) in kinds.iter().zip(figures.iter_mut()) {
            api::set_client_kind(*kind);
            figures[0].push(floors::http_floor(&floor.url, duration).await?.0.p50());
            let name = format!("client-{kind:?}-{run}");
            figures[1].push(workloads::uncontended(&node.url, &name, duration).await?.acquire.p50());
            let urls = [node.url.clone()];
            figures[2].push(workloads::contended(&urls, &name, 32, duration).await?.cycles_per_second);
        }
    }
    api::set_client_kind(args.client);
    println!(
        "The benchmark's HTTP clients, runs alternating (thin: one connection driven by the caller; reqwest)"
    );
    let [thin, reqwest] = figures.map(|figures| figures.map(|values| median(&values)));
    for (i, (what, unit)) in
        [("HTTP floor round trip p50", "ms"), ("W1 acquire p50", "ms"), ("W2 cycles", "/s")]
            .iter()
            .enumerate()
    {
        let digits = if *unit == "ms" { 3 } else { 0 };
        report.add(&format!("{what}, thin client"), format!("{:.digits$} {unit}", thin[i]), None);
        report.add(
            &format!("{what}, reqwest"),
            format!("{:.digits$} {unit} (thin {:.2}x)", reqwest[i], thin[i] / reqwest[i]),
            None,
        );
    }
    Ok(())
}

/// The durable peer: W1 and W2 against Redis (`appendfsync always`, a Lua semaphore, see
/// `redis.rs`), each run alternating with the same workload against Permit's single node, so
/// both see the same machine; ratios Permit/Redis.
async fn redis_rows(
    report: &mut Report,
    work: &std::path::Path,
    permit_url: &str,
    args: &Args,
    duration: Duration,
) -> anyhow::Result<()> {
    let server = redis::RedisProcess::start(&work.join("redis")).await?;
    let (mut p1, mut r1, mut p2, mut r2, mut rcv, mut rmax) = (vec![], vec![], vec![], vec![], vec![], 0);
    for run in 0..args.runs {
        p1.push(workloads::uncontended(permit_url, &format!("w1r-{run}"), duration).await?.acquire.p50());
        r1.push(redis::uncontended(&server.addr, &format!("w1-{run}"), duration).await?.acquire.p50());
        p2.push(
            workloads::contended(&[permit_url.to_owned()], &format!("w2r-{run}"), 32, duration)
                .await?
                .cycles_per_second,
        );
        let w2 = redis::contended(&server.addr, &format!("w2-{run}"), 32, duration).await?;
        r2.push(w2.cycles_per_second);
        rcv.push(w2.fairness_cv);
        rmax = rmax.max(w2.max_holders_seen);
    }
    drop(server);
    let (p1, r1, p2, r2) = (median(&p1), median(&r1), median(&p2), median(&r2));
    println!(
        "Redis 7 peer (appendonly yes, appendfsync always, Lua FIFO semaphore; runs alternating with Permit)"
    );
    report.add("Redis W1 acquire p50", format!("{r1:.3} ms"), None);
    report.add(
        &format!("Permit W1 acquire p50 (same runs, {:?} client)", api::client_kind()),
        format!("{p1:.3} ms ({:.2}x Redis)", p1 / r1),
        Some(("<= 1.0x Redis".into(), p1 <= r1)),
    );
    report.add("Redis W2 cycles, 32 clients, capacity 4", format!("{r2:.0} /s"), None);
    report.add("Redis W2 fairness (CV of cycles per client)", format!("{:.3}", median(&rcv)), None);
    report.add("Redis W2 most holders seen at once", format!("{rmax}"), Some(("<= 4".into(), rmax <= 4)));
    report.add(
        &format!("Permit W2 cycles (same runs, {:?} client)", api::client_kind()),
        format!("{p2:.0} /s ({:.2}x Redis)", p2 / r2),
        Some((">= 1.5x Redis".into(), p2 >= 1.5 * r2)),
    );
    Ok(())
}

/// Q1 and Q2 (`queues.rs`) on a new single node, a new 3-node cluster (through its leader),
/// Redis streams and beanstalkd, runs alternating over the four so that all see the same
/// minutes; ratios Permit/peer, against issue 32's targets.
async fn queue_rows(
    report: &mut Report,
    bin: &std::path::Path,
    work: &std::path::Path,
    args: &Args,
    duration: Duration,
) -> anyhow::Result<()> {
    use queues::Target;
    if let Some(url) = &args.url {
        return queue_rows_at(report, url, args, duration).await;
    }
    let single = ServerProcess::start(bin, "127.0.0.1:0", &work.join("queue-single"), &[])?;
    let nodes = server::cluster(bin, &work.join("queue-cluster"), 3).await?;
    let redis = redis::RedisProcess::start(&work.join("queue-redis")).await?;
    let beanstalk = beanstalk::BeanstalkProcess::start(&work.join("queue-beanstalk")).await?;
    let pids = |pids: &[Option<u32>]| pids.iter().flatten().map(u32::to_string).collect::<Vec<_>>();
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    // The four targets, in this order everywhere below.
    const REDIS: usize = 2;
    const BEANSTALK: usize = 3;
    let labels = ["Permit 1 node", "Permit 3 nodes", "Redis streams", "beanstalkd"];
    let server_pids = [
        pids(&[single.pid()]),
        pids(&nodes.iter().map(ServerProcess::pid).collect::<Vec<_>>()),
        pids(&[redis.pid()]),
        pids(&[beanstalk.pid()]),
    ];
    // Per target, one figure per run.
    let (mut p50, mut p99): ([Vec<f64>; 4], [Vec<f64>; 4]) = Default::default();
    let (mut rate, mut cpu): ([Vec<f64>; 4], [Vec<f64>; 4]) = Default::default();
    for run in 0..args.runs {
        // Through the leader, as clients that follow `permit-leader` do; asked each run.
        let leader = api::Api::new(&urls[0])
            .leader_hint()
            .await?
            .filter(|hint| urls.contains(hint))
            .context("the cluster names no leader among its nodes")?;
        let targets = [
            Target::Permit(single.url.clone()),
            Target::Permit(leader),
            Target::Redis(redis.addr.clone()),
            Target::Beanstalk(beanstalk.addr.clone()),
        ];
        for (i, target) in targets.iter().enumerate() {
            let q1 = queues::q1(target, &format!("q1-{run}"), duration)
                .await
                .with_context(|| format!("Q1 on {}", labels[i]))?;
            p50[i].push(q1.p50());
            p99[i].push(q1.p99());
        }
        for (i, target) in targets.iter().enumerate() {
            let q2 = queues::q2(target, &format!("q2-{run}"), duration, &server_pids[i])
                .await
                .with_context(|| format!("Q2 on {}", labels[i]))?;
            rate[i].push(q2.items_per_second);
            cpu[i].push(q2.cpu_per_item_us);
        }
    }
    drop((single, nodes, redis, beanstalk));
    let [p50, p99, rate, cpu] = [p50, p99, rate, cpu].map(|figures| figures.map(|runs| median(&runs)));
    println!(
        "queues ({} B items; runs alternating: Permit 1 node, 3 nodes via the leader, Redis streams with \
         appendfsync always, beanstalkd -b -f0)",
        queues::PAYLOAD_BYTES
    );
    let versus = |figures: &[f64; 4], i: usize| {
        if i < REDIS {
            let (redis, beanstalk) = (figures[i] / figures[REDIS], figures[i] / figures[BEANSTALK]);
            format!(" ({redis:.2}x Redis, {beanstalk:.2}x beanstalkd)")
        } else {
            String::new()
        }
    };
    for i in [REDIS, BEANSTALK, 0, 1] {
        let target = (i == 0).then(|| ("p50 <= 1.2x Redis streams".to_owned(), p50[0] <= 1.2 * p50[REDIS]));
        report.add(
            &format!("Q1 push to ack p50 / p99, {}", labels[i]),
            format!("{:.3} / {:.3} ms{}", p50[i], p99[i], versus(&p50, i)),
            target,
        );
    }
    for i in [REDIS, BEANSTALK, 0, 1] {
        report.add(
            &format!(
                "Q2 items acked, {} producers, {} consumers, {}",
                queues::Q2_PRODUCERS,
                queues::Q2_CONSUMERS,
                labels[i]
            ),
            format!("{:.0} /s{}; server CPU {:.0} µs per item", rate[i], versus(&rate, i), cpu[i]),
            None,
        );
    }
    report.add(
        "Q2 Permit 1 node against Redis streams",
        format!("{:.2}x", rate[0] / rate[REDIS]),
        Some((">= 1.0x".into(), rate[0] >= rate[REDIS])),
    );
    report.add(
        "Q2 Permit 1 node against beanstalkd",
        format!("{:.2}x", rate[0] / rate[BEANSTALK]),
        Some((">= 1.5x".into(), rate[0] >= 1.5 * rate[BEANSTALK])),
    );
    Ok(())
}

/// T1 (`take.rs`) on a new single node, a new 3-node cluster (through its leader) and Redis'
/// GCRA script with `appendfsync always`, runs alternating over the three; ratios Permit/Redis
/// against issue 33's target, with the run's HTTP floor (`http_rate`, 32 clients) beside them.
/// With `--url`, T1 on that server alone.
async fn take_rows(
    report: &mut Report,
    bin: &std::path::Path,
    work: &std::path::Path,
    args: &Args,
    duration: Duration,
    http_rate: f64,
) -> anyhow::Result<()> {
    use take::Target;
    let clients = take::CLIENTS;
    if let Some(url) = &args.url {
        let (mut rate, mut p50) = (vec![], vec![]);
        // Names unique to this invocation: the server may hold semaphores of earlier ones.
        let tag = std::process::id();
        for run in 0..args.runs {
            let t1 =
                take::throughput(&Target::Permit(url.clone()), &format!("t1-{tag}-{run}"), duration).await?;
            rate.push(t1.per_second);
            p50.push(t1.latency.p50());
        }
        println!("take on {url}");
        report.add(
            &format!("T1 takes, {clients} clients"),
            format!("{:.0} /s, p50 {:.3} ms", median(&rate), median(&p50)),
            None,
        );
        return Ok(());
    }
    let single = ServerProcess::start(bin, "127.0.0.1:0", &work.join("take-single"), &[])?;
    let nodes = server::cluster(bin, &work.join("take-cluster"), 3).await?;
    let redis = redis::RedisProcess::start(&work.join("take-redis")).await?;
    let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
    // The three targets, in this order everywhere below.
    const REDIS: usize = 2;
    let labels = ["Permit 1 node", "Permit 3 nodes", "Redis GCRA"];
    // Per target, one figure per run.
    let (mut rate, mut p50, mut p99) =
        (<[Vec<f64>; 3]>::default(), <[Vec<f64>; 3]>::default(), <[Vec<f64>; 3]>::default());
    for run in 0..args.runs {
        // Through the leader, as clients that follow `permit-leader` do; asked each run.
        let leader = api::Api::new(&urls[0])
            .leader_hint()
            .await?
            .filter(|hint| urls.contains(hint))
            .context("the cluster names no leader among its nodes")?;
        let targets =
            [Target::Permit(single.url.clone()), Target::Permit(leader), Target::Redis(redis.addr.clone())];
        for (i, target) in targets.iter().enumerate() {
            let t1 = take::throughput(target, &format!("t1-{run}"), duration)
                .await
                .with_context(|| format!("T1 on {}", labels[i]))?;
            rate[i].push(t1.per_second);
            p50[i].push(t1.latency.p50());
            p99[i].push(t1.latency.p99());
        }
    }
    drop((single, nodes, redis));
    let [rate, p50, p99] = [rate, p50, p99].map(|figures| figures.map(|runs| median(&runs)));
    println!(
        "take (T1: {clients} clients, a rate that never binds; runs alternating: Permit 1 node, 3 nodes via \
         the leader, Redis appendfsync always running the GCRA script with EVALSHA)"
    );
    for i in [REDIS, 0, 1] {
        let versus =
            if i == REDIS { String::new() } else { format!(" ({:.2}x Redis)", rate[i] / rate[REDIS]) };
        let target = (i == 0).then(|| (">= 0.5x Redis GCRA".to_owned(), rate[0] >= 0.5 * rate[REDIS]));
        report.add(
            &format!("T1 takes, {clients} clients, {}", labels[i]),
            format!("{:.0} /s{versus}; p50 / p99 {:.3} / {:.3} ms", rate[i], p50[i], p99[i]),
            target,
        );
    }
    report.add(
        "T1 HTTP floor of this run, 32 clients",
        format!("{http_rate:.0} /s (Permit 1 node at {:.2}x)", rate[0] / http_rate),
        None,
    );
    Ok(())
}

/// The accuracy of a binding rate (`take.rs`): 32 clients take as fast as they can from a new
/// single node at 100/s, burst 10, for `--accuracy-secs`: grants against `burst + rate × T`
/// (within 1 %), and no grant early in any window.
async fn take_accuracy_rows(
    report: &mut Report,
    bin: &std::path::Path,
    work: &std::path::Path,
    args: &Args,
) -> anyhow::Result<()> {
    anyhow::ensure!(args.accuracy_secs > 0, "--accuracy-secs must be > 0");
    let rate = take::ACCURACY_RATE;
    let node = match &args.url {
        Some(_) => None,
        None => Some(ServerProcess::start(bin, "127.0.0.1:0", &work.join("take-accuracy"), &[])?),
    };
    let url = args.url.clone().unwrap_or_else(|| node.as_ref().expect("started").url.clone());
    let name = format!("accuracy-{}", std::process::id());
    let run = take::accuracy(&url, &name, rate, Duration::from_secs(args.accuracy_secs)).await?;
    drop(node);
    println!(
        "take-accuracy ({} clients as fast as they can, {}/{} ms, burst {}, {} s)",
        take::CLIENTS,
        rate.permits,
        rate.per_ms,
        rate.burst,
        args.accuracy_secs
    );
    let ratio = run.granted as f64 / run.expected;
    report.add(
        "take accuracy: granted against burst + rate x T",
        format!(
            "{} against {:.1} ({ratio:.4}x; T {:.3} s, {} refused)",
            run.granted,
            run.expected,
            run.window.as_secs_f64(),
            run.refused
        ),
        Some(("within 1 %".into(), (ratio - 1.0).abs() <= 0.01)),
    );
    report.add(
        "take accuracy: windows with more grants than the rate allows",
        format!("{} (worst excess {:.2} grants)", run.early, run.worst_excess),
        Some(("none".into(), run.early == 0)),
    );
    Ok(())
}

/// Q1 and Q2 against a running server (`--url`), e.g. to profile it; its CPU is not measured.
async fn queue_rows_at(
    report: &mut Report,
    url: &str,
    args: &Args,
    duration: Duration,
) -> anyhow::Result<()> {
    let target = queues::Target::Permit(url.to_owned());
    let (mut p50, mut p99, mut rate) = (vec![], vec![], vec![]);
    // Names unique to this invocation: the server may hold queues of earlier ones.
    let tag = std::process::id();
    for run in 0..args.runs {
        let q1 = queues::q1(&target, &format!("q1-{tag}-{run}"), duration).await?;
        p50.push(q1.p50());
        p99.push(q1.p99());
        rate.push(queues::q2(&target, &format!("q2-{tag}-{run}"), duration, &[]).await?.items_per_second);
    }
    println!("queues ({} B items) on {url}", queues::PAYLOAD_BYTES);
    report.add("Q1 push to ack p50 / p99", format!("{:.3} / {:.3} ms", median(&p50), median(&p99)), None);
    report.add("Q2 items acked", format!("{:.0} /s", median(&rate)), None);
    Ok(())
}

/// A new single node's resident memory per pending 1 KiB item (`--queue-mem-n` of them, pushed
/// one at a time), also after a restart, and on another node with the items pushed 1000 at a
/// time; then another node's clean stop and restart with `--queue-restart-n` pending items, to
/// `/v1/health` answering 200 and to the first read of the queue.
async fn queue_big_rows(
    report: &mut Report,
    bin: &std::path::Path,
    work: &std::path::Path,
    args: &Args,
) -> anyhow::Result<()> {
    let n = args.queue_mem_n;
    anyhow::ensure!(n > 0 && args.queue_restart_n > 0, "--queue-mem-n and --queue-restart-n must be > 0");
    println!("queue-big ({n} pending 1 KiB items; restart with {} pending items)", args.queue_restart_n);
    // One item per push from 32 producers: small log entries, which snapshots purge as they do
    // in service. 1000 per push: each log entry holds 1000 payloads, and the log store keeps
    // its entries in memory until a purge (none here: too few entries for a snapshot).
    for (per_push, clients) in [(1, 32), (queues::PUSH_ITEMS_MAX, 4)] {
        let dir = work.join(format!("queue-mem-{per_push}"));
        let mut node = ServerProcess::start(bin, "127.0.0.1:0", &dir, &[])?;
        let api = api::Api::new(&node.url);
        queues::put_queue(&api, "mem", Some(n as u64)).await?;
        let empty = node.rss_bytes().context("the node's resident memory")?;
        queues::fill(&node.url, "mem", n, 1024, per_push, clients).await?;
        anyhow::ensure!(queues::pending(&api, "mem").await? == n as u64, "not all {n} items pending");
        let per =
            node.rss_bytes().context("the node's resident memory")?.saturating_sub(empty) as f64 / n as f64;
        if per_push > 1 {
            report.add(&format!("queue: the same, pushed {per_push} per push"), format!("{per:.0} B"), None);
            continue;
        }
        report.add(
            &format!("queue: resident memory per pending 1 KiB item ({n} items, one per push)"),
            format!("{per:.0} B"),
            Some(("<= 2048 B".into(), per <= 2048.0)),
        );
        node.terminate(Duration::from_secs(60))?;
        let started = Instant::now();
        node.start_again()?;
        queues::ready(&node.url, started).await?;
        // A new client: the old one's connection went with the old process.
        anyhow::ensure!(
            queues::pending(&api::Api::new(&node.url), "mem").await? == n as u64,
            "not all {n} items pending after a restart"
        );
        let restarted = node.rss_bytes().context("the node's resident memory")?;
        let per = restarted.saturating_sub(empty) as f64 / n as f64;
        report.add(
            "queue: the same after a restart (over the empty node's)",
            format!("{per:.0} B"),
            Some(("<= 2048 B".into(), per <= 2048.0)),
        );
    }

    let n = args.queue_restart_n;
    let mut node = ServerProcess::start(bin, "127.0.0.1:0", &work.join("queue-restart"), &[])?;
    let api = api::Api::new(&node.url);
    queues::put_queue(&api, "restart", Some(n as u64)).await?;
    let started = Instant::now();
    queues::fill(&node.url, "restart", n, 32, queues::PUSH_ITEMS_MAX, 4).await?;
    let populate = started.elapsed();
    anyhow::ensure!(queues::pending(&api, "restart").await? == n as u64, "not all {n} items pending");
    report.add(
        &format!("queue: push {n} items of 32 B, 1000 per push"),
        format!("{:.1} s ({:.0} items/s)", populate.as_secs_f64(), n as f64 / populate.as_secs_f64()),
        None,
    );
    let stop = node.terminate(Duration::from_secs(120))?;
    report.add(
        &format!("queue: data dir with {n} pending items; SIGTERM to exit"),
        format!(
            "{:.0} MiB; {:.2} s",
            queues::dir_bytes(&node.data_dir) as f64 / (1u64 << 20) as f64,
            stop.as_secs_f64()
        ),
        None,
    );
    let started = Instant::now();
    node.start_again()?;
    let health = queues::ready(&node.url, started).await?.as_secs_f64();
    anyhow::ensure!(
        queues::pending(&api::Api::new(&node.url), "restart").await? == n as u64,
        "not all {n} items pending after a restart"
    );
    let read = started.elapsed().as_secs_f64();
    report.add(
        &format!("queue: restart with {n} pending items to /v1/health 200"),
        format!("{health:.2} s (first read of the queue {read:.2} s)"),
        Some(("<= 3 s".into(), health <= 3.0)),
    );
    Ok(())
}

/// W1 via the leader and via a follower, W2 with the clients spread over the nodes, and W2 with
/// leader-aware clients, on each cluster (this build's first, then each `--compare-bin`'s), runs
/// alternating so that every cluster sees the same minutes; ratios to the first cluster. W1 is
/// placed by role, not by node: which node leads depends on each cluster's first election, and a
/// forwarding hop costs more than anything a build changes. Each W2 run also reports the CPU its
/// three nodes spent per cycle, which other load on the machine disturbs less than a rate.
async fn cluster_rows(
    report: &mut Report,
    clusters: &[(String, &[ServerProcess])],
    args: &Args,
    duration: Duration,
    handoff_bound: f64,
) -> anyhow::Result<()> {
    #[derive(Default, Clone)]
    struct Figures {
        w1_leader_p50: Vec<f64>,
        w1_follower_p50: Vec<f64>,
        spread: Vec<f64>,
        spread_cpu: Vec<f64>,
        wait50: Vec<f64>,
        wait99: Vec<f64>,
        cv: Vec<f64>,
        most: i64,
        leader: Vec<f64>,
        leader_cpu: Vec<f64>,
        /// Per workload (W1 via the leader, via a follower, W2 spread, leader-aware): the share
        /// of the 3 nodes' CPU spent on peer authenticators, for builds that count it.
        mac_share: [Vec<f64>; 4],
    }
    let mut figures = vec![Figures::default(); clusters.len()];
    for run in 0..args.runs {
        for ((_, nodes), f) in clusters.iter().zip(&mut figures) {
            let urls: Vec<String> = nodes.iter().map(|n| n.url.clone()).collect();
            let pids: Vec<String> =
                nodes.iter().filter_map(ServerProcess::pid).map(|pid| pid.to_string()).collect();
            let leader = api::Api::new(&urls[0])
                .leader_hint()
                .await?
                .filter(|hint| urls.contains(hint))
                .context("the cluster names no leader among its nodes")?;
            let follower = urls.iter().find(|url| **url != leader).context("a follower")?;
            let priced = Priced::start(&urls, &pids).await?;
            let w1 = workloads::uncontended(&leader, &format!("cw1l-{run}"), duration).await?;
            f.w1_leader_p50.push(w1.acquire.p50());
            f.mac_share[0].extend(priced.share().await?);
            let priced = Priced::start(&urls, &pids).await?;
            let w1 = workloads::uncontended(follower, &format!("cw1f-{run}"), duration).await?;
            f.w1_follower_p50.push(w1.acquire.p50());
            f.mac_share[1].extend(priced.share().await?);
            // Spread and leader-aware runs take turns going first: the second W2 run of a pair
            // came out faster than the first even when both were spread, so a fixed order would
            // bias their ratio.
            for leader_aware in [run % 2 == 1, run % 2 == 0] {
                let label = if leader_aware { "W23leader" } else { "W23nodes" };
                let name = format!("{label}-{run}");
                let cpu = CpuWindow::start(pids.clone())?;
                let priced = Priced::start(&urls, &pids).await?;
                let started = Instant::now();
                let w2 = workloads::contended_as(&urls, &name, 32, duration, leader_aware).await?;
                let percent: f64 = cpu.percent(started.elapsed())?.iter().sum();
                f.mac_share[if leader_aware { 3 } else { 2 }].extend(priced.share().await?);
                let per_cycle = percent / 100.0 * 1e6 / w2.cycles_per_second;
                if leader_aware {
                    f.leader.push(w2.cycles_per_second);
                    f.leader_cpu.push(per_cycle);
                } else {
                    f.spread.push(w2.cycles_per_second);
                    f.spread_cpu.push(per_cycle);
                    f.wait50.push(w2.wait.p50());
                    f.wait99.push(w2.wait.p99());
                }
                f.cv.push(w2.fairness_cv);
                f.most = f.most.max(w2.max_holders_seen);
            }
        }
    }
    println!("3-node cluster");
    let factor = 0.4;
    let target = factor * handoff_bound;
    let base = median(&figures[0].spread);
    for ((label, _), f) in clusters.iter().zip(&figures) {
        let versus = |value: f64, base: f64| {
            if label.is_empty() {
                String::new()
            } else {
                format!(", {:.2}x this build", value / base)
            }
        };
        for (via, p50, base) in [
            ("the leader", median(&f.w1_leader_p50), median(&figures[0].w1_leader_p50)),
            ("a follower", median(&f.w1_follower_p50), median(&figures[0].w1_follower_p50)),
        ] {
            report.add(
                &format!("W1 (3 nodes, via {via}{label}) acquire p50"),
                format!("{p50:.3} ms{}", versus(p50, base)),
                None,
            );
        }
        let cycles = median(&f.spread);
        report.add(
            &format!("W2 (3 nodes{label}) cycles, 32 clients spread, capacity 4"),
            format!("{cycles:.0} /s ({:.2}x the bound{})", cycles / handoff_bound, versus(cycles, base)),
            Some((format!(">= {factor} x 4 / (fsync p50 + HTTP p50) = {target:.0} /s"), cycles >= target)),
        );
        let (cpu, base_cpu) = (median(&f.spread_cpu), median(&figures[0].spread_cpu));
        report.add(
            &format!("W2 (3 nodes{label}) spread: CPU of the 3 nodes per cycle"),
            format!("{cpu:.0} µs{}", versus(cpu, base_cpu)),
            None,
        );
        report.add(&format!("W2 (3 nodes{label}) wait p50"), format!("{:.3} ms", median(&f.wait50)), None);
        report.add(&format!("W2 (3 nodes{label}) wait p99"), format!("{:.3} ms", median(&f.wait99)), None);
        let leader = median(&f.leader);
        report.add(
            &format!("W2 (3 nodes{label}) cycles, leader-aware clients (permit-leader)"),
            format!(
                "{leader:.0} /s ({:.2}x the bound, {:.2}x spread{})",
                leader / handoff_bound,
                leader / cycles,
                versus(leader, median(&figures[0].leader))
            ),
            None,
        );
        let (cpu, base_cpu) = (median(&f.leader_cpu), median(&figures[0].leader_cpu));
        report.add(
            &format!("W2 (3 nodes{label}) leader-aware: CPU of the 3 nodes per cycle"),
            format!("{cpu:.0} µs{}", versus(cpu, base_cpu)),
            None,
        );
        let workloads = ["W1 via the leader", "W1 via a follower", "W2 spread", "W2 leader-aware"];
        for (workload, shares) in workloads.iter().zip(&f.mac_share).filter(|(_, s)| !s.is_empty()) {
            let share = median(shares);
            report.add(
                &format!("{workload} (3 nodes{label}): peer authenticators' share of the nodes' CPU"),
                format!("{:.2} %", share * 100.0),
                Some(("<= 5 %".into(), share <= 0.05)),
            );
        }
        let cv = median(&f.cv);
        report.add(
            &format!("W2 (3 nodes{label}) fairness (CV of cycles per client)"),
            format!("{cv:.3}"),
            Some(("<= 0.05".into(), cv <= 0.05)),
        );
        report.add(
            &format!("W2 (3 nodes{label}) most holders seen at once"),
            format!("{}", f.most),
            Some(("<= 4".into(), f.most <= 4)),
        );
    }
    Ok(())
}

/// The CPU that a cluster's nodes spend on peer authenticators over a window, against all the
/// CPU they spend: their `permit_peer_mac_seconds_total` (builds before it have none) and their
/// CPU ticks, read at the start and at [`Priced::share`].
struct Priced {
    urls: Vec<String>,
    cpu: CpuWindow,
    started: Instant,
    mac_seconds: Option<f64>,
}

impl Priced {
    async fn start(urls: &[String], pids: &[String]) -> anyhow::Result<Priced> {
        let mac_seconds = mac_seconds(urls).await?;
        Ok(Priced {
            urls: urls.to_vec(),
            cpu: CpuWindow::start(pids.to_vec())?,
            started: Instant::now(),
            mac_seconds,
        })
    }

    /// The authenticators' share of the nodes' CPU since the start (`None` for a build that
    /// does not count them).
    async fn share(self) -> anyhow::Result<Option<f64>> {
        let cpu_seconds: f64 = self.cpu.percent(self.started.elapsed())?.iter().sum::<f64>() / 100.0
            * self.started.elapsed().as_secs_f64();
        let (Some(before), Some(after)) = (self.mac_seconds, mac_seconds(&self.urls).await?) else {
            return Ok(None);
        };
        Ok(Some((after - before) / cpu_seconds))
    }
}

/// The seconds the nodes at `urls` spent on peer authenticators, summed; `None` when a node
/// does not count them.
async fn mac_seconds(urls: &[String]) -> anyhow::Result<Option<f64>> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let mut total = 0.0;
    for url in urls {
        let text = http.get(format!("{url}/metrics")).send().await?.text().await?;
        let value = text.lines().find_map(|line| line.strip_prefix("permit_peer_mac_seconds_total "));
        match value.and_then(|v| v.trim().parse::<f64>().ok()) {
            Some(seconds) => total += seconds,
            None => return Ok(None),
        }
    }
    Ok(Some(total))
}

/// The W2 rows of one node: cycles against 0.7 × `handoff_bound`, waits, fairness, the most
/// holders seen, and the CPU spent by this load generator and (when the bench started it,
/// `server_pid`) the server, per cycle.
async fn contended_rows(
    report: &mut Report,
    label: &str,
    urls: &[String],
    args: &Args,
    duration: Duration,
    handoff_bound: f64,
    server_pid: Option<u32>,
) -> anyhow::Result<()> {
    // The single-node target: 0.7 of the bound.
    let factor = 0.7;
    let (mut rate, mut w50, mut w99, mut cv, mut max) = (vec![], vec![], vec![], vec![], 0);
    // Per run: the server's CPU (% of a core) and µs per cycle, this load generator's CPU (%).
    let (mut server_cpu, mut server_per_cycle, mut generator_cpu) = (vec![], vec![], vec![]);
    for run in 0..args.runs {
        let mut pids = vec!["self".to_owned()];
        pids.extend(server_pid.map(|pid| pid.to_string()));
        let cpu = CpuWindow::start(pids)?;
        let started = Instant::now();
        let w2 = workloads::contended(
            urls,
            &format!("{}-{run}", label.replace([' ', '(', ')'], "")),
            32,
            duration,
        )
        .await?;
        // The window includes the clients' session setup (32 requests), which is noise next to
        // a run's thousands of cycles.
        let percent = cpu.percent(started.elapsed())?;
        generator_cpu.push(percent[0]);
        if let Some(&server) = percent.get(1) {
            server_cpu.push(server);
            server_per_cycle.push(server / 100.0 * 1e6 / w2.cycles_per_second);
        }
        rate.push(w2.cycles_per_second);
        w50.push(w2.wait.p50());
        w99.push(w2.wait.p99());
        cv.push(w2.fairness_cv);
        max = max.max(w2.max_holders_seen);
    }
    println!("{label}");
    let target = factor * handoff_bound;
    let cycles = median(&rate);
    report.add(
        &format!("{label} cycles, 32 clients, capacity 4"),
        format!("{cycles:.0} /s ({:.2}x the bound)", cycles / handoff_bound),
        Some((format!(">= {factor} x 4 / (fsync p50 + HTTP p50) = {target:.0} /s"), cycles >= target)),
    );
    report.add(&format!("{label} wait p50"), format!("{:.3} ms", median(&w50)), None);
    report.add(&format!("{label} wait p99"), format!("{:.3} ms", median(&w99)), None);
    let cv = median(&cv);
    report.add(
        &format!("{label} fairness (CV of cycles per client)"),
        format!("{cv:.3}"),
        Some(("<= 0.05".into(), cv <= 0.05)),
    );
    report.add(
        &format!("{label} most holders seen at once"),
        format!("{max}"),
        Some(("<= 4".into(), max <= 4)),
    );
    let generator = median(&generator_cpu);
    let cpu = if server_cpu.is_empty() {
        format!("load generator {generator:.0} % of a core (the server's is not measured with --url)")
    } else {
        format!(
            "server {:.0} % of a core, {:.0} µs per cycle (2 requests); load generator {generator:.0} %",
            median(&server_cpu),
            median(&server_per_cycle)
        )
    };
    report.add(&format!("{label} CPU"), cpu, None);
    Ok(())
}

async fn scale_rows(
    report: &mut Report,
    bin: &std::path::Path,
    dir: &std::path::Path,
    n: usize,
    runs: usize,
) -> anyhow::Result<()> {
    println!("scale (n = {n} and {})", 10 * n);
    // Both servers are populated first and then measured in alternation, so that the ratio
    // compares latencies from the same minutes (the disk's fsync time drifts between minutes).
    let counts = [n, 10 * n];
    let mut nodes = Vec::new();
    for (step, count) in counts.into_iter().enumerate() {
        let node = ServerProcess::start(bin, "127.0.0.1:0", &dir.join(format!("scale{step}")), &[])?;
        let rss_empty = node.rss_bytes().unwrap_or(0);
        let started = Instant::now();
        workloads::populate(&node.url, "s", count, count, 32).await?;
        let populate = started.elapsed();
        let api = api::Api::new(&node.url);
        let holder = api.session(86_400_000).await?;
        api.semaphore("queue", 1).await?;
        api.acquire("queue", &holder, 1, 0).await?.context("holder")?;
        workloads::queue_waiters(&node.url, "queue", count / 10, 32).await?;
        let rss = node.rss_bytes().unwrap_or(0);
        report.add(
            &format!("scale {count}: populate rate"),
            format!("{:.0} sessions+holds/s", count as f64 / populate.as_secs_f64()),
            None,
        );
        let per = (rss.saturating_sub(rss_empty)) as f64 / (count + count / 10) as f64;
        report.add(
            &format!("scale {count}: resident memory per session with a hold"),
            format!("{per:.0} B"),
            None,
        );
        nodes.push(node);
    }
    let mut p50s = [Vec::new(), Vec::new()];
    for run in 0..runs {
        for (node, p50) in nodes.iter().zip(&mut p50s) {
            let w1 =
                workloads::uncontended(&node.url, &format!("probe-{run}"), Duration::from_secs(3)).await?;
            p50.push(w1.acquire.p50());
        }
    }
    for (count, p50) in counts.iter().zip(&p50s) {
        report.add(
            &format!("scale {count} sessions+holds, {} waiters: acquire p50", count / 10),
            format!("{:.3} ms", median(p50)),
            None,
        );
    }
    let ratio = median(&p50s[1]) / median(&p50s[0]);
    report.add(
        "scale: acquire p50 ratio 10n / n",
        format!("{ratio:.2}"),
        Some(("<= 1.3".into(), ratio <= 1.3)),
    );
    for (count, node) in counts.iter().zip(&mut nodes) {
        let recovery = recover(node).await?;
        report.add(
            &format!("scale {count}: restart to first linearizable read"),
            format!("{:.0} ms", recovery.as_secs_f64() * 1e3),
            None,
        );
    }
    Ok(())
}

async fn big_rows(
    report: &mut Report,
    bin: &std::path::Path,
    dir: &std::path::Path,
    n: usize,
) -> anyhow::Result<()> {
    println!("big ({n} sessions with one hold each)");
    let mut node = ServerProcess::start(bin, "127.0.0.1:0", &dir.join("big"), &[])?;
    let started = Instant::now();
    workloads::populate(&node.url, "b", n, 1000, 64).await?;
    report.add("big: populate", format!("{:.0} s", started.elapsed().as_secs_f64()), None);
    let rss = node.rss_bytes().unwrap_or(0) as f64 / (1u64 << 20) as f64;
    report.add(
        &format!("big: resident memory with {n} sessions+holds"),
        format!("{rss:.0} MiB"),
        Some(("< 1024 MiB".into(), rss < 1024.0)),
    );
    let recovery = recover(&mut node).await?.as_secs_f64();
    report.add(
        "big: restart to first linearizable read",
        format!("{recovery:.2} s"),
        Some(("< 3 s".into(), recovery < 3.0)),
    );
    Ok(())
}

/// Scrape cost and the stall a scrape causes: `n` sessions with one hold each over `n / 10`
/// semaphores, populated once (by the last binary) and then served by each binary in turn from
/// the same data dir. For each: the median and slowest of 20 back-to-back `/metrics` scrapes,
/// and the acquire latency of W1 (p99 and max) alone and while a client scrapes back to back.
async fn scrape_rows(
    report: &mut Report,
    bins: &[(&str, PathBuf)],
    dir: &std::path::Path,
    n: usize,
    runs: usize,
) -> anyhow::Result<()> {
    println!("scrape (n = {n} sessions with a hold, {} semaphores)", (n / 10).max(1));
    let data = dir.join(format!("scrape{n}"));
    {
        let (_, populate_bin) = bins.last().expect("a binary");
        let node = ServerProcess::start(populate_bin, "127.0.0.1:0", &data, &[])?;
        let started = Instant::now();
        workloads::populate(&node.url, "s", n, (n / 10).max(1), 64).await?;
        println!("  populated in {:.0} s", started.elapsed().as_secs_f64());
    }
    let client = api_client();
    for run in 0..runs {
        for (label, bin) in bins {
            let node = ServerProcess::start(bin, "127.0.0.1:0", &data, &[])?;
            // Ready once a linearizable read answers.
            let ready = Instant::now();
            loop {
                let answer = client.get(format!("{}/v1/semaphores/s0", node.url)).send().await;
                if answer.is_ok_and(|a| a.status().is_success()) {
                    break;
                }
                anyhow::ensure!(ready.elapsed() < Duration::from_secs(180), "not ready in 180 s");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut scrapes = Samples::default();
            let mut bytes = 0;
            for _ in 0..20 {
                let t = Instant::now();
                let text = client.get(format!("{}/metrics", node.url)).send().await?.text().await?;
                scrapes.push(t.elapsed());
                bytes = text.len();
            }
            let alone =
                workloads::uncontended(&node.url, &format!("alone-{run}"), Duration::from_secs(3)).await?;
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let scraper = {
                let (url, stop, client) = (node.url.clone(), stop.clone(), client.clone());
                tokio::spawn(async move {
                    let mut count = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _ = client.get(format!("{url}/metrics")).send().await?.bytes().await?;
                        count += 1;
                    }
                    anyhow::Ok(count)
                })
            };
            let during =
                workloads::uncontended(&node.url, &format!("during-{run}"), Duration::from_secs(3)).await?;
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let scraped = scraper.await??;
            let name = format!("scrape {n} ({label}, run {})", run + 1);
            report.add(
                &format!("{name}: /metrics p50 / max"),
                format!("{:.2} / {:.2} ms", scrapes.p50(), scrapes.max()),
                (*label == "after").then(|| ("<= 5 ms".to_owned(), scrapes.p50() <= 5.0)),
            );
            report.add(&format!("{name}: /metrics size"), format!("{} KiB", bytes / 1024), None);
            report.add(
                &format!("{name}: acquire p99 / max alone"),
                format!("{:.2} / {:.2} ms", alone.acquire.p99(), alone.acquire.max()),
                None,
            );
            report.add(
                &format!("{name}: acquire p99 / max while scraping ({scraped} scrapes)"),
                format!("{:.2} / {:.2} ms", during.acquire.p99(), during.acquire.max()),
                None,
            );
        }
    }
    Ok(())
}

async fn snap_rows(
    report: &mut Report,
    bin: &std::path::Path,
    dir: &std::path::Path,
    args: &Args,
) -> anyhow::Result<()> {
    let (n, logs) = (args.snap_n, args.snap_logs);
    println!("snap ({n} sessions with one hold each, a snapshot every {logs} log entries)");
    let node = ServerProcess::start(
        bin,
        "127.0.0.1:0",
        &dir.join("snap"),
        &["--snapshot-logs".into(), logs.to_string()],
    )?;
    let started = Instant::now();
    snap::sessions(&node.url, n, 64).await?;
    report.add("snap: populate", format!("{:.0} s", started.elapsed().as_secs_f64()), None);
    let run = snap::stall(&node.url, Duration::from_millis(args.snap_ms)).await?;
    let mut windows = stats::Samples::default();
    for window in &run.windows {
        windows.push(*window);
    }
    report.add(
        "snap: snapshots taken during the W1 run",
        format!(
            "{} (window p50 {:.0} ms, max {:.0} ms)",
            run.windows.len(),
            windows.p50(),
            windows.quantile_ms(1.0)
        ),
        Some(("> 0".into(), !run.windows.is_empty())),
    );
    report.add("snap: W1 cycles", format!("{:.0} /s", run.cycles_per_second), None);
    for (label, samples) in [("outside snapshots", &run.outside), ("during a snapshot", &run.during)] {
        report.add(
            &format!("snap: W1 acquire {label}, p50 / p99 / max"),
            format!(
                "{:.3} / {:.3} / {:.1} ms (n={})",
                samples.p50(),
                samples.p99(),
                samples.quantile_ms(1.0),
                samples.len()
            ),
            None,
        );
    }
    let p99 = run.during.p99();
    report.add(
        &format!("snap: W1 acquire p99 during a snapshot of {n} sessions"),
        format!("{p99:.3} ms"),
        Some(("<= 10 ms".into(), p99 <= 10.0)),
    );
    Ok(())
}

/// The `keepalive` part's rows for one step of `n` sessions (see `keepalive.rs`): each binary
/// (`--before-bin`, then this one) on a fresh cluster, then the same load on the HTTP floor.
async fn keepalive_rows(
    report: &mut Report,
    bins: &[(&str, PathBuf)],
    dir: &std::path::Path,
    n: usize,
    args: &Args,
) -> anyhow::Result<()> {
    let ttl = Duration::from_millis(args.keepalive_ttl_ms);
    let window = Duration::from_millis(args.keepalive_ms);
    let clients = args.keepalive_clients;
    let batch = args.keepalive_batch as usize;
    println!(
        "keepalive ({n} sessions, TTL {ttl:?}, each kept alive every {:?} by {clients} clients, {batch} \
         per request; 3 nodes; window {window:?}; the load generator shares the machine's 2 cores with the 3 nodes)",
        ttl / 3
    );
    let scheduled = n as f64 / (ttl / 3).as_secs_f64();
    for (tag, bin) in bins {
        let dir = dir.join(format!("keepalive{n}-{tag}"));
        let run = keepalive::run(bin, &dir, n, ttl, clients, batch, window).await?;
        let secs = run.window.as_secs_f64();
        let label = |what: &str| {
            if bins.len() > 1 {
                format!("keepalive {n} ({tag}): {what}")
            } else {
                format!("keepalive {n}: {what}")
            }
        };
        report.add(&label("populate"), format!("{:.1} s", run.populate.as_secs_f64()), None);
        let rate = run.keepalives as f64 / secs;
        report.add(
            &label("keepalives answered"),
            format!("{rate:.0} /s ({:.2}x schedule)", rate / scheduled),
            Some((format!("schedule {scheduled:.0} /s"), rate >= 0.95 * scheduled)),
        );
        let requests = run.latency.len() as f64 / secs;
        report.add(
            &label("keepalive requests"),
            format!("{requests:.0} /s ({:.1} sessions each)", rate / requests.max(f64::MIN_POSITIVE)),
            None,
        );
        report.add(
            &label("keepalive request latency p50 / p99"),
            format!("{:.2} / {:.2} ms", run.latency.p50(), run.latency.p99()),
            None,
        );
        report.add(
            &label("sent behind schedule p50 / p99"),
            format!("{:.1} / {:.1} ms", run.lateness.p50(), run.lateness.p99()),
            None,
        );
        let lost = (n as u64).saturating_sub(run.sessions_at_end);
        report.add(
            &label("sessions lost (expired / missing at end)"),
            format!("{} / {lost}", run.expired),
            Some(("0".into(), run.expired == 0 && lost == 0)),
        );
        report.add(
            &label("keepalives failed and retried (no leader, timeouts)"),
            format!("{}", run.failed),
            None,
        );
        let per_round = run.barrier_waits as f64 / run.rounds.max(1) as f64;
        report.add(
            &label("quorum rounds"),
            format!("{:.0} /s ({per_round:.1} keepalives+reads per round)", run.rounds as f64 / secs),
            None,
        );
        let (appends, heartbeats) = run.leader_sent;
        report.add(
            &label("peer RPCs sent by the leader"),
            format!(
                "{:.0} /s ({:.0} heartbeats, {:.0} appends; {:.2} per round)",
                (appends + heartbeats) as f64 / secs,
                heartbeats as f64 / secs,
                appends as f64 / secs,
                (appends + heartbeats) as f64 / run.rounds.max(1) as f64
            ),
            None,
        );
        let received: Vec<String> =
            run.followers_received.iter().map(|r| format!("{:.0}", *r as f64 / secs)).collect();
        report.add(&label("peer RPCs received per follower"), format!("{} /s", received.join(" / ")), None);
        report.add(
            &label("leader CPU"),
            format!(
                "{:.0} % of a core ({:.1} µs per session kept alive, {:.1} µs per request)",
                run.leader_cpu,
                run.leader_cpu / 100.0 / rate * 1e6,
                run.leader_cpu / 100.0 / requests * 1e6
            ),
            Some(("< 25 %".into(), run.leader_cpu < 25.0)),
        );
        let followers: Vec<String> = run.followers_cpu.iter().map(|c| format!("{c:.0} %")).collect();
        report.add(&label("followers' CPU"), followers.join(" / "), None);
        report.add(&label("load generator CPU (same 2 cores)"), format!("{:.0} %", run.generator_cpu), None);
    }
    let floor = keepalive::floor(&std::env::current_exe()?, n, ttl, clients, batch, window).await?;
    report.add(
        &format!("keepalive {n}: HTTP floor server (same load, answers at once): CPU"),
        format!(
            "{:.0} % of a core at {:.0} /s ({:.1} µs per keepalive; p50 {:.2} ms; load generator {:.0} %)",
            floor.server_cpu,
            floor.rate,
            floor.server_cpu / 100.0 / floor.rate * 1e6,
            floor.latency.p50(),
            floor.generator_cpu
        ),
        None,
    );
    Ok(())
}

/// `kill -9`, restart, and time until a linearizable read succeeds.
async fn recover(node: &mut ServerProcess) -> anyhow::Result<Duration> {
    let started = Instant::now();
    node.restart()?;
    let client = api_client();
    loop {
        let answer = client.get(format!("{}/v1/semaphores/queue", node.url)).send().await;
        if answer.is_ok_and(|a| a.status().as_u16() != 503) {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < Duration::from_secs(120), "no recovery in 120 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
