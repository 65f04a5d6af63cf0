//! [`Permit`]: a granted hold on a semaphore, and the acquire methods of [`Session`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::Result;
use crate::hold::{Hold, Object};
use crate::semaphores::duration_ms;
use crate::session::Session;
use crate::waiter::{wait_for_grant, Ask};

/// Options of [`Session::acquire_with`].
///
/// `AcquireOptions::default()` asks for an **ephemeral** semaphore (`ephemeral: true`): one
/// that `capacity` creates is deleted by the server when its last holder and waiter leave, as
/// the CLI's `--capacity` does without `--keep` and the Python client's `capacity=` does
/// without `ephemeral=False`. Set `ephemeral: false` to keep it (a `put_semaphore` also makes
/// it permanent). `ephemeral` changes nothing for a semaphore that already exists.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use permit_client::AcquireOptions;
/// let options = AcquireOptions {
///     capacity: Some(4),
///     max_hold: Some(Duration::from_secs(600)),
///     timeout: Some(Duration::from_secs(30)),
///     ephemeral: false,
///     group: None,
/// };
/// // Or from the default, counting against a group's cap (`group_max`):
/// let options = AcquireOptions::default().group("team-a").timeout(Duration::from_secs(30));
/// assert_eq!(options.group.as_deref(), Some("team-a"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireOptions {
    /// Create the semaphore with this capacity if it does not exist (ignored if it does).
    pub capacity: Option<u64>,
    /// Release the hold this long after the grant even if the session lives (100 ms to 7 days).
    pub max_hold: Option<Duration>,
    /// Give up after this long (`Some(Duration::ZERO)`: try once without queueing); `None`
    /// waits as long as the session lives.
    pub timeout: Option<Duration>,
    /// If this acquire creates the semaphore, the server deletes it again when its last holder
    /// and waiter leave (for names made on the fly). `true` by default, as in the CLI and the
    /// Python client; `false` keeps it.
    pub ephemeral: bool,
    /// The group this acquire counts against (1-64 bytes of `[A-Za-z0-9._:-]`): with the
    /// semaphore's `group_max` set, no group holds more permits than that, and a waiter whose
    /// group is at its cap is passed over (keeping its place) for waiters of other groups.
    pub group: Option<String>,
}

impl Default for AcquireOptions {
    /// No capacity, no `max_hold`, no timeout, no group, and `ephemeral: true`: a semaphore
    /// that `capacity` creates goes away with its last user, as with the CLI (`--keep` keeps it).
    fn default() -> Self {
        Self { capacity: None, max_hold: None, timeout: None, ephemeral: true, group: None }
    }
}

impl AcquireOptions {
    /// These options with [`AcquireOptions::capacity`] set.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = permit_client::AcquireOptions::default().capacity(4);
    /// assert_eq!(options.capacity, Some(4));
    /// ```
    #[must_use]
    pub fn capacity(mut self, capacity: u64) -> Self {
        self.capacity = Some(capacity);
        self
    }

    /// These options with [`AcquireOptions::max_hold`] set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = permit_client::AcquireOptions::default().max_hold(Duration::from_secs(600));
    /// assert_eq!(options.max_hold, Some(Duration::from_secs(600)));
    /// ```
    #[must_use]
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// These options with [`AcquireOptions::timeout`] set.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// let options = permit_client::AcquireOptions::default().timeout(Duration::ZERO);
    /// assert_eq!(options.timeout, Some(Duration::ZERO));
    /// ```
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// These options with [`AcquireOptions::ephemeral`] set.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = permit_client::AcquireOptions::default().capacity(2).ephemeral(false);
    /// assert!(!options.ephemeral);
    /// ```
    #[must_use]
    pub fn ephemeral(mut self, ephemeral: bool) -> Self {
        self.ephemeral = ephemeral;
        self
    }

    /// These options with [`AcquireOptions::group`] set: the acquire counts against the
    /// semaphore's per-group cap (`group_max`, see
    /// [`Client::put_semaphore_with`](crate::Client::put_semaphore_with)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::AcquireOptions;
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// let options = AcquireOptions::default().group("team-a");
    /// let permit = session.acquire_with("gpu", 1, &options).await?.expect("no timeout set");
    /// println!("a GPU slot for team-a, token {}", permit.token());
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }
}

