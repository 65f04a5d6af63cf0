//! Wake-ups for long-polls: a waiting acquire wakes when its wait ends (`Effect::WaitEnded`), a
//! watch when its object changes (`Effect::ObjectChanged`), and every long-poll and event stream
//! of a token when that token is deleted (`Notifier::revoke`). An apply wakes only the requests
//! it concerns. The queue itself is replicated state; only these wake-ups live in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use permit_core::{Effect, EventKind, Key, SessionId, TokenId};
use tokio::sync::Notify;

/// Registered interests: the `Notify` of each key and how many requests share it.
type Interests<K> = Mutex<HashMap<K, (Arc<Notify>, usize)>>;

/// Wake-up registry of one node.
#[derive(Debug)]
pub struct Notifier {
    /// Waits, by (object, session).
    waits: Interests<(Key, SessionId)>,
    /// Watches, by object.
    watches: Interests<Key>,
    /// Long-polls and event streams, by the token they were opened with.
    tokens: Interests<TokenId>,
    /// Sessions whose registered waits the latest applies ended, oldest first, at most
    /// [`WOKEN_MAX`]: their requests are being answered, so their clients' next commands are on
    /// the way (the proposer waits a moment for them, see `raft/proposer.rs`).
    woken: Mutex<Vec<SessionId>>,
    /// Tokens of waiting takes that an apply served (`Effect::Taken`), for their long-polls: a
    /// take holds nothing in the state to read its token from. Only registered takes are kept,
    /// and each leaves with its registration.
    taken: Mutex<HashMap<(Key, SessionId), u64>>,
}

/// Most woken sessions kept for the proposer between two of its batches.
const WOKEN_MAX: usize = 64;

/// A registration for the end of one session's wait on one object. Dropping it unregisters.
pub(crate) type WaitSubscription = Subscription<(Key, SessionId)>;

/// A registration for changes of one object (a blocking read). Dropping it unregisters.
pub(crate) type WatchSubscription = Subscription<Key>;

/// A registration for the deletion of one token (a long-poll or stream it holds open).
/// Dropping it unregisters.
pub(crate) type RevocationSubscription = Subscription<TokenId>;

/// A registration in one of the [`Notifier`]'s registries. Dropping it unregisters.
pub(crate) struct Subscription<K: Registry> {
    notifier: Arc<Notifier>,
    key: K,
    notify: Arc<Notify>,
}

/// Which registry a key type lives in.
pub(crate) trait Registry: std::hash::Hash + Eq + Clone + Sized {
    /// The registry of this key type in `notifier`.
    fn interests(notifier: &Notifier) -> &Interests<Self>;

    /// Forgets what the notifier kept for `key` once nobody is registered for it.
    fn forget(_notifier: &Notifier, _key: &Self) {}
}

impl Registry for (Key, SessionId) {
    fn interests(notifier: &Notifier) -> &Interests<Self> {
        &notifier.waits
    }

    fn forget(notifier: &Notifier, key: &Self) {
        notifier.taken.lock().expect("notifier lock").remove(key);
    }
}

impl Registry for Key {
    fn interests(notifier: &Notifier) -> &Interests<Self> {
        &notifier.watches
    }
}

impl Registry for TokenId {
    fn interests(notifier: &Notifier) -> &Interests<Self> {
        &notifier.tokens
    }
}

impl Notifier {
    /// A registry with nothing registered.
    pub fn new() -> Arc<Notifier> {
        Arc::new(Notifier {
            waits: Mutex::new(HashMap::new()),
            watches: Mutex::new(HashMap::new()),
            tokens: Mutex::new(HashMap::new()),
            woken: Mutex::new(Vec::new()),
            taken: Mutex::new(HashMap::new()),
        })
    }

    /// Registers interest in the end of `session`'s wait on `key`.
    pub(crate) fn subscribe(self: &Arc<Notifier>, key: Key, session: SessionId) -> WaitSubscription {
        self.register((key, session))
    }

    /// Registers interest in changes of the object `key` (including its creation and deletion).
    pub(crate) fn watch(self: &Arc<Notifier>, key: Key) -> WatchSubscription {
        self.register(key)
    }

    /// Registers interest in the deletion of `token`.
    pub(crate) fn on_revocation(self: &Arc<Notifier>, token: TokenId) -> RevocationSubscription {
        self.register(token)
    }

