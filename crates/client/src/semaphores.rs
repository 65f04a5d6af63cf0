//! The semaphore routes of [`Client`], one method per route.

use std::time::Duration;

use permit_wire::{
    AcquireRequest, AcquireResponse, PutSemaphoreRequest, ReleaseRequest, ReleaseResponse, RevokeRequest,
    SemaphoreList, SemaphoreSummary, SemaphoreView, TakeRequest, TakeResponse, ValidateRequest,
    ValidateResponse,
};
use reqwest::Method;

use crate::client::Client;
use crate::error::Result;
use crate::transport::{long_poll_timeout, segment, Call, Retry};

/// Largest page [`Client::list_semaphores`] may ask for (the server's cap).
pub const LIST_LIMIT_MAX: u32 = 1000;
/// Most pages [`Client::all_semaphores`] reads: the server holds at most a million objects.
pub(crate) const LIST_PAGES_MAX: u32 = 1000;

impl Client {
    /// `PUT /v1/semaphores/{name}`: creates the semaphore with this capacity, or sets its capacity
    /// (its policies stay as they are: [`Client::put_semaphore_with`] sets them).
    ///
    /// Shrinking below what is held keeps the holders; nothing is granted until holdings fit.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let view = client.put_semaphore("db.orders", 8).await?;
    /// assert_eq!(view.capacity, 8);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_name`, `invalid_argument` (capacity outside 1..=1000000), `limit_exceeded`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not set the capacity; repeating the call is harmless.
    pub async fn put_semaphore(&self, name: &str, capacity: u64) -> Result<SemaphoreView> {
        let call = Call::new(Method::PUT, semaphore_path(name, ""))
            .body(&PutSemaphoreRequest { capacity, ..PutSemaphoreRequest::default() });
        self.transport.send(&call).await?.json()
    }

