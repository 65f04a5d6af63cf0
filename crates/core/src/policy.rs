//! Semaphore policies: a rate next to the capacity (a generic cell rate algorithm on leader
//! time), lock-delay (the permits of a failed hold stay out of circulation for a while), a cap
//! of permits per group, and takes (`Command::Take`): rate permits asked for without a session,
//! which wait in the semaphore's FIFO queue like acquires and hold nothing once served.
//!
//! A semaphore's policy lives beside it (`State::policies`), not inside [`Semaphore`], so that
//! semaphores without one are encoded as before and pay nothing: every check here starts with a
//! lookup that finds no policy. A policy entry exists while it has a setting or runtime state
//! (a rate, a delay, a group cap, delayed permits, a grouped holder or waiter, a waiting take)
//! and is removed when it has none, so equal states have equal entries.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::limits::*;
use crate::outcome::{Effect, Event, EventKind, Field, Outcome, Refusal, WaitEndReason};
use crate::semaphore::{Semaphore, Waiter};
use crate::state::emit;
use crate::{Key, Name, SessionId, State};

/// A rate: at most `burst` permits at once, `permits` per `per_ms` sustained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    /// Permits per period.
    pub permits: u64,
    /// The period, in leader ms.
    pub per_ms: u64,
    /// Most permits granted at once.
    pub burst: u64,
}

/// What a `PUT` changes of a semaphore's policy; each `None` keeps the current setting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyChange {
    /// `Some(None)` removes the rate.
    pub rate: Option<Option<Rate>>,
    /// The lock-delay in ms (0: none).
    pub lock_delay_ms: Option<u64>,
    /// `Some(None)` removes the cap.
    pub group_max: Option<Option<u64>>,
}

impl PolicyChange {
    /// Whether the change changes nothing (a plain capacity `PUT`).
    pub fn is_empty(&self) -> bool {
        self.rate.is_none() && self.lock_delay_ms.is_none() && self.group_max.is_none()
    }
}

/// Permits of a failed hold kept out of circulation until `until_ms` (leader time).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delayed {
    /// The permits.
    pub permits: u64,
    /// When they return.
    pub until_ms: u64,
}

/// The policy and policy state of one semaphore.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The rate, if any.
    pub rate: Option<Rate>,
    /// The rate's theoretical arrival time, in leader ms scaled by `rate.permits` (so that a
    /// period that `permits` does not divide costs no rounding): the rate is spent up to here.
    pub tat: u128,
    /// Lock-delay in leader ms (0: none).
    pub lock_delay_ms: u64,
    /// Delayed permits, soonest first.
    pub delayed: Vec<Delayed>,
    /// Most permits one group may hold.
    pub group_max: Option<u64>,
    /// The group of each holder and waiter that named one.
    pub groups: BTreeMap<SessionId, Name>,
    /// Waiting takes: their id (which stands in the queue where a session would) and the leader
    /// time at which their wait ends.
    pub takers: BTreeMap<SessionId, u64>,
    /// Derived: permits held per group (groups holding none are absent).
    #[serde(skip)]
    pub(crate) group_held: BTreeMap<Name, u64>,
    /// Derived: `takers` by deadline.
    #[serde(skip)]
    pub(crate) taker_deadlines: BTreeSet<(u64, SessionId)>,
}

impl Policy {
    /// Whether nothing is set and nothing is in progress: the entry can go.
    fn is_empty(&self) -> bool {
        self.rate.is_none()
            && self.lock_delay_ms == 0
            && self.delayed.is_empty()
            && self.group_max.is_none()
            && self.groups.is_empty()
            && self.takers.is_empty()
    }

    /// Permits the lock-delay keeps out of circulation.
    pub fn delayed_permits(&self) -> u64 {
        self.delayed.iter().map(|delayed| delayed.permits).sum()
    }

    /// Permits held by `group`'s holders.
    pub fn group_held(&self, group: &Name) -> u64 {
        self.group_held.get(group).copied().unwrap_or(0)
    }

    /// Holdings per group, in group order.
    pub fn groups_held(&self) -> impl Iterator<Item = (&Name, u64)> {
        self.group_held.iter().map(|(group, held)| (group, *held))
    }

    /// Whether `session`'s acquire of `permits` would put its group over the cap.
    fn group_capped(&self, session: SessionId, permits: u64) -> bool {
        match (self.group_max, self.groups.get(&session)) {
            (Some(max), Some(group)) => self.group_held(group) + permits > max,
            _ => false,
        }
    }

    /// Whether every waiter of `object` is passed over (an acquire whose group is at its cap),
    /// so that a newcomer goes first without breaking FIFO for anyone.
    fn passes_over_all(&self, object: &Semaphore) -> bool {
        object.queue.iter().all(|waiter| {
            !self.takers.contains_key(&waiter.session) && self.group_capped(waiter.session, waiter.permits)
        })
    }

    /// The first waiter of `object` after sequence number `after` that is not passed over, with
    /// its sequence number and, when it fits the capacity beside the delayed permits (a take
    /// always does), the leader time at which the rate grants it.
    fn first_in_line(&self, object: &Semaphore, after: Option<u64>) -> Option<(u64, SessionId, Option<u64>)> {
        let delayed = self.delayed_permits();
        let (seq, waiter) = object.queue.entries_after(after).find(|(_, waiter)| {
            self.takers.contains_key(&waiter.session) || !self.group_capped(waiter.session, waiter.permits)
        })?;
        let fits = self.takers.contains_key(&waiter.session)
            || object.held + delayed + waiter.permits <= object.capacity;
        Some((seq, waiter.session, fits.then(|| self.rate_ready_ms(waiter.permits))))
    }

