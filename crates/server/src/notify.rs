//! Wake-ups for long-polls: a waiting acquire wakes when its wait ends, a watch when anything is
//! applied. The queue itself is replicated state; only these wake-ups live in memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use permit_core::{Effect, Key, SessionId};
use tokio::sync::{watch, Notify};

/// Registered waits: the `Notify` of each (object, session) and how many requests share it.
type Waits = HashMap<(Key, SessionId), (Arc<Notify>, usize)>;

/// Wake-up registry of one node.
#[derive(Debug)]
pub struct Notifier {
    waits: Mutex<Waits>,
    applied: watch::Sender<u64>,
}

/// A registration for the end of one session's wait on one object. Dropping it unregisters.
pub struct WaitSubscription {
    notifier: Arc<Notifier>,
    key: (Key, SessionId),
    notify: Arc<Notify>,
}

impl Notifier {
    /// A registry with nothing registered.
    pub fn new(applied_index: u64) -> Arc<Notifier> {
        Arc::new(Notifier { waits: Mutex::new(HashMap::new()), applied: watch::channel(applied_index).0 })
    }

    /// Registers interest in the end of `session`'s wait on `key`.
    pub fn subscribe(self: &Arc<Notifier>, key: Key, session: SessionId) -> WaitSubscription {
        let mut waits = self.waits.lock().expect("notifier lock");
        let entry = waits.entry((key.clone(), session)).or_insert_with(|| (Arc::new(Notify::new()), 0));
        entry.1 += 1;
        WaitSubscription { notifier: self.clone(), key: (key, session), notify: entry.0.clone() }
    }

    /// Wakes whoever the effects of an apply concern, then announces the applied index.
    pub fn dispatch(&self, effects: &[Effect], applied_index: u64) {
        {
            let waits = self.waits.lock().expect("notifier lock");
            if !waits.is_empty() {
                for effect in effects {
                    if let Effect::WaitEnded { key, session } = effect {
                        if let Some((notify, _)) = waits.get(&(key.clone(), *session)) {
                            notify.notify_waiters();
                        }
                    }
                }
            }
        }
        self.applied.send_replace(applied_index);
    }

    /// Wakes every registered wait (the whole state was replaced by a snapshot).
    pub fn wake_all(&self, applied_index: u64) {
        for (notify, _) in self.waits.lock().expect("notifier lock").values() {
            notify.notify_waiters();
        }
        self.applied.send_replace(applied_index);
    }

    /// A receiver of the applied index, for blocking reads.
    pub fn applied(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }
}

impl WaitSubscription {
    /// The `Notify` to wait on; enable the `notified()` future before checking the state.
    pub fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for WaitSubscription {
    fn drop(&mut self) {
        let mut waits = self.notifier.waits.lock().expect("notifier lock");
        if let Some(entry) = waits.get_mut(&self.key) {
            entry.1 -= 1;
            if entry.1 == 0 {
                waits.remove(&self.key);
            }
        }
    }
}
