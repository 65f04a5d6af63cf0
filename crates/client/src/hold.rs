//! A hold as the guards see it: what it is on, its token, its conservative deadline, and the
//! release on drop shared by [`Permit`](crate::Permit) and [`Leadership`](crate::Leadership).

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::session::{Session, SessionState};

/// What a hold is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Object {
    Semaphore,
    Election,
}

/// The names a session holds or is acquiring, one guard each.
pub(crate) type Claims = Arc<Mutex<HashSet<(Object, String)>>>;

/// A session's claim on one name, from the moment an acquire (or campaign) starts until the
/// guard it made is released, or the acquire left nothing behind on the server. While it lives,
/// a second acquire of that name on that session fails at once with [`Error::AlreadyHeld`]: the
/// server answers a repeated acquire with the grant the session has (that makes retries safe),
/// so a second guard would share the first one's hold, and its release would end the hold the
/// first one still guards.
#[derive(Debug)]
pub(crate) struct Claim {
    claims: Claims,
    key: (Object, String),
}

impl Claim {
    /// Claims `name` in `claims`.
    ///
    /// # Errors
    /// [`Error::AlreadyHeld`] when the session holds or is acquiring it already.
    pub fn new(claims: &Claims, object: Object, name: &str) -> Result<Claim> {
        let key = (object, name.to_owned());
        if !claims.lock().unwrap_or_else(PoisonError::into_inner).insert(key.clone()) {
            let object = match object {
                Object::Semaphore => "semaphore",
                Object::Election => "election",
            };
            return Err(Error::AlreadyHeld { object, name: name.to_owned() });
        }
        Ok(Claim { claims: claims.clone(), key })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.claims.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.key);
    }
}

impl Object {
    /// Releases `session`'s hold or wait on `name` (resign, for an election).
    pub async fn release(self, client: &Client, name: &str, session: &str) -> Result<u64> {
        let answer = match self {
            Object::Semaphore => client.release(name, session).await?,
            Object::Election => client.resign(name, session).await?,
        };
        Ok(answer.released)
    }
}

/// Releases in a spawned task, best effort; the task keeps the session open, and the name
/// claimed (`claim`), until it is done, so that no new guard shares the hold being released.
/// Outside a tokio runtime nothing is sent, and the session's expiry frees the hold.
pub(crate) fn release_in_background(session: Session, object: Object, name: String, claim: Option<Claim>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(%name, "no runtime to release on; the session's end frees the hold");
        return;
    };
    runtime.spawn(async move {
        let _claim = claim;
        if session.liveness().state() == SessionState::Expired {
            return;
        }
        if let Err(error) = object.release(session.client(), &name, session.id()).await {
            tracing::debug!(%name, %error, "background release failed; the session's end frees the hold");
        }
    });
}

/// A granted hold, released on drop unless released explicitly.
#[derive(Debug)]
pub(crate) struct Hold {
    pub session: Session,
    pub object: Object,
    pub name: String,
    pub permits: u64,
    pub token: u64,
    /// When `max_hold` releases the hold at the earliest, counted from before the grant.
    pub max_hold_deadline: Option<Instant>,
    pub released: bool,
    /// The session's claim on the name, given back once the hold is released.
    pub claim: Option<Claim>,
}

impl Hold {
    pub fn deadline(&self) -> Instant {
        let session = self.session.deadline();
        self.max_hold_deadline.map_or(session, |max_hold| max_hold.min(session))
    }

    pub fn is_valid_locally(&self) -> bool {
        self.session.state() != SessionState::Expired
            && self.max_hold_deadline.is_none_or(|deadline| Instant::now() < deadline)
    }

    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let expired = self.session.expired();
        let max_hold = self.max_hold_deadline;
        async move {
            match max_hold {
                Some(deadline) => {
                    tokio::select! {
                        () = expired => {}
                        () = tokio::time::sleep_until(deadline) => {}
                    }
                }
                None => expired.await,
            }
        }
    }

    /// Releases now. A hold that is already gone with its session is not an error.
    pub async fn release(mut self) -> Result<()> {
        self.released = true;
        match self.object.release(self.session.client(), &self.name, self.session.id()).await {
            Err(error) if !error.is_session_not_found() => Err(error),
            _ => Ok(()),
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.released {
            let claim = self.claim.take();
            release_in_background(self.session.clone(), self.object, std::mem::take(&mut self.name), claim);
        }
    }
}
