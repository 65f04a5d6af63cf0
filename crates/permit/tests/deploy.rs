//! The checked-in monitoring files (`deploy/grafana/permit.json`, `deploy/prometheus/*.yml`)
//! parse, and every metric they query exists in the `/metrics` of a real `permit serve`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;

use std::time::Duration;

use serde_json::json;

use crate::common::api::Api;
use crate::common::{eventually, Server};

fn deploy(path: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(deploy(path)).unwrap_or_else(|e| panic!("cannot read deploy/{path}: {e}"))
}

/// Every string under a key named `expr` or `query` in a JSON (or YAML-as-JSON) tree.
fn queries(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query", Value::String(text)) => out.push(text.clone()),
                    _ => queries(value, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| queries(item, out)),
        _ => {}
    }
}

/// The Permit and process metric names a PromQL expression mentions.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut word = String::new();
    for c in expr.chars().chain([' ']) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        // A name is not inside a label matcher's quoted value or a label name before `=`.
        if (word.starts_with("permit_") || word.starts_with("process_")) && c != '=' && c != '"' {
            names.insert(std::mem::take(&mut word));
        }
        word.clear();
    }
    names
}

/// Every sample name a scrape can contain, from the `# TYPE` lines: counters as `_total`,
/// histograms as `_bucket`, `_sum` and `_count`.
fn exposed(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else { continue };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|suffix| format!("{name}{suffix}")));
        }
    }
    names
}

#[tokio::test]
async fn the_grafana_dashboard_and_prometheus_files_parse_and_use_only_real_metrics() {
    let dashboard: Value = serde_json::from_str(&read("grafana/permit.json")).expect("permit.json is JSON");
    assert!(dashboard["panels"].as_array().is_some_and(|panels| panels.len() >= 10), "panels");
    let scrape: serde_yaml::Value = serde_yaml::from_str(&read("prometheus/prometheus.yml")).expect("YAML");
    let scrape: Value = serde_json::to_value(scrape).unwrap();
    let jobs = scrape["scrape_configs"].as_array().expect("scrape_configs");
    assert!(jobs.iter().any(|job| job["job_name"] == "permit" && job["metrics_path"] == "/metrics"));
    for file in scrape["rule_files"].as_array().expect("rule_files") {
        assert!(deploy("prometheus").join(file.as_str().unwrap()).exists(), "{file} exists");
    }
    let alerts: serde_yaml::Value = serde_yaml::from_str(&read("prometheus/alerts.yml")).expect("YAML");
    let alerts: Value = serde_json::to_value(alerts).unwrap();
    let rules: Vec<&Value> = alerts["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    for name in ["PermitOldestWaiterOver30s", "PermitNoLeader", "PermitFsyncP99Over50ms"] {
        assert!(rules.iter().any(|rule| rule["alert"] == name), "alert {name}");
    }

    let mut all = Vec::new();
    queries(&dashboard, &mut all);
    queries(&alerts, &mut all);
    let used: BTreeSet<String> = all.iter().flat_map(|expr| metric_names(expr)).collect();
    assert!(used.len() >= 20, "the files query the metrics: {used:?}");

    // Per-object series exist once their objects saw activity: make every kind happen.
    let server = Server::start();
    let api = Api::new(&server);
    let (s1, s2, short) = (api.session(30_000).await, api.session(30_000).await, api.session(300).await);
    assert_eq!(api.acquire("gpu", json!({ "session": s1, "capacity": 1 })).await.status, 200);
    assert_eq!(api.acquire("gpu", json!({ "session": s2, "wait_ms": 20 })).await.status, 202);
    assert_eq!(api.acquire("gpu", json!({ "session": short })).await.status, 409);
    assert_eq!(api.acquire("db", json!({ "session": short, "capacity": 1 })).await.status, 200);
    assert_eq!(api.release("gpu", &s1).await.status, 200);
    let campaign = api.post("/v1/elections/boss/campaign", json!({ "session": s1, "value": "a" })).await;
    assert_eq!(campaign.status, 200);
    let scrape = async || api.get("/metrics").await.body.as_str().unwrap_or_default().to_owned();
    let expired = eventually(Duration::from_secs(5), async || {
        scrape().await.contains("permit_semaphore_expirations_total{semaphore=\"db\"} 1")
    });
    assert!(expired.await, "the short session expired");
    let text = scrape().await;
    let exposed = exposed(&text);
    let missing: Vec<&String> = used.iter().filter(|name| !exposed.contains(*name)).collect();
    assert!(missing.is_empty(), "metrics used in deploy/ but not exposed: {missing:?}\nexposed: {exposed:?}");
}

#[test]
fn metric_names_skip_label_names_and_values() {
    let names = metric_names(
        r#"histogram_quantile(0.99, sum by (le) (rate(permit_x_bucket{job="permit_y",permit_z="a"}[5m])))"#,
    );
    assert_eq!(names, BTreeSet::from(["permit_x_bucket".to_owned()]));
}

