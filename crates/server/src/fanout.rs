//! Who is woken for an event: the event streams of `GET /v1/events` that may be sent it, and
//! no other. Streams are indexed by what they may see, so that a write costs nothing per stream
//! that cannot see its events (1,000 idle streams of a token that may read nothing made every
//! write cost 3.6× the CPU when each apply woke every stream to filter the event itself).
//!
//! A stream registers a [`Sight`]: the (event kind, resource, name prefix) triples whose events
//! it may be sent, and, for session events of its own token's sessions, (event kind, token).
//! [`Fanout::deliver`] looks up each event under the prefixes of its name that some stream
//! registered (one lookup per distinct registered prefix length, not per stream) and under its
//! session's owner, and wakes the [`Inbox`] of each stream found. A stream then reads the ring
//! itself and filters again (the index may find a stream whose other filters refuse the event:
//! it is a superset, never a subset, of the streams that may be sent it).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use permit_core::{Event, EventKind, Resource, TokenId};
use tokio::sync::Notify;

/// Where one stream is woken.
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    /// Woken (one stored permit) when an event it may see was added to the ring.
    pub(crate) notify: Notify,
    /// The seq of the first such event since the stream last took this (0: none). The
    /// publisher adds events in seq order, so this is the smallest such seq: the stream may
    /// skip every event before it, which it could not have been sent.
    first_unread: AtomicU64,
    /// How many times it was woken (for tests and the curious).
    wakeups: AtomicU64,
}

impl Inbox {
    /// Takes the seq of the first event this stream may see since the last call (0: none).
    pub(crate) fn take_first_unread(&self) -> u64 {
        self.first_unread.swap(0, Ordering::AcqRel)
    }

    /// How many times the stream was woken for an event.
    #[cfg(test)]
    pub(crate) fn wakeups(&self) -> u64 {
        self.wakeups.load(Ordering::Relaxed)
    }

    fn wake(&self, seq: u64) {
        let _ = self.first_unread.compare_exchange(0, seq, Ordering::AcqRel, Ordering::Acquire);
        self.wakeups.fetch_add(1, Ordering::Relaxed);
        self.notify.notify_one();
    }
}

/// What one stream may be sent (see the module docs).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Sight {
    /// Events of this kind about this resource (semaphore, election, or session by its name)
    /// whose name starts with this prefix.
    pub(crate) prefixes: Vec<(EventKind, Resource, String)>,
    /// Session events of this kind about sessions this token created.
    pub(crate) owned: Vec<(EventKind, TokenId)>,
}

/// Streams registered under one (kind, resource).
#[derive(Default)]
struct Table {
    by_prefix: HashMap<Box<str>, HashMap<u64, Arc<Inbox>>>,
    /// Registered prefix lengths, with how many registrations use each.
    lengths: BTreeMap<usize, usize>,
}

#[derive(Default)]
struct Index {
    next_id: u64,
    tables: HashMap<(EventKind, Resource), Table>,
    owned: HashMap<(EventKind, TokenId), HashMap<u64, Arc<Inbox>>>,
}

/// The index of every open stream by what it may see.
#[derive(Default)]
pub(crate) struct Fanout {
    index: Mutex<Index>,
}

/// One stream's registration; dropping it unregisters.
pub(crate) struct Subscription {
    fanout: Arc<Fanout>,
    id: u64,
    sight: Sight,
    inbox: Arc<Inbox>,
}

impl Subscription {
    /// Where the stream is woken.
    pub(crate) fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }
}

/// The resource and name an event is filed under: its object, or its session's name.
fn filed_under(event: &Event) -> (Resource, &str) {
    match &event.key {
        Some(key) => (crate::auth::resource_of(key.kind), key.name.as_str()),
        None => (Resource::Session, event.session_name.as_deref().unwrap_or("")),
    }
}

