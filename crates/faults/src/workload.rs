//! Workloads: client tasks that record every call. Each runs until told to stop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use permit_check::{Completion, Invocation, Recorder};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::Client;
use crate::resource::Resource;

/// Chance per step that a churn client abandons its session while holding.
const ABANDON_PROBABILITY: f64 = 0.05;

/// Longest back-off of a linearizable client after an unknown outcome.
const LEADER_WAIT: Duration = Duration::from_secs(5);

/// What the clients do.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// W1: sessions with a short TTL kept alive every TTL/3; try-acquire 1 permit, hold a
    /// random while, release.
    Churn,
    /// W2: hold a capacity-1 semaphore while doing a read-modify-write of the protected counter
    /// with the token.
    FencedCounter,
    /// W3: long-TTL sessions (nothing expires); try-acquire, release, describe and validate.
    Linearizable,
    /// Work queues (the workload's `semaphores` are its queues, capacities unused): the first
    /// [`QUEUE_PRODUCERS`] clients push items with unique payloads; the others are consumers
    /// with short-TTL sessions that claim one item at a time (retrying a lost claim with its
    /// `request_id`), hold it a random while, and ack it, sometimes nack it, sometimes abandon
    /// their session while holding it.
    Queue,
}

/// Producers of a queue workload; the other clients consume.
pub const QUEUE_PRODUCERS: u32 = 2;

/// Chance per item that a consumer nacks it instead of acking.
const NACK_PROBABILITY: f64 = 0.1;
/// Share of a consumer's acks sent as an ack that claims the next item (`AckAndClaim`).
const ACK_AND_CLAIM_PROBABILITY: f64 = 0.5;

/// Longest a consumer's claim waits for an item (well within a call's timeout).
const CLAIM_WAIT_MS: u64 = 300;

/// Times a consumer sends a claim or an ack whose outcome it did not learn.
const QUEUE_CALL_TRIES: u32 = 3;

/// A workload's settings.
#[derive(Clone, Debug)]
pub struct Workload {
    /// What the clients do.
    pub kind: Kind,
    /// Semaphores and their capacities.
    pub semaphores: Vec<(String, u64)>,
    /// Number of clients.
    pub clients: u32,
    /// Session TTL.
    pub ttl_ms: u64,
    /// Longest hold.
    pub hold_ms_max: u64,
}

/// Everything the clients share.
pub struct Shared {
    /// The history.
    pub recorder: Arc<Recorder>,
    /// The protected counters.
    pub resource: Resource,
    /// Set to stop every client.
    pub stop: Arc<AtomicBool>,
    /// Node URLs.
    pub urls: Vec<String>,
}

/// Starts the workload's clients; they stop when `shared.stop` is set.
pub fn start(
    workload: &Workload,
    shared: &Shared,
    seed: u64,
    first_client: u32,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..workload.clients)
        .map(|i| {
            let id = first_client + 2 * i;
            let client = Client::new(id, shared.urls.clone(), i as usize, shared.recorder.clone());
            let keepalive = Client::new(id + 1, shared.urls.clone(), i as usize, shared.recorder.clone());
            let (workload, resource, stop) = (workload.clone(), shared.resource.clone(), shared.stop.clone());
            let rng = StdRng::seed_from_u64(seed ^ (u64::from(id) << 20));
            match workload.kind {
                Kind::Queue if i < QUEUE_PRODUCERS => tokio::spawn(produce(workload, client, stop, rng)),
                Kind::Queue => tokio::spawn(consume(workload, client, keepalive, stop, rng)),
                _ => tokio::spawn(run_client(workload, client, keepalive, resource, stop, rng)),
            }
        })
        .collect()
}

