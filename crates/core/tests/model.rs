//! Property tests: random command sequences applied to `State` and to a small reference model
//! written independently from the spec in docs/semantics.md. After every batch the two must
//! agree on every outcome and every holder and waiter, and the invariants must hold.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use permit_core::{
    Acquire, Batch, Command, Effect, Key, Name, Outcome, Refusal, SessionId, State, FEATURE_VERSION,
};
use proptest::prelude::*;

const SESSIONS: u8 = 5;

fn session(i: u8) -> SessionId {
    SessionId::from_bytes([i; 16])
}

fn key(j: u8) -> Key {
    let name = Name::new(format!("s{}", j % 2)).unwrap();
    if j < 2 {
        Key::semaphore(name)
    } else {
        Key::election(name)
    }
}

#[derive(Debug, Default, Clone)]
struct ModelObject {
    capacity: u64,
    holders: BTreeMap<u8, (u64, u64, Option<u64>)>, // session -> (permits, token, deadline)
    queue: VecDeque<(u8, u64, Option<u64>)>,        // (session, permits, max_hold_ms)
    /// Elections: the value each holder publishes, and the time of its grant. A grant sets it
    /// (a campaign's value is `v{session}`), a proclaim replaces the value.
    values: BTreeMap<u8, (String, u64)>,
}

impl ModelObject {
    fn held(&self) -> u64 {
        self.holders.values().map(|h| h.0).sum()
    }
}

/// The reference model: plain vectors and linear scans, no indexes.
#[derive(Debug, Default, Clone)]
struct Model {
    sessions: BTreeSet<u8>,
    objects: BTreeMap<u8, ModelObject>,
    last_token: u64,
    now_ms: u64,
}

impl Model {
    fn pump(&mut self, j: u8) {
        let Some(object) = self.objects.get_mut(&j) else { return };
        while let Some(&(s, permits, max_hold)) = object.queue.front() {
            if object.held() + permits > object.capacity {
                break;
            }
            object.queue.pop_front();
            self.last_token += 1;
            object.holders.insert(s, (permits, self.last_token, max_hold.map(|m| self.now_ms + m)));
            object.values.insert(s, (format!("v{s}"), self.now_ms));
        }
    }

    fn drop_idle_election(&mut self, j: u8) {
        if j >= 2 && self.objects.get(&j).is_some_and(|o| o.holders.is_empty() && o.queue.is_empty()) {
            self.objects.remove(&j);
        }
    }

