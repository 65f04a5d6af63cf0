//! The one error type of the client.

use std::time::Duration;

use permit_wire::ErrorCode;

/// What can go wrong talking to Permit.
///
/// A [`Error::Timeout`] (or a transport error after the request was sent) leaves the outcome
/// unknown, not failed: the write may have been applied. Every call is safe to repeat except
/// creating a session (a repeat may open a second one, which simply expires) and pushing a
/// queue item without a key (a repeat may push it twice). Acquire and campaign are idempotent
/// per session and name, so repeating them returns the same grant; a repeated ack or nack never
/// applies twice, but may be answered `claim_lost` when the first applied.
///
/// # Examples
///
/// ```no_run
/// use permit_client::{Client, Error, ErrorCode};
/// # async fn run() -> permit_client::Result<()> {
/// let client = Client::new("http://127.0.0.1:7376")?;
/// match client.get_semaphore("db.orders").await {
///     Ok(view) => println!("{} of {} free", view.available, view.capacity),
///     Err(error) if error.code() == Some(ErrorCode::SemaphoreNotFound) => println!("no such semaphore"),
///     Err(error) => return Err(error),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server refused the request with an error code.
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        /// The HTTP status.
        status: u16,
        /// The stable error code ([`ErrorCode::Unknown`] for codes newer than this client).
        code: ErrorCode,
        /// The server's explanation, for humans.
        message: String,
    },
    /// No endpoint could be reached, or the connection failed mid-request.
    ///
    /// When more than one endpoint was tried, `source` lists every endpoint with its last error
    /// (a [`Unreachable`]); otherwise it is what the HTTP library reported.
    #[error("cannot reach {endpoint}")]
    Transport {
        /// The endpoint tried last.
        endpoint: String,
        /// What the HTTP library reported, or every endpoint's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// No answer came within the client-side timeout; the outcome is unknown.
    #[error("no answer from {endpoint} within {after:?}; the outcome is unknown")]
    Timeout {
        /// The endpoint tried last.
        endpoint: String,
        /// How long the client waited.
        after: Duration,
    },
    /// The server answered something this client does not understand.
    #[error("unexpected answer from {endpoint} (HTTP {status}): {message}")]
    Protocol {
        /// The endpoint that answered.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// What was wrong with it.
        message: String,
    },
    /// An endpoint URL is not an `http://host:port` address.
    #[error("invalid endpoint {url:?}: {reason}")]
    InvalidEndpoint {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// `https://` against a port that serves plain HTTP: the TLS handshake got an HTTP answer.
    /// Nothing was done, and retrying cannot help: fix the address. (The reverse, `http://`
    /// against a TLS port, is the server's answer [`ErrorCode::TlsRequired`].)
    #[error("{endpoint}: {reason}")]
    SchemeMismatch {
        /// The endpoint as configured.
        endpoint: String,
        /// What was found, and the address to use instead.
        reason: String,
    },
    /// The semaphore's rate had no room for a take ([`Client::take`](crate::Client::take)):
    /// nothing was taken. The server's code is [`ErrorCode::RateLimited`] (HTTP 429).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use permit_client::{Client, Error};
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = Client::new("http://127.0.0.1:7376")?;
    /// match client.take("api.quota", 1, Duration::ZERO).await {
    ///     Ok(token) => println!("call the API (take {token})"),
    ///     Err(Error::RateLimited { retry_after, .. }) => println!("try again in {retry_after:?}"),
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[error("{message} (rate_limited, retry after {retry_after:?})")]
    RateLimited {
        /// How long until the rate allows the take, by the leader's clock when it answered
        /// (the server's `retry_after_ms`; zero if it gave none).
        retry_after: Duration,
        /// The server's explanation, for humans.
        message: String,
    },
    /// A value is out of range before anything was sent (for example a TTL that does not fit).
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// Which value, and its range.
        message: String,
    },
    /// The session is gone: the server does not know it (expired or closed), or its conservative
    /// local deadline passed before a keepalive was acknowledged.
    #[error("the session expired or was closed")]
    SessionExpired,
    /// This session already holds (or is acquiring) that semaphore or election through another
    /// guard; nothing was sent. A second guard would share the first one's hold, and releasing
    /// it would end the hold the first one still guards. Use the guard you have, or another
    /// session.
    #[error("this session already holds or is acquiring {object} {name:?}; use the guard you have, or another session")]
    AlreadyHeld {
        /// `"semaphore"` or `"election"`.
        object: &'static str,
        /// Its name.
        name: String,
    },
}

impl Error {
    /// The error code, for server refusals; [`Error::SessionExpired`] reports
    /// [`ErrorCode::SessionNotFound`] so that both ways of learning it look alike, and
    /// [`Error::RateLimited`] reports [`ErrorCode::RateLimited`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::{Client, ErrorCode};
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = Client::new("http://127.0.0.1:7376")?;
    /// let error = client.keepalive("00000000000000000000000000000000").await.unwrap_err();
    /// assert_eq!(error.code(), Some(ErrorCode::SessionNotFound));
    /// # Ok(())
    /// # }
    /// ```
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Api { code, .. } => Some(code.clone()),
            Error::SessionExpired => Some(ErrorCode::SessionNotFound),
            Error::RateLimited { .. } => Some(ErrorCode::RateLimited),
            _ => None,
        }
    }

    /// Whether the request may have taken effect although it failed: a client-side timeout, a
    /// connection lost after sending, or a server `timeout`/`internal` error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::Client;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = Client::new("http://127.0.0.1:7376")?;
    /// if let Err(error) = client.put_semaphore("db.orders", 4).await {
    ///     if error.is_outcome_unknown() {
    ///         client.put_semaphore("db.orders", 4).await?; // Idempotent: safe to repeat.
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn is_outcome_unknown(&self) -> bool {
        match self {
            Error::Timeout { .. } | Error::Transport { .. } => true,
            Error::Api { code, .. } => matches!(code, ErrorCode::Timeout | ErrorCode::Internal),
            _ => false,
        }
    }

    pub(crate) fn is_session_not_found(&self) -> bool {
        matches!(self, Error::Api { code: ErrorCode::SessionNotFound, .. } | Error::SessionExpired)
    }

    /// Maps the server's `session_not_found` to [`Error::SessionExpired`].
    pub(crate) fn into_session_error(self) -> Error {
        if self.is_session_not_found() {
            Error::SessionExpired
        } else {
            self
        }
    }
}

/// The client's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The source of an [`Error::Transport`] after more than one endpoint was tried: each endpoint
/// with the last error it gave, in the order of the client's endpoints.
#[derive(Debug)]
pub struct Unreachable {
    /// `(endpoint, error)` for every endpoint that failed.
    pub attempts: Vec<(String, String)>,
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tried {} endpoints: ", self.attempts.len())?;
        for (i, (endpoint, error)) in self.attempts.iter().enumerate() {
            let separator = if i == 0 { "" } else { "; " };
            write!(f, "{separator}{endpoint}: {error}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Unreachable {}
