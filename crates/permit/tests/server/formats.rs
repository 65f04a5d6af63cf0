//! The formats on disk carry their version (issue 31): files written by the previous build are
//! read, and a newer format is refused at start with a message that says so. The fixtures were
//! written by the build of the commit before versioned clusters (`d9fc6e4`, log format 2,
//! snapshot format 3): `tests/fixtures/d9fc6e4-data-dir` is a single node's data dir with a
//! snapshot at index 19 and two entries after it, and `tests/fixtures/d9fc6e4-backup.bin` a
//! backup (`permit snapshot save`) taken before the last entry.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;

use crate::common::{eventually, permit_bin, Server};
use crate::Api;

/// Session `worker-a` holds both permits of `db` with token 7; `worker-b` waits for one and
/// leads election `sched` (value `host-b`, token 8).
const HOLDER: &str = "0645159593af6493b9d18b9f255d2dda";
const WAITER: &str = "b469eb73e0d84d720278e122c62b13ca";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// A copy of the fixture data dir in `dir`.
fn copy_of_the_data_dir(dir: &Path) -> PathBuf {
    let data = dir.join("data");
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(fixtures().join("d9fc6e4-data-dir"))
        .arg(&data)
        .status();
    assert!(status.unwrap().success());
    data
}

/// What the fixture holds, as the API shows it.
async fn assert_the_fixture_state(api: &Api, with_the_last_entry: bool) {
    let db = api.get("/v1/semaphores/db").await.body;
    assert_eq!(db["holders"][0]["session"], HOLDER, "{db}");
    assert_eq!(
        (db["holders"][0]["permits"].as_u64(), db["holders"][0]["token"].as_u64()),
        (Some(2), Some(7)),
        "{db}"
    );
    assert_eq!(db["waiters"][0]["session"], WAITER, "{db}");
    let sched = api.get("/v1/elections/sched").await.body;
    assert_eq!(
        (&sched["leader"]["value"], &sched["leader"]["token"]),
        (&json!("host-b"), &json!(8)),
        "{sched}"
    );
    let after = api.get("/v1/semaphores/after").await;
    assert_eq!(after.status == 200, with_the_last_entry, "{after:?}");
}

#[tokio::test]
async fn a_data_dir_and_a_backup_of_the_previous_build_are_read_and_move_to_the_new_formats() {
    let dir = tempfile::tempdir().unwrap();
    let data = copy_of_the_data_dir(dir.path());
    let mut server = Server::start_in(&data, "127.0.0.1:0", &["--snapshot-logs", "10"]);
    let api = Api::new(&server);
    assert_the_fixture_state(&api, true).await;
    // Its cluster is raised to this build's version (one member); tokens go on from 8.
    let raised = eventually(Duration::from_secs(10), async || {
        api.get("/v1/cluster").await.body["feature_version"] == permit_core::FEATURE_VERSION
    })
    .await;
    assert!(raised, "{}", api.get("/v1/cluster").await.body);
    let session = api.session(60_000).await;
    for name in ["x1", "x2", "x3", "x4", "x5", "x6", "x7", "x8", "x9", "x10", "x11", "x12"] {
        let granted = api.acquire(name, json!({ "session": session, "capacity": 1 })).await;
        assert!(granted.body["token"].as_u64().unwrap() > 8, "{granted:?}");
    }
    // A snapshot was written since, in format 4; the restart reads it.
    let snapshot = std::fs::read(data.join("snapshots/snapshot.bin")).unwrap();
    let fixture = std::fs::read(fixtures().join("d9fc6e4-data-dir/snapshots/snapshot.bin")).unwrap();
    assert_ne!(snapshot, fixture, "a new snapshot");
    let (_, state) = permit_server::raft::snapshot_store::decode(&snapshot).unwrap();
    assert_eq!(state[0], permit_core::SNAPSHOT_FORMAT_VERSION, "in format 4, with the cluster's version");
    server.restart();
    let api = Api::new(&server);
    assert_the_fixture_state(&api, true).await;
    assert_eq!(api.get("/v1/cluster").await.body["feature_version"], permit_core::FEATURE_VERSION);

    // The backup restores into a new cluster.
    let backup = fixtures().join("d9fc6e4-backup.bin").display().to_string();
    let restored = Server::start_in(&dir.path().join("restored"), "127.0.0.1:0", &["--restore", &backup]);
    assert_the_fixture_state(&Api::new(&restored), false).await;
}

/// Runs `permit serve` on `data` until it exits (it must, within 30 s); its stderr.
async fn refused_start(data: &Path) -> String {
    let mut child = std::process::Command::new(permit_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data)
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited = eventually(Duration::from_secs(30), async || child.try_wait().unwrap().is_some()).await;
    if !exited {
        let _ = child.kill();
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(exited && output.status.code() == Some(1), "a newer format must stop the start: {stderr}");
    stderr
}

#[tokio::test]
async fn a_newer_snapshot_or_log_format_is_refused_at_start_and_left_as_it_is() {
    // A snapshot of a format after this build's.
    let dir = tempfile::tempdir().unwrap();
    let data = copy_of_the_data_dir(dir.path());
    let file = data.join("snapshots/snapshot.bin");
    let (meta, mut state) =
        permit_server::raft::snapshot_store::decode(&std::fs::read(&file).unwrap()).unwrap();
    state[0] = permit_core::SNAPSHOT_FORMAT_VERSION + 1;
    let bytes = permit_server::raft::snapshot_store::encode(&meta, &state).unwrap();
    std::fs::write(&file, &bytes).unwrap();
    let stderr = refused_start(&data).await;
    assert!(stderr.contains("a newer build wrote it"), "{stderr}");
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "left as it was");

    // A log whose metadata is of a newer format.
    let dir = tempfile::tempdir().unwrap();
    let data = copy_of_the_data_dir(dir.path());
    let meta = data.join("raft-log/meta");
    let mut bytes: Vec<u8> = std::fs::read(&meta).unwrap();
    bytes[0] += 1;
    std::fs::write(&meta, &bytes).unwrap();
    let stderr = refused_start(&data).await;
    assert!(stderr.contains("log format version 3") && stderr.contains("a newer build wrote it"), "{stderr}");
}
