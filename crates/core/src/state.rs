//! The state machine: all sessions and objects, and [`State::apply`].

use std::cmp::max;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use imbl::{OrdMap, OrdSet};

use crate::command::{Acquire, Batch, Command, Creator};
use crate::limits::*;
use crate::outcome::{Effect, Event, EventKind, Field, Limit, Outcome, Refusal, WaitEndReason};
use crate::policy::Policy;
use crate::queue::Queue;
use crate::semaphore::{Hold, Semaphore, Waiter};
use crate::session::{KeySet, Session};
use crate::{Key, Kind, Name, SessionId, Token, TokenId};

/// Every session and object, and the counters that order grants.
///
/// `State` is deterministic: the same batches applied in the same order give the same state and
/// the same snapshot bytes on every replica. It reads no clock (time arrives in
/// [`Batch::now_ms`]), does no I/O and draws no random numbers.
///
/// # Examples
/// ```
/// use permit_core::{Acquire, Batch, Command, Key, Name, Outcome, SessionId, State};
///
/// let mut state = State::default();
/// let session = SessionId::from_bytes([1; 16]);
/// let key = Key::semaphore(Name::new("gpu").unwrap());
/// let batch = Batch {
///     now_ms: 0,
///     commands: vec![
///         Command::CreateSession { id: session, ttl_ms: 10_000, name: None },
///         Command::Acquire(Acquire {
///             key, session, permits: 2, wait: false,
///             capacity: Some(4), max_hold_ms: None, value: None,
///         }),
///     ],
/// };
/// let outcomes = state.apply(1, 1, &batch, &mut Vec::new());
/// assert_eq!(outcomes[1], Outcome::Acquired { permits: 2, token: 1 });
/// ```
///
/// The maps that a snapshot encodes are persistent B-trees (`imbl`): cloning them is O(1) and
/// later writes copy only the paths they touch, so [`State::snapshot_view`] freezes the state
/// under the shell's lock and the view is encoded outside it while writes go on. Objects sit
/// behind an `Arc`, so a write during a snapshot copies the one object it touches, not the
/// up to 64 neighbours that share its tree leaf.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub(crate) sessions: OrdMap<SessionId, Session>,
    pub(crate) objects: OrdMap<Key, Arc<Semaphore>>,
    /// Derived index of holds with a `max_hold_ms` deadline: (deadline, object, session).
    pub(crate) hold_deadlines: BTreeSet<(u64, Key, SessionId)>,
    /// The largest fencing token issued so far; tokens are global, so they grow per object too.
    pub(crate) last_token: u64,
    /// The largest leader time seen in any batch.
    pub(crate) now_ms: u64,
    /// Log index of the last applied batch.
    pub(crate) applied_index: u64,
    /// Access tokens by id.
    pub(crate) tokens: OrdMap<TokenId, Token>,
    /// Derived index: token id by the SHA-256 of its secret.
    pub(crate) token_ids_by_secret: BTreeMap<[u8; 32], TokenId>,
    /// Derived index: live sessions per owning token (tokens without sessions are absent).
    pub(crate) sessions_per_owner: BTreeMap<TokenId, u64>,
    /// Whether the root token was ever created; the bootstrap happens once per cluster.
    pub(crate) root_created: bool,
    /// Semaphores created by an ephemeral acquire and not made permanent by a put since: each is
    /// deleted when it becomes idle.
    pub(crate) ephemeral: OrdSet<Key>,
    /// The token that created each object, for objects created on behalf of a token that still
    /// exists ([`Command::PutSemaphoreBy`], [`Command::AcquireBy`]). An object leaves it when it
    /// is deleted, or when its creator is deleted while the object is in use.
    pub(crate) creators: OrdMap<Key, TokenId>,
    /// Derived index of `creators`: the objects each token created that still exist, to cap
    /// them and to find them when the token is deleted (tokens with none are absent).
    pub(crate) created_by: BTreeMap<TokenId, BTreeSet<Key>>,
    /// The key under which token secrets are stored (HMAC-SHA256), once the cluster has one.
    pub(crate) token_salt: Option<[u8; 32]>,
    /// The cluster's feature version ([`Command::SetClusterVersion`]); 0 until the first raise,
    /// which reads as version 1 (see [`State::cluster_version`]).
    pub(crate) cluster_version: u32,
    /// Work queues by name.
    pub(crate) queues: OrdMap<Name, Arc<Queue>>,
    /// The largest item id issued so far; ids are global, so an item keeps its id when it is
    /// dead-lettered.
    pub(crate) last_item: u64,
    /// Derived: items in all queues.
    pub(crate) queued_items: u64,
    /// Derived index of delayed items: (due time, queue, item).
    pub(crate) items_due: BTreeSet<(u64, Name, u64)>,
    /// Derived index: the queues in which each session has claimed items or a blocked claim
    /// (sessions with none are absent).
    pub(crate) queue_sessions: BTreeMap<SessionId, BTreeSet<Name>>,
    /// Semaphore policies (rates, lock-delays, group caps, waiting takes), by semaphore; only
    /// semaphores with one are present.
    pub(crate) policies: OrdMap<Key, Arc<Policy>>,
    /// Derived index: when each policy has something due (a delay's end, a take's deadline, the
    /// rate's turn of a waiter), as (leader time, semaphore).
    pub(crate) policy_due: BTreeSet<(u64, Key)>,
    /// Derived: each semaphore's entry in `policy_due`.
    pub(crate) policy_due_at: BTreeMap<Key, u64>,
}

/// Debug builds check every invariant ([`State::verify`]) after a batch; the check walks the
/// whole state, so it runs after every batch only while the state has at most this many
/// sessions, objects and tokens, and after every `size / VERIFY_EVERY_SIZE` (rounded up to a
/// power of two) batches beyond: the checks then cost about `VERIFY_EVERY_SIZE` items per
/// batch, whatever the state's size. Checking after every batch made applying `n` entries
/// cost O(n²), so a debug build's restart after a few thousand entries outlasted the tests.
pub(crate) const VERIFY_EVERY_SIZE: usize = 64;

/// Whether a debug build checks the invariants after the batch at `index` of a state of `size`
/// (see [`VERIFY_EVERY_SIZE`]). Release builds never do.
pub(crate) fn verify_due(index: u64, size: usize) -> bool {
    let period = (size / VERIFY_EVERY_SIZE).max(1).next_power_of_two() as u64;
    index.is_multiple_of(period)
}

impl State {
    /// Applies the commands of the batch at log `index`, written in Raft term `term`, in order,
    /// and returns one outcome per command. Effects for the shell (wake-ups, timers) are
    /// appended to `effects`.
    ///
    /// # Panics
    /// If `index` does not grow: the log is applied in order, exactly once.
    pub fn apply(&mut self, index: u64, term: u64, batch: &Batch, effects: &mut Vec<Effect>) -> Vec<Outcome> {
        self.advance_index(index);
        self.now_ms = max(self.now_ms, batch.now_ms);
        let outcomes =
            batch.commands.iter().map(|command| self.apply_command(index, term, command, effects)).collect();
        if cfg!(debug_assertions) && verify_due(index, self.verify_size()) {
            if let Err(violation) = self.verify() {
                panic!("invariant violated after applying index {index}: {violation}");
            }
        }
        outcomes
    }

    /// What a [`State::verify`] walks, roughly: sessions, objects and tokens.
    fn verify_size(&self) -> usize {
        self.sessions.len() + self.objects.len() + self.tokens.len() + self.queued_items as usize
    }

    /// Records that the log entry at `index` carried no batch (a Raft blank or membership entry).
    pub fn skip(&mut self, index: u64) {
        self.advance_index(index);
    }

    /// Raft logs start at index 0 (the initial membership), so 0 may be applied once, first.
    fn advance_index(&mut self, index: u64) {
        let fresh = index == 0 && self.applied_index == 0;
        assert!(
            index > self.applied_index || fresh,
            "log index {index} applied after {}",
            self.applied_index
        );
        self.applied_index = index;
    }

