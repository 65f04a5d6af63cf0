//! The background task that keeps a session alive and tracks its conservative deadline, and the
//! per-[`Client`] [`Batcher`] that carries the keepalives of all its sessions in shared requests.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permit_wire::{ErrorCode, KeepaliveResult, KEEPALIVE_BATCH_MAX};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::client::Client;
use crate::error::Error;
use crate::session::{Liveness, SessionState};
use crate::transport::{Retry, REQUEST_TIMEOUT};

/// Shortest and longest pause between keepalive retries while in jeopardy.
const RETRY_PAUSE_MIN: Duration = Duration::from_millis(10);
const RETRY_PAUSE_MAX: Duration = Duration::from_secs(1);
/// Shortest client-side timeout of one keepalive.
const KEEPALIVE_TIMEOUT_MIN: Duration = Duration::from_millis(100);
/// How long keepalives go one per session after the server answered the batch route 404/405,
/// before the route is tried again (the cluster may have been upgraded meanwhile).
const BATCH_ROUTE_RETRY: Duration = Duration::from_secs(60);

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
            let state = self.liveness.state();
            let next = match state {
                SessionState::Alive => self.acknowledged_sent + self.ttl / 3,
                SessionState::Jeopardy => Instant::now() + retry_pause(self.ttl),
                SessionState::Expired => return Ending::Gone,
            };
            // Past half its period, a healthy session rides along with any batch this client
            // sends: the sessions of one client fall into step and share their requests.
            let ride_from = self.acknowledged_sent + self.ttl / 6;
            tokio::select! {
                () = tokio::time::sleep_until(next.min(deadline)) => {}
                () = self.client.batcher.departure_after(ride_from), if state == SessionState::Alive => {}
            }
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
                self.client.batcher.keepalive(&self.client, &self.id, attempt_timeout(left, endpoints));
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
                Ok(Ok(Renewal { sent, ttl_ms })) => {
                    // `sent` is when the request that carried this keepalive was sent (at or
                    // after this loop asked): the server renewed after that.
                    self.acknowledged_sent = sent;
                    let ttl = self.ttl.min(Duration::from_millis(ttl_ms));
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

/// An acknowledged keepalive: when the request carrying it was sent, and the session's TTL.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Renewal {
    pub sent: Instant,
    pub ttl_ms: u64,
}

/// A keepalive's outcome; the error is shared by every session of a failed batch.
type Outcome = Result<Renewal, Arc<Error>>;

/// Group commit of one [`Client`]'s keepalives: a session asking for one is sent at once when no
/// batch is in flight; asks that come while one is in flight wait and all go in the next request
/// (`POST /v1/sessions/keepalive`, up to [`KEEPALIVE_BATCH_MAX`] ids each) when it returns. A
/// server without the batch route (404/405) gets one request per session for
/// [`BATCH_ROUTE_RETRY`], then the route is tried again.
#[derive(Debug, Default)]
pub(crate) struct Batcher {
    queue: Mutex<Queue>,
    /// Until when keepalives go one per session (the server answered the batch route 404/405).
    unbatched_until: Mutex<Option<Instant>>,
    /// Woken when a batch is about to be sent (see [`Batcher::departure_after`]).
    departing: Notify,
}

#[derive(Debug, Default)]
struct Queue {
    /// A sender task is running; it takes every ask queued before it stops.
    sending: bool,
    asks: Vec<Ask>,
}

#[derive(Debug)]
struct Ask {
    id: String,
    timeout: Duration,
    reply: oneshot::Sender<Reply>,
}

#[derive(Debug)]
enum Reply {
    Done(Outcome),
    /// The server has no batch route: send this keepalive alone.
    Unsupported,
}

impl Batcher {
    /// Keeps session `id` alive through the next batch (or alone, on an older server);
    /// `timeout` bounds the request (a batch takes the shortest timeout of its asks).
    async fn keepalive(&self, client: &Client, id: &str, timeout: Duration) -> Outcome {
        if !self.unbatched() {
            let (reply, answer) = oneshot::channel();
            let start = {
                let mut queue = self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                queue.asks.push(Ask { id: id.to_owned(), timeout, reply });
                !std::mem::replace(&mut queue.sending, true)
            };
            if start {
                tokio::spawn(Batcher::send_batches(client.clone()));
            }
            match answer.await {
                Ok(Reply::Done(outcome)) => return outcome,
                Ok(Reply::Unsupported) => {}
                Err(_) => {
                    return Err(Arc::new(Error::Protocol {
                        endpoint: String::new(),
                        status: 0,
                        message: "the keepalive batcher stopped".into(),
                    }))
                }
            }
        }
        let sent = Instant::now();
        match client.keepalive_within(id, timeout, Retry::OnePass).await {
            Ok(answer) => Ok(Renewal { sent, ttl_ms: answer.ttl_ms }),
            Err(error) => Err(Arc::new(error)),
        }
    }

