//! Work queues: items handed out in `seq` order, each claimed by one session at a time. A claim
//! is a lease bound to its session: when the session ends, its claimed items are pending again.

use std::collections::VecDeque;
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};
use serde::{Deserialize, Serialize};

use crate::{Name, SessionId};

/// Claims of one item before it moves to the dead-letter queue, unless the queue says otherwise.
pub const QUEUE_MAX_ATTEMPTS_DEFAULT: u32 = 5;
/// Items a queue holds, unless it says otherwise.
pub const QUEUE_MAX_ITEMS_DEFAULT: u64 = 1_000_000;
/// Suffix of a queue's default dead-letter queue: `jobs` sends its dead items to `jobs.dead`.
pub const DEAD_LETTER_SUFFIX: &str = ".dead";

/// One queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    /// Claims of one item before it is dead-lettered.
    pub max_attempts: u32,
    /// Where items go after `max_attempts` claims without an ack; `None` for a dead-letter queue
    /// made on the fly (items stay there for people to look at, whatever their attempts) and
    /// for a queue whose name is too long for the default `{name}.dead`.
    pub dead_letter: Option<Name>,
    /// Most items (in any state) the queue holds; pushes beyond it are refused.
    pub max_items: u64,
    /// Log index of the entry that created the queue.
    pub created_index: u64,
    /// Log index of the queue's last change.
    pub modified_index: u64,
    /// The `seq` of the next item to enter the queue.
    pub next_seq: u64,
    /// Items by id.
    pub(crate) items: OrdMap<u64, Arc<Item>>,
    /// Derived: pending items, `(seq, id)`, in claim order.
    pub(crate) ready: OrdSet<(u64, u64)>,
    /// Derived: delayed items, `(due_ms, seq, id)`.
    pub(crate) delayed: OrdSet<(u64, u64, u64)>,
    /// Derived: claimed items by claiming session.
    pub(crate) claimed: OrdMap<SessionId, OrdSet<u64>>,
    /// Derived: deduplication keys of the items that carry one.
    pub(crate) keys: OrdMap<String, u64>,
    /// Sessions blocked in a claim, in arrival order.
    pub(crate) claimers: VecDeque<Claimer>,
}

/// An item's JSON text, shared, not copied, by the push that carries it, the item it becomes
/// and the claims that hand it out: a pending item's payload is in memory once although the
/// Raft log keeps its push entry until a purge (the log store's entry and the state's item hold
/// the same allocation). An `Arc<String>`, not an `Arc<str>`, so that the text's allocation is
/// exactly its length (the count sits in a small allocation of its own). Encoded as the string
/// it holds: log records and snapshots are the bytes a `String` gives.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Payload(Arc<String>);

impl Payload {
    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether `self` and `other` are the same allocation (not just the same text).
    pub fn shares(&self, other: &Payload) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::ops::Deref for Payload {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<String> for Payload {
    fn from(text: String) -> Payload {
        Payload(Arc::new(text))
    }
}

impl From<&str> for Payload {
    fn from(text: &str) -> Payload {
        Payload(Arc::new(text.to_owned()))
    }
}

impl From<Payload> for String {
    fn from(payload: Payload) -> String {
        Arc::unwrap_or_clone(payload.0)
    }
}

impl PartialEq<str> for Payload {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Payload {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Payload {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Payload, D::Error> {
        String::deserialize(deserializer).map(Payload::from)
    }
}

/// One item in a queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// Its place in its queue.
    pub seq: u64,
    /// The JSON text pushed.
    pub payload: Payload,
    /// Claims of this item so far (in this queue and any it was dead-lettered from).
    pub attempt: u32,
    /// Its deduplication key, if it was pushed with one (dropped when dead-lettered).
    pub key: Option<String>,
    /// Leader time at which it entered this queue.
    pub entered_ms: u64,
    /// Why its last claim ended without an ack.
    pub last_error: Option<String>,
    /// Where it stands.
    pub state: ItemState,
}

/// Where an item stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ItemState {
    /// Due: the next claims take it in `seq` order.
    Pending,
    /// Out of claims until leader time reaches `until_ms`.
    Delayed {
        /// When it becomes due.
        until_ms: u64,
    },
    /// Claimed by a live session.
    Claimed(Claim),
}

/// A claim of one item: a lease that lasts as long as its session, or until acked or nacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The claiming session.
    pub session: SessionId,
    /// The claim's fencing token.
    pub token: u64,
    /// The claim request that took it ([`crate::Command::Claim`]'s `request`).
    pub request: u64,
    /// Leader time of the claim.
    pub claimed_at_ms: u64,
}

/// A session blocked in a claim, waiting for items.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claimer {
    /// The session.
    pub session: SessionId,
    /// The claim request (chosen by the client or the server; unique per session).
    pub request: u64,
    /// Most items to hand it.
    pub max: u32,
    /// Leader time after which it takes nothing more (its `wait_ms` passed).
    pub until_ms: u64,
}

/// A queue's counts, for reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueCounts {
    /// Pending items.
    pub pending: u64,
    /// Delayed items.
    pub delayed: u64,
    /// Claimed items.
    pub claimed: u64,
    /// Blocked claimers.
    pub claimers: u64,
}

impl Queue {
    /// An empty queue created at log `index`.
    pub(crate) fn new(index: u64, max_attempts: u32, dead_letter: Option<Name>, max_items: u64) -> Queue {
        Queue {
            max_attempts,
            dead_letter,
            max_items,
            created_index: index,
            modified_index: index,
            next_seq: 1,
            items: OrdMap::new(),
            ready: OrdSet::new(),
            delayed: OrdSet::new(),
            claimed: OrdMap::new(),
            keys: OrdMap::new(),
            claimers: VecDeque::new(),
        }
    }

    /// The item with this id.
    pub fn item(&self, id: u64) -> Option<&Item> {
        self.items.get(&id).map(|item| &**item)
    }

    /// Every item, by id.
    pub fn items(&self) -> impl Iterator<Item = (u64, &Item)> {
        self.items.iter().map(|(id, item)| (*id, &**item))
    }

    /// Number of items in any state.
    pub fn len(&self) -> u64 {
        self.items.len() as u64
    }

