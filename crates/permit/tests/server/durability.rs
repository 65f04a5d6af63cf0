//! Acknowledged grants and releases survive `kill -9`; tokens keep increasing across restarts.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::common::{without_ages, Server};
use crate::Api;

const WORKERS: usize = 6;
const SEMAPHORES: usize = 3;

/// What a worker last had acknowledged for (semaphore, session), and whether an op is in flight.
#[derive(Default)]
struct Ledger {
    /// (semaphore, session) -> Some(token) if the last acknowledged op was a grant, None if a release.
    acked: BTreeMap<(String, String), Option<u64>>,
    in_flight: BTreeMap<(String, String), ()>,
    max_token: u64,
    ops: usize,
}

async fn worker(api: Api, session: String, ledger: Arc<Mutex<Ledger>>, seed: usize) {
    for step in 0.. {
        let name = format!("d{}", (seed + step) % SEMAPHORES);
        let key = (name.clone(), session.clone());
        ledger.lock().unwrap().in_flight.insert(key.clone(), ());
        let acquire = step % 2 == 0;
        let path = format!("/v1/semaphores/{name}/{}", if acquire { "acquire" } else { "release" });
        let result =
            api.http.post(format!("{}{path}", api.url)).json(&json!({ "session": session })).send().await;
        let Ok(response) = result else { return }; // The server died: this op's outcome is unknown.
        let status = response.status().as_u16();
        let Ok(body) = response.json::<serde_json::Value>().await else { return };
        let mut ledger = ledger.lock().unwrap();
        ledger.in_flight.remove(&key);
        ledger.ops += 1;
        match (acquire, status) {
            (true, 200) => {
                let token = body["token"].as_u64().unwrap();
                ledger.max_token = ledger.max_token.max(token);
                ledger.acked.insert(key, Some(token));
            }
            (true, 409) => {} // unavailable: nothing changed
            (false, 200) => {
                ledger.acked.insert(key, None);
            }
            other => panic!("unexpected answer {other:?}: {body}"),
        }
    }
}

#[tokio::test]
async fn acknowledged_grants_and_releases_survive_kill_9_and_tokens_keep_growing() {
    let mut server = Server::start_in(
        &tempfile::tempdir().unwrap().keep().join("d"),
        "127.0.0.1:0",
        &["--snapshot-logs", "40"],
    );
    let api = Api::new(&server);
    for i in 0..SEMAPHORES {
        api.semaphore(&format!("d{i}"), 2).await;
    }
    let mut sessions = Vec::new();
    for _ in 0..WORKERS {
        sessions.push(api.session(120_000).await);
    }
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let tasks: Vec<_> = sessions
        .iter()
        .enumerate()
        .map(|(i, s)| tokio::spawn(worker(api.clone(), s.clone(), ledger.clone(), i)))
        .collect();
    let enough =
        crate::common::eventually(Duration::from_secs(20), async || ledger.lock().unwrap().ops >= 300).await;
    assert!(enough, "the workload made progress");
    server.kill9();
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(20), task).await.expect("workers stop").unwrap();
    }
    assert!(server.data_dir.join("snapshots/snapshot.bin").exists(), "a snapshot was taken during the run");

    server.restart();
    let api = Api::new(&server);
    let ledger = std::mem::take(&mut *ledger.lock().unwrap());
    let mut checked = 0;
    for ((name, session), token) in &ledger.acked {
        if ledger.in_flight.contains_key(&(name.clone(), session.clone())) {
            continue; // Unknown outcome.
        }
        let view = api.get(&format!("/v1/semaphores/{name}")).await;
        let held = view.body["holders"].as_array().unwrap().iter().find(|h| h["session"] == session.as_str());
        assert_eq!(held.map(|h| h["token"].as_u64().unwrap()), *token, "{name} {session}");
        checked += 1;
    }
    assert!(checked >= WORKERS, "checked {checked} pairs");
    // Sessions survived too, and a new grant gets a larger token than any acknowledged before.
    for session in &sessions {
        assert_eq!(api.post(&format!("/v1/sessions/{session}/keepalive"), json!(null)).await.status, 200);
    }
    let fresh = api.session(10_000).await;
    let answer = api.acquire("after-restart", json!({ "session": fresh, "capacity": 1 })).await;
    assert!(answer.body["token"].as_u64().unwrap() > ledger.max_token);
    let _ = std::fs::remove_dir_all(server.data_dir.parent().unwrap());
}

