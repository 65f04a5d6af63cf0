//! What the state machine's applies look like from outside: the event ring behind
//! `GET /v1/events`, and the per-object metrics kept up to date as entries apply.
//!
//! The core reports [`permit_core::Event`]s as effects of `apply`; the state machine adapter
//! (`raft/state_machine.rs`) hands each entry's effects here with the entry's log index and
//! leader time. Everything is updated incrementally, so a scrape costs O(series) and never walks
//! the state under the replica lock; a snapshot install rebuilds the gauges once. The semaphores
//! with series of their own also get a `History` of their last 15 minutes, by this node's clock.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use permit_core::{Effect, Event, EventKind, Key, Kind, Name, QueueCounts, SessionId, State};

use crate::fanout::Fanout;
use crate::history::{History, Second};
use crate::metrics::{ClockGauges, Labels, Metrics, ObjectCounts, ObjectGauges, QueueSeries};

/// Events kept for resuming streams (`Last-Event-ID`).
pub const EVENT_RING_LEN: usize = 10_000;

/// The label value under which objects past `--metrics-names-max` are summed.
pub(crate) const OVERFLOW_LABEL: &str = "_other";

/// One event as streamed: its number, the event, and its JSON, rendered when a stream first
/// sends it (most events are never streamed, so rendering each at apply time would be wasted
/// work on the apply path).
#[derive(Debug)]
pub(crate) struct Recorded {
    /// Its number on this node (the SSE `id`).
    pub(crate) seq: u64,
    /// The log index of the entry it came from.
    index: u64,
    /// The leader time of that entry.
    now_ms: u64,
    event: Box<Event>,
    json: OnceLock<String>,
}

impl Recorded {
    /// Its kind.
    pub(crate) fn kind(&self) -> EventKind {
        self.event.kind
    }

    /// The object, for object events.
    pub(crate) fn key(&self) -> Option<&Key> {
        self.event.key.as_ref()
    }

    /// The session's name, for session events (auth checks `session` read on it): `""` for a
    /// session without one, `None` for other events.
    pub(crate) fn session_name(&self) -> Option<&str> {
        self.event.kind.is_session().then(|| self.event.session_name.as_deref().unwrap_or(""))
    }

    /// The token that created the session, for session events of an owned session.
    pub(crate) fn session_owner(&self) -> Option<permit_core::TokenId> {
        self.event.session_owner
    }

    /// The `data:` line.
    pub(crate) fn json(&self) -> &str {
        self.json.get_or_init(|| render(self.seq, self.index, self.now_ms, &self.event))
    }
}

#[cfg(test)]
impl Recorded {
    /// An event as the ring would record it, for tests elsewhere in the crate.
    pub(crate) fn for_test(seq: u64, event: Event) -> Recorded {
        Recorded { seq, index: seq, now_ms: 0, event: Box::new(event), json: OnceLock::new() }
    }
}

/// The last [`EVENT_RING_LEN`] events, and the streams waiting for more, woken only for the
/// events they may see ([`Fanout`]).
#[derive(Default)]
pub(crate) struct EventRing {
    inner: Mutex<Ring>,
    /// The open streams, by what they may see.
    pub(crate) fanout: Arc<Fanout>,
}

#[derive(Default)]
struct Ring {
    events: VecDeque<Arc<Recorded>>,
    /// The seq the next event gets (seqs start at 1).
    next_seq: u64,
}

/// What a stream resuming after `last` gets.
pub(crate) struct Since {
    /// `Some((requested, first_available))` when events after `last` fell out of the ring.
    pub(crate) missed: Option<(u64, u64)>,
    /// The events to send, oldest first.
    pub(crate) events: Vec<Arc<Recorded>>,
}

