//! Work queues: the queue routes of [`Client`], the claims of [`Session`], and [`Item`], a
//! claimed item as a guard.
//!
//! A claim is a lease of the claiming session: the item is the session's until it is acked or
//! nacked, or the session ends (then it is pending again at once). Each claim carries a fencing
//! token, larger than every token issued before.

use std::future::Future;
use std::time::Duration;

use permit_wire::{
    AckRequest, ClaimRequest, ClaimResponse, ErrorCode, ItemList, ItemState, NackRequest, NextClaim,
    PushItem, PushRequest, PushResponse, PushedItem, PutQueueRequest, QueueList, QueueView, SettleResponse,
    CLAIM_REQUEST_ID_MAX, QUEUE_PUSH_BODY_BYTES_MAX,
};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::value::RawValue;
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::semaphores::{duration_ms, LIST_LIMIT_MAX, LIST_PAGES_MAX};
use crate::session::{Session, SessionState};
use crate::transport::{long_poll_timeout, segment, Call, Retry};
use crate::waiter::is_outage;

/// Most items of one push request (the server's cap); [`Client::push_many`] sends more in
/// several requests.
pub const PUSH_ITEMS_MAX: usize = 1000;

/// Longest wait asked of the server in one claim request; a longer claim asks again.
const CLAIM_CHUNK: Duration = Duration::from_secs(30);
/// Pauses between asks while the servers cannot be reached (after the transport's own
/// retries): from the first, doubling up to the last.
const OUTAGE_PAUSE_MIN: Duration = Duration::from_millis(100);
const OUTAGE_PAUSE_MAX: Duration = Duration::from_secs(1);
/// The `error` of the nack sent for an [`Item`] dropped without an ack or a nack.
const DROPPED_ERROR: &str = "the worker dropped the item without an ack or a nack";

/// How to push one item (see [`Client::push_with`]).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use permit_client::PushOptions;
/// let options = PushOptions { delay: Some(Duration::from_secs(60)), key: Some("invoice-1234".into()) };
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PushOptions {
    /// Keep the item out of claims for this long after the push (up to 7 days; whole ms).
    pub delay: Option<Duration>,
    /// Deduplication key (1..=128 bytes): while an item pushed with this key is pending,
    /// delayed or claimed, a push with the same key adds nothing and answers that item (its
    /// [`PushedItem::duplicate`] is set).
    pub key: Option<String>,
}

impl PushOptions {
    /// One wire item of `payload` with these options.
    ///
    /// # Examples
    ///
    /// ```
    /// use permit_client::PushOptions;
    /// let item = PushOptions::default().item(&serde_json::json!({"video": 42})).unwrap();
    /// assert_eq!(item.payload.get(), r#"{"video":42}"#);
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] if `payload` does not serialize to JSON.
    pub fn item(&self, payload: &impl Serialize) -> Result<PushItem> {
        let payload = serde_json::value::to_raw_value(payload).map_err(|error| Error::InvalidArgument {
            message: format!("the payload is not JSON: {error}"),
        })?;
        Ok(PushItem { payload, delay_ms: self.delay.map(duration_ms), key: self.key.clone() })
    }
}

/// Options of [`Session::claim_with`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use permit_client::ClaimOptions;
/// let options = ClaimOptions { max: 10, timeout: Some(Duration::from_secs(30)) };
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimOptions {
    /// Most items to claim at once: 1..=1000. A claim answers as soon as at least one is due,
    /// with up to `max` of those due then.
    pub max: u32,
    /// Give up after this long (`Some(Duration::ZERO)`: take what is due, without waiting);
    /// `None` waits as long as the session lives.
    pub timeout: Option<Duration>,
}

impl Default for ClaimOptions {
    /// One item, no timeout.
    fn default() -> ClaimOptions {
        ClaimOptions { max: 1, timeout: None }
    }
}

