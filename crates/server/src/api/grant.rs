//! Acquire and campaign share one path: propose the acquire, then long-poll for the grant.
//!
//! The queue is replicated state; the long-poll only waits for a wake-up that the state machine
//! sends when this session's wait ends, then reads the outcome from the applied state.

use std::time::Duration;

use permit_core::{Acquire, Command, Creator, Key, Limit, Name, Outcome, Refusal, SessionId};
use permit_wire::{ErrorCode, WAIT_MS_MAX};
use tokio::time::Instant;

use super::app::App;
use crate::error::ApiError;
use crate::notify::Unanswered;

/// The result of an acquire or campaign as the client sees it.
pub(crate) enum Grant {
    /// Held, with this token.
    Acquired {
        /// Permits held.
        permits: u64,
        /// Fencing token.
        token: u64,
    },
    /// Still queued at this position when the wait ended.
    Waiting {
        /// 1-based queue position.
        position: u64,
    },
}

/// The server-side cap on a long-poll.
pub(crate) fn capped_wait(wait_ms: Option<u64>) -> u64 {
    wait_ms.unwrap_or(0).min(WAIT_MS_MAX)
}

/// Proposes `acquire` and, if it is queued and `wait_ms > 0`, waits up to `wait_ms` for the grant.
/// An `ephemeral` acquire that creates its semaphore makes it one that is deleted when idle. An
/// object it creates counts against the `creator` token's cap.
pub(crate) async fn acquire(
    app: &App,
    acquire: Acquire,
    wait_ms: u64,
    ephemeral: bool,
    creator: Option<Creator>,
    group: Option<Name>,
) -> Result<Grant, ApiError> {
    let grant = acquire_correctly(app, acquire, wait_ms, ephemeral, creator, group).await;
    match (grant, crate::bugs::active()) {
        (Ok(Grant::Acquired { permits, token }), Some(crate::bugs::Bug::NonMonotonicToken)) => {
            Ok(Grant::Acquired { permits, token: token % 5 + 1 })
        }
        (grant, _) => grant,
    }
}

async fn acquire_correctly(
    app: &App,
    acquire: Acquire,
    wait_ms: u64,
    ephemeral: bool,
    creator: Option<Creator>,
    group: Option<Name>,
) -> Result<Grant, ApiError> {
    if crate::bugs::is(crate::bugs::Bug::AckBeforeCommit) {
        if let Some(grant) = predict(app, &acquire) {
            return Ok(grant);
        }
    }
    let (key, session) = (acquire.key.clone(), acquire.session);
    // Subscribe before proposing, so that a grant applied right after the proposal is not missed.
    let subscription = (wait_ms > 0).then(|| app.notifier.subscribe(key.clone(), session));
    let command = match (group, creator) {
        // Only an acquire that names a group needs the newer command (cluster version 5).
        (Some(group), creator) => Command::AcquireInGroup { acquire, ephemeral, creator, group },
        (None, Some(creator)) => Command::AcquireBy { acquire, ephemeral, creator },
        (None, None) if ephemeral => Command::AcquireEphemeral(acquire),
        (None, None) => Command::Acquire(acquire),
    };
    let position = match app.propose(command).await? {
        Outcome::Acquired { permits, token } => return Ok(Grant::Acquired { permits, token }),
        Outcome::Waiting { position } => position,
        Outcome::Refused(Refusal::LimitExceeded(Limit::ObjectsPerToken)) => {
            return Err(crate::auth::slowly(crate::auth::objects_cap_refusal()).await)
        }
        Outcome::Refused(refusal) => return Err(refusal.into()),
        other => return Err(ApiError::internal(other)),
    };
    let Some(subscription) = subscription else { return Ok(Grant::Waiting { position }) };
    let deadline = Instant::now() + Duration::from_millis(wait_ms);
    let mut shutdown = app.shutdown.clone();
    let mut position = position;
    let waited = subscription
        .wait(deadline, &mut shutdown, || match status(app, &key, session) {
            Status::Held { permits, token } => Some(Ok(Grant::Acquired { permits, token })),
            Status::Waiting { position: now } => {
                position = now;
                None
            }
            Status::Ended(error) => Some(Err(error)),
        })
        .await;
    match waited {
        Ok(answer) => answer,
        Err(Unanswered::Deadline) => {
            app.observer.acquire_timed_out(&key);
            Ok(Grant::Waiting { position })
        }
        Err(Unanswered::Shutdown) => Ok(Grant::Waiting { position }),
    }
}

enum Status {
    Held { permits: u64, token: u64 },
    Waiting { position: u64 },
    Ended(ApiError),
}

/// Where `session` stands on `key` in the applied state.
fn status(app: &App, key: &Key, session: SessionId) -> Status {
    let replica = app.replica().read();
    if replica.state.session(session).is_none() {
        return Status::Ended(ApiError::session_not_found());
    }
    let Some(object) = replica.state.object(key) else {
        return Status::Ended(ApiError::new(ErrorCode::WaitCancelled, format!("{key} was deleted")));
    };
    if let Some(hold) = object.holders.get(&session) {
        return Status::Held { permits: hold.permits, token: hold.token };
    }
    match object.queue.position(session) {
        Some(position) => Status::Waiting { position },
        None => Status::Ended(ApiError::new(
            ErrorCode::WaitCancelled,
            "the wait ended without a grant: it was released, or the capacity shrank below it",
        )),
    }
}

/// `ack_before_commit`: answers what applying the acquire to the current state would give, and
/// proposes it without waiting for the commit.
fn predict(app: &App, acquire: &Acquire) -> Option<Grant> {
    let mut state = app.replica().read().state.clone();
    let next_index = state.applied_index() + 1;
    let batch =
        permit_core::Batch { now_ms: state.now_ms(), commands: vec![Command::Acquire(acquire.clone())] };
    let outcome = state.apply(next_index, 0, &batch, &mut Vec::new()).pop()?;
    let Outcome::Acquired { permits, token } = outcome else { return None };
    app.propose_detached(Command::Acquire(acquire.clone()));
    Some(Grant::Acquired { permits, token })
}