    /// Rebuilds the derived indexes from `object`'s holders.
    pub(crate) fn reindex(&mut self, object: &Semaphore) {
        self.group_held.clear();
        for (session, group) in &self.groups {
            if let Some(hold) = object.holders.get(session) {
                *self.group_held.entry(group.clone()).or_default() += hold.permits;
            }
        }
        self.taker_deadlines = self.takers.iter().map(|(taker, deadline)| (*deadline, *taker)).collect();
    }

    /// Whether the rate (if any) grants `permits` at leader time `now_ms`.
    pub fn rate_allows(&self, permits: u64, now_ms: u64) -> bool {
        self.rate_wait_ms(permits, now_ms) == 0
    }

    /// Leader ms until the rate grants `permits` (0: now).
    pub fn rate_wait_ms(&self, permits: u64, now_ms: u64) -> u64 {
        self.rate_ready_ms(permits).saturating_sub(now_ms)
    }

    /// The earliest leader time at which the rate grants `permits` (`permits` ≤ `burst`): the
    /// grant moves the arrival time to `max(tat, now) + permits × interval`, which may be at most
    /// `now + burst × interval`. It depends on the state alone, not on the time of asking.
    pub fn rate_ready_ms(&self, permits: u64) -> u64 {
        let Some(rate) = self.rate else { return 0 };
        if permits > rate.burst {
            // More than the burst never fits: the grant's arrival time would pass the limit
            // whenever it came.
            return u64::MAX;
        }
        let (p, interval, burst) =
            (u128::from(rate.permits), u128::from(rate.per_ms), u128::from(rate.burst));
        let after = self.tat + u128::from(permits) * interval;
        let slack = burst * interval;
        if after <= slack {
            return 0;
        }
        u64::try_from((after - slack).div_ceil(p)).unwrap_or(u64::MAX)
    }

    /// Permits the rate would grant at once at `now_ms` (at most `burst`), and the leader ms until
    /// one more would be granted when it grants none. `None` without a rate.
    pub fn rate_state(&self, now_ms: u64) -> Option<(u64, u64)> {
        let rate = self.rate?;
        let (p, interval, burst) =
            (u128::from(rate.permits), u128::from(rate.per_ms), u128::from(rate.burst));
        let now = u128::from(now_ms) * p;
        let room = (now + burst * interval).saturating_sub(self.tat.max(now));
        let available = u64::try_from(room / interval).unwrap_or(u64::MAX).min(rate.burst);
        let next = if available > 0 { 0 } else { self.rate_wait_ms(1, now_ms) };
        Some((available, next))
    }

    /// Spends the rate for `permits` granted at `now_ms`. The caller checked [`Policy::rate_allows`].
    fn spend(&mut self, permits: u64, now_ms: u64) {
        if let Some(rate) = self.rate {
            assert!(self.rate_allows(permits, now_ms), "a grant beyond the rate");
            let now = u128::from(now_ms) * u128::from(rate.permits);
            self.tat = self.tat.max(now) + u128::from(permits) * u128::from(rate.per_ms);
        }
    }

    /// Sets a new rate, keeping what was spent: the spent time carries over to the new scale,
    /// rounded up, so that a change never grants early.
    fn set_rate(&mut self, rate: Option<Rate>) {
        self.tat = match (self.rate, rate) {
            (Some(old), Some(new)) => (self.tat * u128::from(new.permits)).div_ceil(u128::from(old.permits)),
            _ => 0,
        };
        self.rate = rate;
    }

    /// The leader time at which something in the policy is due: a delay ends, a take's wait ends.
    fn next_timer_ms(&self) -> Option<u64> {
        let delay = self.delayed.first().map(|delayed| delayed.until_ms);
        let taker = self.taker_deadlines.first().map(|(deadline, _)| *deadline);
        delay.into_iter().chain(taker).min()
    }
}

/// Checks a policy change: every field in range.
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming the field.
pub fn validate_policy_change(change: &PolicyChange) -> Result<(), Refusal> {
    if let Some(Some(rate)) = change.rate {
        validate_rate(&rate)?;
    }
    if let Some(ms) = change.lock_delay_ms {
        if ms > LOCK_DELAY_MS_MAX {
            return Err(invalid(Field::LockDelayMs, format!("{ms} is not in 0..={LOCK_DELAY_MS_MAX}")));
        }
    }
    if let Some(Some(max)) = change.group_max {
        if !(1..=SEMAPHORE_CAPACITY_MAX).contains(&max) {
            return Err(invalid(Field::GroupMax, format!("{max} is not in 1..={SEMAPHORE_CAPACITY_MAX}")));
        }
    }
    Ok(())
}

/// Checks a rate's fields.
///
/// # Errors
/// [`Refusal::InvalidArgument`] naming the field.
pub fn validate_rate(rate: &Rate) -> Result<(), Refusal> {
    if !(1..=RATE_PERMITS_MAX).contains(&rate.permits) {
        return Err(invalid(
            Field::Rate,
            format!("permits {} is not in 1..={RATE_PERMITS_MAX}", rate.permits),
        ));
    }
    if !(1..=RATE_PER_MS_MAX).contains(&rate.per_ms) {
        return Err(invalid(Field::Rate, format!("per_ms {} is not in 1..={RATE_PER_MS_MAX}", rate.per_ms)));
    }
    if !(1..=RATE_PERMITS_MAX).contains(&rate.burst) {
        return Err(invalid(Field::Rate, format!("burst {} is not in 1..={RATE_PERMITS_MAX}", rate.burst)));
    }
    Ok(())
}

/// Checks a group name: 1..=64 bytes of `[A-Za-z0-9._:-]`.
///
/// # Errors
/// [`Refusal::InvalidArgument`] on the `group` field.
pub fn validate_group(group: &str) -> Result<Name, Refusal> {
    let good = (1..=GROUP_BYTES_MAX).contains(&group.len())
        && group.bytes().all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b));
    if !good {
        return Err(invalid(
            Field::Group,
            format!("{group:?} is not 1-{GROUP_BYTES_MAX} bytes of [A-Za-z0-9._:-]"),
        ));
    }
    Name::new(group).map_err(|error| invalid(Field::Group, error.to_string()))
}