impl Client {
    /// `PUT /v1/queues/{name}`: creates a queue, or changes the settings given (the others keep
    /// their values; a new queue takes the defaults: 5 attempts, dead letters to `{name}.dead`,
    /// a million items).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::PutQueueRequest;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let settings = PutQueueRequest { max_attempts: Some(3), ..PutQueueRequest::default() };
    /// let view = client.put_queue("jobs", &settings).await?;
    /// assert_eq!(view.max_attempts, 3);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_name`, `invalid_argument` (a setting out of range, a queue that is its own dead
    /// letter), `limit_exceeded`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not apply the settings; repeating the call is harmless.
    pub async fn put_queue(&self, name: &str, settings: &PutQueueRequest) -> Result<QueueView> {
        let call = Call::new(Method::PUT, queue_path(name, "")).body(settings);
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/queues/{name}`: counts by state, settings, blocked claimers and the oldest
    /// pending item's age (a linearizable read).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let view = client.get_queue("jobs").await?;
    /// println!("{} pending, {} claimed, {} delayed", view.pending, view.claimed, view.delayed);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `queue_not_found`, `invalid_name`.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn get_queue(&self, name: &str) -> Result<QueueView> {
        let call = Call::new(Method::GET, queue_path(name, ""));
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/queues?after=&limit=`: one page of queues in name order.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let page = client.list_queues(None, 100).await?;
    /// for queue in &page.queues {
    ///     println!("{}: {} pending", queue.name, queue.pending);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `invalid_argument` for a limit outside 1..=1000.
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn list_queues(&self, after: Option<&str>, limit: u32) -> Result<QueueList> {
        let mut call = Call::new(Method::GET, "/v1/queues".into()).query("limit", limit);
        if let Some(after) = after {
            call = call.query("after", after);
        }
        self.transport.send(&call).await?.json()
    }

    /// Every queue, reading [`Client::list_queues`] page by page (not one consistent snapshot).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let backlog: u64 = client.all_queues().await?.iter().map(|q| q.pending).sum();
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::list_queues`].
    ///
    /// # Cancel safety
    ///
    /// Safe: reads.
    pub async fn all_queues(&self) -> Result<Vec<QueueView>> {
        let mut all = Vec::new();
        let mut after = None;
        for _ in 0..LIST_PAGES_MAX {
            let page = self.list_queues(after.as_deref(), LIST_LIMIT_MAX).await?;
            all.extend(page.queues);
            match page.next_after {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        Ok(all)
    }

    /// `DELETE /v1/queues/{name}`: deletes an empty queue.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// client.delete_queue("jobs").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `queue_not_found` (also when a retry after a lost answer finds it deleted),
    /// `queue_busy` (it holds items, or claims wait on it), `invalid_name`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not delete the queue.
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        let call = Call::new(Method::DELETE, queue_path(name, ""));
        self.transport.send(&call).await.map(drop)
    }

    /// `POST /v1/queues/{name}/items`: pushes one item (any value that serializes to JSON, at
    /// most 64 KiB encoded). Creates the queue with the defaults if it does not exist.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let pushed = client.push("videos.encode", &serde_json::json!({"video": 42})).await?;
    /// println!("item {} at seq {}", pushed.id, pushed.seq);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `payload_too_large`, `queue_full`, `invalid_name`, `invalid_argument`, `limit_exceeded`;
    /// [`Error::InvalidArgument`] if `payload` does not serialize.
    ///
    /// # Cancel safety
    ///
    /// A push is retried only when it certainly was not applied (a repeat would push the item
    /// twice). After an unknown outcome ([`Error::is_outcome_unknown`]) the item may be in the
    /// queue: push with a [`PushOptions::key`] to make a repeat add nothing.
    pub async fn push(&self, queue: &str, payload: &impl Serialize) -> Result<PushedItem> {
        self.push_with(queue, payload, &PushOptions::default()).await
    }

    /// Like [`Client::push`], with a delay and a deduplication key.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use permit_client::PushOptions;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let options = PushOptions { delay: Some(Duration::from_secs(30)), key: Some("order-17".into()) };
    /// let pushed = client.push_with("emails", &"order-17 shipped", &options).await?;
    /// if pushed.duplicate {
    ///     println!("already queued as {}", pushed.id);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::push`].
    ///
    /// # Cancel safety
    ///
    /// As [`Client::push`]; with a key, the push is retried after an unknown outcome too (a
    /// repeat answers the item the first attempt pushed, while it is in the queue).
    pub async fn push_with(
        &self,
        queue: &str,
        payload: &impl Serialize,
        options: &PushOptions,
    ) -> Result<PushedItem> {
        let mut pushed = self.push_many(queue, [options.item(payload)?]).await?;
        pushed.pop().ok_or_else(|| Error::Protocol {
            endpoint: self.endpoints().join(","),
            status: 200,
            message: "a push of one item answered no item".into(),
        })
    }

