//! [`Session`]: a server-side session kept alive by a background task, and its local state.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permit_wire::CreateSessionRequest;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::hold::{Claim, Claims, Object};
use crate::keepalive::{self, Stop};
use crate::semaphores::duration_ms;

/// Where a session stands, as this client knows it.
///
/// The client counts the session's life from when each keepalive was *sent*, so its local
/// deadline is never later than the server's: a session this client still calls alive is alive
/// on the server (as long as the two clocks run at the same rate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionState {
    /// The last keepalive was acknowledged.
    Alive,
    /// A keepalive failed (network error, 5xx) or is overdue (no answer within a third of the
    /// TTL), but the conservative deadline has not passed: the session may still be alive.
    /// Failed keepalives are retried quickly (every tenth of the TTL).
    Jeopardy,
    /// The session is gone: the server answered `session_not_found`, it was closed, or the
    /// conservative deadline passed without an acknowledged keepalive. It never comes back.
    Expired,
}

/// How to open a session (see [`Client::session_with`]).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use permit_client::SessionOptions;
/// let options = SessionOptions { ttl: Duration::from_secs(3), name: Some("worker-1".into()) };
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionOptions {
    /// Time to live after the last keepalive, 200 ms to 24 h; keepalives go out every third of
    /// it. Whole milliseconds.
    pub ttl: Duration,
    /// A name for humans, at most 256 bytes.
    pub name: Option<String>,
}

impl Default for SessionOptions {
    /// A 10 s TTL and no name (the server's defaults).
    fn default() -> SessionOptions {
        SessionOptions { ttl: Duration::from_secs(10), name: None }
    }
}

/// A session: the server-side identity that holds permits and leadership, kept alive by a
/// background task that sends a keepalive every third of the TTL.
///
/// Handles are cheap clones; every [`Permit`](crate::Permit) and
/// [`Leadership`](crate::Leadership) keeps one. When the last handle is dropped the task stops
/// and closes the session in the background (releasing whatever it still holds); call
/// [`Session::close`] to close it and wait for the answer.
///
/// A TTL alone never gives mutual exclusion: a paused process may wake up after its session
/// expired. Watch [`Session::state`] or [`Permit::lost`](crate::Permit::lost), and pass fencing
/// tokens to the resources you protect.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use permit_client::{Client, SessionState};
/// # async fn run() -> permit_client::Result<()> {
/// let client = Client::new("http://127.0.0.1:7376")?;
/// let session = client.session(Duration::from_secs(10)).await?;
/// let mut state = session.watch_state();
/// tokio::spawn(async move {
///     while state.changed().await.is_ok() {
///         if *state.borrow() == SessionState::Jeopardy {
///             eprintln!("keepalives are failing");
///         }
///     }
/// });
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Session {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    id: String,
    ttl: Duration,
    liveness: Arc<Liveness>,
    /// Tells the keepalive task to stop; dropping it (with the last handle) stops it too.
    stop: Mutex<Option<oneshot::Sender<Stop>>>,
    /// The names this session holds or is acquiring (one guard each).
    claims: Claims,
    /// The queue place of the latest wait, as the server last reported it.
    queue: watch::Sender<Option<QueuePosition>>,
}

/// Where a waiting acquire or campaign of a session stands in its queue (see
/// [`Session::watch_queue_position`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuePosition {
    /// The semaphore or election waited on.
    pub name: String,
    /// 1-based position in its queue (among the waiters, or among the candidates).
    pub position: u64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
            let _ = stop.send(Stop::Close);
        }
    }
}

/// The session's state and conservative deadline, shared by the handles and the keepalive task.
#[derive(Debug)]
pub(crate) struct Liveness {
    state: watch::Sender<SessionState>,
    deadline: watch::Sender<Instant>,
}

impl Liveness {
    fn new(deadline: Instant) -> Liveness {
        Liveness { state: watch::Sender::new(SessionState::Alive), deadline: watch::Sender::new(deadline) }
    }

