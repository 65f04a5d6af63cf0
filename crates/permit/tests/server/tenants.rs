//! Tenants of one `--auth` server against each other, as attacks: an object flood, lists that
//! must cost only what the caller may see, stored token hashes in a backup, and a restore that
//! must apply the operator's root secret and name the tokens it brings back.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use crate::auth::{secured, ROOT};
use crate::common::{eventually, permit_bin};
use crate::Api;

async fn put(api: &Api, name: &str) -> u16 {
    api.send("PUT", &format!("/v1/semaphores/{name}"), Some(json!({ "capacity": 1 }))).await.status
}

#[tokio::test]
async fn an_object_flood_stops_at_the_tokens_cap_with_429_and_deleting_the_token_frees_its_unused_objects() {
    let (server, _temp) = secured(&["--objects-per-token-max", "20"]).await;
    let root = Api::with_token(&server.url, ROOT);
    let rules = ["semaphore:=admin", "election:=write", "session:=write"];
    let (flood_secret, flood_id) = root.create_token("flood", &rules).await;
    let flood = Api::with_token(&server.url, &flood_secret);
    let other = Api::with_token(&server.url, &root.create_token("other", &rules).await.0);

    // 15 one by one, then 15 at once: exactly 5 of those fit, however they interleave (the
    // state machine decides, so concurrent requests cannot overshoot).
    for i in 0..15 {
        assert_eq!(put(&flood, &format!("flood.{i:02}")).await, 201);
    }
    let burst = (15..30).map(|i| {
        let flood = flood.clone();
        async move { put(&flood, &format!("flood.{i:02}")).await }
    });
    let mut statuses = futures::future::join_all(burst).await;
    statuses.sort_unstable();
    assert_eq!(statuses, [[201; 5].as_slice(), [429; 10].as_slice()].concat());

    // At the cap, every way of creating is refused with 429 and Retry-After: a put, an acquire
    // that creates, a campaign.
    let session = flood.session(60_000).await;
    let refused =
        flood.http.put(format!("{}/v1/semaphores/flood.new", server.url)).json(&json!({ "capacity": 1 }));
    let refused = refused.send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(
        refused.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned()).as_deref(),
        Some("1")
    );
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["error"]["code"], "limit_exceeded", "{body}");
    let acquire = flood.acquire("flood.new", json!({ "session": session, "capacity": 1 })).await;
    assert_eq!((acquire.status, acquire.code()), (429, "limit_exceeded"), "{acquire:?}");
    let campaign =
        flood.post("/v1/elections/flood.e/campaign", json!({ "session": session, "value": "x" })).await;
    assert_eq!((campaign.status, campaign.code()), (429, "limit_exceeded"), "{campaign:?}");
    // Using what exists is no creation: still allowed.
    assert_eq!(flood.acquire("flood.00", json!({ "session": session })).await.status, 200);
    // Another token is not capped by the flood.
    assert_eq!(put(&other, "other.1").await, 201);
    let other_session = other.session(60_000).await;
    assert_eq!(other.acquire("flood.01", json!({ "session": other_session })).await.status, 200);

    // Deleting the flooding token frees what it made that nobody uses; what another token's
    // session holds stays. flood.00 was held by the deleted token's own session: free now, gone.
    assert_eq!(root.send("DELETE", &format!("/v1/acl/tokens/{flood_id}"), None).await.status, 204);
    let names = |list: Value| -> Vec<String> {
        list["semaphores"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(names(root.get("/v1/semaphores").await.body), ["flood.01", "other.1"]);
    // The object still in use counts against nobody now: a new token has its whole cap.
    let (fresh, _) = root.create_token("fresh", &rules).await;
    let fresh = Api::with_token(&server.url, &fresh);
    for i in 0..20 {
        assert_eq!(put(&fresh, &format!("fresh.{i:02}")).await, 201, "fresh.{i}");
    }
    assert_eq!(put(&fresh, "fresh.20").await, 429);
}

#[tokio::test]
async fn lists_show_exactly_what_the_read_rules_allow_page_by_page() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let mut all: Vec<String> =
        ["a.1", "a.2", "a.b.1", "a.b.2", "ab", "b.1", "c.1", "c.10", "c.2", "z"].map(String::from).to_vec();
    all.extend((0..40).map(|i| format!("other.{i:02}")));
    for name in &all {
        assert_eq!(put(&root, name).await, 201);
    }
    let session = root.session(60_000).await;
    for election in ["a.e", "x.e"] {
        let path = format!("/v1/elections/{election}/campaign");
        assert_eq!(root.post(&path, json!({ "session": session, "value": "v" })).await.status, 200);
    }
    // Overlapping prefixes (a. and a.b.), a prefix that is a whole name and more (c.1 covers c.10),
    // and write access, which includes read.
    let (secret, _) = root
        .create_token(
            "reader",
            &["semaphore:a.=read", "semaphore:a.b.=write", "semaphore:c.1=read", "election:a.=read"],
        )
        .await;
    let reader = Api::with_token(&server.url, &secret);
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let path = match &after {
            Some(after) => format!("/v1/semaphores?limit=2&after={after}"),
            None => "/v1/semaphores?limit=2".to_owned(),
        };
        let page = reader.get(&path).await;
        assert_eq!(page.status, 200, "{page:?}");
        let names = page.body["semaphores"].as_array().unwrap();
        assert!(names.len() <= 2);
        seen.extend(names.iter().map(|s| s["name"].as_str().unwrap().to_owned()));
        match page.body["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(seen, ["a.1", "a.2", "a.b.1", "a.b.2", "c.1", "c.10"]);
    let elections = reader.get("/v1/elections").await.body;
    let names: Vec<&str> =
        elections["elections"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a.e"]);
    // A cursor inside a range, and one between ranges.
    let page = reader.get("/v1/semaphores?after=a.b.1").await.body;
    assert_eq!(page["semaphores"].as_array().unwrap().len(), 3, "{page}");
    let page = reader.get("/v1/semaphores?after=b").await.body;
    assert_eq!(page["semaphores"][0]["name"], "c.1", "{page}");
    // No rule for semaphores: nothing, not everything.
    let (blind, _) = root.create_token("blind", &["session:=write"]).await;
    let blind = Api::with_token(&server.url, &blind).get("/v1/semaphores").await.body;
    assert_eq!(blind, json!({ "semaphores": [], "next_after": null }));
    // Root sees every name, in order.
    let mut root_seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..10 {
        let path = match &after {
            Some(after) => format!("/v1/semaphores?limit=20&after={after}"),
            None => "/v1/semaphores?limit=20".to_owned(),
        };
        let page = root.get(&path).await.body;
        root_seen.extend(
            page["semaphores"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap().to_owned()),
        );
        match page["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
    }
    all.sort();
    assert_eq!(root_seen, all);
}

/// The bytes of a backup of the server (`GET /v1/snapshot`, as root).
async fn backup(url: &str) -> Vec<u8> {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let answer = http.get(format!("{url}/v1/snapshot")).bearer_auth(ROOT).send().await.unwrap();
    assert_eq!(answer.status(), 200);
    answer.bytes().await.unwrap().to_vec()
}

#[tokio::test]
async fn a_backup_holds_no_unsalted_hash_of_any_token_secret() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let (secret, _) = root.create_token("ci", &["semaphore:=read"]).await;
    let bytes = backup(&server.url).await;
    for secret in [ROOT, secret.as_str()] {
        let plain = permit_server::auth::secret_hash(None, secret);
        assert!(
            !bytes.windows(32).any(|window| window == plain),
            "a plain SHA-256 of a secret is in the backup"
        );
    }
    // And the secrets still authenticate.
    assert_eq!(Api::with_token(&server.url, &secret).get("/v1/acl/tokens/self").await.status, 200);
    assert_eq!(root.get("/v1/acl/tokens/self").await.body["name"], "root");
}

/// A `permit serve` started by a test with its stderr kept in a file; killed when dropped.
struct Logged {
    child: Child,
    url: String,
    log: std::path::PathBuf,
}

impl Logged {
    fn start(args: &[&str], env: &[(&str, &str)], log: std::path::PathBuf) -> Logged {
        let stderr = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(permit_bin())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn,openraft=off")
            .env_remove("PERMIT_ROOT_TOKEN")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("permit listening on ") {
                    let _ = tx.send(url.split_whitespace().next().unwrap_or("").to_owned());
                }
            }
        });
        let mut logged = Logged { child, url: String::new(), log };
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(url) => logged.url = url,
            Err(_) => panic!("no address; stderr: {}", logged.stderr()),
        }
        logged
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_restore_applies_the_configured_root_secret_and_names_every_token_it_brings_back() {
    let (mut old, temp) = secured(&[]).await;
    let root = Api::with_token(&old.url, ROOT);
    let (kept, kept_id) = root.create_token("kept", &["semaphore:=read"]).await;
    let (revived, revived_id) = root.create_token("revived", &["semaphore:=read"]).await;
    let file = temp.path().join("permit.backup");
    std::fs::write(&file, backup(&old.url).await).unwrap();
    // Deleted after the backup: the restore brings it back, and must say so.
    assert_eq!(root.send("DELETE", &format!("/v1/acl/tokens/{revived_id}"), None).await.status, 204);
    old.kill9();

    let new_root = "a-new-root-secret-after-the-leak-0123456789abcdef";
    let restore = file.to_str().unwrap();
    let data = temp.path().join("restored");
    let server = Logged::start(
        &["--auth", "--restore", restore, "--data-dir", data.to_str().unwrap()],
        &[("PERMIT_ROOT_TOKEN", new_root)],
        temp.path().join("restore.log"),
    );
    let root = Api::with_token(&server.url, new_root);
    let me = root.get("/v1/acl/tokens/self").await;
    assert_eq!((me.status, me.body["id"].as_str()), (200, Some("0".repeat(32).as_str())), "{me:?}");
    let old_root = Api::with_token(&server.url, ROOT).get("/v1/acl/tokens/self").await;
    assert_eq!(old_root.status, 401, "the backup's root secret must stop working");
    assert_eq!(Api::with_token(&server.url, &kept).get("/v1/acl/tokens/self").await.status, 200);
    assert_eq!(Api::with_token(&server.url, &revived).get("/v1/acl/tokens/self").await.status, 200);
    let said = eventually(Duration::from_secs(5), async || {
        let log = server.stderr();
        log.contains(&format!("brought back token {revived_id} (revived)")) && log.contains(&kept_id)
    })
    .await;
    assert!(said, "the restore does not name the tokens it brought back:\n{}", server.stderr());
    // The operator deletes it, as the log says.
    assert_eq!(root.send("DELETE", &format!("/v1/acl/tokens/{revived_id}"), None).await.status, 204);
    assert_eq!(Api::with_token(&server.url, &revived).get("/v1/acl/tokens/self").await.status, 401);
}

