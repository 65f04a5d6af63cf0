//! What `permit serve` logs with its default filter (no `RUST_LOG`): a healthy cluster start
//! logs no WARN or ERROR line, and a follower that is down is logged once, not on every retry.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{eventually, permit_bin, write_cluster_secret};

/// Longest any step may take.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long the leader keeps retrying a down follower before its log is read: several of
/// openraft's retry rounds (one each 500 ms), each of which logged an ERROR line before.
const DOWN_WINDOW: Duration = Duration::from_secs(3);

/// A node with its stderr in a file and the default log filter.
struct Node {
    child: Child,
    url: String,
    addr: String,
    stderr: PathBuf,
}

impl Node {
    async fn start(dir: &Path, id: u64, secret: &Path) -> Node {
        let stderr = dir.join(format!("stderr-{id}"));
        let mut child = Command::new(permit_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--id", &id.to_string(), "--join"])
            .arg("--cluster-secret-file")
            .arg(secret)
            .arg("--data-dir")
            .arg(dir.join(format!("n{id}")))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn permit serve");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = tokio::time::timeout(PATIENCE, async {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(url) = line.strip_prefix("permit listening on ") {
                    return url.split_whitespace().next().unwrap_or("").to_owned();
                }
            }
            panic!("permit serve exited before printing its address");
        })
        .await
        .expect("permit serve printed its address in time");
        // Keep reading stdout so that the node never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let addr = url.trim_start_matches("http://").to_owned();
        Node { child, url, addr, stderr }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

/// WARN and ERROR lines of a log, but the notice of a slow log write: that one is about the
/// machine (a disk or a CPU that kept a log write past the server's threshold), not the cluster.
fn alarms(log: &str) -> Vec<&str> {
    let about_the_cluster = |line: &&str| !line.contains("a log write was slow");
    log.lines()
        .filter(|line| line.contains(" WARN ") || line.contains(" ERROR "))
        .filter(about_the_cluster)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_start_logs_no_warnings_and_a_down_follower_is_logged_once() {
    let dir = tempfile::tempdir().unwrap();
    let secret = write_cluster_secret(dir.path());
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(Node::start(dir.path(), id, &secret).await);
    }
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().timeout(Duration::from_secs(5)).build().unwrap();
    let members: Vec<serde_json::Value> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| serde_json::json!({ "id": i as u64 + 1, "addr": n.addr }))
        .collect();
    let init = http
        .post(format!("{}/v1/cluster/init", nodes[0].url))
        .json(&serde_json::json!({ "members": members }))
        .send()
        .await
        .unwrap();
    assert!(init.status().is_success(), "init: {}", init.text().await.unwrap_or_default());

    // Healthy: every node ok, with one leader, and a write applied everywhere.
    let write =
        http.put(format!("{}/v1/semaphores/logs", nodes[0].url)).json(&serde_json::json!({"capacity": 1}));
    let written = eventually(PATIENCE, async || {
        write.try_clone().unwrap().send().await.is_ok_and(|answer| answer.status().is_success())
    })
    .await;
    assert!(written, "no write was committed");
    let mut leader = None;
    let settled = eventually(PATIENCE, async || {
        let mut seen = Vec::new();
        for node in &nodes {
            let Ok(answer) = http.get(format!("{}/v1/health", node.url)).send().await else { return false };
            let Ok(health) = answer.json::<serde_json::Value>().await else { return false };
            seen.push((
                health["status"].clone(),
                health["raft_leader"].clone(),
                health["applied_index"].clone(),
            ));
        }
        leader = seen[0].1.as_u64();
        seen.iter().all(|s| s.0 == "ok" && s.1 == seen[0].1 && s.2 == seen[0].2)
    })
    .await;
    assert!(settled, "the cluster did not settle");
    for node in &nodes {
        let log = node.log();
        assert!(alarms(&log).is_empty(), "a healthy start logged warnings:\n{log}");
    }

    // A follower goes down: the leader says so once, then keeps retrying quietly.
    let leader = leader.expect("a leader") as usize - 1;
    let follower = (leader + 1) % nodes.len();
    nodes[follower].child.start_kill().unwrap();
    nodes[follower].child.wait().await.unwrap();
    let noticed = eventually(PATIENCE, async || nodes[leader].log().contains("peer unreachable")).await;
    assert!(noticed, "the leader did not log the down peer:\n{}", nodes[leader].log());
    // Bounded observation window with writes, each of which makes the leader try the follower.
    let started = Instant::now();
    let mut writes = 0;
    while started.elapsed() < DOWN_WINDOW && writes < 1000 {
        let put = http.put(format!("{}/v1/semaphores/logs", nodes[leader].url));
        let answer = put.json(&serde_json::json!({"capacity": 1 + writes % 2})).send().await.unwrap();
        assert!(answer.status().is_success(), "a write failed with one follower down");
        writes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = nodes[leader].log();
    let alarms = alarms(&log);
    assert_eq!(alarms.len(), 1, "the down follower was logged more than once:\n{log}");
    assert!(alarms[0].contains("peer unreachable") && alarms[0].contains(&nodes[follower].addr), "{log}");
}
