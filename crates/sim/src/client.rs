//! A simulated client: one session at a time, kept alive by a background task like the Rust
//! client's, and a random sequence of acquires (try and blocking), releases, reads, resizes and
//! closes against whichever node believes it leads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permit_core::{Key, Name, Outcome, Refusal, SessionId};
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, IteratorRandom};
use rand::Rng;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::gateway::{Gateway, Observation};

/// Session TTLs the clients choose from, in ms.
pub const TTLS_MS: [u64; 3] = [1000, 2500, 6000];
/// Largest `max_hold_ms` a client asks for.
pub const MAX_HOLD_MS_MAX: u64 = 4000;
/// Largest capacity a resize sets.
pub const CAPACITY_MAX: u64 = 5;

/// A client's current session, shared with its keepalive task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// The session.
    pub id: SessionId,
    /// Its TTL.
    pub ttl_ms: u64,
}

/// The slot holding a client's current session, if any.
pub type LeaseSlot = Arc<Mutex<Option<Lease>>>;

/// What a client believes of one semaphore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Held,
    Waiting,
    /// An operation on it went unanswered.
    Unknown,
}

/// One simulated client.
pub struct Client {
    gateway: Gateway,
    rng: StdRng,
    names: Vec<Name>,
    lease: LeaseSlot,
    standing: BTreeMap<Key, Standing>,
    standing_of: Option<SessionId>,
}

impl Client {
    /// A client working on the semaphores `names`.
    pub fn new(gateway: Gateway, rng: StdRng, names: Vec<Name>, lease: LeaseSlot) -> Client {
        Client { gateway, rng, names, lease, standing: BTreeMap::new(), standing_of: None }
    }