/// Checks a take's permits.
///
/// # Errors
/// [`Refusal::InvalidArgument`] when out of range.
pub fn validate_take(permits: u64, wait_ms: u64) -> Result<(), Refusal> {
    if !(1..=RATE_PERMITS_MAX).contains(&permits) {
        return Err(invalid(Field::Permits, format!("{permits} is not in 1..={RATE_PERMITS_MAX}")));
    }
    if wait_ms > TAKE_WAIT_MS_MAX {
        return Err(invalid(Field::WaitMs, format!("{wait_ms} is not in 0..={TAKE_WAIT_MS_MAX}")));
    }
    Ok(())
}

fn invalid(field: Field, reason: String) -> Refusal {
    Refusal::InvalidArgument { field, reason }
}

/// Why no more of a policy semaphore's queue is granted.
enum Blocked {
    /// Nothing to grant: the queue is empty, or every waiter is passed over.
    Nothing,
    /// The first waiter not passed over does not fit the capacity (with the delayed permits).
    Capacity,
    /// The first waiter not passed over fits but must wait for the rate, until this leader time.
    Rate(u64),
}

impl State {
    /// The policy of the semaphore `key`, if it has one.
    pub fn policy(&self, key: &Key) -> Option<&Policy> {
        self.policies.get(key).map(|policy| &**policy)
    }

    /// The semaphores that have a policy, in key order.
    pub fn policies(&self) -> impl Iterator<Item = (&Key, &Policy)> {
        self.policies.iter().map(|(key, policy)| (key, &**policy))
    }

    /// The earliest leader time at which a `PolicyTick` has something to do.
    pub fn next_policy_due_ms(&self) -> Option<u64> {
        self.policy_due.first().map(|(at, _)| *at)
    }

    /// The policy to change, created empty if the semaphore has none.
    fn policy_mut(&mut self, key: &Key) -> &mut Policy {
        Arc::make_mut(self.policies.entry(key.clone()).or_default())
    }

    /// Whether `waiter` is a take rather than a session's acquire.
    pub(crate) fn is_taker(&self, key: &Key, waiter: SessionId) -> bool {
        self.policies.get(key).is_some_and(|policy| policy.takers.contains_key(&waiter))
    }

    /// Creates the semaphore or sets its capacity (as `PutSemaphore`), then changes its policy.
    pub(crate) fn put_semaphore_policy(
        &mut self,
        index: u64,
        name: &Name,
        capacity: u64,
        change: &PolicyChange,
        creator: Option<&crate::Creator>,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_policy_change(change)?;
        let outcome = self.put_semaphore(index, name, capacity, creator, effects)?;
        let key = Key::semaphore(name.clone());
        let policy = self.policy_mut(&key);
        if let Some(rate) = change.rate {
            policy.set_rate(rate);
        }
        if let Some(ms) = change.lock_delay_ms {
            policy.lock_delay_ms = ms;
        }
        if let Some(max) = change.group_max {
            policy.group_max = max;
        }
        // Waits that the new rate can never serve (more than its burst) end now, as waits
        // beyond a shrunk capacity do.
        let burst = policy.rate.map(|rate| rate.burst);
        let doomed: Vec<SessionId> = match burst {
            Some(burst) => {
                let object = self.objects.get(&key).expect("put above");
                object
                    .queue
                    .iter()
                    .filter(|waiter| waiter.permits > burst)
                    .map(|waiter| waiter.session)
                    .collect()
            }
            None => Vec::new(),
        };
        for waiter in doomed {
            if !self.end_take(&key, waiter, effects) {
                self.end_wait_beyond_burst(&key, waiter, effects);
            }
        }
        self.settle_policy(&key);
        self.touch(index, &key, effects);
        self.pump(index, &key, effects);
        self.schedule_policy(&key, self.rate_turn(&key), effects);
        Ok(outcome)
    }

    /// Records the group that `session`'s acquire names, before the acquire is granted or queued.
    pub(crate) fn record_group(&mut self, key: &Key, session: SessionId, group: &Name) {
        let policy = self.policy_mut(key);
        policy.groups.insert(session, group.clone());
    }

    /// Whether an acquire of `permits` by `session` (whose group is recorded) is granted at once:
    /// it fits the capacity beside the delayed permits, its group is under the cap, the rate
    /// allows it, and every waiter before it is passed over (its group at the cap). Without a
    /// policy: the queue is empty and the permits fit.
    pub(crate) fn grantable_now(&self, key: &Key, session: SessionId, permits: u64) -> bool {
        let Some(object) = self.objects.get(key) else { return false };
        let Some(policy) = self.policies.get(key) else {
            return object.queue.is_empty() && object.fits(permits);
        };
        policy.passes_over_all(object)
            && object.held + policy.delayed_permits() + permits <= object.capacity
            && !policy.group_capped(session, permits)
            && policy.rate_allows(permits, self.now_ms)
    }

    /// The first waiter, in queue order after `after`, that may be granted now, or why none may.
    fn next_grant(&self, key: &Key, after: Option<u64>) -> Result<(u64, SessionId), Blocked> {
        let object = self.objects.get(key).expect("pumped object exists");
        let policy = self.policies.get(key).expect("a policy semaphore");
        match policy.first_in_line(object, after) {
            None => Err(Blocked::Nothing),
            Some((_, _, None)) => Err(Blocked::Capacity),
            Some((seq, session, Some(ready))) if ready <= self.now_ms => Ok((seq, session)),
            Some((_, _, Some(ready))) => Err(Blocked::Rate(ready)),
        }
    }

