//! Adding and removing nodes while clients keep working.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use crate::common::Cluster;
use crate::{Api, Failover};

#[tokio::test]
async fn nodes_join_and_leave_under_traffic() {
    let mut cluster = Cluster::start(3, &[]).await;
    let urls = cluster.urls();
    let stop = Arc::new(AtomicBool::new(false));
    let cycles = Arc::new(AtomicUsize::new(0));
    let traffic = {
        let (stop, cycles, urls) = (stop.clone(), cycles.clone(), urls.clone());
        tokio::spawn(async move {
            let mut client = Failover::new(&urls, 2);
            let session = client.session(60_000).await;
            while !stop.load(Ordering::Relaxed) {
                let answer = client
                    .post("/v1/semaphores/m/acquire", json!({ "session": session, "capacity": 1 }))
                    .await;
                assert_eq!(answer.status, 200, "{answer:?}");
                let answer = client.post("/v1/semaphores/m/release", json!({ "session": session })).await;
                assert_eq!(answer.status, 200, "{answer:?}");
                cycles.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let joiner = cluster.start_joiner(4);
    // Not a member yet: alive, but not ready.
    let (status, body, _) = readiness(&cluster.nodes[joiner].url).await.expect("the joiner answers");
    assert_eq!((status, body["reason"].as_str()), (503, Some("joining")), "{body}");
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let live = http.get(format!("{}/v1/health/live", cluster.nodes[joiner].url)).send().await.unwrap();
    assert_eq!(live.status().as_u16(), 200);
    let mut admin = Failover::new(&urls, 0);
    // A member is refused when its address is another member's, or its node has another id.
    for (id, addr) in [(4, cluster.nodes[0].addr.clone()), (5, cluster.nodes[joiner].addr.clone())] {
        let refused = admin.post("/v1/cluster/members", json!({ "id": id, "addr": addr })).await;
        assert_eq!((refused.status, refused.code()), (400, "invalid_argument"), "{refused:?}");
    }
    let added =
        admin.post("/v1/cluster/members", json!({ "id": 4, "addr": cluster.nodes[joiner].addr })).await;
    assert_eq!(added.status, 200, "{added:?}");
    let voters = |view: &serde_json::Value| {
        let mut ids: Vec<u64> = view["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "voter")
            .map(|m| m["id"].as_u64().unwrap())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(voters(&admin.get("/v1/cluster").await.body), vec![1, 2, 3, 4]);
    let before = cycles.load(Ordering::Relaxed);
    // The new node serves the API (forwarding to the leader).
    let new_node = Api::new(&cluster.nodes[joiner]);
    assert_eq!(new_node.get("/v1/semaphores/m").await.status, 200);

    // Remove node 1, whatever its role.
    let removed = admin.send("DELETE", "/v1/cluster/members/1", None, Duration::from_secs(20)).await.0;
    assert_eq!(removed.status, 204, "{removed:?}");
    let mut admin = Failover::new(&urls[1..], 0);
    let view = admin.get("/v1/cluster").await;
    assert_eq!(voters(&view.body), vec![2, 3, 4]);
    let progressed = crate::common::eventually(Duration::from_secs(20), async || {
        cycles.load(Ordering::Relaxed) > before + 20
    })
    .await;
    assert!(progressed, "traffic kept flowing");
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), traffic).await.unwrap().unwrap();
    let unknown = admin.send("DELETE", "/v1/cluster/members/9", None, Duration::from_secs(5)).await.0;
    assert_eq!((unknown.status, unknown.code()), (400, "invalid_argument"));
}

/// A node's readiness: status, body and `Retry-After`, or `None` when it does not answer.
async fn readiness(url: &str) -> Option<(u16, serde_json::Value, Option<String>)> {
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let answer = http.get(format!("{url}/v1/health")).timeout(Duration::from_secs(2)).send().await.ok()?;
    let retry_after = answer.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let status = answer.status().as_u16();
    Some((status, answer.json().await.ok()?, retry_after))
}

#[tokio::test]
async fn a_removed_node_says_so_and_stops_campaigning_until_added_back() {
    let cluster = Cluster::start(3, &[]).await;
    let urls = cluster.urls();
    let mut admin = Failover::new(&urls[..2], 0);
    let removed = admin.send("DELETE", "/v1/cluster/members/3", None, Duration::from_secs(20)).await.0;
    assert_eq!(removed.status, 204, "{removed:?}");

    // Node 3 finds out (from its own log or from the others) and answers 503 `removed`.
    let node3 = cluster.nodes[2].url.clone();
    let mut last = None;
    let said_removed = crate::common::eventually(Duration::from_secs(30), async || {
        last = readiness(&node3).await;
        last.as_ref().is_some_and(|(status, body, _)| *status == 503 && body["reason"] == "removed")
    })
    .await;
    assert!(said_removed, "node 3 never said it was removed: {last:?}");
    let (_, body, retry_after) = last.take().unwrap();
    assert!(retry_after.is_some(), "503 carries Retry-After");
    let term = body["raft_term"].as_u64().unwrap();

    // It no longer campaigns: over several election timeouts (at most 1 s each) its term stays put.
    let window = std::time::Instant::now() + Duration::from_secs(4);
    while std::time::Instant::now() < window {
        let (status, body, _) = readiness(&node3).await.expect("node 3 answers");
        assert_eq!((status, body["reason"].as_str()), (503, Some("removed")), "{body}");
        assert_eq!(body["raft_term"].as_u64(), Some(term), "node 3 campaigns again: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Alive, though: liveness answers 200, and the others still serve.
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let live = http.get(format!("{node3}/v1/health/live")).send().await.unwrap();
    assert_eq!(live.status().as_u16(), 200);
    let session = admin.session(10_000).await;
    assert!(!session.is_empty());

    // Added back, it is ready again.
    let body = json!({ "id": 3, "addr": cluster.nodes[2].addr });
    let added = admin.send("POST", "/v1/cluster/members", Some(body), Duration::from_secs(60)).await.0;
    assert_eq!(added.status, 200, "{added:?}");
    let ready = crate::common::eventually(Duration::from_secs(30), async || {
        last = readiness(&node3).await;
        last.as_ref().is_some_and(|(status, _, _)| *status == 200)
    })
    .await;
    assert!(ready, "node 3 is ready once added back: {last:?}");
}

/// `permit <args>` against the node at `url`, within a minute: its exit code and stderr.
async fn permit_cli(url: &str, args: &[&str]) -> (i32, String) {
    let run = tokio::process::Command::new(crate::common::permit_bin())
        .args(args)
        .env("PERMIT_SERVER", url)
        .env_remove("PERMIT_AUTH_TOKEN")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60), run).await.expect("permit returns").unwrap();
    (output.status.code().unwrap_or(-1), String::from_utf8_lossy(&output.stderr).into_owned())
}

/// The ids of the cluster's voters, as the node at `url` reports them.
async fn voters(url: &str) -> Vec<u64> {
    let view = crate::Api::at(url).get("/v1/cluster").await;
    assert_eq!(view.status, 200, "{view:?}");
    let members = view.body["members"].as_array().expect("members").iter();
    members.filter(|m| m["role"] == "voter").map(|m| m["id"].as_u64().unwrap()).collect()
}

/// docs/operations.md, "Restore, then grow": a node restored from a backup grows with `permit
/// cluster add` once it has the cluster secret, given at the restore or at a restart without
/// `--restore`; until then the add is refused with a message naming the flag, and changes nothing.
#[tokio::test]
async fn a_restored_node_grows_with_cluster_add_once_it_has_the_cluster_secret() {
    use crate::common::Server;
    let dir = tempfile::tempdir().unwrap();
    let secret = crate::common::write_cluster_secret(dir.path()).display().to_string();
    let backup = dir.path().join("permit.backup").display().to_string();
    {
        let old = Server::start_in(&dir.path().join("old"), "127.0.0.1:0", &[]);
        crate::Api::at(&old.url).semaphore("db", 3).await;
        let saved = permit_cli(&old.url, &["snapshot", "save", &backup]).await;
        assert_eq!(saved.0, 0, "{saved:?}");
    }
    let join = |name: &str| {
        let args = ["--id", "2", "--join", "--cluster-secret-file", &secret];
        Server::start_in(&dir.path().join(name), "127.0.0.1:0", &args)
    };

    // Restored without the secret: refused, naming the flag; still one voter.
    let data = dir.path().join("restored");
    let mut restored = Server::start_in(&data, "127.0.0.1:0", &["--restore", &backup]);
    let joiner = join("joiner");
    let refused = permit_cli(&restored.url, &["cluster", "add", "2", &joiner.addr]).await;
    assert_eq!(refused.0, 1, "{refused:?}");
    assert!(
        refused.1.contains("no cluster secret") && refused.1.contains("--cluster-secret-file"),
        "{refused:?}"
    );
    assert_eq!(voters(&restored.url).await, [1]);

    // Started again on its data dir and address with the secret (not --restore): it grows.
    let addr = restored.addr.clone();
    restored.kill9();
    let restored = Server::start_in(&data, &addr, &["--cluster-secret-file", &secret]);
    let added = permit_cli(&restored.url, &["cluster", "add", "2", &joiner.addr]).await;
    assert_eq!(added.0, 0, "{added:?}");
    assert_eq!(voters(&restored.url).await, [1, 2]);
    let from_joiner = crate::Api::at(&joiner.url).get("/v1/semaphores/db").await;
    assert_eq!(
        from_joiner.body["capacity"], 3,
        "the backup's state, through the new member: {from_joiner:?}"
    );

    // Given the secret at the restore already: it grows at once.
    let args = ["--restore", &backup, "--cluster-secret-file", &secret];
    let fresh = Server::start_in(&dir.path().join("fresh"), "127.0.0.1:0", &args);
    let joiner = join("joiner-2");
    let added = permit_cli(&fresh.url, &["cluster", "add", "2", &joiner.addr]).await;
    assert_eq!(added.0, 0, "{added:?}");
    assert_eq!(voters(&fresh.url).await, [1, 2]);
}
