//! Property tests of semaphore policies: random mixes of acquires (grouped or not), releases,
//! revokes, session ends, takes, cancelled takes, ticks and policy changes, against the promises
//! of docs/semantics.md ("Semaphore policies"), checked from the events and leader time alone:
//! the rate's window bound, the group cap at every grant, and no grant of a lock-delayed
//! capacity-1 semaphore before its delay ends. After every batch the invariants hold and a
//! snapshot decodes to the same state.

use permit_core::{
    Acquire, Batch, Command, Effect, EventKind, Key, Name, PolicyChange, Rate, SessionId, State,
    FEATURE_VERSION,
};
use proptest::prelude::*;

const SESSIONS: u8 = 6;
/// The rated, grouped semaphore (capacity 4) and the lock-delayed one (capacity 1).
const RATED: &str = "r";
const LOCK: &str = "l";
const LOCK_DELAY_MS: u64 = 300;

fn session(i: u8) -> SessionId {
    SessionId::from_bytes([i + 1; 16])
}

fn taker(i: u8) -> SessionId {
    SessionId::from_bytes([200 + i; 16])
}

fn name(n: &str) -> Name {
    Name::new(n).unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Create(u8),
    Close(u8),
    Expire(u8),
    /// Session, semaphore (0 rated, 1 lock), permits, group (0: none), wait.
    Acquire(u8, u8, u64, u8, bool),
    Release(u8, u8),
    Revoke(u8, u8),
    /// Take id, permits, wait ms.
    Take(u8, u64, u64),
    CancelTake(u8),
    Tick,
    /// A new rate on the rated semaphore (permits, per_ms, burst), or its removal.
    SetRate(Option<(u64, u64, u64)>),
    SetGroupMax(Option<u64>),
}

fn semaphore(j: u8) -> &'static str {
    if j == 0 {
        RATED
    } else {
        LOCK
    }
}

impl Op {
    fn command(&self) -> Command {
        match *self {
            Op::Create(s) => Command::CreateSession { id: session(s), ttl_ms: 1000, name: None },
            Op::Close(s) => Command::CloseSession { id: session(s) },
            Op::Expire(s) => Command::ExpireSessions { ids: vec![session(s)], decided_term: 1 },
            Op::Acquire(s, j, permits, group, wait) => {
                let acquire = Acquire {
                    key: Key::semaphore(name(semaphore(j))),
                    session: session(s),
                    permits: if j == 0 { permits } else { 1 },
                    wait,
                    capacity: None,
                    max_hold_ms: None,
                    value: None,
                };
                match group {
                    0 => Command::Acquire(acquire),
                    g => Command::AcquireInGroup {
                        acquire,
                        ephemeral: false,
                        creator: None,
                        group: name(&format!("g{g}")),
                    },
                }
            }
            Op::Release(s, j) => {
                Command::Release { key: Key::semaphore(name(semaphore(j))), session: session(s) }
            }
            Op::Revoke(s, j) => {
                Command::Revoke { key: Key::semaphore(name(semaphore(j))), session: session(s) }
            }
            Op::Take(t, permits, wait_ms) => {
                Command::Take { name: name(RATED), taker: taker(t), permits, wait_ms }
            }
            Op::CancelTake(t) => Command::CancelTake { name: name(RATED), taker: taker(t) },
            Op::Tick => Command::PolicyTick,
            Op::SetRate(rate) => Command::PutSemaphorePolicy {
                name: name(RATED),
                capacity: 4,
                policy: PolicyChange {
                    rate: Some(rate.map(|(permits, per_ms, burst)| Rate { permits, per_ms, burst })),
                    ..PolicyChange::default()
                },
                creator: None,
            },
            Op::SetGroupMax(max) => Command::PutSemaphorePolicy {
                name: name(RATED),
                capacity: 4,
                policy: PolicyChange { group_max: Some(max), ..PolicyChange::default() },
                creator: None,
            },
        }
    }
}

fn op() -> impl Strategy<Value = Op> {
    let s = 0..SESSIONS;
    prop_oneof![
        2 => s.clone().prop_map(Op::Create),
        1 => s.clone().prop_map(Op::Close),
        1 => s.clone().prop_map(Op::Expire),
        6 => (s.clone(), 0u8..2, 1u64..3, 0u8..3, any::<bool>())
            .prop_map(|(s, j, p, g, w)| Op::Acquire(s, j, p, g, w)),
        3 => (s.clone(), 0u8..2).prop_map(|(s, j)| Op::Release(s, j)),
        1 => (s, 0u8..2).prop_map(|(s, j)| Op::Revoke(s, j)),
        4 => (0u8..4, 1u64..3, prop_oneof![Just(0u64), 1u64..400]).prop_map(|(t, p, w)| Op::Take(t, p, w)),
        1 => (0u8..4).prop_map(Op::CancelTake),
        3 => Just(Op::Tick),
        1 => proptest::option::of((1u64..5, 50u64..300, 1u64..4)).prop_map(Op::SetRate),
        1 => proptest::option::of(1u64..4).prop_map(Op::SetGroupMax),
    ]
}

