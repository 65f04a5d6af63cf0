//! Versioned clusters (issue 31, docs/operations.md *Upgrading*), with a node that speaks
//! feature version 1 as builds from before versioning do (`PERMIT_INJECT_BUG=speaks_version_1`
//! in a test build). The rolling upgrade from a real older build is the fault suite's
//! `f11_rolling_upgrade_from_the_previous_build`.

use std::process::{Command, Stdio};
use std::time::Duration;

use permit_core::FEATURE_VERSION;
use serde_json::{json, Value};

use crate::common::{eventually, permit_bin, Cluster, Server};
use crate::Api;

const SPEAKS_1: &[(&str, &str)] = &[("PERMIT_INJECT_BUG", "speaks_version_1")];

/// The cluster view as node `api` answers it.
async fn view(api: &Api) -> Value {
    api.get("/v1/cluster").await.body
}

/// The members' feature versions in `view`, by node id.
fn member_versions(view: &Value) -> Vec<(u64, Option<u64>)> {
    let members = view["members"].as_array().cloned().unwrap_or_default();
    members.iter().map(|m| (m["id"].as_u64().unwrap(), m["feature_version"].as_u64())).collect()
}

#[tokio::test]
async fn a_cluster_refuses_a_newer_feature_until_every_member_speaks_it_and_never_goes_back() {
    permit_client::install_crypto_provider();
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let mut cluster = Cluster::start_with_envs(&[&[], &[], SPEAKS_1], &[], http).await;
    let leader = cluster.leader(Duration::from_secs(10)).await.expect("a leader");
    let api = Api::at(&cluster.nodes[leader].url);

    // Node 3 holds the cluster at version 1; the view says so.
    let new = Some(u64::from(FEATURE_VERSION));
    let seen = eventually(Duration::from_secs(10), async || {
        let view = view(&api).await;
        view["feature_version"] == 1 && member_versions(&view) == [(1, new), (2, new), (3, Some(1))]
    })
    .await;
    assert!(seen, "the view shows the cluster at 1 and each member's version: {}", view(&api).await);

    // A revoke needs version 2: refused, naming node 3, and nothing changes.
    api.semaphore("db", 1).await;
    let session = api.session(30_000).await;
    let granted = api.acquire("db", json!({ "session": session })).await;
    assert_eq!(granted.body["status"], "acquired", "{granted:?}");
    let revoke = || api.post("/v1/semaphores/db/revoke", json!({ "session": session }));
    let named = eventually(Duration::from_secs(10), async || {
        let refused = revoke().await;
        assert_eq!((refused.status, refused.code()), (409, "feature_unavailable"), "{refused:?}");
        refused.body["error"]["message"].as_str().unwrap_or_default().contains("node 3 (version 1)")
    })
    .await;
    assert!(named, "the refusal names the older member: {:?}", revoke().await);
    assert_eq!(api.holders("db").await, std::slice::from_ref(&session), "the refused revoke changed nothing");

    // A proclaim needs version 3: refused the same way, and the leader's value stays.
    let campaign = api.post("/v1/elections/e/campaign", json!({ "session": session, "value": "a" })).await;
    assert_eq!(campaign.status, 200, "{campaign:?}");
    let proclaim = api.post("/v1/elections/e/proclaim", json!({ "session": session, "value": "b" })).await;
    assert_eq!((proclaim.status, proclaim.code()), (409, "feature_unavailable"), "{proclaim:?}");
    // So is the leader's campaign with another value (it proclaims); with its own, it leads.
    let changed = api.post("/v1/elections/e/campaign", json!({ "session": session, "value": "b" })).await;
    assert_eq!((changed.status, changed.code()), (409, "feature_unavailable"), "{changed:?}");
    assert_eq!(
        api.post("/v1/elections/e/campaign", json!({ "session": session, "value": "a" })).await.status,
        200
    );
    assert_eq!(api.get("/v1/elections/e").await.body["leader"]["value"], "a");
    // Queues need version 4: refused the same way, and no queue appears.
    let push = || api.post("/v1/queues/jobs/items", json!({ "payload": 1 }));
    let refused = push().await;
    assert_eq!((refused.status, refused.code()), (409, "feature_unavailable"), "{refused:?}");
    assert_eq!(api.get("/v1/queues/jobs").await.code(), "queue_not_found");
    // Semaphore policies need version 5: a policy, a grouped acquire and a take are refused; a
    // plain capacity change still works.
    let policy =
        || api.send("PUT", "/v1/semaphores/db", Some(json!({ "capacity": 2, "lock_delay_ms": 100 })));
    let refused = policy().await;
    assert_eq!((refused.status, refused.code()), (409, "feature_unavailable"), "{refused:?}");
    let other = api.session(30_000).await;
    let grouped = api.acquire("db", json!({ "session": other, "group": "g" })).await;
    assert_eq!((grouped.status, grouped.code()), (409, "feature_unavailable"), "{grouped:?}");
    let take = || api.post("/v1/semaphores/db/take", json!({}));
    assert_eq!(take().await.code(), "feature_unavailable");
    let plain = api.send("PUT", "/v1/semaphores/db", Some(json!({ "capacity": 1 }))).await;
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.body["lock_delay_ms"], 0, "{plain:?}");

    // Node 3 upgraded (restarted without the injection): the leader raises the version.
    cluster.nodes[2].restart();
    let raised =
        eventually(Duration::from_secs(15), async || view(&api).await["feature_version"] == FEATURE_VERSION)
            .await;
    assert!(raised, "raised once every member speaks {FEATURE_VERSION}: {}", view(&api).await);
    let revoked = revoke().await;
    assert_eq!(revoked.status, 200, "{revoked:?}");
    assert!(api.holders("db").await.is_empty());
    let proclaimed = api.post("/v1/elections/e/proclaim", json!({ "session": session, "value": "b" })).await;
    assert_eq!((proclaimed.status, proclaimed.body["value"].as_str()), (200, Some("b")), "{proclaimed:?}");
    assert_eq!(push().await.status, 201);
    assert_eq!(policy().await.body["lock_delay_ms"], 100);
    assert_eq!(take().await.status, 200);

    // A member that speaks less than the cluster's version is not added.
    let secret = cluster.secret_file.display().to_string();
    let old_dir = tempfile::tempdir().unwrap();
    let old = Server::start_with_env(
        &old_dir.path().join("data"),
        "127.0.0.1:0",
        &["--id", "4", "--join", "--cluster-secret-file", &secret],
        SPEAKS_1,
    );
    let added = api.post("/v1/cluster/members", json!({ "id": 4, "addr": old.addr })).await;
    assert_eq!((added.status, added.code()), (409, "feature_unavailable"), "{added:?}");
    let message = added.body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("node 4 speaks feature version 1"), "{message}");
    assert_eq!(member_versions(&view(&api).await).len(), 3, "not added");

    // A downgrade: node 2 restarted as a build that speaks 1 stops, saying what to run.
    let follower = (0..3).find(|i| *i != leader && *i != 2).unwrap();
    let node = &mut cluster.nodes[follower];
    node.kill9();
    let id = (follower + 1).to_string();
    let mut downgraded = Command::new(permit_bin())
        .args(["serve", "--listen", &node.addr, "--data-dir"])
        .arg(&node.data_dir)
        .args(["--id", &id, "--join", "--cluster-secret-file", &secret])
        .env("PERMIT_INJECT_BUG", "speaks_version_1")
        .env("RUST_LOG", "warn,openraft=off")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the downgraded node");
    let exited =
        eventually(Duration::from_secs(30), async || downgraded.try_wait().ok().flatten().is_some()).await;
    if !exited {
        let _ = downgraded.kill();
    }
    let output = downgraded.wait_with_output().expect("its output");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(exited && !output.status.success(), "the downgraded node stops: {:?}\n{stderr}", output.status);
    assert!(
        stderr.contains("speaks version 1")
            && stderr.contains(&format!("a build that speaks version {FEATURE_VERSION} or newer")),
        "the message says what to run:\n{stderr}"
    );
}
