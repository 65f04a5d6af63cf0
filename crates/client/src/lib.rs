//! Async Rust client of Permit, a distributed semaphore service.
//!
//! A [`Client`] talks HTTP/JSON to one server or to any node of a cluster, over `http://` or
//! `https://` ([`Client::builder`] takes a private CA and a client certificate; TLS is rustls
//! with the ring provider, see [`install_crypto_provider`]). A [`Session`] is the
//! server-side identity that holds things; this client keeps it alive in the background
//! (a keepalive every third of its TTL) and tracks its [`SessionState`]. The sessions of one
//! `Client` (and its clones) share their keepalive requests: while one batched keepalive is in
//! flight the others queue and go together in the next, so many sessions cost about one request
//! per period. From a session:
//!
//! - [`Session::acquire`] (and [`try_acquire`](Session::try_acquire),
//!   [`acquire_timeout`](Session::acquire_timeout), [`acquire_with`](Session::acquire_with))
//!   returns a [`Permit`] guard with a fencing token, released on drop;
//! - [`Session::campaign`] returns a [`Leadership`] guard; [`Client::leader`] tells who leads.
//!
//! # Model
//!
//! A *semaphore* has a capacity in *permits*; a session's *hold* on it is some permits plus a
//! *token*, a number larger than every token granted before. Waiters queue in strict FIFO order.
//! When a session expires (no keepalive for its TTL) the server frees its holds. A semaphore
//! that an acquire creates ([`AcquireOptions::capacity`]) is *ephemeral* by default, as with the
//! CLI and the Python client: the server deletes it when its last holder and waiter leave;
//! `ephemeral: false` keeps it (the CLI's `--keep`, Python's `ephemeral=False`).
//!
//! The client's view is conservative: a session's local deadline counts from when the last
//! acknowledged keepalive was *sent* (for a batched one, when its batch was sent), so [`Permit::lost`] fires no later than the server frees
//! the permits (clock rates being equal). That still does not give mutual exclusion against a
//! paused process by itself: pass [`Permit::token`] to the resource you protect and have it
//! reject tokens smaller than the largest it has seen (or ask [`Client::validate`]).
//!
//! # Errors and retries
//!
//! One [`Error`] type; server refusals carry a stable [`ErrorCode`]. A timeout leaves the
//! outcome unknown ([`Error::is_outcome_unknown`]); acquire and campaign are idempotent per
//! session and name, so repeating them is safe. With several endpoints
//! ([`Client::with_endpoints`]) requests fail over on connection errors and `no_leader`, and go
//! to the endpoint that the servers name as the leader (`permit-leader`), when it is one of them.
//!
//! # Examples
//!
//! Cap a job at three concurrent runs across machines:
//!
//! ```no_run
//! use std::time::Duration;
//! use permit_client::{AcquireOptions, Client};
//! # async fn run_job(_token: u64) {}
//! # async fn run() -> permit_client::Result<()> {
//! let client = Client::new("http://127.0.0.1:7376")?;
//! let session = client.session(Duration::from_secs(10)).await?;
//! let options = AcquireOptions { capacity: Some(3), ..AcquireOptions::default() };
//! let permit = session.acquire_with("jobs.render", 1, &options).await?.expect("no timeout set");
//! tokio::select! {
//!     () = run_job(permit.token()) => permit.release().await?,
//!     () = permit.lost() => eprintln!("lost the permit: stop"),
//! }
//! session.close().await?;
//! # Ok(())
//! # }
//! ```
#![deny(missing_docs)]

mod acl;
mod builder;
mod client;
mod cluster;
mod elections;
mod error;
mod events;
mod hold;
mod keepalive;
mod leadership;
mod permit;
mod semaphores;
mod session;
mod transport;
mod waiter;

pub use builder::ClientBuilder;
pub use client::Client;
pub use error::{Error, Result, Unreachable};
pub use events::{EventStream, EventsOptions, StreamEvent};
pub use leadership::Leadership;
pub use permit::{AcquireOptions, Permit};
pub use permit_wire::ErrorCode;
pub use semaphores::LIST_LIMIT_MAX;
pub use session::{QueuePosition, Session, SessionOptions, SessionState};
pub use transport::install_crypto_provider;

/// The JSON bodies of the HTTP API, as the low-level [`Client`] methods take and return them.
pub use permit_wire as wire;
