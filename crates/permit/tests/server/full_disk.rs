//! A full disk: the node refuses work (health 503 `storage_error` of kind `disk_full`, with
//! `Retry-After`), exits non-zero, and a restart on a roomy copy of its data dir recovers every
//! acknowledged write.
//!
//! The data dir is on a small tmpfs that the test mounts (it needs root); where `mount` fails
//! the test prints why and passes without running, unless `PERMIT_REQUIRE_TMPFS=1` (CI).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::require::{or_skip, Need};
use crate::common::Server;
use crate::Api;

/// Size of the tmpfs holding the data dir.
const TMPFS_SIZE: &str = "16m";
/// Free space left on it once the server runs, so that the disk fills after a few thousand writes.
const FREE_BYTES: u64 = 256 * 1024;
/// Concurrent writers.
const WORKERS: usize = 8;
/// Longest the writers may take to fill the disk.
const FILL_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest a failed node may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A tmpfs mounted for the test, unmounted (lazily) when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path) -> Result<Tmpfs, String> {
        std::fs::create_dir_all(path).map_err(|e| e.to_string())?;
        let size = format!("size={TMPFS_SIZE}");
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(path)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !output.status.success() {
            return Err(format!("cannot mount a tmpfs: {}", String::from_utf8_lossy(&output.stderr).trim()));
        }
        Ok(Tmpfs { path: path.to_owned() })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Fills the file system of `dir` with a ballast file, then frees `FREE_BYTES` of it.
fn leave_free(dir: &Path) {
    let path = dir.join("ballast");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while file.write_all(&chunk).is_ok() {}
    let _ = file.flush();
    let len = file.metadata().unwrap().len();
    file.set_len(len.saturating_sub(FREE_BYTES)).unwrap();
}

/// Writes acknowledged by the server: sessions, and grants as (semaphore, session, token).
#[derive(Default)]
pub(crate) struct Acked {
    pub(crate) sessions: Vec<String>,
    pub(crate) grants: Vec<(String, String, u64)>,
}

/// Creates sessions and takes a capacity-1 semaphore with each, until a write is refused.
pub(crate) async fn writer(url: String, worker: usize, acked: Arc<Mutex<Acked>>, deadline: Instant) {
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let name_of_session = "x".repeat(200);
    for i in 0.. {
        if Instant::now() > deadline {
            return;
        }
        let body = json!({ "ttl_ms": 86_400_000, "name": name_of_session });
        let Some((201, created)) = post(&http, &format!("{url}/v1/sessions"), body).await else { return };
        let session = created["id"].as_str().unwrap().to_owned();
        acked.lock().unwrap().sessions.push(session.clone());
        let name = format!("disk-{worker}-{i}");
        let acquire = format!("{url}/v1/semaphores/{name}/acquire");
        let Some((200, granted)) = post(&http, &acquire, json!({ "session": session, "capacity": 1 })).await
        else {
            return;
        };
        let token = granted["token"].as_u64().unwrap();
        acked.lock().unwrap().grants.push((name, session, token));
    }
}

/// POSTs `body`; the status and JSON body, or `None` when the server did not answer.
async fn post(http: &reqwest::Client, url: &str, body: Value) -> Option<(u16, Value)> {
    let response = http.post(url).json(&body).timeout(Duration::from_secs(20)).send().await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.json().await.unwrap_or(Value::Null)))
}

/// What the health monitor saw: the first 503 `storage_error` answer, with its `Retry-After`.
#[derive(Default, Debug)]
pub(crate) struct Seen {
    pub(crate) storage_error: Option<(Value, Option<String>)>,
    pub(crate) live_503: bool,
}