    /// [`State::pump`] for a semaphore with a policy: grants in queue order, passing over waiters
    /// whose group is at its cap, until a waiter does not fit or must wait for the rate.
    pub(crate) fn pump_policy(&mut self, index: u64, key: &Key, effects: &mut Vec<Effect>) {
        let mut after = None;
        let blocked = loop {
            match self.next_grant(key, after) {
                Ok((seq, session)) => {
                    after = Some(seq);
                    let object = self.object_mut(key).expect("a policy semaphore exists");
                    let waiter = object.queue.remove(session).expect("listed by next_grant");
                    if self.is_taker(key, session) {
                        self.serve_take(index, key, waiter, effects);
                    } else {
                        let session_state =
                            self.sessions.get_mut(&waiter.session).expect("a waiter's session exists");
                        session_state.waits.remove(key);
                        effects.push(Effect::WaitEnded { key: key.clone(), session: waiter.session });
                        self.grant(index, key, waiter, true, effects);
                    }
                }
                Err(blocked) => break blocked,
            }
        };
        let rate_turn = match blocked {
            Blocked::Rate(at) => Some(at),
            Blocked::Capacity | Blocked::Nothing => None,
        };
        // Served takes and granted waits may leave nothing in the policy.
        self.settle_policy(key);
        // What `rate_turn` finds from the head: the waiters passed over stay passed over.
        debug_assert_eq!(rate_turn.filter(|_| self.policies.contains_key(key)), self.rate_turn(key));
        self.schedule_policy(key, rate_turn, effects);
    }

    /// Spends the rate and records the group's holding of a grant (called by `grant`).
    pub(crate) fn policy_granted(&mut self, key: &Key, session: SessionId, permits: u64) {
        let now_ms = self.now_ms;
        let Some(policy) = self.policies.get_mut(key).map(Arc::make_mut) else { return };
        policy.spend(permits, now_ms);
        if let Some(group) = policy.groups.get(&session).cloned() {
            let held = policy.group_held.entry(group).or_default();
            *held += permits;
            if let Some(max) = policy.group_max {
                assert!(*held <= max, "a grant over the group cap");
            }
        }
    }

    /// Forgets the group of a hold or wait of `session` that ended; `held` permits leave the
    /// group's holdings (0 for a wait). A hold that `failed` (expired or revoked) leaves its
    /// permits delayed for the lock-delay.
    pub(crate) fn policy_hold_or_wait_ended(
        &mut self,
        key: &Key,
        session: SessionId,
        held: u64,
        failed: bool,
        event: Option<&mut Event>,
    ) {
        let now_ms = self.now_ms;
        let Some(policy) = self.policies.get_mut(key).map(Arc::make_mut) else { return };
        if let Some(group) = policy.groups.remove(&session) {
            if held > 0 {
                let left = policy.group_held.get_mut(&group).expect("a holding group is counted");
                *left -= held;
                if *left == 0 {
                    policy.group_held.remove(&group);
                }
            }
        }
        if failed && held > 0 && policy.lock_delay_ms > 0 {
            let until_ms = now_ms.saturating_add(policy.lock_delay_ms);
            let at = policy.delayed.partition_point(|delayed| delayed.until_ms <= until_ms);
            policy.delayed.insert(at, Delayed { permits: held, until_ms });
            if let Some(event) = event {
                event.delay_ms = Some(policy.lock_delay_ms);
            }
        }
        self.settle_policy(key);
    }

    /// Removes the policy of `key` if nothing is set or in progress any more, with its place in
    /// the due index: an entry exists only while it means something.
    pub(crate) fn settle_policy(&mut self, key: &Key) {
        if self.policies.get(key).is_some_and(|policy| policy.is_empty()) {
            self.forget_policy(key);
        }
    }

    /// A take of the semaphore `name`'s rate, by the take `taker` (an id the server drew).
    pub(crate) fn take(
        &mut self,
        index: u64,
        name: &Name,
        taker: SessionId,
        permits: u64,
        wait_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        validate_take(permits, wait_ms)?;
        let key = Key::semaphore(name.clone());
        let object = self.objects.get(&key).ok_or(Refusal::SemaphoreNotFound)?;
        let policy = self.policies.get(&key);
        let Some(rate) = policy.and_then(|policy| policy.rate) else {
            return Ok(self.taken(&key, permits, effects));
        };
        let policy = policy.expect("has a rate");
        if permits > rate.burst {
            return Err(Refusal::PermitsExceedCapacity { permits, capacity: rate.burst });
        }
        if self.sessions.contains_key(&taker) || object.queue.get(taker).is_some() {
            return Err(invalid(Field::Permits, "the take's id is in use".into()));
        }
        let wait = policy.rate_wait_ms(permits, self.now_ms);
        if policy.passes_over_all(object) && wait == 0 {
            let now_ms = self.now_ms;
            self.policy_mut(&key).spend(permits, now_ms);
            let outcome = self.taken(&key, permits, effects);
            self.schedule_policy(&key, None, effects);
            return Ok(outcome);
        }
        if wait_ms == 0 {
            let mut event = Event::new(EventKind::RateLimited);
            event.key = Some(key.clone());
            event.permits = Some(permits);
            emit(effects, event);
            return Err(Refusal::RateLimited { retry_after_ms: wait.max(1) });
        }
        if object.queue.len() >= WAITERS_PER_OBJECT_MAX {
            return Err(Refusal::LimitExceeded(crate::Limit::WaitersPerObject));
        }
        let deadline = self.now_ms.saturating_add(wait_ms);
        let policy = self.policy_mut(&key);
        policy.takers.insert(taker, deadline);
        policy.taker_deadlines.insert((deadline, taker));
        let waiter =
            Waiter { session: taker, permits, max_hold_ms: None, value: None, enqueued_index: index };
        self.object_mut(&key).expect("checked above").queue.push(waiter);
        self.touch(index, &key, effects);
        // The head may have come due since the last pump; the take may be served right away.
        self.pump_policy(index, &key, effects);
        let served = effects.iter().rev().find_map(|effect| match effect {
            Effect::Taken { key: taken, taker: who, token } if *who == taker && *taken == key => Some(*token),
            _ => None,
        });
        Ok(match served {
            Some(token) => Outcome::Taken { token },
            None => Outcome::TakeWaiting,
        })
    }

