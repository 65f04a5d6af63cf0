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
}

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
            tokio::spawn(run_client(workload, client, keepalive, resource, stop, rng))
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
