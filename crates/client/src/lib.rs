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
//! - [`Session::campaign`] returns a [`Leadership`] guard; [`Client::leader`] tells who leads;
//! - [`Session::claim`] (and [`try_claim`](Session::try_claim),
//!   [`claim_timeout`](Session::claim_timeout), [`claim_with`](Session::claim_with)) returns
//!   [`Item`] guards of a work queue, acked or nacked by the worker; [`Client::push`] (and
//!   [`push_with`](Client::push_with), [`push_many`](Client::push_many)) fills the queue.
//!
//! Without a session, [`Client::take`] takes permits of a semaphore's rate (holding nothing;
//! [`Error::RateLimited`] says when the rate has room), and [`Client::put_semaphore_with`] sets a
//! semaphore's policies: a rate next to its capacity, a lock-delay after failed holds, and a cap
//! per group ([`AcquireOptions::group`]).
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
//! A *queue* holds items in `seq` order. A claim hands due items out, each to one session, as a
//! lease of that session: the item is the session's until it is acked or nacked, or the session
//! ends (then it is pending again at once, for another claim); an item claimed `max_attempts`
//! times without an ack moves to the queue's dead-letter queue. Each claim has a fencing token,
//! as grants do, and [`Item::lost`] fires as [`Permit::lost`] does.
//!
//! # Errors and retries
//!
//! One [`Error`] type; server refusals carry a stable [`ErrorCode`]. A timeout leaves the
//! outcome unknown ([`Error::is_outcome_unknown`]); acquire and campaign are idempotent per
//! session and name, so repeating them is safe. A claim carries a random `request_id` and is
//! repeated with it until answered, so a lost answer never leaves items claimed and unseen.
//! Pushes without a key are sent again only when they certainly were not applied; ack and nack
//! are repeated after a lost answer (a repeat cannot apply twice, but may be answered
//! `claim_lost` when the first attempt applied: see [`Item::ack`]). With several endpoints
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
//!
//! A worker of a work queue, and a producer:
//!
//! ```no_run
//! use std::time::Duration;
//! use permit_client::Client;
//! # async fn render(_payload: &str, _token: u64) -> Result<(), String> { Ok(()) }
//! # async fn run() -> permit_client::Result<()> {
//! let client = Client::new("http://127.0.0.1:7376")?;
//! client.push("thumbnails", &serde_json::json!({"image": "cat.png"})).await?;
//!
//! let session = client.session(Duration::from_secs(10)).await?;
//! while let Some(item) = session.claim_timeout("thumbnails", Duration::from_secs(30)).await? {
//!     tokio::select! {
//!         done = render(item.payload(), item.token()) => match done {
//!             Ok(()) => item.ack().await?,
//!             Err(why) => drop(item.nack(Duration::from_secs(10), Some(&why)).await?),
//!         },
//!         () = item.lost() => eprintln!("session lost: another worker gets the item"),
//!     }
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
mod queues;
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
pub use queues::{ClaimOptions, Item, PushOptions, PUSH_ITEMS_MAX};
pub use semaphores::LIST_LIMIT_MAX;
pub use session::{QueuePosition, Session, SessionOptions, SessionState};
pub use transport::install_crypto_provider;

/// The JSON bodies of the HTTP API, as the low-level [`Client`] methods take and return them.
pub use permit_wire as wire;