/// Permits of a semaphore held by a session, with the grant's fencing token.
///
/// Dropping the guard releases the permits in the background (best effort: if that fails, they
/// come back when the session ends); [`Permit::release`] releases them and reports the outcome.
/// A session holds at most one grant per semaphore, and this client hands out one guard for it:
/// acquiring a semaphore again on a session that holds it (or is acquiring it) fails at once with
/// [`Error::AlreadyHeld`](crate::Error::AlreadyHeld), until the first guard is released or
/// dropped (and its release answered). So an inner scope can never release a hold an outer one
/// still guards. Use another session for a second, independent hold.
///
/// The hold can be lost while the guard lives: when the session expires, or when `max_hold`
/// passes. [`Permit::lost`] resolves then, counted conservatively from when requests were sent,
/// so it fires no later than the server frees the permits.
///
/// # Examples
///
/// Fence writes with the token, and stop when the hold is lost:
///
/// ```no_run
/// use std::time::Duration;
/// # async fn write(_token: u64) {}
/// # async fn run(client: permit_client::Client) -> permit_client::Result<()> {
/// let session = client.session(Duration::from_secs(10)).await?;
/// let permit = session.acquire("db.orders.migration", 1).await?;
/// tokio::select! {
///     () = write(permit.token()) => permit.release().await?,
///     () = permit.lost() => eprintln!("lost the permit; the storage rejects tokens below the newest"),
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Permit {
    hold: Hold,
}

impl Permit {
    /// The semaphore's name.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(permit: permit_client::Permit) {
    /// println!("holding {}", permit.name());
    /// # }
    /// ```
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// The fencing token of the grant: larger than every token granted before it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(permit: permit_client::Permit) {
    /// println!("PERMIT_TOKEN={}", permit.token());
    /// # }
    /// ```
    pub fn token(&self) -> u64 {
        self.hold.token
    }

    /// The number of permits held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(permit: permit_client::Permit) {
    /// assert!(permit.permits() >= 1);
    /// # }
    /// ```
    pub fn permits(&self) -> u64 {
        self.hold.permits
    }

    /// The session that holds the permits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(permit: permit_client::Permit) {
    /// println!("held by session {}", permit.session().id());
    /// # }
    /// ```
    pub fn session(&self) -> &Session {
        &self.hold.session
    }

    /// The conservative local deadline of the hold: the session's deadline, or the `max_hold`
    /// deadline (counted from before the grant) if that is earlier. It moves later with each
    /// acknowledged keepalive.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(permit: permit_client::Permit) {
    /// let left = permit.deadline().saturating_duration_since(tokio::time::Instant::now());
    /// println!("held for at least {left:?}");
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.hold.deadline()
    }

    /// Whether the hold is certainly still on the server, as far as this client knows: the session
    /// is not expired and neither deadline has passed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(permit: permit_client::Permit) {
    /// if !permit.is_valid_locally() {
    ///     eprintln!("do not write: the permit may be gone");
    /// }
    /// # }
    /// ```
    pub fn is_valid_locally(&self) -> bool {
        self.hold.is_valid_locally()
    }

    /// Resolves when the hold is lost: the session expires (the server said so, or its
    /// conservative deadline passed) or the `max_hold` deadline passes.
    ///
    /// The future owns what it needs, so it can be spawned or kept while the permit is released.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(permit: permit_client::Permit) {
    /// let lost = permit.lost();
    /// tokio::spawn(async move {
    ///     lost.await;
    ///     eprintln!("permit lost");
    /// });
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.hold.lost()
    }

    /// Releases the permits and waits for the server's answer.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(permit: permit_client::Permit) -> permit_client::Result<()> {
    /// permit.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Transport errors (the permits then come back when the session ends). A hold already gone
    /// with its session is not an error.
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped before the answer, the release may or may not have happened; the
    /// permits come back when the session ends at the latest.
    pub async fn release(self) -> Result<()> {
        self.hold.release().await
    }
}

