//! HTTP plumbing: endpoints, failover, retries and client-side timeouts.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use permit_wire::{ErrorBody, ErrorCode};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// Client-side timeout of a request that does not long-poll.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Extra time a long-poll is given beyond the wait it asks the server for.
pub(crate) const LONG_POLL_MARGIN: Duration = Duration::from_secs(5);
/// Attempts of a retried call, over all endpoints.
const ATTEMPTS_MAX: u32 = 24;
/// Longest a retried call keeps retrying: enough to ride out a leader election (≈ 2 s), short
/// enough that a dead server is reported promptly.
const RETRY_WINDOW: Duration = Duration::from_secs(6);
/// Attempts that may time out before a retried call gives up, so that it never takes much more
/// than twice its timeout (one that times out on a hung endpoint still gets to try another).
const TIMEOUTS_MAX: u32 = 2;
/// First pause before going around the endpoints again; doubles up to `BACKOFF_MAX`.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(1);
/// Idle pooled connections are dropped after this long: before the server's header-read timeout
/// (10 s by default) closes them, which could race with a request being sent on one.
const POOL_IDLE: Duration = Duration::from_secs(4);
/// Longest time spent connecting to one endpoint before trying the next.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// When a failed request may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// Repeating is harmless: retry connection failures, timeouts and `no_leader`, with backoff.
    Idempotent,
    /// A repeat could apply twice: retry only when the request was certainly not applied
    /// (connection refused, `no_leader`, `shutting_down`).
    Unsent,
    /// One pass over the endpoints on connection failures and `no_leader`, no backoff: the caller
    /// (the keepalive loop) keeps its own schedule.
    OnePass,
}

/// One request to make.
pub(crate) struct Call {
    pub method: Method,
    pub path: String,
    pub query: Vec<(&'static str, String)>,
    /// The JSON body, encoded once: raw payloads (`RawValue`) go out byte for byte.
    pub body: Option<Vec<u8>>,
    pub timeout: Duration,
    pub retry: Retry,
    /// A non-2xx status whose body is an answer rather than an error (health's 503).
    pub accept: Option<u16>,
}

impl Call {
    pub fn new(method: Method, path: String) -> Call {
        Call {
            method,
            path,
            query: Vec::new(),
            body: None,
            timeout: REQUEST_TIMEOUT,
            retry: Retry::Idempotent,
            accept: None,
        }
    }

    pub fn body(mut self, body: &impl Serialize) -> Call {
        self.body = Some(serde_json::to_vec(body).expect("wire types serialize"));
        self
    }

    pub fn query(mut self, key: &'static str, value: impl ToString) -> Call {
        self.query.push((key, value.to_string()));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Call {
        self.timeout = timeout;
        self
    }

    pub fn retry(mut self, retry: Retry) -> Call {
        self.retry = retry;
        self
    }

    pub fn accept(mut self, status: u16) -> Call {
        self.accept = Some(status);
        self
    }
}

/// A successful (2xx) answer.
pub(crate) struct Reply {
    pub status: u16,
    pub endpoint: String,
    pub bytes: Vec<u8>,
}

impl Reply {
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.bytes).map_err(|error| Error::Protocol {
            endpoint: self.endpoint.clone(),
            status: self.status,
            message: format!("cannot decode the body: {error}"),
        })
    }
}

/// The endpoints and the HTTP connection pool shared by every handle of a client.
#[derive(Debug)]
pub(crate) struct Transport {
    http: reqwest::Client,
    endpoints: Vec<String>,
    /// Index of the endpoint that answered last; requests start there.
    preferred: AtomicUsize,
    /// The secret sent as `Authorization: Bearer SECRET`, when the server has auth on.
    auth_token: Option<String>,
}

/// TLS settings of a client: CAs to trust instead of the system's roots, and a client identity.
#[derive(Debug, Default)]
pub(crate) struct TlsOptions {
    /// PEM texts of trusted CAs; when any is given, only these are trusted.
    pub ca_pems: Vec<Vec<u8>>,
    /// PEM certificate chain followed by its private key.
    pub identity: Option<Vec<u8>>,
}

