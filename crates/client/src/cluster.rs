//! The cluster routes: status and membership.

use std::time::Duration;

use permit_wire::{AddMemberRequest, ClusterView};
use reqwest::Method;

use crate::error::Result;
use crate::transport::{Call, Retry};
use crate::Client;

/// A membership change waits for the new node to catch up, by snapshot if it is far behind.
const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(90);

impl Client {
    /// `GET /v1/cluster`: the leader, the term, and every member with its role and indexes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let cluster = client.cluster().await?;
    /// println!("leader {:?} in term {}", cluster.leader, cluster.term);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `no_leader` / `leader_unreachable` while no leader is elected (the view needs the leader's
    /// replication state), and transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn cluster(&self) -> Result<ClusterView> {
        let call = Call::new(Method::GET, "/v1/cluster".into()).retry(Retry::Idempotent);
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/cluster/members`: adds node `id` at `addr` (started with `permit serve --join`)
    /// as a learner, waits until it caught up, then makes it a voter (unless `learner`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let cluster = client.add_member(4, "10.0.0.4:7376", false).await?;
    /// assert!(cluster.members.iter().any(|m| m.id == 4));
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `membership_change_in_progress`, `timeout` (the node did not catch up; it stays a
    /// learner), `invalid_argument`, and transport errors.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not stop the change on the server.
    pub async fn add_member(&self, id: u64, addr: &str, learner: bool) -> Result<ClusterView> {
        let body = AddMemberRequest { id, addr: addr.to_owned(), learner };
        let call =
            Call::new(Method::POST, "/v1/cluster/members".into()).body(&body).timeout(MEMBERSHIP_TIMEOUT);
        self.transport.send(&call).await?.json()
    }

    /// `DELETE /v1/cluster/members/{id}`: removes node `id` from the cluster.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// client.remove_member(1).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` (not a member, or the last voter), `membership_change_in_progress`,
    /// and transport errors.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future does not stop the change on the server.
    pub async fn remove_member(&self, id: u64) -> Result<()> {
        let call = Call::new(Method::DELETE, format!("/v1/cluster/members/{id}")).timeout(MEMBERSHIP_TIMEOUT);
        self.transport.send(&call).await.map(drop)
    }

    /// `GET /v1/snapshot`: a consistent backup of the whole state, as the bytes of a snapshot
    /// file; `permit serve --restore FILE` starts a new cluster from it. Needs `cluster` admin.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let backup = client.snapshot().await?;
    /// std::fs::write("permit.backup", backup).expect("written");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `permission_denied`, `no_leader`, and transport errors.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn snapshot(&self) -> Result<Vec<u8>> {
        let call = Call::new(Method::GET, "/v1/snapshot".into())
            .retry(Retry::Idempotent)
            .timeout(MEMBERSHIP_TIMEOUT);
        Ok(self.transport.send(&call).await?.bytes)
    }
}
