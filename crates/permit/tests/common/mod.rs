//! Test harness: real `permit serve` processes on ephemeral loopback ports, in temp dirs.
#![allow(dead_code)] // Each test file uses a different part of the harness.

pub mod api;
pub mod require;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster secret of test clusters (`--cluster-secret-file`).
pub const CLUSTER_SECRET: &str = "permit-test-cluster-secret";

/// Writes [`CLUSTER_SECRET`] to `dir/cluster.secret` and returns the file's path.
pub fn write_cluster_secret(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).expect("secret dir");
    let path = dir.join("cluster.secret");
    std::fs::write(&path, CLUSTER_SECRET).expect("write the cluster secret");
    path
}

/// Longest a server may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `permit serve` process, killed (by PID) when dropped.
pub struct Server {
    pub url: String,
    pub addr: String,
    pub data_dir: PathBuf,
    extra: Vec<String>,
    child: Child,
    stopped: bool,
    _temp: Option<tempfile::TempDir>,
}

/// Path of the `permit` binary under test.
pub fn permit_bin() -> &'static str {
    env!("CARGO_BIN_EXE_permit")
}

impl Server {
    /// Starts a single-node server on an ephemeral port with a fresh data dir.
    pub fn start() -> Server {
        let temp = tempfile::tempdir().expect("temp dir");
        let data_dir = temp.path().join("data");
        let mut server = Server::start_in(&data_dir, "127.0.0.1:0", &[]);
        server._temp = Some(temp);
        server
    }

    /// Starts a server on `listen` with its data in `data_dir` and extra arguments.
    pub fn start_in(data_dir: &Path, listen: &str, extra: &[&str]) -> Server {
        Server::start_with_env(data_dir, listen, extra, &[])
    }

    /// Like [`Server::start_in`], with extra environment variables (`LD_PRELOAD`, for instance).
    pub fn start_with_env(data_dir: &Path, listen: &str, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let mut command = Command::new(permit_bin());
        command.arg("serve").arg("--listen").arg(listen).arg("--data-dir").arg(data_dir).args(extra);
        command.envs(env.iter().copied());
        let mut server = Server::spawn(command);
        server.data_dir = data_dir.to_owned();
        server.extra = extra.iter().map(|s| s.to_string()).collect();
        server
    }

