//! Waiting for a grant: the long-poll loop shared by acquire and campaign, and the guard that
//! gives up the queue place when the wait is abandoned.

use std::time::Duration;

use permit_wire::{AcquireRequest, AcquireResponse, CampaignRequest, CampaignResponse, ErrorCode};
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::hold::{release_in_background, Claim, Object};
use crate::semaphores::duration_ms;
use crate::session::{Session, SessionState};

/// Longest wait asked of the server in one request; the loop repeats the idempotent call.
const WAIT_CHUNK: Duration = Duration::from_secs(30);
/// Longest wait asked while somebody follows the queue position
/// ([`Session::watch_queue_position`]): a `waiting` answer at least this often keeps it current.
/// Each ask is proposed to the log (an idempotent acquire or campaign), so a watched wait costs
/// one small log entry per this period: 5 s keeps a queue of a hundred CLI waiters at twenty
/// entries a second, and a position at most 5 s stale; unwatched waits ask every 30 s.
const WATCHED_CHUNK: Duration = Duration::from_secs(5);
/// The first wait asked while the position is followed: short, so that a queued waiter learns
/// (and shows) its place when its wait starts, not one [`WATCHED_CHUNK`] later.
const WATCHED_FIRST: Duration = Duration::from_millis(50);
/// Pauses between asks while the servers cannot be reached (after the transport's own retries):
/// from the first, doubling up to the last.
const OUTAGE_PAUSE_MIN: Duration = Duration::from_millis(100);
const OUTAGE_PAUSE_MAX: Duration = Duration::from_secs(1);

/// What to ask for.
pub(crate) enum Ask<'a> {
    /// Permits of a semaphore.
    Acquire {
        /// Permits wanted.
        permits: u64,
        /// Create the semaphore with this capacity if needed.
        capacity: Option<u64>,
        /// Release the hold this long after the grant.
        max_hold: Option<Duration>,
        /// Delete the semaphore when idle, if this acquire creates it.
        ephemeral: bool,
        /// The group the acquire counts against.
        group: Option<&'a str>,
    },
    /// Leadership of an election, publishing `value`.
    Campaign {
        /// The value to publish while leader.
        value: &'a str,
    },
}

/// A grant, with the earliest instant it can have happened at on the server.
pub(crate) struct Granted {
    pub permits: u64,
    pub token: u64,
    /// When the last request that found the session still queued was sent (or the first
    /// request, if it was granted at once): the grant happened after this.
    pub not_before: Instant,
}

enum Answer {
    Granted { permits: u64, token: u64 },
    Waiting { position: u64 },
}

/// Whether `error` may come from an outage (no server reachable, no leader, a node shutting
/// down, an unknown outcome) rather than a refusal. The server keeps a session's queue place as
/// long as the session lives, so the wait asks again (the call is idempotent per session and
/// name) until the session's conservative local deadline passes.
pub(crate) fn is_outage(error: &Error) -> bool {
    error.is_outcome_unknown()
        || matches!(
            error.code(),
            Some(ErrorCode::NoLeader | ErrorCode::ShuttingDown | ErrorCode::LeaderUnreachable)
        )
}

impl Ask<'_> {
    fn object(&self) -> Object {
        match self {
            Ask::Acquire { .. } => Object::Semaphore,
            Ask::Campaign { .. } => Object::Election,
        }
    }

    async fn send(&self, session: &Session, name: &str, wait_ms: u64) -> Result<Answer> {
        let client = session.client();
        match self {
            Ask::Acquire { permits, capacity, max_hold, ephemeral, group } => {
                let request = AcquireRequest {
                    session: session.id().to_owned(),
                    permits: Some(*permits),
                    wait_ms: Some(wait_ms),
                    capacity: *capacity,
                    max_hold_ms: max_hold.map(duration_ms),
                    ephemeral: *ephemeral,
                    group: group.map(str::to_owned),
                };
                Ok(match client.acquire(name, &request).await? {
                    AcquireResponse::Acquired { permits, token } => Answer::Granted { permits, token },
                    AcquireResponse::Waiting { position } => Answer::Waiting { position },
                })
            }
            Ask::Campaign { value } => {
                let request = CampaignRequest {
                    session: session.id().to_owned(),
                    value: (*value).to_owned(),
                    wait_ms: Some(wait_ms),
                };
                Ok(match client.campaign(name, &request).await? {
                    CampaignResponse::Leader { token } => Answer::Granted { permits: 1, token },
                    CampaignResponse::Waiting { position } => Answer::Waiting { position },
                })
            }
        }
    }
}