/// A backup as a cluster made before token salts wrote it: snapshot format 2, every token
/// stored under the plain SHA-256 of its secret, no salt. Built from a backup of `url` whose
/// tokens' secrets are `secrets` (by token name).
async fn backup_before_salts(url: &str, secrets: &[(&str, &str)]) -> Vec<u8> {
    use permit_core::{Kind, State};
    use permit_server::raft::snapshot_store;
    let (meta, bytes) = snapshot_store::decode(&backup(url).await).unwrap();
    let state = State::decode_snapshot(&bytes).unwrap();
    let objects: Vec<_> = [Kind::Semaphore, Kind::Election]
        .into_iter()
        .flat_map(|kind| state.objects_after(kind, None).map(|(key, object)| (key.clone(), object.clone())))
        .collect();
    let tokens: Vec<_> = state
        .tokens()
        .map(|(id, token)| {
            let secret = secrets.iter().find(|(name, _)| *name == token.name).expect("a known token").1;
            let mut token = token.clone();
            token.secret_hash = permit_server::auth::secret_hash(None, secret);
            (*id, token)
        })
        .collect();
    let ephemeral: Vec<_> =
        objects.iter().map(|(key, _)| key.clone()).filter(|key| state.is_ephemeral(key)).collect();
    // Version 2's fields, one after the other: sessions, objects, last token, time, applied
    // index, tokens, whether the root was created, ephemeral semaphores.
    let v2 = (
        state.sessions().map(|(id, session)| (*id, session.clone())).collect::<Vec<_>>(),
        objects,
        state.last_token(),
        state.now_ms(),
        state.applied_index(),
        tokens,
        state.root_created(),
        ephemeral,
    );
    let state_bytes = postcard::to_extend(&v2, vec![2]).unwrap();
    snapshot_store::encode(&meta, &state_bytes).unwrap()
}