    /// Starts `command` (a `permit serve` command line of the caller's), waits for its address
    /// and returns it as a server; `data_dir` is empty, and [`Server::restart`] is not for it.
    pub fn spawn(mut command: Command) -> Server {
        // Tests build their own reqwest clients for the server; rustls needs a process-wide
        // crypto provider before the first one, whichever test runs first.
        permit_client::install_crypto_provider();
        if command.get_envs().all(|(key, _)| key != "RUST_LOG") {
            command.env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn,openraft=off".into()));
        }
        let mut child =
            command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn permit serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut sent = false;
            while let Some(Ok(line)) = lines.next() {
                if !sent {
                    if let Some(url) = line.strip_prefix("permit listening on ") {
                        let _ = tx.send(url.split_whitespace().next().unwrap_or("").to_owned());
                        sent = true;
                    }
                }
            }
        });
        let url = match rx.recv_timeout(START_TIMEOUT) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("permit serve did not print its address within {START_TIMEOUT:?}");
            }
        };
        let addr = url.split_once("://").map_or(url.as_str(), |(_, addr)| addr).to_owned();
        Server { url, addr, data_dir: PathBuf::new(), extra: Vec::new(), child, stopped: false, _temp: None }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the process to exit on its own; its status if it did.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        None
    }

    /// Kills the process with SIGKILL and waits for it, keeping the data dir.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Restarts the process on the same address, data dir and arguments (after `kill9`).
    pub fn restart(&mut self) {
        self.kill9();
        let temp = self._temp.take();
        let extra: Vec<&str> = self.extra.iter().map(String::as_str).collect();
        let mut next = Server::start_in(&self.data_dir, &self.addr, &extra);
        next._temp = temp;
        std::mem::swap(self, &mut next);
    }

    /// Waits up to `timeout` for the process to exit by itself; its status, or None.
    pub fn wait_for_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Stops the process cleanly (SIGTERM) and waits up to `timeout` for it to exit, keeping
    /// the data dir; its exit status, or None ([`Server::restart`] starts it again).
    pub fn terminate(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.signal(libc::SIGTERM);
        self.wait_for_exit(timeout)
    }

    /// Pauses the process (SIGSTOP): it keeps its sockets but answers nothing.
    pub fn pause(&mut self) {
        self.signal(libc::SIGSTOP);
        self.stopped = true;
    }

    /// Resumes a paused process (SIGCONT).
    pub fn resume(&mut self) {
        self.signal(libc::SIGCONT);
        self.stopped = false;
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: sending a signal to our own child by its PID.
        let result = unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
        assert_eq!(result, 0, "kill({}, {signal})", self.child.id());
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.stopped {
            self.signal(libc::SIGCONT);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A semaphore's or an election's view (`GET /v1/semaphores/{name}`, `/v1/elections/{name}`)
/// without what moves with time: the index and the ages (hold age, tenure, time waiting). Two
/// views of the same state compare equal.
pub fn without_ages(mut view: serde_json::Value) -> serde_json::Value {
    view.as_object_mut().expect("a view").remove("index");
    for list in ["holders", "waiters"] {
        for entry in view[list].as_array_mut().into_iter().flatten() {
            entry.as_object_mut().expect("an entry").retain(|key, _| key != "held_ms" && key != "waiting_ms");
        }
    }
    if let Some(leader) = view["leader"].as_object_mut() {
        leader.remove("held_ms");
    }
    view
}

/// Polls `check` every 5 ms until it returns true or `timeout` passes.
pub async fn eventually(timeout: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    false
}

/// A cluster of real `permit serve` processes on ephemeral loopback ports, formed with
/// `--join` and `POST /v1/cluster/init` so that no port has to be chosen in advance.
pub struct Cluster {
    pub nodes: Vec<Server>,
    /// The cluster secret's file, given to every node.
    pub secret_file: PathBuf,
    /// The client the harness talks to the nodes with.
    pub http: reqwest::Client,
    _temp: tempfile::TempDir,
    /// Files the nodes read at every start (the root secret of [`Cluster::start_secured`]).
    _secrets: Option<tempfile::TempDir>,
}

impl Cluster {
    /// Starts `size` nodes (ids 1..=size) and forms a cluster of all of them.
    pub async fn start(size: u64, extra: &[&str]) -> Cluster {
        permit_client::install_crypto_provider();
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        Cluster::start_with(size, extra, http).await
    }

    /// Starts `size` nodes with `--auth`, `root` as their root secret (`--root-token-file`) and
    /// `extra`; the harness talks to them as root (`POST /v1/cluster/init` on a pristine node is
    /// authorised by the root secret it was given).
    pub async fn start_secured(size: u64, root: &str, extra: &[&str]) -> Cluster {
        let secrets = tempfile::tempdir().expect("temp dir");
        let file = secrets.path().join("root.secret");
        std::fs::write(&file, root).expect("write the root secret");
        let file_arg = file.display().to_string();
        let mut args = vec!["--auth", "--root-token-file", file_arg.as_str()];
        args.extend_from_slice(extra);
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::AUTHORIZATION, format!("Bearer {root}").parse().unwrap());
        permit_client::install_crypto_provider();
        let http = reqwest::Client::builder().no_proxy().default_headers(headers).build().unwrap();
        let mut cluster = Cluster::start_with(size, &args, http).await;
        cluster._secrets = Some(secrets);
        cluster
    }

    /// Like [`Cluster::start`], talking to the nodes with `http` (one that trusts their CA, for
    /// nodes serving HTTPS).
    pub async fn start_with(size: u64, extra: &[&str], http: reqwest::Client) -> Cluster {
        let envs = vec![&[] as &[(&str, &str)]; size as usize];
        Cluster::start_with_envs(&envs, extra, http).await
    }

    /// Like [`Cluster::start_with`], one node per entry of `envs`, started with those extra
    /// environment variables (`PERMIT_INJECT_BUG`, for instance).
    pub async fn start_with_envs(envs: &[&[(&str, &str)]], extra: &[&str], http: reqwest::Client) -> Cluster {
        let temp = tempfile::tempdir().expect("temp dir");
        let secret_file = write_cluster_secret(temp.path());
        let secret_arg = secret_file.display().to_string();
        let mut args = vec!["--join", "--cluster-secret-file", secret_arg.as_str()];
        args.extend_from_slice(extra);
        let nodes: Vec<Server> = (1..=envs.len() as u64)
            .zip(envs)
            .map(|(id, env)| {
                let id_arg = id.to_string();
                let mut node_args = vec!["--id", id_arg.as_str()];
                node_args.extend_from_slice(&args);
                Server::start_with_env(&temp.path().join(format!("n{id}")), "127.0.0.1:0", &node_args, env)
            })
            .collect();
        let members: Vec<serde_json::Value> = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| serde_json::json!({ "id": i as u64 + 1, "addr": n.addr }))
            .collect();
        let answer = http
            .post(format!("{}/v1/cluster/init", nodes[0].url))
            .json(&serde_json::json!({ "members": members }))
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .expect("init");
        assert!(answer.status().is_success(), "init: {}", answer.text().await.unwrap_or_default());
        let cluster = Cluster { nodes, secret_file, http, _temp: temp, _secrets: None };
        cluster.leader(Duration::from_secs(10)).await.expect("a leader is elected");
        cluster
    }

    /// Starts one more node with `--join` (not yet a member), returning its index in `nodes`.
    pub fn start_joiner(&mut self, id: u64) -> usize {
        self.start_joiner_with(id, &[])
    }

    /// Like [`Cluster::start_joiner`], with extra arguments (the TLS flags of a TLS cluster).
    pub fn start_joiner_with(&mut self, id: u64, extra: &[&str]) -> usize {
        let id_arg = id.to_string();
        let dir = self._temp.path().join(format!("n{id}"));
        let secret_arg = self.secret_file.display().to_string();
        let mut args = vec!["--id", &id_arg, "--join", "--cluster-secret-file", &secret_arg];
        args.extend_from_slice(extra);
        self.nodes.push(Server::start_in(&dir, "127.0.0.1:0", &args));
        self.nodes.len() - 1
    }

    /// Index in `nodes` of the leader as the reachable nodes report it, once they agree.
    pub async fn leader(&self, timeout: Duration) -> Option<usize> {
        let http = &self.http;
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            for node in self.nodes.iter().filter(|n| !n.stopped) {
                let Ok(answer) = http
                    .get(format!("{}/v1/health", node.url))
                    .timeout(Duration::from_millis(500))
                    .send()
                    .await
                else {
                    continue;
                };
                let Ok(health) = answer.json::<serde_json::Value>().await else { continue };
                if health["raft_role"] == "leader" {
                    let id = health["node_id"].as_u64().unwrap();
                    return self.nodes.iter().position(|n| n.addr == node.addr).filter(|_| id > 0);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// URLs of every node, for clients that fail over between endpoints.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url.clone()).collect()
    }
}

/// A TCP relay in front of a server that counts the connections made through it (a test of
/// how many attempts a command made, whatever the machine's speed).
pub struct Connections {
    pub url: String,
    count: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    relay: tokio::task::JoinHandle<()>,
}

impl Connections {
    pub async fn to(server_addr: &str) -> Connections {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (counted, server_addr) = (count.clone(), server_addr.to_owned());
        let relay = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let server_addr = server_addr.clone();
                tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&server_addr).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Connections { url, count, relay }
    }

    pub fn count(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Connections {
    fn drop(&mut self) {
        self.relay.abort();
    }
}