    /// A take served at once: a token, an event, and nothing held.
    fn taken(&mut self, key: &Key, permits: u64, effects: &mut Vec<Effect>) -> Outcome {
        self.last_token += 1;
        let token = self.last_token;
        let mut event = Event::new(EventKind::Taken);
        event.key = Some(key.clone());
        event.permits = Some(permits);
        event.token = Some(token);
        emit(effects, event);
        Outcome::Taken { token }
    }

    /// Serves a waiting take that `pump_policy` took off the queue.
    fn serve_take(&mut self, index: u64, key: &Key, waiter: Waiter, effects: &mut Vec<Effect>) {
        let now_ms = self.now_ms;
        let policy = self.policy_mut(key);
        let deadline = policy.takers.remove(&waiter.session).expect("a waiting take");
        policy.taker_deadlines.remove(&(deadline, waiter.session));
        policy.spend(waiter.permits, now_ms);
        let Outcome::Taken { token } = self.taken(key, waiter.permits, effects) else { unreachable!() };
        effects.push(Effect::Taken { key: key.clone(), taker: waiter.session, token });
        effects.push(Effect::WaitEnded { key: key.clone(), session: waiter.session });
        self.touch(index, key, effects);
    }

    /// Ends a waiting take without serving it (its wait ran out, or its client stopped waiting).
    fn end_take(&mut self, key: &Key, taker: SessionId, effects: &mut Vec<Effect>) -> bool {
        let Some(policy) = self.policies.get(key) else { return false };
        let Some(&deadline) = policy.takers.get(&taker) else { return false };
        let policy = self.policy_mut(key);
        policy.takers.remove(&taker);
        policy.taker_deadlines.remove(&(deadline, taker));
        let waiter = self
            .object_mut(key)
            .expect("a policy semaphore exists")
            .queue
            .remove(taker)
            .expect("a take waits");
        let mut event = Event::new(EventKind::RateLimited);
        event.key = Some(key.clone());
        event.permits = Some(waiter.permits);
        event.reason = Some(WaitEndReason::Timeout);
        emit(effects, event);
        effects.push(Effect::WaitEnded { key: key.clone(), session: taker });
        self.settle_policy(key);
        true
    }

    /// Ends the wait of `session`'s acquire, which asks for more than the new rate's burst.
    fn end_wait_beyond_burst(&mut self, key: &Key, session: SessionId, effects: &mut Vec<Effect>) {
        let waiter = self.object_mut(key).expect("exists").queue.remove(session).expect("queued");
        self.policy_hold_or_wait_ended(key, session, 0, false, None);
        let session_state = self.sessions.get_mut(&session).expect("a waiter's session exists");
        session_state.waits.remove(key);
        effects.push(Effect::WaitEnded { key: key.clone(), session });
        let mut event = Event::new(EventKind::WaitEnded);
        event.key = Some(key.clone());
        event.session = Some(session);
        event.session_name = session_state.name.clone();
        event.permits = Some(waiter.permits);
        event.reason = Some(WaitEndReason::Cancelled);
        emit(effects, event);
    }

    /// Refuses an acquire of more permits than the semaphore's rate grants at once.
    pub(crate) fn check_burst(&self, key: &Key, permits: u64) -> Result<(), Refusal> {
        match self.policies.get(key).and_then(|policy| policy.rate) {
            Some(rate) if permits > rate.burst => {
                Err(Refusal::PermitsExceedCapacity { permits, capacity: rate.burst })
            }
            _ => Ok(()),
        }
    }

    /// Ends a waiting take at its client's request.
    pub(crate) fn cancel_take(
        &mut self,
        index: u64,
        name: &Name,
        taker: SessionId,
        effects: &mut Vec<Effect>,
    ) -> Result<Outcome, Refusal> {
        let key = Key::semaphore(name.clone());
        if !self.objects.contains_key(&key) {
            return Err(Refusal::SemaphoreNotFound);
        }
        let waiting = self.end_take(&key, taker, effects);
        if waiting {
            self.touch(index, &key, effects);
            self.pump(index, &key, effects);
        }
        Ok(Outcome::TakeCancelled { waiting })
    }

    /// Ends the delays and take waits that are due, and grants what that (and the passing of
    /// leader time, for the rate) allows.
    pub(crate) fn policy_tick(&mut self, index: u64, effects: &mut Vec<Effect>) -> Outcome {
        let due: Vec<Key> = self
            .policy_due
            .iter()
            .take_while(|(at, _)| *at <= self.now_ms)
            .take(POLICY_TICK_KEYS_MAX)
            .map(|(_, key)| key.clone())
            .collect();
        let now_ms = self.now_ms;
        for key in &due {
            let Some(policy) = self.policies.get(key) else {
                // Not reachable: a policy leaves the due index with its entry (`forget_policy`).
                self.schedule_policy(key, None, effects);
                continue;
            };
            let ended: Vec<Delayed> =
                policy.delayed.iter().take_while(|d| d.until_ms <= now_ms).copied().collect();
            let expired: Vec<SessionId> = policy
                .taker_deadlines
                .iter()
                .take_while(|(deadline, _)| *deadline <= now_ms)
                .map(|(_, taker)| *taker)
                .collect();
            if !ended.is_empty() {
                let policy = self.policy_mut(key);
                policy.delayed.drain(..ended.len());
                for delayed in &ended {
                    let mut event = Event::new(EventKind::DelayEnded);
                    event.key = Some(key.clone());
                    event.permits = Some(delayed.permits);
                    emit(effects, event);
                }
            }
            for taker in expired {
                self.end_take(key, taker, effects);
            }
            self.settle_policy(key);
            self.touch(index, key, effects);
            self.pump(index, key, effects);
            // Filed again by the pump when the policy stays; otherwise nothing is due.
            self.schedule_policy(key, self.rate_turn(key), effects);
        }
        Outcome::PoliciesTicked { semaphores: due.len() as u64 }
    }