impl Fanout {
    fn lock(&self) -> MutexGuard<'_, Index> {
        self.index.lock().expect("fan-out index lock poisoned")
    }

    /// Registers a stream that may see `sight`.
    pub(crate) fn subscribe(self: &Arc<Fanout>, sight: Sight) -> Subscription {
        let inbox = Arc::new(Inbox::default());
        let mut index = self.lock();
        index.next_id += 1;
        let id = index.next_id;
        for (kind, resource, prefix) in &sight.prefixes {
            let table = index.tables.entry((*kind, *resource)).or_default();
            table.by_prefix.entry(prefix.as_str().into()).or_default().insert(id, inbox.clone());
            *table.lengths.entry(prefix.len()).or_default() += 1;
        }
        for key in &sight.owned {
            index.owned.entry(*key).or_default().insert(id, inbox.clone());
        }
        drop(index);
        Subscription { fanout: self.clone(), id, sight, inbox }
    }

    /// Wakes the streams that may see `event`, numbered `seq`. Costs one lookup per distinct
    /// prefix length registered for its kind and resource (and one for its session's owner),
    /// plus one per stream woken; nothing per stream that may not see it.
    pub(crate) fn deliver(&self, seq: u64, event: &Event) {
        let index = self.lock();
        let (resource, name) = filed_under(event);
        if let Some(table) = index.tables.get(&(event.kind, resource)) {
            for &length in table.lengths.range(..=name.len()).map(|(length, _)| length) {
                let Some(prefix) = name.get(..length) else { continue };
                for inbox in table.by_prefix.get(prefix).into_iter().flat_map(HashMap::values) {
                    inbox.wake(seq);
                }
            }
        }
        if let Some(owner) = event.session_owner.filter(|_| event.kind.is_session()) {
            for inbox in index.owned.get(&(event.kind, owner)).into_iter().flat_map(HashMap::values) {
                inbox.wake(seq);
            }
        }
    }

    /// Open registrations.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let index = self.lock();
        let mut ids: std::collections::HashSet<u64> = index
            .tables
            .values()
            .flat_map(|t| t.by_prefix.values().flat_map(|streams| streams.keys().copied()))
            .collect();
        ids.extend(index.owned.values().flat_map(|streams| streams.keys().copied()));
        ids.len()
    }

    /// Whether no stream is registered.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut index = self.fanout.lock();
        for (kind, resource, prefix) in &self.sight.prefixes {
            let Some(table) = index.tables.get_mut(&(*kind, *resource)) else { continue };
            if let Some(streams) = table.by_prefix.get_mut(prefix.as_str()) {
                streams.remove(&self.id);
                if streams.is_empty() {
                    table.by_prefix.remove(prefix.as_str());
                }
            }
            if let Some(count) = table.lengths.get_mut(&prefix.len()) {
                *count -= 1;
                if *count == 0 {
                    table.lengths.remove(&prefix.len());
                }
            }
            if table.by_prefix.is_empty() {
                index.tables.remove(&(*kind, *resource));
            }
        }
        for key in &self.sight.owned {
            if let Some(streams) = index.owned.get_mut(key) {
                streams.remove(&self.id);
                if streams.is_empty() {
                    index.owned.remove(key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use permit_core::{Key, Kind, Name, SessionId};

    use super::*;

    fn object_event(kind: EventKind, object: Kind, name: &str) -> Event {
        let name = Name::new(name).expect("a valid name");
        Event { key: Some(Key { kind: object, name }), ..Event::new(kind) }
    }

    fn session_event(kind: EventKind, name: Option<&str>, owner: Option<TokenId>) -> Event {
        Event {
            session: Some(SessionId::from_bytes([1; 16])),
            session_name: name.map(str::to_owned),
            session_owner: owner,
            ..Event::new(kind)
        }
    }

    #[test]
    fn only_the_streams_that_may_see_an_event_are_woken() {
        let fanout = Arc::new(Fanout::default());
        let (tenant, other) = (TokenId::from_bytes([1; 16]), TokenId::from_bytes([2; 16]));
        // A thousand streams that may see only `b.` semaphores' grants and their own sessions.
        let blind: Vec<Subscription> = (0..1000)
            .map(|_| {
                fanout.subscribe(Sight {
                    prefixes: vec![(EventKind::Granted, Resource::Semaphore, "b.".into())],
                    owned: vec![(EventKind::SessionCreated, other)],
                })
            })
            .collect();
        let a_reader = fanout.subscribe(Sight {
            prefixes: vec![
                (EventKind::Granted, Resource::Semaphore, "a.".into()),
                (EventKind::Granted, Resource::Semaphore, "a.x".into()),
            ],
            owned: vec![(EventKind::SessionCreated, tenant)],
        });
        let everything = fanout.subscribe(Sight {
            prefixes: EventKind::ALL
                .iter()
                .flat_map(|kind| {
                    [Resource::Semaphore, Resource::Election, Resource::Session]
                        .map(|resource| (*kind, resource, String::new()))
                })
                .collect(),
            owned: Vec::new(),
        });
        assert_eq!(fanout.len(), 1002);

        let events = [
            object_event(EventKind::Granted, Kind::Semaphore, "a.x"),
            object_event(EventKind::Granted, Kind::Semaphore, "a.y"),
            object_event(EventKind::Released, Kind::Semaphore, "b.x"),
            object_event(EventKind::Granted, Kind::Election, "b.x"),
            object_event(EventKind::Granted, Kind::Semaphore, "bb"),
            session_event(EventKind::SessionCreated, Some("b.worker"), Some(tenant)),
            session_event(EventKind::SessionClosed, None, Some(other)),
        ];
        for (seq, event) in (1..).zip(&events) {
            fanout.deliver(seq, event);
        }
        for stream in &blind {
            assert_eq!(stream.inbox().wakeups(), 0, "a stream that may see none of them is never woken");
            assert_eq!(stream.inbox().take_first_unread(), 0);
        }
        // a.x matches both of its prefixes; a.y one; its own session's creation.
        assert_eq!(a_reader.inbox().wakeups(), 4);
        assert_eq!(a_reader.inbox().take_first_unread(), 1, "the first event it may see");
        assert_eq!(a_reader.inbox().take_first_unread(), 0, "taken once");
        assert_eq!(everything.inbox().wakeups(), events.len() as u64);

        // The blind streams see their own: one event, one wake-up each.
        fanout.deliver(8, &object_event(EventKind::Granted, Kind::Semaphore, "b.y"));
        assert!(blind.iter().all(|stream| stream.inbox().wakeups() == 1));
        assert!(blind.iter().all(|stream| stream.inbox().take_first_unread() == 8));

        drop(blind);
        drop(a_reader);
        assert_eq!(fanout.len(), 1);
        drop(everything);
        assert!(fanout.is_empty());
        assert!(fanout.lock().tables.is_empty() && fanout.lock().owned.is_empty(), "nothing left behind");
    }
}