    /// Pushes `items` in order: up to 1000 (and 4 MiB) per request, each request one log entry
    /// (all or nothing); more go in several requests, in order. Answers one entry per item.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::PushOptions;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let items = (1..=5000)
    ///     .map(|n| PushOptions::default().item(&serde_json::json!({"page": n})))
    ///     .collect::<permit_client::Result<Vec<_>>>()?;
    /// let pushed = client.push_many("crawl", items).await?;
    /// assert_eq!(pushed.len(), 5000);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::push`]. When a later request fails, the earlier ones stay pushed: the error
    /// does not say how many were (use keys to push the rest again safely).
    ///
    /// # Cancel safety
    ///
    /// As [`Client::push_with`], per request.
    pub async fn push_many(
        &self,
        queue: &str,
        items: impl IntoIterator<Item = PushItem>,
    ) -> Result<Vec<PushedItem>> {
        let mut pushed = Vec::new();
        let mut batch: Vec<PushItem> = Vec::new();
        // Room for the request's own JSON around the items.
        let budget = QUEUE_PUSH_BODY_BYTES_MAX - 1024;
        let mut bytes = 0;
        for item in items {
            let size = item.payload.get().len() + item.key.as_ref().map_or(0, String::len) + 64;
            if !batch.is_empty() && (batch.len() == PUSH_ITEMS_MAX || bytes + size > budget) {
                pushed.extend(self.push_items(queue, std::mem::take(&mut batch)).await?);
                bytes = 0;
            }
            bytes += size;
            batch.push(item);
        }
        if !batch.is_empty() {
            pushed.extend(self.push_items(queue, batch).await?);
        }
        Ok(pushed)
    }

    /// One push request of up to [`PUSH_ITEMS_MAX`] items.
    async fn push_items(&self, queue: &str, items: Vec<PushItem>) -> Result<Vec<PushedItem>> {
        // A repeat of a push whose every item has a key answers those items instead of adding
        // them again (while they are in the queue); without keys it could add them twice.
        let retry =
            if items.iter().all(|item| item.key.is_some()) { Retry::Idempotent } else { Retry::Unsent };
        let request = PushRequest { items: Some(items), ..PushRequest::default() };
        let call = Call::new(Method::POST, queue_path(queue, "/items")).body(&request).retry(retry);
        Ok(self.transport.send(&call).await?.json::<PushResponse>()?.items)
    }