impl Session {
    /// Acquires `permits` of semaphore `name`, waiting in its FIFO queue as long as it takes.
    ///
    /// Long-polls in chunks of at most 30 s, repeating the idempotent acquire while queued; the
    /// place in the queue is kept between chunks.
    ///
    /// # Examples
    ///
    /// Cap concurrent database migrations at one across machines:
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(client: permit_client::Client) -> permit_client::Result<()> {
    /// let session = client.session(Duration::from_secs(10)).await?;
    /// let permit = session.acquire("db.migrations", 1).await?;
    /// // ... migrate, passing permit.token() along ...
    /// permit.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::SessionExpired`](crate::Error::SessionExpired) if the session ends while waiting;
    /// `semaphore_not_found`, `permits_exceed_capacity`, `permits_mismatch`, `wait_cancelled`
    /// (the wait was released by another handle, or the capacity shrank below `permits`),
    /// `limit_exceeded`, `invalid_name`, `invalid_argument`; transport errors only when
    /// nothing may be waiting: an outage while waiting (no server reachable, `no_leader`,
    /// `shutting_down`, `leader_unreachable`, an unknown outcome) is retried with the queue place
    /// until the session's local deadline, and ends as `SessionExpired` if it lasts that long.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future gives up the queue place in the background (and releases a grant that
    /// raced with the drop).
    pub async fn acquire(&self, name: &str, permits: u64) -> Result<Permit> {
        let permit = self.acquire_with(name, permits, &AcquireOptions::default()).await?;
        Ok(permit.expect("an acquire without a timeout ends with a grant or an error"))
    }

    /// Tries once to acquire `permits` of `name` without queueing; `None` if too few are free or
    /// others wait first.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// match session.try_acquire("reports.nightly", 1).await? {
    ///     Some(permit) => println!("running with token {}", permit.token()),
    ///     None => println!("another run is in progress"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Session::acquire`], except that `unavailable` is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future releases a grant that raced with the drop, in the background.
    pub async fn try_acquire(&self, name: &str, permits: u64) -> Result<Option<Permit>> {
        let options = AcquireOptions { timeout: Some(Duration::ZERO), ..AcquireOptions::default() };
        self.acquire_with(name, permits, &options).await
    }

    /// Acquires `permits` of `name`, waiting at most `timeout`; `None` when the time is up.
    ///
    /// On timeout the wait is cancelled on the server, so that it does not keep a queue place
    /// (a grant that raced with the cancel is released too).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// match session.acquire_timeout("gpu", 2, Duration::from_secs(30)).await? {
    ///     Some(permit) => println!("token {}", permit.token()),
    ///     None => eprintln!("gave up after 30 s; no queue place is kept"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Session::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`Session::acquire`].
    pub async fn acquire_timeout(
        &self,
        name: &str,
        permits: u64,
        timeout: Duration,
    ) -> Result<Option<Permit>> {
        let options = AcquireOptions { timeout: Some(timeout), ..AcquireOptions::default() };
        self.acquire_with(name, permits, &options).await
    }

    /// Acquires `permits` of `name` with options: create the semaphore on first use, cap how
    /// long the hold lasts, give up after a timeout, count against a group's cap. `None` only when a timeout is set and passes
    /// (or, with a zero timeout, when the permits are not free).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use permit_client::AcquireOptions;
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// let options = AcquireOptions {
    ///     capacity: Some(4),
    ///     max_hold: Some(Duration::from_secs(3600)),
    ///     timeout: Some(Duration::from_secs(60)),
    ///     ephemeral: true,
    ///     group: Some("nightly".into()),
    /// };
    /// if let Some(permit) = session.acquire_with("builds", 1, &options).await? {
    ///     println!("token {}, held until {:?} at the latest", permit.token(), permit.deadline());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Session::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`Session::acquire`].
    pub async fn acquire_with(
        &self,
        name: &str,
        permits: u64,
        options: &AcquireOptions,
    ) -> Result<Option<Permit>> {
        let ask = Ask::Acquire {
            permits,
            capacity: options.capacity,
            max_hold: options.max_hold,
            ephemeral: options.ephemeral,
            group: options.group.as_deref(),
        };
        let claim = self.claim_name(Object::Semaphore, name)?;
        let Some((granted, claim)) = wait_for_grant(self, name, claim, &ask, options.timeout).await? else {
            return Ok(None);
        };
        let hold = Hold {
            session: self.clone(),
            object: Object::Semaphore,
            name: name.to_owned(),
            permits: granted.permits,
            token: granted.token,
            // The server counts whole milliseconds from the grant, which came after `not_before`.
            max_hold_deadline: options
                .max_hold
                .map(|max_hold| granted.not_before + Duration::from_millis(duration_ms(max_hold))),
            released: false,
            claim: Some(claim),
        };
        Ok(Some(Permit { hold }))
    }
}
