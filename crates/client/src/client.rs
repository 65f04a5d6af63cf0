//! [`Client`]: the endpoints, sessions, and the session and system routes.

use std::sync::Arc;
use std::time::Duration;

use permit_wire::{
    CreateSessionRequest, Health, KeepaliveBatchRequest, KeepaliveBatchResponse, KeepaliveResponse,
    KeepaliveResult, SessionCreated, SessionView, KEEPALIVE_BATCH_MAX,
};
use reqwest::Method;

use crate::error::Result;
use crate::session::{Session, SessionOptions};
use crate::transport::{segment, Call, Retry, Transport};

/// A handle to a Permit server or cluster: cheap to clone, shared by every session made from it.
///
/// The high-level entry points are [`Client::session`] (a [`Session`] that keeps itself alive,
/// acquires [`Permit`](crate::Permit)s and [`Leadership`](crate::Leadership)s, and claims queue
/// [`Item`](crate::Item)s), [`Client::leader`] and [`Client::push`]. The other methods map one to
/// one to the HTTP routes.
///
/// Every request has a client-side timeout (10 s, or the long-poll's wait plus 5 s). With several
/// endpoints, a request that cannot connect, or is answered `no_leader`, moves on to the next one;
/// calls that are safe to repeat are retried a bounded number of times with backoff; and once an
/// answer names the leader (`permit-leader`) and it is one of the endpoints, requests go there,
/// saving the hop a follower would forward them over.
///
/// # Examples
///
/// Cap a job at four concurrent runs across machines:
///
/// ```no_run
/// use std::time::Duration;
/// use permit_client::Client;
/// # async fn run() -> permit_client::Result<()> {
/// let client = Client::new("http://127.0.0.1:7376")?;
/// let session = client.session(Duration::from_secs(10)).await?;
/// let permit = session.acquire("nightly.reports", 1).await?;
/// // ... run the job, passing permit.token() to anything that can check it ...
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Client {
    pub(crate) transport: Arc<Transport>,
    /// Coalesces the background keepalives of every session made through this client (and its
    /// clones) into batched requests.
    pub(crate) batcher: Arc<crate::keepalive::Batcher>,
}

impl Client {
    /// A client of the server at `url` (`http://host:port` or `https://host:port`; a bare
    /// `host:port` gets `http://`). Over HTTPS the system's roots are trusted; use
    /// [`Client::builder`] for a private CA or a client certificate.
    ///
    /// Nothing is sent until the first call.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// # Ok::<(), permit_client::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidEndpoint`](crate::Error::InvalidEndpoint) if `url` is not an `http://` or `https://` URL with a host and no path.
    pub fn new(url: &str) -> Result<Client> {
        Client::with_endpoints([url])
    }