async fn run_client(
    workload: Workload,
    mut client: Client,
    keepalive_client: Client,
    resource: Resource,
    stop: Arc<AtomicBool>,
    mut rng: StdRng,
) {
    while !stop.load(Ordering::Relaxed) {
        let Some(session) = client.create_session(workload.ttl_ms).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let alive = Arc::new(AtomicBool::new(true));
        let keepalive = tokio::spawn(keep_alive(
            keepalive_client.clone(),
            session.clone(),
            Duration::from_millis(workload.ttl_ms / 3),
            alive.clone(),
            stop.clone(),
        ));
        while alive.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
            let (name, capacity) =
                workload.semaphores[rng.random_range(0..workload.semaphores.len())].clone();
            match workload.kind {
                // Now and then a churn client "crashes" while holding: no more keepalives, no
                // release, no close. Its permits must come back when its TTL runs out.
                Kind::Churn if rng.random_bool(ABANDON_PROBABILITY) => {
                    client.acquire(&session, &name, 1).await;
                    alive.store(false, Ordering::Relaxed);
                    keepalive.abort();
                    break;
                }
                Kind::Churn => churn_step(&workload, &mut client, &session, &name, capacity, &mut rng).await,
                Kind::FencedCounter => {
                    fenced_step(&workload, &mut client, &session, &name, &resource, &mut rng).await
                }
                Kind::Queue => unreachable!("queue clients run `produce` and `consume`"),
                Kind::Linearizable => {
                    linearizable_step(&mut client, &session, &name, capacity, &mut rng).await;
                    if client.last_was_unknown() {
                        client.wait_for_leader(LEADER_WAIT).await;
                    }
                }
            }
        }
        keepalive.abort();
        // Leave nothing behind: a closed session releases its holds (an unknown close expires).
        if alive.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            client.close_session(&session).await;
        }
    }
}

async fn keep_alive(
    mut client: Client,
    session: String,
    every: Duration,
    alive: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        tokio::time::sleep(every).await;
        if client.keepalive(&session).await == Some(false) {
            alive.store(false, Ordering::Relaxed);
            return;
        }
    }
}

async fn churn_step(
    workload: &Workload,
    client: &mut Client,
    session: &str,
    name: &str,
    capacity: u64,
    rng: &mut StdRng,
) {
    let permits = rng.random_range(1..=capacity.min(2));
    if client.acquire(session, name, permits).await.is_some() {
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..=workload.hold_ms_max))).await;
    }
    // Release even after a refusal or an unknown outcome: release is idempotent.
    client.release(session, name).await;
}

async fn fenced_step(
    workload: &Workload,
    client: &mut Client,
    session: &str,
    name: &str,
    resource: &Resource,
    rng: &mut StdRng,
) {
    if let Some(token) = client.acquire(session, name, 1).await {
        let recorder = client.recorder().clone();
        let handle = recorder.invoke(Invocation::fenced_write(client.id, session, name, token));
        let accepted = match resource.read(name, token) {
            Some(value) => {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..=workload.hold_ms_max))).await;
                resource.write(name, token, value + 1)
            }
            None => false,
        };
        handle.complete(if accepted { Completion::ok() } else { Completion::fail("stale_token") });
    }
    client.release(session, name).await;
}

async fn linearizable_step(client: &mut Client, session: &str, name: &str, capacity: u64, rng: &mut StdRng) {
    // Think time keeps the history small enough for an exhaustive linearizability search.
    tokio::time::sleep(Duration::from_millis(rng.random_range(5..=25))).await;
    match rng.random_range(0..10) {
        0..=3 => {
            client.acquire(session, name, rng.random_range(1..=capacity)).await;
        }
        4..=6 => {
            client.release(session, name).await;
        }
        7..=8 => {
            client.describe(name).await;
        }
        _ => {
            let token = rng.random_range(1..50);
            client.validate(name, token).await;
        }
    }
}

/// A producer: pushes items whose payloads name the client and a counter, so that each payload
/// is unique in the run. An unknown push is not retried (a retry would be a second item).
async fn produce(workload: Workload, mut client: Client, stop: Arc<AtomicBool>, mut rng: StdRng) {
    let mut count = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let queue = &workload.semaphores[rng.random_range(0..workload.semaphores.len())].0;
        count += 1;
        let payload = serde_json::json!({ "producer": client.id, "n": count }).to_string();
        client.push(queue, &payload).await;
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..=80))).await;
    }
}