    /// `POST /v1/queues/{name}/claim`: one raw claim (see [`Session::claim`] for the guards,
    /// the retries and the loop).
    ///
    /// With `wait_ms = 0` it takes what is due; otherwise, with nothing due, the session waits
    /// behind earlier claimers and the call long-polls up to `wait_ms` (at most 60 s). Give a
    /// `request_id` (random, below 2^53) to make a repeat answer the same claim: a claim
    /// without one is sent only once, since a repeat after a lost answer would take more items.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::ClaimRequest;
    /// # async fn run(session: String) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let request = ClaimRequest { session, max: Some(10), wait_ms: Some(20_000), request_id: Some(81_234_567) };
    /// for item in client.claim("jobs", &request).await?.items {
    ///     println!("{} attempt {} token {}", item.id, item.attempt, item.token);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `session_not_found`, `queue_not_found`, `invalid_argument`, `limit_exceeded`,
    /// `permission_denied`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave items claimed by the session (until it acks or nacks them,
    /// or ends); repeat the call with the same `request_id` to get them.
    pub async fn claim(&self, queue: &str, request: &ClaimRequest) -> Result<ClaimResponse> {
        let retry = if request.request_id.is_some() { Retry::Idempotent } else { Retry::Unsent };
        let call = Call::new(Method::POST, queue_path(queue, "/claim"))
            .body(request)
            .timeout(long_poll_timeout(request.wait_ms))
            .retry(retry);
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/queues/{name}/items/{id}/ack`: the claimed item is done and gone. Only the
    /// claiming session, with the claim's token, may ack it.
    ///
    /// Retried like a read: a repeat never acks twice, but a repeat after a lost answer can be
    /// answered `claim_lost` although the first attempt acked the item (see [`Item::ack`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::AckRequest;
    /// # async fn run(session: String, token: u64) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// client.ack("jobs", "17", &AckRequest { session, token, claim: None }).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `claim_lost` (the claim ended: its session is gone, it was nacked or the item removed,
    /// or it is another claim's token; nothing changed), `queue_not_found`, `item_not_found`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not ack the item.
    pub async fn ack(&self, queue: &str, id: &str, request: &AckRequest) -> Result<SettleResponse> {
        self.ack_with(queue, id, request, Retry::Idempotent).await
    }

    async fn ack_with(
        &self,
        queue: &str,
        id: &str,
        request: &AckRequest,
        retry: Retry,
    ) -> Result<SettleResponse> {
        let path = format!("{}/ack", item_path(queue, id));
        let mut call = Call::new(Method::POST, path).body(request).retry(retry);
        if let Some(claim) = &request.claim {
            // Its claim may wait: a long-poll's time.
            call = call.timeout(long_poll_timeout(claim.wait_ms));
        }
        self.transport.send(&call).await?.json()
    }

    /// `POST /v1/queues/{name}/items/{id}/nack`: gives the claimed item back: pending again in
    /// its `seq` place (after `delay_ms`), or dead-lettered when it was claimed `max_attempts`
    /// times. The answer's `state` says which.
    ///
    /// Retried like [`Client::ack`], with the same caveat.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::NackRequest;
    /// # async fn run(session: String, token: u64) -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let request = NackRequest { session, token, delay_ms: Some(5_000), error: Some("HTTP 503 upstream".into()) };
    /// let answer = client.nack("jobs", "17", &request).await?;
    /// println!("now {:?}", answer.state);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Client::ack`]; also `invalid_argument` (a delay over 7 days, an error over 1024
    /// bytes).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not nack the item.
    pub async fn nack(&self, queue: &str, id: &str, request: &NackRequest) -> Result<SettleResponse> {
        self.nack_with(queue, id, request, Retry::Idempotent).await
    }

    async fn nack_with(
        &self,
        queue: &str,
        id: &str,
        request: &NackRequest,
        retry: Retry,
    ) -> Result<SettleResponse> {
        let path = format!("{}/nack", item_path(queue, id));
        let call = Call::new(Method::POST, path).body(request).retry(retry);
        self.transport.send(&call).await?.json()
    }

    /// `GET /v1/queues/{name}/items?state=&after=&limit=`: one page of a queue's items in id
    /// order, with state, attempts, claiming session, age and payload. Pass the page's
    /// `next_after` as `after` for the next one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use permit_client::wire::ItemState;
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// let page = client.list_items("jobs", Some(ItemState::Claimed), None, 100).await?;
    /// for item in page.items {
    ///     println!("{} claimed by {:?} (attempt {})", item.id, item.session, item.attempt);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `queue_not_found`, `invalid_argument` (a limit outside 1..=1000, `state` dead).
    ///
    /// # Cancel safety
    ///
    /// Safe: a read.
    pub async fn list_items(
        &self,
        queue: &str,
        state: Option<ItemState>,
        after: Option<&str>,
        limit: u32,
    ) -> Result<ItemList> {
        let mut call = Call::new(Method::GET, queue_path(queue, "/items")).query("limit", limit);
        if let Some(state) = state {
            let state = serde_json::to_value(state).expect("a state serializes");
            call = call.query("state", state.as_str().unwrap_or_default());
        }
        if let Some(after) = after {
            call = call.query("after", after);
        }
        self.transport.send(&call).await?.json()
    }

    /// `DELETE /v1/queues/{name}/items/{id}`: removes one item whatever its state (an admin
    /// call); a claim of it ends, and its ack or nack gets `claim_lost`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run() -> permit_client::Result<()> {
    /// let client = permit_client::Client::new("http://127.0.0.1:7376")?;
    /// client.remove_item("jobs", "17").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `queue_not_found`, `item_not_found` (also when a retry after a lost answer finds it
    /// removed).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not remove the item.
    pub async fn remove_item(&self, queue: &str, id: &str) -> Result<()> {
        let call = Call::new(Method::DELETE, item_path(queue, id));
        self.transport.send(&call).await.map(drop)
    }
}

fn queue_path(name: &str, action: &str) -> String {
    format!("/v1/queues/{}{action}", segment(name))
}

fn item_path(queue: &str, id: &str) -> String {
    format!("{}/{}", queue_path(queue, "/items"), segment(id))
}

/// A fresh claim `request_id`: random in 1..=2^53-1, so that every JSON reader keeps it exact
/// and two claims of one session practically never share one.
fn new_request_id() -> u64 {
    rand::random::<u64>() % CLAIM_REQUEST_ID_MAX + 1
}

/// An item claimed by a session: a lease that lasts until [`Item::ack`] or [`Item::nack`], or
/// until the session ends (then the item is pending again, for another claim).
///
/// Dropping the guard without an ack or a nack nacks the item in the background (no delay;
/// best effort: if that fails, the item comes back when the session ends). The claim can be
/// lost while the guard lives, when the session expires: [`Item::lost`] resolves then (no later
/// than the server ends the claim, as with [`Permit::lost`](crate::Permit::lost)). An operator
/// may also remove the item; the ack then gets `claim_lost`.
///
/// Processing is at least once: an item whose worker dies, stalls past its session's TTL or
/// fails is claimed again, with a larger [`Item::token`]. For effects that must happen once,
/// have the sink keep the largest token it saw per item and refuse smaller ones.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// # async fn encode(_video: u64, _token: u64) -> Result<(), String> { Ok(()) }
/// # async fn run(client: permit_client::Client) -> permit_client::Result<()> {
/// let session = client.session(Duration::from_secs(10)).await?;
/// loop {
///     let item = session.claim("videos.encode").await?;
///     let video: u64 = item.payload_as().unwrap_or_default();
///     tokio::select! {
///         done = encode(video, item.token()) => match done {
///             Ok(()) => item.ack().await?,
///             Err(why) => drop(item.nack(Duration::from_secs(30), Some(&why)).await?),
///         },
///         () = item.lost() => eprintln!("session lost: item {} goes to another worker", item.id()),
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct Item {
    session: Session,
    queue: String,
    id: String,
    seq: u64,
    attempt: u32,
    token: u64,
    payload: Box<RawValue>,
    /// Acked or nacked (or being): the drop sends nothing.
    settled: bool,
}

impl Item {
    /// The queue the item was claimed from.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// println!("from {}", item.queue());
    /// # }
    /// ```
    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// The item's id (a string: treat it as opaque).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// println!("PERMIT_ITEM_ID={}", item.id());
    /// # }
    /// ```
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The item's place in its queue.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// println!("seq {}", item.seq());
    /// # }
    /// ```
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Claims of this item so far, this one included (1 on the first).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// if item.attempt() > 1 {
    ///     eprintln!("retry {} of item {}", item.attempt() - 1, item.id());
    /// }
    /// # }
    /// ```
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The claim's fencing token: larger than every token issued before it (semaphore grants
    /// included). Pass it to the sink, which refuses a token smaller than the largest it saw.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// println!("PERMIT_TOKEN={}", item.token());
    /// # }
    /// ```
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The payload, as the JSON text pushed (byte for byte).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// println!("{}", item.payload());
    /// # }
    /// ```
    pub fn payload(&self) -> &str {
        self.payload.get()
    }

