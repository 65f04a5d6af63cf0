//! The few API calls the benchmark makes, over one keep-alive connection per client.

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// `permit_wire::LEADER_HEADER` (the bench drives the binary and does not link the wire crate).
fn permit_wire_leader_header() -> &'static str {
    "permit-leader"
}

/// A client with its own connection pool (one connection when used sequentially).
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    /// Base URL.
    pub url: String,
}

/// The secret every new [`Api`] sends as `Authorization: Bearer`, for the parts that measure a
/// server with `--auth` (set and cleared by the `auth` part only; parts run one at a time).
static AUTH_TOKEN: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Makes every [`Api`] created from now on authenticate with `secret` (`None`: no header).
pub fn set_auth_token(secret: Option<String>) {
    *AUTH_TOKEN.write().expect("auth token lock") = secret;
}

impl Api {
    /// A client of `url` with a pool of its own.
    pub fn new(url: &str) -> Api {
        crate::install_crypto_provider();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(secret) = AUTH_TOKEN.read().expect("auth token lock").as_deref() {
            headers
                .insert(reqwest::header::AUTHORIZATION, format!("Bearer {secret}").parse().expect("header"));
        }
        let mut builder = reqwest::Client::builder().default_headers(headers);
        if let Some(ca) = crate::tls::trusted_ca() {
            builder = builder.tls_certs_only([ca.clone()]);
        }
        let http = builder
            .no_proxy()
            .tcp_nodelay(true)
            .pool_max_idle_per_host(1)
            .timeout(Duration::from_secs(90))
            .build()
            .expect("client builds");
        Api { http, url: url.to_owned() }
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        let answer = self.http.post(format!("{}{path}", self.url)).json(&body).send().await?;
        let status = answer.status().as_u16();
        let bytes = answer.bytes().await?;
        Ok((status, if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes)? }))
    }

    /// POSTs `body` to `path`: the status and the JSON answer.
    pub async fn post_json(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        self.post(path, body).await
    }

    /// GETs `path` and returns only the status.
    pub async fn get_status(&self, path: &str) -> anyhow::Result<u16> {
        Ok(self.http.get(format!("{}{path}", self.url)).send().await?.status().as_u16())
    }

    /// The leader's URL as this node names it (`permit-leader` on any answer; asked of
    /// `/v1/health`, which every node answers itself), if it knows one.
    pub async fn leader_hint(&self) -> anyhow::Result<Option<String>> {
        let answer = self.http.get(format!("{}/v1/health", self.url)).send().await?;
        let hint = answer.headers().get(permit_wire_leader_header()).and_then(|v| v.to_str().ok());
        Ok(hint.map(str::to_owned))
    }

    /// Opens a session.
    pub async fn session(&self, ttl_ms: u64) -> anyhow::Result<String> {
        let (status, body) = self.post("/v1/sessions", json!({ "ttl_ms": ttl_ms })).await?;
        if status != 201 {
            bail!("create session: {status} {body}");
        }
        Ok(body["id"].as_str().context("id")?.to_owned())
    }

    /// Creates or resizes a semaphore.
    pub async fn semaphore(&self, name: &str, capacity: u64) -> anyhow::Result<()> {
        let answer = self
            .http
            .put(format!("{}/v1/semaphores/{name}", self.url))
            .json(&json!({ "capacity": capacity }))
            .send()
            .await?;
        if !answer.status().is_success() {
            bail!("put semaphore: {}", answer.status());
        }
        Ok(())
    }

    /// Acquires, blocking up to `wait_ms`; returns the token when granted.
    pub async fn acquire(
        &self,
        name: &str,
        session: &str,
        permits: u64,
        wait_ms: u64,
    ) -> anyhow::Result<Option<u64>> {
        let body = json!({ "session": session, "permits": permits, "wait_ms": wait_ms });
        let (status, body) = self.post(&format!("/v1/semaphores/{name}/acquire"), body).await?;
        match status {
            200 => Ok(body["token"].as_u64()),
            202 | 409 => Ok(None),
            _ => bail!("acquire: {status} {body}"),
        }
    }

    /// Releases.
    pub async fn release(&self, name: &str, session: &str) -> anyhow::Result<()> {
        let (status, body) =
            self.post(&format!("/v1/semaphores/{name}/release"), json!({ "session": session })).await?;
        if status != 200 {
            bail!("release: {status} {body}");
        }
        Ok(())
    }
}
