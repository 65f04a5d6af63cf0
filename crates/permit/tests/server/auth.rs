//! `permit serve --auth`: tokens, rules, session ownership, per-token limits, and the route matrix.

use std::path::Path;
use std::time::Duration;

use permit_server::auth::{need, Need};
use serde_json::{json, Value};

use crate::common::{eventually, Server};
use crate::Api;

/// The root secret the tests start servers with.
pub(crate) const ROOT: &str = "root-secret-for-tests-0123456789abcdef";

/// A server with `--auth` whose root token is [`ROOT`], once the root token exists.
pub(crate) async fn secured(extra: &[&str]) -> (Server, tempfile::TempDir) {
    let temp = tempfile::tempdir().unwrap();
    let file = temp.path().join("root.secret");
    std::fs::write(&file, format!("{ROOT}\n")).unwrap();
    let mut args = vec!["--auth", "--root-token-file", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let server = Server::start_in(&temp.path().join("data"), "127.0.0.1:0", &args);
    let root = Api::with_token(&server.url, ROOT);
    let ready =
        eventually(Duration::from_secs(10), async || root.get("/v1/acl/tokens/self").await.status == 200)
            .await;
    assert!(ready, "the root token was not created");
    (server, temp)
}

/// Creates a token with `rules` (as `RESOURCE:PREFIX=ACCESS`) and returns its secret and id.
pub(crate) async fn token(root: &Api, name: &str, rules: &[&str]) -> (String, String) {
    root.create_token(name, rules).await
}

/// The callers of the matrix and the access each has per resource (`None`: no rule).
struct Caller {
    label: &'static str,
    api: Api,
    /// `None`: not authenticated at all.
    access: Option<fn(&str) -> Option<u8>>,
}

fn level(access: &str) -> u8 {
    match access {
        "read" => 1,
        "write" => 2,
        _ => 3,
    }
}

/// The route's template, method and a concrete path for it.
fn routes(spec: &Value) -> Vec<(String, String, String)> {
    let mut routes = Vec::new();
    for (template, item) in spec["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            let concrete = template
                .replace("{name}", "matrix.x")
                .replace("/v1/sessions/{id}", "/v1/sessions/0123456789abcdef0123456789abcdef")
                .replace("/v1/acl/tokens/{id}", "/v1/acl/tokens/ffffffffffffffffffffffffffffffff")
                .replace("{id}", "9");
            routes.push((method.to_uppercase(), template.clone(), concrete));
        }
    }
    // Routes outside the spec that clients can still reach.
    routes.push(("GET".into(), "/metrics".into(), "/metrics".into()));
    routes.push(("GET".into(), "/ui".into(), "/ui".into()));
    routes.push(("GET".into(), "/ui/{file}".into(), "/ui/app.js".into()));
    routes
}

#[tokio::test]
async fn every_route_answers_each_kind_of_caller_as_its_rule_says() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let (reader, _) = token(
        &root,
        "reader",
        &["semaphore:=read", "election:=read", "session:=read", "cluster:=read", "queue:=read"],
    )
    .await;
    let (writer, _) =
        token(&root, "writer", &["semaphore:=write", "election:=write", "session:=write"]).await;
    let (admin, _) = token(
        &root,
        "admin",
        &["semaphore:=admin", "election:=admin", "session:=admin", "cluster:=admin", "queue:=admin"],
    )
    .await;
    let callers = [
        Caller { label: "no token", api: Api::at(&server.url), access: None },
        Caller { label: "unknown token", api: Api::with_token(&server.url, "not-a-token"), access: None },
        Caller {
            label: "read-only",
            api: Api::with_token(&server.url, &reader),
            access: Some(|resource| (resource != "acl").then_some(1)),
        },
        Caller {
            label: "write",
            api: Api::with_token(&server.url, &writer),
            access: Some(|resource| matches!(resource, "semaphore" | "election" | "session").then_some(2)),
        },
        Caller {
            label: "admin",
            api: Api::with_token(&server.url, &admin),
            access: Some(|resource| (resource != "acl").then_some(3)),
        },
        Caller { label: "root", api: root.clone(), access: Some(|_| Some(3)) },
    ];
    let spec = Api::at(&server.url).get("/v1/openapi.json").await.body;
    let routes = routes(&spec);
    assert!(routes.len() >= 25, "the spec lists every route: {}", routes.len());
    let mut checked = 0;
    for (method, template, path) in &routes {
        let method_type = axum_method(method);
        let rule = need(&method_type, template, false)
            .unwrap_or_else(|| panic!("{method} {template} has no access rule in permit_server::auth::need"));
        for caller in &callers {
            let body = matches!(method.as_str(), "POST" | "PUT").then(|| json!({}));
            // The event stream never ends: an unknown kind makes it answer (400) once past
            // authorisation.
            let path = if template == "/v1/events" { "/v1/events?kinds=none" } else { path.as_str() };
            let answer = caller.api.send(method, path, body).await;
            let expected = expectation(rule, caller.access);
            let ok = match expected {
                Expect::Status(status) => answer.status == status,
                Expect::Passes => answer.status != 401 && answer.status != 403,
            };
            assert!(ok, "{method} {path} as {}: expected {expected:?}, got {answer:?}", caller.label);
            checked += 1;
        }
    }
    assert_eq!(checked, routes.len() * callers.len());
}