    /// The payload decoded as a `T`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// #[derive(serde::Deserialize)]
    /// struct Job { video: u64 }
    /// # fn run(item: permit_client::Item) -> serde_json::Result<()> {
    /// let job: Job = item.payload_as()?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// When the payload is not a `T`.
    pub fn payload_as<T: DeserializeOwned>(&self) -> serde_json::Result<T> {
        serde_json::from_str(self.payload.get())
    }

    /// The claiming session.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// println!("claimed by {}", item.session().id());
    /// # }
    /// ```
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// The conservative local deadline of the claim: the session's (see
    /// [`Session::deadline`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn run(item: permit_client::Item) {
    /// let left = item.deadline().saturating_duration_since(tokio::time::Instant::now());
    /// println!("the claim lasts at least {left:?} more");
    /// # }
    /// ```
    pub fn deadline(&self) -> Instant {
        self.session.deadline()
    }

    /// Resolves when the claim is lost with its session: the server answered
    /// `session_not_found`, the session was closed, or its conservative deadline passed. The
    /// server then hands the item to another claim; stop working on it.
    ///
    /// The future owns what it needs, so it can be spawned or kept while the item is acked.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn run(item: permit_client::Item) -> permit_client::Result<()> {
    /// tokio::select! {
    ///     () = work() => item.ack().await?,
    ///     () = item.lost() => eprintln!("lost the claim; another worker gets the item"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Safe: it only watches.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.session.expired()
    }

    /// Acks the item: it is done and gone for good.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(item: permit_client::Item) -> permit_client::Result<()> {
    /// item.ack().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// `claim_lost` when the claim had ended (the session expired, or an operator removed the
    /// item): the item was not acked by this call, and is another claim's (or gone). A
    /// transport error leaves the outcome unknown; an answer lost in flight is retried, and a
    /// retry can only be answered `claim_lost`, since the first attempt may have acked the item
    /// already: `claim_lost` after such a retry (its message says so) means *maybe acked*.
    /// Either way the item is no longer this worker's; with a token-checking sink no work is
    /// applied twice. [`Error::SessionExpired`] when the server no longer knows the session.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not ack the item; if it did not, the item comes back when
    /// the session ends.
    pub async fn ack(mut self) -> Result<()> {
        self.settled = true;
        let request = AckRequest { session: self.session.id().to_owned(), token: self.token, claim: None };
        let client = self.session.client();
        settle(|retry| client.ack_with(&self.queue, &self.id, &request, retry))
            .await
            .map(drop)
            .map_err(|error| self.session.observe(error))
    }