    /// Wakes the long-polls and streams of tokens that an apply deleted.
    pub(crate) fn revoke(&self, deleted: &[TokenId]) {
        if deleted.is_empty() {
            return;
        }
        let tokens = self.tokens.lock().expect("notifier lock");
        for (notify, _) in deleted.iter().filter_map(|token| tokens.get(token)) {
            notify.notify_waiters();
        }
    }

    fn register<K: Registry>(self: &Arc<Notifier>, key: K) -> Subscription<K> {
        let mut interests = K::interests(self).lock().expect("notifier lock");
        let entry = interests.entry(key.clone()).or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Subscription { notifier: self.clone(), key, notify: entry.0.clone() }
    }

    /// Wakes whoever the effects of an apply concern.
    pub(crate) fn dispatch(&self, effects: &[Effect]) {
        // A worker whose ack is answered claims its next item right away: its session counts
        // as woken, so that its claim shares a write with the push that is on the way too.
        let acked = effects.iter().filter_map(|effect| match effect {
            Effect::Event(event) if event.kind == EventKind::Acked => event.session,
            _ => None,
        });
        {
            let mut woken = self.woken.lock().expect("notifier lock");
            for session in acked {
                if woken.len() < WOKEN_MAX {
                    woken.push(session);
                }
            }
        }
        {
            let waits = self.waits.lock().expect("notifier lock");
            let watches = self.watches.lock().expect("notifier lock");
            if !waits.is_empty() || !watches.is_empty() {
                let mut woken = self.woken.lock().expect("notifier lock");
                for effect in effects {
                    let interest = match effect {
                        Effect::WaitEnded { key, session } => {
                            let interest = waits.get(&(key.clone(), *session));
                            if interest.is_some() && woken.len() < WOKEN_MAX {
                                woken.push(*session);
                            }
                            interest
                        }
                        Effect::ObjectChanged { key } => watches.get(key),
                        Effect::Taken { key, taker, token } => {
                            let wait = (key.clone(), *taker);
                            if waits.contains_key(&wait) {
                                self.taken.lock().expect("notifier lock").insert(wait, *token);
                            }
                            None
                        }
                        _ => None,
                    };
                    if let Some((notify, _)) = interest {
                        notify.notify_waiters();
                    }
                }
            }
        }
    }

    /// The token of the registered take `taker` on `key`, once an apply served it.
    pub(crate) fn taken(&self, key: &Key, taker: SessionId) -> Option<u64> {
        self.taken.lock().expect("notifier lock").get(&(key.clone(), taker)).copied()
    }

    /// Moves the sessions whose waits ended since the last call into `into` (see
    /// [`Notifier::dispatch`]).
    pub(crate) fn take_woken(&self, into: &mut Vec<SessionId>) {
        into.append(&mut self.woken.lock().expect("notifier lock"));
    }

    /// Wakes every registered wait (the whole state was replaced by a snapshot).
    pub(crate) fn wake_all(&self) {
        for (notify, _) in self.waits.lock().expect("notifier lock").values() {
            notify.notify_waiters();
        }
        for (notify, _) in self.watches.lock().expect("notifier lock").values() {
            notify.notify_waiters();
        }
        // The snapshot may lack tokens the old state had: their holders check again.
        for (notify, _) in self.tokens.lock().expect("notifier lock").values() {
            notify.notify_waiters();
        }
    }
}

/// Why [`Subscription::wait`] ended without an answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unanswered {
    /// The deadline passed.
    Deadline,
    /// The server began to shut down.
    Shutdown,
}

impl<K: Registry> Subscription<K> {
    /// The `Notify` to wait on; enable the `notified()` future before checking the state.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }

    /// A long-poll's wait: runs `check` now and after every wake-up until it answers; an
    /// [`Unanswered`] once `deadline` passes or `shutdown` turns true first. The wake-up is armed
    /// before each check, so that an apply between the check and the wait is not missed.
    pub(crate) async fn wait<T>(
        &self,
        deadline: tokio::time::Instant,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
        mut check: impl FnMut() -> Option<T>,
    ) -> Result<T, Unanswered> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(answer) = check() {
                return Ok(answer);
            }
            tokio::select! {
                biased;
                () = &mut notified => {}
                () = tokio::time::sleep_until(deadline) => return Err(Unanswered::Deadline),
                _ = shutdown.wait_for(|stopping| *stopping) => return Err(Unanswered::Shutdown),
            }
        }
    }
}