#[derive(Debug, Clone, Copy)]
enum Expect {
    Status(u16),
    /// Past authorisation: any answer but 401 and 403 (the empty body then fails validation).
    Passes,
}

fn expectation(rule: Need, access: Option<fn(&str) -> Option<u8>>) -> Expect {
    let needed = match rule {
        Need::Open => return Expect::Passes,
        Need::Authenticated => None,
        // The matrix sends `{}`: a body name defaults to "", as a global check does.
        Need::Named(resource, access) | Need::Global(resource, access) | Need::InBody(resource, access) => {
            Some((resource.as_str(), level(access.as_str())))
        }
    };
    let Some(access) = access else { return Expect::Status(401) };
    match needed {
        None => Expect::Passes,
        Some((resource, level)) if access(resource).is_some_and(|have| have >= level) => Expect::Passes,
        Some(_) => Expect::Status(403),
    }
}

fn axum_method(method: &str) -> reqwest::Method {
    reqwest::Method::from_bytes(method.as_bytes()).unwrap()
}

#[tokio::test]
async fn a_session_belongs_to_the_token_that_created_it() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let rules = ["semaphore:=write", "election:=write", "session:=write"];
    let alice = Api::with_token(&server.url, &token(&root, "alice", &rules).await.0);
    let mallory = Api::with_token(&server.url, &token(&root, "mallory", &rules).await.0);
    let session = alice.session(10_000).await;
    let granted = alice.acquire("db.lock", json!({ "session": session, "capacity": 1 })).await;
    assert_eq!(granted.status, 200, "{granted:?}");
    let campaign =
        alice.post("/v1/elections/lead/campaign", json!({ "session": session, "value": "a" })).await;
    assert_eq!(campaign.status, 200, "{campaign:?}");

    // Mallory sees the session id in a GET of the semaphore (she may read it), but it grants her
    // nothing.
    let view = mallory.get("/v1/semaphores/db.lock").await;
    assert_eq!(view.body["holders"][0]["session"], session.as_str());
    let attempts = [
        mallory.post(&format!("/v1/sessions/{session}/keepalive"), json!(null)).await,
        mallory.send("DELETE", &format!("/v1/sessions/{session}"), None).await,
        mallory.release("db.lock", &session).await,
        mallory.acquire("db.other", json!({ "session": session, "capacity": 1 })).await,
        mallory.post("/v1/elections/lead/resign", json!({ "session": session })).await,
        mallory.post("/v1/elections/other/campaign", json!({ "session": session, "value": "m" })).await,
        mallory.post("/v1/elections/lead/proclaim", json!({ "session": session, "value": "m" })).await,
    ];
    for answer in attempts {
        assert_eq!((answer.status, answer.code()), (403, "permission_denied"), "{answer:?}");
    }
    // Nothing changed: alice still holds and leads, and her session lives.
    assert_eq!(alice.holders("db.lock").await, vec![session.clone()]);
    let leader = alice.get("/v1/elections/lead").await;
    assert_eq!(leader.body["leader"]["session"], session.as_str());
    assert_eq!(leader.body["leader"]["value"], "a");
    assert_eq!(alice.post(&format!("/v1/sessions/{session}/keepalive"), json!(null)).await.status, 200);

    // Nor through a batch: mallory's own session is renewed, alice's is refused alone.
    let mine = mallory.session(10_000).await;
    let batch = mallory.post("/v1/sessions/keepalive", json!({ "sessions": [mine, session] })).await;
    assert_eq!(batch.status, 200, "{batch:?}");
    assert_eq!(batch.body["sessions"][0]["ttl_ms"], 10_000, "{batch:?}");
    assert_eq!(batch.body["sessions"][1]["id"], session.as_str());
    assert_eq!(batch.body["sessions"][1]["error"]["code"], "permission_denied", "{batch:?}");
    assert!(batch.body["sessions"][1].get("ttl_ms").is_none());
    let batch = alice.post("/v1/sessions/keepalive", json!({ "sessions": [session] })).await;
    assert_eq!(batch.body["sessions"][0]["ttl_ms"], 10_000, "{batch:?}");

    // An admin may end the hold (revoke); a writer may not.
    let revoke = json!({ "session": session });
    assert_eq!(mallory.post("/v1/semaphores/db.lock/revoke", revoke.clone()).await.status, 403);
    let revoked = root.post("/v1/semaphores/db.lock/revoke", revoke.clone()).await;
    assert_eq!((revoked.status, revoked.body["released"].as_u64()), (200, Some(1)), "{revoked:?}");
    assert!(alice.holders("db.lock").await.is_empty());
    let revoked = root.post("/v1/elections/lead/revoke", revoke).await;
    assert_eq!(revoked.status, 200, "{revoked:?}");
    assert!(alice.get("/v1/elections/lead").await.body["leader"].is_null());
}