    /// Acks the item and claims the session's next item of the same queue in the same request
    /// (one round trip and one log entry instead of two), waiting at most `timeout` for one;
    /// `None` when none came in time. A worker's loop:
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// let mut next = session.claim_timeout("jobs", Duration::from_secs(30)).await?;
    /// while let Some(item) = next {
    ///     println!("working on {}", item.payload());
    ///     next = item.ack_and_claim(Duration::from_secs(30)).await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// The ack and the claim are applied together or not at all; once applied the ack stands,
    /// whatever happens to the claim. On a cluster older than feature version 6 it acks, then
    /// claims, in two requests.
    ///
    /// # Errors
    ///
    /// As [`Item::ack`] (nothing was claimed then), then as [`Session::claim`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not ack the item, and may leave an item claimed by the
    /// session with nobody to work on it, until the session ends.
    pub async fn ack_and_claim(mut self, timeout: Duration) -> Result<Option<Item>> {
        self.settled = true;
        let started = Instant::now();
        let wait = timeout.min(CLAIM_CHUNK);
        let claim = NextClaim {
            max: Some(1),
            wait_ms: Some(if wait.is_zero() { 0 } else { duration_ms(wait).max(1) }),
            request_id: Some(new_request_id()),
        };
        let request =
            AckRequest { session: self.session.id().to_owned(), token: self.token, claim: Some(claim) };
        let client = self.session.client();
        let answer = tokio::select! {
            answer = settle(|retry| client.ack_with(&self.queue, &self.id, &request, retry)) => answer,
            // The session's end gives back whatever the claim took.
            () = self.session.expired() => return Err(Error::SessionExpired),
        };
        let taken = match answer {
            Ok(answer) => answer.items.unwrap_or_default().pop(),
            Err(Error::Api { code: ErrorCode::FeatureUnavailable, .. }) => {
                let plain = AckRequest { claim: None, ..request };
                settle(|retry| client.ack_with(&self.queue, &self.id, &plain, retry))
                    .await
                    .map_err(|error| self.session.observe(error))?;
                None
            }
            Err(error) => return Err(self.session.observe(error)),
        };
        if let Some(item) = taken {
            return Ok(Some(self.session.item(&self.queue, item)));
        }
        match timeout.checked_sub(started.elapsed()) {
            Some(left) if !left.is_zero() => self.session.claim_timeout(&self.queue, left).await,
            _ => Ok(None),
        }
    }

    /// Nacks the item: it is pending again in its `seq` place after `delay`, or moved to the
    /// dead-letter queue when it was claimed the queue's `max_attempts` times. `error` (at most
    /// 1024 bytes) is kept with the item as its `last_error`. Answers where the item went:
    /// [`ItemState::Pending`], [`ItemState::Delayed`] or [`ItemState::Dead`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use permit_client::wire::ItemState;
    /// # async fn run(item: permit_client::Item) -> permit_client::Result<()> {
    /// let backoff = Duration::from_secs(2u64.pow(item.attempt().min(8)));
    /// if item.nack(backoff, Some("upstream answered 503")).await? == ItemState::Dead {
    ///     eprintln!("gave up: the item is in the dead-letter queue");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Item::ack`] (`claim_lost` after a retry means *maybe nacked*); `invalid_argument`
    /// for a delay over 7 days or an error over 1024 bytes.
    ///
    /// # Cancel safety
    ///
    /// As [`Item::ack`].
    pub async fn nack(mut self, delay: Duration, error: Option<&str>) -> Result<ItemState> {
        self.settled = true;
        let request = NackRequest {
            session: self.session.id().to_owned(),
            token: self.token,
            delay_ms: (!delay.is_zero()).then(|| duration_ms(delay)),
            error: error.map(str::to_owned),
        };
        let client = self.session.client();
        let answer = settle(|retry| client.nack_with(&self.queue, &self.id, &request, retry))
            .await
            .map_err(|error| self.session.observe(error))?;
        Ok(answer.state.unwrap_or(ItemState::Pending))
    }
}