impl EventRing {
    fn lock(&self) -> MutexGuard<'_, Ring> {
        self.inner.lock().expect("event ring lock poisoned")
    }

    /// The seq of the newest event (0 before the first).
    pub(crate) fn last_seq(&self) -> u64 {
        self.lock().next_seq.saturating_sub(1)
    }

    /// Events with a seq above `last`. With `check`, reports a gap when `last + 1` is no longer
    /// (or not yet, after a restart) in the ring.
    pub(crate) fn since(&self, last: u64, check: bool) -> Since {
        let ring = self.lock();
        let next = ring.next_seq.max(1);
        let first = ring.events.front().map_or(next, |event| event.seq);
        let requested = last.saturating_add(1);
        if check && (requested < first || requested > next) {
            return Since { missed: Some((requested, first)), events: ring.events.iter().cloned().collect() };
        }
        let skip = requested.saturating_sub(first) as usize;
        Since { missed: None, events: ring.events.iter().skip(skip).cloned().collect() }
    }

    /// Adds an event, then wakes the streams that may see it. Events are added (and streams
    /// woken) in seq order, by the one task that applies entries: [`crate::fanout::Inbox`]
    /// relies on it.
    fn push(&self, make: impl FnOnce(u64) -> Recorded) {
        let recorded = {
            let mut ring = self.lock();
            if ring.next_seq == 0 {
                ring.next_seq = 1;
            }
            let seq = ring.next_seq;
            ring.next_seq += 1;
            if ring.events.len() == EVENT_RING_LEN {
                ring.events.pop_front();
            }
            let recorded = Arc::new(make(seq));
            ring.events.push_back(recorded.clone());
            recorded
        };
        self.fanout.deliver(recorded.seq, &recorded.event);
    }
}

/// The label set of a queue's series: `queue="name"`.
fn queue_labels(name: &str) -> Labels {
    vec![("queue".to_owned(), name.to_owned())]
}

/// The label set of an object's series: `semaphore="name"` or `election="name"`.
fn object_labels(kind: Kind, name: &str) -> Labels {
    let label = match kind {
        Kind::Semaphore => "semaphore",
        Kind::Election => "election",
        Kind::Queue => "queue",
    };
    vec![(label.to_owned(), name.to_owned())]
}

/// What this node tracks of one object for its metrics.
struct Tracked {
    /// Its series' labels (its own, or the overflow label).
    labels: Labels,
    /// Its series' gauges, looked up once (a lookup hashes the labels).
    gauges: ObjectGauges,
    /// Its counting series, looked up on first use.
    counts: ObjectCounts,
    /// Its clock gauges (own series only), looked up at the first scrape.
    clock: Option<ClockGauges>,
    /// Whether it has a series of its own.
    own: bool,
    capacity: u64,
    /// Waiters by session: when they were queued (local clock, leader time).
    queued: HashMap<SessionId, (u64, Instant, u64)>,
    /// Waiters in queue order, by a local number.
    queue_order: BTreeMap<u64, Instant>,
    /// Since when (local clock) the current election leader leads.
    leader_since: Option<Instant>,
    /// Its last 15 minutes: semaphores with a series of their own only, so that the memory of
    /// all histories is bounded by `--metrics-names-max` rings.
    history: Option<History>,
}

/// Per-object bookkeeping for the metrics.
#[derive(Default)]
struct Tracker {
    objects: HashMap<Key, Tracked>,
    /// Queues, with their own budget of `names_max` series.
    queues: HashMap<Name, TrackedQueue>,
    /// Queues with a series of their own.
    own_queues: usize,
    /// Objects with a series of their own.
    own: usize,
    next_wait: u64,
    /// Waiters of overflow objects, in queue order (for the overflow's oldest waiter).
    overflow_queue: BTreeMap<u64, Instant>,
}

/// What this node tracks of one queue for its metrics.
struct TrackedQueue {
    /// Its series' labels (its own, or the overflow label).
    labels: Labels,
    /// Its series, looked up once.
    series: QueueSeries,
    /// Whether the series is its own.
    own: bool,
    /// Its counts as the gauges last took them in (an overflow series sums several queues, so
    /// the gauges move by differences).
    counts: QueueCounts,
    /// Since when, on this node's clock, the next item to be claimed has been in the queue.
    oldest_since: Option<Instant>,
}

/// The event ring and the incrementally kept metrics of one node.
pub struct Observer {
    /// Events for `GET /v1/events`.
    pub(crate) ring: EventRing,
    metrics: Arc<Metrics>,
    names_max: usize,
    tracker: Mutex<Tracker>,
    /// Second 0 of the histories' clock.
    epoch: Instant,
    /// The wall clock at `epoch` (ms since the Unix epoch): the histories' times are it plus
    /// the monotonic time since, so that they never move between two reads.
    epoch_wall_ms: u64,
}

impl Observer {
    /// An observer feeding `metrics`, with at most `names_max` objects per kind... in total
    /// having series of their own.
    pub fn new(metrics: Arc<Metrics>, names_max: usize) -> Observer {
        Observer {
            ring: EventRing::default(),
            metrics,
            names_max,
            tracker: Mutex::default(),
            epoch: Instant::now(),
            epoch_wall_ms: crate::history::wall_ms(),
        }
    }