    fn apply_command(
        &mut self,
        index: u64,
        term: u64,
        command: &Command,
        effects: &mut Vec<Effect>,
    ) -> Outcome {
        let needs = command.feature_version();
        if needs > self.cluster_version() && !matches!(command, Command::SetClusterVersion { .. }) {
            return Outcome::Refused(Refusal::FeatureUnavailable { needs, cluster: self.cluster_version() });
        }
        let result = match command {
            Command::CreateSession { id, ttl_ms, name } => {
                self.create_session(index, *id, *ttl_ms, name, None, effects)
            }
            Command::CreateOwnedSession { id, ttl_ms, name, owner, owner_sessions_max } => self
                .check_owner(*owner, *owner_sessions_max)
                .and_then(|()| self.create_session(index, *id, *ttl_ms, name, Some(*owner), effects)),
            Command::CreateToken { id, token } => self.create_token(*id, token),
            Command::DeleteToken { id } => self.delete_token(index, *id, effects),
            Command::CloseSession { id } => self.close_session(index, *id, effects),
            Command::Revoke { key, session } => self.release(index, key, *session, true, effects),
            Command::ExpireSessions { ids, decided_term } if *decided_term == term => {
                Ok(self.expire_sessions(index, ids, effects))
            }
            Command::ExpireSessions { .. } => Ok(Outcome::SessionsExpired { expired: 0 }),
            Command::PutSemaphore { name, capacity } => {
                self.put_semaphore(index, name, *capacity, None, effects)
            }
            Command::DeleteSemaphore { name } => self.delete_semaphore(name, effects),
            Command::Acquire(acquire) => self.acquire(index, acquire, None, None, effects),
            Command::AcquireEphemeral(acquire) => self.acquire_ephemeral(index, acquire, None, None, effects),
            Command::Release { key, session } => self.release(index, key, *session, false, effects),
            Command::ExpireHolds => Ok(self.expire_holds(index, effects)),
            Command::PutSemaphoreBy { name, capacity, creator } => {
                self.put_semaphore(index, name, *capacity, Some(creator), effects)
            }
            Command::AcquireBy { acquire, ephemeral: false, creator } => {
                self.acquire(index, acquire, Some(creator), None, effects)
            }
            Command::AcquireBy { acquire, ephemeral: true, creator } => {
                self.acquire_ephemeral(index, acquire, Some(creator), None, effects)
            }
            Command::SetTokenSalt { salt, root } => self.set_token_salt(*salt, root.as_ref()),
            Command::SetClusterVersion { version } => {
                // Stored only when raised past 1, so that equal versions are equal states.
                if *version > self.cluster_version() {
                    self.cluster_version = *version;
                }
                Ok(Outcome::ClusterVersionSet { version: self.cluster_version() })
            }
            Command::Proclaim { key, session, value } => self.proclaim(index, key, *session, value, effects),
            Command::PutQueue { name, settings, creator } => {
                self.put_queue(index, name, settings, creator.as_ref(), effects)
            }
            Command::DeleteQueue { name } => self.delete_queue(name, effects),
            Command::Push { queue, items, creator } => {
                self.push(index, queue, items, creator.as_ref(), effects)
            }
            Command::Claim { queue, session, request, max, wait_ms } => {
                self.claim(index, queue, *session, *request, *max, *wait_ms, effects)
            }
            Command::CancelClaim { queue, session, request } => {
                self.cancel_claim(index, queue, *session, *request, effects)
            }
            Command::Ack { queue, id, session, token } => {
                self.ack(index, queue, *id, *session, *token, effects)
            }
            Command::Nack { queue, id, session, token, delay_ms, error } => {
                self.nack(index, queue, *id, *session, *token, *delay_ms, error.as_deref(), effects)
            }
            Command::RemoveItem { queue, id } => self.remove_queued_item(index, queue, *id, effects),
            Command::PromoteDueItems => Ok(self.promote_due_items(index, effects)),
            Command::PutSemaphorePolicy { name, capacity, policy, creator } => {
                self.put_semaphore_policy(index, name, *capacity, policy, creator.as_ref(), effects)
            }
            Command::AcquireInGroup { acquire, ephemeral, creator, group } => {
                crate::policy::validate_group(group.as_str()).and_then(|_| {
                    if *ephemeral {
                        self.acquire_ephemeral(index, acquire, creator.as_ref(), Some(group), effects)
                    } else {
                        self.acquire(index, acquire, creator.as_ref(), Some(group), effects)
                    }
                })
            }
            Command::Take { name, taker, permits, wait_ms } => {
                self.take(index, name, *taker, *permits, *wait_ms, effects)
            }
            Command::CancelTake { name, taker } => self.cancel_take(index, name, *taker, effects),
            Command::PolicyTick => Ok(self.policy_tick(index, effects)),
            Command::AckAndClaim { queue, id, session, token, request, max, wait_ms } => {
                self.ack_and_claim(index, queue, *id, *session, *token, *request, *max, *wait_ms, effects)
            }
        };
        result.unwrap_or_else(Outcome::Refused)
    }

    fn create_session(
        &mut self,
        index: u64,
        id: SessionId,
        ttl_ms: u64,
        name: &Option<String>,
        owner: Option<TokenId>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_ttl_ms(ttl_ms)?;
        validate_session_name(name.as_deref())?;
        if self.sessions.contains_key(&id) {
            return Err(Refusal::SessionExists);
        }
        if self.sessions.len() >= SESSIONS_MAX {
            return Err(Refusal::LimitExceeded(Limit::Sessions));
        }
        let session = Session {
            name: name.clone(),
            ttl_ms,
            created_index: index,
            owner,
            holds: KeySet::default(),
            waits: KeySet::default(),
        };
        if let Some(owner) = owner {
            *self.sessions_per_owner.entry(owner).or_default() += 1;
        }
        let mut event = Event::new(EventKind::SessionCreated);
        event.session = Some(id);
        event.session_name = session.name.clone();
        event.session_owner = owner;
        self.sessions.insert(id, session);
        effects.push(Effect::SessionCreated { id, ttl_ms });
        emit(effects, event);
        Ok(Outcome::SessionCreated)
    }

    fn close_session(
        &mut self,
        index: u64,
        id: SessionId,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        if !self.sessions.contains_key(&id) {
            return Err(Refusal::SessionNotFound);
        }
        self.remove_session(index, id, SessionEnd::Closed, effects);
        Ok(Outcome::SessionClosed)
    }

    fn expire_sessions(&mut self, index: u64, ids: &[SessionId], effects: &mut Vec<Effect>) -> Outcome {
        let mut expired = 0;
        for id in ids {
            if self.sessions.contains_key(id) {
                self.remove_session(index, *id, SessionEnd::Expired, effects);
                expired += 1;
            }
        }
        Outcome::SessionsExpired { expired }
    }

