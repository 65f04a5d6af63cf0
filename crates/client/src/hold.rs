//! A hold as the guards see it: what it is on, its token, its conservative deadline, and the
//! release on drop shared by [`Permit`](crate::Permit) and [`Leadership`](crate::Leadership).

use std::future::Future;

use tokio::time::Instant;

use crate::client::Client;
use crate::error::Result;
use crate::session::{Session, SessionState};

/// What a hold is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Object {
    Semaphore,
    Election,
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

/// Releases in a spawned task, best effort; the task keeps the session open until it is done.
/// Outside a tokio runtime nothing is sent, and the session's expiry frees the hold.
pub(crate) fn release_in_background(session: Session, object: Object, name: String) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        tracing::debug!(%name, "no runtime to release on; the session's end frees the hold");
        return;
    };
    runtime.spawn(async move {
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
            release_in_background(self.session.clone(), self.object, std::mem::take(&mut self.name));
        }
    }
}