    /// A client of a cluster reachable at any of `urls`: requests go to the endpoint that answered
    /// last (or that an answer named as the leader, if it is one of `urls`) and fail over to the
    /// next on connection errors and `no_leader`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = permit_client::Client::with_endpoints([
    ///     "http://10.0.0.1:7376",
    ///     "http://10.0.0.2:7376",
    ///     "http://10.0.0.3:7376",
    /// ])?;
    /// # Ok::<(), permit_client::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidEndpoint`](crate::Error::InvalidEndpoint) if the list is empty or a URL is not an `http://` or `https://` URL.
    pub fn with_endpoints<I, S>(urls: I) -> Result<Client>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Client::builder(urls).build()
    }

    /// A [`ClientBuilder`](crate::ClientBuilder) for these endpoints, for TLS options (a
    /// private CA, a client certificate).
    pub fn builder<I, S>(urls: I) -> crate::ClientBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        crate::ClientBuilder::new(urls.into_iter().map(|url| url.as_ref().to_owned()).collect())
    }

    /// The same client, authenticating every request with this token's secret (for servers
    /// started with `permit serve --auth`). Sessions opened through it belong to that token.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let secret = std::env::var("PERMIT_AUTH_TOKEN").unwrap_or_default();
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?.auth_token(secret);
    /// # Ok::<(), permit_client::Error>(())
    /// ```
    pub fn auth_token(self, secret: impl Into<String>) -> Client {
        // A new batcher: sessions of different tokens never share a batch.
        Client { transport: Arc::new(self.transport.with_auth_token(secret.into())), batcher: Arc::default() }
    }

    /// `GET /v1/sessions`: one page of live sessions in id order (with auth: the caller's own
    /// and those it may read). Pass the page's `next_after` as `after` for the next one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let page = client.list_sessions(None, 100).await?;
    /// for session in page.sessions {
    ///     println!("{} {:?} {:?} ms left", session.id, session.name, session.remaining_ms);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` for a limit outside 1..=1000, and transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn list_sessions(&self, after: Option<&str>, limit: u32) -> Result<permit_wire::SessionList> {
        let mut call = crate::transport::Call::new(reqwest::Method::GET, "/v1/sessions".into())
            .query("limit", limit)
            .retry(crate::transport::Retry::Idempotent);
        if let Some(after) = after {
            call = call.query("after", after);
        }
        self.transport.send(&call).await?.json()
    }

    /// The endpoints, normalized (`http://host:port`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let client = permit_client::Client::new("127.0.0.1:7376")?;
    /// assert_eq!(client.endpoints(), ["http://127.0.0.1:7376"]);
    /// # Ok::<(), permit_client::Error>(())
    /// ```
    pub fn endpoints(&self) -> &[String] {
        self.transport.endpoints()
    }

    /// Opens a session with this TTL and keeps it alive in the background until the last handle
    /// is dropped or [`Session::close`] is called.
    ///
    /// The TTL is rounded down to whole milliseconds; the server accepts 200 ms to 24 h.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let session = client.session(Duration::from_secs(10)).await?;
    /// println!("session {}", session.id());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` for a TTL out of range, `limit_exceeded` when the server has too many
    /// sessions, and [`Error::Transport`](crate::Error::Transport) / [`Error::Timeout`](crate::Error::Timeout) when no endpoint answers.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the server created the session, nobody keeps it alive and
    /// it expires after its TTL.
    pub async fn session(&self, ttl: Duration) -> Result<Session> {
        self.session_with(SessionOptions { ttl, name: None }).await
    }

    /// Like [`Client::session`], with a name shown to humans by `permit show` and the API.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use permit_client::SessionOptions;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let options = SessionOptions { ttl: Duration::from_secs(5), name: Some("backup@host-7".into()) };
    /// let session = client.session_with(options).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::session`]; also `invalid_argument` for a name over 256 bytes.
    ///
    /// # Cancel safety
    ///
    /// As [`Client::session`].
    pub async fn session_with(&self, options: SessionOptions) -> Result<Session> {
        Session::open(self.clone(), options).await
    }

    /// `POST /v1/sessions`: creates a session that nobody keeps alive (see [`Client::session`]).
    ///
    /// Retried only when the server certainly did not create it, since a repeat would open a
    /// second session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::CreateSessionRequest;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let created = client.create_session(&CreateSessionRequest { ttl_ms: Some(5_000), name: None }).await?;
    /// client.keepalive(&created.id).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` (TTL or name out of range), `limit_exceeded`, transport errors.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave a session on the server; it expires after its TTL.
    pub async fn create_session(&self, request: &CreateSessionRequest) -> Result<SessionCreated> {
        let call = Call::new(Method::POST, "/v1/sessions".into()).body(request).retry(Retry::Unsent);
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/sessions/{id}/keepalive`: the session lives at least its TTL after this request
    /// was sent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(id: &str) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let answer = client.keepalive(id).await?;
    /// println!("alive for another {} ms", answer.ttl_ms);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `session_not_found` if the session expired or was closed; transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a keepalive changes nothing but the deadline.
    pub async fn keepalive(&self, id: &str) -> Result<KeepaliveResponse> {
        self.keepalive_within(id, crate::transport::REQUEST_TIMEOUT, Retry::Idempotent).await
    }

    /// `POST /v1/sessions/keepalive`: keeps many sessions alive with one request per 1024 ids
    /// (`wire::KEEPALIVE_BATCH_MAX`), and returns one result per id, in order: renewed (the
    /// session lives at least its TTL after the request was sent) or refused with the error the
    /// single keepalive would give. Sessions made with [`Client::session`] need none of this: their
    /// background keepalives are already batched.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::KeepaliveResult;
    /// # async fn run(ids: &[String]) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// for result in client.keepalive_many(ids).await? {
    ///     match result {
    ///         KeepaliveResult::Renewed { id, ttl_ms } => println!("{id}: alive for another {ttl_ms} ms"),
    ///         KeepaliveResult::Refused { id, error } => println!("{id}: {} ({})", error.message, error.code),
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` for a malformed id or an id given twice (nothing of that request's
    /// chunk is renewed), `method_not_allowed` from a server older than the batch route, and
    /// transport errors. With more than 1024 ids, an error may come after earlier chunks were
    /// renewed.
    ///
    /// # Cancel safety
    ///
    /// Safe: a keepalive changes nothing but deadlines.
    pub async fn keepalive_many<S: AsRef<str>>(&self, ids: &[S]) -> Result<Vec<KeepaliveResult>> {
        let mut results = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(KEEPALIVE_BATCH_MAX) {
            let sessions = chunk.iter().map(|id| id.as_ref().to_owned()).collect();
            let answer =
                self.keepalive_batch(sessions, crate::transport::REQUEST_TIMEOUT, Retry::Idempotent).await?;
            results.extend(answer.sessions);
        }
        Ok(results)
    }

    /// One `POST /v1/sessions/keepalive`, its answer checked to hold one result per id, in order.
    pub(crate) async fn keepalive_batch(
        &self,
        sessions: Vec<String>,
        timeout: Duration,
        retry: Retry,
    ) -> Result<KeepaliveBatchResponse> {
        let request = KeepaliveBatchRequest { sessions };
        let call = Call::new(Method::POST, "/v1/sessions/keepalive".into())
            .body(&request)
            .timeout(timeout)
            .retry(retry);
        let reply = self.transport.send(&call).await?;
        let answer: KeepaliveBatchResponse = reply.json()?;
        let matches = answer.sessions.len() == request.sessions.len()
            && answer.sessions.iter().zip(&request.sessions).all(|(result, id)| result.id() == id);
        if !matches {
            return Err(crate::Error::Protocol {
                endpoint: reply.endpoint,
                status: reply.status,
                message: "the batched keepalive's results do not match the ids sent".into(),
            });
        }
        Ok(answer)
    }

    pub(crate) async fn keepalive_within(
        &self,
        id: &str,
        timeout: Duration,
        retry: Retry,
    ) -> Result<KeepaliveResponse> {
        let call = Call::new(Method::POST, format!("/v1/sessions/{}/keepalive", segment(id)))
            .timeout(timeout)
            .retry(retry);
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/sessions/{id}`: the session's holds and waits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(id: &str) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// for hold in client.get_session(id).await?.holds {
    ///     println!("{} permits of {} (token {})", hold.permits, hold.name, hold.token);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `session_not_found`; transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn get_session(&self, id: &str) -> Result<SessionView> {
        let call = Call::new(Method::GET, format!("/v1/sessions/{}", segment(id)));
        self.transport.send(&call).await?.json()
    }

    /// `DELETE /v1/sessions/{id}`: closes a session, releasing its holds and cancelling its waits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(id: &str) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// client.close_session(id).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `session_not_found` (also when a retried close had already succeeded); transport errors.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not close the session.
    pub async fn close_session(&self, id: &str) -> Result<()> {
        let call = Call::new(Method::DELETE, format!("/v1/sessions/{}", segment(id)));
        self.transport.send(&call).await.map(drop)
    }

    /// `GET /v1/health` of the first endpoint that answers: `ok` when it can serve (a member that
    /// knows a Raft leader, with a live Raft core and a writable data dir), `degraded` otherwise,
    /// with the `reason` (the server answers 503 then; this returns the body either way).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let health = client.health().await?;
    /// println!("{} (node {}, role {})", health.status, health.node_id, health.raft_role);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Transport errors when no endpoint answers; [`Error::Protocol`](crate::Error::Protocol) for a body that is not a
    /// health report.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn health(&self) -> Result<Health> {
        let call = Call::new(Method::GET, "/v1/health".into()).retry(Retry::OnePass).accept(503);
        self.transport.send(&call).await?.json()
    }
}