#[tokio::test]
async fn prefix_rules_decide_per_name_and_lists_show_only_readable_names() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    root.semaphore("db.orders", 2).await;
    root.semaphore("db.prod.ledger", 2).await;
    root.semaphore("gpu", 2).await;
    let ci = Api::with_token(
        &server.url,
        &token(&root, "ci", &["semaphore:db.=write", "semaphore:db.prod.=read", "session:=write"]).await.0,
    );
    let session = ci.session(10_000).await;
    assert_eq!(ci.acquire("db.orders", json!({ "session": session })).await.status, 200);
    let denied = ci.acquire("db.prod.ledger", json!({ "session": session })).await;
    assert_eq!((denied.status, denied.code()), (403, "permission_denied"));
    assert!(denied.body["error"]["message"].as_str().unwrap().contains("write"), "{denied:?}");
    assert_eq!(ci.get("/v1/semaphores/db.prod.ledger").await.status, 200);
    assert_eq!(ci.get("/v1/semaphores/gpu").await.status, 403);
    assert_eq!(ci.send("PUT", "/v1/semaphores/db.orders", Some(json!({ "capacity": 9 }))).await.status, 403);
    let names: Vec<String> = ci.get("/v1/semaphores").await.body["semaphores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["db.orders", "db.prod.ledger"]);
    let own = ci.get("/v1/sessions").await.body;
    assert_eq!(own["sessions"].as_array().unwrap().len(), 1, "only its own session: {own}");
    root.session(10_000).await;
    assert_eq!(root.get("/v1/sessions").await.body["sessions"].as_array().unwrap().len(), 2);
    assert_eq!(ci.get("/v1/acl/tokens").await.status, 403);
    assert_eq!(ci.get("/v1/acl/tokens/self").await.body["name"], "ci");
}