    /// Whether the queue holds no item.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Pending items in claim order, from the first after `after_seq`: `(seq, id)`.
    pub fn pending_after(&self, after_seq: u64) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ready.range((after_seq.saturating_add(1), 0)..).copied()
    }

    /// The first pending item: the next a claim takes.
    pub fn first_pending(&self) -> Option<&Item> {
        self.ready.get_min().and_then(|(_, id)| self.item(*id))
    }

    /// The items `session` has claimed here.
    pub fn claimed_by(&self, session: SessionId) -> impl Iterator<Item = (u64, &Item)> {
        self.claimed.get(&session).into_iter().flatten().filter_map(|id| Some((*id, self.item(*id)?)))
    }

    /// The blocked claimers, in arrival order.
    pub fn claimers(&self) -> impl ExactSizeIterator<Item = &Claimer> {
        self.claimers.iter()
    }

    /// The queue's counts.
    pub fn counts(&self) -> QueueCounts {
        let claimed: usize = self.claimed.values().map(OrdSet::len).sum();
        QueueCounts {
            pending: self.ready.len() as u64,
            delayed: self.delayed.len() as u64,
            claimed: claimed as u64,
            claimers: self.claimers.len() as u64,
        }
    }

    /// The earliest time a delayed item becomes due.
    pub fn next_due_ms(&self) -> Option<u64> {
        self.delayed.get_min().map(|(due, _, _)| *due)
    }

    /// Adds `item` with id `id`, indexing it by its state. The caller checked the id is free.
    pub(crate) fn insert(&mut self, id: u64, item: Item) {
        self.index(id, &item);
        let previous = self.items.insert(id, Arc::new(item));
        assert!(previous.is_none(), "item {id} inserted twice");
    }

    /// Removes the item `id` and its index entries.
    pub(crate) fn remove(&mut self, id: u64) -> Option<Item> {
        let item = self.items.remove(&id)?;
        self.unindex(id, &item);
        Some(Arc::unwrap_or_clone(item))
    }

    /// Replaces the state of item `id` (re-indexing it), and returns the item as it is now.
    pub(crate) fn set_state(&mut self, id: u64, state: ItemState) -> &Item {
        let mut item = self.items.remove(&id).expect("the item exists");
        self.unindex(id, &item);
        Arc::make_mut(&mut item).state = state;
        self.index(id, &item);
        self.items.insert(id, item);
        self.item(id).expect("just inserted")
    }

    /// Changes item `id` in place outside its state (attempt, error).
    pub(crate) fn item_mut(&mut self, id: u64) -> Option<&mut Item> {
        self.items.get_mut(&id).map(Arc::make_mut)
    }

    fn index(&mut self, id: u64, item: &Item) {
        match item.state {
            ItemState::Pending => {
                self.ready.insert((item.seq, id));
            }
            ItemState::Delayed { until_ms } => {
                self.delayed.insert((until_ms, item.seq, id));
            }
            ItemState::Claimed(claim) => {
                self.claimed.entry(claim.session).or_default().insert(id);
            }
        }
        if let Some(key) = &item.key {
            self.keys.insert(key.clone(), id);
        }
    }

    fn unindex(&mut self, id: u64, item: &Item) {
        match item.state {
            ItemState::Pending => {
                self.ready.remove(&(item.seq, id));
            }
            ItemState::Delayed { until_ms } => {
                self.delayed.remove(&(until_ms, item.seq, id));
            }
            ItemState::Claimed(claim) => {
                let claims = self.claimed.get_mut(&claim.session).expect("a claim is indexed");
                claims.remove(&id);
                if claims.is_empty() {
                    self.claimed.remove(&claim.session);
                }
            }
        }
        if let Some(key) = &item.key {
            self.keys.remove(key);
        }
    }

    /// Rebuilds the derived indexes from `items` (after decoding a snapshot).
    pub(crate) fn reindex(&mut self) {
        self.ready = OrdSet::new();
        self.delayed = OrdSet::new();
        self.claimed = OrdMap::new();
        self.keys = OrdMap::new();
        let items: Vec<(u64, Arc<Item>)> = self.items.iter().map(|(id, item)| (*id, item.clone())).collect();
        for (id, item) in items {
            self.index(id, &item);
        }
    }

    /// Whether any item or claimer is here.
    pub(crate) fn is_idle(&self) -> bool {
        self.items.is_empty() && self.claimers.is_empty()
    }
}

/// A queue as a snapshot stores it: the settings, the items and the claimers; the indexes are
/// derived again when it is decoded.
#[derive(Serialize, Deserialize)]
pub(crate) struct QueueRecord {
    pub(crate) max_attempts: u32,
    pub(crate) dead_letter: Option<Name>,
    pub(crate) max_items: u64,
    pub(crate) created_index: u64,
    pub(crate) modified_index: u64,
    pub(crate) next_seq: u64,
    pub(crate) items: Vec<(u64, Item)>,
    pub(crate) claimers: Vec<Claimer>,
}

impl QueueRecord {
    #[cfg(test)]
    pub(crate) fn of(queue: &Queue) -> QueueRecord {
        QueueRecord {
            max_attempts: queue.max_attempts,
            dead_letter: queue.dead_letter.clone(),
            max_items: queue.max_items,
            created_index: queue.created_index,
            modified_index: queue.modified_index,
            next_seq: queue.next_seq,
            items: queue.items.iter().map(|(id, item)| (*id, (**item).clone())).collect(),
            claimers: queue.claimers.iter().copied().collect(),
        }
    }

    pub(crate) fn into_queue(self) -> Queue {
        let mut queue = Queue::new(self.created_index, self.max_attempts, self.dead_letter, self.max_items);
        queue.modified_index = self.modified_index;
        queue.next_seq = self.next_seq;
        queue.items = self.items.into_iter().map(|(id, item)| (id, Arc::new(item))).collect();
        queue.claimers = self.claimers.into_iter().collect();
        queue.reindex();
        queue
    }
}

/// Settings of a `PutQueue`: each `None` keeps the queue's value (or takes the default when the
/// queue is new).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueSettings {
    /// Claims of one item before it is dead-lettered: 1..=[`QUEUE_MAX_ATTEMPTS_MAX`].
    pub max_attempts: Option<u32>,
    /// The dead-letter queue; default `{name}.dead`.
    pub dead_letter: Option<Name>,
    /// Most items the queue holds: 1..=[`QUEUE_ITEMS_MAX`].
    pub max_items: Option<u64>,
}

/// One item of a [`crate::Command::Push`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewItem {
    /// The JSON text (checked by the server; the state machine stores it as it is).
    pub payload: Payload,
    /// Keep it out of claims for this long after the push: 0..=[`QUEUE_DELAY_MS_MAX`].
    pub delay_ms: u64,
    /// Deduplication key: 1..=[`QUEUE_ITEM_KEY_BYTES_MAX`] bytes.
    pub key: Option<String>,
}

/// One item of a push's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushedItem {
    /// The item's id.
    pub id: u64,
    /// Its place in the queue.
    pub seq: u64,
    /// An item with the same key was there: it is this one, and nothing was added.
    pub duplicate: bool,
}

/// One item of a claim's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimedItem {
    /// The item's id.
    pub id: u64,
    /// Its place in the queue.
    pub seq: u64,
    /// Claims so far, this one included.
    pub attempt: u32,
    /// The claim's fencing token.
    pub token: u64,
    /// The payload.
    pub payload: Payload,
}

/// Where a nack sent an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Settled {
    /// Pending again, in its `seq` place.
    Pending,
    /// Delayed, then pending in its `seq` place.
    Delayed,
    /// Moved to the dead-letter queue: it was claimed `max_attempts` times.
    Dead,
}

use crate::command::Creator;
use crate::limits::*;
use crate::outcome::{Effect, Event, EventKind, Field, Limit, Outcome, Refusal};
use crate::state::{emit, State};
use crate::Key;

/// Checks a queue's settings; `name` is the queue's (for the default dead-letter queue).
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming the field.
pub fn validate_queue_settings(name: &Name, settings: &QueueSettings) -> Result<(), Refusal> {
    if let Some(max_attempts) = settings.max_attempts {
        if !(1..=QUEUE_MAX_ATTEMPTS_MAX).contains(&max_attempts) {
            return Err(invalid(Field::MaxAttempts, format!("must be 1..={QUEUE_MAX_ATTEMPTS_MAX}")));
        }
    }
    if let Some(max_items) = settings.max_items {
        if !(1..=QUEUE_ITEMS_MAX).contains(&max_items) {
            return Err(invalid(Field::MaxItems, format!("must be 1..={QUEUE_ITEMS_MAX}")));
        }
    }
    if settings.dead_letter.as_ref() == Some(name) {
        return Err(invalid(Field::DeadLetter, "must not be the queue itself".into()));
    }
    Ok(())
}

/// `{name}.dead`, when that is a valid name (at most [`NAME_BYTES_MAX`] bytes).
fn default_dead_letter(name: &Name) -> Option<Name> {
    Name::new(format!("{name}{DEAD_LETTER_SUFFIX}")).ok()
}

/// Checks the items of a push.
///
/// # Errors
/// [`Refusal::PayloadTooLarge`], or [`Refusal::InvalidArgument`] naming the field.
pub fn validate_push(items: &[NewItem]) -> Result<(), Refusal> {
    if !(1..=QUEUE_PUSH_ITEMS_MAX).contains(&items.len()) {
        return Err(invalid(Field::Items, format!("a push carries 1..={QUEUE_PUSH_ITEMS_MAX} items")));
    }
    for item in items {
        if item.payload.len() > QUEUE_PAYLOAD_BYTES_MAX {
            return Err(Refusal::PayloadTooLarge { bytes: item.payload.len() as u64 });
        }
        if item.payload.is_empty() {
            return Err(invalid(Field::Payload, "must be a JSON value".into()));
        }
        if item.delay_ms > QUEUE_DELAY_MS_MAX {
            return Err(invalid(Field::DelayMs, format!("must be 0..={QUEUE_DELAY_MS_MAX}")));
        }
        if let Some(key) = &item.key {
            if key.is_empty() || key.len() > QUEUE_ITEM_KEY_BYTES_MAX {
                return Err(invalid(Field::ItemKey, format!("must be 1..={QUEUE_ITEM_KEY_BYTES_MAX} bytes")));
            }
        }
    }
    Ok(())
}