    /// Re-files `key` in the due index: at the earliest of its next delay end, take deadline and
    /// (when its head waits for the rate) the rate's turn.
    pub(crate) fn schedule_policy(&mut self, key: &Key, rate_turn: Option<u64>, effects: &mut Vec<Effect>) {
        let at = self
            .policies
            .get(key)
            .and_then(|policy| policy.next_timer_ms().into_iter().chain(rate_turn).min());
        debug_assert_eq!(at, self.policy_due_of(key));
        let old = match at {
            Some(at) => self.policy_due_at.insert(key.clone(), at),
            None => self.policy_due_at.remove(key),
        };
        if old == at {
            return;
        }
        if let Some(old) = old {
            self.policy_due.remove(&(old, key.clone()));
        }
        if let Some(at) = at {
            self.policy_due.insert((at, key.clone()));
            effects.push(Effect::PolicyDueSet { at_ms: at });
        }
    }

    /// When the first waiter that is not passed over waits only for the rate: its turn. From
    /// the state alone (not the time), so that the due index is the same on every replica and
    /// after a snapshot: a turn already past is due at once.
    pub(crate) fn rate_turn(&self, key: &Key) -> Option<u64> {
        let (object, policy) = (self.objects.get(key)?, self.policies.get(key)?);
        policy.rate?;
        policy.first_in_line(object, None)?.2
    }

    /// When `key`'s policy has something due (see [`State::schedule_policy`]), from the state.
    pub(crate) fn policy_due_of(&self, key: &Key) -> Option<u64> {
        let timer = self.policies.get(key)?.next_timer_ms();
        timer.into_iter().chain(self.rate_turn(key)).min()
    }

    /// Removes the policy of a semaphore (deleted, or with nothing left in its policy).
    pub(crate) fn forget_policy(&mut self, key: &Key) {
        self.policies.remove(key);
        if let Some(at) = self.policy_due_at.remove(key) {
            self.policy_due.remove(&(at, key.clone()));
        }
    }

    /// Rebuilds the due index of every policy (after a snapshot decode): the rate turns of heads
    /// blocked by the rate are included, as a pump would file them.
    pub(crate) fn reindex_policies(&mut self) {
        let keys: Vec<Key> = self.policies.keys().cloned().collect();
        for key in keys {
            let object = self.objects.get(&key).cloned();
            if let (Some(object), Some(policy)) = (object, self.policies.get_mut(&key).map(Arc::make_mut)) {
                policy.reindex(&object);
            }
            let rate_turn = self.rate_turn(&key);
            self.schedule_policy(&key, rate_turn, &mut Vec::new());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Acquire, Batch, Command, Outcome};

    fn sid(i: u8) -> SessionId {
        SessionId::from_bytes([i; 16])
    }

    fn api() -> Name {
        Name::new("api").unwrap()
    }

    /// A state at cluster version 5 with sessions 1..=6 and the semaphore `api` of `capacity`
    /// under `change`.
    fn with_policy(capacity: u64, change: PolicyChange) -> State {
        let mut state = State::default();
        let mut commands = vec![Command::SetClusterVersion { version: 5 }];
        for i in 1..=6 {
            commands.push(Command::CreateSession { id: sid(i), ttl_ms: 60_000, name: None });
        }
        commands.push(Command::PutSemaphorePolicy { name: api(), capacity, policy: change, creator: None });
        at(&mut state, 0, commands);
        state
    }

    /// Applies `commands` at leader time `now_ms`, checks the invariants, and checks that a
    /// snapshot of the result decodes to the same state (policies, spent rates, delays, groups
    /// and waiting takes included).
    fn at(state: &mut State, now_ms: u64, commands: Vec<Command>) -> Vec<Outcome> {
        let index = state.applied_index() + 1;
        let outcomes = state.apply(index, 1, &Batch { now_ms, commands }, &mut Vec::new());
        state.verify().unwrap();
        assert_eq!(
            &State::decode_snapshot(&state.encode_snapshot()).unwrap(),
            state,
            "a snapshot round trip"
        );
        outcomes
    }

    fn take(taker: u8, permits: u64, wait_ms: u64) -> Command {
        Command::Take { name: api(), taker: SessionId::from_bytes([100 + taker; 16]), permits, wait_ms }
    }

    fn acquire(session: u8, permits: u64, group: Option<&str>) -> Command {
        let acquire = Acquire {
            key: Key::semaphore(api()),
            session: sid(session),
            permits,
            wait: true,
            capacity: None,
            max_hold_ms: None,
            value: None,
        };
        match group {
            Some(group) => Command::AcquireInGroup {
                acquire,
                ephemeral: false,
                creator: None,
                group: Name::new(group).unwrap(),
            },
            None => Command::Acquire(acquire),
        }
    }

    fn rate(permits: u64, per_ms: u64, burst: u64) -> PolicyChange {
        PolicyChange { rate: Some(Some(Rate { permits, per_ms, burst })), ..PolicyChange::default() }
    }

    fn taken(outcome: &Outcome) -> bool {
        matches!(outcome, Outcome::Taken { .. })
    }

    #[test]
    fn takes_follow_the_burst_then_the_rate_and_refusals_say_when() {
        let mut state = with_policy(1, rate(10, 1000, 5));
        let outcomes = at(&mut state, 0, (0..6).map(|i| take(i, 1, 0)).collect());
        assert_eq!(outcomes.iter().filter(|o| taken(o)).count(), 5);
        assert_eq!(outcomes[5], Outcome::Refused(Refusal::RateLimited { retry_after_ms: 100 }));
        assert_eq!(
            at(&mut state, 99, vec![take(7, 1, 0)])[0],
            Outcome::Refused(Refusal::RateLimited { retry_after_ms: 1 })
        );
        assert!(taken(&at(&mut state, 100, vec![take(8, 1, 0)])[0]));
        assert_eq!(
            at(&mut state, 100, vec![take(9, 6, 0)])[0],
            Outcome::Refused(Refusal::PermitsExceedCapacity { permits: 6, capacity: 5 })
        );
        // A semaphore without a rate takes at once, always.
        let mut free = with_policy(1, PolicyChange { lock_delay_ms: Some(10), ..PolicyChange::default() });
        assert!(at(&mut free, 0, (0..50).map(|i| take(i, 1, 0)).collect()).iter().all(taken));
    }

    /// Over any window of length T, grants ≤ burst + permits × T / per_ms, whatever mix of takes
    /// and acquires arrives when.
    #[test]
    fn grants_in_any_window_stay_within_the_burst_plus_the_rate() {
        let (permits, per_ms, burst) = (3u64, 100u64, 4u64);
        let mut state = with_policy(1_000, rate(permits, per_ms, burst));
        let mut granted_at = Vec::new();
        let mut seed = 7u64;
        let mut now = 0u64;
        for round in 0..400u32 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            now += (seed >> 33) % 40;
            let n = 1 + (seed >> 20) % 3;
            let outcome = at(&mut state, now, vec![take((round % 100) as u8, n, 0)]);
            if taken(&outcome[0]) {
                granted_at.extend(std::iter::repeat_n(now, n as usize));
            }
        }
        assert!(granted_at.len() > 100, "the rate granted {} permits", granted_at.len());
        for (i, start) in granted_at.iter().enumerate() {
            for (j, end) in granted_at.iter().enumerate().skip(i) {
                let window = end - start;
                let allowed = burst + (permits * window) / per_ms;
                assert!((j - i + 1) as u64 <= allowed, "{} grants in {window} ms", j - i + 1);
            }
        }
    }

