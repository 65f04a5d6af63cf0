//! [`Leadership`]: leading an election, and the campaign methods of [`Session`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use permit_wire::ProclaimRequest;

use crate::error::Result;
use crate::hold::{Hold, Object};
use crate::session::Session;
use crate::waiter::{wait_for_grant, Ask};

/// Leadership of an election, held by a session, with its fencing token and published value.
///
/// An election is a capacity-1 semaphore whose hold carries a value (for example the leader's
/// address) that others read with [`Client::leader`](crate::Client::leader). Dropping the guard
/// resigns in the background; [`Leadership::resign`] resigns and reports the outcome.
///
/// # Examples
///
/// Run a scheduler on one machine at a time:
///
/// ```no_run
/// use std::time::Duration;
/// # async fn schedule(_token: u64) {}
/// # async fn run(client: permit_client::Client) -> permit_client::Result<()> {
/// let session = client.session(Duration::from_secs(5)).await?;
/// let leadership = session.campaign("scheduler", "10.0.0.7:8080").await?;
/// tokio::select! {
///     () = schedule(leadership.token()) => leadership.resign().await?,
///     () = leadership.lost() => eprintln!("no longer the leader"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Leadership {
    hold: Hold,
    value: String,
}

impl Leadership {
    /// The election's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(leadership: permit_client::Leadership) {
    /// println!("leading {}", leadership.name());
    /// # }
    /// ```
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// The value published while leading: the campaign's, or the last one proclaimed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(leadership: permit_client::Leadership) {
    /// println!("published {}", leadership.value());
    /// # }
    /// ```
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The fencing token of this leadership: larger than every earlier leader's.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(leadership: permit_client::Leadership) {
    /// println!("PERMIT_TOKEN={}", leadership.token());
    /// # }
    /// ```
    pub fn token(&self) -> u64 {
        self.hold.token
    }

    /// The session that leads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(leadership: permit_client::Leadership) {
    /// println!("session {}", leadership.session().id());
    /// # }
    /// ```
    pub fn session(&self) -> &Session {
        &self.hold.session
    }

    /// The conservative local deadline of the leadership (the session's).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(leadership: permit_client::Leadership) {
    /// let left = leadership.deadline().saturating_duration_since(tokio::time::Instant::now());
    /// println!("leading for at least {left:?}");
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.hold.deadline()
    }

    /// Whether this session certainly still leads, as far as this client knows.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(leadership: permit_client::Leadership) {
    /// if leadership.is_valid_locally() {
    ///     println!("still leading");
    /// }
    /// # }
    /// ```
    pub fn is_valid_locally(&self) -> bool {
        self.hold.is_valid_locally()
    }

    /// Resolves when leadership is lost: the session expires (the server said so, or its
    /// conservative deadline passed).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(leadership: permit_client::Leadership) {
    /// leadership.lost().await;
    /// eprintln!("stepping down");
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.hold.lost()
    }

    /// Publishes `value` in place of the current one and keeps leading, with the same token and
    /// tenure (etcd's `Proclaim`): readers of the election and its watchers see the new value.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(mut leadership: permit_client::Leadership) -> permit_client::Result<()> {
    /// leadership.proclaim("10.0.0.8:8080").await?;
    /// assert_eq!(leadership.value(), "10.0.0.8:8080");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `not_leader` when the session no longer leads (revoked; nothing changed), `invalid_argument`
    /// (value over 4096 bytes), `feature_unavailable` (a member runs a build older than feature
    /// version 3), [`Error::SessionExpired`](crate::Error::SessionExpired) once the session is
    /// known to be gone; transport errors. On an error [`Leadership::value`] keeps the last value
    /// the server confirmed.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before the answer, the value may or may not be published, and
    /// [`Leadership::value`] keeps the previous one; proclaiming again is harmless.
    pub async fn proclaim(&mut self, value: &str) -> Result<()> {
        let session = &self.hold.session;
        let request = ProclaimRequest { session: session.id().to_owned(), value: value.to_owned() };
        let leader = session.client().proclaim(&self.hold.name, &request).await;
        self.value = leader.map_err(|error| session.observe(error))?.value;
        Ok(())
    }

    /// Resigns, letting the next candidate lead, and waits for the server's answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(leadership: permit_client::Leadership) -> permit_client::Result<()> {
    /// leadership.resign().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Transport errors (leadership then ends with the session). Leadership already gone with its
    /// session is not an error.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before the answer, the resignation may or may not have happened.
    pub async fn resign(self) -> Result<()> {
        self.hold.release().await
    }
}

impl Session {
    /// Campaigns in `election`, publishing `value`, and waits as long as it takes to lead.
    ///
    /// Candidates queue in FIFO order behind the leader; the call long-polls in chunks of at most
    /// 30 s, repeating the idempotent campaign.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(client: permit_client::Client) -> permit_client::Result<()> {
    /// let session = client.session(Duration::from_secs(5)).await?;
    /// let leadership = session.campaign("scheduler", "10.0.0.7:8080").await?;
    /// println!("leading with token {}", leadership.token());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::SessionExpired`](crate::Error::SessionExpired) if the session ends while waiting;
    /// `wait_cancelled` (the candidacy was withdrawn by another handle), `limit_exceeded`,
    /// `invalid_name`, `invalid_argument` (value over 4096 bytes); transport errors only when
    /// nothing may be waiting: an outage while waiting (no server reachable, `no_leader`,
    /// `shutting_down`, `leader_unreachable`, an unknown outcome) is retried with the queue place
    /// until the session's local deadline, and ends as `SessionExpired` if it lasts that long.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future withdraws the candidacy in the background (and resigns a leadership
    /// that raced with the drop).
    pub async fn campaign(&self, election: &str, value: &str) -> Result<Leadership> {
        let leadership = self.campaign_timeout_inner(election, value, None).await?;
        Ok(leadership.expect("a campaign without a timeout ends with leadership or an error"))
    }

    /// Campaigns in `election` for at most `timeout`; `None` (candidacy withdrawn) when the time
    /// is up. `Duration::ZERO` tries once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// match session.campaign_timeout("scheduler", "10.0.0.7:8080", Duration::ZERO).await? {
    ///     Some(leadership) => println!("leading with token {}", leadership.token()),
    ///     None => println!("someone else leads"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Session::campaign`].
    ///
    /// # Cancel safety
    ///
    /// As [`Session::campaign`].
    pub async fn campaign_timeout(
        &self,
        election: &str,
        value: &str,
        timeout: Duration,
    ) -> Result<Option<Leadership>> {
        self.campaign_timeout_inner(election, value, Some(timeout)).await
    }

    async fn campaign_timeout_inner(
        &self,
        election: &str,
        value: &str,
        timeout: Option<Duration>,
    ) -> Result<Option<Leadership>> {
        let claim = self.claim_name(Object::Election, election)?;
        let ask = Ask::Campaign { value };
        let Some((granted, claim)) = wait_for_grant(self, election, claim, &ask, timeout).await? else {
            return Ok(None);
        };
        let hold = Hold {
            session: self.clone(),
            object: Object::Election,
            name: election.to_owned(),
            permits: granted.permits,
            token: granted.token,
            max_hold_deadline: None,
            released: false,
            claim: Some(claim),
        };
        Ok(Some(Leadership { hold, value: value.to_owned() }))
    }
}
