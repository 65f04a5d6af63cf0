//! The queue workloads (issue 32): Q1 and Q2 against Permit and the durable peers (Redis streams
//! with `appendfsync always`, beanstalkd with `-b DIR -f0`), each through a client as thin as the
//! others (`http1.rs`, the RESP client of `redis.rs`, `beanstalk.rs`); and a Permit node's memory
//! per pending item and restart time with many pending items.
//!
//! - Q1: one producer and one consumer, one item in flight: the time from the push's request to
//!   the answer of the consumer's ack, per item. The consumer waits in a blocking claim.
//! - Q2: 4 producers and 16 consumers, one item per push and per claim (blocking claims): items
//!   acknowledged per second. The producers keep at most [`Q2_BACKLOG`] items pushed and not yet
//!   acknowledged, so that the queue stays short and the rate is the steady one, not that of a
//!   queue growing for the whole run.
//!
//! Every item carries a tag (`p{producer}-{n}`) at the start of its payload. Q1 checks that the
//! consumer acknowledges the item just pushed; Q2 checks, once it has drained the queue, that
//! every item pushed was acknowledged exactly once. A run ends with one [`STOP`] item per
//! consumer, pushed after every other item: each consumer acknowledges one and leaves, so no
//! consumer is left in a blocking claim.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::api::Api;
use crate::beanstalk;
use crate::cpu::CpuWindow;
use crate::redis::StreamClient;
use crate::stats::Samples;
use crate::tasks::{join, STUCK};

/// Encoded size of a Q1/Q2 item's payload, in bytes.
pub const PAYLOAD_BYTES: usize = 256;
/// How long one blocking claim waits for an item.
const CLAIM_WAIT: Duration = Duration::from_secs(30);
/// Q2's producers and consumers.
pub const Q2_PRODUCERS: usize = 4;
pub const Q2_CONSUMERS: usize = 16;
/// The most items Q2's producers keep pushed and not yet acknowledged.
pub const Q2_BACKLOG: usize = 64;
/// The tag of the items that end a run.
const STOP: &str = "stop";
/// The consumer group of the Redis stream.
const GROUP: &str = "workers";

/// Where the queue workloads run.
#[derive(Clone)]
pub enum Target {
    /// A Permit node (a cluster's leader): its URL.
    Permit(String),
    /// `redis-server`: `host:port`.
    Redis(String),
    /// `beanstalkd`: `host:port`.
    Beanstalk(String),
}

/// One connection of a producer or a consumer.
enum Client {
    /// A consumer has a session; a producer has none.
    Permit {
        api: Api,
        queue: String,
        session: Option<String>,
    },
    Redis(StreamClient),
    Beanstalk(beanstalk::Conn),
}

/// A claimed item: what its ack needs, and its payload.
struct Claimed {
    id: String,
    token: u64,
    payload: Vec<u8>,
}

impl Target {
    /// Creates the queue (Permit), the stream and its group (Redis); a beanstalkd tube needs
    /// nothing.
    async fn prepare(&self, queue: &str) -> anyhow::Result<()> {
        match self {
            Target::Permit(url) => put_queue(&Api::new(url), queue, None).await,
            Target::Redis(addr) => StreamClient::create(addr, queue, GROUP).await,
            Target::Beanstalk(_) => Ok(()),
        }
    }

    async fn producer(&self, queue: &str) -> anyhow::Result<Client> {
        Ok(match self {
            Target::Permit(url) => {
                Client::Permit { api: Api::new(url), queue: queue.to_owned(), session: None }
            }
            Target::Redis(addr) => Client::Redis(StreamClient::open(addr, queue, GROUP, "producer").await?),
            Target::Beanstalk(addr) => Client::Beanstalk(beanstalk::Conn::producer(addr, queue).await?),
        })
    }

