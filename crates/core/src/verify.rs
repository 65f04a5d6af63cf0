//! The state's invariants, checked after every apply in debug builds and after every snapshot
//! decode in all builds.

use std::collections::BTreeSet;

use crate::{Kind, State};

/// An invariant that does not hold: always a bug (or a corrupted snapshot), never bad input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvariantViolation(pub String);

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(InvariantViolation(format!($($fmt)+)));
        }
    };
}

impl State {
    /// Checks every invariant of the state.
    ///
    /// # Errors
    /// The first [`InvariantViolation`] found.
    pub fn verify(&self) -> Result<(), InvariantViolation> {
        let mut deadlines = BTreeSet::new();
        let mut tokens = Vec::new();
        let (mut hold_count, mut wait_count) = (0usize, 0usize);
        for (key, object) in &self.objects {
            let held: u64 = object.holders.values().map(|hold| hold.permits).sum();
            ensure!(held == object.held, "{key}: held {} but holds sum to {held}", object.held);
            // Over capacity only after a shrink, and then no hold was granted since the shrink.
            ensure!(
                object.held <= object.capacity
                    || object.holders.values().all(|hold| hold.token <= object.capacity_set_token),
                "{key}: {} held over capacity {} with a grant after the capacity was set",
                object.held,
                object.capacity
            );
            ensure!(object.capacity >= 1, "{key}: capacity 0");
            ensure!(object.modified_index <= self.applied_index, "{key}: modified in the future");
            if key.kind == Kind::Election {
                ensure!(object.capacity == 1, "{key}: election capacity {}", object.capacity);
                ensure!(!object.is_idle(), "{key}: idle election kept");
            }
            for (session_id, hold) in &object.holders {
                ensure!(hold.permits >= 1, "{key}: empty hold");
                ensure!(hold.token <= self.last_token, "{key}: token {} from the future", hold.token);
                ensure!(object.queue.get(*session_id).is_none(), "{key}: {session_id} holds and waits");
                tokens.push(hold.token);
                if let Some(deadline) = hold.expires_at_ms {
                    deadlines.insert((deadline, key.clone(), *session_id));
                }
            }
            hold_count += object.holders.len();
            object.queue.check();
            let policy = self.policy(key);
            let takers = policy.map_or(0, |policy| policy.takers.len());
            for waiter in object.queue.iter() {
                let taker = policy.is_some_and(|policy| policy.takers.contains_key(&waiter.session));
                ensure!(taker || waiter.permits <= object.capacity, "{key}: waiter can never fit");
            }
            wait_count += object.queue.len() - takers;
            match policy {
                // With a policy, the pump's own checks hold it to the rate, the delays and the
                // group caps; `verify_policies` checks its records.
                Some(_) => {}
                None => {
                    if let Some(head) = object.queue.head() {
                        ensure!(!object.fits(head.permits), "{key}: head waiter fits but was not granted");
                    }
                }
            }
        }
        self.verify_policies()?;
        self.verify_queues(&mut tokens)?;
        // Tokens are global: every hold's and claim's token is distinct.
        tokens.sort_unstable();
        ensure!(tokens.windows(2).all(|w| w[0] < w[1]), "a token is held twice");
        ensure!(deadlines == self.hold_deadlines, "hold deadline index out of date");
        // Every key a session lists names a hold (or wait) of that session; with equal counts, and
        // (session, key) pairs being unique, every hold and wait belongs to a live session too.
        let (mut listed_holds, mut listed_waits) = (0usize, 0usize);
        for (id, session) in &self.sessions {
            ensure!(
                session.holds.is_sorted() && session.waits.is_sorted(),
                "session {id}: key sets out of order"
            );
            for key in &session.holds {
                let holds = self.objects.get(key).is_some_and(|o| o.holders.contains_key(id));
                ensure!(holds, "session {id} lists a hold on {key} that does not exist");
            }
            for key in &session.waits {
                let waits = self.objects.get(key).is_some_and(|o| o.queue.get(*id).is_some());
                ensure!(waits, "session {id} lists a wait on {key} that does not exist");
            }
            listed_holds += session.holds.len();
            listed_waits += session.waits.len();
        }
        ensure!(
            listed_holds == hold_count,
            "{hold_count} holds but sessions list {listed_holds}: a holder is not live"
        );
        ensure!(
            listed_waits == wait_count,
            "{wait_count} waiters but sessions list {listed_waits}: a waiter is not live"
        );
        for key in &self.ephemeral {
            ensure!(key.kind == Kind::Semaphore, "{key}: an election marked ephemeral");
            let live = self.objects.get(key).is_some_and(|object| !object.is_idle());
            ensure!(live, "{key}: ephemeral but idle or gone");
        }
        self.verify_tokens()
    }

