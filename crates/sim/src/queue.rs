//! Queue traffic: a producer pushing items with unique payloads, and consumers whose sessions
//! claim one item at a time (resending a claim whose answer was lost with its request id), hold
//! it a while, and ack it (half the time with an ack that claims the next item, resent as a
//! claim is), nack it, or let their session die holding it. After the run the driver
//! drains the queue and reads it and its dead-letter queue one last time; the history checker
//! ([`crate::checker::queues`]) judges it all.

use std::time::Duration;

use permit_core::{ClaimedItem, ItemState, Name, Outcome, Refusal, DEAD_LETTER_SUFFIX};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::{sleep_or_stop, Lease, LeaseSlot, TTLS_MS};
use crate::gateway::Gateway;
use crate::history::{Answer, Event, History, Operation, QueuedItem, SeenItem, DRIVER};

/// The queue the clients share.
pub const QUEUE: &str = "work";
/// Claims of one item before it is dead-lettered: low, so that nacks and dead sessions send
/// some items there.
pub const MAX_ATTEMPTS: u32 = 3;
/// Producers.
pub const PRODUCERS: u32 = 1;
/// Consumers.
pub const CONSUMERS: u32 = 2;
/// Times a consumer sends a claim or an ack whose answer was lost.
const TRIES: u32 = 3;
/// Pause between pushes, and after a claim that found nothing, in ms: every push and claim is a
/// log entry, and the CI seeds' time grows with the log.
const PAUSE_MS: (u64, u64) = (300, 1200);
/// Longest the driver's drain takes (simulated).
const DRAIN_PATIENCE: Duration = Duration::from_secs(60);

/// The queue's name.
pub fn name() -> Name {
    Name::new(QUEUE).expect("a valid queue name")
}

/// Pushes an item every 0.3-1.2 s (`PAUSE_MS`) until `stop`; payloads name the producer and a
/// counter.
pub async fn produce(gateway: Gateway, mut rng: StdRng, id: u32, mut stop: watch::Receiver<bool>) {
    let queue = name();
    for n in 1u64.. {
        if sleep_or_stop(Duration::from_millis(rng.random_range(PAUSE_MS.0..=PAUSE_MS.1)), &mut stop).await {
            return;
        }
        // An unanswered push is not resent: a resend would be another item.
        gateway.push(&mut rng, &queue, format!("{{\"producer\":{id},\"n\":{n}}}")).await;
    }
}

/// Claims, holds and settles items until `stop`, one session at a time (kept alive by the
/// keepalive task that shares `lease`).
pub async fn consume(gateway: Gateway, mut rng: StdRng, lease: LeaseSlot, mut stop: watch::Receiver<bool>) {
    let queue = name();
    // The item an ack claimed next, and the session that holds it.
    let mut next: Option<(Lease, SeenItem)> = None;
    loop {
        if sleep_or_stop(Duration::from_millis(rng.random_range(10..=100)), &mut stop).await {
            return;
        }
        let Some(current) = *lease.lock().expect("lease lock") else {
            let id = gateway.new_session_id(&mut rng);
            let ttl_ms = *TTLS_MS.choose(&mut rng).expect("TTLs");
            if let Some(Outcome::SessionCreated) = gateway.create_session(&mut rng, id, ttl_ms).await {
                *lease.lock().expect("lease lock") = Some(Lease { id, ttl_ms });
            }
            continue;
        };
        let claimed = match next.take() {
            Some((holder, item)) if holder == current => Some(item),
            _ => {
                let request = rng.random_range(1..(1u64 << 53));
                let mut claimed = None;
                for _ in 0..TRIES {
                    match gateway.claim(&mut rng, current.id, &queue, request).await {
                        None => continue,
                        Some(Outcome::Claimed { items }) => claimed = items.into_iter().next().map(seen),
                        Some(Outcome::Refused(Refusal::SessionNotFound)) => lose(&lease, current),
                        Some(_) => {}
                    }
                    break;
                }
                claimed
            }
        };
        let Some(item) = claimed else {
            // Nothing due: wait a while before the next claim (see `PAUSE_MS`).
            if sleep_or_stop(Duration::from_millis(rng.random_range(PAUSE_MS.0..=PAUSE_MS.1)), &mut stop)
                .await
            {
                return;
            }
            continue;
        };
        if sleep_or_stop(Duration::from_millis(rng.random_range(0..=400)), &mut stop).await {
            return;
        }
        match rng.random_range(0..100) {
            // The consumer "dies" holding the item: no ack, no close, no more keepalives.
            0..5 => lose(&lease, current),
            // Now and then it gives up its session while holding.
            5..8 => {
                gateway.close(&mut rng, current.id).await;
                lose(&lease, current);
            }
            roll @ 18.. if roll % 2 == 0 => {
                let request = rng.random_range(1..(1u64 << 53));
                for _ in 0..TRIES {
                    match gateway.ack_and_claim(&mut rng, current.id, &queue, &item, request).await {
                        None => continue,
                        Some(Outcome::Claimed { items }) => {
                            next = items.into_iter().next().map(|claimed| (current, seen(claimed)));
                        }
                        Some(Outcome::Refused(Refusal::SessionNotFound)) => lose(&lease, current),
                        Some(_) => {}
                    }
                    break;
                }
            }
            roll => {
                for _ in 0..TRIES {
                    if gateway.settle(&mut rng, current.id, &queue, &item, roll >= 18).await.is_some() {
                        break;
                    }
                }
            }
        }
    }
}