/// Checks a claim's `max` and `wait_ms`.
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming the field.
pub fn validate_claim(max: u32, wait_ms: u64) -> Result<(), Refusal> {
    if !(1..=QUEUE_CLAIM_ITEMS_MAX).contains(&max) {
        return Err(invalid(Field::Max, format!("must be 1..={QUEUE_CLAIM_ITEMS_MAX}")));
    }
    if wait_ms > QUEUE_DELAY_MS_MAX {
        return Err(invalid(Field::WaitMs, format!("must be 0..={QUEUE_DELAY_MS_MAX}")));
    }
    Ok(())
}

/// Checks a nack's `delay_ms` and `error`.
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming the field.
pub fn validate_nack(delay_ms: u64, error: Option<&str>) -> Result<(), Refusal> {
    if delay_ms > QUEUE_DELAY_MS_MAX {
        return Err(invalid(Field::DelayMs, format!("must be 0..={QUEUE_DELAY_MS_MAX}")));
    }
    if error.is_some_and(|error| error.len() > QUEUE_ERROR_BYTES_MAX) {
        return Err(invalid(Field::Error, format!("must be at most {QUEUE_ERROR_BYTES_MAX} bytes")));
    }
    Ok(())
}

fn invalid(field: Field, reason: String) -> Refusal {
    Refusal::InvalidArgument { field, reason }
}

/// Why a claimed item stops being claimed without an ack.
enum Unclaim<'a> {
    /// Its claimer nacked it.
    Nack { delay_ms: u64, error: Option<&'a str> },
    /// Its claimer's session ended.
    SessionEnded,
}

/// The queue operations of the state machine.
impl State {
    /// The queue called `name`.
    pub fn queue(&self, name: &Name) -> Option<&Queue> {
        self.queues.get(name).map(|queue| &**queue)
    }