/// Sends an ack or a nack: once as a call that may not be repeated blindly, then, after an
/// outage that leaves the outcome unknown, as a repeatable one. A repeat cannot settle the claim
/// twice (the first one ended it), but it is answered `claim_lost` if the first applied: the
/// message of that answer says the first attempt may have applied.
async fn settle<F, Fut>(send: F) -> Result<SettleResponse>
where
    F: Fn(Retry) -> Fut,
    Fut: Future<Output = Result<SettleResponse>>,
{
    match send(Retry::Unsent).await {
        Err(error) if is_outage(&error) => {
            tracing::debug!(%error, "repeating an ack or nack whose outcome is unknown");
            match send(Retry::Idempotent).await {
                Err(Error::Api { status, code: ErrorCode::ClaimLost, message }) => Err(Error::Api {
                    status,
                    code: ErrorCode::ClaimLost,
                    message: format!(
                        "{message} (after a repeat: the answer to the first attempt was lost, and that attempt may have applied)"
                    ),
                }),
                other => other,
            }
        }
        other => other,
    }
}

impl Drop for Item {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!(id = %self.id, "no runtime to nack on; the session's end gives the item back");
            return;
        };
        let session = self.session.clone();
        let (queue, id) = (std::mem::take(&mut self.queue), std::mem::take(&mut self.id));
        let request = NackRequest {
            session: session.id().to_owned(),
            token: self.token,
            delay_ms: None,
            error: Some(DROPPED_ERROR.to_owned()),
        };
        runtime.spawn(async move {
            if session.liveness().state() == SessionState::Expired {
                return;
            }
            if let Err(error) = session.client().nack(&queue, &id, &request).await {
                tracing::debug!(%queue, %id, %error, "background nack failed; the session's end gives the item back");
            }
        });
    }
}

impl Session {
    /// Claims one item of `queue`, waiting as long as it takes (while the session lives).
    ///
    /// Long-polls in chunks of at most 30 s. Each request carries a random `request_id`; a
    /// request whose answer is lost (no server reachable, no leader, a timeout) is repeated with
    /// the same id until it is answered, so that a lost answer never leaves an item claimed
    /// and unseen.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(client: permit_client::Client) -> permit_client::Result<()> {
    /// let session = client.session(Duration::from_secs(10)).await?;
    /// let item = session.claim("jobs").await?;
    /// println!("working on {} (attempt {})", item.payload(), item.attempt());
    /// item.ack().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::SessionExpired`] if the session ends while waiting (an outage is ridden out until
    /// the session's local deadline); `queue_not_found` (a push creates a queue: a worker
    /// started first can retry), `limit_exceeded`, `invalid_name`, `permission_denied`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future while a request is in flight may leave items claimed by the session,
    /// with nobody to work on them, until the session ends (the server then hands them out
    /// again).
    pub async fn claim(&self, queue: &str) -> Result<Item> {
        let mut items = self.claim_with(queue, &ClaimOptions::default()).await?;
        items.pop().ok_or_else(|| Error::Protocol {
            endpoint: self.client().endpoints().join(","),
            status: 200,
            message: "a claim without a timeout ended without an item".into(),
        })
    }

    /// Claims one item of `queue` if one is due now, without waiting.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// while let Some(item) = session.try_claim("jobs").await? {
    ///     item.ack().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Session::claim`].
    ///
    /// # Cancel safety
    ///
    /// As [`Session::claim`].
    pub async fn try_claim(&self, queue: &str) -> Result<Option<Item>> {
        let options = ClaimOptions { max: 1, timeout: Some(Duration::ZERO) };
        Ok(self.claim_with(queue, &options).await?.pop())
    }

    /// Claims one item of `queue`, waiting at most `timeout`; `None` when the time is up.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// match session.claim_timeout("jobs", Duration::from_secs(30)).await? {
    ///     Some(item) => item.ack().await?,
    ///     None => println!("nothing to do for 30 s"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Session::claim`].
    ///
    /// # Cancel safety
    ///
    /// As [`Session::claim`].
    pub async fn claim_timeout(&self, queue: &str, timeout: Duration) -> Result<Option<Item>> {
        let options = ClaimOptions { max: 1, timeout: Some(timeout) };
        Ok(self.claim_with(queue, &options).await?.pop())
    }

