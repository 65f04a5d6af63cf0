//! Wake-ups for long-polls: a waiting acquire wakes when its wait ends (`Effect::WaitEnded`), a
//! watch when its object changes (`Effect::ObjectChanged`). An apply wakes only the requests it
//! concerns. The queue itself is replicated state; only these wake-ups live in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use permit_core::{Effect, Key, SessionId};
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
}

/// A registration for the end of one session's wait on one object. Dropping it unregisters.
pub type WaitSubscription = Subscription<(Key, SessionId)>;

/// A registration for changes of one object (a blocking read). Dropping it unregisters.
pub type WatchSubscription = Subscription<Key>;

/// A registration in one of the [`Notifier`]'s registries. Dropping it unregisters.
pub struct Subscription<K: Registry> {
    notifier: Arc<Notifier>,
    key: K,
    notify: Arc<Notify>,
}

/// Which registry a key type lives in.
pub trait Registry: std::hash::Hash + Eq + Clone + Sized {
    /// The registry of this key type in `notifier`.
    fn interests(notifier: &Notifier) -> &Interests<Self>;
}

impl Registry for (Key, SessionId) {
    fn interests(notifier: &Notifier) -> &Interests<Self> {
        &notifier.waits
    }
}

impl Registry for Key {
    fn interests(notifier: &Notifier) -> &Interests<Self> {
        &notifier.watches
    }
}

impl Notifier {
    /// A registry with nothing registered.
    pub fn new() -> Arc<Notifier> {
        Arc::new(Notifier { waits: Mutex::new(HashMap::new()), watches: Mutex::new(HashMap::new()) })
    }

    /// Registers interest in the end of `session`'s wait on `key`.
    pub fn subscribe(self: &Arc<Notifier>, key: Key, session: SessionId) -> WaitSubscription {
        self.register((key, session))
    }

    /// Registers interest in changes of the object `key` (including its creation and deletion).
    pub fn watch(self: &Arc<Notifier>, key: Key) -> WatchSubscription {
        self.register(key)
    }

    fn register<K: Registry>(self: &Arc<Notifier>, key: K) -> Subscription<K> {
        let mut interests = K::interests(self).lock().expect("notifier lock");
        let entry = interests.entry(key.clone()).or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        Subscription { notifier: self.clone(), key, notify: entry.0.clone() }
    }

    /// Wakes whoever the effects of an apply concern.
    pub fn dispatch(&self, effects: &[Effect]) {
        {
            let waits = self.waits.lock().expect("notifier lock");
            let watches = self.watches.lock().expect("notifier lock");
            if !waits.is_empty() || !watches.is_empty() {
                for effect in effects {
                    let interest = match effect {
                        Effect::WaitEnded { key, session } => waits.get(&(key.clone(), *session)),
                        Effect::ObjectChanged { key } => watches.get(key),
                        _ => None,
                    };
                    if let Some((notify, _)) = interest {
                        notify.notify_waiters();
                    }
                }
            }
        }
    }

    /// Wakes every registered wait (the whole state was replaced by a snapshot).
    pub fn wake_all(&self) {
        for (notify, _) in self.waits.lock().expect("notifier lock").values() {
            notify.notify_waiters();
        }
        for (notify, _) in self.watches.lock().expect("notifier lock").values() {
            notify.notify_waiters();
        }
    }
}

impl<K: Registry> Subscription<K> {
    /// The `Notify` to wait on; enable the `notified()` future before checking the state.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl<K: Registry> Drop for Subscription<K> {
    fn drop(&mut self) {
        let mut interests = K::interests(&self.notifier).lock().expect("notifier lock");
        if let Some(entry) = interests.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                interests.remove(&self.key);
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
}
