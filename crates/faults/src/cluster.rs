//! A cluster of real `permit serve` processes behind fault-injecting proxies.
//!
//! Node `i` listens on `127.0.B.i` (B is a per-cluster block, so parallel scenarios never meet),
//! dials its peers from that address, and is known to its peers by its proxy's address. Clients
//! talk to nodes directly. Each node's stdout and stderr go to `node-i.log` in the output dir.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::proxy::Proxy;

/// The cluster secret every node of a test cluster shares (`--cluster-secret-file`).
pub const CLUSTER_SECRET: &str = "permit-faults-cluster-secret";
/// Name of the secret's file in the cluster's dir.
const CLUSTER_SECRET_FILE: &str = "cluster.secret";

/// Longest a node may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

static NEXT_BLOCK: AtomicU8 = AtomicU8::new(0);

/// How to run a node's clock.
#[derive(Clone, Debug, PartialEq)]
pub enum Clock {
    /// The real clock.
    Real,
    /// libfaketime: wall clock shifted by `offset` (e.g. "+1h"), monotonic clock untouched.
    WallShift(String),
    /// libfaketime: every clock (monotonic too) runs `rate` times as fast.
    Rate(f64),
}

/// Where libfaketime's preload library is: `PERMIT_LIBFAKETIME`, else Debian's and the upstream
/// install's paths. `None` when it is not installed; the clock scenarios then cannot run.
pub fn faketime_library() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("PERMIT_LIBFAKETIME") {
        return Some(PathBuf::from(path)).filter(|p| p.is_file());
    }
    let arch = format!("/usr/lib/{}-linux-gnu/faketime/libfaketime.so.1", std::env::consts::ARCH);
    [arch.as_str(), "/usr/lib/faketime/libfaketime.so.1", "/usr/local/lib/faketime/libfaketime.so.1"]
        .map(PathBuf::from)
        .into_iter()
        .find(|p| p.is_file())
}

/// One node process.
pub struct NodeProcess {
    /// Node id.
    pub id: u64,
    /// Its direct address (clients use it).
    pub addr: SocketAddr,
    /// Its data dir.
    pub data_dir: PathBuf,
    /// Its log file.
    pub log: PathBuf,
    /// Its clock.
    pub clock: Clock,
    /// The `permit` binary it runs.
    pub bin: PathBuf,
    child: Option<Child>,
    paused: bool,
}

/// A cluster under test.
pub struct Cluster {
    /// The nodes, index `i` has id `i + 1`.
    pub nodes: Vec<NodeProcess>,
    /// The proxies, one per node, same order.
    pub proxies: Vec<Proxy>,
    /// Where logs and data go.
    pub dir: PathBuf,
    block: u8,
    extra: Vec<String>,
    env: Vec<(String, String)>,
    /// HTTP client for admin calls.
    pub http: reqwest::Client,
}

fn node_ip(block: u8, id: u64) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 100 + block, id as u8)
}

impl NodeProcess {
    /// The node's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process runs (possibly paused).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    fn signal(&self, signal: libc::c_int) {
        if let Some(pid) = self.pid() {
            // SAFETY: signalling our own child by its PID.
            unsafe { libc::kill(pid as libc::pid_t, signal) };
        }
    }
}