    /// Consumer `i` of `queue`, for a run of `duration`: a Permit consumer's session outlives the
    /// run and its drain without keepalives.
    async fn consumer(&self, queue: &str, i: usize, duration: Duration) -> anyhow::Result<Client> {
        Ok(match self {
            Target::Permit(url) => {
                let api = Api::new(url);
                let session = api.session((duration + 2 * STUCK).as_millis() as u64).await?;
                Client::Permit { api, queue: queue.to_owned(), session: Some(session) }
            }
            Target::Redis(addr) => {
                Client::Redis(StreamClient::open(addr, queue, GROUP, &format!("c{i}")).await?)
            }
            Target::Beanstalk(addr) => Client::Beanstalk(beanstalk::Conn::consumer(addr, queue).await?),
        })
    }
}

/// `tag|....`, `len` bytes (at least the tag and its bar).
fn payload(tag: &str, len: usize) -> String {
    let mut text = format!("{tag}|");
    let fill = len.saturating_sub(text.len());
    text.extend(std::iter::repeat_n('.', fill));
    text
}

fn tag_of(payload: &[u8]) -> anyhow::Result<String> {
    let text = std::str::from_utf8(payload)?;
    let (tag, _) = text.split_once('|').context("a payload without its tag")?;
    Ok(tag.to_owned())
}