    /// Queues in name order, from the first after `after`.
    pub fn queues_after<'a>(
        &'a self,
        after: Option<&Name>,
    ) -> impl Iterator<Item = (&'a Name, &'a Queue)> + 'a {
        let range = match after {
            Some(after) => {
                self.queues.range((std::ops::Bound::Excluded(after.clone()), std::ops::Bound::Unbounded))
            }
            None => self.queues.range::<_, Name>(..),
        };
        range.map(|(name, queue)| (name, &**queue))
    }

    /// Number of queues.
    pub fn queue_count(&self) -> usize {
        self.queues.len()
    }

    /// Items in all queues.
    pub fn queued_items(&self) -> u64 {
        self.queued_items
    }

    /// The earliest leader time at which a delayed item becomes due.
    pub fn next_item_due_ms(&self) -> Option<u64> {
        self.items_due.first().map(|(due, _, _)| *due)
    }

    /// The queues in which `session` has claims or blocked claims.
    pub fn session_queues(&self, session: SessionId) -> impl Iterator<Item = &Name> {
        self.queue_sessions.get(&session).into_iter().flatten()
    }

    /// The items `session` holds from claim `request` on `queue`, in `seq` order, and whether
    /// that claim still waits for more.
    pub fn claim_status(&self, queue: &Name, session: SessionId, request: u64) -> (Vec<ClaimedItem>, bool) {
        let Some(queue) = self.queue(queue) else { return (Vec::new(), false) };
        let mut items: Vec<ClaimedItem> = queue
            .claimed_by(session)
            .filter_map(|(id, item)| match item.state {
                ItemState::Claimed(claim) if claim.request == request => Some(ClaimedItem {
                    id,
                    seq: item.seq,
                    attempt: item.attempt,
                    token: claim.token,
                    payload: item.payload.clone(),
                }),
                _ => None,
            })
            .collect();
        items.sort_by_key(|item| item.seq);
        let waiting = queue.claimers.iter().any(|c| c.session == session && c.request == request);
        (items, waiting)
    }

    /// Adds a decoded queue's items and claims to the state's derived indexes.
    pub(crate) fn index_queue(&mut self, name: &Name, queue: &Queue) {
        self.queued_items += queue.len();
        for (until_ms, _, id) in &queue.delayed {
            self.items_due.insert((*until_ms, name.clone(), *id));
        }
        let sessions =
            queue.claimed.keys().copied().chain(queue.claimers.iter().map(|claimer| claimer.session));
        for session in sessions {
            self.queue_sessions.entry(session).or_default().insert(name.clone());
        }
    }

    fn queue_mut(&mut self, name: &Name) -> Option<&mut Queue> {
        self.queues.get_mut(name).map(Arc::make_mut)
    }

    pub(crate) fn put_queue(
        &mut self,
        index: u64,
        name: &Name,
        settings: &QueueSettings,
        creator: Option<&Creator>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_queue_settings(name, settings)?;
        let Some(queue) = self.queue_mut(name) else {
            self.create_queue(index, name, settings, default_dead_letter(name), creator, effects)?;
            return Ok(Outcome::QueuePut { created: true });
        };
        if let Some(max_attempts) = settings.max_attempts {
            queue.max_attempts = max_attempts;
        }
        if let Some(dead_letter) = &settings.dead_letter {
            queue.dead_letter = Some(dead_letter.clone());
        }
        if let Some(max_items) = settings.max_items {
            queue.max_items = max_items;
        }
        queue.modified_index = index;
        effects.push(Effect::ObjectChanged { key: Key::queue(name.clone()) });
        Ok(Outcome::QueuePut { created: false })
    }

    /// Creates the queue `name`; its dead-letter queue is the settings' if they name one, else
    /// `default_dead_letter`.
    fn create_queue(
        &mut self,
        index: u64,
        name: &Name,
        settings: &QueueSettings,
        default_dead_letter: Option<Name>,
        creator: Option<&Creator>,
        effects: &mut Vec<Effect>,
    ) -> Result<(), Refusal> {
        validate_queue_settings(name, settings)?;
        if self.queues.len() >= QUEUES_MAX {
            return Err(Refusal::LimitExceeded(Limit::Queues));
        }
        self.check_creator(creator)?;
        let dead_letter = settings.dead_letter.clone().or(default_dead_letter);
        let queue = Queue::new(
            index,
            settings.max_attempts.unwrap_or(QUEUE_MAX_ATTEMPTS_DEFAULT),
            dead_letter,
            settings.max_items.unwrap_or(QUEUE_MAX_ITEMS_DEFAULT),
        );
        self.queues.insert(name.clone(), Arc::new(queue));
        let key = Key::queue(name.clone());
        self.record_creator(&key, creator);
        effects.push(Effect::ObjectChanged { key });
        Ok(())
    }

    pub(crate) fn delete_queue(
        &mut self,
        name: &Name,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        self.queue(name).ok_or(Refusal::QueueNotFound)?;
        self.prune_claimers(name, effects);
        let queue = self.queue(name).expect("checked above");
        if !queue.is_idle() {
            return Err(Refusal::QueueBusy);
        }
        self.queues.remove(name);
        let key = Key::queue(name.clone());
        self.forget_creator(&key);
        effects.push(Effect::ObjectRemoved { key: key.clone() });
        effects.push(Effect::ObjectChanged { key });
        Ok(Outcome::QueueDeleted)
    }

    pub(crate) fn push(
        &mut self,
        index: u64,
        name: &Name,
        items: &[NewItem],
        creator: Option<&Creator>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_push(items)?;
        if self.queue(name).is_none() {
            self.create_queue(
                index,
                name,
                &QueueSettings::default(),
                default_dead_letter(name),
                creator,
                effects,
            )?;
        }
        let queue = self.queue(name).expect("exists or created above");
        // All or nothing: count the items that are not duplicates first.
        let mut keys = std::collections::BTreeSet::new();
        let fresh = items
            .iter()
            .filter(|item| match &item.key {
                Some(key) => !queue.keys.contains_key(key) && keys.insert(key.as_str()),
                None => true,
            })
            .count() as u64;
        if queue.len() + fresh > queue.max_items {
            return Err(Refusal::QueueFull { max_items: queue.max_items });
        }
        if self.queued_items + fresh > ITEMS_MAX {
            return Err(Refusal::LimitExceeded(Limit::Items));
        }
        let now_ms = self.now_ms;
        let mut pushed = Vec::with_capacity(items.len());
        for new in items {
            let queue = self.queue(name).expect("exists");
            if let Some(id) = new.key.as_ref().and_then(|key| queue.keys.get(key)) {
                let seq = queue.item(*id).expect("a key names an item").seq;
                pushed.push(PushedItem { id: *id, seq, duplicate: true });
                continue;
            }
            self.last_item += 1;
            let id = self.last_item;
            let queue = self.queue_mut(name).expect("exists");
            let seq = queue.next_seq;
            queue.next_seq += 1;
            let state = match new.delay_ms {
                0 => ItemState::Pending,
                delay_ms => ItemState::Delayed { until_ms: now_ms.saturating_add(delay_ms) },
            };
            let item = Item {
                seq,
                payload: new.payload.clone(),
                attempt: 0,
                key: new.key.clone(),
                entered_ms: now_ms,
                last_error: None,
                state,
            };
            self.insert_item(name, id, item);
            pushed.push(PushedItem { id, seq, duplicate: false });
            let mut event = queue_event(EventKind::Pushed, name, id);
            event.delay_ms = (new.delay_ms > 0).then_some(new.delay_ms);
            emit(effects, event);
        }
        self.touch_queue(index, name, effects);
        self.pump_queue(index, name, effects);
        Ok(Outcome::Pushed { items: pushed })
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn claim(
        &mut self,
        index: u64,
        name: &Name,
        session: SessionId,
        request: u64,
        max: u32,
        wait_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_claim(max, wait_ms)?;
        if !self.sessions.contains_key(&session) {
            return Err(Refusal::SessionNotFound);
        }
        let queue = self.queue(name).ok_or(Refusal::QueueNotFound)?;
        // A retry of a claim that was answered, or still waits, gets that claim again; with
        // `wait_ms` 0 it waits no more (a claim with 0 never waits).
        let (items, waiting) = self.claim_status(name, session, request);
        if waiting && wait_ms == 0 {
            self.cancel_claim(index, name, session, request, effects)?;
            return Ok(Outcome::Claimed { items });
        }
        if waiting {
            return Ok(Outcome::ClaimWaiting);
        }
        if !items.is_empty() {
            return Ok(Outcome::Claimed { items });
        }
        let held = queue.claimed.get(&session).map_or(0, OrdSet::len);
        if held + max as usize > CLAIMS_PER_SESSION_MAX {
            return Err(Refusal::LimitExceeded(Limit::ClaimsPerSession));
        }
        self.promote_due(name);
        self.prune_claimers(name, effects);
        // Claimers that came first are served first.
        self.pump_queue(index, name, effects);
        let queue = self.queue(name).expect("checked above");
        if !queue.ready.is_empty() {
            let items = self.hand_out(index, name, session, request, max, effects);
            return Ok(Outcome::Claimed { items });
        }
        if wait_ms == 0 {
            return Ok(Outcome::Claimed { items: Vec::new() });
        }
        if queue.claimers.len() >= WAITERS_PER_OBJECT_MAX {
            return Err(Refusal::LimitExceeded(Limit::WaitersPerObject));
        }
        let until_ms = self.now_ms.saturating_add(wait_ms);
        let queue = self.queue_mut(name).expect("checked above");
        queue.claimers.push_back(Claimer { session, request, max, until_ms });
        self.sync_queue_session(name, session);
        self.touch_queue(index, name, effects);
        Ok(Outcome::ClaimWaiting)
    }

    pub(crate) fn cancel_claim(
        &mut self,
        index: u64,
        name: &Name,
        session: SessionId,
        request: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let queue = self.queue(name).ok_or(Refusal::QueueNotFound)?;
        let Some(at) = queue.claimers.iter().position(|c| c.session == session && c.request == request)
        else {
            return Ok(Outcome::ClaimCancelled);
        };
        self.queue_mut(name).expect("exists").claimers.remove(at);
        effects.push(Effect::WaitEnded { key: Key::queue(name.clone()), session });
        self.sync_queue_session(name, session);
        self.touch_queue(index, name, effects);
        Ok(Outcome::ClaimCancelled)
    }

    /// The claim of item `id` that `session` and `token` name, or `ClaimLost`.
    fn owned_claim(&self, name: &Name, id: u64, session: SessionId, token: u64) -> Result<Claim, Refusal> {
        let queue = self.queue(name).ok_or(Refusal::QueueNotFound)?;
        match queue.item(id).map(|item| &item.state) {
            Some(ItemState::Claimed(claim)) if claim.session == session && claim.token == token => Ok(*claim),
            _ => Err(Refusal::ClaimLost),
        }
    }

    pub(crate) fn ack(
        &mut self,
        index: u64,
        name: &Name,
        id: u64,
        session: SessionId,
        token: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let claim = self.owned_claim(name, id, session, token)?;
        let item = self.remove_item(name, id);
        self.sync_queue_session(name, session);
        let mut event = queue_event(EventKind::Acked, name, id);
        event.session = Some(session);
        event.session_name = self.session_name(session);
        event.token = Some(token);
        event.attempt = Some(item.attempt);
        event.held_ms = Some(self.now_ms.saturating_sub(claim.claimed_at_ms));
        emit(effects, event);
        self.touch_queue(index, name, effects);
        Ok(Outcome::Acked)
    }

    /// An ack, then a claim by the same session, checked as one: a refusal of either changes
    /// nothing. A retry of one that was applied (its claim took items, or still waits) answers
    /// that claim again.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn ack_and_claim(
        &mut self,
        index: u64,
        name: &Name,
        id: u64,
        session: SessionId,
        token: u64,
        request: u64,
        max: u32,
        wait_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_claim(max, wait_ms)?;
        let (items, waiting) = self.claim_status(name, session, request);
        if items.iter().any(|item| item.id == id) {
            return Err(invalid(
                Field::RequestId,
                "names the claim of the item acked: the next claim needs its own".into(),
            ));
        }
        if waiting || !items.is_empty() {
            return self.claim(index, name, session, request, max, wait_ms, effects);
        }
        self.owned_claim(name, id, session, token)?;
        // The claim's own refusals, as they will stand once the ack has freed one of the
        // session's claims: after the ack nothing may refuse it.
        let queue = self.queue(name).expect("an owned claim's queue exists");
        let held = queue.claimed.get(&session).map_or(0, OrdSet::len);
        if held.saturating_sub(1) + max as usize > CLAIMS_PER_SESSION_MAX {
            return Err(Refusal::LimitExceeded(Limit::ClaimsPerSession));
        }
        if wait_ms > 0 && queue.claimers.len() >= WAITERS_PER_OBJECT_MAX {
            return Err(Refusal::LimitExceeded(Limit::WaitersPerObject));
        }
        self.ack(index, name, id, session, token, effects)?;
        let claimed = self.claim(index, name, session, request, max, wait_ms, effects);
        assert!(claimed.is_ok(), "a claim checked before its ack was refused after it: {claimed:?}");
        claimed
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn nack(
        &mut self,
        index: u64,
        name: &Name,
        id: u64,
        session: SessionId,
        token: u64,
        delay_ms: u64,
        error: Option<&str>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_nack(delay_ms, error)?;
        self.owned_claim(name, id, session, token)?;
        let settled = self.unclaim(index, name, id, Unclaim::Nack { delay_ms, error }, effects);
        self.sync_queue_session(name, session);
        self.touch_queue(index, name, effects);
        self.pump_queue(index, name, effects);
        Ok(Outcome::Nacked { settled })
    }

    pub(crate) fn remove_queued_item(
        &mut self,
        index: u64,
        name: &Name,
        id: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let queue = self.queue(name).ok_or(Refusal::QueueNotFound)?;
        let item = queue.item(id).ok_or(Refusal::ItemNotFound)?;
        let session = match item.state {
            ItemState::Claimed(claim) => Some(claim.session),
            _ => None,
        };
        self.remove_item(name, id);
        if let Some(session) = session {
            self.sync_queue_session(name, session);
        }
        self.touch_queue(index, name, effects);
        Ok(Outcome::ItemRemoved)
    }

    /// Moves delayed items whose time came to pending, in every queue (at most
    /// [`PROMOTE_ITEMS_PER_COMMAND_MAX`]; the shell proposes again for the rest), and hands them
    /// to blocked claimers.
    pub(crate) fn promote_due_items(&mut self, index: u64, effects: &mut Vec<Effect>) -> Outcome {
        let due: Vec<(u64, Name, u64)> = self
            .items_due
            .iter()
            .take_while(|(due, _, _)| *due <= self.now_ms)
            .take(PROMOTE_ITEMS_PER_COMMAND_MAX)
            .cloned()
            .collect();
        let mut queues = std::collections::BTreeSet::new();
        for (_, name, id) in &due {
            self.set_item_state(name, *id, ItemState::Pending);
            queues.insert(name.clone());
        }
        for name in &queues {
            self.touch_queue(index, name, effects);
            self.pump_queue(index, name, effects);
        }
        Outcome::ItemsPromoted { promoted: due.len() as u64 }
    }

    /// Ends `session`'s part in every queue: its blocked claims end, its claimed items are
    /// pending again (or dead-lettered). Called as the session is removed.
    pub(crate) fn end_queue_session(&mut self, index: u64, session: SessionId, effects: &mut Vec<Effect>) {
        let Some(names) = self.queue_sessions.remove(&session) else { return };
        for name in &names {
            let queue = self.queue_mut(name).expect("a session's queue exists");
            let claimers = queue.claimers.len();
            queue.claimers.retain(|claimer| claimer.session != session);
            if queue.claimers.len() < claimers {
                // Its long-polls answer now, not when their wait runs out.
                effects.push(Effect::WaitEnded { key: Key::queue(name.clone()), session });
            }
            let ids: Vec<u64> = queue.claimed.get(&session).into_iter().flatten().copied().collect();
            for id in ids {
                self.unclaim(index, name, id, Unclaim::SessionEnded, effects);
            }
            self.touch_queue(index, name, effects);
            self.pump_queue(index, name, effects);
        }
        // The pumps above hand nothing to the gone session; its index entry stays removed.
        debug_assert!(!self.queue_sessions.contains_key(&session));
    }

    /// Ends the claim of item `id`: pending (or delayed) again, or dead-lettered after
    /// `max_attempts` claims.
    fn unclaim(
        &mut self,
        index: u64,
        name: &Name,
        id: u64,
        why: Unclaim,
        effects: &mut Vec<Effect>,
    ) -> Settled {
        let queue = self.queue(name).expect("the item's queue exists");
        let max_attempts = queue.max_attempts;
        let item = queue.item(id).expect("the item exists");
        let ItemState::Claimed(claim) = item.state else { unreachable!("only claimed items are unclaimed") };
        let attempt = item.attempt;
        let (delay_ms, error) = match why {
            Unclaim::Nack { delay_ms, error } => (delay_ms, error.map(str::to_owned)),
            Unclaim::SessionEnded => (0, Some("the claiming session ended".to_owned())),
        };
        let mut event = queue_event(EventKind::Nacked, name, id);
        event.session = Some(claim.session);
        event.session_name = self.session_name(claim.session);
        event.token = Some(claim.token);
        event.attempt = Some(attempt);
        event.error = error.clone();
        emit(effects, event);
        self.queue_mut(name).expect("exists").item_mut(id).expect("exists").last_error = error;
        if attempt >= max_attempts && self.dead_letter(index, name, id, effects).is_some() {
            return Settled::Dead;
        }
        if delay_ms == 0 {
            self.set_item_state(name, id, ItemState::Pending);
            Settled::Pending
        } else {
            let until_ms = self.now_ms.saturating_add(delay_ms);
            self.set_item_state(name, id, ItemState::Delayed { until_ms });
            Settled::Delayed
        }
    }

    /// Moves item `id` to its queue's dead-letter queue (created if needed, as a terminal one:
    /// no dead-letter queue of its own), pending there under a new `seq`, and names it. `None`,
    /// and the item stays, when the queue has no dead-letter queue or it cannot be created (the
    /// queue limit): the item is claimed again rather than lost.
    fn dead_letter(&mut self, index: u64, name: &Name, id: u64, effects: &mut Vec<Effect>) -> Option<Name> {
        let target = self.queue(name).expect("exists").dead_letter.clone()?;
        if self.queue(&target).is_none() {
            self.create_queue(index, &target, &QueueSettings::default(), None, None, effects).ok()?;
        }
        let mut item = self.remove_item(name, id);
        let dead = self.queue_mut(&target).expect("exists or created above");
        item.seq = dead.next_seq;
        dead.next_seq += 1;
        item.key = None;
        item.entered_ms = self.now_ms;
        item.state = ItemState::Pending;
        let attempt = item.attempt;
        let error = item.last_error.clone();
        self.insert_item(&target, id, item);
        let mut event = queue_event(EventKind::Dead, name, id);
        event.attempt = Some(attempt);
        event.error = error;
        event.dead_letter = Some(target.clone());
        emit(effects, event);
        self.touch_queue(index, &target, effects);
        self.pump_queue(index, &target, effects);
        Some(target)
    }

    /// Ends the blocked claims of `name` whose `wait_ms` passed.
    fn prune_claimers(&mut self, name: &Name, effects: &mut Vec<Effect>) {
        let now_ms = self.now_ms;
        let queue = self.queue(name).expect("exists");
        if queue.claimers.iter().all(|claimer| claimer.until_ms > now_ms) {
            return;
        }
        let queue = self.queue_mut(name).expect("exists");
        let (live, gone): (Vec<Claimer>, Vec<Claimer>) =
            queue.claimers.drain(..).partition(|claimer| claimer.until_ms > now_ms);
        queue.claimers = live.into();
        for claimer in gone {
            self.sync_queue_session(name, claimer.session);
            effects.push(Effect::WaitEnded { key: Key::queue(name.clone()), session: claimer.session });
        }
    }

    /// Moves `name`'s delayed items that are due to pending.
    fn promote_due(&mut self, name: &Name) {
        let now_ms = self.now_ms;
        let queue = self.queue(name).expect("exists");
        let due: Vec<u64> =
            queue.delayed.iter().take_while(|(due, _, _)| *due <= now_ms).map(|(_, _, id)| *id).collect();
        for id in due {
            self.set_item_state(name, id, ItemState::Pending);
        }
    }

    /// Hands pending items to the blocked claimers, first come first served, while both exist.
    /// A claimer whose `wait_ms` passed takes nothing and leaves.
    fn pump_queue(&mut self, index: u64, name: &Name, effects: &mut Vec<Effect>) {
        loop {
            let now_ms = self.now_ms;
            let queue = self.queue(name).expect("pumped queue exists");
            if queue.ready.is_empty() {
                return;
            }
            let Some(claimer) = queue.claimers.front().copied() else { return };
            self.queue_mut(name).expect("exists").claimers.pop_front();
            if claimer.until_ms > now_ms {
                self.hand_out(index, name, claimer.session, claimer.request, claimer.max, effects);
            }
            self.sync_queue_session(name, claimer.session);
            effects.push(Effect::WaitEnded { key: Key::queue(name.clone()), session: claimer.session });
        }
    }

    /// Claims up to `max` pending items of `name`, in `seq` order, for `session`.
    fn hand_out(
        &mut self,
        index: u64,
        name: &Name,
        session: SessionId,
        request: u64,
        max: u32,
        effects: &mut Vec<Effect>,
    ) -> Vec<ClaimedItem> {
        let queue = self.queue(name).expect("exists");
        let ids: Vec<u64> = queue.ready.iter().take(max as usize).map(|(_, id)| *id).collect();
        let session_name = self.session_name(session);
        let mut claimed = Vec::with_capacity(ids.len());
        for id in ids {
            self.last_token += 1;
            let token = self.last_token;
            let claim = Claim { session, token, request, claimed_at_ms: self.now_ms };
            let queue = self.queue_mut(name).expect("exists");
            queue.item_mut(id).expect("a ready item exists").attempt += 1;
            let now_ms = self.now_ms;
            let item = self.set_item_state(name, id, ItemState::Claimed(claim));
            let waited_ms = now_ms.saturating_sub(item.entered_ms);
            claimed.push(ClaimedItem {
                id,
                seq: item.seq,
                attempt: item.attempt,
                token,
                payload: item.payload.clone(),
            });
            let mut event = queue_event(EventKind::Claimed, name, id);
            event.session = Some(session);
            event.session_name = session_name.clone();
            event.token = Some(token);
            event.attempt = Some(claimed.last().expect("pushed").attempt);
            event.waited_ms = Some(waited_ms);
            emit(effects, event);
        }
        self.sync_queue_session(name, session);
        self.touch_queue(index, name, effects);
        claimed
    }

    fn insert_item(&mut self, name: &Name, id: u64, item: Item) {
        if let ItemState::Delayed { until_ms } = item.state {
            self.items_due.insert((until_ms, name.clone(), id));
        }
        self.queue_mut(name).expect("exists").insert(id, item);
        self.queued_items += 1;
    }

    fn remove_item(&mut self, name: &Name, id: u64) -> Item {
        let item = self.queue_mut(name).expect("exists").remove(id).expect("the item exists");
        if let ItemState::Delayed { until_ms } = item.state {
            self.items_due.remove(&(until_ms, name.clone(), id));
        }
        self.queued_items -= 1;
        item
    }

    fn set_item_state(&mut self, name: &Name, id: u64, state: ItemState) -> &Item {
        let queue = self.queues.get_mut(name).map(Arc::make_mut).expect("exists");
        if let Some(ItemState::Delayed { until_ms }) = queue.item(id).map(|item| &item.state) {
            self.items_due.remove(&(*until_ms, name.clone(), id));
        }
        if let ItemState::Delayed { until_ms } = state {
            self.items_due.insert((until_ms, name.clone(), id));
        }
        let queue = self.queues.get_mut(name).map(Arc::make_mut).expect("exists");
        queue.set_state(id, state)
    }

    /// Keeps the index of sessions' queues true for `session` on `name`.
    fn sync_queue_session(&mut self, name: &Name, session: SessionId) {
        let queue = self.queue(name).expect("exists");
        let involved = queue.claimed.contains_key(&session)
            || queue.claimers.iter().any(|claimer| claimer.session == session);
        if involved {
            self.queue_sessions.entry(session).or_default().insert(name.clone());
        } else if let Some(names) = self.queue_sessions.get_mut(&session) {
            names.remove(name);
            if names.is_empty() {
                self.queue_sessions.remove(&session);
            }
        }
    }

    fn touch_queue(&mut self, index: u64, name: &Name, effects: &mut Vec<Effect>) {
        if let Some(queue) = self.queue_mut(name) {
            queue.modified_index = index;
        }
        effects.push(Effect::ObjectChanged { key: Key::queue(name.clone()) });
        if let Some(due) = self.next_item_due_ms() {
            effects.push(Effect::ItemDueSet { due_ms: due });
        }
    }

    fn session_name(&self, session: SessionId) -> Option<String> {
        self.sessions.get(&session).and_then(|session| session.name.clone())
    }
}