    /// Cancels the session's waits, then releases its holds, granting to waiters behind them.
    pub(crate) fn remove_session(
        &mut self,
        index: u64,
        id: SessionId,
        end: SessionEnd,
        effects: &mut Vec<Effect>,
    ) {
        let expired = end == SessionEnd::Expired;
        // Its holder did not let go: a semaphore's lock-delay keeps the permits out a while.
        let failed = end != SessionEnd::Closed;
        let session = self.sessions.remove(&id).expect("caller checked the session exists");
        if let Some(owner) = session.owner {
            let count = self.sessions_per_owner.get_mut(&owner).expect("an owner's sessions are counted");
            *count -= 1;
            if *count == 0 {
                self.sessions_per_owner.remove(&owner);
            }
        }
        for key in &session.waits {
            let object = self.object_mut(key).expect("a wait's object exists");
            let waiter = object.queue.remove(id).expect("a session's wait is queued");
            self.policy_hold_or_wait_ended(key, id, 0, false, None);
            effects.push(Effect::WaitEnded { key: key.clone(), session: id });
            let mut event = Event::new(EventKind::WaitEnded);
            event.key = Some(key.clone());
            event.session = Some(id);
            event.session_name = session.name.clone();
            event.permits = Some(waiter.permits);
            event.reason = Some(WaitEndReason::SessionEnded);
            emit(effects, event);
            self.touch(index, key, effects);
            self.pump(index, key, effects);
        }
        let hold_end = if expired { EventKind::Expired } else { EventKind::Released };
        for key in &session.holds {
            let hold = self.remove_hold(key, id);
            let mut event = self.hold_ended(hold_end, key, id, session.name.clone(), &hold);
            self.policy_hold_or_wait_ended(key, id, hold.permits, failed, Some(&mut event));
            emit(effects, event);
            self.touch(index, key, effects);
            self.pump(index, key, effects);
            self.leader_check(key, effects);
        }
        for key in session.waits.iter().chain(&session.holds) {
            self.drop_idle_election(key, effects);
        }
        self.end_queue_session(index, id, effects);
        effects.push(Effect::SessionRemoved { id });
        let mut event =
            Event::new(if expired { EventKind::SessionExpired } else { EventKind::SessionClosed });
        event.session = Some(id);
        event.session_name = session.name;
        event.session_owner = session.owner;
        emit(effects, event);
    }

    pub(crate) fn put_semaphore(
        &mut self,
        index: u64,
        name: &Name,
        capacity: u64,
        creator: Option<&Creator>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_capacity(capacity)?;
        let key = Key::semaphore(name.clone());
        let last_token = self.last_token;
        let Some(object) = self.objects.get_mut(&key).map(Arc::make_mut) else {
            if self.objects.len() >= OBJECTS_MAX {
                return Err(Refusal::LimitExceeded(Limit::Objects));
            }
            self.check_creator(creator)?;
            self.objects.insert(key.clone(), Arc::new(Semaphore::new(capacity, index, last_token)));
            self.record_creator(&key, creator);
            emit(effects, capacity_event(&key, capacity));
            effects.push(Effect::ObjectChanged { key });
            return Ok(Outcome::SemaphoreCreated);
        };
        object.capacity = capacity;
        emit(effects, capacity_event(&key, capacity));
        object.capacity_set_token = last_token;
        self.ephemeral.remove(&key);
        // Waiters that can never fit would block the queue forever: their waits end, refused.
        let takers = self.policies.get(&key).map(|policy| policy.takers.clone()).unwrap_or_default();
        let object = self.object_mut(&key).expect("exists");
        let dropped = object
            .queue
            .remove_where(|waiter| waiter.permits > capacity && !takers.contains_key(&waiter.session));
        for waiter in dropped {
            self.policy_hold_or_wait_ended(&key, waiter.session, 0, false, None);
            let session = self.sessions.get_mut(&waiter.session).expect("a waiter's session exists");
            session.waits.remove(&key);
            effects.push(Effect::WaitEnded { key: key.clone(), session: waiter.session });
            let mut event = Event::new(EventKind::WaitEnded);
            event.key = Some(key.clone());
            event.session = Some(waiter.session);
            event.session_name = session.name.clone();
            event.permits = Some(waiter.permits);
            event.reason = Some(WaitEndReason::Cancelled);
            emit(effects, event);
        }
        self.touch(index, &key, effects);
        self.pump(index, &key, effects);
        Ok(Outcome::SemaphoreUpdated)
    }

    fn delete_semaphore(&mut self, name: &Name, effects: &mut Vec<Effect>) -> Result<Outcome, Refusal> {
        let key = Key::semaphore(name.clone());
        let object = self.objects.get(&key).ok_or(Refusal::SemaphoreNotFound)?;
        let delayed = self.policies.get(&key).is_some_and(|policy| !policy.delayed.is_empty());
        if !object.is_idle() || delayed {
            return Err(Refusal::SemaphoreBusy);
        }
        self.remove_object(&key, effects);
        Ok(Outcome::SemaphoreDeleted)
    }

    /// An acquire whose semaphore, if it creates it, is deleted when idle.
    fn acquire_ephemeral(
        &mut self,
        index: u64,
        acquire: &Acquire,
        creator: Option<&Creator>,
        group: Option<&Name>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let created = acquire.key.kind == Kind::Semaphore && !self.objects.contains_key(&acquire.key);
        let outcome = self.acquire(index, acquire, creator, group, effects);
        if created && self.objects.contains_key(&acquire.key) {
            self.ephemeral.insert(acquire.key.clone());
        }
        outcome
    }

    /// An acquire or campaign; `group` (semaphores only) counts it against the group's cap.
    fn acquire(
        &mut self,
        index: u64,
        acquire: &Acquire,
        creator: Option<&Creator>,
        group: Option<&Name>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_acquire(acquire)?;
        if group.is_some() && acquire.key.kind != Kind::Semaphore {
            return Err(out_of_range(Field::Group, "only semaphores have groups".into()));
        }
        let session = self.sessions.get(&acquire.session).ok_or(Refusal::SessionNotFound)?;
        let key = &acquire.key;
        let capacity = match (self.objects.get(key), key.kind) {
            (Some(object), _) => object.capacity,
            (None, Kind::Election) => 1,
            (None, Kind::Semaphore) => acquire.capacity.ok_or(Refusal::SemaphoreNotFound)?,
            (None, Kind::Queue) => {
                return Err(out_of_range(Field::Permits, "a queue's items are claimed, not acquired".into()))
            }
        };
        if let Some(object) = self.objects.get(key) {
            if let Some(hold) = object.holders.get(&acquire.session) {
                return same_permits(hold.permits, acquire.permits)
                    .map(|()| Outcome::Acquired { permits: hold.permits, token: hold.token });
            }
            if let Some(waiter) = object.queue.get(acquire.session) {
                same_permits(waiter.permits, acquire.permits)?;
                let position = object.queue.position(acquire.session).expect("the waiter is queued");
                return Ok(Outcome::Waiting { position });
            }
        }
        if acquire.permits > capacity {
            return Err(Refusal::PermitsExceedCapacity { permits: acquire.permits, capacity });
        }
        self.check_burst(key, acquire.permits)?;
        if session.key_count() >= KEYS_PER_SESSION_MAX {
            return Err(Refusal::LimitExceeded(Limit::KeysPerSession));
        }
        if !self.objects.contains_key(key) {
            if self.objects.len() >= OBJECTS_MAX {
                return Err(Refusal::LimitExceeded(Limit::Objects));
            }
            self.check_creator(creator)?;
            self.objects.insert(key.clone(), Arc::new(Semaphore::new(capacity, index, self.last_token)));
            // A new object with an empty queue always grants below (the permits fit the
            // capacity, checked above), so it never stays idle and created for nothing.
            self.record_creator(key, creator);
            if key.kind == Kind::Semaphore {
                emit(effects, capacity_event(key, capacity));
            }
        }
        if let Some(group) = group {
            self.record_group(key, acquire.session, group);
        }
        if self.grantable_now(key, acquire.session, acquire.permits) {
            let waiter = waiter_of(index, acquire);
            let token = self.grant(index, key, waiter, false, effects);
            return Ok(Outcome::Acquired { permits: acquire.permits, token });
        }
        let object = self.object_mut(key).expect("created above");
        let refusal = if !acquire.wait {
            effects.push(Effect::TryAcquireRefused { key: key.clone() });
            Some(Refusal::Unavailable)
        } else if object.queue.len() >= WAITERS_PER_OBJECT_MAX {
            Some(Refusal::LimitExceeded(Limit::WaitersPerObject))
        } else {
            None
        };
        if let Some(refusal) = refusal {
            // The group recorded above goes with the refused acquire.
            self.policy_hold_or_wait_ended(key, acquire.session, 0, false, None);
            return Err(refusal);
        }
        let object = self.object_mut(key).expect("created above");
        object.queue.push(waiter_of(index, acquire));
        let position = object.queue.position(acquire.session).expect("just queued");
        let session = self.sessions.get_mut(&acquire.session).expect("checked above");
        session.waits.insert(key.clone());
        let mut event = Event::new(EventKind::Queued);
        event.key = Some(key.clone());
        event.session = Some(acquire.session);
        event.session_name = session.name.clone();
        event.permits = Some(acquire.permits);
        emit(effects, event);
        self.touch(index, key, effects);
        if self.policies.contains_key(key) {
            // Leader time moved since the last pump: a waiter held back by the rate (this one,
            // or one before it) may be due now.
            self.pump(index, key, effects);
            let object = self.objects.get(key).expect("exists");
            if let Some(hold) = object.holders.get(&acquire.session) {
                return Ok(Outcome::Acquired { permits: hold.permits, token: hold.token });
            }
            let position = object.queue.position(acquire.session).expect("still queued");
            return Ok(Outcome::Waiting { position });
        }
        Ok(Outcome::Waiting { position })
    }

