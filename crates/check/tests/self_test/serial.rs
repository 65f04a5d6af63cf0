//! Correct histories by construction: a serial execution of a reference semaphore model,
//! with each op's invoke and completion spread around its linearization point so that ops of
//! different clients overlap in real time.

use std::collections::BTreeMap;

use permit_check::{Completion, FinalRead, History, Holder, Invocation, Op, UNAVAILABLE};

/// Long enough that nothing expires during a generated run.
pub const TTL_MS: u64 = 3_600_000;
/// Time between two consecutive linearization points.
const STEP_NS: u64 = 1_000_000;

pub struct Workload {
    pub clients: u32,
    pub ops_per_client: usize,
    pub capacities: Vec<u64>,
    /// Chance that an op gets no answer (its client then stops, as Jepsen's clients do).
    pub unknown_per_mille: u64,
}

pub struct Generated {
    pub history: History,
    pub capacities: BTreeMap<String, u64>,
    pub final_read: FinalRead,
}

/// SplitMix64: enough randomness for a generator, reproducible from the seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound.max(1)
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high.saturating_sub(low) + 1)
    }
}

/// The reference model: holds per (semaphore, client), a global token counter.
#[derive(Clone, Default)]
struct Model {
    capacities: Vec<u64>,
    holds: BTreeMap<(usize, u32), (u64, u64)>,
    last_token: u64,
}

impl Model {
    fn held(&self, semaphore: usize) -> u64 {
        self.holds.iter().filter(|((s, _), _)| *s == semaphore).map(|(_, (permits, _))| permits).sum()
    }

    fn holders(&self, semaphore: usize) -> Vec<Holder> {
        self.holds
            .iter()
            .filter(|((s, _), _)| *s == semaphore)
            .map(|(&(_, client), &(permits, token))| Holder { session: session(client), permits, token })
            .collect()
    }
}

fn session(client: u32) -> String {
    format!("s{client}")
}

fn semaphore(index: usize) -> String {
    format!("sem{index}")
}

pub fn generate(seed: u64, workload: &Workload) -> Generated {
    let mut rng = Rng::new(seed);
    let mut model = Model { capacities: workload.capacities.clone(), ..Model::default() };
    let mut ops: Vec<(Op, u64)> = Vec::new(); // each op with its linearization point
    let mut remaining: Vec<usize> = vec![workload.ops_per_client; workload.clients as usize];
    let mut started = vec![false; workload.clients as usize];
    loop {
        let live: Vec<u32> = (0..workload.clients).filter(|&c| remaining[c as usize] > 0).collect();
        if live.is_empty() {
            break;
        }
        let client = live[rng.below(live.len() as u64) as usize];
        let point_ns = (ops.len() as u64 + 1) * STEP_NS;
        let lost = rng.below(1000) < workload.unknown_per_mille;
        let took_effect = rng.below(2) == 0;
        let before = model.clone();
        let mut op = if started[client as usize] {
            next_call(&mut rng, &mut model, client, remaining[client as usize] == 1)
        } else {
            started[client as usize] = true;
            let invocation = Invocation::create_session(client, TTL_MS);
            answered(invocation, Completion { session: Some(session(client)), ..Completion::ok() })
        };
        op.id = ops.len() as u64;
        remaining[client as usize] -= 1;
        if lost {
            // An unanswered call takes effect or not; the client stops, as Jepsen's do.
            if !took_effect {
                model = before;
            }
            lose_answer(&mut op);
            remaining[client as usize] = 0;
        }
        ops.push((op, point_ns));
    }
    spread_in_time(&mut rng, &mut ops, workload.clients);
    finish(ops, &model)
}