impl Cluster {
    /// Starts `size` nodes running `bin` and forms a cluster: node 1 first, alone, then the others
    /// join as voters, so node 1 leads at the start.
    pub async fn start(
        bin: &Path,
        dir: &Path,
        size: u64,
        clocks: &[(u64, Clock)],
        extra: &[&str],
        env: &[(String, String)],
    ) -> anyhow::Result<Cluster> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join(CLUSTER_SECRET_FILE), CLUSTER_SECRET)?;
        let block = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed) % 100 + (std::process::id() % 50) as u8;
        crate::install_crypto_provider();
        let http = reqwest::Client::builder().no_proxy().build()?;
        let mut cluster = Cluster {
            nodes: Vec::new(),
            proxies: Vec::new(),
            dir: dir.to_owned(),
            block,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            env: env.to_vec(),
            http,
        };
        for id in 1..=size {
            let ip = node_ip(block, id);
            let proxy = Proxy::start(SocketAddr::new(IpAddr::V4(ip), 0)).await?;
            let clock = clocks.iter().find(|(n, _)| *n == id).map_or(Clock::Real, |(_, c)| c.clone());
            let listen = SocketAddr::new(IpAddr::V4(ip), 0);
            let node = cluster.spawn(bin, id, listen, &dir.join(format!("n{id}")), clock)?;
            proxy.set_target(node.addr);
            cluster.nodes.push(node);
            cluster.proxies.push(proxy);
        }
        let first = json!({ "members": [{ "id": 1, "addr": cluster.proxies[0].addr.to_string() }] });
        cluster.admin(0, "POST", "/v1/cluster/init", Some(first)).await?;
        cluster.wait_for_leader(Duration::from_secs(10)).await.context("node 1 leads")?;
        for id in 2..=size {
            let body = json!({ "id": id, "addr": cluster.proxies[id as usize - 1].addr.to_string() });
            cluster.admin(0, "POST", "/v1/cluster/members", Some(body)).await?;
        }
        Ok(cluster)
    }

    fn spawn(
        &self,
        bin: &Path,
        id: u64,
        listen: SocketAddr,
        data_dir: &Path,
        clock: Clock,
    ) -> anyhow::Result<NodeProcess> {
        let log = self.dir.join(format!("node-{id}.log"));
        let mut command = Command::new(bin);
        // libfaketime is preloaded into the node itself, not run through the `faketime` wrapper:
        // the wrapper forks, so the child we would signal (SIGSTOP, kill -9) is the wrapper while
        // the node runs on, and a killed wrapper leaves a named semaphore that makes a later
        // wrapper with the same PID exit with "sem_open: File exists".
        let faked = match &clock {
            Clock::Real => None,
            Clock::WallShift(offset) => Some((offset.clone(), true)),
            Clock::Rate(rate) => Some((format!("+0 x{rate}"), false)),
        };
        if let Some((spec, monotonic_real)) = faked {
            let library =
                faketime_library().context("libfaketime is not installed (apt-get install faketime)")?;
            command.env("LD_PRELOAD", library).env("FAKETIME", spec);
            if monotonic_real {
                command.env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
            }
        }
        command
            .arg("serve")
            .arg("--id")
            .arg(id.to_string())
            .arg("--listen")
            .arg(listen.to_string())
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--join")
            .arg("--cluster-secret-file")
            .arg(self.dir.join(CLUSTER_SECRET_FILE))
            .args(&self.extra)
            .env("RUST_LOG", "warn,openraft=error")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().with_context(|| format!("spawn node {id}"))?;
        let addr = read_address(&mut child, &log)?;
        Ok(NodeProcess {
            id,
            addr,
            data_dir: data_dir.to_owned(),
            log,
            clock,
            bin: bin.to_owned(),
            child: Some(child),
            paused: false,
        })
    }

    /// `kill -9` node `i` (index).
    pub fn kill(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        if node.paused {
            node.signal(libc::SIGCONT);
            node.paused = false;
        }
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A dead process refuses connections; so does its proxy until the node restarts.
        if let Some(proxy) = self.proxies.get(i) {
            proxy.take_down();
        }
    }

    /// Restarts node `i` on its address and data dir (after `kill`), optionally with a new clock.
    pub fn restart(&mut self, i: usize, clock: Option<Clock>) -> anyhow::Result<()> {
        self.kill(i);
        let node = &self.nodes[i];
        let clock = clock.unwrap_or_else(|| node.clock.clone());
        let (id, addr, dir, bin) = (node.id, node.addr, node.data_dir.clone(), node.bin.clone());
        let restarted = self.spawn(&bin, id, addr, &dir, clock)?;
        if let Some(proxy) = self.proxies.get(i) {
            proxy.set_target(restarted.addr);
        }
        self.nodes[i] = restarted;
        Ok(())
    }

    /// Stops node `i` as an operator would (SIGTERM, then SIGKILL after `patience`) and starts it
    /// again on its address and data dir with `bin`: one step of a rolling upgrade.
    pub async fn upgrade(&mut self, i: usize, bin: &Path, patience: Duration) -> anyhow::Result<()> {
        self.nodes[i].signal(libc::SIGTERM);
        let deadline = Instant::now() + patience;
        while Instant::now() < deadline {
            let exited =
                self.nodes[i].child.as_mut().is_none_or(|child| matches!(child.try_wait(), Ok(Some(_))));
            if exited {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.nodes[i].bin = bin.to_owned();
        self.restart(i, None)
    }

    /// Whether node `i`'s process has exited on its own.
    pub fn has_exited(&mut self, i: usize) -> bool {
        self.nodes[i].child.as_mut().is_none_or(|child| matches!(child.try_wait(), Ok(Some(_))))
    }

    /// SIGSTOP node `i`.
    pub fn pause(&mut self, i: usize) {
        self.nodes[i].signal(libc::SIGSTOP);
        self.nodes[i].paused = true;
    }

    /// SIGCONT node `i`.
    pub fn resume(&mut self, i: usize) {
        self.nodes[i].signal(libc::SIGCONT);
        self.nodes[i].paused = false;
    }

    /// Cuts every link between node `i` and the others, both ways.
    pub fn isolate(&self, i: usize) {
        self.partition(&[vec![i], (0..self.nodes.len()).filter(|j| *j != i).collect()]);
    }

    /// Cuts every link between nodes of different groups.
    pub fn partition(&self, groups: &[Vec<usize>]) {
        for (a, group) in groups.iter().enumerate() {
            for &j in group {
                let outsiders: Vec<IpAddr> = groups
                    .iter()
                    .enumerate()
                    .filter(|(b, _)| *b != a)
                    .flat_map(|(_, g)| g.iter().map(|k| IpAddr::V4(node_ip(self.block, *k as u64 + 1))))
                    .collect();
                self.proxies[j].update(|r| r.cut_from = outsiders.into_iter().collect());
            }
        }
    }

    /// Removes every cut, delay and loss.
    pub fn heal(&self) {
        for proxy in &self.proxies {
            proxy.update(|r| *r = Default::default());
        }
    }

    /// Adds latency and loss on every link into every node.
    pub fn degrade(&self, delay: (Duration, Duration), loss: f64) {
        for proxy in &self.proxies {
            proxy.update(|r| {
                r.delay = Some(delay);
                r.loss = loss;
            });
        }
    }

    /// URLs of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(NodeProcess::url).collect()
    }

    /// Calls the admin API on node `i` and returns the JSON answer.
    pub async fn admin(
        &self,
        i: usize,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let method = reqwest::Method::from_bytes(method.as_bytes())?;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.nodes[i].url()))
            .timeout(Duration::from_secs(70));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await?;
        let status = response.status();
        let text = response.text().await?;
        if !status.is_success() {
            bail!("{path}: {status} {text}");
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The health of node `i`, if it answers within 500 ms.
    pub async fn health(&self, i: usize) -> Option<Value> {
        let url = format!("{}/v1/health", self.nodes[i].url());
        let answer = self.http.get(url).timeout(Duration::from_millis(500)).send().await.ok()?;
        answer.json().await.ok()
    }

    /// Index of the node that says it leads, once one does.
    pub async fn wait_for_leader(&self, timeout: Duration) -> anyhow::Result<usize> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            for i in 0..self.nodes.len() {
                if !self.nodes[i].is_running() || self.nodes[i].is_paused() {
                    continue;
                }
                if let Some(health) = self.health(i).await {
                    if health["raft_role"] == "leader" {
                        return Ok(i);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bail!("no leader within {timeout:?}")
    }

    /// `(node, applied_index, digest)` of every running node.
    pub async fn digests(&self) -> Vec<(u64, u64, u64)> {
        let mut digests = Vec::new();
        for node in self.nodes.iter().filter(|n| n.is_running() && !n.is_paused()) {
            let url = format!("{}/v1/debug/digest", node.url());
            let Ok(answer) = self.http.get(url).timeout(Duration::from_secs(2)).send().await else {
                continue;
            };
            let Ok(digest) = answer.json::<Value>().await else { continue };
            digests.push((
                node.id,
                digest["applied_index"].as_u64().unwrap_or(0),
                digest["digest"].as_u64().unwrap_or(0),
            ));
        }
        digests
    }

    /// Waits until every running node applied the same index, then returns their digests.
    pub async fn converged_digests(&self, timeout: Duration) -> Vec<(u64, u64, u64)> {
        let deadline = Instant::now() + timeout;
        loop {
            let digests = self.digests().await;
            let same_index = digests.windows(2).all(|w| w[0].1 == w[1].1);
            if same_index || Instant::now() >= deadline {
                return digests;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The text of every node's log.
    pub fn logs(&self) -> Vec<(u64, String)> {
        self.nodes.iter().map(|n| (n.id, std::fs::read_to_string(&n.log).unwrap_or_default())).collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// Tees the child's stdout and stderr into `log` and returns the address it prints.
fn read_address(child: &mut Child, log: &Path) -> anyhow::Result<SocketAddr> {
    let file = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
    let stdout = child.stdout.take().context("stdout")?;
    let stderr = child.stderr.take().context("stderr")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut out_file = file.try_clone()?;
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("permit listening on http://") {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or_default().to_owned());
            }
            let _ = writeln!(out_file, "{line}");
        }
    });
    let mut err_file = file;
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(err_file, "{line}");
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(addr) => Ok(addr.parse()?),
        Err(e) => {
            // Say why: the node's exit status and the end of its log, once its pipes are drained.
            let deadline = Instant::now() + Duration::from_secs(2);
            let status = loop {
                match child.try_wait() {
                    Ok(Some(status)) => break format!("exited ({status})"),
                    Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                    Ok(None) => {
                        // Every process we spawn ends by its PID, this one too.
                        let _ = child.kill();
                        let _ = child.wait();
                        break "did not exit, so it was killed".to_owned();
                    }
                    Err(e) => break e.to_string(),
                }
            };
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(20)..].join("\n");
            bail!("the node did not print its address ({e}); it {status}; its log ends:\n{tail}")
        }
    }
}