#[tokio::test]
async fn deleting_a_token_refuses_it_at_once_and_frees_its_sessions_permits() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let rules = ["semaphore:=write", "session:=write"];
    let (secret, id) = token(&root, "doomed", &rules).await;
    let doomed = Api::with_token(&server.url, &secret);
    let other = Api::with_token(&server.url, &token(&root, "other", &rules).await.0);
    let held = doomed.session(60_000).await;
    assert_eq!(doomed.acquire("one", json!({ "session": held, "capacity": 1 })).await.status, 200);
    let waiter = other.session(60_000).await;
    let queued = other.acquire("one", json!({ "session": waiter, "wait_ms": 0 })).await;
    assert_eq!(queued.code(), "unavailable");

    assert_eq!(root.send("DELETE", &format!("/v1/acl/tokens/{id}"), None).await.status, 204);
    let refused = doomed.get("/v1/semaphores/one").await;
    assert_eq!((refused.status, refused.code()), (401, "unauthenticated"));
    // The session is gone, its permit free; and the semaphore it created, which nobody uses
    // now, is gone with it (docs/security.md): another token creates it again and takes it.
    assert_eq!(root.get(&format!("/v1/sessions/{held}")).await.code(), "session_not_found");
    assert_eq!(root.get("/v1/semaphores/one").await.code(), "semaphore_not_found");
    assert_eq!(other.acquire("one", json!({ "session": waiter, "capacity": 1 })).await.status, 200);
    let again = root.send("DELETE", &format!("/v1/acl/tokens/{id}"), None).await;
    assert_eq!((again.status, again.code()), (404, "token_not_found"));
    let listed = root.get("/v1/acl/tokens").await.body;
    let names: Vec<&str> =
        listed["tokens"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2, "root and other: {names:?}");
    assert!(!listed.to_string().contains(&secret), "secrets are never listed");
}