#[tokio::test]
async fn a_restart_recovers_from_the_snapshot_plus_the_log_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(&dir.path().join("d"), "127.0.0.1:0", &["--snapshot-logs", "20"]);
    let api = Api::new(&server);
    let session = api.session(120_000).await;
    for i in 0..45 {
        let answer = api.acquire(&format!("s{i}"), json!({ "session": session, "capacity": 1 })).await;
        assert_eq!(answer.status, 200);
    }
    let before: Vec<_> = (0..45).map(|i| format!("s{i}")).collect();
    let snapshot = server.data_dir.join("snapshots/snapshot.bin");
    assert!(crate::common::eventually(Duration::from_secs(5), async || snapshot.exists()).await);
    server.kill9();
    server.restart();
    let api = Api::new(&server);
    let view = api.get(&format!("/v1/sessions/{session}")).await;
    let holds: Vec<&str> =
        view.body["holds"].as_array().unwrap().iter().map(|h| h["name"].as_str().unwrap()).collect();
    let mut expected: Vec<&str> = before.iter().map(String::as_str).collect();
    expected.sort();
    assert_eq!(holds, expected);
}

#[tokio::test]
async fn a_backup_restores_every_object_and_the_token_counter_into_a_new_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = Server::start_in(&dir.path().join("old"), "127.0.0.1:0", &[]);
    let api = Api::new(&old);
    let (a, b) = (api.session(120_000).await, api.session(120_000).await);
    assert_eq!(api.acquire("db", json!({ "session": a, "capacity": 2, "permits": 2 })).await.status, 200);
    assert_eq!(api.acquire("db", json!({ "session": b, "wait_ms": 0 })).await.code(), "unavailable");
    let queued = api.acquire("db", json!({ "session": b, "wait_ms": 1 })).await;
    assert_eq!(queued.status, 202, "{queued:?}");
    let lead = api.post("/v1/elections/sched/campaign", json!({ "session": b, "value": "host-b" })).await;
    assert_eq!(lead.status, 200, "{lead:?}");
    api.semaphore("idle", 7).await;
    let before = (api.get("/v1/semaphores/db").await.body, api.get("/v1/elections/sched").await.body);
    let last_token = lead.body["token"].as_u64().unwrap();

    let file = dir.path().join("permit.backup");
    let saved = std::process::Command::new(crate::common::permit_bin())
        .args(["snapshot", "save"])
        .arg(&file)
        .env("PERMIT_SERVER", &old.url)
        .output()
        .unwrap();
    assert!(saved.status.success(), "{}", String::from_utf8_lossy(&saved.stderr));
    old.kill9();

    let restore = file.display().to_string();
    let new = Server::start_in(&dir.path().join("new"), "127.0.0.1:0", &["--restore", &restore]);
    let api = Api::new(&new);
    let after = (api.get("/v1/semaphores/db").await.body, api.get("/v1/elections/sched").await.body);
    assert_eq!(
        (without_ages(after.0), without_ages(after.1)),
        (without_ages(before.0), without_ages(before.1)),
        "holders, queue and leader"
    );
    assert_eq!(api.get("/v1/semaphores/idle").await.body["capacity"], 7);
    // The sessions live on (with a fresh lease) and the token counter continues.
    assert_eq!(api.post(&format!("/v1/sessions/{a}/keepalive"), json!(null)).await.status, 200);
    let c = api.session(10_000).await;
    let next = api.acquire("fresh", json!({ "session": c, "capacity": 1 })).await;
    assert!(next.body["token"].as_u64().unwrap() > last_token, "{next:?}");
    // A restore needs an empty data dir.
    let again = std::process::Command::new(crate::common::permit_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--restore", &restore, "--data-dir"])
        .arg(dir.path().join("new"))
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("must be empty"), "{again:?}");
}

#[tokio::test]
async fn the_segment_log_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_in(&dir.path().join("data"), "127.0.0.1:0", &[]);
    let api = Api::new(&server);
    let session = api.session(120_000).await;
    let answer = api.acquire("kept", json!({ "session": session, "capacity": 1 })).await;
    assert_eq!(answer.status, 200);
    let token = answer.body["token"].as_u64().unwrap();
    server.kill9();
    server.restart();
    let api = Api::new(&server);
    let view = api.get("/v1/semaphores/kept").await;
    assert_eq!(view.body["holders"][0]["token"].as_u64(), Some(token), "{}", view.body);
}

/// The session that holds 2 permits of `db` (capacity 3, token 1) in the redb fixture.
const REDB_FIXTURE_HOLDER: &str = "00f62a571b1e40a76a67d915713ffcf0";