    fn release(
        &mut self,
        index: u64,
        key: &Key,
        session_id: SessionId,
        revoke: bool,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        if !self.sessions.contains_key(&session_id) {
            return Err(Refusal::SessionNotFound);
        }
        let Some(object) = self.object_mut(key) else {
            return Ok(Outcome::Released { permits: 0 });
        };
        let held = object.holders.contains_key(&session_id);
        let permits = if held {
            let hold = self.remove_hold(key, session_id);
            let session = self.sessions.get_mut(&session_id).expect("checked above");
            session.holds.remove(key);
            let name = session.name.clone();
            let kind = if revoke { EventKind::Revoked } else { EventKind::Released };
            let mut event = self.hold_ended(kind, key, session_id, name, &hold);
            self.policy_hold_or_wait_ended(key, session_id, hold.permits, revoke, Some(&mut event));
            emit(effects, event);
            hold.permits
        } else if let Some(waiter) = object.queue.remove(session_id) {
            self.policy_hold_or_wait_ended(key, session_id, 0, false, None);
            let session = self.sessions.get_mut(&session_id).expect("checked above");
            session.waits.remove(key);
            effects.push(Effect::WaitEnded { key: key.clone(), session: session_id });
            let mut event = Event::new(EventKind::WaitEnded);
            event.key = Some(key.clone());
            event.session = Some(session_id);
            event.session_name = session.name.clone();
            event.permits = Some(waiter.permits);
            event.reason = Some(WaitEndReason::Cancelled);
            emit(effects, event);
            0
        } else {
            return Ok(Outcome::Released { permits: 0 });
        };
        self.touch(index, key, effects);
        self.pump(index, key, effects);
        if held {
            self.leader_check(key, effects);
        }
        self.drop_idle_election(key, effects);
        Ok(Outcome::Released { permits })
    }

    /// The leader of the election `key` publishes `value` in place of its own: the hold, its
    /// token and its tenure stay. The same value again changes nothing (no watcher wakes).
    fn proclaim(
        &mut self,
        index: u64,
        key: &Key,
        session_id: SessionId,
        value: &str,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        if key.kind != Kind::Election {
            return Err(out_of_range(Field::Value, "only elections carry a value".into()));
        }
        validate_election_value(value)?;
        let session = self.sessions.get(&session_id).ok_or(Refusal::SessionNotFound)?;
        let session_name = session.name.clone();
        // Read first: a refusal must not copy an object that a snapshot view shares.
        let hold = self.objects.get(key).and_then(|object| object.holders.get(&session_id));
        let hold = hold.ok_or(Refusal::NotLeader)?;
        let outcome = Outcome::Proclaimed { token: hold.token, granted_at_ms: hold.granted_at_ms };
        if hold.value.as_deref() == Some(value) {
            return Ok(outcome);
        }
        let token = hold.token;
        let object = self.object_mut(key).expect("the leader's election exists");
        object.holders.get_mut(&session_id).expect("the leader holds it").value = Some(value.to_owned());
        let mut event = Event::new(EventKind::Proclaimed);
        event.key = Some(key.clone());
        event.session = Some(session_id);
        event.session_name = session_name;
        event.token = Some(token);
        event.value = Some(value.to_owned());
        emit(effects, event);
        self.touch(index, key, effects);
        Ok(outcome)
    }

    fn expire_holds(&mut self, index: u64, effects: &mut Vec<Effect>) -> Outcome {
        let due: Vec<(u64, Key, SessionId)> = self
            .hold_deadlines
            .iter()
            .take_while(|(deadline, _, _)| *deadline <= self.now_ms)
            .take(EXPIRE_HOLDS_PER_COMMAND_MAX)
            .cloned()
            .collect();
        for (_, key, session_id) in &due {
            let hold = self.remove_hold(key, *session_id);
            let session = self.sessions.get_mut(session_id).expect("a holder's session exists");
            session.holds.remove(key);
            let name = session.name.clone();
            let mut event = self.hold_ended(EventKind::Expired, key, *session_id, name, &hold);
            self.policy_hold_or_wait_ended(key, *session_id, hold.permits, true, Some(&mut event));
            emit(effects, event);
            self.touch(index, key, effects);
            self.pump(index, key, effects);
            self.leader_check(key, effects);
            self.drop_idle_election(key, effects);
        }
        Outcome::HoldsExpired { expired: due.len() as u64 }
    }

    /// Grants waiters from the head of the queue while the head fits. A head that does not fit
    /// blocks everyone behind it: strict FIFO, so large requests are never starved.
    pub(crate) fn pump(&mut self, index: u64, key: &Key, effects: &mut Vec<Effect>) {
        if self.policies.contains_key(key) {
            return self.pump_policy(index, key, effects);
        }
        loop {
            let object = self.object_mut(key).expect("pumped object exists");
            match object.queue.head() {
                Some(head) if object.fits(head.permits) => {}
                _ => return,
            }
            let waiter = object.queue.pop_head().expect("head exists");
            let session = self.sessions.get_mut(&waiter.session).expect("a waiter's session exists");
            session.waits.remove(key);
            effects.push(Effect::WaitEnded { key: key.clone(), session: waiter.session });
            self.grant(index, key, waiter, true, effects);
        }
    }

    /// Gives `waiter` its permits with a new token. The caller checked that they fit.
    pub(crate) fn grant(
        &mut self,
        index: u64,
        key: &Key,
        waiter: Waiter,
        from_queue: bool,
        effects: &mut Vec<Effect>,
    ) -> u64 {
        self.last_token += 1;
        let token = self.last_token;
        let expires_at_ms = waiter.max_hold_ms.map(|ms| self.now_ms.saturating_add(ms));
        let hold = Hold {
            permits: waiter.permits,
            token,
            granted_index: index,
            granted_at_ms: self.now_ms,
            expires_at_ms,
            value: waiter.value,
        };
        let object = self.object_mut(key).expect("granted object exists");
        assert!(object.fits(hold.permits), "grant over capacity");
        object.held += hold.permits;
        let (held, capacity, permits) = (object.held, object.capacity, hold.permits);
        object.holders.insert(waiter.session, hold);
        if let Some(policy) = self.policies.get(key) {
            assert!(held + policy.delayed_permits() <= capacity, "grant into delayed permits");
            self.policy_granted(key, waiter.session, permits);
        }
        let session = self.sessions.get_mut(&waiter.session).expect("a grantee's session exists");
        session.holds.insert(key.clone());
        let mut event = Event::new(EventKind::Granted);
        event.key = Some(key.clone());
        event.session = Some(waiter.session);
        event.session_name = session.name.clone();
        event.permits = Some(waiter.permits);
        event.token = Some(token);
        event.from_queue = from_queue;
        if key.kind == Kind::Election {
            let mut leader = event.clone();
            leader.kind = EventKind::LeaderChanged;
            leader.permits = None;
            leader.from_queue = false;
            leader.value = object_value(&self.objects, key, waiter.session);
            emit(effects, event);
            emit(effects, leader);
        } else {
            emit(effects, event);
        }
        if let Some(expires_at_ms) = expires_at_ms {
            self.hold_deadlines.insert((expires_at_ms, key.clone(), waiter.session));
            effects.push(Effect::HoldDeadlineSet { expires_at_ms });
        }
        self.touch(index, key, effects);
        token
    }

