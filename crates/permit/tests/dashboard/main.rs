//! The dashboard (`/ui`) in a real headless Chromium against a real `permit serve --auth` with
//! live activity: what it shows (the node's history of a semaphore from before the page opened,
//! election leaders, the node and its role), how fast an outside change appears, links between
//! sessions and holds, sorting and filtering, admin actions, a read-only token, and the
//! browser's log. Screenshots go to `target/dashboard-screenshots/`.
//!
//! Needs Debian's `chromium` and `chromium-driver`; without them the test is skipped, unless
//! `PERMIT_REQUIRE_BROWSER=1`.

#[path = "../common/mod.rs"]
mod common;

mod browser;

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use browser::Browser;
use common::api::Api;
use common::require::{or_skip, Need};
use common::{eventually, Server};

/// The root secret of the server under test.
const ROOT: &str = "root-secret-for-dashboard-tests-0123456789";
/// How long the page may take to show a change made outside it.
const LIVE_WITHIN: Duration = Duration::from_secs(1);
/// How long the screenshots' semaphore sees churn before it is photographed.
const CHURN: Duration = Duration::from_secs(6);
/// How long the page may take to show anything else (a first load, a login).
const SHOW_WITHIN: Duration = Duration::from_secs(10);

/// What the page shows, read from its DOM.
const READ_PAGE: &str = r"
const rows = (id) => [...document.querySelectorAll('#' + id + ' tbody tr')]
  .map((row) => [...row.cells].map((cell) => cell.textContent.trim()));
const text = (id) => { const el = document.getElementById(id); return el ? el.textContent.trim() : null; };
return {
  holders: rows('holders'), queue: rows('queue'), semaphores: rows('semaphores'),
  elections: rows('elections'), sessions: rows('sessions'), members: rows('members'),
  items: rows('items'), queues: rows('queues'),
  capacity: text('capacity'), held: text('held'), error: text('view-error'), policy: text('policy'),
  session_holds: rows('session-holds'), semaphore_name: text('semaphore-name'), session_name: text('session-name'),
  node: [text('node-id'), text('node-addr'), text('node-role')],
  chart_points: Number((document.getElementById('chart') || { dataset: {} }).dataset.points || 0),
  chart_first: Number((document.getElementById('chart') || { dataset: {} }).dataset.first || 0),
  grants: [...document.querySelectorAll('.grants')].map((g) => Number(g.dataset.total)),
  opened: performance.timeOrigin,
  login: !document.getElementById('login').hidden,
  admin: !!document.getElementById('admin'), revoke: document.querySelectorAll('.revoke').length,
  live: document.getElementById('live').dataset.mode,
};";

async fn page(browser: &Browser) -> Value {
    browser.eval(READ_PAGE).await
}