    /// Claims up to `options.max` items of `queue` (in `seq` order), waiting up to
    /// `options.timeout` for the first; an empty list when none came in time.
    ///
    /// A request whose answer is lost is repeated with its `request_id` until answered, even
    /// past the timeout (the items it may have taken come back with the answer), or until the
    /// session's local deadline.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use permit_client::ClaimOptions;
    /// # async fn run(session: permit_client::Session) -> permit_client::Result<()> {
    /// let options = ClaimOptions { max: 100, timeout: Some(Duration::from_secs(5)) };
    /// let batch = session.claim_with("events", &options).await?;
    /// for item in batch {
    ///     item.ack().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Session::claim`]; `invalid_argument` for `max` outside 1..=1000.
    ///
    /// # Cancel safety
    ///
    /// As [`Session::claim`].
    pub async fn claim_with(&self, queue: &str, options: &ClaimOptions) -> Result<Vec<Item>> {
        if self.state() == SessionState::Expired {
            return Err(Error::SessionExpired);
        }
        let try_once = options.timeout == Some(Duration::ZERO);
        let deadline = options.timeout.map(|timeout| Instant::now() + timeout);
        let mut request_id = new_request_id();
        let mut outage_pause = OUTAGE_PAUSE_MIN;
        loop {
            let wait = match deadline {
                _ if try_once => Duration::ZERO,
                None => CLAIM_CHUNK,
                Some(deadline) => deadline.saturating_duration_since(Instant::now()).min(CLAIM_CHUNK),
            };
            // Round up, so that a wait under a millisecond still waits rather than tries; a
            // repeat waits at least a millisecond too, as the claim it repeats may wait.
            let wait_ms = if try_once { 0 } else { duration_ms(wait).max(1) };
            let request = ClaimRequest {
                session: self.id().to_owned(),
                max: Some(options.max),
                wait_ms: Some(wait_ms),
                request_id: Some(request_id),
            };
            let answer = tokio::select! {
                answer = self.client().claim(queue, &request) => answer,
                // The session's end hands back whatever the claim took.
                () = self.expired() => return Err(Error::SessionExpired),
            };
            match answer {
                Ok(answer) if !answer.items.is_empty() => {
                    return Ok(answer.items.into_iter().map(|item| self.item(queue, item)).collect());
                }
                Ok(_) => {
                    outage_pause = OUTAGE_PAUSE_MIN;
                    // Answered: the next request is a new claim.
                    request_id = new_request_id();
                }
                Err(error) if is_outage(&error) => {
                    // The claim may have taken items: ask again with the same id, even past
                    // the timeout, until it is answered.
                    tracing::debug!(%error, queue, "claiming through an outage");
                    let pause = outage_pause;
                    outage_pause = (outage_pause * 2).min(OUTAGE_PAUSE_MAX);
                    tokio::select! {
                        () = tokio::time::sleep(pause) => {}
                        () = self.expired() => return Err(Error::SessionExpired),
                    }
                    continue;
                }
                Err(error) => return Err(self.observe(error)),
            }
            if try_once || deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Ok(Vec::new());
            }
        }
    }

    fn item(&self, queue: &str, item: permit_wire::ClaimedItem) -> Item {
        Item {
            session: self.clone(),
            queue: queue.to_owned(),
            id: item.id,
            seq: item.seq,
            attempt: item.attempt,
            token: item.token,
            payload: item.payload,
            settled: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim_lost() -> Error {
        Error::Api { status: 409, code: ErrorCode::ClaimLost, message: "the claim ended".into() }
    }

    /// The two attempts of an ack whose first answer was lost, as the transport reports them.
    async fn settle_after(first: Error, second: Error) -> (Result<SettleResponse>, Vec<Retry>) {
        let calls = std::sync::Mutex::new(Vec::new());
        let answers = std::sync::Mutex::new(vec![second, first]);
        let result = settle(|retry| {
            calls.lock().unwrap().push(retry);
            let answer = answers.lock().unwrap().pop().expect("at most two attempts");
            async move { Err(answer) }
        })
        .await;
        (result, calls.into_inner().unwrap())
    }

    #[tokio::test]
    async fn a_claim_lost_after_a_lost_answer_says_the_first_attempt_may_have_applied() {
        let lost = Error::Timeout { endpoint: "http://a".into(), after: Duration::from_secs(10) };
        let (result, calls) = settle_after(lost, claim_lost()).await;
        assert_eq!(calls, [Retry::Unsent, Retry::Idempotent]);
        let error = result.unwrap_err();
        assert_eq!(error.code(), Some(ErrorCode::ClaimLost));
        assert!(error.to_string().contains("may have applied"), "{error}");

        // A refusal at the first attempt is final, and says nothing of a repeat.
        let (result, calls) = settle_after(claim_lost(), claim_lost()).await;
        assert_eq!(calls, [Retry::Unsent]);
        assert!(!result.unwrap_err().to_string().contains("may have applied"));
    }

    #[test]
    fn request_ids_stay_within_what_json_readers_keep_exact() {
        for _ in 0..10_000 {
            let id = new_request_id();
            assert!((1..=CLAIM_REQUEST_ID_MAX).contains(&id), "{id}");
        }
    }
}
