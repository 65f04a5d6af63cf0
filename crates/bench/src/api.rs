//! The few API calls the benchmark makes, over one keep-alive connection per client, through the
//! thin HTTP/1.1 client (`crate::http1`) or reqwest (`--client`).

use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::{json, Value};

/// `permit_wire::LEADER_HEADER` (the bench drives the binary and does not link the wire crate).
fn permit_wire_leader_header() -> &'static str {
    "permit-leader"
}

/// Which HTTP client the benchmark's API calls go through (`--client`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ClientKind {
    /// [`crate::http1::Http1`]: one connection, read and written by the calling task, as thin
    /// as the `redis` part's RESP client.
    Thin,
    /// reqwest, with a pool of one idle connection (what `permit-client` uses).
    Reqwest,
}

/// The client every [`Api`] created from now on uses (set once from `--client`, and by the
/// `client` part, which runs alone).
static CLIENT_KIND: std::sync::RwLock<ClientKind> = std::sync::RwLock::new(ClientKind::Thin);

/// Makes every [`Api`] created from now on use `kind`.
pub fn set_client_kind(kind: ClientKind) {
    *CLIENT_KIND.write().expect("client kind lock") = kind;
}

/// The client [`Api::new`] uses now.
pub fn client_kind() -> ClientKind {
    *CLIENT_KIND.read().expect("client kind lock")
}

/// A client with a connection of its own (one connection when used sequentially; a clone shares
/// it, and a call made while another holds it opens a second).
#[derive(Clone)]
pub struct Api {
    transport: Transport,
    /// `Authorization: Bearer` secret, if the server runs with `--auth`.
    bearer: Option<std::sync::Arc<str>>,
    /// Base URL.
    pub url: String,
}

#[derive(Clone)]
enum Transport {
    Thin(std::sync::Arc<std::sync::Mutex<Option<crate::http1::Http1>>>),
    Reqwest(reqwest::Client),
}

/// The secret every new [`Api`] sends as `Authorization: Bearer`, for the parts that measure a
/// server with `--auth` (set and cleared by the `auth` part only; parts run one at a time).
static AUTH_TOKEN: std::sync::RwLock<Option<String>> = std::sync::RwLock::new(None);

/// Makes every [`Api`] created from now on authenticate with `secret` (`None`: no header).
pub fn set_auth_token(secret: Option<String>) {
    *AUTH_TOKEN.write().expect("auth token lock") = secret;
}

/// One answer: status, `permit-leader` header, body.
struct Answer {
    status: u16,
    leader: Option<String>,
    body: Vec<u8>,
}

impl Api {
    /// A client of `url` with a connection of its own, through the client [`client_kind`] names.
    pub fn new(url: &str) -> Api {
        Api::with(url, client_kind())
    }

    /// A client of `url` through `kind`.
    pub fn with(url: &str, kind: ClientKind) -> Api {
        crate::install_crypto_provider();
        let bearer = AUTH_TOKEN.read().expect("auth token lock").as_deref().map(std::sync::Arc::from);
        let transport = match kind {
            ClientKind::Thin => Transport::Thin(Default::default()),
            ClientKind::Reqwest => {
                let mut builder = reqwest::Client::builder();
                if let Some(ca) = crate::tls::trusted_ca() {
                    let ca = reqwest::Certificate::from_der(ca.as_ref()).expect("the run's CA parses");
                    builder = builder.tls_certs_only([ca]);
                }
                let http = builder
                    .no_proxy()
                    .tcp_nodelay(true)
                    .pool_max_idle_per_host(1)
                    .timeout(Duration::from_secs(90))
                    .build()
                    .expect("client builds");
                Transport::Reqwest(http)
            }
        };
        Api { transport, bearer, url: url.to_owned() }
    }

    /// One request, bounded by 90 s.
    async fn call(&self, method: &'static str, path: &str, body: Option<Value>) -> anyhow::Result<Answer> {
        let body = body.map(|body| serde_json::to_vec(&body)).transpose()?;
        let bearer = self.bearer.as_deref();
        match &self.transport {
            Transport::Thin(slot) => {
                let taken = slot.lock().expect("connection slot").take();
                let mut conn = match taken {
                    Some(conn) => conn,
                    None => crate::http1::Http1::new(&self.url)?,
                };
                let answer = tokio::time::timeout(
                    Duration::from_secs(90),
                    conn.request(method, path, body.as_deref(), bearer),
                )
                .await
                .with_context(|| format!("{method} {path}: no answer within 90 s"))??;
                slot.lock().expect("connection slot").get_or_insert(conn);
                Ok(Answer { status: answer.status, leader: answer.leader, body: answer.body })
            }
            Transport::Reqwest(http) => {
                let method = reqwest::Method::from_bytes(method.as_bytes())?;
                let mut request = http.request(method, format!("{}{path}", self.url));
                if let Some(secret) = bearer {
                    request = request.bearer_auth(secret);
                }
                if let Some(body) = body {
                    request = request.header(reqwest::header::CONTENT_TYPE, "application/json").body(body);
                }
                let answer = request.send().await?;
                let status = answer.status().as_u16();
                let leader = answer
                    .headers()
                    .get(permit_wire_leader_header())
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                Ok(Answer { status, leader, body: answer.bytes().await?.to_vec() })
            }
        }
    }

    async fn post(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        self.request_json("POST", path, Some(body)).await
    }

    /// One request with an optional JSON body: the status and the JSON answer (`null` when
    /// empty).
    pub async fn request_json(
        &self,
        method: &'static str,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let answer = self.call(method, path, body).await?;
        let value = if answer.body.is_empty() { Value::Null } else { serde_json::from_slice(&answer.body)? };
        Ok((answer.status, value))
    }

    /// POSTs `body` to `path`: the status and the JSON answer.
    pub async fn post_json(&self, path: &str, body: Value) -> anyhow::Result<(u16, Value)> {
        self.post(path, body).await
    }

    /// GETs `path` and returns only the status.
    pub async fn get_status(&self, path: &str) -> anyhow::Result<u16> {
        Ok(self.call("GET", path, None).await?.status)
    }

    /// The leader's URL as this node names it (`permit-leader` on any answer; asked of
    /// `/v1/health`, which every node answers itself), if it knows one.
    pub async fn leader_hint(&self) -> anyhow::Result<Option<String>> {
        Ok(self.call("GET", "/v1/health", None).await?.leader)
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
            .call("PUT", &format!("/v1/semaphores/{name}"), Some(json!({ "capacity": capacity })))
            .await?;
        if !(200..300).contains(&answer.status) {
            bail!("put semaphore: {}", answer.status);
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