    /// The current second of the histories' clock.
    fn second(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    fn tracker(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock().expect("metrics tracker lock poisoned")
    }

    /// Rebuilds the per-object gauges from `state` (a snapshot was installed or loaded): the one
    /// walk of the state, done at install time, never at scrape time.
    pub(crate) fn reset(&self, state: &State) {
        let mut tracker = self.tracker();
        let m = &self.metrics;
        self.forget_queues(&mut tracker);
        for tracked in tracker.objects.values() {
            m.forget_object(&tracked.labels);
        }
        // The histories outlive the install: what this node saw before it is still true.
        let mut histories: HashMap<Key, History> = tracker
            .objects
            .iter_mut()
            .filter_map(|(key, tracked)| Some((key.clone(), tracked.history.take()?)))
            .collect();
        *tracker = Tracker::default();
        let second = self.second();
        m.forget_object(&object_labels(Kind::Semaphore, OVERFLOW_LABEL));
        m.forget_object(&object_labels(Kind::Election, OVERFLOW_LABEL));
        m.reset_object_totals();
        let now = Instant::now();
        for kind in [Kind::Semaphore, Kind::Election] {
            for (key, object) in state.objects_after(kind, None) {
                self.track(&mut tracker, key, object.capacity);
                let tracked = tracker.objects.get_mut(key).expect("tracked above");
                let takers = state.policy(key).map_or(0, |policy| policy.takers.len());
                m.change_object(&tracked.gauges, |g| {
                    g.held.inc_by(object.held as i64);
                    g.holders.inc_by(object.holders.len() as i64);
                    g.waiters.inc_by((object.queue.len() - takers) as i64);
                });
                if key.kind == Kind::Election && !object.holders.is_empty() {
                    tracked.leader_since = Some(now);
                }
                if let Some(history) = &mut tracked.history {
                    if let Some(kept) = histories.remove(key) {
                        *history = kept;
                    }
                    history.set(second, object.held, object.capacity, object.queue.len() as u64);
                }
                let own = tracked.own;
                let policy = state.policy(key);
                if let Some(delayed) = policy.map(permit_core::Policy::delayed_permits).filter(|d| *d > 0) {
                    m.delayed_permits(&tracked.labels, delayed as i64);
                }
                // Waiting takes are not acquires: they have no `queued` event and no gauge.
                let waiters: Vec<SessionId> = object
                    .queue
                    .iter()
                    .map(|waiter| waiter.session)
                    .filter(|session| !policy.is_some_and(|policy| policy.takers.contains_key(session)))
                    .collect();
                for session in waiters {
                    tracker.next_wait += 1;
                    let seq = tracker.next_wait;
                    let tracked = tracker.objects.get_mut(key).expect("tracked above");
                    tracked.queued.insert(session, (seq, now, state.now_ms()));
                    tracked.queue_order.insert(seq, now);
                    if !own {
                        tracker.overflow_queue.insert(seq, now);
                    }
                }
            }
        }
        for (name, _) in state.queues_after(None) {
            self.track_queue(&mut tracker, state, name);
        }
        m.set_totals(state.session_count() as i64);
    }

    /// Starts tracking `key` (created with `capacity`) if it is not tracked yet.
    fn track(&self, tracker: &mut Tracker, key: &Key, capacity: u64) {
        if tracker.objects.contains_key(key) {
            return;
        }
        let own = tracker.own < self.names_max;
        let labels = if own {
            object_labels(key.kind, key.name.as_str())
        } else {
            object_labels(key.kind, OVERFLOW_LABEL)
        };
        if own {
            tracker.own += 1;
        }
        let gauges = self.metrics.object_series(key.kind, &labels);
        self.metrics.change_object(&gauges, |g| g.capacity.inc_by(capacity as i64));
        self.metrics.objects_gauge(key.kind).inc();
        let tracked = Tracked {
            labels,
            gauges,
            counts: ObjectCounts::default(),
            clock: None,
            own,
            capacity,
            queued: HashMap::new(),
            queue_order: BTreeMap::new(),
            leader_since: None,
            history: (own && key.kind == Kind::Semaphore)
                .then(|| History::new(self.second(), 0, capacity, 0)),
        };
        tracker.objects.insert(key.clone(), tracked);
    }

    /// Takes in the effects of the log entry at `index`, applied at leader time `now_ms`.
    pub(crate) fn on_entry(&self, index: u64, now_ms: u64, effects: &[Effect]) {
        let mut tracker = self.tracker();
        for effect in effects {
            match effect {
                Effect::Event(event) => {
                    self.count(&mut tracker, now_ms, event);
                    self.ring.push(|seq| Recorded {
                        seq,
                        index,
                        now_ms,
                        event: event.clone(),
                        json: OnceLock::new(),
                    });
                }
                Effect::TryAcquireRefused { key } => {
                    if let Some(tracked) = tracker.objects.get(key) {
                        self.metrics.try_acquire_refused(key.kind, &tracked.labels);
                    }
                }
                Effect::ObjectRemoved { key } if key.kind != Kind::Queue => self.untrack(&mut tracker, key),
                _ => {}
            }
        }
    }

    fn untrack(&self, tracker: &mut Tracker, key: &Key) {
        let Some(tracked) = tracker.objects.remove(key) else { return };
        self.metrics.objects_gauge(key.kind).dec();
        for (seq, _, _) in tracked.queued.values() {
            tracker.overflow_queue.remove(seq);
        }
        if tracked.own {
            tracker.own -= 1;
            self.metrics.forget_object(&tracked.labels);
        } else {
            // An idle object holds and waits for nothing: only its capacity is in the sum.
            self.metrics.change_object(&tracked.gauges, |g| g.capacity.dec_by(tracked.capacity as i64));
        }
    }

    /// Moves the metrics for one event.
    fn count(&self, tracker: &mut Tracker, now_ms: u64, event: &Event) {
        let m = &self.metrics;
        match event.kind {
            EventKind::SessionCreated => m.session_created(),
            EventKind::SessionExpired => m.session_ended(true),
            EventKind::SessionClosed => m.session_ended(false),
            _ => {}
        }
        let Some(key) = event.key.as_ref().filter(|key| key.kind != Kind::Queue) else { return };
        if event.kind == EventKind::CapacityChanged {
            let capacity = event.capacity.unwrap_or(0);
            if let Some(tracked) = tracker.objects.get_mut(key) {
                let delta = capacity as i64 - tracked.capacity as i64;
                tracked.capacity = capacity;
                if let Some(history) = &mut tracked.history {
                    history.capacity(self.second(), capacity);
                }
                m.change_object(&tracked.gauges, |g| g.capacity.inc_by(delta));
            } else {
                self.track(tracker, key, capacity);
            }
            return;
        }
        if !tracker.objects.contains_key(key) {
            // An election or semaphore created by this event's acquire.
            self.track(tracker, key, if key.kind == Kind::Election { 1 } else { 0 });
        }
        let Tracker { objects, overflow_queue, next_wait, .. } = tracker;
        let tracked = objects.get_mut(key).expect("tracked above");
        let labels = &tracked.labels;
        let permits = event.permits.unwrap_or(0) as i64;
        let session = event.session;
        let second = self.second();
        let end_wait = |tracked: &mut Tracked, overflow_queue: &mut BTreeMap<u64, Instant>| {
            let waited = session.and_then(|session| tracked.queued.remove(&session));
            if let Some((seq, _, _)) = waited {
                tracked.queue_order.remove(&seq);
                overflow_queue.remove(&seq);
                m.change_object(&tracked.gauges, |g| g.waiters.dec());
                if let Some(history) = &mut tracked.history {
                    history.waiters(second, -1);
                }
            }
            waited.map(|(_, _, queued_ms)| queued_ms)
        };
        match event.kind {
            EventKind::Queued => {
                *next_wait += 1;
                let now = Instant::now();
                if let Some(session) = session {
                    tracked.queued.insert(session, (*next_wait, now, now_ms));
                    tracked.queue_order.insert(*next_wait, now);
                    if !tracked.own {
                        overflow_queue.insert(*next_wait, now);
                    }
                }
                m.change_object(&tracked.gauges, |g| g.waiters.inc());
                if let Some(history) = &mut tracked.history {
                    history.waiters(second, 1);
                }
            }
            EventKind::Granted => {
                let queued_ms = end_wait(tracked, overflow_queue);
                if let Some(history) = &mut tracked.history {
                    history.held(second, permits);
                    history.granted(second);
                }
                m.change_object(&tracked.gauges, |g| {
                    g.held.inc_by(permits);
                    g.holders.inc();
                });
                let waited_ms = queued_ms.map_or(0, |queued| now_ms.saturating_sub(queued));
                m.granted(key.kind, &tracked.labels, &mut tracked.counts, waited_ms as f64 / 1000.0);
            }
            EventKind::WaitEnded => {
                end_wait(tracked, overflow_queue);
            }
            EventKind::Released | EventKind::Expired | EventKind::Revoked => {
                if let Some(history) = &mut tracked.history {
                    history.held(second, -permits);
                }
                m.change_object(&tracked.gauges, |g| {
                    g.held.dec_by(permits);
                    g.holders.dec();
                });
                let held = event.held_ms.unwrap_or(0) as f64 / 1000.0;
                m.hold_ended(key.kind, &tracked.labels, &mut tracked.counts, event.kind, held);
                if event.delay_ms.is_some() {
                    m.delayed_permits(&tracked.labels, permits);
                }
            }
            EventKind::DelayEnded => m.delayed_permits(&tracked.labels, -permits),
            EventKind::Taken => m.take_answered(&tracked.labels, &mut tracked.counts, true),
            EventKind::RateLimited => m.take_answered(&tracked.labels, &mut tracked.counts, false),
            EventKind::LeaderChanged => {
                tracked.leader_since = session.map(|_| Instant::now());
                m.leader_changed(labels);
            }
            _ => {}
        }
    }

    /// Takes in the queues that the log entry just applied to `state` changed (its effects):
    /// their gauges move to the queues' counts, and queue events count. O(queues changed) gauge
    /// updates: `state` is the same for every effect, so a run of events of one queue (a push
    /// of 1000 items, or a log replayed at start) updates its gauges once and counts its events
    /// of one kind with one increment.
    pub(crate) fn on_queues(&self, state: &State, effects: &[Effect]) {
        let mut tracker = self.tracker();
        // The queue whose gauges were last brought to `state` (still tracked since), and the
        // events counted but not yet added: their queue, kind and number.
        let mut tracked_last: Option<&Name> = None;
        let mut uncounted: Option<(&Name, EventKind, u64)> = None;
        for effect in effects {
            match effect {
                Effect::ObjectChanged { key } if key.kind == Kind::Queue => {
                    self.track_queue(&mut tracker, state, &key.name);
                    tracked_last = Some(&key.name);
                }
                Effect::ObjectRemoved { key } if key.kind == Kind::Queue => {
                    self.count_queue_events(&tracker, uncounted.take());
                    self.untrack_queue(&mut tracker, &key.name);
                    tracked_last = None;
                }
                Effect::Event(event) => {
                    let Some(key) = event.key.as_ref().filter(|key| key.kind == Kind::Queue) else {
                        continue;
                    };
                    if tracked_last != Some(&key.name) {
                        self.track_queue(&mut tracker, state, &key.name);
                        tracked_last = Some(&key.name);
                    }
                    let Some(tracked) = tracker.queues.get(&key.name) else { continue };
                    let seconds = match event.kind {
                        EventKind::Claimed => event.waited_ms,
                        EventKind::Acked => event.held_ms,
                        _ => None,
                    };
                    if let Some(ms) = seconds {
                        tracked.series.observe(event.kind, ms as f64 / 1000.0);
                    }
                    match &mut uncounted {
                        Some((name, kind, n)) if *name == &key.name && *kind == event.kind => *n += 1,
                        _ => self.count_queue_events(&tracker, uncounted.replace((&key.name, event.kind, 1))),
                    }
                }
                _ => {}
            }
        }
        self.count_queue_events(&tracker, uncounted);
    }

    /// Adds `n` events of `kind` to the queue's counter, if it is tracked.
    fn count_queue_events(&self, tracker: &Tracker, uncounted: Option<(&Name, EventKind, u64)>) {
        let Some((name, kind, n)) = uncounted else { return };
        if let Some(tracked) = tracker.queues.get(name) {
            tracked.series.count(kind, n);
        }
    }

    fn track_queue(&self, tracker: &mut Tracker, state: &State, name: &Name) {
        let Some(queue) = state.queue(name) else { return };
        if !tracker.queues.contains_key(name) {
            let own = tracker.own_queues < self.names_max;
            tracker.own_queues += usize::from(own);
            let labels = queue_labels(if own { name.as_str() } else { OVERFLOW_LABEL });
            let series = self.metrics.queue_series(&labels);
            self.metrics.gauges.queues.inc();
            let tracked =
                TrackedQueue { labels, series, own, counts: QueueCounts::default(), oldest_since: None };
            tracker.queues.insert(name.clone(), tracked);
        }
        let tracked = tracker.queues.get_mut(name).expect("tracked above");
        let counts = queue.counts();
        let before = [tracked.counts.pending, tracked.counts.delayed, tracked.counts.claimed];
        let after = [counts.pending, counts.delayed, counts.claimed];
        for ((gauge, before), after) in tracked.series.items.iter().zip(before).zip(after) {
            gauge.inc_by(after as i64 - before as i64);
        }
        tracked.series.claimers.inc_by(counts.claimers as i64 - tracked.counts.claimers as i64);
        tracked.counts = counts;
        let age_ms = queue.first_pending().map(|item| state.now_ms().saturating_sub(item.entered_ms));
        tracked.oldest_since = age_ms
            .map(|ms| Instant::now().checked_sub(Duration::from_millis(ms)).unwrap_or_else(Instant::now));
    }

    fn untrack_queue(&self, tracker: &mut Tracker, name: &Name) {
        let Some(tracked) = tracker.queues.remove(name) else { return };
        self.metrics.gauges.queues.dec();
        if tracked.own {
            tracker.own_queues -= 1;
            self.metrics.forget_queue(&tracked.labels);
        } else {
            let before = [tracked.counts.pending, tracked.counts.delayed, tracked.counts.claimed];
            for (gauge, before) in tracked.series.items.iter().zip(before) {
                gauge.dec_by(before as i64);
            }
            tracked.series.claimers.dec_by(tracked.counts.claimers as i64);
        }
    }

    /// Drops every queue series (the first half of [`Observer::reset`]).
    fn forget_queues(&self, tracker: &mut Tracker) {
        let names: Vec<Name> = tracker.queues.keys().cloned().collect();
        for name in &names {
            self.untrack_queue(tracker, name);
        }
        self.metrics.forget_queue(&queue_labels(OVERFLOW_LABEL));
    }

    /// Refreshes the gauges that depend on the clock (oldest waiter, leader tenure): O(series).
    pub(crate) fn refresh(&self) {
        let mut tracker = self.tracker();
        let now = Instant::now();
        let mut overflow_oldest: Option<f64> = None;
        for tracked in tracker.queues.values() {
            let oldest = tracked.oldest_since.map_or(0.0, |since| (now - since).as_secs_f64());
            if tracked.own {
                self.metrics.queue_oldest_pending(&tracked.labels, oldest);
            } else {
                overflow_oldest = Some(overflow_oldest.unwrap_or(0.0).max(oldest));
            }
        }
        if let Some(oldest) = overflow_oldest {
            self.metrics.queue_oldest_pending(&queue_labels(OVERFLOW_LABEL), oldest);
        }
        let mut overflow_has = [false, false];
        for (key, tracked) in &mut tracker.objects {
            if !tracked.own {
                overflow_has[usize::from(key.kind == Kind::Election)] = true;
                continue;
            }
            let oldest =
                tracked.queue_order.values().next().map_or(0.0, |since| (now - *since).as_secs_f64());
            let tenure = tracked.leader_since.map(|since| (now - since).as_secs_f64());
            let clock =
                tracked.clock.get_or_insert_with(|| self.metrics.clock_series(key.kind, &tracked.labels));
            clock.set(oldest, tenure);
        }
        let oldest = tracker.overflow_queue.values().next().map_or(0.0, |since| (now - *since).as_secs_f64());
        for (i, kind) in [Kind::Semaphore, Kind::Election].into_iter().enumerate() {
            if overflow_has[i] {
                self.metrics.clock_series(kind, &object_labels(kind, OVERFLOW_LABEL)).set(oldest, None);
            }
        }
    }

    /// Sets the policy gauges (what each rate grants now, what each group holds) of the
    /// semaphores with a policy and a series of their own, from `state` at leader time `now_ms`:
    /// O(semaphores with a policy).
    pub(crate) fn refresh_policies(&self, state: &State, now_ms: u64) {
        let tracker = self.tracker();
        let gauges = state
            .policies()
            .filter_map(|(key, policy)| {
                let tracked = tracker.objects.get(key).filter(|tracked| tracked.own)?;
                let available = policy.rate_state(now_ms).map(|(available, _)| available);
                let groups = policy.groups_held().map(|(group, held)| (group.to_string(), held)).collect();
                Some((tracked.labels.clone(), available, groups))
            })
            .collect();
        self.metrics.set_policy_gauges(gauges);
    }

    /// Counts a waiting acquire or campaign on `key` whose long-poll ended still queued.
    pub(crate) fn acquire_timed_out(&self, key: &Key) {
        if let Some(tracked) = self.tracker().objects.get(key) {
            self.metrics.acquire_timed_out(key.kind, &tracked.labels);
        }
    }

    /// How long `session` has waited on `key`, by this node's clock (since it applied the
    /// entry that queued it, or since it loaded a snapshot that held the waiter).
    pub(crate) fn waited(&self, key: &Key, session: SessionId) -> Option<Duration> {
        let tracker = self.tracker();
        tracker.objects.get(key)?.queued.get(&session).map(|(_, since, _)| since.elapsed())
    }

    /// How long the oldest waiter of `key` has waited, as [`Observer::waited`] counts.
    pub(crate) fn oldest_wait(&self, key: &Key) -> Option<Duration> {
        let tracker = self.tracker();
        tracker.objects.get(key)?.queue_order.values().next().map(Instant::elapsed)
    }

    /// The history of semaphore `key` ([`History`]), oldest first, each second with its start
    /// in ms since the Unix epoch (by this node's wall clock when it started, plus its monotonic
    /// clock since), and that clock now. The history is `None` when this node keeps none for
    /// it (it is past `--metrics-names-max`, or unknown here).
    pub(crate) fn history(&self, key: &Key) -> (Option<Vec<(u64, Second)>>, u64) {
        let mut tracker = self.tracker();
        let since_epoch = self.epoch.elapsed();
        let now_ms =
            self.epoch_wall_ms.saturating_add(u64::try_from(since_epoch.as_millis()).unwrap_or(u64::MAX));
        let Some(history) = tracker.objects.get_mut(key).and_then(|tracked| tracked.history.as_mut()) else {
            return (None, now_ms);
        };
        history.advance(since_epoch.as_secs());
        let samples = history.samples().map(|(s, values)| (self.epoch_wall_ms + s * 1000, values)).collect();
        (Some(samples), now_ms)
    }
}

/// The JSON of one event, as the stream sends it. Fields are in alphabetical order, absent
/// ones left out.
fn render(seq: u64, index: u64, now_ms: u64, event: &Event) -> String {
    /// Serialized as its hex text (the id as every route spells it).
    struct Hex(SessionId);

    impl serde::Serialize for Hex {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.collect_str(&self.0)
        }
    }

