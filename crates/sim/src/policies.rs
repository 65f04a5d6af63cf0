//! Semaphore policy traffic: a rated semaphore ([`RATED`]) that takers hammer with takes (some
//! waiting in its queue) and holders try to acquire, and a capacity-1 semaphore with a
//! lock-delay ([`DELAYED`]) whose holders release, are revoked, or let their session expire
//! holding it. The checks are [`crate::checker::policies`]: the rate and the lock-delay on leader
//! time over the committed log ([`crate::applied`]), and the lock-delay on the clients' clock
//! over the history.

use std::time::Duration;

use permit_core::{Key, Name, Outcome, PolicyChange, Rate};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::Rng;
use tokio::sync::watch;

use crate::client::sleep_or_stop;
use crate::gateway::Gateway;

/// The rated semaphore.
pub const RATED: &str = "api";
/// Its capacity (acquires hold it; takes hold nothing).
pub const RATED_CAPACITY: u64 = 2;
/// Its rate: a burst of 2, then 3 per 7 s (an interval that is not a whole number of ms), so
/// that the taker below (about 0.8 takes a second) and the holder run into it often.
pub const RATE: Rate = Rate { permits: 3, per_ms: 7000, burst: 2 };
/// The lock-delayed semaphore, of capacity 1.
pub const DELAYED: &str = "lease";
/// Its lock-delay, in leader ms.
pub const LOCK_DELAY_MS: u64 = 1500;
/// Takers. Few, and slow: every take and every step of a hold is a log entry, and the CI seeds'
/// time grows with the log.
pub const TAKERS: u32 = 1;
/// Holders.
pub const HOLDERS: u32 = 1;
/// Pause between one taker's takes, in ms.
const TAKE_PAUSE_MS: (u64, u64) = (500, 2000);
/// The `wait_ms` of a take: mostly none (refused at once with no room).
const TAKE_WAITS_MS: [u64; 5] = [0, 0, 0, 300, 1500];
/// Pause between one holder's rounds, in ms.
const HOLD_PAUSE_MS: (u64, u64) = (1000, 3000);
/// TTLs of the holders' sessions, which are never kept alive: one let expire holding ends by
/// expiry within this.
const HOLDER_TTLS_MS: [u64; 2] = [700, 1500];

/// The two semaphores' names.
pub fn names() -> (Name, Name) {
    (Name::new(RATED).expect("a valid name"), Name::new(DELAYED).expect("a valid name"))
}

/// Creates both semaphores with their policies; false when no leader set them (the cluster
/// speaks feature version 5 only once its leader raised the cluster version).
pub async fn create(driver: &Gateway, rng: &mut StdRng) -> bool {
    let (rated, delayed) = names();
    let settings = [
        (rated, RATED_CAPACITY, PolicyChange { rate: Some(Some(RATE)), ..PolicyChange::default() }),
        (delayed, 1, PolicyChange { lock_delay_ms: Some(LOCK_DELAY_MS), ..PolicyChange::default() }),
    ];
    for (name, capacity, policy) in settings {
        let mut created = false;
        for _ in 0..20 {
            if let Some(Outcome::SemaphoreCreated | Outcome::SemaphoreUpdated) =
                driver.put_semaphore_policy(rng, &name, capacity, policy.clone()).await
            {
                created = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        if !created {
            driver.recorder().violation(format!("semaphore {name} could not be created with its policy"));
            return false;
        }
    }
    true
}

/// Takes one permit of [`RATED`] every 0.5-2 s until `stop`, some takes waiting in the queue.
/// An unanswered take is not resent (a resend is another take).
pub async fn take(gateway: Gateway, mut rng: StdRng, mut stop: watch::Receiver<bool>) {
    let (rated, _) = names();
    loop {
        let pause = Duration::from_millis(rng.random_range(TAKE_PAUSE_MS.0..=TAKE_PAUSE_MS.1));
        if sleep_or_stop(pause, &mut stop).await {
            return;
        }
        let wait_ms = *TAKE_WAITS_MS.choose(&mut rng).expect("waits");
        gateway.take(&mut rng, &rated, 1, wait_ms).await;
    }
}

/// Until `stop`: opens a session that is never kept alive, tries to acquire one permit of
/// [`DELAYED`] (two times in three) or [`RATED`], and ends a hold by a release, an admin's
/// revoke, or by letting the session expire holding it (a third each).
pub async fn hold(gateway: Gateway, mut rng: StdRng, mut stop: watch::Receiver<bool>) {
    let (rated, delayed) = names();
    // After it revoked a hold of the lock-delayed semaphore, the holder tries that semaphore
    // again at a random time within twice the delay: about half the tries fall inside the delay
    // (refused), and a grant answered early is what the real-time check looks for.
    let mut revoked_delayed = false;
    loop {
        let pause = match revoked_delayed {
            true => rng.random_range(0..=2 * LOCK_DELAY_MS),
            false => rng.random_range(HOLD_PAUSE_MS.0..=HOLD_PAUSE_MS.1),
        };
        let pause = Duration::from_millis(pause);
        if sleep_or_stop(pause, &mut stop).await {
            return;
        }
        let session = gateway.new_session_id(&mut rng);
        let ttl_ms = *HOLDER_TTLS_MS.choose(&mut rng).expect("TTLs");
        if gateway.create_session(&mut rng, session, ttl_ms).await != Some(Outcome::SessionCreated) {
            continue;
        }
        let rated_now = !revoked_delayed && rng.random_bool(1.0 / 3.0);
        let key = Key::semaphore(if rated_now { rated.clone() } else { delayed.clone() });
        revoked_delayed = false;
        let Some(Outcome::Acquired { token, .. }) =
            gateway.acquire(&mut rng, session, &key, 1, false, None).await
        else {
            gateway.close(&mut rng, session).await;
            continue;
        };
        // Hold for less than the shortest TTL, then end the hold one of three ways.
        if sleep_or_stop(Duration::from_millis(rng.random_range(0..=300)), &mut stop).await {
            return;
        }
        match rng.random_range(0..3) {
            0 => {
                gateway.release(&mut rng, session, &key).await;
                gateway.close(&mut rng, session).await;
            }
            1 => {
                gateway.revoke(&mut rng, session, &key, token).await;
                gateway.close(&mut rng, session).await;
                revoked_delayed = !rated_now;
            }
            // Let the session expire holding it.
            _ => {}
        }
    }
}
