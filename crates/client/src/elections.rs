//! The election routes of [`Client`], one method per route, and [`Client::leader`].

use std::time::Duration;

use permit_wire::{
    CampaignRequest, CampaignResponse, ElectionList, ElectionView, LeaderView, ProclaimRequest,
    ReleaseRequest, ReleaseResponse, RevokeRequest,
};
use reqwest::Method;

use crate::client::Client;
use crate::error::Result;
use crate::semaphores::{duration_ms, LIST_LIMIT_MAX, LIST_PAGES_MAX};
use crate::transport::{long_poll_timeout, segment, Call};

impl Client {
    /// The current leader of `election`, or `None` when nobody leads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// match client.leader("scheduler").await? {
    ///     Some(leader) => println!("{} leads (token {})", leader.value, leader.token),
    ///     None => println!("nobody leads"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_name`; transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn leader(&self, election: &str) -> Result<Option<LeaderView>> {
        Ok(self.get_election(election).await?.leader)
    }

    /// `GET /v1/elections?after=NAME&limit=N`: one page of the elections the caller may read, in
    /// name order, each with its leader.
    ///
    /// # Errors
    ///
    /// `invalid_argument` for a `limit` outside 1..=[`LIST_LIMIT_MAX`], `invalid_name` for a bad
    /// `after`.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn list_elections(&self, after: Option<&str>, limit: u32) -> Result<ElectionList> {
        let mut call = Call::new(Method::GET, "/v1/elections".into()).query("limit", limit);
        if let Some(after) = after {
            call = call.query("after", after);
        }
        self.transport.send(&call).await?.json()
    }

    /// Every election in name order, read page by page (each page is consistent, the whole list
    /// is not a snapshot).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// for election in client.all_elections().await? {
    ///     let leader = election.leader.map_or("-".to_owned(), |leader| leader.value);
    ///     println!("{}: {leader}", election.name);
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
    pub async fn all_elections(&self) -> Result<Vec<ElectionView>> {
        let mut all = Vec::new();
        let mut after = None;
        for _ in 0..LIST_PAGES_MAX {
            let page = self.list_elections(after.as_deref(), LIST_LIMIT_MAX).await?;
            all.extend(page.elections);
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(all)
    }

    /// `POST /v1/elections/{name}/revoke`: ends `session`'s leadership of (or candidacy in) the
    /// election, as an operator; the next candidate leads. The session itself lives on.
    ///
    /// # Errors
    ///
    /// `session_not_found`, `invalid_name`, `permission_denied`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not revoke; repeating the call is harmless.
    pub async fn revoke_election(&self, name: &str, session: &str) -> Result<ReleaseResponse> {
        let call = Call::new(Method::POST, election_path(name, "/revoke"))
            .body(&RevokeRequest { session: session.to_owned() });
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/elections/{name}`: the leader and the number of candidates (a linearizable read).
    /// An election nobody ever campaigned in has no leader and `index` 0.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let view = client.get_election("scheduler").await?;
    /// println!("{} candidates waiting", view.candidates);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_name`; transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn get_election(&self, name: &str) -> Result<ElectionView> {
        let call = Call::new(Method::GET, election_path(name, ""));
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/elections/{name}?index=N&wait_ms=T`: blocks until the election changes after
    /// `index`, or `wait` (at most 60 s) passes; returns the view either way.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let mut view = client.get_election("scheduler").await?;
    /// loop {
    ///     view = client.watch_election("scheduler", view.index, Duration::from_secs(30)).await?;
    ///     println!("leader: {:?}", view.leader.as_ref().map(|l| &l.value));
    /// #   break;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_name`; transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn watch_election(&self, name: &str, index: u64, wait: Duration) -> Result<ElectionView> {
        let wait_ms = duration_ms(wait);
        let call = Call::new(Method::GET, election_path(name, ""))
            .query("index", index)
            .query("wait_ms", wait_ms)
            .timeout(long_poll_timeout(Some(wait_ms)));
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/elections/{name}/campaign`: one raw campaign (see
    /// [`Session::campaign`](crate::Session::campaign) for the guard).
    ///
    /// With `wait_ms > 0` the session queues behind the leader and earlier candidates and the call
    /// long-polls; [`CampaignResponse::Waiting`] keeps the place, and repeating the call is
    /// idempotent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::{CampaignRequest, CampaignResponse};
    /// # async fn run(session: String) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let request = CampaignRequest { session, value: "10.0.0.7:8080".into(), wait_ms: Some(0) };
    /// if let CampaignResponse::Leader { token } = client.campaign("scheduler", &request).await? {
    ///     println!("leading with token {token}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `session_not_found`, `wait_cancelled`, `limit_exceeded`, `invalid_name`,
    /// `invalid_argument` (value over 4096 bytes).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future keeps the candidacy, or the leadership, on the server until it is
    /// resigned or the session ends.
    pub async fn campaign(&self, name: &str, request: &CampaignRequest) -> Result<CampaignResponse> {
        let call = Call::new(Method::POST, election_path(name, "/campaign"))
            .body(request)
            .timeout(long_poll_timeout(request.wait_ms));
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/elections/{name}/proclaim`: the leading session publishes a new value and keeps
    /// leading, with the same token (see [`Leadership::proclaim`](crate::Leadership::proclaim)
    /// for the guard). Answers the leader with the new value.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::ProclaimRequest;
    /// # async fn run(session: String) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let request = ProclaimRequest { session, value: "10.0.0.8:8080".into() };
    /// let leader = client.proclaim("scheduler", &request).await?;
    /// println!("still leading with token {}, now at {}", leader.token, leader.value);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `not_leader` (the session does not lead; nothing changed), `session_not_found`,
    /// `feature_unavailable` (a member runs a build older than feature version 3),
    /// `invalid_name`, `invalid_argument` (value over 4096 bytes).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not publish the value; repeating the call is harmless.
    pub async fn proclaim(&self, name: &str, request: &ProclaimRequest) -> Result<LeaderView> {
        let call = Call::new(Method::POST, election_path(name, "/proclaim")).body(request);
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/elections/{name}/resign`: gives up leadership or withdraws a candidacy; resigning
    /// nothing is not an error.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: &str) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// client.resign("scheduler", session).await?;
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
    /// Dropping the future may or may not resign; repeating the call is harmless.
    pub async fn resign(&self, name: &str, session: &str) -> Result<ReleaseResponse> {
        let call = Call::new(Method::POST, election_path(name, "/resign"))
            .body(&ReleaseRequest { session: session.to_owned() });
        self.transport.send(&call).await?.json()
    }
}

fn election_path(name: &str, action: &str) -> String {
    format!("/v1/elections/{}{action}", segment(name))
}