    #[test]
    fn a_waiting_take_keeps_its_place_behind_an_acquire_and_is_served_at_its_turn() {
        let mut state = with_policy(1, rate(10, 1000, 1));
        assert!(matches!(at(&mut state, 0, vec![acquire(1, 1, None)])[0], Outcome::Acquired { .. }));
        // Session 2 waits for the capacity; the take behind it waits in FIFO order.
        assert!(matches!(at(&mut state, 0, vec![acquire(2, 1, None)])[0], Outcome::Waiting { position: 1 }));
        assert_eq!(at(&mut state, 0, vec![take(1, 1, 5_000)])[0], Outcome::TakeWaiting);
        assert_eq!(state.next_policy_due_ms(), Some(5_000), "only the take's deadline is due");
        let key = Key::semaphore(api());
        at(&mut state, 10, vec![Command::Release { key: key.clone(), session: sid(1) }]);
        // Session 2 got the capacity but the rate's turn comes at 100: the take waits for it.
        assert_eq!(state.next_policy_due_ms(), Some(100), "session 2's rate turn");
        at(&mut state, 200, vec![Command::PolicyTick]);
        assert!(state.object(&key).unwrap().holders.contains_key(&sid(2)));
        // Its grant spent the rate until 300: the take's turn.
        assert_eq!(state.next_policy_due_ms(), Some(300));
        let mut effects = Vec::new();
        let index = state.applied_index() + 1;
        state.apply(index, 1, &Batch { now_ms: 300, commands: vec![Command::PolicyTick] }, &mut effects);
        state.verify().unwrap();
        assert!(effects.iter().any(|e| matches!(e, Effect::Taken { .. })), "the take was served");
        assert!(state.policy(&key).is_some_and(|policy| policy.takers.is_empty()));
    }

    #[test]
    fn a_take_whose_wait_runs_out_leaves_the_queue() {
        let mut state = with_policy(1, rate(1, 1000, 1));
        assert!(taken(&at(&mut state, 0, vec![take(1, 1, 0)])[0]));
        assert_eq!(at(&mut state, 0, vec![take(2, 1, 300)])[0], Outcome::TakeWaiting);
        assert_eq!(state.next_policy_due_ms(), Some(300));
        at(&mut state, 300, vec![Command::PolicyTick]);
        let key = Key::semaphore(api());
        assert!(state.object(&key).unwrap().queue.is_empty());
        assert_eq!(state.next_policy_due_ms(), None);
        let cancel = Command::CancelTake { name: api(), taker: SessionId::from_bytes([102; 16]) };
        assert_eq!(at(&mut state, 301, vec![cancel])[0], Outcome::TakeCancelled { waiting: false });
    }