    /// `PUT /v1/semaphores/{name}` with policies: creates the semaphore or sets its capacity,
    /// and sets (or removes) its rate, lock-delay and per-group cap. A policy left `None` in
    /// `request` keeps its current setting; `Some(None)` removes a rate or a group cap.
    ///
    /// - `rate`: permits granted (by acquire or [`Client::take`]) obey a generic cell rate
    ///   algorithm on the leader's clock: at most `burst` at once, `permits` per `per_ms`.
    /// - `lock_delay_ms`: the permits of a hold that ends by expiry or revoke stay out of
    ///   circulation this long (a release returns them at once).
    /// - `group_max`: no group ([`AcquireOptions::group`](crate::AcquireOptions::group)) holds
    ///   more permits than this; its waiters are passed over until it drops below.
    ///
    /// # Examples
    ///
    /// Four calls in flight and ten a second, with a 5 s lock-delay and at most two per team:
    ///
    /// ```no_run
    /// use permit_client::wire::{PutSemaphoreRequest, Rate};
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let request = PutSemaphoreRequest {
    ///     capacity: 4,
    ///     rate: Some(Some(Rate { permits: 10, per_ms: 1000, burst: Some(10) })),
    ///     lock_delay_ms: Some(5000),
    ///     group_max: Some(Some(2)),
    /// };
    /// let view = client.put_semaphore_with("api.vendor", &request).await?;
    /// assert_eq!(view.group_max, Some(2));
    /// // Later: remove the rate, keep the rest.
    /// let request = PutSemaphoreRequest { capacity: 4, rate: Some(None), ..PutSemaphoreRequest::default() };
    /// client.put_semaphore_with("api.vendor", &request).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::put_semaphore`]; `invalid_argument` also for a policy out of range (see
    /// [`PutSemaphoreRequest`]), `feature_unavailable` while some node of the cluster runs a
    /// version without policies.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not apply the request; repeating it is harmless.
    pub async fn put_semaphore_with(
        &self,
        name: &str,
        request: &PutSemaphoreRequest,
    ) -> Result<SemaphoreView> {
        let call = Call::new(Method::PUT, semaphore_path(name, "")).body(request);
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/semaphores/{name}/take`: takes `permits` of the semaphore's rate, holding
    /// nothing and needing no session; returns the take's token (from the counter of grant
    /// tokens, larger than every token before it).
    ///
    /// With `wait` zero it answers at once; otherwise it waits in the semaphore's FIFO queue
    /// (behind earlier acquires and takes) until the rate allows, at most `wait` (the server
    /// caps it at 60 s). A semaphore without a rate takes at once, always.
    ///
    /// # Examples
    ///
    /// Call a third-party API no faster than its quota (set with
    /// [`Client::put_semaphore_with`]):
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use permit_client::{Client, Error};
    /// # async fn call_api() {}
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = Client::new("http://127.0.0.1:7376")?;
    /// match client.take("api.quota", 1, Duration::from_secs(5)).await {
    ///     Ok(_token) => call_api().await,
    ///     Err(Error::RateLimited { retry_after, .. }) => eprintln!("over quota; retry in {retry_after:?}"),
    ///     Err(error) => return Err(error),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::RateLimited`](crate::Error::RateLimited) when the rate has no room (or others
    /// wait first) and `wait` passes, with how long until it has; `semaphore_not_found`,
    /// `permits_exceed_capacity` (more permits than the rate's `burst`), `invalid_name`,
    /// `invalid_argument`, `feature_unavailable`.
    ///
    /// # Cancel safety
    ///
    /// A take is not idempotent: it is sent again only when it certainly was not applied, and
    /// after an unknown outcome ([`Error::is_outcome_unknown`](crate::Error::is_outcome_unknown))
    /// the permits may have been taken. Dropping the future may or may not take them.
    pub async fn take(&self, name: &str, permits: u64, wait: Duration) -> Result<u64> {
        let wait_ms = duration_ms(wait).min(permit_wire::WAIT_MS_MAX);
        let request = TakeRequest { permits: Some(permits), wait_ms: Some(wait_ms) };
        let call = Call::new(Method::POST, semaphore_path(name, "/take"))
            .body(&request)
            .timeout(long_poll_timeout(Some(wait_ms)))
            .retry(Retry::Unsent);
        let TakeResponse::Taken { token } = self.transport.send(&call).await?.json()?;
        Ok(token)
    }

    /// `GET /v1/semaphores/{name}`: capacity, holders and waiters (a linearizable read).
    ///
    /// The view's `index` is the `Permit-Index` of its last change; pass it to
    /// [`Client::watch_semaphore`] to wait for the next one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let view = client.get_semaphore("db.orders").await?;
    /// println!("{} held, {} waiting", view.held, view.waiters.len());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `semaphore_not_found`, `invalid_name`.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn get_semaphore(&self, name: &str) -> Result<SemaphoreView> {
        let call = Call::new(Method::GET, semaphore_path(name, ""));
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/semaphores/{name}?index=N&wait_ms=T`: blocks until the semaphore changes after
    /// `index` (its `index` differs), or `wait` (at most 60 s) passes; returns the view either way.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let mut view = client.get_semaphore("db.orders").await?;
    /// for _ in 0..10 {
    ///     view = client.watch_semaphore("db.orders", view.index, Duration::from_secs(30)).await?;
    ///     println!("{} held", view.held);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `semaphore_not_found` (also when it is deleted while watched), `invalid_name`.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn watch_semaphore(&self, name: &str, index: u64, wait: Duration) -> Result<SemaphoreView> {
        let wait_ms = duration_ms(wait);
        let call = Call::new(Method::GET, semaphore_path(name, ""))
            .query("index", index)
            .query("wait_ms", wait_ms)
            .timeout(long_poll_timeout(Some(wait_ms)));
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/semaphores?after=&limit=`: one page of semaphores in name order.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let page = client.list_semaphores(None, 100).await?;
    /// if let Some(after) = page.next_after {
    ///     let _next = client.list_semaphores(Some(&after), 100).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` for a `limit` outside 1..=[`LIST_LIMIT_MAX`], `invalid_name` for a bad
    /// `after`.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn list_semaphores(&self, after: Option<&str>, limit: u32) -> Result<SemaphoreList> {
        let mut call = Call::new(Method::GET, "/v1/semaphores".into()).query("limit", limit);
        if let Some(after) = after {
            call = call.query("after", after);
        }
        self.transport.send(&call).await?.json()
    }

    /// Every semaphore in name order, read page by page (each page is consistent, the whole list
    /// is not a snapshot).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// for semaphore in client.all_semaphores().await? {
    ///     println!("{}: {}/{}", semaphore.name, semaphore.held, semaphore.capacity);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// Transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: reads.
    pub async fn all_semaphores(&self) -> Result<Vec<SemaphoreSummary>> {
        let mut all = Vec::new();
        let mut after = None;
        for _ in 0..LIST_PAGES_MAX {
            let page = self.list_semaphores(after.as_deref(), LIST_LIMIT_MAX).await?;
            all.extend(page.semaphores);
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(all)
    }

    /// `DELETE /v1/semaphores/{name}`: deletes a semaphore that nobody holds or waits on.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// client.delete_semaphore("db.orders").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `semaphore_busy` while held or waited on, `semaphore_not_found` (also when a retried
    /// delete had already succeeded), `invalid_name`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not delete the semaphore.
    pub async fn delete_semaphore(&self, name: &str) -> Result<()> {
        let call = Call::new(Method::DELETE, semaphore_path(name, ""));
        self.transport.send(&call).await.map(drop)
    }

    /// `POST /v1/semaphores/{name}/acquire`: one raw acquire (see
    /// [`Session::acquire`](crate::Session::acquire) for the guard that loops and releases).
    ///
    /// With `wait_ms = 0` it tries once; otherwise the session queues (strict FIFO) and the call
    /// long-polls up to `wait_ms` (at most 60 s). [`AcquireResponse::Waiting`] keeps the place;
    /// repeating the call returns the same grant or keeps waiting in the same place.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::{AcquireRequest, AcquireResponse};
    /// # async fn run(session: String) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let request = AcquireRequest {
    ///     session,
    ///     permits: Some(2),
    ///     wait_ms: Some(10_000),
    ///     capacity: Some(8),
    ///     max_hold_ms: None,
    ///     ephemeral: true,
    ///     group: None,
    /// };
    /// match client.acquire("db.orders", &request).await? {
    ///     AcquireResponse::Acquired { token, .. } => println!("token {token}"),
    ///     AcquireResponse::Waiting { position } => println!("still number {position} in line"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `unavailable` (a try that found too few permits), `session_not_found`,
    /// `semaphore_not_found` (no `capacity` given), `permits_exceed_capacity`, `permits_mismatch`,
    /// `wait_cancelled`, `limit_exceeded`, `invalid_name`, `invalid_argument`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future keeps the queue place, or a grant, on the server until it is released
    /// or the session ends.
    pub async fn acquire(&self, name: &str, request: &AcquireRequest) -> Result<AcquireResponse> {
        let call = Call::new(Method::POST, semaphore_path(name, "/acquire"))
            .body(request)
            .timeout(long_poll_timeout(request.wait_ms));
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/semaphores/{name}/release`: releases the session's hold or cancels its wait;
    /// releasing nothing is not an error (`released` is 0).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: &str) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let answer = client.release("db.orders", session).await?;
    /// println!("released {} permits", answer.released);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `session_not_found`, `invalid_name`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not release; repeating the call is harmless.
    pub async fn release(&self, name: &str, session: &str) -> Result<ReleaseResponse> {
        let call = Call::new(Method::POST, semaphore_path(name, "/release"))
            .body(&ReleaseRequest { session: session.to_owned() });
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/semaphores/{name}/revoke`: ends `session`'s hold on (or place in the queue of)
    /// the semaphore, as an operator: for a stuck holder whose session is still kept alive.
    /// The session itself lives on; its guard learns of the loss from its next check.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: &str) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let answer = client.revoke("db.orders", session).await?;
    /// println!("revoked {} permits", answer.released);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `session_not_found`, `invalid_name`, `permission_denied`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not revoke; repeating the call is harmless.
    pub async fn revoke(&self, name: &str, session: &str) -> Result<ReleaseResponse> {
        let call = Call::new(Method::POST, semaphore_path(name, "/revoke"))
            .body(&RevokeRequest { session: session.to_owned() });
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/semaphores/{name}/validate`: whether a current holder carries `token` (a
    /// linearizable read), for resources that cannot store the last token they saw.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(token: u64) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// if !client.validate("db.orders", token).await?.valid {
    ///     println!("stale writer: refuse the write");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_name`.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn validate(&self, name: &str, token: u64) -> Result<ValidateResponse> {
        let call =
            Call::new(Method::POST, semaphore_path(name, "/validate")).body(&ValidateRequest { token });
        self.transport.send(&call).await?.json()
    }
}

fn semaphore_path(name: &str, action: &str) -> String {
    format!("/v1/semaphores/{}{action}", segment(name))
}

/// `duration` in whole milliseconds, saturating.
pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