    /// Removes a hold from its object and the deadline index; the caller updates the session.
    fn remove_hold(&mut self, key: &Key, session: SessionId) -> Hold {
        let object = self.object_mut(key).expect("held object exists");
        let hold = object.holders.remove(&session).expect("hold exists");
        object.held -= hold.permits;
        if let Some(expires_at_ms) = hold.expires_at_ms {
            self.hold_deadlines.remove(&(expires_at_ms, key.clone(), session));
        }
        hold
    }

    /// Elections and ephemeral semaphores exist only while someone holds or waits; an idle one
    /// is removed. Tokens are global, so a name created again never repeats a token.
    fn drop_idle_election(&mut self, key: &Key, effects: &mut Vec<Effect>) {
        let transient = key.kind == Kind::Election || self.ephemeral.contains(key);
        if transient && self.objects.get(key).is_some_and(|object| object.is_idle()) {
            self.remove_object(key, effects);
        }
    }

    /// Removes an idle object, with its ephemeral mark and its creator's record: every removal
    /// of an object goes through here, so a token's count of objects is always of live ones.
    pub(crate) fn remove_object(&mut self, key: &Key, effects: &mut Vec<Effect>) {
        self.objects.remove(key);
        self.forget_policy(key);
        self.ephemeral.remove(key);
        self.forget_creator(key);
        effects.push(Effect::ObjectRemoved { key: key.clone() });
        effects.push(Effect::ObjectChanged { key: key.clone() });
    }

    /// Removes the record of who created `key`, as it is deleted.
    pub(crate) fn forget_creator(&mut self, key: &Key) {
        if let Some(token) = self.creators.remove(key) {
            let created = self.created_by.get_mut(&token).expect("a creator's objects are indexed");
            created.remove(key);
            if created.is_empty() {
                self.created_by.remove(&token);
            }
        }
    }

    /// Refuses to create an object on behalf of a token that is gone, or that has created its
    /// cap of objects that still exist. No creator (auth off): nothing to check. The root token
    /// before its bootstrap (the configured root secret already acts as root then) creates
    /// freely, and [`State::record_creator`] records nothing for it.
    pub(crate) fn check_creator(&self, creator: Option<&Creator>) -> Result<(), Refusal> {
        let Some(creator) = creator else { return Ok(()) };
        if self.root_before_bootstrap(creator.token) {
            return Ok(());
        }
        if !self.tokens.contains_key(&creator.token) {
            return Err(Refusal::TokenNotFound);
        }
        if self.objects_created_by(creator.token) >= creator.objects_max {
            return Err(Refusal::LimitExceeded(Limit::ObjectsPerToken));
        }
        Ok(())
    }

    /// Whether `token` is the root token of a cluster whose bootstrap has not created it yet.
    fn root_before_bootstrap(&self, token: TokenId) -> bool {
        token == crate::ROOT_TOKEN_ID && !self.root_created
    }

    /// Records that `creator` made the object `key`, just inserted.
    pub(crate) fn record_creator(&mut self, key: &Key, creator: Option<&Creator>) {
        if let Some(creator) = creator.filter(|creator| !self.root_before_bootstrap(creator.token)) {
            self.creators.insert(key.clone(), creator.token);
            self.created_by.entry(creator.token).or_default().insert(key.clone());
        }
    }

    pub(crate) fn set_token_salt(
        &mut self,
        salt: [u8; 32],
        root: Option<&Token>,
    ) -> Result<Outcome, Refusal> {
        if self.token_salt.is_some() {
            return Err(Refusal::TokenExists);
        }
        if let Some(root) = root {
            // Refused before the salt is set: the command changes all or nothing.
            self.create_token(crate::ROOT_TOKEN_ID, root)?;
        }
        self.token_salt = Some(salt);
        Ok(Outcome::TokenSaltSet)
    }

    /// The event of a hold of `session` on `key` that ended as `kind`.
    fn hold_ended(
        &self,
        kind: EventKind,
        key: &Key,
        session: SessionId,
        name: Option<String>,
        hold: &Hold,
    ) -> Event {
        let mut event = Event::new(kind);
        event.key = Some(key.clone());
        event.session = Some(session);
        event.session_name = name;
        event.permits = Some(hold.permits);
        event.token = Some(hold.token);
        event.held_ms = Some(self.now_ms.saturating_sub(hold.granted_at_ms));
        event
    }

    /// After a hold on `key` ended and the queue was pumped: an election left without a leader
    /// says so (a new leader announced itself in `grant`).
    fn leader_check(&self, key: &Key, effects: &mut Vec<Effect>) {
        if key.kind != Kind::Election {
            return;
        }
        if self.objects.get(key).is_none_or(|object| object.holders.is_empty()) {
            let mut event = Event::new(EventKind::LeaderChanged);
            event.key = Some(key.clone());
            emit(effects, event);
        }
    }

    /// The object to change: copied first if a snapshot view still shares it.
    pub(crate) fn object_mut(&mut self, key: &Key) -> Option<&mut Semaphore> {
        self.objects.get_mut(key).map(Arc::make_mut)
    }

    pub(crate) fn touch(&mut self, index: u64, key: &Key, effects: &mut Vec<Effect>) {
        if let Some(object) = self.object_mut(key) {
            object.modified_index = index;
        }
        effects.push(Effect::ObjectChanged { key: key.clone() });
    }
}

/// How a session ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SessionEnd {
    /// Its client closed it: its holds end as `released`.
    Closed,
    /// It ran out of TTL: its holds end as `expired`.
    Expired,
    /// Its access token was deleted: its holds end as `released`, but its client did not let
    /// go (a lock-delay applies, as to a revoke).
    TokenDeleted,
}

/// Read access for the shell.
impl State {
    /// The session with this id.
    pub fn session(&self, id: SessionId) -> Option<&Session> {
        self.sessions.get(&id)
    }

    /// All sessions, ordered by id.
    pub fn sessions(&self) -> impl ExactSizeIterator<Item = (&SessionId, &Session)> {
        self.sessions.iter()
    }

    /// Sessions whose id comes after `after`, in id order (for paging).
    pub fn sessions_after(&self, after: Option<SessionId>) -> impl Iterator<Item = (&SessionId, &Session)> {
        use std::ops::Bound;
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.sessions.range((start, Bound::Unbounded))
    }

    /// Number of live sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// The object with this key.
    pub fn object(&self, key: &Key) -> Option<&Semaphore> {
        self.objects.get(key).map(|object| &**object)
    }