/// A path segment with everything but unreserved characters percent-encoded.
fn segment(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Client {
    /// Pushes one item tagged `tag`, of [`PAYLOAD_BYTES`] encoded.
    async fn push(&mut self, tag: &str) -> anyhow::Result<()> {
        match self {
            Client::Permit { api, queue, .. } => {
                // A JSON string: its quotes are two of its bytes.
                let body = json!({ "payload": payload(tag, PAYLOAD_BYTES - 2) });
                let (status, answer) =
                    api.request_json("POST", &format!("/v1/queues/{queue}/items"), Some(body)).await?;
                anyhow::ensure!(status == 201, "push: {status} {answer}");
                Ok(())
            }
            Client::Redis(client) => client.push(payload(tag, PAYLOAD_BYTES).as_bytes()).await,
            Client::Beanstalk(conn) => conn.put(payload(tag, PAYLOAD_BYTES).as_bytes()).await.map(drop),
        }
    }

    /// One blocking claim of one item: `None` when none came within [`CLAIM_WAIT`].
    async fn claim(&mut self) -> anyhow::Result<Option<Claimed>> {
        match self {
            Client::Permit { api, queue, session } => {
                let session = session.as_deref().context("a producer does not claim")?;
                let wait_ms = CLAIM_WAIT.as_millis() as u64;
                let body = json!({ "session": session, "max": 1, "wait_ms": wait_ms });
                let (status, answer) =
                    api.request_json("POST", &format!("/v1/queues/{queue}/claim"), Some(body)).await?;
                anyhow::ensure!(status == 200, "claim: {status} {answer}");
                claimed(&answer)
            }
            Client::Redis(client) => Ok(client.claim(CLAIM_WAIT).await?.map(|entry| Claimed {
                id: entry.id,
                token: 0,
                payload: entry.payload,
            })),
            Client::Beanstalk(conn) => Ok(conn.reserve(CLAIM_WAIT).await?.map(|job| Claimed {
                id: job.id.to_string(),
                token: 0,
                payload: job.body,
            })),
        }
    }

    /// Acknowledges a claimed item: it is gone for good once this returns.
    async fn ack(&mut self, item: &Claimed) -> anyhow::Result<()> {
        match self {
            Client::Permit { api, queue, session } => {
                let body = json!({ "session": session, "token": item.token });
                let path = format!("/v1/queues/{queue}/items/{}/ack", segment(&item.id));
                let (status, answer) = api.request_json("POST", &path, Some(body)).await?;
                anyhow::ensure!(status == 200, "ack: {status} {answer}");
                Ok(())
            }
            Client::Redis(client) => client.ack(&item.id).await,
            Client::Beanstalk(conn) => conn.delete(item.id.parse()?).await,
        }
    }

    /// Acknowledges `item` and claims the next one, blocking: `None` when none came within
    /// [`CLAIM_WAIT`]. Permit does both in one request (an ack with `claim`); the peers' protocols
    /// have no such command, so their clients send the two of [`Client::ack`] and
    /// [`Client::claim`] one after the other.
    async fn ack_and_claim(&mut self, item: &Claimed) -> anyhow::Result<Option<Claimed>> {
        let Client::Permit { api, queue, session } = self else {
            self.ack(item).await?;
            return self.claim().await;
        };
        let wait_ms = CLAIM_WAIT.as_millis() as u64;
        let body =
            json!({ "session": session, "token": item.token, "claim": { "max": 1, "wait_ms": wait_ms } });
        let path = format!("/v1/queues/{queue}/items/{}/ack", segment(&item.id));
        let (status, answer) = api.request_json("POST", &path, Some(body)).await?;
        anyhow::ensure!(status == 200, "ack and claim: {status} {answer}");
        claimed(&answer)
    }

    /// Closes a consumer's session.
    async fn close(&mut self) -> anyhow::Result<()> {
        if let Client::Permit { api, session: Some(session), .. } = self {
            let (status, answer) =
                api.request_json("DELETE", &format!("/v1/sessions/{session}"), None).await?;
            anyhow::ensure!((200..300).contains(&status), "close session: {status} {answer}");
        }
        Ok(())
    }

    /// Claims until an item comes: bounded by [`STUCK`].
    async fn next(&mut self) -> anyhow::Result<Claimed> {
        let started = Instant::now();
        loop {
            if let Some(item) = self.claim().await? {
                return Ok(item);
            }
            anyhow::ensure!(started.elapsed() < STUCK, "no item within {STUCK:?}");
        }
    }
}

/// The item of a Permit claim's answer (`items`, at most one): `None` when it took none.
fn claimed(answer: &serde_json::Value) -> anyhow::Result<Option<Claimed>> {
    let items = answer["items"].as_array().context("claim answered no items")?;
    let Some(item) = items.first() else { return Ok(None) };
    anyhow::ensure!(items.len() == 1, "claimed {} items with max 1", items.len());
    let payload = item["payload"].as_str().context("a payload that is not a string")?;
    Ok(Some(Claimed {
        id: item["id"].as_str().context("an item without an id")?.to_owned(),
        token: item["token"].as_u64().context("an item without a token")?,
        payload: payload.as_bytes().to_vec(),
    }))
}

/// Q1 on `target`, queue `queue` (new): each item's time from its push to its ack's answer.
pub async fn q1(target: &Target, queue: &str, duration: Duration) -> anyhow::Result<Samples> {
    target.prepare(queue).await?;
    let mut producer = target.producer(queue).await?;
    let mut consumer = target.consumer(queue, 0, duration).await?;
    let (acked_tx, mut acked_rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let consuming = tokio::spawn(async move {
        loop {
            let item = consumer.next().await?;
            consumer.ack(&item).await?;
            let acked = Instant::now();
            let tag = tag_of(&item.payload)?;
            if tag == STOP {
                return consumer.close().await;
            }
            acked_tx.send((tag, acked)).ok().context("the producer left")?;
        }
    });
    let producing = async {
        let mut samples = Samples::default();
        let started = Instant::now();
        let mut n = 0u64;
        while started.elapsed() < duration {
            let tag = format!("p0-{n}");
            let sent = Instant::now();
            producer.push(&tag).await?;
            let (acked_tag, acked) = tokio::time::timeout(STUCK, acked_rx.recv())
                .await
                .with_context(|| format!("{tag} not acknowledged within {STUCK:?}"))?
                .context("the consumer left")?;
            anyhow::ensure!(acked_tag == tag, "the consumer acknowledged {acked_tag} after {tag} was pushed");
            samples.push(acked - sent);
            n += 1;
        }
        producer.push(STOP).await?;
        anyhow::Ok(samples)
    };
    match producing.await {
        Ok(samples) => {
            join(consuming, "queue").await?;
            Ok(samples)
        }
        Err(error) => {
            // The consumer's failure, when it failed first, says more.
            if consuming.is_finished() {
                join(consuming, "queue").await?;
            } else {
                consuming.abort();
            }
            Err(error)
        }
    }
}

/// One Q2 run.
pub struct Q2Run {
    /// Items whose ack was answered within the run's window, per second.
    pub items_per_second: f64,
    /// CPU of the server processes (`pids`) per item acknowledged in the window, in µs.
    pub cpu_per_item_us: f64,
}

/// Q2 on `target`, queue `queue` (new), for `duration`; `pids` are the server's processes.
pub async fn q2(target: &Target, queue: &str, duration: Duration, pids: &[String]) -> anyhow::Result<Q2Run> {
    target.prepare(queue).await?;
    let mut producers = Vec::new();
    for _ in 0..Q2_PRODUCERS {
        producers.push(target.producer(queue).await?);
    }
    let mut consumers = Vec::new();
    for i in 0..Q2_CONSUMERS {
        consumers.push(target.consumer(queue, i, duration).await?);
    }
    let backlog = Arc::new(tokio::sync::Semaphore::new(Q2_BACKLOG));
    let in_window = Arc::new(AtomicU64::new(0));
    let cpu = CpuWindow::start(pids.to_vec())?;
    let started = Instant::now();
    let end = started + duration;
    let consuming: Vec<_> = consumers
        .into_iter()
        .map(|mut consumer| {
            let (backlog, in_window) = (backlog.clone(), in_window.clone());
            tokio::spawn(async move {
                let mut tags = Vec::new();
                let mut item = consumer.next().await?;
                loop {
                    let tag = tag_of(&item.payload)?;
                    // A consumer leaves at its stop item: it claims nothing after it.
                    let next = if tag == STOP {
                        consumer.ack(&item).await?;
                        None
                    } else {
                        consumer.ack_and_claim(&item).await?
                    };
                    if Instant::now() <= end {
                        in_window.fetch_add(1, Ordering::Relaxed);
                    }
                    if tag == STOP {
                        consumer.close().await?;
                        return anyhow::Ok(tags);
                    }
                    tags.push(tag);
                    backlog.add_permits(1);
                    item = match next {
                        Some(next) => next,
                        None => consumer.next().await?,
                    };
                }
            })
        })
        .collect();
    let producing: Vec<_> = producers
        .into_iter()
        .enumerate()
        .map(|(i, mut producer)| {
            let backlog = backlog.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while Instant::now() < end {
                    tokio::time::timeout(STUCK, backlog.acquire())
                        .await
                        .with_context(|| format!("no item acknowledged within {STUCK:?}"))??
                        .forget();
                    if Instant::now() >= end {
                        break;
                    }
                    producer.push(&format!("p{i}-{n}")).await?;
                    n += 1;
                }
                anyhow::Ok((n, producer))
            })
        })
        .collect();
    let abort_all = |consuming: &[tokio::task::JoinHandle<_>]| consuming.iter().for_each(|t| t.abort());
    let mut pushed = 0;
    let mut last = None;
    for task in producing {
        match join(task, "queue").await {
            Ok((n, producer)) => {
                pushed += n;
                last = Some(producer);
            }
            Err(error) => {
                abort_all(&consuming);
                return Err(error);
            }
        }
    }
    let cpu_percent: f64 = cpu.percent(started.elapsed())?.iter().sum();
    let cpu_seconds = cpu_percent / 100.0 * started.elapsed().as_secs_f64();
    // Every producer's items are in the queue: the stop items come after them all.
    let mut producer = last.context("no producer")?;
    for _ in 0..Q2_CONSUMERS {
        if let Err(error) = producer.push(STOP).await {
            abort_all(&consuming);
            return Err(error);
        }
    }
    let mut acked = HashSet::new();
    for task in consuming {
        for tag in join(task, "queue").await? {
            anyhow::ensure!(acked.insert(tag.clone()), "{tag} acknowledged twice");
        }
    }
    anyhow::ensure!(
        acked.len() as u64 == pushed,
        "{pushed} items pushed, {} acknowledged after the queue drained",
        acked.len()
    );
    // The stop items' acks do not count: they come after the window.
    let items = in_window.load(Ordering::Relaxed);
    Ok(Q2Run {
        items_per_second: items as f64 / duration.as_secs_f64(),
        cpu_per_item_us: cpu_seconds * 1e6 / items.max(1) as f64,
    })
}