/// `permit config show`'s lines `key = value  # default`, as (key, value).
fn serve_defaults() -> BTreeMap<String, String> {
    let output = std::process::Command::new(crate::common::permit_bin())
        .args(["config", "show"])
        .env_remove("PERMIT_CONFIG")
        .output()
        .expect("run permit config show");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    text.lines()
        .filter_map(|line| line.strip_suffix("  # default"))
        .filter_map(|line| line.split_once(" = "))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

/// The unit's `Key=value` lines of its `[Service]` section (a key may repeat).
fn service_settings(unit: &str) -> Vec<(String, String)> {
    let service = unit.split("[Service]").nth(1).expect("a [Service] section");
    let service = service.split("\n[").next().unwrap();
    service
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
        .collect()
}

/// `deploy/systemd/permit.service`: `Type=notify` (the server notifies, see
/// tests/server/sd_notify.rs), its own user, a read-only system, a file-descriptor limit that
/// fits `--connections-max`, a watchdog; and `systemd-analyze verify` accepts it where systemd
/// is installed (with `ExecStart` pointing at the binary under test, which it checks exists).
#[test]
fn the_systemd_unit_is_hardened_and_verifies() {
    let unit = read("systemd/permit.service");
    let settings = service_settings(&unit);
    let get = |key: &str| settings.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    for (key, value) in [
        ("Type", "notify"),
        ("ExecStart", "/usr/bin/permit serve --config /etc/permit/permit.toml"),
        ("User", "permit"),
        ("ProtectSystem", "strict"),
        ("StateDirectory", "permit"),
        ("NoNewPrivileges", "yes"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(get(key), Some(value), "{key}= in deploy/systemd/permit.service");
    }
    assert!(get("WatchdogSec").is_some_and(|value| humantime::parse_duration(value).is_ok()), "WatchdogSec=");
    // Every client connection, the 64 peer slots, and a few hundred for the log and snapshots.
    let connections: u64 = serve_defaults()["connections-max"].parse().unwrap();
    let files: u64 = get("LimitNOFILE").expect("LimitNOFILE=").parse().unwrap();
    assert!(
        files >= connections + 64 + 256,
        "LimitNOFILE={files} does not fit --connections-max {connections}"
    );

    let Ok(analyze) = which("systemd-analyze") else {
        eprintln!("SKIPPED: systemd-analyze verify of deploy/systemd/permit.service: systemd-analyze is not installed");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("permit.service");
    std::fs::write(&copy, unit.replace("/usr/bin/permit", crate::common::permit_bin())).unwrap();
    let output = std::process::Command::new(analyze).arg("verify").arg(&copy).output().unwrap();
    let complaints =
        format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && complaints.trim().is_empty(), "systemd-analyze verify: {complaints}");
}

/// The directory of `program` on `PATH`.
fn which(program: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("{program} is not on PATH"))
}

/// `deploy/systemd/permit.toml` passes `permit config check`, names every key of `permit serve`
/// (commented where it shows the default), and its commented values are the defaults.
#[test]
fn the_example_configuration_is_valid_and_names_every_key() {
    let example = deploy("systemd/permit.toml");
    let output = std::process::Command::new(crate::common::permit_bin())
        .args(["config", "check"])
        .arg(&example)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = read("systemd/permit.toml");
    let defaults = serve_defaults();
    let keyed: BTreeMap<&str, &str> = text
        .lines()
        .map(|line| line.strip_prefix("# ").unwrap_or(line))
        .filter_map(|line| line.split_once(" = "))
        .filter(|(key, _)| key.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
        .map(|(key, value)| (key, value.split("  #").next().unwrap().trim()))
        .collect();
    // Every key `config show` prints, set (`key = value  # ...`) or not (`# key is not set`).
    let shown =
        std::process::Command::new(crate::common::permit_bin()).args(["config", "show"]).output().unwrap();
    let shown = String::from_utf8(shown.stdout).unwrap();
    let keys: Vec<&str> = shown
        .lines()
        .filter_map(|line| {
            line.split_once(" = ")
                .map(|(key, _)| key)
                .or_else(|| line.strip_prefix("# ")?.strip_suffix(" is not set"))
        })
        .collect();
    assert!(keys.len() > 20, "{shown}");
    for key in keys {
        assert!(keyed.contains_key(key), "deploy/systemd/permit.toml does not name the key {key}");
    }
    for line in text.lines().filter_map(|line| line.strip_prefix("# ")) {
        if let Some((key, value)) = line.split_once(" = ") {
            if let Some(default) = defaults.get(key) {
                let value = value.split("  #").next().unwrap().trim();
                assert_eq!(
                    value, default,
                    "the commented {key} of deploy/systemd/permit.toml is not its default"
                );
            }
        }
    }
}