fn seen(item: ClaimedItem) -> SeenItem {
    SeenItem { id: item.id, payload: item.payload.into(), token: item.token }
}

fn lose(lease: &LeaseSlot, current: Lease) {
    let mut slot = lease.lock().expect("lease lock");
    if *slot == Some(current) {
        *slot = None;
    }
}

/// Once every client's session is gone: claims and acks every item left, then reads the queue
/// and its dead-letter queue linearizably and records what it found ([`Event::QueueRead`]).
pub async fn drain_and_read(driver: &Gateway, rng: &mut impl Rng) {
    let recorder = driver.recorder();
    let queue = name();
    let session = driver.new_session_id(rng);
    if driver.create_session(rng, session, 2 * DRAIN_PATIENCE.as_millis() as u64).await
        != Some(Outcome::SessionCreated)
    {
        recorder.violation("queue drain: the session could not be created");
        return;
    }
    let deadline = Instant::now() + DRAIN_PATIENCE;
    while Instant::now() < deadline {
        let request = rng.random_range(1..(1u64 << 53));
        match driver.claim(rng, session, &queue, request).await {
            Some(Outcome::Claimed { items }) if items.is_empty() => {
                if queue_is_empty(driver, rng, &queue).await {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Some(Outcome::Claimed { items }) => {
                for item in items {
                    let seen = SeenItem { id: item.id, payload: item.payload.into(), token: item.token };
                    driver.settle(rng, session, &queue, &seen, true).await;
                }
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    driver.close(rng, session).await;
    read_queue(driver, rng, &queue).await;
}

async fn queue_is_empty(driver: &Gateway, rng: &mut impl Rng, queue: &Name) -> bool {
    let Some(node) = driver.leader(rng).await else { return false };
    if node.ensure_linearizable().await.is_err() {
        return false;
    }
    let replica = node.replica().read();
    replica.state.queue(queue).is_none_or(|queue| queue.is_empty())
}

async fn read_queue(driver: &Gateway, rng: &mut impl Rng, queue: &Name) {
    let recorder = driver.recorder();
    for _ in 0..10 {
        let Some(node) = driver.leader(rng).await else { continue };
        if node.ensure_linearizable().await.is_err() {
            continue;
        }
        let dead_letter = Name::new(format!("{QUEUE}{DEAD_LETTER_SUFFIX}")).expect("a valid queue name");
        let event = {
            let replica = node.replica().read();
            let items = |name: &Name, dead: bool| -> Vec<QueuedItem> {
                let Some(queue) = replica.state.queue(name) else { return Vec::new() };
                queue
                    .items()
                    .map(|(id, item)| QueuedItem {
                        id,
                        payload: item.payload.to_string(),
                        state: match (&item.state, dead) {
                            (_, true) => "dead",
                            (ItemState::Pending, _) => "pending",
                            (ItemState::Delayed { .. }, _) => "delayed",
                            (ItemState::Claimed(_), _) => "claimed",
                        },
                    })
                    .collect()
            };
            Event::QueueRead {
                queue: queue.clone(),
                items: items(queue, false),
                dead: items(&dead_letter, true),
                drained: true,
            }
        };
        recorder.record(DRIVER, event);
        return;
    }
    recorder.violation("queue drain: no leader could read the queue");
}

/// Items whose push was acknowledged, acks acknowledged, and items the final read found
/// dead-lettered, in `history`.
pub fn counts(history: &History) -> (usize, usize, usize) {
    let mut acks = std::collections::BTreeSet::new();
    let (mut pushed, mut acked, mut dead) = (0, 0, 0);
    for record in &history.records {
        match &record.event {
            Event::Invoked {
                op,
                operation: Operation::Settle { ack: true, .. } | Operation::AckAndClaim { .. },
                ..
            } => {
                acks.insert(*op);
            }
            Event::Acked { answer: Answer::Pushed { .. }, .. } => pushed += 1,
            Event::Acked { op, answer: Answer::Settled | Answer::Claimed(_) } if acks.contains(op) => {
                acked += 1
            }
            Event::QueueRead { dead: items, .. } => dead = items.len(),
            _ => {}
        }
    }
    (pushed, acked, dead)
}
