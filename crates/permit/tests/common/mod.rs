//! Test harness: real `permit serve` processes on ephemeral loopback ports, in temp dirs.
#![allow(dead_code)] // Each test file uses a different part of the harness.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Longest a server may take to print its address.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running `permit serve` process, killed (by PID) when dropped.
pub struct Server {
    pub url: String,
    pub addr: String,
    pub data_dir: PathBuf,
    child: Child,
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
        let mut child = Command::new(permit_bin())
            .arg("serve")
            .arg("--listen")
            .arg(listen)
            .arg("--data-dir")
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn permit serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let mut sent = false;
            while let Some(Ok(line)) = lines.next() {
                if !sent {
                    if let Some(addr) = line.strip_prefix("permit listening on http://") {
                        let _ = tx.send(addr.split_whitespace().next().unwrap_or("").to_owned());
                        sent = true;
                    }
                }
            }
        });
        let addr = match rx.recv_timeout(START_TIMEOUT) {
            Ok(addr) => addr,
            Err(_) => {
                let _ = child.kill();
                panic!("permit serve did not print its address within {START_TIMEOUT:?}");
            }
        };
        Server { url: format!("http://{addr}"), addr, data_dir: data_dir.to_owned(), child, _temp: None }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process with SIGKILL and waits for it, keeping the data dir.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Restarts the process on the same address and data dir (after `kill9`).
    pub fn restart(&mut self) {
        self.kill9();
        let temp = self._temp.take();
        let mut next = Server::start_in(&self.data_dir, &self.addr, &[]);
        next._temp = temp;
        std::mem::swap(self, &mut next);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