impl TlsOptions {
    /// Adds these settings to a reqwest builder.
    fn apply(&self, mut builder: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder> {
        let invalid = |what: &str, error: reqwest::Error| Error::InvalidArgument {
            message: format!("{what}: {error}"),
        };
        let mut roots = Vec::new();
        for pem in &self.ca_pems {
            roots.extend(
                reqwest::Certificate::from_pem_bundle(pem).map_err(|e| invalid("CA certificate", e))?,
            );
        }
        if !self.ca_pems.is_empty() {
            if roots.is_empty() {
                return Err(Error::InvalidArgument { message: "the CA PEM holds no certificate".into() });
            }
            builder = builder.tls_certs_only(roots);
        }
        if let Some(identity) = &self.identity {
            builder = builder
                .identity(reqwest::Identity::from_pem(identity).map_err(|e| invalid("client identity", e))?);
        }
        Ok(builder)
    }
}

/// Installs rustls' `ring` crypto provider as the process default unless one is installed.
/// reqwest is built without a provider of its own (`rustls-no-provider`), and every reqwest
/// client in the process needs one.
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race against another thread installing one is fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

impl Transport {
    pub fn new(urls: &[String], tls: &TlsOptions) -> Result<Transport> {
        if urls.is_empty() {
            return Err(Error::InvalidEndpoint { url: String::new(), reason: "no endpoint given".into() });
        }
        let endpoints = urls.iter().map(|url| normalize(url)).collect::<Result<Vec<_>>>()?;
        install_crypto_provider();
        let http = tls
            .apply(reqwest::Client::builder())?
            .no_proxy()
            .pool_idle_timeout(POOL_IDLE)
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .build()
            .map_err(|error| Error::InvalidEndpoint { url: urls.join(","), reason: error.to_string() })?;
        Ok(Transport { http, endpoints, preferred: AtomicUsize::new(0), auth_token: None })
    }