    #[derive(serde::Serialize)]
    struct Json<'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        attempt: Option<u32>,
        #[serde(skip_serializing_if = "Option::is_none")]
        capacity: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        dead_letter: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        delay_ms: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a str>,
        index: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        item: Option<String>,
        kind: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
        now_ms: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        object_kind: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        permits: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<&'static str>,
        seq: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        session: Option<Hex>,
        #[serde(skip_serializing_if = "Option::is_none")]
        session_name: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        token: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<&'a str>,
    }

    let json = Json {
        attempt: event.attempt,
        capacity: event.capacity,
        dead_letter: event.dead_letter.as_ref().map(|name| name.as_str()),
        delay_ms: event.delay_ms,
        error: event.error.as_deref(),
        index,
        item: event.item.map(|id| id.to_string()),
        kind: event.kind.as_str(),
        name: event.key.as_ref().map(|key| key.name.as_str()),
        now_ms,
        object_kind: event.key.as_ref().map(|key| match key.kind {
            Kind::Semaphore => "semaphore",
            Kind::Election => "election",
            Kind::Queue => "queue",
        }),
        permits: event.permits,
        reason: event.reason.map(|reason| reason.as_str()),
        seq,
        session: event.session.map(Hex),
        session_name: event.session_name.as_deref(),
        token: event.token,
        value: event.value.as_deref(),
    };
    serde_json::to_string(&json).expect("an event serializes")
}

