//! Lost-quorum recovery (issue 31, docs/operations.md *Lost quorum*): two of three nodes are
//! destroyed; `permit recover` makes the third a single-node cluster with everything it had,
//! which grows back to three with `permit cluster add`, and refuses an old member that comes
//! back.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;

use crate::common::{eventually, permit_bin, without_ages, Cluster, Server};
use crate::Api;

fn recover(data_dir: &std::path::Path, id: u64) -> std::process::Output {
    Command::new(permit_bin())
        .args(["recover", "--id", &id.to_string(), "--data-dir"])
        .arg(data_dir)
        .output()
        .expect("run permit recover")
}

#[tokio::test]
async fn a_lost_quorum_is_recovered_from_one_node_that_keeps_its_writes_and_grows_back() {
    let mut cluster = Cluster::start(3, &[]).await;
    let leader = cluster.leader(Duration::from_secs(10)).await.expect("a leader");
    let api = Api::at(&cluster.nodes[leader].url);
    api.semaphore("db", 1).await;
    let (a, b) = (api.session(600_000).await, api.session(600_000).await);
    assert_eq!(api.acquire("db", json!({ "session": a })).await.body["status"], "acquired");
    assert_eq!(api.acquire("db", json!({ "session": b, "wait_ms": 1 })).await.status, 202, "b waits");
    let lead = api.post("/v1/elections/sched/campaign", json!({ "session": a, "value": "host-a" })).await;
    assert_eq!(lead.status, 200, "{lead:?}");
    let last_token = lead.body["token"].as_u64().unwrap();
    let before = (
        without_ages(api.get("/v1/semaphores/db").await.body),
        without_ages(api.get("/v1/elections/sched").await.body),
    );

    // The survivor: a follower that has applied everything the leader committed.
    let survivor = (0..3).find(|i| *i != leader).unwrap();
    let id = survivor as u64 + 1;
    let target = api.get("/v1/health").await.body["applied_index"].as_u64().unwrap();
    let on_survivor = Api::at(&cluster.nodes[survivor].url);
    let caught_up = eventually(Duration::from_secs(10), async || {
        on_survivor.get("/v1/health").await.body["applied_index"].as_u64() >= Some(target)
    })
    .await;
    assert!(caught_up, "the survivor applied what the leader committed");

    // Refused while its server runs, changing nothing.
    let data_dir = cluster.nodes[survivor].data_dir.clone();
    let refused = recover(&data_dir, id);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("a server is using"), "{stderr}");

    // Two nodes destroyed (one's data kept aside, to come back later as an old member).
    let old = (0..3).find(|i| *i != survivor).unwrap();
    let old_copy = tempfile::tempdir().unwrap();
    for i in (0..3).filter(|i| *i != survivor) {
        cluster.nodes[i].kill9();
        if i == old {
            let status =
                Command::new("cp").arg("-a").arg(&cluster.nodes[i].data_dir).arg(old_copy.path()).status();
            assert!(status.unwrap().success());
        }
        std::fs::remove_dir_all(&cluster.nodes[i].data_dir).unwrap();
    }
    cluster.nodes[survivor].kill9();

    let recovered = recover(&data_dir, id);
    let stdout = String::from_utf8_lossy(&recovered.stdout);
    assert!(recovered.status.success(), "{stdout}{}", String::from_utf8_lossy(&recovered.stderr));
    assert!(stdout.contains("kept the log up to index"), "{stdout}");
    let secret = cluster.secret_file.display().to_string();
    let addr = cluster.nodes[survivor].addr.clone();
    let id_arg = id.to_string();
    let node = Server::start_in(&data_dir, &addr, &["--id", &id_arg, "--cluster-secret-file", &secret]);
    let api = Api::new(&node);
    let leads = eventually(Duration::from_secs(15), async || api.get("/v1/health").await.status == 200).await;
    assert!(leads, "the recovered node serves: {:?}", api.get("/v1/health").await);

    // Every write it had is there, and tokens keep growing.
    let after = (
        without_ages(api.get("/v1/semaphores/db").await.body),
        without_ages(api.get("/v1/elections/sched").await.body),
    );
    assert_eq!(after, before, "holders, waiters and the election survive the recovery");
    let c = api.session(60_000).await;
    let granted = api.acquire("fresh", json!({ "session": c, "capacity": 1 })).await;
    assert!(granted.body["token"].as_u64().unwrap() > last_token, "tokens grow: {granted:?}");

    // An old member that comes back with its data is refused, and says why.
    let old_dir = old_copy.path().join(cluster.nodes[old].data_dir.file_name().unwrap());
    let old_id = (old + 1).to_string();
    let mut comeback = Command::new(permit_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--id",
            &old_id,
            "--cluster-secret-file",
            &secret,
            "--data-dir",
        ])
        .arg(&old_dir)
        .env("RUST_LOG", "warn,openraft=off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the old member");
    let mut stderr = comeback.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut text = String::new();
        let mut buffer = [0; 4096];
        while let Ok(n) = stderr.read(&mut buffer) {
            if n == 0 {
                break;
            }
            text.push_str(&String::from_utf8_lossy(&buffer[..n]));
            if text.contains("wrong_cluster") {
                let _ = tx.send(text.clone());
                break;
            }
        }
    });
    let said = rx.recv_timeout(Duration::from_secs(20));
    let _ = comeback.kill();
    let _ = comeback.wait();
    let said = said.expect("the old member is refused with wrong_cluster");
    assert!(said.contains("the cluster before that recovery") && said.contains("wipe"), "{said}");

    // Grown back to three with `permit cluster add`; the new members take its identity.
    for new_id in [4, 5] {
        let index = cluster.start_joiner(new_id);
        let body = json!({ "id": new_id, "addr": cluster.nodes[index].addr });
        let added = api.post("/v1/cluster/members", body).await;
        assert_eq!(added.status, 200, "{added:?}");
    }
    let view = api.get("/v1/cluster").await.body;
    assert_eq!(view["members"].as_array().map(Vec::len), Some(3), "{view}");
    let d = api.session(60_000).await;
    assert_eq!(
        api.acquire("fresh2", json!({ "session": d, "capacity": 1 })).await.body["status"],
        "acquired"
    );
    let joined = Api::at(&cluster.nodes[cluster.nodes.len() - 1].url);
    let follows = eventually(Duration::from_secs(10), async || {
        without_ages(joined.get("/v1/semaphores/db?stale=true").await.body) == before.0
    })
    .await;
    assert!(follows, "a new member has the recovered state");
}