    /// Objects of `kind` whose name comes after `after`, in name order.
    pub fn objects_after<'a>(
        &'a self,
        kind: Kind,
        after: Option<&'a Name>,
    ) -> impl Iterator<Item = (&'a Key, &'a Semaphore)> + 'a {
        use std::ops::Bound;
        let start = match after {
            Some(name) => Bound::Excluded(Key { kind, name: name.clone() }),
            None => Bound::Included(Key { kind, name: Name::below_all() }),
        };
        self.objects
            .range((start, Bound::Unbounded))
            .take_while(move |(key, _)| key.kind == kind)
            .map(|(key, object)| (key, &**object))
    }

    /// Objects of `kind` whose name starts with one of `prefixes` and comes after `after`, in
    /// name order. The walk visits only those names: one B-tree range per prefix, never the
    /// objects outside them, so a caller that may read few names costs little whatever the size
    /// of the table (`GET /v1/semaphores`, `GET /v1/elections`). Prefixes that extend another
    /// one are skipped (their names are in the shorter one's range); `""` is every name.
    pub fn objects_in_prefixes<'a>(
        &'a self,
        kind: Kind,
        prefixes: &[&str],
        after: Option<&'a Name>,
    ) -> impl Iterator<Item = (&'a Key, &'a Semaphore)> + 'a {
        use std::ops::Bound;
        let mut sorted: Vec<String> = prefixes.iter().map(|prefix| (*prefix).to_owned()).collect();
        sorted.sort_unstable();
        sorted.dedup();
        // After sorting, a prefix that extends another comes right after the shortest one it
        // extends (or after another extension of it), so one pass keeps the minimal ones. The
        // kept prefixes extend none of each other, so their ranges are disjoint and in order.
        let mut minimal: Vec<String> = Vec::with_capacity(sorted.len());
        for prefix in sorted {
            if minimal.last().is_none_or(|kept| !prefix.starts_with(kept.as_str())) {
                minimal.push(prefix);
            }
        }
        minimal.into_iter().flat_map(move |prefix| {
            let low = Key { kind, name: Name::bound(prefix.clone()) };
            let start = match after {
                Some(after) if after.as_str() >= prefix.as_str() => {
                    Bound::Excluded(Key { kind, name: after.clone() })
                }
                _ => Bound::Included(low),
            };
            // Names are ASCII: every name that starts with `prefix` sorts below `prefix` followed
            // by the largest char, and every other name after `prefix` sorts above it.
            let high = Key { kind, name: Name::bound(format!("{prefix}{}", char::MAX)) };
            let range = match &start {
                Bound::Excluded(from) if *from >= high => None,
                _ => Some(self.objects.range((start, Bound::Excluded(high)))),
            };
            range.into_iter().flatten().map(|(key, object)| (key, &**object))
        })
    }

    /// Whether the semaphore is ephemeral (deleted when idle).
    pub fn is_ephemeral(&self, key: &Key) -> bool {
        self.ephemeral.contains(key)
    }

    /// Number of semaphores and elections.
    pub fn object_count(&self) -> usize {
        self.objects.len()
    }

    /// Objects created on behalf of `token` that still exist (the count its cap applies to).
    pub fn objects_created_by(&self, token: TokenId) -> u64 {
        self.created_by.get(&token).map_or(0, |created| created.len() as u64)
    }

    /// The token on whose behalf the object was created, while that token exists.
    pub fn creator_of(&self, key: &Key) -> Option<TokenId> {
        self.creators.get(key).copied()
    }

    /// The cluster's feature version: 1 until a [`Command::SetClusterVersion`] raised it.
    pub fn cluster_version(&self) -> u32 {
        self.cluster_version.max(1)
    }

    /// The cluster's token salt, once set.
    pub fn token_salt(&self) -> Option<&[u8; 32]> {
        self.token_salt.as_ref()
    }

    /// The largest fencing token issued so far.
    pub fn last_token(&self) -> u64 {
        self.last_token
    }

    /// The largest leader time applied so far.
    pub fn now_ms(&self) -> u64 {
        self.now_ms
    }

    /// Log index of the last applied entry.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// The earliest `max_hold_ms` deadline of any hold, in leader time.
    pub fn next_hold_deadline_ms(&self) -> Option<u64> {
        self.hold_deadlines.first().map(|(deadline, _, _)| *deadline)
    }
}

pub(crate) fn emit(effects: &mut Vec<Effect>, event: Event) {
    effects.push(Effect::Event(Box::new(event)));
}

fn capacity_event(key: &Key, capacity: u64) -> Event {
    let mut event = Event::new(EventKind::CapacityChanged);
    event.key = Some(key.clone());
    event.capacity = Some(capacity);
    event
}

fn object_value(objects: &OrdMap<Key, Arc<Semaphore>>, key: &Key, session: SessionId) -> Option<String> {
    objects.get(key)?.holders.get(&session)?.value.clone()
}

fn waiter_of(index: u64, acquire: &Acquire) -> Waiter {
    Waiter {
        session: acquire.session,
        permits: acquire.permits,
        max_hold_ms: acquire.max_hold_ms,
        value: acquire.value.clone(),
        enqueued_index: index,
    }
}

fn same_permits(existing: u64, requested: u64) -> Result<(), Refusal> {
    if existing == requested {
        Ok(())
    } else {
        Err(Refusal::PermitsMismatch { existing, requested })
    }
}

fn out_of_range(field: Field, reason: String) -> Refusal {
    Refusal::InvalidArgument { field, reason }
}

/// Checks a session TTL against [`SESSION_TTL_MS_MIN`] and [`SESSION_TTL_MS_MAX`].
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming `ttl_ms`.
pub fn validate_ttl_ms(ttl_ms: u64) -> Result<(), Refusal> {
    if !(SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX).contains(&ttl_ms) {
        return Err(out_of_range(
            Field::TtlMs,
            format!("{ttl_ms} is not in {SESSION_TTL_MS_MIN}..={SESSION_TTL_MS_MAX}"),
        ));
    }
    Ok(())
}

/// Checks a session name against [`SESSION_NAME_BYTES_MAX`].
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming `name`.
pub fn validate_session_name(name: Option<&str>) -> Result<(), Refusal> {
    match name {
        Some(name) if name.len() > SESSION_NAME_BYTES_MAX => Err(out_of_range(
            Field::SessionName,
            format!("{} bytes, at most {SESSION_NAME_BYTES_MAX}", name.len()),
        )),
        _ => Ok(()),
    }
}

/// Checks a capacity against 1..=[`SEMAPHORE_CAPACITY_MAX`].
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming `capacity`.
pub fn validate_capacity(capacity: u64) -> Result<(), Refusal> {
    if !(1..=SEMAPHORE_CAPACITY_MAX).contains(&capacity) {
        return Err(out_of_range(
            Field::Capacity,
            format!("{capacity} is not in 1..={SEMAPHORE_CAPACITY_MAX}"),
        ));
    }
    Ok(())
}

/// Checks an election's value (a campaign's or a proclaim's) against
/// [`ELECTION_VALUE_BYTES_MAX`].
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming `value`.
pub fn validate_election_value(value: &str) -> Result<(), Refusal> {
    if value.len() > ELECTION_VALUE_BYTES_MAX {
        return Err(out_of_range(
            Field::Value,
            format!("{} bytes, at most {ELECTION_VALUE_BYTES_MAX}", value.len()),
        ));
    }
    Ok(())
}