#[cfg(test)]
mod tests {
    use permit_core::{Name, WaitEndReason};

    use super::*;

    /// The rendering before it was typed: a JSON object built field by field.
    fn by_map(seq: u64, index: u64, now_ms: u64, event: &Event) -> serde_json::Value {
        let mut data = serde_json::Map::new();
        data.insert("seq".into(), seq.into());
        data.insert("index".into(), index.into());
        data.insert("now_ms".into(), now_ms.into());
        data.insert("kind".into(), event.kind.as_str().into());
        if let Some(key) = &event.key {
            let kind = if key.kind == Kind::Semaphore { "semaphore" } else { "election" };
            data.insert("object_kind".into(), kind.into());
            data.insert("name".into(), key.name.as_str().into());
        }
        if let Some(session) = event.session {
            data.insert("session".into(), session.to_string().into());
        }
        if let Some(name) = &event.session_name {
            data.insert("session_name".into(), name.as_str().into());
        }
        for (field, value) in
            [("permits", event.permits), ("token", event.token), ("capacity", event.capacity)]
        {
            if let Some(value) = value {
                data.insert(field.into(), value.into());
            }
        }
        if let Some(value) = &event.value {
            data.insert("value".into(), value.as_str().into());
        }
        if let Some(reason) = event.reason {
            data.insert("reason".into(), reason.as_str().into());
        }
        serde_json::Value::Object(data)
    }

