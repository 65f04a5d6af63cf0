//! A tiny JSON-over-HTTP client for driving the API exactly as curl would.

use std::time::Duration;

use serde_json::{json, Value};

/// Timeout of one request in tests (long-polls pass a longer one).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// A tiny JSON-over-HTTP client for driving the API exactly as curl would.
#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub url: String,
}

/// An answer: status, body as JSON (Null when empty), and the `permit-index` header.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub index: Option<u64>,
}

impl Answer {
    /// The error code of an error answer.
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("<no error code>")
    }
}

impl Api {
    /// Creates an ACL token with `rules` (as `RESOURCE:PREFIX=ACCESS`), as this client (an admin
    /// of `acl`), and returns its secret and id.
    pub async fn create_token(&self, name: &str, rules: &[&str]) -> (String, String) {
        let rules: Vec<Value> = rules
            .iter()
            .map(|rule| {
                let (scope, access) = rule.rsplit_once('=').unwrap();
                let (resource, prefix) = scope.split_once(':').unwrap();
                json!({ "resource": resource, "prefix": prefix, "access": access })
            })
            .collect();
        let created = self.post("/v1/acl/tokens", json!({ "name": name, "rules": rules })).await;
        assert_eq!(created.status, 201, "{created:?}");
        (created.body["secret"].as_str().unwrap().to_owned(), created.body["id"].as_str().unwrap().to_owned())
    }

    pub fn new(server: &super::Server) -> Api {
        Api::at(&server.url)
    }

    /// A client of the node at `url`.
    pub fn at(url: &str) -> Api {
        permit_client::install_crypto_provider();
        Api { http: reqwest::Client::builder().no_proxy().build().unwrap(), url: url.to_owned() }
    }

    /// A client of the node at `url` that sends `Authorization: Bearer SECRET`.
    pub fn with_token(url: &str, secret: &str) -> Api {
        permit_client::install_crypto_provider();
        let mut headers = reqwest::header::HeaderMap::new();
        let value = format!("Bearer {secret}").parse().expect("header value");
        headers.insert(reqwest::header::AUTHORIZATION, value);
        let http = reqwest::Client::builder().no_proxy().default_headers(headers).build().unwrap();
        Api { http, url: url.to_owned() }
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<Value>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request =
            self.http.request(method, format!("{}{path}", self.url)).timeout(REQUEST_TIMEOUT * 4);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request sent");
        Answer::read(response).await
    }

    /// Sends a raw body with a content type.
    pub async fn raw(&self, method: &str, path: &str, content_type: &str, body: Vec<u8>) -> Answer {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let response = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("content-type", content_type)
            .body(body)
            .timeout(REQUEST_TIMEOUT)
            .send()
            .await
            .expect("request sent");
        Answer::read(response).await
    }

    pub async fn get(&self, path: &str) -> Answer {
        self.send("GET", path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> Answer {
        self.send("POST", path, Some(body)).await
    }

    /// Opens a session with this TTL and returns its id.
    pub async fn session(&self, ttl_ms: u64) -> String {
        let answer = self.post("/v1/sessions", json!({ "ttl_ms": ttl_ms })).await;
        assert_eq!(answer.status, 201, "{answer:?}");
        answer.body["id"].as_str().unwrap().to_owned()
    }

    /// Creates (or resizes) a semaphore.
    pub async fn semaphore(&self, name: &str, capacity: u64) {
        let answer =
            self.send("PUT", &format!("/v1/semaphores/{name}"), Some(json!({ "capacity": capacity }))).await;
        assert!(answer.status == 201 || answer.status == 200, "{answer:?}");
    }

    pub async fn acquire(&self, name: &str, body: Value) -> Answer {
        self.post(&format!("/v1/semaphores/{name}/acquire"), body).await
    }

    pub async fn release(&self, name: &str, session: &str) -> Answer {
        self.post(&format!("/v1/semaphores/{name}/release"), json!({ "session": session })).await
    }

    /// Sessions holding `name`, in token order.
    pub async fn holders(&self, name: &str) -> Vec<String> {
        let view = self.get(&format!("/v1/semaphores/{name}")).await;
        let mut holders: Vec<(u64, String)> = view.body["holders"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| (h["token"].as_u64().unwrap(), h["session"].as_str().unwrap().to_owned()))
            .collect();
        holders.sort();
        holders.into_iter().map(|(_, s)| s).collect()
    }
}

impl Answer {
    async fn read(response: reqwest::Response) -> Answer {
        let status = response.status().as_u16();
        let index = response.headers().get("permit-index").and_then(|v| v.to_str().ok()?.parse().ok());
        let bytes = response.bytes().await.expect("body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()))
        };
        Answer { status, body, index }
    }
}