/// Checks the ranges of an acquire's fields (not against the state).
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming the first field out of range.
pub fn validate_acquire(acquire: &Acquire) -> Result<(), Refusal> {
    if !(1..=SEMAPHORE_CAPACITY_MAX).contains(&acquire.permits) {
        return Err(out_of_range(
            Field::Permits,
            format!("{} is not in 1..={SEMAPHORE_CAPACITY_MAX}", acquire.permits),
        ));
    }
    if let Some(capacity) = acquire.capacity {
        validate_capacity(capacity)?;
    }
    if let Some(ms) = acquire.max_hold_ms {
        if !(MAX_HOLD_MS_MIN..=MAX_HOLD_MS_MAX).contains(&ms) {
            return Err(out_of_range(
                Field::MaxHoldMs,
                format!("{ms} is not in {MAX_HOLD_MS_MIN}..={MAX_HOLD_MS_MAX}"),
            ));
        }
    }
    if let (Kind::Election, Some(value)) = (acquire.key.kind, &acquire.value) {
        validate_election_value(value)?;
    }
    match (acquire.key.kind, &acquire.value) {
        (Kind::Semaphore, Some(_)) => Err(out_of_range(Field::Value, "only elections carry a value".into())),
        (Kind::Election, _) if acquire.permits != 1 || acquire.capacity.is_some_and(|c| c != 1) => {
            Err(out_of_range(Field::Permits, "an election grants exactly 1 permit".into()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod ephemeral_tests {
    use super::*;

    use crate::test_support::{acquire_one as acquire, apply_next as run};

    #[test]
    fn an_ephemeral_semaphore_goes_when_its_last_holder_and_waiter_leave_and_tokens_keep_growing() {
        let mut state = State::default();
        let key = Key::semaphore(Name::new("tmp").unwrap());
        let sessions = (1..=2).map(|i| Command::CreateSession {
            id: SessionId::from_bytes([i; 16]),
            ttl_ms: 1000,
            name: None,
        });
        run(&mut state, sessions.collect());
        let outcomes = run(
            &mut state,
            vec![Command::AcquireEphemeral(acquire(&key, 1)), Command::AcquireEphemeral(acquire(&key, 2))],
        );
        assert_eq!(outcomes[0], Outcome::Acquired { permits: 1, token: 1 });
        assert!(state.is_ephemeral(&key));
        run(&mut state, vec![Command::Release { key: key.clone(), session: SessionId::from_bytes([1; 16]) }]);
        assert!(state.object(&key).is_some(), "the waiter was granted; it stays");
        run(&mut state, vec![Command::CloseSession { id: SessionId::from_bytes([2; 16]) }]);
        assert!(state.object(&key).is_none() && !state.is_ephemeral(&key), "idle: gone");
        let outcomes = run(&mut state, vec![Command::AcquireEphemeral(acquire(&key, 1))]);
        assert_eq!(
            outcomes[0],
            Outcome::Acquired { permits: 1, token: 3 },
            "a new name never repeats a token"
        );
        // A put makes it permanent.
        run(&mut state, vec![Command::PutSemaphore { name: key.name.clone(), capacity: 2 }]);
        run(&mut state, vec![Command::Release { key: key.clone(), session: SessionId::from_bytes([1; 16]) }]);
        assert!(state.object(&key).is_some() && !state.is_ephemeral(&key));
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);
    }
}

#[cfg(test)]
mod list_tests {
    use super::*;

    /// A state with the semaphores and elections named.
    fn with_objects(semaphores: &[String], elections: &[&str]) -> State {
        let session = SessionId::from_bytes([1; 16]);
        let mut commands = vec![Command::CreateSession { id: session, ttl_ms: 1000, name: None }];
        commands.extend(
            semaphores
                .iter()
                .map(|name| Command::PutSemaphore { name: Name::new(name.as_str()).unwrap(), capacity: 1 }),
        );
        commands.extend(elections.iter().map(|name| {
            Command::Acquire(Acquire {
                value: Some(String::new()),
                ..crate::test_support::acquire_one(&Key::election(Name::new(*name).unwrap()), 1)
            })
        }));
        let mut state = State::default();
        state.apply(1, 1, &Batch { now_ms: 0, commands }, &mut Vec::new());
        state
    }

    fn names<'a>(iter: impl Iterator<Item = (&'a Key, &'a Semaphore)>) -> Vec<String> {
        iter.map(|(key, _)| key.name.to_string()).collect()
    }

    /// The cost of a list is the objects under the caller's prefixes: every entry the walk
    /// visits is one it yields (each prefix is one bounded B-tree range), so counting what it
    /// yields counts what it visits; 10 000 other objects add nothing.
    #[test]
    fn a_prefix_walk_visits_only_the_names_under_the_prefixes() {
        let mut semaphores: Vec<String> = (0..10_000).map(|i| format!("other.{i:05}")).collect();
        semaphores.extend(
            ["mine.a", "mine.b", "mine.deep.c", "mind", "mine", "minf.x", "z.1", "y"].map(String::from),
        );
        let state = with_objects(&semaphores, &["mine.e", "other.e"]);
        let walk = |prefixes: &[&str], after: Option<&str>| {
            let after = after.map(|a| Name::new(a).unwrap());
            names(state.objects_in_prefixes(Kind::Semaphore, prefixes, after.as_ref()))
        };
        // Overlapping and repeated prefixes give each name once, in name order.
        let prefixes = ["z.", "mine.", "mine.deep.", "mine.", "nothing."];
        assert_eq!(walk(&prefixes, None), ["mine.a", "mine.b", "mine.deep.c", "z.1"]);
        // Paging: strictly after the cursor, across ranges, and a cursor between or past them.
        assert_eq!(walk(&prefixes, Some("mine.a")), ["mine.b", "mine.deep.c", "z.1"]);
        assert_eq!(walk(&prefixes, Some("mine.deep.c")), ["z.1"]);
        assert_eq!(walk(&prefixes, Some("n")), ["z.1"]);
        assert_eq!(walk(&prefixes, Some("a")), ["mine.a", "mine.b", "mine.deep.c", "z.1"]);
        assert!(walk(&prefixes, Some("zz")).is_empty());
        // A prefix that is itself a name includes it; no prefix, nothing; "" everything.
        assert_eq!(walk(&["mine"], None), ["mine", "mine.a", "mine.b", "mine.deep.c"]);
        assert!(walk(&[], None).is_empty());
        assert_eq!(walk(&[""], None).len(), semaphores.len());
        // Elections are another kind: never in a semaphore walk, and walked alike.
        let elections = names(state.objects_in_prefixes(Kind::Election, &["mine."], None));
        assert_eq!(elections, ["mine.e"]);
        assert_eq!(names(state.objects_in_prefixes(Kind::Election, &[""], None)), ["mine.e", "other.e"]);
    }
}

#[cfg(test)]
mod verify_cost_tests {
    use super::*;

    /// Replaying a log whose entries each add an item: the debug checks must cost O(n) in all,
    /// not the O(n²) of a check after every entry.
    #[test]
    fn debug_invariant_checks_cost_linear_time_in_the_entries_applied() {
        let entries: u64 = 200_000;
        let mut walked: u64 = 0;
        let mut checks = 0;
        for index in 1..=entries {
            let size = index as usize;
            if verify_due(index, size) {
                walked += size as u64;
                checks += 1;
            }
        }
        let per_entry = walked / entries;
        assert!(per_entry <= 4 * VERIFY_EVERY_SIZE as u64, "{per_entry} items walked per entry");
        // Still checked, and after every entry while the state is small.
        assert!(checks > entries / 2_000, "{checks} checks");
        assert!((1..=VERIFY_EVERY_SIZE as u64).all(|index| verify_due(index, index as usize)));
        assert!((0..10).all(|index| verify_due(index, 0)));
    }

    #[test]
    fn a_violation_in_a_small_state_panics_at_the_entry_that_made_it() {
        let mut state = State::default();
        let session = SessionId::from_bytes([1; 16]);
        let batch = Batch {
            now_ms: 0,
            commands: vec![Command::CreateSession { id: session, ttl_ms: 10_000, name: None }],
        };
        state.apply(1, 1, &batch, &mut Vec::new());
        // Corrupt a derived index behind apply's back: the next batch's check must see it.
        state.sessions_per_owner.insert(TokenId::from_bytes([9; 16]), 5);
        let applied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            state.apply(2, 1, &Batch { now_ms: 0, commands: vec![] }, &mut Vec::new())
        }));
        if cfg!(debug_assertions) {
            let message = applied.expect_err("a debug build checks small states after every batch");
            let message = message.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(message.contains("after applying index 2"), "{message}");
        } else {
            assert!(applied.is_ok(), "release builds do not check");
        }
    }
}

#[cfg(test)]
mod feature_version_tests {
    use super::*;

    /// A command that needs a newer feature version than the cluster's is refused and changes
    /// nothing; once a `SetClusterVersion` raised it, the same command applies.
    #[test]
    fn a_command_above_the_cluster_version_is_refused_until_it_is_raised() {
        let mut state = State::default();
        assert_eq!(state.cluster_version(), 1);
        let session = SessionId::from_bytes([1; 16]);
        let key = Key::semaphore(Name::new("db").unwrap());
        let acquire = Acquire {
            key: key.clone(),
            session,
            permits: 1,
            wait: false,
            capacity: Some(1),
            max_hold_ms: None,
            value: None,
        };
        let setup = vec![
            Command::CreateSession { id: session, ttl_ms: 10_000, name: None },
            Command::Acquire(acquire),
        ];
        state.apply(1, 1, &Batch { now_ms: 0, commands: setup }, &mut Vec::new());
        let revoke = Command::Revoke { key: key.clone(), session };
        assert_eq!(revoke.feature_version(), 2);
        let before = state.clone();
        let refused =
            state.apply(2, 1, &Batch { now_ms: 0, commands: vec![revoke.clone()] }, &mut Vec::new());
        assert_eq!(refused, [Outcome::Refused(Refusal::FeatureUnavailable { needs: 2, cluster: 1 })]);
        assert_eq!(state.object(&key), before.object(&key), "nothing changed");
        let raise = Batch { now_ms: 0, commands: vec![Command::SetClusterVersion { version: 2 }, revoke] };
        assert_eq!(raise.feature_version(), 2);
        let outcomes = state.apply(3, 1, &raise, &mut Vec::new());
        assert_eq!(outcomes, [Outcome::ClusterVersionSet { version: 2 }, Outcome::Released { permits: 1 }]);
        let beyond = Batch { now_ms: 0, commands: vec![Command::SetClusterVersion { version: 7 }] };
        assert_eq!(beyond.feature_version(), 7, "a raise needs the version it raises to");
    }
}