    #[test]
    fn events_render_as_they_did_field_by_field() {
        let key = |kind, name: &str| Some(Key { kind, name: Name::new(name).expect("a valid name") });
        let session = "00112233445566778899aabbccddeeff".parse::<SessionId>().expect("an id");
        let mut events = Vec::new();
        for kind in EventKind::ALL {
            events.push(Event::new(kind));
            events.push(Event {
                key: key(Kind::Semaphore, "db-pool.main_1"),
                session: Some(session),
                session_name: Some("worker \"1\"\n\u{e9}".into()),
                permits: Some(3),
                token: Some(u64::MAX),
                capacity: Some(0),
                value: Some("{\"leader\":true}".into()),
                reason: Some(WaitEndReason::SessionEnded),
                held_ms: Some(12),
                from_queue: true,
                ..Event::new(kind)
            });
            events.push(Event { key: key(Kind::Election, "scheduler"), ..Event::new(kind) });
        }
        for (i, event) in events.iter().enumerate() {
            let rendered = render(i as u64 + 1, 1_000 + i as u64, 5_000, event);
            let parsed: serde_json::Value = serde_json::from_str(&rendered).expect("valid JSON");
            assert_eq!(parsed, by_map(i as u64 + 1, 1_000 + i as u64, 5_000, event), "{rendered}");
            // Keys in alphabetical order, as the map rendered them.
            assert_eq!(rendered, parsed.to_string());
        }
    }