/// Picks and executes the next call of `client` on the model.
fn next_call(rng: &mut Rng, model: &mut Model, client: u32, last: bool) -> Op {
    let sessions = session(client);
    if last && rng.below(2) == 0 {
        model.holds.retain(|&(_, holder), _| holder != client);
        return answered(Invocation::close_session(client, &sessions), Completion::ok());
    }
    let index = rng.below(model.capacities.len() as u64) as usize;
    let name = semaphore(index);
    let held = model.holds.get(&(index, client)).copied();
    match rng.below(10) {
        0..=3 => {
            let permits = rng.between(1, model.capacities[index]);
            let invocation = Invocation::acquire(client, &sessions, &name, permits);
            let answer = match held {
                Some((held_permits, token)) if held_permits == permits => {
                    Completion { token: Some(token), ..Completion::ok() }
                }
                Some(_) => Completion::fail("permits_mismatch"),
                None if model.held(index) + permits <= model.capacities[index] => {
                    model.last_token += 1;
                    model.holds.insert((index, client), (permits, model.last_token));
                    Completion { token: Some(model.last_token), ..Completion::ok() }
                }
                None => Completion::fail(UNAVAILABLE),
            };
            answered(invocation, answer)
        }
        4..=5 => {
            model.holds.remove(&(index, client));
            let released = held.map_or(0, |(permits, _)| permits);
            answered(
                Invocation::release(client, &sessions, &name),
                Completion { released: Some(released), ..Completion::ok() },
            )
        }
        6..=7 => {
            let holders = model.holders(index);
            answered(Invocation::describe(client, &name), Completion { holders, ..Completion::ok() })
        }
        _ => {
            let token = match held {
                Some((_, token)) if rng.below(2) == 0 => token,
                _ => rng.between(1, model.last_token + 2),
            };
            let valid = model.holds.iter().any(|(&(s, _), &(_, t))| s == index && t == token);
            answered(
                Invocation::validate(client, &name, token),
                Completion { valid: Some(valid), ..Completion::ok() },
            )
        }
    }
}

/// Replaces the op's answer by a timeout.
fn lose_answer(op: &mut Op) {
    let mut lost = Op::invoked(op.id, invocation_of(op), 0);
    lost.complete(0, Completion::unknown("timeout"));
    *op = lost;
}

fn invocation_of(op: &Op) -> Invocation {
    Invocation {
        client: op.client,
        kind: op.kind.clone(),
        semaphore: op.semaphore.clone(),
        session: op.session.clone(),
        permits: op.permits,
        item: op.item.clone(),
        payload: op.payload.clone(),
    }
}

fn answered(invocation: Invocation, answer: Completion) -> Op {
    let mut op = Op::invoked(0, invocation, 0);
    op.complete(0, answer);
    op
}

/// Gives each op an invoke before and a completion after its linearization point, keeping
/// every client's ops one after another.
fn spread_in_time(rng: &mut Rng, ops: &mut [(Op, u64)], clients: u32) {
    for client in 0..clients {
        let mine: Vec<usize> = (0..ops.len()).filter(|&at| ops[at].0.client == client).collect();
        let mut free_from_ns = 0;
        for (position, &at) in mine.iter().enumerate() {
            let point_ns = ops[at].1;
            let invoke_ns = rng.between(free_from_ns, point_ns - 1);
            let next_point_ns = mine.get(position + 1).map_or(point_ns + 4 * STEP_NS, |&next| ops[next].1);
            let complete_ns = rng.between(point_ns + 1, point_ns + (next_point_ns - point_ns) / 2);
            let op = &mut ops[at].0;
            op.invoke_ns = invoke_ns;
            if op.complete_ns.is_some() {
                op.complete_ns = Some(complete_ns);
            }
            free_from_ns = complete_ns + 1;
        }
    }
}

fn finish(ops: Vec<(Op, u64)>, model: &Model) -> Generated {
    let end_ns = ops.iter().map(|(_, point_ns)| point_ns).max().copied().unwrap_or(0) + 10 * STEP_NS;
    let holders = (0..model.capacities.len()).map(|index| (semaphore(index), model.holders(index))).collect();
    let capacities =
        model.capacities.iter().enumerate().map(|(index, &capacity)| (semaphore(index), capacity)).collect();
    Generated {
        history: ops.into_iter().map(|(op, _)| op).collect(),
        capacities,
        final_read: FinalRead { invoke_ns: end_ns, complete_ns: end_ns + STEP_NS, holders },
    }
}