    pub fn state(&self) -> SessionState {
        *self.state.borrow()
    }

    pub fn deadline(&self) -> Instant {
        *self.deadline.borrow()
    }

    /// A keepalive sent at some instant was acknowledged: the session lives until `deadline`.
    pub fn renew(&self, deadline: Instant) {
        if self.state() == SessionState::Expired {
            return;
        }
        self.deadline.send_if_modified(|current| {
            let later = deadline > *current;
            *current = (*current).max(deadline);
            later
        });
        self.state
            .send_if_modified(|state| std::mem::replace(state, SessionState::Alive) != SessionState::Alive);
    }

    /// A keepalive failed without an answer that settles it.
    pub fn jeopardy(&self) {
        self.state.send_if_modified(|state| {
            let changed = *state == SessionState::Alive;
            if changed {
                *state = SessionState::Jeopardy;
            }
            changed
        });
    }

    /// The session is gone for good.
    pub fn expire(&self) {
        self.state.send_if_modified(|state| {
            std::mem::replace(state, SessionState::Expired) != SessionState::Expired
        });
    }

    /// Resolves when the session is expired, including when the conservative deadline passes.
    pub fn expired(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut state = self.state.subscribe();
        let mut deadline = self.deadline.subscribe();
        async move {
            loop {
                if *state.borrow_and_update() == SessionState::Expired {
                    return;
                }
                let at = *deadline.borrow_and_update();
                if Instant::now() >= at {
                    return;
                }
                tokio::select! {
                    changed = state.changed() => if changed.is_err() { return },
                    changed = deadline.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep_until(at) => {}
                }
            }
        }
    }
}

impl Session {
    /// Creates the session and starts its keepalive task.
    pub(crate) async fn open(client: Client, options: SessionOptions) -> Result<Session> {
        let ttl_ms = duration_ms(options.ttl);
        let sent = Instant::now();
        let created =
            client.create_session(&CreateSessionRequest { ttl_ms: Some(ttl_ms), name: options.name }).await?;
        let ttl = Duration::from_millis(created.ttl_ms.min(ttl_ms));
        let liveness = Arc::new(Liveness::new(sent + ttl));
        let (stop, stopped) = oneshot::channel();
        let task = keepalive::Task {
            client: client.clone(),
            id: created.id.clone(),
            ttl,
            liveness: liveness.clone(),
            acknowledged_sent: sent,
        };
        tokio::spawn(task.run(stopped));
        let inner = Inner {
            client,
            id: created.id,
            ttl,
            liveness,
            stop: Mutex::new(Some(stop)),
            claims: Claims::default(),
            queue: watch::Sender::new(None),
        };
        Ok(Session { inner: Arc::new(inner) })
    }

    /// Claims `name` for one guard (see [`Claim`]); an expired session says so first.
    pub(crate) fn claim_name(&self, object: Object, name: &str) -> Result<Claim> {
        if self.state() == SessionState::Expired {
            return Err(Error::SessionExpired);
        }
        Claim::new(&self.inner.claims, object, name)
    }