    /// Runs operations until `stop` turns true.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let think = Duration::from_millis(self.rng.random_range(10..=250));
            if sleep_or_stop(think, &mut stop).await {
                return;
            }
            self.step().await;
        }
    }

    async fn step(&mut self) {
        let lease = *self.lease.lock().expect("lease lock");
        let Some(lease) = lease else { return self.create_session().await };
        if self.standing_of != Some(lease.id) {
            self.standing.clear();
            self.standing_of = Some(lease.id);
        }
        match self.rng.random_range(0..100) {
            0..45 => self.acquire(lease).await,
            45..68 => self.release(lease).await,
            68..88 => self.observe(lease).await.map_or((), drop),
            88..92 => self.resize().await,
            92..95 => self.close(lease).await,
            _ => {}
        }
    }

    async fn create_session(&mut self) {
        let id = self.gateway.new_session_id(&mut self.rng);
        let ttl_ms = *TTLS_MS.choose(&mut self.rng).expect("TTLs");
        if let Some(Outcome::SessionCreated) = self.gateway.create_session(&mut self.rng, id, ttl_ms).await {
            *self.lease.lock().expect("lease lock") = Some(Lease { id, ttl_ms });
        }
    }

    fn key(&mut self) -> Key {
        Key::semaphore(self.names.choose(&mut self.rng).expect("semaphores").clone())
    }

    async fn acquire(&mut self, lease: Lease) {
        let key = self.key();
        let permits = self.rng.random_range(1..=3);
        let wait = self.rng.random_bool(0.5);
        let max_hold_ms = self.rng.random_bool(0.15).then(|| self.rng.random_range(300..=MAX_HOLD_MS_MAX));
        let outcome = self.gateway.acquire(&mut self.rng, lease.id, &key, permits, wait, max_hold_ms).await;
        match outcome {
            Some(Outcome::Acquired { .. }) => self.set(&key, Some(Standing::Held)),
            Some(Outcome::Waiting { .. }) => {
                self.set(&key, Some(Standing::Waiting));
                if wait {
                    self.await_grant(lease, &key).await;
                }
            }
            Some(Outcome::Refused(Refusal::SessionNotFound)) => self.lose(lease),
            Some(Outcome::Refused(Refusal::PermitsMismatch { .. })) | None => {
                self.set(&key, Some(Standing::Unknown));
            }
            Some(_) => self.set(&key, None),
        }
    }

    /// Long-polls for a queued grant by reading the session, then keeps the place or gives it up.
    async fn await_grant(&mut self, lease: Lease, key: &Key) {
        let deadline = Instant::now() + Duration::from_millis(self.rng.random_range(200..=3000));
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(self.rng.random_range(50..=200))).await;
            match self.observe(lease).await {
                Some(seen) if seen.waits.contains(key) => {}
                Some(_) => return,
                None => {}
            }
        }
        if self.standing.get(key) == Some(&Standing::Waiting) && self.rng.random_bool(0.5) {
            self.release_key(lease, key.clone()).await;
        }
    }

    async fn release(&mut self, lease: Lease) {
        let known = self.standing.keys().choose(&mut self.rng).cloned();
        let key = match known {
            Some(key) => key,
            None => self.key(),
        };
        self.release_key(lease, key).await;
    }

    async fn release_key(&mut self, lease: Lease, key: Key) {
        match self.gateway.release(&mut self.rng, lease.id, &key).await {
            Some(Outcome::Released { .. }) => self.set(&key, None),
            Some(Outcome::Refused(Refusal::SessionNotFound)) => self.lose(lease),
            _ => self.set(&key, Some(Standing::Unknown)),
        }
    }

    async fn observe(&mut self, lease: Lease) -> Option<Observation> {
        let seen = self.gateway.observe(&mut self.rng, lease.id).await?;
        if !seen.present {
            self.lose(lease);
            return Some(seen);
        }
        if self.standing_of == Some(lease.id) {
            self.standing = seen.holds.iter().map(|hold| (hold.key.clone(), Standing::Held)).collect();
            self.standing.extend(seen.waits.iter().map(|key| (key.clone(), Standing::Waiting)));
        }
        Some(seen)
    }

    async fn resize(&mut self) {
        let name = self.names.choose(&mut self.rng).expect("semaphores").clone();
        let capacity = self.rng.random_range(1..=CAPACITY_MAX);
        self.gateway.put_semaphore(&mut self.rng, &name, capacity).await;
    }

    async fn close(&mut self, lease: Lease) {
        self.gateway.close(&mut self.rng, lease.id).await;
        self.lose(lease);
    }

    fn set(&mut self, key: &Key, standing: Option<Standing>) {
        match standing {
            Some(standing) => self.standing.insert(key.clone(), standing),
            None => self.standing.remove(key),
        };
    }

    /// Forgets the session (gone, or closed).
    fn lose(&mut self, lease: Lease) {
        let mut slot = self.lease.lock().expect("lease lock");
        if *slot == Some(lease) {
            *slot = None;
        }
        self.standing.clear();
    }
}

/// Keeps the client's current session alive every third of its TTL until `stop` turns true.
pub async fn keep_alive(
    gateway: Gateway,
    mut rng: StdRng,
    lease: LeaseSlot,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let current = *lease.lock().expect("lease lock");
        let period_ms = current.map_or(100, |lease| lease.ttl_ms / 3);
        let jitter_ms = rng.random_range(0..=period_ms / 5);
        if sleep_or_stop(Duration::from_millis(period_ms - jitter_ms), &mut stop).await {
            return;
        }
        let Some(current) = *lease.lock().expect("lease lock") else { continue };
        if gateway.keepalive(&mut rng, current.id).await == Some(false) {
            let mut slot = lease.lock().expect("lease lock");
            if *slot == Some(current) {
                *slot = None;
            }
        }
    }
}

/// Sleeps for `duration`; true when `stop` turned true first.
pub async fn sleep_or_stop(duration: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    if *stop.borrow() {
        return true;
    }
    let stopped = tokio::select! {
        biased;
        () = tokio::time::sleep(duration) => false,
        _ = stop.wait_for(|stopped| *stopped) => true,
    };
    stopped || *stop.borrow()
}