/// A data dir written by the redb log store of earlier versions is refused at start, and left as
/// it was, with the commands that move its state to the segment log; they work as printed. The
/// fixtures were made by the last build with that store: `tests/fixtures/redb-data-dir` is the
/// data dir of a node (semaphore `db` of capacity 3, session [`REDB_FIXTURE_HOLDER`] holding 2
/// permits with token 1), and `tests/fixtures/redb-backup.bin` is what the message's first
/// command, `permit --server URL snapshot save FILE`, saved from it.
#[tokio::test]
async fn a_redb_data_dir_is_refused_with_the_commands_that_move_it() {
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let redb = std::fs::read(fixtures.join("redb-data-dir/raft-log.redb")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir_all(data_dir.join("snapshots")).unwrap();
    std::fs::write(data_dir.join("raft-log.redb"), &redb).unwrap();
    let listing = |dir: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };

    let mut child = std::process::Command::new(crate::common::permit_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data_dir)
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let exited =
        crate::common::eventually(Duration::from_secs(30), async || child.try_wait().unwrap().is_some())
            .await;
    if !exited {
        let _ = child.kill();
        let _ = child.wait();
        panic!("permit serve started on a data dir of the redb log store");
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("holds a Raft log written by the redb log store"), "{stderr}");
    assert_eq!(listing(&data_dir), ["raft-log.redb", "snapshots"], "the refused start changed the data dir");
    assert!(listing(&data_dir.join("snapshots")).is_empty());
    assert!(
        std::fs::read(data_dir.join("raft-log.redb")).unwrap() == redb,
        "the refused start wrote the log"
    );
    let commands: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|line| line.starts_with("permit ") || line.starts_with("mv "))
        .collect();
    let (data, aside) = (data_dir.display().to_string(), format!("{}.redb", data_dir.display()));
    assert_eq!(
        commands,
        [
            "permit --server http://127.0.0.1:0 snapshot save permit-backup.bin".to_owned(),
            format!("mv {data} {aside}"),
            format!("permit serve --data-dir {data} --restore permit-backup.bin"),
        ],
        "{stderr}"
    );

    // Step 1 ran on the old build (the fixture backup); steps 2 and 3 as printed.
    let backup = dir.path().join("permit-backup.bin");
    std::fs::copy(fixtures.join("redb-backup.bin"), &backup).unwrap();
    std::fs::rename(&data_dir, &aside).unwrap();
    let server = Server::start_in(&data_dir, "127.0.0.1:0", &["--restore", &backup.display().to_string()]);
    let api = Api::new(&server);
    let view = api.get("/v1/semaphores/db").await;
    assert_eq!(view.body["capacity"], 3, "{}", view.body);
    assert_eq!(view.body["holders"][0]["session"], REDB_FIXTURE_HOLDER, "{}", view.body);
    assert_eq!(view.body["holders"][0]["permits"], 2, "{}", view.body);
    assert_eq!(view.body["holders"][0]["token"], 1, "{}", view.body);
    let renewed = api.post(&format!("/v1/sessions/{REDB_FIXTURE_HOLDER}/keepalive"), json!(null)).await;
    assert_eq!(renewed.status, 200, "{renewed:?}");
    let session = api.session(120_000).await;
    let next = api.acquire("db", json!({ "session": session })).await;
    assert!(next.body["token"].as_u64().unwrap() > 1, "{next:?}");
    assert!(data_dir.join("raft-log").is_dir() && !data_dir.join("raft-log.redb").exists());
    assert!(std::fs::read(std::path::Path::new(&aside).join("raft-log.redb")).unwrap() == redb);
}

/// Log entries written before the restart in [`a_restart_replays_thousands_of_entries_in_linear_time`].
const REPLAYED_ENTRIES: u64 = 4_000;
/// Longest that restart may take until the node is ready: far above a linear replay in a debug
/// build on a loaded machine, below the O(n²) one of a check after every batch.
const REPLAY_BOUND: Duration = Duration::from_secs(10);