/// Asks until granted, the session ends, or `timeout` passes (`Some(ZERO)`: ask once without
/// queueing). An outage (see [`is_outage`]) does not end the wait: it asks again, keeping the
/// place, until the session's local deadline (then [`Error::SessionExpired`]) or the timeout. On timeout the wait is cancelled on the server (a grant that raced with the
/// cancel is released) and the answer is `None`. Dropping the future does the same in the
/// background.
///
/// `claim` is the session's claim on `name`: it comes back with the grant, goes with a place
/// given up in the background until that is done, and is given back otherwise.
pub(crate) async fn wait_for_grant(
    session: &Session,
    name: &str,
    claim: Claim,
    ask: &Ask<'_>,
    timeout: Option<Duration>,
) -> Result<Option<(Granted, Claim)>> {
    if session.state() == SessionState::Expired {
        return Err(Error::SessionExpired);
    }
    let try_once = timeout == Some(Duration::ZERO);
    let deadline = timeout.map(|timeout| Instant::now() + timeout);
    let mut place = QueuePlace { session, object: ask.object(), name, armed: true, claim: Some(claim) };
    let mut last_waiting_sent = None;
    let mut outage_pause = OUTAGE_PAUSE_MIN;
    let mut first = true;
    loop {
        let chunk = match session.positions_watched() {
            true if first => WATCHED_FIRST,
            true => WATCHED_CHUNK,
            false => WAIT_CHUNK,
        };
        first = false;
        let wait = match deadline {
            _ if try_once => Duration::ZERO,
            None => chunk,
            Some(deadline) => deadline.saturating_duration_since(Instant::now()).min(chunk),
        };
        let sent = Instant::now();
        // Round up, so that a wait under a millisecond still waits rather than tries.
        let wait_ms = if try_once { 0 } else { duration_ms(wait).max(1) };
        let answer = tokio::select! {
            answer = ask.send(session, name, wait_ms) => answer,
            () = session.expired() => return Err(Error::SessionExpired),
        };
        match answer {
            Ok(Answer::Granted { permits, token }) => {
                place.armed = false;
                let not_before = last_waiting_sent.unwrap_or(sent);
                let claim = place.claim.take().expect("the claim stays with the place until granted");
                return Ok(Some((Granted { permits, token, not_before }, claim)));
            }
            Ok(Answer::Waiting { position }) => {
                outage_pause = OUTAGE_PAUSE_MIN;
                session.report_position(name, position);
            }
            Err(error) if try_once && error.code() == Some(ErrorCode::Unavailable) => {
                place.armed = false;
                return Ok(None);
            }
            Err(error) if !try_once && is_outage(&error) => {
                // The place may still be there (or a grant nobody took yet): keep it armed, and
                // ask again after a pause, until the session's local deadline or the timeout.
                tracing::debug!(%error, name, "waiting through an outage");
                let pause = match deadline {
                    Some(deadline) => outage_pause.min(deadline.saturating_duration_since(Instant::now())),
                    None => outage_pause,
                };
                outage_pause = (outage_pause * 2).min(OUTAGE_PAUSE_MAX);
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = session.expired() => return Err(Error::SessionExpired),
                }
                if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    // Timed out during the outage: the place is given up in the background
                    // (the armed guard), and the session's end frees it anyway.
                    return Ok(None);
                }
                continue;
            }
            Err(error) => {
                // A refusal settles that nothing is queued; only an unknown outcome may have
                // left a place (or a grant) behind.
                place.armed = error.is_outcome_unknown();
                return Err(session.observe(error));
            }
        }
        if try_once || deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            // Cancel the wait; a grant that raced with the timeout is released the same way.
            ask.object()
                .release(session.client(), name, session.id())
                .await
                .map_err(|e| session.observe(e))?;
            place.armed = false;
            return Ok(None);
        }
        last_waiting_sent = Some(sent);
    }
}

/// A queue place (or a grant nobody has taken yet) to give up if the wait is abandoned.
struct QueuePlace<'a> {
    session: &'a Session,
    object: Object,
    name: &'a str,
    armed: bool,
    claim: Option<Claim>,
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        if self.armed {
            let claim = self.claim.take();
            release_in_background(self.session.clone(), self.object, self.name.to_owned(), claim);
        }
    }
}
