//! Multi-process cluster tests: real `permit serve` processes on loopback, real faults.

#[path = "../common/mod.rs"]
mod common;

mod acl;
mod client_failover;
mod failover;
mod leader_hint;
mod logs;
mod membership;
mod minority;
mod peer;
mod policies;
mod recover;
mod restart;
mod revocation;
mod ui;
mod versions;

pub use common::api::{Answer, Api};

use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A client that fails over between endpoints and retries idempotent calls until one answers
/// with something other than "no leader" or a connection error, within a deadline.
#[derive(Clone)]
pub struct Failover {
    pub apis: Vec<Api>,
    pub preferred: usize,
}

impl Failover {
    pub fn new(urls: &[String], preferred: usize) -> Failover {
        Failover { apis: urls.iter().map(|u| Api::at(u)).collect(), preferred }
    }

    /// Sends until an endpoint answers conclusively; returns the answer and how many attempts
    /// were unknown (connection refused, 503).
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Value>,
        deadline: Duration,
    ) -> (Answer, u32) {
        let started = Instant::now();
        let mut unknown = 0;
        loop {
            let api = &self.apis[self.preferred % self.apis.len()];
            let method_ = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            let mut request =
                api.http.request(method_, format!("{}{path}", api.url)).timeout(Duration::from_secs(8));
            if let Some(body) = &body {
                request = request.json(body);
            }
            match request.send().await {
                Ok(response) if response.status().as_u16() != 503 => {
                    let status = response.status().as_u16();
                    let index =
                        response.headers().get("permit-index").and_then(|v| v.to_str().ok()?.parse().ok());
                    let bytes = response.bytes().await.unwrap_or_default();
                    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                    return (Answer { status, body, index }, unknown);
                }
                _ => {
                    unknown += 1;
                    self.preferred += 1;
                    assert!(
                        started.elapsed() < deadline,
                        "no conclusive answer to {method} {path} within {deadline:?}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    pub async fn post(&mut self, path: &str, body: Value) -> Answer {
        self.send("POST", path, Some(body), Duration::from_secs(20)).await.0
    }

    pub async fn get(&mut self, path: &str) -> Answer {
        self.send("GET", path, None, Duration::from_secs(20)).await.0
    }

    pub async fn session(&mut self, ttl_ms: u64) -> String {
        let answer = self.post("/v1/sessions", json!({ "ttl_ms": ttl_ms })).await;
        assert_eq!(answer.status, 201, "{answer:?}");
        answer.body["id"].as_str().unwrap().to_owned()
    }
}