/// Polls readiness and liveness until `stop`, recording the first `storage_error` answer.
pub(crate) async fn monitor(url: String, seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) {
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    while !stop.load(Ordering::Relaxed) {
        let ready = http.get(format!("{url}/v1/health")).timeout(Duration::from_secs(1)).send().await;
        if let Ok(answer) = ready {
            let retry_after =
                answer.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
            let status = answer.status().as_u16();
            let body: Value = answer.json().await.unwrap_or(Value::Null);
            if status == 503 && body["reason"] == "storage_error" {
                seen.lock().unwrap().storage_error.get_or_insert((body, retry_after));
                let live = http.get(format!("{url}/v1/health/live")).send().await;
                if live.is_ok_and(|l| l.status().as_u16() == 503) {
                    seen.lock().unwrap().live_503 = true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[tokio::test]
async fn a_full_disk_stops_the_node_and_a_restart_recovers_every_acknowledged_write() {
    let temp = tempfile::tempdir().unwrap();
    let mount_point = temp.path().join("small");
    let Some(tmpfs) = or_skip(Need::Tmpfs, Tmpfs::mount(&mount_point)) else { return };
    let data_dir = tmpfs.path.join("data");
    let mut server = Server::start_in(&data_dir, "127.0.0.1:0", &[]);
    leave_free(&tmpfs.path);

    let (status, seen, acked) = write_until_it_stops(&mut server, WORKERS, FILL_TIMEOUT).await;
    let status = status.expect("the node exits after the disk filled");
    assert!(!status.success(), "a failed node exits non-zero: {status}");
    let (body, retry_after) = seen.storage_error.expect("health answered 503 storage_error before the exit");
    // The first write to fail is a log append, or a snapshot write if one was due.
    let detail = body["detail"].as_str().unwrap();
    let names_the_file = detail.contains(data_dir.to_str().unwrap());
    assert!(names_the_file && detail.contains("os error 28"), "the detail names the file and ENOSPC: {body}");
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["error"]["kind"], "disk_full", "health names the failure's kind: {body}");
    assert_eq!(body["error"]["message"], body["detail"], "{body}");
    assert!(retry_after.is_some_and(|s| s.parse::<u64>().is_ok()), "503 carries Retry-After");
    assert!(seen.live_503, "liveness fails too once storage failed");

    // Restart on a roomy copy (as an operator would after freeing space).
    assert!(acked.sessions.len() > 100, "the disk filled only after some writes: {}", acked.sessions.len());
    let roomy = temp.path().join("roomy");
    copy_dir(&data_dir, &roomy);
    drop(server);
    drop(tmpfs);
    let restarted = Server::start_in(&roomy, "127.0.0.1:0", &[]);
    assert_recovered(&restarted, &acked).await;
}

/// Runs `workers` writers against `server` (for at most `timeout`) while a monitor watches its
/// health, until the node fails and exits (or [`EXIT_TIMEOUT`] after the writers stop). Returns
/// its exit status, what health said, and every acknowledged write.
pub(crate) async fn write_until_it_stops(
    server: &mut Server,
    workers: usize,
    timeout: Duration,
) -> (Option<std::process::ExitStatus>, Seen, Acked) {
    let acked = Arc::new(Mutex::new(Acked::default()));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(monitor(server.url.clone(), seen.clone(), stop.clone()));
    let deadline = Instant::now() + timeout;
    let writers: Vec<_> = (0..workers)
        .map(|worker| tokio::spawn(writer(server.url.clone(), worker, acked.clone(), deadline)))
        .collect();
    for writer in writers {
        writer.await.unwrap();
    }
    let status = server.wait_exit(EXIT_TIMEOUT).await;
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    (status, seen, acked)
}

/// Waits until `server` is ready, then checks that every acknowledged write is there.
pub(crate) async fn assert_recovered(server: &Server, acked: &Acked) {
    let api = Api::new(server);
    let ready = crate::common::eventually(Duration::from_secs(20), async || {
        api.get("/v1/health").await.status == 200
    })
    .await;
    assert!(ready, "the restarted node becomes ready");
    for session in &acked.sessions {
        let answer = api.get(&format!("/v1/sessions/{session}")).await;
        assert_eq!(answer.status, 200, "acknowledged session {session} lost: {answer:?}");
    }
    for (name, session, token) in &acked.grants {
        let view = api.get(&format!("/v1/semaphores/{name}")).await;
        assert_eq!(view.status, 200, "{view:?}");
        let holders = view.body["holders"].as_array().unwrap();
        let held = holders.iter().any(|h| h["session"] == session.as_str() && h["token"] == *token);
        assert!(held, "acknowledged grant of {name} (token {token}) lost: {}", view.body);
    }
}