    /// The same endpoints and connection pool, sending `auth_token` with every request.
    pub fn with_auth_token(&self, auth_token: String) -> Transport {
        Transport {
            http: self.http.clone(),
            endpoints: self.endpoints.clone(),
            preferred: AtomicUsize::new(self.preferred.load(Ordering::Relaxed)),
            auth_token: Some(auth_token),
        }
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Sends `call`, failing over and retrying as its policy allows; non-2xx answers are errors.
    pub async fn send(&self, call: &Call) -> Result<Reply> {
        let attempts = match call.retry {
            Retry::OnePass => self.endpoints.len() as u32,
            Retry::Idempotent | Retry::Unsent => ATTEMPTS_MAX.max(self.endpoints.len() as u32),
        };
        let mut backoff = BACKOFF_MIN;
        let mut attempt = 0;
        let mut timeouts = 0;
        let started = tokio::time::Instant::now();
        // The last error of each endpoint, so that "cannot reach" names every endpoint tried.
        let mut failed = FailedEndpoints::default();
        loop {
            let index = self.preferred.load(Ordering::Relaxed) % self.endpoints.len();
            let error = match self.send_once(&self.endpoints[index], call).await {
                Ok(reply) => return Ok(reply),
                Err(error) => error,
            };
            failed.record(&self.endpoints[index], &error.error);
            attempt += 1;
            if matches!(error.error, Error::Timeout { .. }) {
                timeouts += 1;
            }
            let exhausted = attempt >= attempts
                || started.elapsed() >= RETRY_WINDOW
                || (call.retry != Retry::OnePass && timeouts >= TIMEOUTS_MAX);
            if exhausted || !error.retryable(call.retry) {
                return Err(failed.summarize(&self.endpoints, error.error));
            }
            tracing::debug!(endpoint = %self.endpoints[index], error = %error.error, "retrying on the next endpoint");
            // Move on only if nobody else did meanwhile, so concurrent failures skip one endpoint.
            let next = (index + 1) % self.endpoints.len();
            let _ = self.preferred.compare_exchange(index, next, Ordering::Relaxed, Ordering::Relaxed);
            if next == 0 || self.endpoints.len() == 1 {
                tokio::time::sleep(jitter(backoff)).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }

    /// Opens a streaming `GET` (the event stream) on the first endpoint that answers 2xx, with
    /// `headers`; no client-side timeout once the headers arrived.
    pub async fn open_stream(
        &self,
        path: &str,
        query: &[(&'static str, String)],
        headers: &[(&'static str, String)],
    ) -> Result<(String, reqwest::Response)> {
        let mut last = None;
        let mut failed = FailedEndpoints::default();
        let start = self.preferred.load(Ordering::Relaxed);
        for i in 0..self.endpoints.len() {
            if let Some(error) = &last {
                let previous = &self.endpoints[(start + i - 1) % self.endpoints.len()];
                failed.record(previous, error);
            }
            let endpoint = &self.endpoints[(start + i) % self.endpoints.len()];
            let mut url = reqwest::Url::parse(&format!("{endpoint}{path}"))
                .map_err(|error| Error::InvalidArgument { message: format!("bad path {path:?}: {error}") })?;
            if !query.is_empty() {
                url.query_pairs_mut().extend_pairs(query);
            }
            let mut request = self.http.get(url);
            if let Some(secret) = &self.auth_token {
                request = request.bearer_auth(secret);
            }
            for (name, value) in headers {
                request = request.header(*name, value);
            }
            let sending = tokio::time::timeout(REQUEST_TIMEOUT, request.send()).await;
            let response = match sending {
                Err(_) => {
                    last = Some(Error::Timeout { endpoint: endpoint.clone(), after: REQUEST_TIMEOUT });
                    continue;
                }
                Ok(Err(error)) => {
                    let failure = Failure::transport(endpoint, REQUEST_TIMEOUT, error);
                    if failure.scheme_mismatch() {
                        return Err(failure.error);
                    }
                    last = Some(failure.error);
                    continue;
                }
                Ok(Ok(response)) => response,
            };
            let status = response.status();
            if status.is_success() {
                return Ok((endpoint.clone(), response));
            }
            let bytes = response.bytes().await.unwrap_or_default();
            let failure = Failure::answer(endpoint, status, &bytes);
            if !failure.retryable(Retry::Idempotent) {
                return Err(failure.error);
            }
            last = Some(failure.error);
        }
        let last = last.expect("at least one endpoint");
        failed.record(&self.endpoints[(start + self.endpoints.len() - 1) % self.endpoints.len()], &last);
        Err(failed.summarize(&self.endpoints, last))
    }

    /// Prefers the endpoint that a successful answer from `endpoint` names as the leader
    /// (`permit-leader`), if it is one of this client's: a follower would forward the requests
    /// there anyway, one HTTP hop more. An address that is not one of the endpoints is ignored
    /// (the client talks only to the endpoints it was given). A failed answer's hint is not
    /// followed: a follower that cannot reach a leader that died still names it until an
    /// election, and following it would send the retries back to the dead node.
    fn follow_leader_hint(&self, endpoint: &str, headers: &reqwest::header::HeaderMap) {
        if self.endpoints.len() < 2 {
            return;
        }
        let hint = headers.get(permit_wire::LEADER_HEADER).and_then(|v| v.to_str().ok());
        let Some(leader) = hint.and_then(|url| normalize(url).ok()) else {
            return;
        };
        if leader == endpoint {
            return;
        }
        if let Some(index) = self.endpoints.iter().position(|e| *e == leader) {
            self.preferred.store(index, Ordering::Relaxed);
        }
    }

    async fn send_once(&self, endpoint: &str, call: &Call) -> Result<Reply, Failure> {
        let mut url = reqwest::Url::parse(&format!("{endpoint}{}", call.path)).map_err(|error| Failure {
            error: Error::InvalidArgument { message: format!("bad request path {:?}: {error}", call.path) },
            unsent: false,
        })?;
        if !call.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&call.query);
        }
        let mut request = self.http.request(call.method.clone(), url).timeout(call.timeout);
        if let Some(secret) = &self.auth_token {
            request = request.bearer_auth(secret);
        }
        if let Some(body) = &call.body {
            request = request.header(reqwest::header::CONTENT_TYPE, "application/json").body(body.clone());
        }
        let transport = |error: reqwest::Error| Failure::transport(endpoint, call.timeout, error);
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        if status.is_success() {
            self.follow_leader_hint(endpoint, response.headers());
        }
        let bytes = response.bytes().await.map_err(transport)?.to_vec();
        if status.is_success() || call.accept == Some(status.as_u16()) {
            return Ok(Reply { status: status.as_u16(), endpoint: endpoint.to_owned(), bytes });
        }
        Err(Failure::answer(endpoint, status, &bytes))
    }
}

/// A failed attempt and whether it could have been applied.
struct Failure {
    error: Error,
    /// The server certainly did not apply the request.
    unsent: bool,
}

impl Failure {
    fn transport(endpoint: &str, timeout: Duration, error: reqwest::Error) -> Failure {
        let unsent = error.is_connect();
        if endpoint.starts_with("https://") && is_plain_http_reply(&error) {
            // A TLS handshake answered by a plain-HTTP server: rustls reads the HTTP reply as
            // a record of an unknown content type. Retrying cannot help.
            let plain = endpoint.replacen("https://", "http://", 1);
            let reason = format!("this port serves plain HTTP, not TLS: use {plain}");
            return Failure {
                error: Error::SchemeMismatch { endpoint: endpoint.to_owned(), reason },
                unsent,
            };
        }
        let error = if error.is_timeout() {
            Error::Timeout { endpoint: endpoint.to_owned(), after: timeout }
        } else {
            Error::Transport { endpoint: endpoint.to_owned(), source: Box::new(error) }
        };
        Failure { error, unsent }
    }

    /// Whether this failure is a scheme mismatch, which no retry can mend.
    fn scheme_mismatch(&self) -> bool {
        matches!(self.error, Error::SchemeMismatch { .. })
    }

    fn answer(endpoint: &str, status: StatusCode, bytes: &[u8]) -> Failure {
        let error = match serde_json::from_slice::<ErrorBody>(bytes) {
            Ok(body) if body.error.code == ErrorCode::RateLimited => Error::RateLimited {
                retry_after: Duration::from_millis(body.error.retry_after_ms.unwrap_or(0)),
                message: body.error.message,
            },
            Ok(body) => {
                Error::Api { status: status.as_u16(), code: body.error.code, message: body.error.message }
            }
            Err(_) => Error::Protocol {
                endpoint: endpoint.to_owned(),
                status: status.as_u16(),
                message: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned(),
            },
        };
        // Only `leader_unreachable` and `storage_error` (a failed node refusing all work) prove
        // that nothing was done; `no_leader`, `shutting_down` and `timeout` leave the outcome
        // unknown (the request may have reached a leader that then failed), so only idempotent
        // calls retry them.
        let unsent =
            matches!(error, Error::Api { code: ErrorCode::LeaderUnreachable | ErrorCode::StorageError, .. });
        Failure { error, unsent }
    }

    fn retryable(&self, retry: Retry) -> bool {
        if self.scheme_mismatch() {
            return false;
        }
        match retry {
            Retry::Unsent | Retry::OnePass => self.unsent,
            Retry::Idempotent => {
                self.unsent
                    || matches!(
                        self.error,
                        Error::Timeout { .. }
                            | Error::Transport { .. }
                            | Error::Api {
                                code: ErrorCode::Timeout | ErrorCode::NoLeader | ErrorCode::ShuttingDown,
                                ..
                            }
                    )
            }
        }
    }
}

/// Whether `error` is a TLS handshake that got a plain-HTTP answer: rustls reports a record of
/// an invalid content type (an HTTP reply starts with `H`, no TLS record type).
fn is_plain_http_reply(error: &reqwest::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    // Bounded: error chains are finite and short; the bound guards against a cyclic one.
    for _ in 0..16 {
        let Some(current) = cause else { return false };
        // `io::Error::source` skips the error it wraps, so look inside it explicitly.
        let inner = current.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        for candidate in
            [Some(current), inner.map(|e| e as &(dyn std::error::Error + 'static))].into_iter().flatten()
        {
            if let Some(rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType)) =
                candidate.downcast_ref::<rustls::Error>()
            {
                return true;
            }
        }
        // The connector may carry the TLS error only as text (a boxed error of its own);
        // rustls's text for this case names the variant.
        if current.to_string().contains("InvalidContentType") {
            return true;
        }
        cause = current.source();
    }
    false
}

/// The last error of every endpoint a call tried, in the order they failed first.
#[derive(Default)]
struct FailedEndpoints {
    attempts: Vec<(String, String)>,
}

impl FailedEndpoints {
    fn record(&mut self, endpoint: &str, error: &Error) {
        let text = match error {
            Error::Transport { source, .. } => innermost(source.as_ref()),
            Error::Timeout { after, .. } => format!("no answer within {after:?}"),
            other => other.to_string(),
        };
        match self.attempts.iter_mut().find(|(e, _)| e == endpoint) {
            Some(slot) => slot.1 = text,
            None => self.attempts.push((endpoint.to_owned(), text)),
        }
    }

    /// `last` itself, unless it is a transport error after several endpoints failed: then a
    /// transport error whose source names every endpoint and its error.
    fn summarize(mut self, endpoints: &[String], last: Error) -> Error {
        match last {
            Error::Transport { endpoint, .. } if self.attempts.len() > 1 => {
                self.attempts.sort_by_key(|(e, _)| endpoints.iter().position(|x| x == e));
                Error::Transport {
                    endpoint,
                    source: Box::new(crate::error::Unreachable { attempts: self.attempts }),
                }
            }
            other => other,
        }
    }
}

/// The deepest cause of `error`: for reqwest errors, the OS or TLS error rather than "error
/// sending request for url (...)".
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current = error;
    // Bounded, as in `is_plain_http_reply`.
    for _ in 0..16 {
        match current.source() {
            Some(next) => current = next,
            None => break,
        }
    }
    current.to_string()
}

/// `http://host:port` without a trailing slash; a bare `host:port` gets `http://`.
fn normalize(url: &str) -> Result<String> {
    let invalid = |reason: &str| Error::InvalidEndpoint { url: url.to_owned(), reason: reason.to_owned() };
    let trimmed = url.trim();
    let with_scheme = if trimmed.contains("://") { trimmed.to_owned() } else { format!("http://{trimmed}") };
    let parsed = reqwest::Url::parse(&with_scheme).map_err(|error| invalid(&error.to_string()))?;
    if parsed.scheme() != "http" && parsed.scheme() != "https" {
        return Err(invalid("only http:// and https:// endpoints are supported"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if parsed.path() != "/" || parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(invalid("give only the scheme, host and port"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid("credentials in the URL are not supported"));
    }
    Ok(parsed.origin().ascii_serialization())
}

/// `pause` scaled by a random factor in [0.5, 1.5), so that clients do not retry in lockstep.
fn jitter(pause: Duration) -> Duration {
    pause.mul_f64(0.5 + rand::random::<f64>())
}

/// `text` as one URL path segment: unreserved bytes stay, everything else is percent-encoded, so
/// that a bad name reaches the server (which refuses it) instead of another route.
pub(crate) fn segment(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~' | b':') {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

/// Client-side timeout of a long-poll that asks the server to wait `wait_ms`.
pub(crate) fn long_poll_timeout(wait_ms: Option<u64>) -> Duration {
    let wait_ms = wait_ms.unwrap_or(0).min(permit_wire::WAIT_MS_MAX);
    REQUEST_TIMEOUT.max(Duration::from_millis(wait_ms) + LONG_POLL_MARGIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hint(url: &str) -> reqwest::header::HeaderMap {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(permit_wire::LEADER_HEADER, url.parse().unwrap());
        headers
    }

    #[test]
    fn a_leader_hint_moves_requests_only_to_one_of_the_endpoints() {
        let urls = ["http://a.example:7376".to_owned(), "http://b.example:7376".to_owned()];
        let transport = Transport::new(&urls, &TlsOptions::default()).unwrap();
        let preferred = || transport.preferred.load(Ordering::Relaxed);
        // Compared as normalized endpoints: scheme and host case, a trailing slash.
        transport.follow_leader_hint(&urls[0], &hint("HTTP://B.example:7376/"));
        assert_eq!(preferred(), 1);
        // A node that is not one of the endpoints, or a hint that is no URL, changes nothing.
        transport.follow_leader_hint(&urls[1], &hint("http://c.example:7376"));
        transport.follow_leader_hint(&urls[1], &hint("not a url"));
        transport.follow_leader_hint(&urls[1], &reqwest::header::HeaderMap::new());
        assert_eq!(preferred(), 1);
        transport.follow_leader_hint(&urls[1], &hint("http://a.example:7376"));
        assert_eq!(preferred(), 0);
        // One endpoint: nothing to choose.
        let single = Transport::new(&urls[..1], &TlsOptions::default()).unwrap();
        single.follow_leader_hint(&urls[0], &hint("http://b.example:7376"));
        assert_eq!(single.preferred.load(Ordering::Relaxed), 0);
    }
}