fn queue_event(kind: EventKind, name: &Name, id: u64) -> Event {
    let mut event = Event::new(kind);
    event.key = Some(Key::queue(name.clone()));
    event.item = Some(id);
    event
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::apply_next;
    use crate::{Command, Outcome, State, FEATURE_VERSION};

    fn name(text: &str) -> Name {
        Name::new(text).unwrap()
    }

    fn session(id: u8) -> SessionId {
        SessionId::from_bytes([id; 16])
    }

    /// A state at this build's feature version with sessions 1 to 3.
    fn state() -> State {
        let mut state = State::default();
        let mut commands = vec![Command::SetClusterVersion { version: FEATURE_VERSION }];
        commands.extend((1..=3).map(|id| Command::CreateSession {
            id: session(id),
            ttl_ms: 10_000,
            name: None,
        }));
        apply_next(&mut state, commands);
        state
    }

    fn item(payload: &str) -> NewItem {
        NewItem { payload: payload.into(), delay_ms: 0, key: None }
    }

    fn push(state: &mut State, queue: &str, items: Vec<NewItem>) -> Outcome {
        apply_next(state, vec![Command::Push { queue: name(queue), items, creator: None }]).remove(0)
    }

    fn claim(state: &mut State, queue: &str, who: u8, request: u64, max: u32, wait_ms: u64) -> Outcome {
        let command = Command::Claim { queue: name(queue), session: session(who), request, max, wait_ms };
        apply_next(state, vec![command]).remove(0)
    }

    fn claimed(outcome: Outcome) -> Vec<ClaimedItem> {
        match outcome {
            Outcome::Claimed { items } => items,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    fn ack(state: &mut State, queue: &str, item: &ClaimedItem, who: u8) -> Outcome {
        let command =
            Command::Ack { queue: name(queue), id: item.id, session: session(who), token: item.token };
        apply_next(state, vec![command]).remove(0)
    }

    fn nack(state: &mut State, queue: &str, item: &ClaimedItem, who: u8, delay_ms: u64) -> Outcome {
        let command = Command::Nack {
            queue: name(queue),
            id: item.id,
            session: session(who),
            token: item.token,
            delay_ms,
            error: Some("boom".into()),
        };
        apply_next(state, vec![command]).remove(0)
    }

    #[test]
    fn claims_take_items_in_seq_order_with_tokens_from_the_grant_counter() {
        let mut state = state();
        push(&mut state, "jobs", vec![item("1"), item("2"), item("3")]);
        let first = claimed(claim(&mut state, "jobs", 1, 1, 2, 0));
        assert_eq!(first.iter().map(|i| i.payload.as_str()).collect::<Vec<_>>(), ["1", "2"]);
        assert!(first[0].seq < first[1].seq && first[0].token < first[1].token);
        assert_eq!(first[0].attempt, 1);
        let second = claimed(claim(&mut state, "jobs", 2, 2, 5, 0));
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].payload, "3");
        assert_eq!(second[0].token, state.last_token());
        assert!(claimed(claim(&mut state, "jobs", 3, 3, 1, 0)).is_empty(), "nothing pending");
        let counts = state.queue(&name("jobs")).unwrap().counts();
        assert_eq!((counts.pending, counts.claimed), (0, 3));
        state.verify().unwrap();
    }

    #[test]
    fn a_blocked_claim_is_handed_the_next_push_first_come_first_served() {
        let mut state = state();
        apply_next(
            &mut state,
            vec![Command::PutQueue { name: name("jobs"), settings: Default::default(), creator: None }],
        );
        assert_eq!(claim(&mut state, "jobs", 1, 11, 1, 5_000), Outcome::ClaimWaiting);
        assert_eq!(claim(&mut state, "jobs", 2, 12, 1, 5_000), Outcome::ClaimWaiting);
        push(&mut state, "jobs", vec![item("\"a\"")]);
        let (items, waiting) = state.claim_status(&name("jobs"), session(1), 11);
        assert_eq!((items.len(), waiting), (1, false), "the first claimer got it");
        let (items, waiting) = state.claim_status(&name("jobs"), session(2), 12);
        assert_eq!((items.len(), waiting), (0, true), "the second still waits");
        // A retry of the answered claim answers the same items, and claims nothing more.
        assert_eq!(claimed(claim(&mut state, "jobs", 1, 11, 1, 5_000)).len(), 1);
        assert_eq!(state.queue(&name("jobs")).unwrap().counts().claimed, 1);
        // Sent again with wait_ms 0, the second claim waits no more: it answers what it took.
        assert_eq!(claimed(claim(&mut state, "jobs", 2, 12, 1, 0)), Vec::new());
        assert!(!state.claim_status(&name("jobs"), session(2), 12).1);
        push(&mut state, "jobs", vec![item("\"b\"")]);
        assert_eq!(state.queue(&name("jobs")).unwrap().counts().pending, 1);
        state.verify().unwrap();
    }

    #[test]
    fn a_blocked_claim_past_its_wait_takes_nothing() {
        let mut state = state();
        push(&mut state, "jobs", vec![item("1")]);
        claimed(claim(&mut state, "jobs", 1, 1, 1, 0));
        assert_eq!(claim(&mut state, "jobs", 2, 2, 1, 1), Outcome::ClaimWaiting);
        // Leader time moves past the claim's wait before the next push.
        apply_next(&mut state, vec![]);
        apply_next(&mut state, vec![]);
        push(&mut state, "jobs", vec![item("2")]);
        let (items, waiting) = state.claim_status(&name("jobs"), session(2), 2);
        assert!(items.is_empty() && !waiting);
        assert_eq!(state.queue(&name("jobs")).unwrap().counts().pending, 1);
        state.verify().unwrap();
    }

    #[test]
    fn only_the_claiming_session_and_token_settle_a_claim() {
        let mut state = state();
        push(&mut state, "jobs", vec![item("1")]);
        let got = claimed(claim(&mut state, "jobs", 1, 1, 1, 0)).remove(0);
        let before = state.clone();
        let mut stale = got.clone();
        stale.token -= 1;
        assert_eq!(ack(&mut state, "jobs", &got, 2), Outcome::Refused(Refusal::ClaimLost));
        assert_eq!(ack(&mut state, "jobs", &stale, 1), Outcome::Refused(Refusal::ClaimLost));
        assert_eq!(nack(&mut state, "jobs", &stale, 1, 0), Outcome::Refused(Refusal::ClaimLost));
        assert_eq!(state.queue(&name("jobs")), before.queue(&name("jobs")), "refusals change nothing");
        assert_eq!(ack(&mut state, "jobs", &got, 1), Outcome::Acked);
        assert_eq!(ack(&mut state, "jobs", &got, 1), Outcome::Refused(Refusal::ClaimLost), "acked once");
        assert!(state.queue(&name("jobs")).unwrap().is_empty());
        state.verify().unwrap();
    }

    #[allow(clippy::too_many_arguments)]
    fn ack_and_claim(
        state: &mut State,
        queue: &str,
        item: &ClaimedItem,
        who: u8,
        request: u64,
        max: u32,
        wait_ms: u64,
    ) -> Outcome {
        let command = Command::AckAndClaim {
            queue: name(queue),
            id: item.id,
            session: session(who),
            token: item.token,
            request,
            max,
            wait_ms,
        };
        apply_next(state, vec![command]).remove(0)
    }

    #[test]
    fn an_ack_that_claims_acks_then_claims_or_refuses_both() {
        let mut state = state();
        push(&mut state, "jobs", vec![item("1"), item("2")]);
        let first = claimed(claim(&mut state, "jobs", 1, 1, 1, 0)).remove(0);
        // A lost claim, a bad claim, or a request id naming the acked item's claim: nothing
        // changes, the item stays claimed.
        let before = state.clone();
        let mut stale = first.clone();
        stale.token -= 1;
        assert_eq!(
            ack_and_claim(&mut state, "jobs", &stale, 1, 2, 1, 0),
            Outcome::Refused(Refusal::ClaimLost)
        );
        assert_eq!(
            ack_and_claim(&mut state, "jobs", &first, 2, 2, 1, 0),
            Outcome::Refused(Refusal::ClaimLost)
        );
        assert!(matches!(
            ack_and_claim(&mut state, "jobs", &first, 1, 2, 0, 0),
            Outcome::Refused(Refusal::InvalidArgument { field: Field::Max, .. })
        ));
        assert!(matches!(
            ack_and_claim(&mut state, "jobs", &first, 1, 1, 1, 0),
            Outcome::Refused(Refusal::InvalidArgument { field: Field::RequestId, .. })
        ));
        assert_eq!(state.queue(&name("jobs")), before.queue(&name("jobs")), "refusals change nothing");
        // Acked and the next item claimed, in one apply.
        let second = claimed(ack_and_claim(&mut state, "jobs", &first, 1, 2, 1, 0)).remove(0);
        assert_eq!(second.payload, "2");
        assert!(second.token > first.token);
        assert_eq!(ack(&mut state, "jobs", &first, 1), Outcome::Refused(Refusal::ClaimLost), "acked");
        // A retry answers the same claim and acks nothing more.
        assert_eq!(claimed(ack_and_claim(&mut state, "jobs", &first, 1, 2, 1, 0)), vec![second.clone()]);
        // Nothing pending: with a wait, the claim queues behind the others and a push serves it.
        assert_eq!(ack_and_claim(&mut state, "jobs", &second, 1, 3, 1, 5_000), Outcome::ClaimWaiting);
        let counts = state.queue(&name("jobs")).unwrap().counts();
        assert_eq!((counts.pending, counts.claimed), (0, 0), "the second item is acked");
        push(&mut state, "jobs", vec![item("3")]);
        let (items, waiting) = state.claim_status(&name("jobs"), session(1), 3);
        assert_eq!((items.len(), waiting), (1, false));
        assert_eq!(items[0].payload, "3");
        state.verify().unwrap();
    }

    #[test]
    fn a_nacked_item_returns_to_its_seq_place_after_its_delay() {
        let mut state = state();
        push(&mut state, "jobs", vec![item("1"), item("2")]);
        let first = claimed(claim(&mut state, "jobs", 1, 1, 1, 0)).remove(0);
        assert_eq!(nack(&mut state, "jobs", &first, 1, 0), Outcome::Nacked { settled: Settled::Pending });
        let again = claimed(claim(&mut state, "jobs", 2, 2, 1, 0)).remove(0);
        assert_eq!((again.id, again.attempt), (first.id, 2), "back in its place, ahead of item 2");
        assert!(again.token > first.token);
        assert_eq!(nack(&mut state, "jobs", &again, 2, 1_000), Outcome::Nacked { settled: Settled::Delayed });
        assert_eq!(state.next_item_due_ms(), Some(state.now_ms() + 1_000));
        let other = claimed(claim(&mut state, "jobs", 2, 3, 5, 0));
        assert_eq!(
            other.iter().map(|i| i.payload.as_str()).collect::<Vec<_>>(),
            ["2"],
            "the delayed one waits"
        );
        let due = state.next_item_due_ms().unwrap();
        let index = state.applied_index() + 1;
        let promoted = state.apply(
            index,
            1,
            &crate::Batch { now_ms: due, commands: vec![Command::PromoteDueItems] },
            &mut Vec::new(),
        );
        assert_eq!(promoted, vec![Outcome::ItemsPromoted { promoted: 1 }]);
        assert_eq!(
            state.queue(&name("jobs")).unwrap().item(first.id).unwrap().last_error.as_deref(),
            Some("boom")
        );
        state.verify().unwrap();
    }

    #[test]
    fn an_ended_session_s_claims_are_pending_again_and_the_last_attempt_is_dead_lettered() {
        let mut state = state();
        let settings = QueueSettings { max_attempts: Some(2), ..Default::default() };
        apply_next(&mut state, vec![Command::PutQueue { name: name("jobs"), settings, creator: None }]);
        push(&mut state, "jobs", vec![item("{\"n\":1}")]);
        let first = claimed(claim(&mut state, "jobs", 1, 1, 1, 0)).remove(0);
        assert_eq!(claim(&mut state, "jobs", 2, 2, 1, 10_000), Outcome::ClaimWaiting);
        apply_next(&mut state, vec![Command::CloseSession { id: session(1) }]);
        // Pending again at once, and handed to the blocked claim.
        let (items, _) = state.claim_status(&name("jobs"), session(2), 2);
        assert_eq!((items[0].id, items[0].attempt), (first.id, 2));
        apply_next(&mut state, vec![Command::ExpireSessions { ids: vec![session(2)], decided_term: 1 }]);
        assert!(state.queue(&name("jobs")).unwrap().is_empty(), "claimed max_attempts times: gone from jobs");
        let dead = state.queue(&name("jobs.dead")).expect("the dead-letter queue was made");
        let item = dead.item(first.id).expect("same id in the dead-letter queue");
        assert_eq!((item.attempt, item.payload.as_str()), (2, "{\"n\":1}"));
        assert_eq!(item.last_error.as_deref(), Some("the claiming session ended"));
        assert_eq!(dead.dead_letter, None, "a dead-letter queue made on the fly is the end of the line");
        state.verify().unwrap();
    }

    #[test]
    fn a_key_deduplicates_while_its_item_lives_and_a_full_queue_takes_nothing() {
        let mut state = state();
        let settings = QueueSettings { max_items: Some(2), ..Default::default() };
        apply_next(&mut state, vec![Command::PutQueue { name: name("jobs"), settings, creator: None }]);
        let keyed = NewItem { key: Some("k".into()), ..item("1") };
        let Outcome::Pushed { items } = push(&mut state, "jobs", vec![keyed.clone(), keyed.clone()]) else {
            panic!()
        };
        assert!(!items[0].duplicate && items[1].duplicate && items[0].id == items[1].id);
        let before = state.queue(&name("jobs")).unwrap().clone();
        assert_eq!(
            push(&mut state, "jobs", vec![item("2"), item("3")]),
            Outcome::Refused(Refusal::QueueFull { max_items: 2 }),
            "all or nothing"
        );
        assert_eq!(state.queue(&name("jobs")).unwrap(), &before);
        let got = claimed(claim(&mut state, "jobs", 1, 1, 1, 0)).remove(0);
        let Outcome::Pushed { items } = push(&mut state, "jobs", vec![keyed.clone()]) else { panic!() };
        assert!(items[0].duplicate, "a claimed item still deduplicates");
        ack(&mut state, "jobs", &got, 1);
        let Outcome::Pushed { items } = push(&mut state, "jobs", vec![keyed]) else { panic!() };
        assert!(!items[0].duplicate, "after the ack the key is free");
        state.verify().unwrap();
    }

    #[test]
    fn bad_input_is_refused_and_changes_nothing() {
        let mut state = state();
        let before = state.clone();
        let big = item(&"1".repeat(QUEUE_PAYLOAD_BYTES_MAX + 1));
        assert!(matches!(
            push(&mut state, "q", vec![big]),
            Outcome::Refused(Refusal::PayloadTooLarge { .. })
        ));
        assert!(matches!(push(&mut state, "q", vec![]), Outcome::Refused(Refusal::InvalidArgument { .. })));
        assert!(matches!(
            claim(&mut state, "q", 1, 1, 0, 0),
            Outcome::Refused(Refusal::InvalidArgument { .. })
        ));
        assert_eq!(claim(&mut state, "nope", 1, 1, 1, 0), Outcome::Refused(Refusal::QueueNotFound));
        let own = QueueSettings { dead_letter: Some(name("q")), ..Default::default() };
        let put = Command::PutQueue { name: name("q"), settings: own, creator: None };
        assert!(matches!(
            apply_next(&mut state, vec![put]).remove(0),
            Outcome::Refused(Refusal::InvalidArgument { .. })
        ));
        assert_eq!((state.queue_count(), state.queued_items()), (0, 0));
        assert_eq!((state.last_token(), state.last_item), (before.last_token(), before.last_item));
    }

    /// A pushed item holds the push command's payload allocation (the one the Raft log's entry
    /// keeps), not a copy, and so does a claim's answer; the payload encodes as the `String` it
    /// replaced, so log records and snapshots keep their bytes.
    #[test]
    fn an_item_shares_its_push_payload_and_encodes_as_a_string() {
        let mut state = state();
        let items = vec![item("{\"n\":1}"), item("[2]")];
        let command = Command::Push { queue: name("jobs"), items: items.clone(), creator: None };
        apply_next(&mut state, vec![command]);
        let queue = state.queue(&name("jobs")).expect("created by the push");
        for (new, (_, stored)) in items.iter().zip(queue.items()) {
            assert!(stored.payload.shares(&new.payload), "{new:?} copied");
        }
        let stored = queue.items().next().expect("two items").1.payload.clone();
        let taken = claimed(claim(&mut state, "jobs", 1, 1, 1, 0));
        assert!(taken[0].payload.shares(&stored), "a claim copied the payload");
        assert!(!Payload::from("[2]").shares(&Payload::from("[2]")));

        let text = "{\"n\":1}".to_owned();
        let encoded = postcard::to_allocvec(&Payload::from(text.as_str())).expect("encode");
        assert_eq!(encoded, postcard::to_allocvec(&text).expect("encode"));
        let decoded: Payload = postcard::from_bytes(&encoded).expect("decode");
        assert_eq!(decoded, text.as_str());
        let record = postcard::to_allocvec(&items[0]).expect("encode");
        #[derive(Serialize)]
        struct AsString<'a> {
            payload: &'a str,
            delay_ms: u64,
            key: Option<String>,
        }
        let before = AsString { payload: "{\"n\":1}", delay_ms: 0, key: None };
        assert_eq!(record, postcard::to_allocvec(&before).expect("encode"));
    }

    /// The claim's limit counts the session's claims as they stand after the ack.
    #[test]
    fn an_ack_that_claims_counts_the_acked_claim_out_of_the_session_s_limit() {
        let mut state = state();
        let per_push = QUEUE_PUSH_ITEMS_MAX;
        for _ in 0..(CLAIMS_PER_SESSION_MAX + 2) / per_push + 1 {
            push(&mut state, "jobs", (0..per_push).map(|n| item(&n.to_string())).collect());
        }
        let mut held = Vec::new();
        for request in 1.. {
            let left = CLAIMS_PER_SESSION_MAX - held.len();
            if left == 0 {
                break;
            }
            let max = left.min(QUEUE_CLAIM_ITEMS_MAX as usize) as u32;
            held.extend(claimed(claim(&mut state, "jobs", 1, request, max, 0)));
        }
        let before = state.clone();
        let over = ack_and_claim(&mut state, "jobs", &held[0], 1, 1_000_000, 2, 0);
        assert_eq!(over, Outcome::Refused(Refusal::LimitExceeded(Limit::ClaimsPerSession)));
        assert_eq!(state.queue(&name("jobs")), before.queue(&name("jobs")), "refused: not acked");
        assert_eq!(claimed(ack_and_claim(&mut state, "jobs", &held[0], 1, 1_000_000, 1, 0)).len(), 1);
        assert_eq!(state.queue(&name("jobs")).unwrap().counts().claimed, CLAIMS_PER_SESSION_MAX as u64);
    }

    #[test]
    fn an_ack_that_claims_needs_cluster_version_6() {
        let mut state = State::default();
        apply_next(&mut state, vec![Command::SetClusterVersion { version: 5 }]);
        apply_next(&mut state, vec![Command::CreateSession { id: session(1), ttl_ms: 10_000, name: None }]);
        push(&mut state, "jobs", vec![item("1")]);
        let got = claimed(claim(&mut state, "jobs", 1, 1, 1, 0)).remove(0);
        let outcome = ack_and_claim(&mut state, "jobs", &got, 1, 2, 1, 0);
        assert_eq!(outcome, Outcome::Refused(Refusal::FeatureUnavailable { needs: 6, cluster: 5 }));
        assert_eq!(state.queue(&name("jobs")).unwrap().counts().claimed, 1);
    }

    #[test]
    fn queues_need_cluster_version_4() {
        let mut state = State::default();
        apply_next(&mut state, vec![Command::SetClusterVersion { version: 3 }]);
        let outcome = push(&mut state, "jobs", vec![item("1")]);
        assert_eq!(outcome, Outcome::Refused(Refusal::FeatureUnavailable { needs: 4, cluster: 3 }));
        let rules = vec![crate::Rule {
            resource: crate::Resource::Queue,
            prefix: String::new(),
            access: crate::Access::Read,
        }];
        let token = crate::Token { name: "q".into(), secret_hash: [1; 32], rules };
        assert_eq!(
            Command::CreateToken { id: crate::TokenId::from_bytes([1; 16]), token }.feature_version(),
            4
        );
        assert!(crate::root_rules().iter().all(|rule| rule.resource != crate::Resource::Queue));
    }

    #[test]
    fn queues_survive_a_snapshot_and_the_encoder_writes_what_the_decoder_reads() {
        let mut state = state();
        push(
            &mut state,
            "jobs",
            vec![
                item("1"),
                NewItem { delay_ms: 50_000, ..item("2") },
                NewItem { key: Some("k".into()), ..item("3") },
            ],
        );
        claimed(claim(&mut state, "jobs", 1, 7, 1, 0));
        apply_next(
            &mut state,
            vec![Command::PutQueue { name: name("idle"), settings: Default::default(), creator: None }],
        );
        assert_eq!(claim(&mut state, "idle", 2, 8, 1, 60_000), Outcome::ClaimWaiting);
        let bytes = state.encode_snapshot();
        assert_eq!(bytes[0], crate::SNAPSHOT_FORMAT_VERSION);
        let decoded = State::decode_snapshot(&bytes).unwrap();
        assert_eq!(decoded, state, "indexes are derived again alike");
        let queue = state.queue(&name("jobs")).unwrap();
        let by_ref = postcard::to_allocvec(&crate::snapshot::queue_ref(queue)).unwrap();
        assert_eq!(by_ref, postcard::to_allocvec(&QueueRecord::of(queue)).unwrap());
    }
}
