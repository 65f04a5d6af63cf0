//! The background task that keeps a session alive and tracks its conservative deadline.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::client::Client;
use crate::session::{Liveness, SessionState};
use crate::transport::{Retry, REQUEST_TIMEOUT};

/// Shortest and longest pause between keepalive retries while in jeopardy.
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(10);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);
/// Shortest client-side timeout of one keepalive.
const KEEPALIVE_TIMEOUT_MIN: Duration = Duration::from_millis(100);

/// Why the keepalive task was told to stop.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The last handle is gone: close the session on the server.
    Close,
    /// [`Session::close`](crate::Session::close) closes it itself.
    Detach,
}

/// The keepalive loop of one session.
pub(crate) struct Task {
    pub client: Client,
    pub id: String,
    pub ttl: Duration,
    pub liveness: Arc<Liveness>,
    /// When the last acknowledged keepalive (or the create) was sent.
    pub acknowledged_sent: Instant,
}

/// How the keepalive loop ended.
enum Ending {
    /// The server no longer knows the session, or someone marked it expired.
    Gone,
    /// The conservative deadline passed; the server may still keep the session a little longer.
    DeadlinePassed,
}

impl Task {
    /// Keeps the session alive until it ends or `stop` fires; then marks it expired and, unless
    /// detached or already gone, closes it on the server (best effort).
    pub async fn run(self, stop: oneshot::Receiver<Stop>) {
        let (client, id, liveness) = (self.client.clone(), self.id.clone(), self.liveness.clone());
        let close = tokio::select! {
            stop = stop => matches!(stop, Ok(Stop::Close) | Err(_)),
            ending = self.keep_alive() => matches!(ending, Ending::DeadlinePassed),
        };
        liveness.expire();
        if close {
            if let Err(error) = client.close_session(&id).await {
                tracing::debug!(session = %id, %error, "closing the session failed; it expires on its own");
            }
        }
    }

    async fn keep_alive(mut self) -> Ending {
        loop {
            let deadline = self.liveness.deadline();
            let next = match self.liveness.state() {
                SessionState::Alive => self.acknowledged_sent + self.ttl / 3,
                SessionState::Jeopardy => Instant::now() + retry_pause(self.ttl),
                SessionState::Expired => return Ending::Gone,
            };
            tokio::time::sleep_until(next.min(deadline)).await;
            if self.liveness.state() == SessionState::Expired {
                return Ending::Gone;
            }
            let sent = Instant::now();
            if sent >= deadline {
                tracing::warn!(session = %self.id, "session expired locally: no keepalive acknowledged in time");
                return Ending::DeadlinePassed;
            }
            let left = deadline - sent;
            let endpoints = self.client.endpoints().len() as u32;
            let keepalive =
                self.client.keepalive_within(&self.id, attempt_timeout(left, endpoints), Retry::OnePass);
            // An answer later than the next keepalive would be due puts the session in jeopardy,
            // but is still waited for: it may yet extend the deadline.
            let overdue = sent + self.ttl / 3;
            let liveness = &self.liveness;
            let patient = async move {
                tokio::pin!(keepalive);
                tokio::select! {
                    biased;
                    answer = &mut keepalive => answer,
                    () = tokio::time::sleep_until(overdue) => {
                        liveness.jeopardy();
                        keepalive.await
                    }
                }
            };
            match tokio::time::timeout(left, patient).await {
                Ok(Ok(answer)) => {
                    self.acknowledged_sent = sent;
                    let ttl = self.ttl.min(Duration::from_millis(answer.ttl_ms));
                    self.liveness.renew(sent + ttl);
                }
                Ok(Err(error)) if error.is_session_not_found() => {
                    tracing::warn!(session = %self.id, "the server no longer knows the session");
                    return Ending::Gone;
                }
                Ok(Err(error)) => {
                    tracing::debug!(session = %self.id, %error, "keepalive failed; session in jeopardy");
                    self.liveness.jeopardy();
                }
                Err(_) => self.liveness.jeopardy(),
            }
        }
    }
}

/// Pause between keepalive retries in jeopardy: a tenth of the TTL, bounded.
fn retry_pause(ttl: Duration) -> Duration {
    (ttl / 10).clamp(RETRY_PAUSE_MIN, RETRY_PAUSE_MAX)
}

/// Client-side timeout of one keepalive attempt: the time left before the deadline, shared by the
/// endpoints, so that a hung endpoint leaves time to try the others; a slow answer from the only
/// endpoint is still worth waiting for.
fn attempt_timeout(left: Duration, endpoints: u32) -> Duration {
    (left / endpoints.max(1)).clamp(KEEPALIVE_TIMEOUT_MIN, REQUEST_TIMEOUT)
}