    #[test]
    fn histories_follow_the_events_of_the_semaphores_under_the_cap_only() {
        let observer = Observer::new(Arc::new(Metrics::new()), 1);
        let key = |name: &str| Key::semaphore(Name::new(name).expect("a valid name"));
        let one = "00000000000000000000000000000001".parse::<SessionId>().expect("an id");
        let two = "00000000000000000000000000000002".parse::<SessionId>().expect("an id");
        let event = |kind, name: &str, session: SessionId, permits: Option<u64>, capacity: Option<u64>| {
            Effect::Event(Box::new(Event {
                key: Some(key(name)),
                session: Some(session),
                permits,
                capacity,
                ..Event::new(kind)
            }))
        };
        observer.on_entry(
            1,
            0,
            &[
                event(EventKind::CapacityChanged, "kept", one, None, Some(3)),
                event(EventKind::CapacityChanged, "past-cap", one, None, Some(3)),
            ],
        );
        observer.on_entry(
            2,
            0,
            &[
                event(EventKind::Granted, "kept", one, Some(2), None),
                event(EventKind::Queued, "kept", two, Some(2), None),
                event(EventKind::Granted, "past-cap", one, Some(1), None),
            ],
        );
        let last = |name: &str| {
            let (samples, _) = observer.history(&key(name));
            samples.map(|samples| {
                let grants: u32 = samples.iter().map(|(_, s)| s.grants).sum();
                let last = samples.last().expect("a sample").1;
                (last.held, last.capacity, last.waiters, grants)
            })
        };
        assert_eq!(last("kept"), Some((2, 3, 1, 1)));
        observer.on_entry(
            3,
            0,
            &[
                event(EventKind::Released, "kept", one, Some(2), None),
                event(EventKind::Granted, "kept", two, Some(2), None),
            ],
        );
        assert_eq!(last("kept"), Some((2, 3, 0, 2)));
        assert_eq!(last("past-cap"), None, "no history past the cap");
        observer.on_entry(4, 0, &[Effect::ObjectRemoved { key: key("kept") }]);
        assert_eq!(last("kept"), None, "a deleted semaphore's ring is dropped");
        let (none, now_ms) = observer.history(&key("unknown"));
        assert!(none.is_none() && now_ms > 0);
    }

    #[test]
    fn a_recorded_event_renders_once_and_answers_the_filters() {
        let event = Event { session_name: None, ..Event::new(EventKind::SessionCreated) };
        let recorded =
            Recorded { seq: 7, index: 9, now_ms: 11, event: Box::new(event), json: OnceLock::new() };
        assert_eq!(recorded.session_name(), Some(""));
        assert!(recorded.key().is_none());
        let first: *const str = recorded.json();
        assert!(std::ptr::eq(first, recorded.json()), "rendered once");
        assert!(recorded.json().contains("\"seq\":7"));
    }
}