    fn remove_session(&mut self, s: u8) {
        self.sessions.remove(&s);
        let keys: Vec<u8> = self.objects.keys().copied().collect();
        for j in &keys {
            let object = self.objects.get_mut(j).unwrap();
            if object.queue.iter().any(|w| w.0 == s) {
                object.queue.retain(|w| w.0 != s);
                self.pump(*j);
            }
        }
        for j in &keys {
            let object = self.objects.get_mut(j).unwrap();
            if object.holders.remove(&s).is_some() {
                self.pump(*j);
            }
        }
        for j in keys {
            self.drop_idle_election(j);
        }
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        match *op {
            Op::Create(s) => {
                if !self.sessions.insert(s) {
                    return Outcome::Refused(Refusal::SessionExists);
                }
                Outcome::SessionCreated
            }
            Op::Close(s) => {
                if !self.sessions.contains(&s) {
                    return Outcome::Refused(Refusal::SessionNotFound);
                }
                self.remove_session(s);
                Outcome::SessionClosed
            }
            Op::Expire(ref ids) => {
                let mut expired = 0;
                for s in ids {
                    if self.sessions.contains(s) {
                        self.remove_session(*s);
                        expired += 1;
                    }
                }
                Outcome::SessionsExpired { expired }
            }
            Op::Put(j, capacity) => {
                let j = j % 2;
                let Some(object) = self.objects.get_mut(&j) else {
                    self.objects.insert(j, ModelObject { capacity, ..Default::default() });
                    return Outcome::SemaphoreCreated;
                };
                object.capacity = capacity;
                object.queue.retain(|w| w.1 <= capacity);
                self.pump(j);
                Outcome::SemaphoreUpdated
            }
            Op::Delete(j) => {
                let j = j % 2;
                match self.objects.get(&j) {
                    None => Outcome::Refused(Refusal::SemaphoreNotFound),
                    Some(o) if !o.holders.is_empty() || !o.queue.is_empty() => {
                        Outcome::Refused(Refusal::SemaphoreBusy)
                    }
                    Some(_) => {
                        self.objects.remove(&j);
                        Outcome::SemaphoreDeleted
                    }
                }
            }
            Op::Acquire { object: j, session: s, permits, wait, capacity, max_hold_ms } => {
                let permits = if j >= 2 { 1 } else { permits };
                if !self.sessions.contains(&s) {
                    return Outcome::Refused(Refusal::SessionNotFound);
                }
                let capacity = match (self.objects.get(&j), j >= 2) {
                    (Some(o), _) => o.capacity,
                    (None, true) => 1,
                    (None, false) => match capacity {
                        Some(c) => c,
                        None => return Outcome::Refused(Refusal::SemaphoreNotFound),
                    },
                };
                if let Some(o) = self.objects.get(&j) {
                    if let Some(&(p, token, _)) = o.holders.get(&s) {
                        if p != permits {
                            return Outcome::Refused(Refusal::PermitsMismatch {
                                existing: p,
                                requested: permits,
                            });
                        }
                        return Outcome::Acquired { permits: p, token };
                    }
                    if let Some(i) = o.queue.iter().position(|w| w.0 == s) {
                        let p = o.queue[i].1;
                        if p != permits {
                            return Outcome::Refused(Refusal::PermitsMismatch {
                                existing: p,
                                requested: permits,
                            });
                        }
                        return Outcome::Waiting { position: i as u64 + 1 };
                    }
                }
                if permits > capacity {
                    return Outcome::Refused(Refusal::PermitsExceedCapacity { permits, capacity });
                }
                let o =
                    self.objects.entry(j).or_insert_with(|| ModelObject { capacity, ..Default::default() });
                if o.queue.is_empty() && o.held() + permits <= o.capacity {
                    self.last_token += 1;
                    o.holders.insert(s, (permits, self.last_token, max_hold_ms.map(|m| self.now_ms + m)));
                    o.values.insert(s, (format!("v{s}"), self.now_ms));
                    return Outcome::Acquired { permits, token: self.last_token };
                }
                if !wait {
                    return Outcome::Refused(Refusal::Unavailable);
                }
                o.queue.push_back((s, permits, max_hold_ms));
                Outcome::Waiting { position: o.queue.len() as u64 }
            }
            Op::Release(j, s) => {
                if !self.sessions.contains(&s) {
                    return Outcome::Refused(Refusal::SessionNotFound);
                }
                let Some(o) = self.objects.get_mut(&j) else { return Outcome::Released { permits: 0 } };
                let permits = if let Some((p, _, _)) = o.holders.remove(&s) {
                    p
                } else if let Some(i) = o.queue.iter().position(|w| w.0 == s) {
                    o.queue.remove(i);
                    0
                } else {
                    return Outcome::Released { permits: 0 };
                };
                self.pump(j);
                self.drop_idle_election(j);
                Outcome::Released { permits }
            }
            Op::ExpireHolds => {
                let mut due: Vec<(u64, u8, u8)> = Vec::new();
                for (j, o) in &self.objects {
                    for (s, h) in &o.holders {
                        if let Some(d) = h.2.filter(|d| *d <= self.now_ms) {
                            due.push((d, *j, *s));
                        }
                    }
                }
                due.sort_by_key(|(d, j, s)| (*d, key(*j), session(*s)));
                for (_, j, s) in &due {
                    self.objects.get_mut(j).unwrap().holders.remove(s);
                    self.pump(*j);
                    self.drop_idle_election(*j);
                }
                Outcome::HoldsExpired { expired: due.len() as u64 }
            }
            Op::Proclaim(s, n) => {
                if !self.sessions.contains(&s) {
                    return Outcome::Refused(Refusal::SessionNotFound);
                }
                let Some(o) = self.objects.get_mut(&2) else { return Outcome::Refused(Refusal::NotLeader) };
                let Some(&(_, token, _)) = o.holders.get(&s) else {
                    return Outcome::Refused(Refusal::NotLeader);
                };
                let (value, granted_at_ms) = o.values.get_mut(&s).unwrap();
                *value = format!("p{n}");
                Outcome::Proclaimed { token, granted_at_ms: *granted_at_ms }
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    Close(u8),
    Expire(Vec<u8>),
    Put(u8, u64),
    Delete(u8),
    Acquire {
        object: u8,
        session: u8,
        permits: u64,
        wait: bool,
        capacity: Option<u64>,
        max_hold_ms: Option<u64>,
    },
    Release(u8, u8),
    ExpireHolds,
    /// Session, value number: a proclaim in the election.
    Proclaim(u8, u8),
}

impl Op {
    fn command(&self) -> Command {
        match *self {
            Op::Create(s) => Command::CreateSession { id: session(s), ttl_ms: 1000, name: None },
            Op::Close(s) => Command::CloseSession { id: session(s) },
            Op::Expire(ref ids) => {
                Command::ExpireSessions { ids: ids.iter().map(|s| session(*s)).collect(), decided_term: 1 }
            }
            Op::Put(j, capacity) => Command::PutSemaphore { name: key(j % 2).name, capacity },
            Op::Delete(j) => Command::DeleteSemaphore { name: key(j % 2).name },
            Op::Acquire { object, session: s, permits, wait, capacity, max_hold_ms } => {
                let election = object >= 2;
                Command::Acquire(Acquire {
                    key: key(object),
                    session: session(s),
                    permits: if election { 1 } else { permits },
                    wait,
                    capacity: if election { None } else { capacity },
                    max_hold_ms,
                    value: election.then(|| format!("v{s}")),
                })
            }
            Op::Release(j, s) => Command::Release { key: key(j), session: session(s) },
            Op::ExpireHolds => Command::ExpireHolds,
            Op::Proclaim(s, n) => {
                Command::Proclaim { key: key(2), session: session(s), value: format!("p{n}") }
            }
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..SESSIONS;
    prop_oneof![
        2 => s.clone().prop_map(Op::Create),
        1 => s.clone().prop_map(Op::Close),
        1 => proptest::collection::vec(0..SESSIONS, 0..3).prop_map(Op::Expire),
        1 => (0u8..2, 1u64..6).prop_map(|(j, c)| Op::Put(j, c)),
        1 => (0u8..2).prop_map(Op::Delete),
        6 => (0u8..3, s.clone(), 1u64..5, any::<bool>(), proptest::option::of(1u64..6),
              proptest::option::weighted(0.2, 100u64..400))
            .prop_map(|(object, session, permits, wait, capacity, max_hold_ms)|
                Op::Acquire { object, session, permits, wait, capacity, max_hold_ms }),
        4 => (0u8..3, s.clone()).prop_map(|(j, s)| Op::Release(j, s)),
        1 => Just(Op::ExpireHolds),
        2 => (s, 0u8..3).prop_map(|(s, n)| Op::Proclaim(s, n)),
    ]
}

/// Batches of 1–4 operations, each batch advancing time by 0–150 ms.
fn batches() -> impl Strategy<Value = Vec<(u64, Vec<Op>)>> {
    proptest::collection::vec((0u64..150, proptest::collection::vec(op(), 1..4)), 1..60)
}

/// A state whose cluster runs this build's feature version, so that every command applies.
fn fresh() -> State {
    let mut state = State::default();
    let raise = Batch { now_ms: 0, commands: vec![Command::SetClusterVersion { version: FEATURE_VERSION }] };
    state.apply(0, 1, &raise, &mut Vec::new());
    state
}

fn compare(model: &Model, state: &State) {
    for j in 0..3u8 {
        let object = state.object(&key(j));
        let mo = model.objects.get(&j);
        assert_eq!(object.is_some(), mo.is_some(), "existence of {}", key(j));
        let (Some(object), Some(mo)) = (object, mo) else { continue };
        assert_eq!(object.capacity, mo.capacity);
        let holders: BTreeMap<SessionId, (u64, u64, Option<u64>)> =
            object.holders.iter().map(|(s, h)| (*s, (h.permits, h.token, h.expires_at_ms))).collect();
        let expected: BTreeMap<SessionId, (u64, u64, Option<u64>)> =
            mo.holders.iter().map(|(s, h)| (session(*s), *h)).collect();
        assert_eq!(holders, expected, "holders of {}", key(j));
        let queue: Vec<(SessionId, u64)> = object.queue.iter().map(|w| (w.session, w.permits)).collect();
        let expected: Vec<(SessionId, u64)> = mo.queue.iter().map(|w| (session(w.0), w.1)).collect();
        assert_eq!(queue, expected, "queue of {}", key(j));
        if j >= 2 {
            let values: BTreeMap<SessionId, (Option<&str>, u64)> =
                object.holders.iter().map(|(s, h)| (*s, (h.value.as_deref(), h.granted_at_ms))).collect();
            let expected: BTreeMap<SessionId, (Option<&str>, u64)> = mo
                .holders
                .keys()
                .map(|s| (session(*s), mo.values.get(s).map(|(v, at)| (Some(v.as_str()), *at)).unwrap()))
                .collect();
            assert_eq!(values, expected, "values of {}", key(j));
        }
    }
    assert_eq!(state.session_count(), model.sessions.len());
    assert_eq!(state.last_token(), model.last_token);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn apply_matches_the_reference_model(batches in batches()) {
        let mut state = fresh();
        let mut model = Model::default();
        let mut now_ms = 0;
        for (index, (advance_ms, ops)) in batches.iter().enumerate() {
            now_ms += advance_ms;
            model.now_ms = now_ms;
            let batch = Batch { now_ms, commands: ops.iter().map(Op::command).collect() };
            let outcomes = state.apply(index as u64 + 1, 1, &batch, &mut Vec::new());
            for (op, outcome) in ops.iter().zip(&outcomes) {
                let expected = model.apply(op);
                prop_assert_eq!(outcome, &expected, "op {:?}", op);
            }
            compare(&model, &state);
            state.verify().unwrap();
        }
    }

    #[test]
    fn held_never_exceeds_capacity_unless_shrunk_and_tokens_strictly_increase(batches in batches()) {
        let mut state = fresh();
        let mut now_ms = 0;
        let mut seen_tokens = BTreeSet::new();
        for (index, (advance_ms, ops)) in batches.iter().enumerate() {
            now_ms += advance_ms;
            let last_token_before = state.last_token();
            let batch = Batch { now_ms, commands: ops.iter().map(Op::command).collect() };
            state.apply(index as u64 + 1, 1, &batch, &mut Vec::new());
            for j in 0..3 {
                let Some(object) = state.object(&key(j)) else { continue };
                for hold in object.holders.values() {
                    // A token is new exactly when it is above every token issued before.
                    if hold.granted_index == index as u64 + 1 && seen_tokens.insert((j, hold.token)) {
                        prop_assert!(hold.token > last_token_before);
                    }
                    if hold.token > object.capacity_set_token {
                        prop_assert!(object.held <= object.capacity);
                    }
                }
            }
        }
    }

    #[test]
    fn expiry_frees_exactly_the_expired_sessions_holds(batches in batches(), victim in 0..SESSIONS) {
        let mut state = fresh();
        let mut now_ms = 0;
        for (index, (advance_ms, ops)) in batches.iter().enumerate() {
            now_ms += advance_ms;
            let batch = Batch { now_ms, commands: ops.iter().map(Op::command).collect() };
            state.apply(index as u64 + 1, 1, &batch, &mut Vec::new());
        }
        let before = state.clone();
        let expire = Batch { now_ms, commands: vec![Command::ExpireSessions { ids: vec![session(victim)], decided_term: 1 }] };
        let mut effects = Vec::new();
        state.apply(batches.len() as u64 + 1, 1, &expire, &mut effects);
        prop_assert!(state.session(session(victim)).is_none());
        for j in 0..3 {
            let (Some(old), new) = (before.object(&key(j)), state.object(&key(j))) else { continue };
            for (s, hold) in &old.holders {
                let kept = new.and_then(|o| o.holders.get(s));
                if *s == session(victim) {
                    prop_assert!(kept.is_none(), "the victim's hold survived");
                } else {
                    prop_assert_eq!(kept, Some(hold), "another session's hold changed");
                }
            }
        }
        if before.session(session(victim)).is_some() {
            let removed = Effect::SessionRemoved { id: session(victim) };
            prop_assert!(effects.contains(&removed), "no SessionRemoved effect");
        }
    }

    #[test]
    fn snapshot_restore_gives_the_same_state_and_bytes(batches in batches()) {
        let mut state = fresh();
        let mut now_ms = 0;
        for (index, (advance_ms, ops)) in batches.iter().enumerate() {
            now_ms += advance_ms;
            let batch = Batch { now_ms, commands: ops.iter().map(Op::command).collect() };
            state.apply(index as u64 + 1, 1, &batch, &mut Vec::new());
            let bytes = state.encode_snapshot();
            let restored = State::decode_snapshot(&bytes).unwrap();
            prop_assert_eq!(&restored, &state);
            prop_assert_eq!(restored.encode_snapshot(), bytes);
        }
    }

    #[test]
    fn replicas_applying_one_log_agree(batches in batches()) {
        let mut a = fresh();
        let mut b = fresh();
        for (index, (advance_ms, ops)) in batches.iter().enumerate() {
            let batch = Batch { now_ms: *advance_ms * index as u64, commands: ops.iter().map(Op::command).collect() };
            let oa = a.apply(index as u64 + 1, 1, &batch, &mut Vec::new());
            let ob = b.apply(index as u64 + 1, 1, &batch, &mut Vec::new());
            prop_assert_eq!(oa, ob);
        }
        prop_assert_eq!(a.digest(), b.digest());
    }
}

#[test]
fn a_head_waiter_that_does_not_fit_blocks_smaller_requests_behind_it() {
    let mut state = State::default();
    let k = key(0);
    let acquire = |s: u8, permits: u64| {
        Command::Acquire(Acquire {
            key: k.clone(),
            session: session(s),
            permits,
            wait: true,
            capacity: Some(4),
            max_hold_ms: None,
            value: None,
        })
    };
    let batch = Batch {
        now_ms: 0,
        commands: vec![
            Op::Create(1).command(),
            Op::Create(2).command(),
            Op::Create(3).command(),
            acquire(1, 3),
            acquire(2, 4),
            acquire(3, 1),
        ],
    };
    let outcomes = state.apply(1, 1, &batch, &mut Vec::new());
    assert_eq!(outcomes[3], Outcome::Acquired { permits: 3, token: 1 });
    assert_eq!(outcomes[4], Outcome::Waiting { position: 1 });
    // One permit is free, but the large request at the head goes first.
    assert_eq!(outcomes[5], Outcome::Waiting { position: 2 });
    let release =
        Batch { now_ms: 1, commands: vec![Command::Release { key: k.clone(), session: session(1) }] };
    state.apply(2, 1, &release, &mut Vec::new());
    let object = state.object(&k).unwrap();
    assert_eq!(object.holders[&session(2)].token, 2);
    assert_eq!(object.queue.position(session(3)), Some(1));
}

#[test]
fn shrinking_capacity_keeps_holders_and_grants_nothing_until_they_fit() {
    let mut state = State::default();
    let k = key(0);
    let acquire = |s: u8| {
        Command::Acquire(Acquire {
            key: k.clone(),
            session: session(s),
            permits: 1,
            wait: true,
            capacity: Some(3),
            max_hold_ms: None,
            value: None,
        })
    };
    let mut commands: Vec<Command> = (1..=4).map(|s| Op::Create(s).command()).collect();
    commands.extend((1..=4).map(acquire));
    commands.push(Command::PutSemaphore { name: k.name.clone(), capacity: 1 });
    state.apply(1, 1, &Batch { now_ms: 0, commands }, &mut Vec::new());
    let object = state.object(&k).unwrap();
    assert_eq!((object.held, object.capacity, object.available()), (3, 1, 0));
    let release =
        |s: u8| Batch { now_ms: 0, commands: vec![Command::Release { key: k.clone(), session: session(s) }] };
    state.apply(2, 1, &release(1), &mut Vec::new());
    assert!(state.object(&k).unwrap().queue.get(session(4)).is_some(), "2 held > capacity 1: no grant");
    state.apply(3, 1, &release(2), &mut Vec::new());
    state.apply(4, 1, &release(3), &mut Vec::new());
    assert!(state.object(&k).unwrap().holders.contains_key(&session(4)), "granted once holdings fit");
}

#[test]
fn an_expiry_decided_in_another_term_changes_nothing() {
    let mut state = State::default();
    let create = Batch { now_ms: 0, commands: vec![Op::Create(1).command()] };
    state.apply(1, 3, &create, &mut Vec::new());
    // Decided by the leader of term 3, written after that node was re-elected in term 4: the
    // new leadership extended every deadline, so the old decision must not apply.
    let stale = Batch {
        now_ms: 0,
        commands: vec![Command::ExpireSessions { ids: vec![session(1)], decided_term: 3 }],
    };
    let outcomes = state.apply(2, 4, &stale, &mut Vec::new());
    assert_eq!(outcomes, vec![Outcome::SessionsExpired { expired: 0 }]);
    assert!(state.session(session(1)).is_some());
    let current = Batch {
        now_ms: 0,
        commands: vec![Command::ExpireSessions { ids: vec![session(1)], decided_term: 4 }],
    };
    assert_eq!(state.apply(3, 4, &current, &mut Vec::new()), vec![Outcome::SessionsExpired { expired: 1 }]);
}