    #[test]
    fn a_failed_hold_keeps_its_permits_out_for_the_lock_delay_and_a_release_does_not() {
        let mut state =
            with_policy(2, PolicyChange { lock_delay_ms: Some(1_000), ..PolicyChange::default() });
        let key = Key::semaphore(api());
        at(&mut state, 0, vec![acquire(1, 1, None), acquire(2, 1, None), acquire(3, 1, None)]);
        // A revoke is a failure: its permit stays out; session 3 keeps waiting.
        at(&mut state, 10, vec![Command::Revoke { key: key.clone(), session: sid(1) }]);
        assert_eq!(state.policy(&key).unwrap().delayed, vec![Delayed { permits: 1, until_ms: 1_010 }]);
        assert!(state.object(&key).unwrap().queue.get(sid(3)).is_some());
        assert_eq!(
            at(&mut state, 20, vec![Command::DeleteSemaphore { name: api() }])[0],
            Outcome::Refused(Refusal::SemaphoreBusy)
        );
        assert_eq!(state.next_policy_due_ms(), Some(1_010));
        at(&mut state, 1_009, vec![Command::PolicyTick]);
        assert!(state.object(&key).unwrap().queue.get(sid(3)).is_some(), "not a moment early");
        at(&mut state, 1_010, vec![Command::PolicyTick]);
        assert!(state.object(&key).unwrap().holders.contains_key(&sid(3)));
        // A release (a clean end) returns the permit at once.
        at(
            &mut state,
            1_020,
            vec![acquire(4, 1, None), Command::Release { key: key.clone(), session: sid(2) }],
        );
        assert!(state.object(&key).unwrap().holders.contains_key(&sid(4)));
        // Session expiry is a failure too.
        at(&mut state, 1_030, vec![Command::ExpireSessions { ids: vec![sid(3)], decided_term: 1 }]);
        assert_eq!(state.policy(&key).unwrap().delayed_permits(), 1);
        // And so is the deletion of the access token that owns the holder's session; a session
        // its client closes is not.
        let owner = crate::TokenId::from_bytes([9; 16]);
        let token = crate::Token { name: "t".into(), secret_hash: [1; 32], rules: Vec::new() };
        let owned = |id: u8| Command::CreateOwnedSession {
            id: sid(id),
            ttl_ms: 60_000,
            name: None,
            owner,
            owner_sessions_max: 10,
        };
        at(
            &mut state,
            3_000,
            vec![Command::PolicyTick, Command::Release { key: key.clone(), session: sid(4) }],
        );
        assert_eq!(state.policy(&key).unwrap().delayed_permits(), 0);
        at(&mut state, 3_000, vec![Command::CreateToken { id: owner, token }, owned(20), owned(21)]);
        at(&mut state, 3_000, vec![acquire(20, 1, None), acquire(21, 1, None)]);
        at(&mut state, 3_001, vec![Command::CloseSession { id: sid(20) }]);
        assert_eq!(state.policy(&key).unwrap().delayed_permits(), 0, "a close is a clean end");
        at(&mut state, 3_002, vec![Command::DeleteToken { id: owner }]);
        assert_eq!(state.policy(&key).unwrap().delayed, vec![Delayed { permits: 1, until_ms: 4_002 }]);
    }

    #[test]
    fn a_group_at_its_cap_is_passed_over_and_keeps_its_place() {
        let change = PolicyChange { group_max: Some(Some(2)), ..PolicyChange::default() };
        let mut state = with_policy(4, change);
        let key = Key::semaphore(api());
        let outcomes = at(
            &mut state,
            0,
            vec![
                acquire(1, 1, Some("a")),
                acquire(2, 1, Some("a")),
                acquire(3, 1, Some("a")),
                acquire(4, 1, Some("b")),
            ],
        );
        assert!(matches!(outcomes[2], Outcome::Waiting { position: 1 }), "{outcomes:?}");
        assert!(matches!(outcomes[3], Outcome::Acquired { .. }), "group b is not blocked by a's backlog");
        assert_eq!(state.policy(&key).unwrap().group_held(&Name::new("a").unwrap()), 2);
        at(&mut state, 1, vec![Command::Release { key: key.clone(), session: sid(1) }]);
        assert!(state.object(&key).unwrap().holders.contains_key(&sid(3)), "its place was kept");
        // No group above its cap, ever.
        let groups: Vec<(Name, u64)> =
            state.policy(&key).unwrap().groups_held().map(|(g, h)| (g.clone(), h)).collect();
        assert!(groups.iter().all(|(_, held)| *held <= 2), "{groups:?}");
        // Release everything: the policy keeps only its setting.
        for i in 1..=4 {
            at(&mut state, 2, vec![Command::Release { key: key.clone(), session: sid(i) }]);
        }
        assert!(state.policy(&key).unwrap().groups.is_empty());
    }

    #[test]
    fn a_new_rate_never_grants_early_and_removing_it_serves_waiting_takes() {
        let mut state = with_policy(1, rate(1, 1000, 1));
        assert!(taken(&at(&mut state, 0, vec![take(1, 1, 0)])[0]));
        // The same rate on another scale: spent until 1000 still.
        let put =
            |change| Command::PutSemaphorePolicy { name: api(), capacity: 1, policy: change, creator: None };
        at(&mut state, 0, vec![put(rate(3, 3000, 1))]);
        assert!(!taken(&at(&mut state, 999, vec![take(2, 1, 0)])[0]));
        assert_eq!(at(&mut state, 999, vec![take(3, 1, 10_000)])[0], Outcome::TakeWaiting);
        let mut effects = Vec::new();
        let index = state.applied_index() + 1;
        let remove = PolicyChange { rate: Some(None), ..PolicyChange::default() };
        state.apply(index, 1, &Batch { now_ms: 999, commands: vec![put(remove)] }, &mut effects);
        state.verify().unwrap();
        assert!(effects.iter().any(|e| matches!(e, Effect::Taken { .. })));
        assert!(state.policy(&Key::semaphore(api())).is_none(), "nothing left of the policy");
    }

    #[test]
    fn a_try_acquire_refused_by_the_rate_changes_nothing() {
        let mut state = with_policy(5, rate(1, 1000, 1));
        assert!(matches!(at(&mut state, 0, vec![acquire(1, 1, Some("a"))])[0], Outcome::Acquired { .. }));
        let before = state.clone();
        let mut try_acquire = acquire(2, 1, Some("a"));
        if let Command::AcquireInGroup { acquire, .. } = &mut try_acquire {
            acquire.wait = false;
        }
        assert_eq!(at(&mut state, 0, vec![try_acquire])[0], Outcome::Refused(Refusal::Unavailable));
        let mut expected = before;
        expected.applied_index = state.applied_index;
        assert_eq!(state, expected);
    }
}