impl<K: Registry> Drop for Subscription<K> {
    fn drop(&mut self) {
        let mut interests = K::interests(&self.notifier).lock().expect("notifier lock");
        if let Some(entry) = interests.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                interests.remove(&self.key);
                K::forget(&self.notifier, &self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use permit_core::Name;

    use super::*;

    /// Whether `future` is ready when polled once.
    fn ready(future: std::pin::Pin<&mut impl Future<Output = ()>>) -> bool {
        future.poll(&mut Context::from_waker(Waker::noop())) == Poll::Ready(())
    }

    #[test]
    fn a_watch_wakes_only_for_its_own_object_and_unregisters_when_dropped() {
        let notifier = Notifier::new();
        let (x, y) = (Key::semaphore(Name::new("x").unwrap()), Key::semaphore(Name::new("y").unwrap()));
        let watch = notifier.watch(x.clone());
        {
            let mut woken = pin!(watch.notify().notified());
            woken.as_mut().enable();
            notifier.dispatch(&[Effect::ObjectChanged { key: y.clone() }]);
            assert!(!ready(woken.as_mut()), "a change of y does not wake a watch of x");
            let session = SessionId::from_bytes([1; 16]);
            notifier.dispatch(&[Effect::WaitEnded { key: x.clone(), session }]);
            assert!(!ready(woken.as_mut()), "a wait ending is not a watch's business");
            notifier.dispatch(&[Effect::ObjectChanged { key: x.clone() }]);
            assert!(ready(woken.as_mut()));
        }
        let second = notifier.watch(x.clone());
        drop(watch);
        assert_eq!(notifier.watches.lock().unwrap().get(&x).map(|(_, n)| *n), Some(1));
        drop(second);
        assert!(notifier.watches.lock().unwrap().is_empty());
    }

    #[test]
    fn a_revocation_wakes_only_the_deleted_tokens_polls_and_a_snapshot_wakes_all() {
        let notifier = Notifier::new();
        let (deleted, kept) = (TokenId::from_bytes([1; 16]), TokenId::from_bytes([2; 16]));
        let (doomed, other) = (notifier.on_revocation(deleted), notifier.on_revocation(kept));
        {
            let mut woken = pin!(doomed.notify().notified());
            let mut spared = pin!(other.notify().notified());
            woken.as_mut().enable();
            spared.as_mut().enable();
            notifier.revoke(&[]);
            assert!(!ready(woken.as_mut()), "nothing deleted");
            notifier.dispatch(&[Effect::ObjectChanged { key: Key::semaphore(Name::new("x").unwrap()) }]);
            assert!(!ready(woken.as_mut()), "a change of an object is not a revocation");
            notifier.revoke(&[deleted]);
            assert!(ready(woken.as_mut()));
            assert!(!ready(spared.as_mut()), "another token's polls keep waiting");
            notifier.wake_all();
            assert!(ready(spared.as_mut()), "a snapshot may lack any token: every holder checks again");
        }
        drop((doomed, other));
        assert!(notifier.tokens.lock().unwrap().is_empty());
    }

    #[test]
    fn only_the_registered_waits_that_ended_are_handed_to_the_proposer_once() {
        let notifier = Notifier::new();
        let x = Key::semaphore(Name::new("x").unwrap());
        let (waiting, other) = (SessionId::from_bytes([1; 16]), SessionId::from_bytes([2; 16]));
        let _wait = notifier.subscribe(x.clone(), waiting);
        notifier.dispatch(&[
            Effect::WaitEnded { key: x.clone(), session: other },
            Effect::ObjectChanged { key: x.clone() },
            Effect::WaitEnded { key: x.clone(), session: waiting },
        ]);
        let mut woken = Vec::new();
        notifier.take_woken(&mut woken);
        assert_eq!(woken, vec![waiting], "a wait nobody here registered is not this node's client");
        notifier.take_woken(&mut woken);
        assert_eq!(woken, vec![waiting], "taken once");
        for _ in 0..2 * WOKEN_MAX {
            notifier.dispatch(&[Effect::WaitEnded { key: x.clone(), session: waiting }]);
        }
        woken.clear();
        notifier.take_woken(&mut woken);
        assert_eq!(woken.len(), WOKEN_MAX, "bounded when nobody takes them (a follower)");
    }
}