/// Polls the page until `check` holds, for at most `within`; the last reading either way.
async fn until(browser: &Browser, within: Duration, check: impl Fn(&Value) -> bool) -> (bool, Value) {
    let deadline = Instant::now() + within;
    loop {
        let shown = page(browser).await;
        if check(&shown) {
            return (true, shown);
        }
        if Instant::now() >= deadline {
            return (false, shown);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Rows of a table as (session name, permits, token) for holders.
fn holders(shown: &Value) -> Vec<(String, String, String)> {
    let rows = shown["holders"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .map(|r| {
            (r[0].as_str().unwrap().into(), r[2].as_str().unwrap().into(), r[3].as_str().unwrap().into())
        })
        .collect()
}

/// Queue rows as (position, session name, permits).
fn queue(shown: &Value) -> Vec<(String, String, String)> {
    let rows = shown["queue"].as_array().cloned().unwrap_or_default();
    rows.iter()
        .map(|r| {
            (r[0].as_str().unwrap().into(), r[1].as_str().unwrap().into(), r[3].as_str().unwrap().into())
        })
        .collect()
}

fn row(name: &str, permits: u64, token: u64) -> (String, String, String) {
    (name.into(), permits.to_string(), token.to_string())
}

/// Creates a token with `rules` (`RESOURCE:PREFIX=ACCESS`) and returns its secret.
async fn token(root: &Api, name: &str, rules: &[&str]) -> String {
    root.create_token(name, rules).await.0
}

/// A named session of the root token.
async fn session(root: &Api, name: &str) -> String {
    let answer = root.post("/v1/sessions", json!({ "ttl_ms": 60_000, "name": name })).await;
    assert_eq!(answer.status, 201, "{answer:?}");
    answer.body["id"].as_str().unwrap().to_owned()
}

async fn acquire(root: &Api, name: &str, session: &str, permits: u64) -> u64 {
    let answer = root.acquire(name, json!({ "session": session, "permits": permits })).await;
    assert_eq!((answer.status, &answer.body["status"]), (200, &json!("acquired")), "{answer:?}");
    answer.body["token"].as_u64().unwrap()
}

/// Logs in on the page with `secret` (it is kept in sessionStorage for the tab).
async fn log_in(browser: &Browser, secret: &str) {
    let (shown, page) = until(browser, SHOW_WITHIN, |p| p["login"] == true).await;
    assert!(shown, "no login form: {page}");
    browser.type_into("#token", secret).await;
    browser.click("#login button[type=submit]").await;
}

#[tokio::test]
async fn the_dashboard_shows_live_state_and_admin_actions_to_those_allowed() {
    let Some(()) = or_skip(Need::Browser, browser::available()) else { return };
    let started = Instant::now();
    let temp = tempfile::tempdir().unwrap();
    let root_file = temp.path().join("root.secret");
    std::fs::write(&root_file, ROOT).unwrap();
    let server = Server::start_in(
        &temp.path().join("data"),
        "127.0.0.1:0",
        &["--auth", "--root-token-file", root_file.to_str().unwrap()],
    );
    let root = Api::with_token(&server.url, ROOT);
    let ready = eventually(SHOW_WITHIN, async || root.get("/v1/acl/tokens/self").await.status == 200).await;
    assert!(ready, "the root token was not created");
    let admin =
        token(&root, "ops-admin", &["semaphore:=admin", "election:=read", "session:=admin", "cluster:=read"])
            .await;
    let reader =
        token(&root, "viewer", &["semaphore:=read", "election:=read", "session:=read", "cluster:=read"])
            .await;

    // Live activity: worker-1 holds 2 of 3; an election has a leader.
    root.semaphore("gpu", 3).await;
    root.semaphore("db.lock", 1).await;
    let worker = [
        session(&root, "worker-1").await,
        session(&root, "worker-2").await,
        session(&root, "worker-3").await,
        session(&root, "worker-4").await,
    ];
    let t1 = acquire(&root, "gpu", &worker[0], 2).await;
    let campaign = root
        .post("/v1/elections/scheduler/campaign", json!({ "session": worker[0], "value": "host-a:8080" }))
        .await;
    assert_eq!(campaign.status, 200, "{campaign:?}");

    let browser = Browser::start(1280, 900).await;
    let shots = browser::artifacts_dir();
    browser.goto(&format!("{}/ui#/semaphore/gpu", server.url)).await;
    log_in(&browser, &admin).await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| holders(p) == [row("worker-1", 2, t1)]).await;
    assert!(shown, "the holder is not shown: {now}");
    assert_eq!(now["capacity"], "3");

    // A fresh page shows the node's history: chart points from before the page opened, and the
    // grant made before it in the grants per second.
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| {
        p["chart_first"].as_f64().is_some_and(|first| first > 0.0 && first < p["opened"].as_f64().unwrap())
    })
    .await;
    assert!(shown, "the chart has no point from before the page opened: {now}");
    assert_eq!(now["grants"], json!([1]), "the grant made before the page opened: {now}");

    // The header names the node, its address and its Raft role.
    let health = root.get("/v1/health").await.body;
    let cluster = root.get("/v1/cluster").await.body;
    let expected_node =
        json!([format!("node {}", health["node_id"]), cluster["members"][0]["addr"], "leader"]);
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| p["node"] == expected_node).await;
    assert!(shown, "the header does not name the node ({expected_node}): {now}");
    let (live, now) = until(&browser, SHOW_WITHIN, |p| p["live"] == "events").await;
    assert!(live, "the page did not connect to the event stream: {now}");

    // An acquire made outside the page appears within a second, without a reload.
    browser.eval("window.__marker = 'no reload'; return null;").await;
    let t2 = acquire(&root, "gpu", &worker[1], 1).await;
    let acquired_at = Instant::now();
    let (shown, now) = until(&browser, LIVE_WITHIN, |p| holders(p).contains(&row("worker-2", 1, t2))).await;
    assert!(shown, "the acquire did not appear within {LIVE_WITHIN:?} ({:?}): {now}", acquired_at.elapsed());
    eprintln!("an outside acquire appeared on the page after {:?}", acquired_at.elapsed());
    assert_eq!(browser.eval("return window.__marker;").await, "no reload");

    // Waiters appear in FIFO order (worker-4 wants 1 and 0 are free; it waits behind worker-3).
    let mut waits = Vec::new();
    for (session, permits) in [(&worker[2], 2), (&worker[3], 1)] {
        let api = root.clone();
        let body = json!({ "session": session, "permits": permits, "wait_ms": 30_000 });
        waits.push(tokio::spawn(async move { api.acquire("gpu", body).await }));
        let queued = eventually(SHOW_WITHIN, async || {
            root.get("/v1/semaphores/gpu").await.body["waiters"]
                .as_array()
                .is_some_and(|w| w.iter().any(|w| w["session"] == session.as_str()))
        })
        .await;
        assert!(queued, "{session} did not queue");
    }
    let expected_queue = [
        ("1".to_string(), "worker-3".to_string(), "2".to_string()),
        ("2".into(), "worker-4".into(), "1".into()),
    ];
    let (shown, now) = until(&browser, LIVE_WITHIN, |p| queue(p) == expected_queue).await;
    assert!(shown, "the queue is not shown in order: {now}");
    for waiter in now["queue"].as_array().unwrap() {
        let waited = waiter[4].as_str().unwrap();
        assert!(
            waited.ends_with('s') && waited[..waited.len() - 1].parse::<u64>().is_ok(),
            "time waiting: {waited}"
        );
    }
    browser.screenshot(&shots.join("semaphore-admin.png")).await;

    // Admin action: capacity 3 -> 5 grants worker-3 its 2 permits; worker-4 still waits.
    browser.type_into("#capacity-input", "5").await;
    browser.click("#set-capacity").await;
    let granted = waits.remove(0).await.unwrap();
    assert_eq!(granted.body["status"], "acquired", "{granted:?}");
    let t3 = granted.body["token"].as_u64().unwrap();
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| {
        p["capacity"] == "5" && holders(p).contains(&row("worker-3", 2, t3)) && queue(p).len() == 1
    })
    .await;
    assert!(shown, "the new capacity and grant are not shown: {now}");
    assert_eq!(root.get("/v1/semaphores/gpu").await.body["capacity"], 5);

    // Admin action: revoke worker-1's hold; worker-4 is granted in its place.
    browser.click(&format!(".revoke[data-session='{}']", worker[0])).await;
    browser.accept_alert().await;
    let granted = waits.remove(0).await.unwrap();
    assert_eq!(granted.body["status"], "acquired", "{granted:?}");
    let t4 = granted.body["token"].as_u64().unwrap();
    assert!(!root.holders("gpu").await.contains(&worker[0]), "worker-1 still holds");
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| {
        let h = holders(p);
        !h.iter().any(|(name, _, _)| name == "worker-1")
            && h.contains(&row("worker-4", 1, t4))
            && queue(p).is_empty()
    })
    .await;
    assert!(shown, "the revoke is not shown: {now}");

    // Policies: the rate, the lock-delay and the groups show once set.
    assert!(now["policy"].is_null(), "no policy card without a policy: {now}");
    let policy = json!({ "capacity": 5, "rate": { "permits": 10, "per_ms": 1000, "burst": 3 }, "lock_delay_ms": 2500, "group_max": 2 });
    assert_eq!(root.send("PUT", "/v1/semaphores/gpu", Some(policy)).await.status, 200);
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| {
        p["policy"].as_str().is_some_and(|text| {
            text.contains("Rate 10 per 1s, burst 3")
                && text.contains("Lock-delay 2s")
                && text.contains("at most 2 each")
        })
    })
    .await;
    assert!(shown, "the policies are not shown: {now}");

    // The other views.
    browser.goto(&format!("{}/ui#/semaphores", server.url)).await;
    let (shown, now) =
        until(&browser, SHOW_WITHIN, |p| p["semaphores"].as_array().is_some_and(|r| r.len() == 2)).await;
    assert!(shown, "semaphores list: {now}");
    let gpu = now["semaphores"].as_array().unwrap().iter().find(|r| r[0] == "gpu").cloned().unwrap();
    assert_eq!(gpu[1], "4 / 5", "held / capacity: {gpu}");
    browser.goto(&format!("{}/ui#/elections", server.url)).await;
    let (shown, now) =
        until(&browser, SHOW_WITHIN, |p| p["elections"].as_array().is_some_and(|r| !r.is_empty())).await;
    assert!(shown, "elections: {now}");
    assert_eq!(
        (&now["elections"][0][0], &now["elections"][0][1], &now["elections"][0][2]),
        (&json!("scheduler"), &json!("worker-1"), &json!("host-a:8080"))
    );
    let tenure = now["elections"][0][4].as_str().unwrap();
    assert!(tenure.contains(" since "), "the leader's tenure says since when: {tenure}");
    browser.goto(&format!("{}/ui#/sessions", server.url)).await;
    let (shown, now) =
        until(&browser, SHOW_WITHIN, |p| p["sessions"].as_array().is_some_and(|r| r.len() == 4)).await;
    assert!(shown, "sessions: {now}");

    // Sorting: a click on a header sorts by it, a second click reverses; the filter keeps the
    // rows whose name matches.
    let names = |p: &Value| -> Vec<String> {
        p["sessions"].as_array().unwrap().iter().map(|r| r[0].as_str().unwrap().to_owned()).collect()
    };
    let ascending: Vec<String> = (1..=4).map(|i| format!("worker-{i}")).collect();
    let descending: Vec<String> = ascending.iter().rev().cloned().collect();
    browser.click("#sessions th[data-sort='name']").await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| names(p) == ascending).await;
    assert!(shown, "sorted by name: {now}");
    browser.click("#sessions th[data-sort='name']").await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| names(p) == descending).await;
    assert!(shown, "sorted by name, descending: {now}");
    browser.type_into("#filter", "worker-2").await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| names(p) == ["worker-2"]).await;
    assert!(shown, "filtered by name: {now}");

    // Links: a session to its hold's semaphore, a holder to its session.
    browser.click(&format!("#sessions a.session-link[data-session='{}']", worker[1])).await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| {
        p["session_name"] == "worker-2"
            && p["session_holds"] == json!([["gpu", "semaphore", "1", t2.to_string()]])
    })
    .await;
    assert!(shown, "the session's page with its hold: {now}");
    browser.click("#session-holds a.object-link").await;
    let (shown, now) =
        until(&browser, SHOW_WITHIN, |p| p["semaphore_name"] == "gpu" && holders(p).len() == 3).await;
    assert!(shown, "the hold's semaphore: {now}");
    browser.click(&format!("#holders a.session-link[data-session='{}']", worker[1])).await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| p["session_name"] == "worker-2").await;
    assert!(shown, "the holder's session: {now}");
    browser.goto(&format!("{}/ui#/cluster", server.url)).await;
    let (shown, now) =
        until(&browser, SHOW_WITHIN, |p| p["members"].as_array().is_some_and(|r| r.len() == 1)).await;
    assert!(shown, "cluster: {now}");
    assert!(now["members"][0][5] == "reachable", "{now}");
    browser.resize(390, 844).await;
    browser.goto(&format!("{}/ui#/semaphore/gpu", server.url)).await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| holders(p).len() == 3).await;
    assert!(shown, "phone-sized semaphore view: {now}");
    assert!(
        browser.eval("return document.documentElement.scrollWidth <= window.innerWidth;").await == true,
        "the phone view scrolls sideways"
    );
    browser.screenshot(&shots.join("semaphore-phone.png")).await;
    browser.resize(1280, 900).await;

    // A few seconds of churn on another semaphore, so that its charts have a history for the
    // screenshots the README shows (paced, not synchronised: the assertions above are done).
    let churn =
        [session(&root, "batch-1").await, session(&root, "batch-2").await, session(&root, "batch-3").await];
    let late = session(&root, "batch-4").await;
    root.semaphore("render.farm", 4).await;
    browser.goto(&format!("{}/ui#/semaphore/render.farm", server.url)).await;
    let churn_until = Instant::now() + CHURN;
    let mut holding = [false; 3];
    let mut step = 0usize;
    while Instant::now() < churn_until && step < 1000 {
        let i = step % 3;
        if holding[i] {
            assert_eq!(root.release("render.farm", &churn[i]).await.status, 200);
            holding[i] = false;
        } else {
            let permits = 1 + (step / 3) % 2;
            let answer =
                root.acquire("render.farm", json!({ "session": churn[i], "permits": permits })).await;
            holding[i] = answer.status == 200;
        }
        step += 1;
        tokio::time::sleep(Duration::from_millis(120)).await;
    }
    if !holding.contains(&true) {
        acquire(&root, "render.farm", &churn[0], 1).await;
    }
    let waiter = root.clone();
    let body = json!({ "session": late, "permits": 4, "wait_ms": 10_000 });
    let queued = tokio::spawn(async move { waiter.acquire("render.farm", body).await });
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| queue(p).len() == 1).await;
    assert!(shown, "render.farm: {now}");
    browser.screenshot(&shots.join("semaphore.png")).await;
    queued.abort();
    browser.goto(&format!("{}/ui#/semaphores", server.url)).await;
    let (shown, now) =
        until(&browser, SHOW_WITHIN, |p| p["semaphores"].as_array().is_some_and(|r| r.len() == 3)).await;
    assert!(shown, "semaphores list: {now}");
    browser.screenshot(&shots.join("semaphores.png")).await;

    // A read-only token sees the same holders and no admin action.
    browser.goto(&format!("{}/ui#/semaphore/gpu", server.url)).await;
    browser.click("#logout").await;
    log_in(&browser, &reader).await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| p["login"] == false && holders(p).len() == 3).await;
    assert!(shown, "the read-only token sees no holders: {now}");
    assert_eq!(
        (&now["admin"], &now["revoke"]),
        (&json!(false), &json!(0)),
        "admin actions shown to a reader: {now}"
    );
    browser.screenshot(&shots.join("semaphore-read-only.png")).await;

    // The root token (whose stored rules predate queues) sees a queue's items live: a push and a
    // claim made outside the page appear without a reload.
    let pushed = root
        .post("/v1/queues/jobs/items", json!({ "items": [{ "payload": { "n": 1 } }, { "payload": "two" }] }))
        .await;
    assert_eq!(pushed.status, 201, "{pushed:?}");
    browser.click("#logout").await;
    log_in(&browser, ROOT).await;
    browser.goto(&format!("{}/ui#/queue/jobs", server.url)).await;
    let items = |p: &Value| p["items"].as_array().cloned().unwrap_or_default();
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| items(p).len() == 2).await;
    assert!(shown, "the queue's items are not shown: {now}");
    let claimed = root.post("/v1/queues/jobs/claim", json!({ "session": worker[3], "max": 1 })).await;
    assert_eq!(claimed.status, 200, "{claimed:?}");
    let claimed_at = Instant::now();
    let (shown, now) =
        until(&browser, LIVE_WITHIN, |p| items(p).first().is_some_and(|row| row[2] == "claimed")).await;
    assert!(shown, "the claim did not appear within {LIVE_WITHIN:?} ({:?}): {now}", claimed_at.elapsed());
    assert_eq!(now["items"][0][8], "{\"n\":1}", "the payload is shown: {now}");
    assert_eq!(now["items"][1][2], "pending");
    browser.screenshot(&shots.join("queue.png")).await;
    browser.goto(&format!("{}/ui#/queues", server.url)).await;
    let (shown, now) = until(&browser, SHOW_WITHIN, |p| {
        p["queues"].as_array().is_some_and(|rows| rows.len() == 1 && rows[0][1] == "1" && rows[0][2] == "1")
    })
    .await;
    assert!(shown, "the queue list shows jobs with 1 pending and 1 claimed: {now}");

    // No console errors, no failed requests.
    let log = browser.log().await;
    let errors: Vec<&Value> = log.iter().filter(|entry| entry["level"] == "SEVERE").collect();
    assert!(errors.is_empty(), "browser errors: {errors:#?}");
    browser.quit().await;
    eprintln!("dashboard test took {:?}; screenshots in {}", started.elapsed(), shots.display());
}