/// `PUT /v1/queues/{name}`, with `max_items` when given.
pub async fn put_queue(api: &Api, name: &str, max_items: Option<u64>) -> anyhow::Result<()> {
    let body = match max_items {
        Some(max) => json!({ "max_items": max }),
        None => json!({}),
    };
    let (status, answer) = api.request_json("PUT", &format!("/v1/queues/{name}"), Some(body)).await?;
    anyhow::ensure!((200..300).contains(&status), "put queue {name}: {status} {answer}");
    Ok(())
}

/// The queue's `pending` count (a linearizable read).
pub async fn pending(api: &Api, name: &str) -> anyhow::Result<u64> {
    let (status, answer) = api.request_json("GET", &format!("/v1/queues/{name}"), None).await?;
    anyhow::ensure!(status == 200, "get queue {name}: {status} {answer}");
    answer["pending"].as_u64().context("a queue view without pending")
}

/// The most items one push carries (`permit_wire::QUEUE_PUSH_ITEMS_MAX`).
pub const PUSH_ITEMS_MAX: usize = 1000;

/// Pushes `count` items with payloads of `payload_bytes` encoded (JSON strings), `per_push` at a
/// time (1: one `payload` per push, as a producer does; more: `items`), from `clients`
/// concurrent clients.
pub async fn fill(
    url: &str,
    name: &str,
    count: usize,
    payload_bytes: usize,
    per_push: usize,
    clients: usize,
) -> anyhow::Result<()> {
    anyhow::ensure!((1..=PUSH_ITEMS_MAX).contains(&per_push), "{per_push} items per push");
    let next = Arc::new(AtomicU64::new(0));
    let pushes = count.div_ceil(per_push) as u64;
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (url, name, next) = (url.to_owned(), name.to_owned(), next.clone());
            tokio::spawn(async move {
                let api = Api::new(&url);
                let path = format!("/v1/queues/{name}/items");
                loop {
                    let push = next.fetch_add(1, Ordering::Relaxed);
                    if push >= pushes {
                        return anyhow::Ok(());
                    }
                    let first = push as usize * per_push;
                    let mut items: Vec<_> = (first..count.min(first + per_push))
                        .map(|i| json!({ "payload": payload(&format!("f{i}"), payload_bytes - 2) }))
                        .collect();
                    let pushed = items.len();
                    let body = if per_push == 1 { items.remove(0) } else { json!({ "items": items }) };
                    let (status, answer) = api.request_json("POST", &path, Some(body)).await?;
                    anyhow::ensure!(status == 201, "push of {pushed} items: {status} {answer}");
                    let answered = answer["items"].as_array().map_or(0, Vec::len);
                    anyhow::ensure!(answered == pushed, "pushed {pushed} items, {answered} answered");
                }
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// Polls `/v1/health` every 5 ms until it answers 200: the time since `since`. Bounded by 180 s.
pub async fn ready(url: &str, since: Instant) -> anyhow::Result<Duration> {
    let api = Api::new(url);
    loop {
        if api.get_status("/v1/health").await.is_ok_and(|status| status == 200) {
            return Ok(since.elapsed());
        }
        anyhow::ensure!(since.elapsed() < Duration::from_secs(180), "{url} not ready within 180 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Total size of the files under `dir`, in bytes.
pub fn dir_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => dir_bytes(&entry.path()),
            _ => entry.metadata().map_or(0, |m| m.len()),
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_have_their_size_and_tag() {
        let text = payload("p3-17", PAYLOAD_BYTES);
        assert_eq!(text.len(), PAYLOAD_BYTES);
        assert_eq!(tag_of(text.as_bytes()).expect("tagged"), "p3-17");
        assert_eq!(serde_json::to_vec(&payload("x", PAYLOAD_BYTES - 2)).expect("json").len(), PAYLOAD_BYTES);
        assert!(tag_of(b"untagged").is_err());
    }

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(segment("01HX-a_b.c~"), "01HX-a_b.c~");
        assert_eq!(segment("a/b c%"), "a%2Fb%20c%25");
    }
}