    /// Every queue's indexes match its items; every claim and blocked claim belongs to a live
    /// session; no item is pending while a claimer that could take it waits; the state's queue
    /// indexes match. Adds the claims' tokens to `tokens`.
    fn verify_policies(&self) -> Result<(), InvariantViolation> {
        for (key, policy) in &self.policies {
            let object = self.objects.get(key);
            ensure!(key.kind == Kind::Semaphore, "{key}: a policy on an election or queue");
            let Some(object) = object else {
                return Err(InvariantViolation(format!("{key}: a policy without its semaphore")));
            };
            let mut rebuilt = (**policy).clone();
            rebuilt.reindex(object);
            ensure!(rebuilt == **policy, "{key}: a policy's index is out of date");
            ensure!(**policy != crate::Policy::default(), "{key}: an empty policy is kept");
            ensure!(
                policy.delayed.is_sorted_by_key(|delayed| delayed.until_ms),
                "{key}: delays out of order"
            );
            for session in policy.groups.keys() {
                let present = object.holders.contains_key(session) || object.queue.get(*session).is_some();
                ensure!(present, "{key}: a group recorded for {session}, which neither holds nor waits");
            }
            for taker in policy.takers.keys() {
                ensure!(object.queue.get(*taker).is_some(), "{key}: take {taker} is not queued");
                ensure!(!self.sessions.contains_key(taker), "{key}: take {taker} is also a session");
                ensure!(!policy.groups.contains_key(taker), "{key}: take {taker} has a group");
            }
            if let Some(rate) = policy.rate {
                for waiter in object.queue.iter() {
                    ensure!(waiter.permits <= rate.burst, "{key}: a wait beyond the rate's burst");
                }
            }
            ensure!(
                self.policy_due_at.get(key).copied() == self.policy_due_of(key),
                "{key}: the policy's due time is out of date"
            );
        }
        for (key, at) in &self.policy_due_at {
            ensure!(self.policies.contains_key(key), "{key}: due without a policy");
            ensure!(self.policy_due.contains(&(*at, key.clone())), "{key}: due index out of date");
        }
        ensure!(self.policy_due.len() == self.policy_due_at.len(), "due index out of date");
        Ok(())
    }

    fn verify_queues(&self, tokens: &mut Vec<u64>) -> Result<(), InvariantViolation> {
        let mut items = 0u64;
        let mut due = BTreeSet::new();
        let mut sessions = std::collections::BTreeMap::<_, BTreeSet<_>>::new();
        for (name, queue) in &self.queues {
            let mut rebuilt = (**queue).clone();
            rebuilt.reindex();
            ensure!(rebuilt == **queue, "queue {name}: an index is out of date");
            ensure!(queue.modified_index <= self.applied_index, "queue {name}: modified in the future");
            ensure!(queue.dead_letter.as_ref() != Some(name), "queue {name}: its own dead-letter queue");
            let mut seqs = BTreeSet::new();
            for (id, item) in queue.items() {
                ensure!(id >= 1 && id <= self.last_item, "queue {name}: item {id} from the future");
                ensure!(
                    item.seq >= 1 && item.seq < queue.next_seq,
                    "queue {name}: item {id} has seq {} from the future",
                    item.seq
                );
                ensure!(seqs.insert(item.seq), "queue {name}: seq {} twice", item.seq);
                match item.state {
                    crate::ItemState::Claimed(claim) => {
                        ensure!(
                            self.sessions.contains_key(&claim.session),
                            "queue {name}: item {id} claimed by a gone session"
                        );
                        ensure!(
                            claim.token <= self.last_token,
                            "queue {name}: item {id} has a token from the future"
                        );
                        ensure!(item.attempt >= 1, "queue {name}: item {id} claimed with no attempt");
                        tokens.push(claim.token);
                        sessions.entry(claim.session).or_default().insert(name.clone());
                    }
                    crate::ItemState::Delayed { until_ms } => {
                        due.insert((until_ms, name.clone(), id));
                    }
                    crate::ItemState::Pending => {}
                }
            }
            for claimer in queue.claimers() {
                ensure!(
                    self.sessions.contains_key(&claimer.session),
                    "queue {name}: a gone session's claim waits"
                );
                sessions.entry(claimer.session).or_default().insert(name.clone());
                let live = claimer.until_ms > self.now_ms;
                ensure!(
                    !live || queue.counts().pending == 0,
                    "queue {name}: items pending while a claim waits"
                );
            }
            items += queue.len();
        }
        ensure!(items == self.queued_items, "queued item count out of date");
        ensure!(due == self.items_due, "due item index out of date");
        ensure!(sessions == self.queue_sessions, "session queue index out of date");
        Ok(())
    }

    /// Every session's owner is a live token, and the derived token indexes match.
    fn verify_tokens(&self) -> Result<(), InvariantViolation> {
        let mut per_owner = std::collections::BTreeMap::new();
        for (id, session) in &self.sessions {
            if let Some(owner) = session.owner {
                ensure!(self.tokens.contains_key(&owner), "session {id} belongs to a deleted token {owner}");
                *per_owner.entry(owner).or_insert(0u64) += 1;
            }
        }
        ensure!(per_owner == self.sessions_per_owner, "sessions-per-token index out of date");
        ensure!(self.token_ids_by_secret.len() == self.tokens.len(), "two tokens share a secret");
        let mut created_by = std::collections::BTreeMap::<_, BTreeSet<_>>::new();
        for (key, token) in &self.creators {
            let exists = match key.kind {
                Kind::Queue => self.queues.contains_key(&key.name),
                Kind::Semaphore | Kind::Election => self.objects.contains_key(key),
            };
            ensure!(exists, "{key}: a creator recorded for an object that is gone");
            ensure!(self.tokens.contains_key(token), "{key}: created by a deleted token {token}");
            created_by.entry(*token).or_default().insert(key.clone());
        }
        ensure!(created_by == self.created_by, "objects-per-token index out of date");
        for (id, token) in &self.tokens {
            ensure!(self.token_ids_by_secret.get(&token.secret_hash) == Some(id), "secret index out of date");
            ensure!(*id != crate::ROOT_TOKEN_ID || self.root_created, "root token without its bootstrap");
        }
        Ok(())
    }
}