/// Batches of 1-4 operations, each advancing leader time by 0-120 ms.
fn batches() -> impl Strategy<Value = Vec<(u64, Vec<Op>)>> {
    proptest::collection::vec((0u64..120, proptest::collection::vec(op(), 1..4)), 1..80)
}

/// The two semaphores, at this build's feature version: the rated one with 2 per 100 ms,
/// burst 2, and groups capped at 2; the lock with its delay.
fn fresh() -> State {
    let mut state = State::default();
    let put = |n: &str, capacity, policy| Command::PutSemaphorePolicy {
        name: name(n),
        capacity,
        policy,
        creator: None,
    };
    let rated = PolicyChange {
        rate: Some(Some(Rate { permits: 2, per_ms: 100, burst: 2 })),
        group_max: Some(Some(2)),
        ..PolicyChange::default()
    };
    let lock = PolicyChange { lock_delay_ms: Some(LOCK_DELAY_MS), ..PolicyChange::default() };
    let commands = vec![
        Command::SetClusterVersion { version: FEATURE_VERSION },
        put(RATED, 4, rated),
        put(LOCK, 1, lock),
    ];
    state.apply(1, 1, &Batch { now_ms: 0, commands }, &mut Vec::new());
    state
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn policies_keep_their_promises(batches in batches()) {
        let mut state = fresh();
        let mut now_ms = 0;
        // Permits granted on the rated semaphore under its current rate, at their leader time.
        let mut rate: Option<Rate> = Some(Rate { permits: 2, per_ms: 100, burst: 2 });
        let mut granted: Vec<u64> = Vec::new();
        let mut group_max = Some(2u64);
        // The leader time until which the lock's permit is delayed.
        let mut lock_free_at = 0u64;
        for (i, (advance_ms, ops)) in batches.iter().enumerate() {
            now_ms += advance_ms;
            let batch = Batch { now_ms, commands: ops.iter().map(Op::command).collect() };
            let mut effects = Vec::new();
            state.apply(i as u64 + 2, 1, &batch, &mut effects);
            let time = state.now_ms();
            // A batch that changes a setting is not held to either setting: the events do not
            // say which of its grants came before the change.
            let changes_rate = ops.iter().any(|op| matches!(op, Op::SetRate(_)));
            let changes_cap = ops.iter().any(|op| matches!(op, Op::SetGroupMax(_)));
            for effect in &effects {
                let Effect::Event(event) = effect else { continue };
                let Some(key) = &event.key else { continue };
                match (key.name.as_str(), event.kind) {
                    (RATED, EventKind::Granted | EventKind::Taken) => {
                        granted.extend(std::iter::repeat_n(time, event.permits.unwrap_or(0) as usize));
                        let checked = if changes_cap { None } else { group_max };
                        if let (EventKind::Granted, Some(max), Some(session)) = (event.kind, checked, event.session) {
                            let policy = state.policy(key).expect("a grouped semaphore has a policy");
                            if let Some(group) = policy.groups.get(&session) {
                                prop_assert!(policy.group_held(group) <= max, "{group} above its cap {max}");
                            }
                        }
                    }
                    (LOCK, EventKind::Expired | EventKind::Revoked) => {
                        prop_assert_eq!(event.delay_ms, Some(LOCK_DELAY_MS));
                        lock_free_at = time + LOCK_DELAY_MS;
                    }
                    (LOCK, EventKind::Granted) => {
                        prop_assert!(time >= lock_free_at, "granted at {} in a delay until {}", time, lock_free_at);
                    }
                    _ => {}
                }
            }
            for op in ops {
                match op {
                    Op::SetRate(new) => rate = new.map(|(permits, per_ms, burst)| Rate { permits, per_ms, burst }),
                    Op::SetGroupMax(max) => group_max = *max,
                    _ => {}
                }
            }
            if changes_rate {
                granted.clear();
            }
            // Over any window of leader time T: at most burst + permits × T / per_ms.
            if let Some(rate) = rate {
                for (a, start) in granted.iter().enumerate() {
                    for (b, end) in granted.iter().enumerate().skip(a) {
                        let allowed = rate.burst + rate.permits * (end - start) / rate.per_ms;
                        prop_assert!((b - a + 1) as u64 <= allowed, "{} permits in {} ms under {:?}", b - a + 1, end - start, rate);
                    }
                }
            }
            state.verify().unwrap();
            prop_assert_eq!(&State::decode_snapshot(&state.encode_snapshot()).unwrap(), &state);
        }
        // Every waiting take ends by its deadline.
        let deadline = now_ms + 400;
        state.apply(batches.len() as u64 + 2, 1, &Batch { now_ms: deadline, commands: vec![Command::PolicyTick] }, &mut Vec::new());
        let takers = state.policy(&Key::semaphore(name(RATED))).map_or(0, |policy| policy.takers.len());
        prop_assert_eq!(takers, 0);
    }
}