/// A consumer: one session at a time, kept alive every TTL/3, claiming one item at a time.
async fn consume(
    workload: Workload,
    mut client: Client,
    keepalive_client: Client,
    stop: Arc<AtomicBool>,
    mut rng: StdRng,
) {
    while !stop.load(Ordering::Relaxed) {
        let Some(session) = client.create_session(workload.ttl_ms).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let alive = Arc::new(AtomicBool::new(true));
        let keepalive = tokio::spawn(keep_alive(
            keepalive_client.clone(),
            session.clone(),
            Duration::from_millis(workload.ttl_ms / 3),
            alive.clone(),
            stop.clone(),
        ));
        // The item an ack claimed next, and its queue.
        let mut next: Option<(String, crate::client::Claimed)> = None;
        while alive.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
            let (queue, item) = match next.take() {
                Some(next) => next,
                None => {
                    let queue = workload.semaphores[rng.random_range(0..workload.semaphores.len())].0.clone();
                    let Some(item) = claim_one(&mut client, &session, &queue, &mut rng).await else {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    };
                    (queue, item)
                }
            };
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=workload.hold_ms_max))).await;
            // Now and then a consumer "crashes" holding the item: its claim must end with the
            // session, and the item go to another consumer.
            if rng.random_bool(ABANDON_PROBABILITY) {
                alive.store(false, Ordering::Relaxed);
                keepalive.abort();
                break;
            }
            let nack = rng.random_bool(NACK_PROBABILITY);
            if !nack && rng.random_bool(ACK_AND_CLAIM_PROBABILITY) {
                match ack_and_claim(&mut client, &session, &queue, &item, &mut rng).await {
                    Some(claimed) => {
                        next = claimed.map(|claimed| (queue, claimed));
                        continue;
                    }
                    // Refused (`feature_unavailable` on an older cluster, `claim_lost`): a
                    // plain ack below says what became of the item.
                    None if !client.last_was_unknown() => {}
                    // Unknown after every try: the item is acked or not, and its session's end
                    // frees whatever the claim took.
                    None => continue,
                }
            }
            for _ in 0..QUEUE_CALL_TRIES {
                let settled = match nack {
                    true => client.nack(&session, &queue, &item).await,
                    false => client.ack(&session, &queue, &item).await,
                };
                if settled.is_some() {
                    break;
                }
            }
        }
        keepalive.abort();
        if alive.load(Ordering::Relaxed) || stop.load(Ordering::Relaxed) {
            client.close_session(&session).await;
        }
    }
}

/// Acks `item` and claims the next item of `queue` in one request, sending the same request
/// again while its outcome is unknown: as [`Client::ack_and_claim`] (`None` when it was refused,
/// or still unknown after every try).
async fn ack_and_claim(
    client: &mut Client,
    session: &str,
    queue: &str,
    item: &crate::client::Claimed,
    rng: &mut StdRng,
) -> Option<Option<crate::client::Claimed>> {
    let request_id = rng.random_range(1..(1u64 << 53));
    for _ in 0..QUEUE_CALL_TRIES {
        match client.ack_and_claim(session, queue, item, request_id, CLAIM_WAIT_MS).await {
            Some(claimed) => return Some(claimed),
            None if client.last_was_unknown() => continue,
            None => return None,
        }
    }
    None
}

/// Claims one item, sending the same claim again while its outcome is unknown; `None` when
/// nothing was due or the claim failed.
pub async fn claim_one(
    client: &mut Client,
    session: &str,
    queue: &str,
    rng: &mut StdRng,
) -> Option<crate::client::Claimed> {
    // The server takes ids up to 2^53 - 1 (JSON-safe integers).
    let request_id = rng.random_range(1..(1u64 << 53));
    for _ in 0..QUEUE_CALL_TRIES {
        match client.claim(session, queue, request_id, CLAIM_WAIT_MS).await {
            Some(claimed) => return claimed,
            None if client.last_was_unknown() => continue,
            None => return None,
        }
    }
    None
}