    /// The session id (32 hex digits), as the server and `permit show` print it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) {
    /// println!("session {}", session.id());
    /// # }
    /// ```
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The TTL the server granted.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) {
    /// println!("keepalive every {:?}", session.ttl() / 3);
    /// # }
    /// ```
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// The client the session was opened with.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// let holds = session.client().get_session(session.id()).await?.holds;
    /// # Ok(())
    /// # }
    /// ```
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// The session's state now; [`SessionState::Expired`] as soon as the conservative deadline
    /// has passed, even before the keepalive task notices.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::SessionState;
    /// # async fn run(session: permit_client::Session) {
    /// if session.state() == SessionState::Expired {
    ///     eprintln!("session lost; stop writing");
    /// }
    /// # }
    /// ```
    pub fn state(&self) -> SessionState {
        if Instant::now() >= self.deadline() {
            return SessionState::Expired;
        }
        self.inner.liveness.state()
    }

    /// A watch of the session's state, updated by the keepalive task (which marks the session
    /// expired when the conservative deadline passes).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::SessionState;
    /// # async fn run(session: permit_client::Session) {
    /// let mut state = session.watch_state();
    /// let _ = state.wait_for(|state| *state == SessionState::Expired).await;
    /// # }
    /// ```
    pub fn watch_state(&self) -> watch::Receiver<SessionState> {
        self.inner.liveness.state.subscribe()
    }

    /// The conservative local deadline: when the last acknowledged keepalive (or the create) was
    /// sent, plus the TTL. The server keeps the session at least until then.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) {
    /// let left = session.deadline().saturating_duration_since(tokio::time::Instant::now());
    /// println!("alive for at least {left:?}");
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.inner.liveness.deadline()
    }

    /// Resolves when the session expires: the server answered `session_not_found`, it was
    /// closed, or the conservative deadline passed.
    ///
    /// The future owns what it needs (it does not borrow the session), so it can be spawned.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) {
    /// tokio::select! {
    ///     () = session.expired() => eprintln!("session expired"),
    ///     () = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
    /// }
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub fn expired(&self) -> impl Future<Output = ()> + Send + 'static {
        self.inner.liveness.expired()
    }

    /// Closes the session on the server (releasing its holds and cancelling its waits) and stops
    /// the keepalive task. Guards made from it report themselves lost.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(client: permit_client::Client) -> permit_client::Result<()> {
    /// let session = client.session(Duration::from_secs(10)).await?;
    /// session.close().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Transport errors; the session then expires on its own after its TTL. A session the server
    /// no longer knows is not an error.
    ///
    /// # Cancel safety
    ///
    /// The keepalive task stops at the first poll; if the future is dropped before the answer,
    /// the session may stay on the server until its TTL runs out.
    pub async fn close(self) -> Result<()> {
        let stop = self.inner.stop.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(stop) = stop {
            let _ = stop.send(Stop::Detach);
        }
        self.inner.liveness.expire();
        match self.inner.client.close_session(&self.inner.id).await {
            Err(error) if !error.is_session_not_found() => Err(error),
            _ => Ok(()),
        }
    }

    /// Follows the queue position of this session's waits: every `waiting` answer of an acquire
    /// or campaign updates it. While anybody watches, waits ask the server at least once a
    /// second (instead of every 30 s), so that the position stays current (each ask is one
    /// small replicated write); without a watcher nothing changes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) {
    /// let mut positions = session.watch_queue_position();
    /// tokio::spawn(async move {
    ///     while positions.changed().await.is_ok() {
    ///         if let Some(place) = positions.borrow_and_update().clone() {
    ///             eprintln!("position {} in the queue of {}", place.position, place.name);
    ///         }
    ///     }
    /// });
    /// # }
    /// ```
    pub fn watch_queue_position(&self) -> watch::Receiver<Option<QueuePosition>> {
        self.inner.queue.subscribe()
    }

    /// Records a `waiting` answer's position.
    pub(crate) fn report_position(&self, name: &str, position: u64) {
        let place = QueuePosition { name: name.to_owned(), position };
        self.inner.queue.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&place);
            *current = Some(place);
            changed
        });
    }

    /// Whether anybody follows the queue position.
    pub(crate) fn positions_watched(&self) -> bool {
        self.inner.queue.receiver_count() > 0
    }

    pub(crate) fn liveness(&self) -> &Liveness {
        &self.inner.liveness
    }

    /// Records what a request learnt: a `session_not_found` answer means the session is gone.
    pub(crate) fn observe(&self, error: Error) -> Error {
        if error.is_session_not_found() {
            self.inner.liveness.expire();
        }
        error.into_session_error()
    }
}