/// A restart re-applies the log after the last snapshot before it serves. With thousands of
/// entries and no snapshot yet, a debug build must still be ready within [`REPLAY_BOUND`]: a
/// check after every applied batch that walked the whole state made the replay O(n²).
#[tokio::test]
async fn a_restart_replays_thousands_of_entries_in_linear_time() {
    let mut server = Server::start();
    let api = Api::new(&server);
    let created = Arc::new(Mutex::new(Vec::new()));
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    // Each session holds a semaphore of its own, as in the full-disk test that found it.
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (api, created) = (api.clone(), created.clone());
            tokio::spawn(async move {
                for round in 0.. {
                    let done = gauge(&api, "permit_raft_applied_index").await >= REPLAYED_ENTRIES;
                    if done || std::time::Instant::now() > deadline {
                        return;
                    }
                    for i in 0..25 {
                        let session = api.session(86_400_000).await;
                        let name = format!("replay-{worker}-{round}-{i}");
                        let held = api.acquire(&name, json!({ "session": session, "capacity": 1 })).await;
                        assert_eq!(held.status, 200, "{held:?}");
                        created.lock().unwrap().push(session);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.await.unwrap();
    }
    let applied = gauge(&api, "permit_raft_applied_index").await;
    assert!(applied >= REPLAYED_ENTRIES, "only {applied} entries written in time");

    let started = std::time::Instant::now();
    server.restart();
    let api = Api::new(&server);
    let ready =
        crate::common::eventually(REPLAY_BOUND, async || api.get("/v1/health").await.status == 200).await;
    let took = started.elapsed();
    println!("a restart replaying {applied} entries took {took:?}");
    assert!(ready && took < REPLAY_BOUND, "a restart replaying {applied} entries took {took:?}");
    let created = std::mem::take(&mut *created.lock().unwrap());
    assert_eq!(gauge(&api, "permit_sessions").await, created.len() as u64, "every session is back");
    let last = created.last().unwrap();
    let answer = api.post(&format!("/v1/sessions/{last}/keepalive"), json!(null)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// The gauge `name` of the server's `/metrics`.
async fn gauge(api: &Api, name: &str) -> u64 {
    let text = api.http.get(format!("{}/metrics", api.url)).send().await.unwrap().text().await.unwrap();
    let value = text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')).unwrap();
    value.trim().parse::<f64>().unwrap() as u64
}

/// A snapshot is encoded from a frozen copy of the state, off the lock: with its encoding slowed
/// down by 2 s (`slow_snapshot_encode`), writes keep being acknowledged and applied past the
/// snapshot's index while it is being taken, none waits for it, and the snapshot is then taken
/// at the index where it started and recovers after `kill -9`.
#[tokio::test]
async fn writes_flow_while_a_snapshot_is_encoded() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start_with_env(
        &dir.path().join("d"),
        "127.0.0.1:0",
        &["--snapshot-logs", "20"],
        &[("PERMIT_INJECT_BUG", "slow_snapshot_encode")],
    );
    let api = Api::new(&server);
    let session = api.session(120_000).await;
    api.semaphore("w", 1).await;
    let cycle = async |api: &Api| {
        let started = std::time::Instant::now();
        assert_eq!(api.acquire("w", json!({ "session": session })).await.status, 200);
        assert_eq!(api.release("w", &session).await.status, 200);
        started.elapsed()
    };
    // Past 20 entries: the first snapshot starts, and its encoding sleeps for 2 s.
    while gauge(&api, "permit_raft_applied_index").await < 25 {
        cycle(&api).await;
    }
    assert_eq!(gauge(&api, "permit_raft_snapshot_index").await, 0, "the snapshot is still being encoded");
    let (mut cycles, mut slowest) = (0, Duration::ZERO);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut applied_before_it = 0;
    loop {
        let snapshot = gauge(&api, "permit_raft_snapshot_index").await;
        if snapshot > 0 {
            assert!(snapshot <= 30, "the snapshot is at the index it started from, not later: {snapshot}");
            let health: serde_json::Value =
                api.http.get(format!("{}/v1/health", api.url)).send().await.unwrap().json().await.unwrap();
            let reported = health["snapshot_index"].as_u64().expect("the health report has snapshot_index");
            assert!(reported >= snapshot, "health reports snapshot {reported}, the metrics {snapshot}");
            assert!(
                applied_before_it >= snapshot + 20,
                "writes were applied past the snapshot's index ({snapshot}) while it was encoded: \
                 {applied_before_it}"
            );
            break;
        }
        applied_before_it = gauge(&api, "permit_raft_applied_index").await;
        assert!(std::time::Instant::now() < deadline, "no snapshot within 30 s");
        slowest = slowest.max(cycle(&api).await);
        cycles += 1;
    }
    assert!(cycles >= 10, "only {cycles} write cycles during the 2 s encoding");
    assert!(slowest < Duration::from_millis(1000), "a write waited {slowest:?} for the snapshot");
    let file = server.data_dir.join("snapshots/snapshot.bin");
    assert!(file.exists());
    let held = api.acquire("w", json!({ "session": session })).await;
    assert_eq!(held.status, 200);
    server.kill9();
    server.restart();
    let api = Api::new(&server);
    assert_eq!(api.holders("w").await, vec![session.clone()], "the state after the snapshot recovers");
}