/// Whether the server's replicated state (as a backup shows it) has a token salt.
async fn has_salt(url: &str) -> bool {
    let (_, state) = permit_server::raft::snapshot_store::decode(&backup(url).await).unwrap();
    assert_eq!(state[0], permit_core::SNAPSHOT_FORMAT_VERSION);
    permit_core::State::decode_snapshot(&state).unwrap().token_salt().is_some()
}

#[tokio::test]
async fn tokens_stored_unsalted_before_the_upgrade_keep_working_and_new_ones_are_salted() {
    let (mut old, temp) = secured(&[]).await;
    let root = Api::with_token(&old.url, ROOT);
    let (ci, _) = root.create_token("ci", &["semaphore:=admin"]).await;
    assert_eq!(put(&Api::with_token(&old.url, &ci), "db").await, 201);
    let file = temp.path().join("old.backup");
    std::fs::write(&file, backup_before_salts(&old.url, &[("root", ROOT), ("ci", &ci)]).await).unwrap();
    old.kill9();

    // Restored without a configured root secret: every old token keeps its plain hash and
    // authenticates by it; the new leader gives the cluster a salt, and tokens made from then
    // on are stored under it.
    let restore = file.to_str().unwrap();
    let data = temp.path().join("upgraded");
    let server = Logged::start(
        &["--auth", "--restore", restore, "--data-dir", data.to_str().unwrap()],
        &[],
        temp.path().join("upgraded.log"),
    );
    let root = Api::with_token(&server.url, ROOT);
    assert_eq!(root.get("/v1/acl/tokens/self").await.body["name"], "root", "{}", server.stderr());
    let ci = Api::with_token(&server.url, &ci);
    assert_eq!(ci.get("/v1/semaphores/db").await.status, 200);
    let salted = eventually(Duration::from_secs(10), async || has_salt(&server.url).await).await;
    assert!(salted, "the upgraded cluster got no salt");
    let (fresh, _) = root.create_token("fresh", &["semaphore:=read"]).await;
    assert_eq!(Api::with_token(&server.url, &fresh).get("/v1/semaphores/db").await.status, 200);
    let plain = permit_server::auth::secret_hash(None, &fresh);
    let bytes = backup(&server.url).await;
    assert!(!bytes.windows(32).any(|window| window == plain), "a token made after the upgrade is unsalted");
    // The old tokens still authenticate once the salt is there.
    assert_eq!(ci.get("/v1/semaphores/db").await.status, 200);
    assert_eq!(root.get("/v1/acl/tokens/self").await.status, 200);
}