#[tokio::test]
async fn per_token_caps_answer_429_with_retry_after_and_spare_other_tokens() {
    let (server, _temp) =
        secured(&["--sessions-per-token-max", "3", "--long-polls-per-token-max", "1"]).await;
    let root = Api::with_token(&server.url, ROOT);
    let rules = ["semaphore:=write", "session:=write"];
    let greedy = Api::with_token(&server.url, &token(&root, "greedy", &rules).await.0);
    let polite = Api::with_token(&server.url, &token(&root, "polite", &rules).await.0);
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(greedy.session(10_000).await);
    }
    let capped = greedy.post("/v1/sessions", json!({})).await;
    assert_eq!((capped.status, capped.code()), (429, "limit_exceeded"), "{capped:?}");
    let retry_after = greedy
        .http
        .post(format!("{}/v1/sessions", server.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(polite.post("/v1/sessions", json!({})).await.status, 201, "another token is not capped");

    // One long-poll at a time: a second blocking acquire of the same token is refused.
    assert_eq!(greedy.acquire("one", json!({ "session": sessions[0], "capacity": 1 })).await.status, 200);
    let waiting = {
        let greedy = greedy.clone();
        let session = sessions[1].clone();
        tokio::spawn(
            async move { greedy.acquire("one", json!({ "session": session, "wait_ms": 5000 })).await },
        )
    };
    let blocked = eventually(Duration::from_secs(5), async || {
        let view = root.get("/v1/semaphores/one").await;
        view.body["waiters"].as_array().is_some_and(|w| w.len() == 1)
    })
    .await;
    assert!(blocked);
    let second = greedy.acquire("one", json!({ "session": sessions[2], "wait_ms": 5000 })).await;
    assert_eq!((second.status, second.code()), (429, "limit_exceeded"), "{second:?}");
    assert_eq!(greedy.release("one", &sessions[0]).await.status, 200);
    assert_eq!(waiting.await.unwrap().status, 200, "the first long-poll was granted");
}

#[tokio::test]
async fn without_a_token_only_health_and_the_spec_answer() {
    let (server, temp) = secured(&[]).await;
    let anonymous = Api::at(&server.url);
    assert_eq!(anonymous.get("/v1/health").await.status, 200);
    assert_eq!(anonymous.get("/v1/openapi.json").await.status, 200);
    for path in ["/v1/semaphores", "/metrics", "/v1/cluster", "/v1/debug/digest"] {
        let answer = anonymous.get(path).await;
        assert_eq!((answer.status, answer.code()), (401, "unauthenticated"), "{path}");
    }
    let malformed = Api::with_token(&server.url, "").get("/v1/semaphores").await;
    assert_eq!(malformed.status, 401);
    assert!(
        !temp.path().join("data/root-token").exists(),
        "a configured root secret is not written anywhere"
    );
}

#[tokio::test]
async fn a_generated_root_secret_lands_in_a_private_file_in_the_data_dir() {
    let temp = tempfile::tempdir().unwrap();
    let server = Server::start_in(&temp.path().join("data"), "127.0.0.1:0", &["--auth"]);
    let file = temp.path().join("data/root-token");
    let written = eventually(Duration::from_secs(10), async || secret_in(&file).is_some()).await;
    assert!(written, "no root-token file");
    let secret = secret_in(&file).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    let root = Api::with_token(&server.url, &secret);
    let me =
        eventually(Duration::from_secs(10), async || root.get("/v1/acl/tokens/self").await.status == 200);
    assert!(me.await);
    assert_eq!(root.get("/v1/acl/tokens/self").await.body["id"], "0".repeat(32));
}

fn secret_in(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let secret = text.trim();
    (secret.len() >= 32).then(|| secret.to_owned())
}

#[tokio::test]
async fn listening_beyond_loopback_without_auth_must_be_explicit() {
    let temp = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(crate::common::permit_bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(temp.path().join("data"))
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--allow-unauthenticated"), "{stderr}");
}

/// Runs `permit serve ARGS` with `env` in a fresh data dir until it exits (at most 30 s: a
/// server that keeps running fails the test); its exit status and stderr.
fn serve_until_exit(args: &[&str], env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    use std::io::Read;
    let temp = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(crate::common::permit_bin())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(temp.path().join("data"))
        .args(args)
        .env("RUST_LOG", "error")
        .env_remove("PERMIT_ROOT_TOKEN")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("permit serve {args:?} {env:?} started: the secret was accepted");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (status, stderr)
}

/// An operator's secret a guesser could find (`passwordpassword`, 16 characters, was accepted)
/// is refused at start with a message that says why and how to make one, never the secret.
#[test]
fn guessable_root_and_cluster_secrets_are_refused_at_start() {
    let temp = tempfile::tempdir().unwrap();
    let weak = temp.path().join("weak.secret");
    std::fs::write(&weak, "passwordpassword\n").unwrap();
    let weak_arg = weak.to_str().unwrap();
    for (args, env) in [
        (&["--auth"][..], &[("PERMIT_ROOT_TOKEN", "passwordpassword")][..]),
        (&["--auth", "--root-token-file", weak_arg][..], &[][..]),
        (&["--auth"][..], &[("PERMIT_ROOT_TOKEN", "0123456789abcdef0123456789abcdef")][..]),
    ] {
        let (status, stderr) = serve_until_exit(args, env);
        assert!(!status.success(), "{args:?}");
        assert!(
            stderr.contains("the root token's secret") && stderr.contains("too easy to guess"),
            "{stderr}"
        );
        assert!(stderr.contains("openssl rand -hex 32"), "{stderr}");
        assert!(!stderr.contains("password"), "the secret is never printed: {stderr}");
    }
    let (status, stderr) = serve_until_exit(&["--join", "--cluster-secret-file", weak_arg], &[]);
    assert!(!status.success());
    assert!(stderr.contains("the cluster secret") && stderr.contains("too easy to guess"), "{stderr}");
    // 32 random hex digits are enough.
    let good = "3f9a1c0e7b52d4869e0f3a7c1b5d2e84";
    let root = Server::start_with_env(
        &temp.path().join("data"),
        "127.0.0.1:0",
        &["--auth"],
        &[("PERMIT_ROOT_TOKEN", good)],
    );
    drop(root);
}

#[tokio::test]
async fn the_event_stream_shows_a_token_only_what_it_may_read() {
    let (server, _temp) = secured(&[]).await;
    let root = Api::with_token(&server.url, ROOT);
    let (reader, _) = token(&root, "reader", &["semaphore:pub.=read"]).await;
    let reader = Api::with_token(&server.url, &reader);
    assert_eq!(Api::at(&server.url).get("/v1/events?kinds=granted").await.status, 401);
    let mut stream = crate::observability::Sse::open(&reader, "/v1/events", None).await;
    let session = root.session(30_000).await;
    for name in ["secret.a", "pub.b"] {
        let answer = root.acquire(name, json!({ "session": session, "capacity": 1 })).await;
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    // The session's creation and the secret semaphore's events are not shown: the first frame
    // is pub.b's.
    let first = stream.next(Duration::from_secs(5)).await.expect("a frame");
    assert_eq!((first.event.as_str(), first.data["name"].as_str()), ("capacity_changed", Some("pub.b")));
    let second = stream.next(Duration::from_secs(5)).await.expect("a frame");
    assert_eq!((second.event.as_str(), second.data["name"].as_str()), ("granted", Some("pub.b")));
}