    /// Whether keepalives go one per session for now.
    fn unbatched(&self) -> bool {
        let until = *self.unbatched_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        until.is_some_and(|until| Instant::now() < until)
    }

    /// Resolves at the first batch sent after `from`.
    async fn departure_after(&self, from: Instant) {
        tokio::time::sleep_until(from).await;
        self.departing.notified().await;
    }

    /// Sends the queued asks, a batch at a time, until none is left.
    async fn send_batches(client: Client) {
        let batcher = client.batcher.clone();
        loop {
            // Sessions due soon join this batch rather than the next one.
            batcher.departing.notify_waiters();
            tokio::task::yield_now().await;
            let asks: Vec<Ask> = {
                let mut queue = batcher.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                // Asks whose session stopped waiting (its timeout passed) are dropped.
                queue.asks.retain(|ask| !ask.reply.is_closed());
                if queue.asks.is_empty() {
                    queue.sending = false;
                    return;
                }
                let take = queue.asks.len().min(KEEPALIVE_BATCH_MAX);
                queue.asks.drain(..take).collect()
            };
            batcher.send_batch(&client, asks).await;
        }
    }

    async fn send_batch(&self, client: &Client, asks: Vec<Ask>) {
        if self.unbatched() {
            // Asked before an earlier batch found the route missing.
            for ask in asks {
                let _ = ask.reply.send(Reply::Unsupported);
            }
            return;
        }
        // An id asked twice (a session that gave up on an earlier ask) is sent once.
        let mut ids: Vec<String> = Vec::with_capacity(asks.len());
        let mut slots: HashMap<String, usize> = HashMap::with_capacity(asks.len());
        let slot_of: Vec<usize> = asks
            .iter()
            .map(|ask| {
                *slots.entry(ask.id.clone()).or_insert_with(|| {
                    ids.push(ask.id.clone());
                    ids.len() - 1
                })
            })
            .collect();
        let timeout = asks.iter().map(|ask| ask.timeout).min().unwrap_or(REQUEST_TIMEOUT);
        // Taken before the request leaves: every renewal it carries happens after this instant.
        let sent = Instant::now();
        match client.keepalive_batch(ids, timeout, Retry::OnePass).await {
            Ok(answer) => {
                for (ask, slot) in asks.into_iter().zip(slot_of) {
                    let outcome = match &answer.sessions[slot] {
                        KeepaliveResult::Renewed { ttl_ms, .. } => Ok(Renewal { sent, ttl_ms: *ttl_ms }),
                        KeepaliveResult::Refused { error, .. } => Err(Arc::new(Error::Api {
                            status: error.code.http_status(),
                            code: error.code.clone(),
                            message: error.message.clone(),
                        })),
                    };
                    let _ = ask.reply.send(Reply::Done(outcome));
                }
            }
            Err(error) if lacks_batch_route(&error) => {
                tracing::debug!(%error, "the server has no batched keepalive; one request per session");
                *self.unbatched_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(Instant::now() + BATCH_ROUTE_RETRY);
                for ask in asks {
                    let _ = ask.reply.send(Reply::Unsupported);
                }
            }
            Err(error) => {
                let error = Arc::new(error);
                for ask in asks {
                    let _ = ask.reply.send(Reply::Done(Err(error.clone())));
                }
            }
        }
    }
}

/// Whether `error` is an older server's answer to the batch route it does not have: 405 (the
/// path matched `/v1/sessions/{id}`) or a 404 other than `session_not_found`.
fn lacks_batch_route(error: &Error) -> bool {
    match error {
        Error::Api { status: 405, .. } => true,
        Error::Api { status: 404, code, .. } => *code != ErrorCode::SessionNotFound,
        Error::Protocol { status, .. } => matches!(status, 404 | 405),
        _ => false,
    }
}
