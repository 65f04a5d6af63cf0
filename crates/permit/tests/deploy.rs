//! The checked-in monitoring files (`deploy/grafana/permit.json`, `deploy/prometheus/*.yml`)
//! parse, and every metric they query exists in the `/metrics` of a real `permit serve`.

mod common;

use std::collections::BTreeSet;
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