#[cfg(test)]
mod proclaim_tests {
    use super::*;

    use crate::test_support::{acquire_one, apply_next as run};

    fn session(id: u8) -> SessionId {
        SessionId::from_bytes([id; 16])
    }

    fn proclaim(key: &Key, id: u8, value: &str) -> Command {
        Command::Proclaim { key: key.clone(), session: session(id), value: value.to_owned() }
    }

    /// A cluster at this build's version, with sessions 1 and 2, session 1 leading `key` with
    /// value "a" and session 2 waiting behind it.
    fn led(key: &Key) -> State {
        let mut state = State::default();
        run(&mut state, vec![Command::SetClusterVersion { version: crate::FEATURE_VERSION }]);
        let mut commands: Vec<Command> =
            (1..=2).map(|i| Command::CreateSession { id: session(i), ttl_ms: 1000, name: None }).collect();
        for i in 1..=2u8 {
            let value = Some(["a", "b"][usize::from(i) - 1].to_owned());
            commands.push(Command::Acquire(Acquire { capacity: None, value, ..acquire_one(key, i) }));
        }
        run(&mut state, commands);
        state
    }

    fn leader(state: &State, key: &Key) -> (SessionId, Hold) {
        let (session, hold) = state.object(key).unwrap().holders.iter().next().unwrap();
        (*session, hold.clone())
    }

    #[test]
    fn the_leader_proclaims_a_new_value_and_keeps_its_hold_token_and_tenure() {
        let key = Key::election(Name::new("sched").unwrap());
        let mut state = led(&key);
        let (_, before) = leader(&state, &key);
        let last_token = state.last_token();
        let mut effects = Vec::new();
        let index = state.applied_index() + 1;
        let batch = Batch { now_ms: 500, commands: vec![proclaim(&key, 1, "b:7376")] };
        let outcomes = state.apply(index, 1, &batch, &mut effects);
        assert_eq!(
            outcomes,
            [Outcome::Proclaimed { token: before.token, granted_at_ms: before.granted_at_ms }]
        );
        let (holder, after) = leader(&state, &key);
        assert_eq!(holder, session(1));
        assert_eq!(after, Hold { value: Some("b:7376".into()), ..before }, "only the value changed");
        assert_eq!(state.object(&key).unwrap().modified_index, index, "watchers see a change");
        assert!(effects.contains(&Effect::ObjectChanged { key: key.clone() }), "watchers wake: {effects:?}");
        let events: Vec<&Event> = effects
            .iter()
            .filter_map(|effect| match effect {
                Effect::Event(event) => Some(&**event),
                _ => None,
            })
            .collect();
        assert_eq!(events.len(), 1, "{events:?}");
        let event = events[0];
        assert_eq!(event.kind, EventKind::Proclaimed, "not a leader change: the tenure goes on");
        assert_eq!(
            (event.key.as_ref(), event.session, event.token, event.value.as_deref()),
            (Some(&key), Some(session(1)), Some(before.token), Some("b:7376"))
        );
        assert_eq!(state.last_token(), last_token, "no token was drawn");
        assert_eq!(State::decode_snapshot(&state.encode_snapshot()).unwrap(), state);

        // The same value again changes nothing and wakes nobody.
        let unchanged = state.clone();
        let mut effects = Vec::new();
        let batch = Batch { now_ms: 600, commands: vec![proclaim(&key, 1, "b:7376")] };
        let outcomes = state.apply(index + 1, 1, &batch, &mut effects);
        assert!(matches!(outcomes[0], Outcome::Proclaimed { .. }));
        assert!(effects.is_empty(), "{effects:?}");
        assert_eq!(state.object(&key), unchanged.object(&key));
    }

    #[test]
    fn only_the_leader_may_proclaim_and_a_refusal_changes_nothing() {
        let key = Key::election(Name::new("sched").unwrap());
        let mut state = led(&key);
        let before = state.clone();
        let other = Key::election(Name::new("nobody").unwrap());
        let semaphore = Key::semaphore(Name::new("sched").unwrap());
        let too_long = "x".repeat(ELECTION_VALUE_BYTES_MAX + 1);
        let cases = [
            (proclaim(&key, 2, "c"), "a waiting candidate"),
            (proclaim(&other, 1, "c"), "an election nobody campaigns in"),
            (proclaim(&key, 9, "c"), "an unknown session"),
            (proclaim(&key, 1, &too_long), "a value too long"),
            (proclaim(&semaphore, 1, "c"), "a semaphore"),
        ];
        let mut refusals = Vec::new();
        for (command, what) in cases {
            let mut effects = Vec::new();
            let index = state.applied_index() + 1;
            let outcome = state.apply(index, 1, &Batch { now_ms: 0, commands: vec![command] }, &mut effects);
            let [Outcome::Refused(refusal)] = &outcome[..] else { panic!("{what}: {outcome:?}") };
            refusals.push(refusal.clone());
            assert!(effects.is_empty(), "{what}: {effects:?}");
            assert_eq!(state.object(&key), before.object(&key), "{what} changed nothing");
            assert!(state.object(&other).is_none(), "{what} created nothing");
        }
        assert_eq!(&refusals[..3], [Refusal::NotLeader, Refusal::NotLeader, Refusal::SessionNotFound]);
        assert!(matches!(refusals[3], Refusal::InvalidArgument { field: Field::Value, .. }), "{refusals:?}");
        assert!(matches!(refusals[4], Refusal::InvalidArgument { field: Field::Value, .. }), "{refusals:?}");
        // A value of exactly the limit is a campaign's limit too.
        let limit = "x".repeat(ELECTION_VALUE_BYTES_MAX);
        assert!(matches!(run(&mut state, vec![proclaim(&key, 1, &limit)])[0], Outcome::Proclaimed { .. }));
    }

    #[test]
    fn a_proclaim_needs_version_3_and_the_next_leader_publishes_its_own_value() {
        let key = Key::election(Name::new("sched").unwrap());
        let mut state = led(&key);
        assert_eq!(proclaim(&key, 1, "c").feature_version(), 3);
        let mut old = State::default();
        run(&mut old, vec![Command::CreateSession { id: session(1), ttl_ms: 1000, name: None }]);
        let campaign = Acquire { capacity: None, value: Some("a".into()), ..acquire_one(&key, 1) };
        run(&mut old, vec![Command::Acquire(campaign)]);
        let refused = run(&mut old, vec![proclaim(&key, 1, "c")]);
        assert_eq!(refused, [Outcome::Refused(Refusal::FeatureUnavailable { needs: 3, cluster: 1 })]);
        assert_eq!(leader(&old, &key).1.value.as_deref(), Some("a"));

        // The proclaimed value goes with the leadership: the next leader publishes its campaign's.
        run(&mut state, vec![proclaim(&key, 1, "c")]);
        run(&mut state, vec![Command::Release { key: key.clone(), session: session(1) }]);
        let (holder, hold) = leader(&state, &key);
        assert_eq!((holder, hold.value.as_deref()), (session(2), Some("b")));
    }
}
