//! `permit serve` processes for the benchmark: a single node, or a cluster on loopback.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

/// One server process; killed (by PID) on drop.
pub struct ServerProcess {
    /// Base URL.
    pub url: String,
    /// Listen address.
    pub addr: String,
    /// Data dir.
    pub data_dir: PathBuf,
    args: Vec<String>,
    bin: PathBuf,
    child: Option<Child>,
}

impl ServerProcess {
    /// Starts `bin serve --listen listen --data-dir data_dir args...`.
    pub fn start(
        bin: &Path,
        listen: &str,
        data_dir: &Path,
        args: &[String],
    ) -> anyhow::Result<ServerProcess> {
        let mut command = Command::new(bin);
        command.arg("serve").arg("--listen").arg(listen).arg("--data-dir").arg(data_dir).args(args);
        let mut server = ServerProcess::spawn(command, bin)?;
        server.data_dir = data_dir.to_owned();
        server.args = args.to_vec();
        Ok(server)
    }

    /// Runs `command` and reads the address it prints as its first line.
    pub fn spawn(mut command: Command, bin: &Path) -> anyhow::Result<ServerProcess> {
        let mut child = command
            .env("RUST_LOG", "error")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        let stdout = child.stdout.take().context("stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let line = lines.next().context("no output")??;
        std::thread::spawn(move || for _ in lines {});
        let url = line
            .strip_prefix("permit listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .with_context(|| format!("unexpected first line {line:?}"))?
            .to_owned();
        let addr = url.split_once("://").map_or(url.as_str(), |(_, addr)| addr).to_owned();
        Ok(ServerProcess {
            url,
            addr,
            data_dir: PathBuf::new(),
            args: Vec::new(),
            bin: bin.to_owned(),
            child: Some(child),
        })
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `kill -9`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits until the process has exited (a clean stop); returns how long that
    /// took. Killed with SIGKILL and an error after `timeout`.
    pub fn terminate(&mut self, timeout: Duration) -> anyhow::Result<Duration> {
        let mut child = self.child.take().context("not running")?;
        let started = Instant::now();
        let pid = libc::pid_t::try_from(child.id())?;
        // SAFETY: kill(2) on the PID of a child this process has not yet waited for.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!("SIGTERM to {pid}: {}", std::io::Error::last_os_error());
        }
        loop {
            if let Some(status) = child.try_wait()? {
                anyhow::ensure!(status.success(), "stopped by SIGTERM with {status}");
                return Ok(started.elapsed());
            }
            if started.elapsed() > timeout {
                let _ = child.kill();
                let _ = child.wait();
                bail!("still running {timeout:?} after SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// Restarts on the same address and data dir; returns how long until it printed its address.
    pub fn restart(&mut self) -> anyhow::Result<Duration> {
        self.kill();
        self.start_again()
    }

    /// Starts the stopped process again on the same address, data dir and arguments; returns
    /// how long until it printed its address.
    pub fn start_again(&mut self) -> anyhow::Result<Duration> {
        anyhow::ensure!(self.child.is_none(), "still running");
        let started = Instant::now();
        let next = ServerProcess::start(&self.bin, &self.addr, &self.data_dir, &self.args)?;
        let elapsed = started.elapsed();
        *self = next;
        Ok(elapsed)
    }

    /// Resident memory of the process, in bytes.
    pub fn rss_bytes(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()?)).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The cluster secret shared by the benchmark's cluster nodes.
const CLUSTER_SECRET: &str = "permit-bench-cluster-secret";

/// Starts `size` nodes with `--join` (and a shared cluster secret) and forms a cluster through
/// node 1.
pub async fn cluster(bin: &Path, dir: &Path, size: u64) -> anyhow::Result<Vec<ServerProcess>> {
    let mut nodes = Vec::new();
    std::fs::create_dir_all(dir)?;
    let secret = dir.join("cluster.secret");
    std::fs::write(&secret, CLUSTER_SECRET)?;
    for id in 1..=size {
        let args = vec![
            "--id".to_owned(),
            id.to_string(),
            "--join".to_owned(),
            "--cluster-secret-file".to_owned(),
            secret.display().to_string(),
        ];
        nodes.push(ServerProcess::start(bin, "127.0.0.1:0", &dir.join(format!("n{id}")), &args)?);
    }
    let members: Vec<_> =
        nodes.iter().enumerate().map(|(i, n)| json!({ "id": i + 1, "addr": n.addr })).collect();
    crate::install_crypto_provider();
    let http = reqwest::Client::new();
    let answer = http
        .post(format!("{}/v1/cluster/init", nodes[0].url))
        .json(&json!({ "members": members }))
        .send()
        .await?;
    if !answer.status().is_success() {
        bail!("cluster init failed: {}", answer.text().await?);
    }
    leader(&http, &nodes, Duration::from_secs(10)).await?;
    Ok(nodes)
}

/// Index of the node that leads.
pub async fn leader(
    http: &reqwest::Client,
    nodes: &[ServerProcess],
    timeout: Duration,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        for (i, node) in nodes.iter().enumerate() {
            if node.child.is_none() {
                continue;
            }
            let Ok(answer) =
                http.get(format!("{}/v1/health", node.url)).timeout(Duration::from_millis(300)).send().await
            else {
                continue;
            };
            let Ok(health) = answer.json::<serde_json::Value>().await else { continue };
            if health["raft_role"] == "leader" {
                return Ok(i);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("no leader within {timeout:?}")
}
