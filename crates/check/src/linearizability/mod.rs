//! I4, linearizability of each semaphore under try-acquires and long TTLs.

mod model;
mod search;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use crate::history::{History, Op, OpId, OpKind, Outcome, UNAVAILABLE};
use crate::report::{op_summary, Invariant, Report, Violation};
use model::{Call, ModelOp, Return, SessionIndex, State};
use search::{search, Allowance, Refutation, Verdict};

/// How much work one [`check_linearizability`] may do, over all semaphores together.
/// Running out is a violation ("checker timed out"), never a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SearchBudget {
    /// Search steps (an attempt to linearize one call, or one backtrack).
    pub steps_max: u64,
    /// Wall time.
    pub time_max: Duration,
}

impl Default for SearchBudget {
    /// 5 million steps or 30 s, whichever comes first.
    fn default() -> SearchBudget {
        SearchBudget { steps_max: 5_000_000, time_max: Duration::from_secs(30) }
    }
}

/// Checks that each semaphore's ops are linearizable against a sequential semaphore model,
/// with a Wing–Gong/Lowe search memoised on (linearized ops, model state), like Porcupine.
///
/// The model of a semaphore is `{capacity, holders: session → (permits, token), max_token}`,
/// starting empty:
/// - an `Ok` acquire grants when the session holds nothing, `permits` fit and its token is
///   larger than every token granted on the semaphore so far; a session that holds gets its
///   own grant back (idempotent repeat, same permits and token);
/// - an acquire `Fail` with detail [`UNAVAILABLE`](crate::UNAVAILABLE) is legal only when the
///   session holds nothing and the permits do not fit; other failures change nothing and
///   constrain nothing;
/// - an `Ok` release removes the session's hold and must report its permits in
///   [`Op::released`](crate::Op::released) (0 when it held nothing); an `Ok` close session
///   removes the session's hold on every semaphore;
/// - an `Ok` describe lists exactly the holders; an `Ok` validate answers whether a holder
///   carries the token.
///
/// Assumptions: acquires do not wait (`wait_ms = 0`, so no queue), sessions never expire
/// (long TTL), and each semaphore starts with no holder. Ops on different semaphores are
/// checked separately (P-compositionality); a close session is projected onto every semaphore
/// its session used. Unknown ops may linearize anywhere after their invoke, or not at all; an
/// unknown acquire that linearizes as a grant holds an unknown token until a describe or
/// validate shows it. `checked` counts the ops searched. A semaphore missing from
/// `capacities` is a violation, and so is running out of `budget`.
///
/// # Examples
///
/// ```
/// use std::collections::BTreeMap;
/// use permit_check::{check_linearizability, Completion, History, Holder, Invocation, Op, SearchBudget};
///
/// let mut acquire = Op::invoked(0, Invocation::acquire(1, "a", "db", 1), 0);
/// acquire.complete(10, Completion { token: Some(1), ..Completion::ok() });
/// let mut release = Op::invoked(1, Invocation::release(1, "a", "db"), 20);
/// release.complete(30, Completion { released: Some(1), ..Completion::ok() });
/// // A read that starts after the release was answered still shows the hold.
/// let mut describe = Op::invoked(2, Invocation::describe(2, "db"), 40);
/// let holder = Holder { session: "a".into(), permits: 1, token: 1 };
/// describe.complete(50, Completion { holders: vec![holder], ..Completion::ok() });
/// let history: History = [acquire, release, describe].into_iter().collect();
///
/// let capacities = BTreeMap::from([("db".to_owned(), 1)]);
/// let report = check_linearizability(&history, &capacities, SearchBudget::default());
/// assert_eq!(report.checked, 3);
/// assert!(report.violations[0].message.contains("not linearizable"));
/// ```
pub fn check_linearizability(
    history: &History,
    capacities: &BTreeMap<String, u64>,
    budget: SearchBudget,
) -> Report {
    let started = Instant::now();
    let deadline = started + budget.time_max;
    let mut steps_left = budget.steps_max;
    let mut report = Report::new(0);
    for (semaphore, ops) in partitions(history) {
        let Some(&capacity) = capacities.get(semaphore) else {
            let message = format!("no capacity given for semaphore `{semaphore}`");
            report.push(Violation::new(Invariant::WellFormed, vec![ops[0].id], message));
            continue;
        };
        let partition = Partition::new(ops);
        report.checked += partition.ops.len();
        let allowance = Allowance { steps_max: steps_left, deadline };
        let (verdict, steps) = search(capacity, &partition.model_ops, allowance);
        steps_left = steps_left.saturating_sub(steps);
        let (ops, message) = match verdict {
            Verdict::Linearizable => continue,
            Verdict::OutOfBudget => (
                Vec::new(),
                format!(
                    "checker timed out on semaphore `{semaphore}` ({} ops) after {} steps in {:.1?} (budget \
                 {} steps, {:.1?}): linearizability not proven",
                    partition.ops.len(),
                    budget.steps_max - steps_left,
                    started.elapsed(),
                    budget.steps_max,
                    budget.time_max
                ),
            ),
            Verdict::Refuted(refutation) => partition.explain(semaphore, capacity, &refutation),
        };
        report.push(Violation::new(Invariant::Linearizability, ops, message));
    }
    report
}

/// Groups the semaphore ops by semaphore and adds each close session to every semaphore its
/// session used.
fn partitions(history: &History) -> BTreeMap<&str, Vec<&Op>> {
    let mut partitions: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    let mut sessions: HashMap<&str, BTreeSet<&str>> = HashMap::new();
    for op in history.ops() {
        let on_semaphore =
            matches!(op.kind, OpKind::Acquire | OpKind::Release | OpKind::Describe | OpKind::Validate { .. });
        if on_semaphore && !op.semaphore.is_empty() {
            partitions.entry(op.semaphore.as_str()).or_default().push(op);
            if !op.session.is_empty() {
                sessions.entry(op.session.as_str()).or_default().insert(op.semaphore.as_str());
            }
        }
    }
    for op in history.ops().iter().filter(|op| op.kind == OpKind::CloseSession) {
        for semaphore in sessions.get(op.session.as_str()).into_iter().flatten() {
            partitions.get_mut(semaphore).expect("sessions only name partitions").push(op);
        }
    }
    partitions
}

/// One semaphore's ops that constrain or change the model, and their model form.
struct Partition<'h> {
    ops: Vec<&'h Op>,
    model_ops: Vec<ModelOp>,
    sessions: Vec<&'h str>,
}

impl<'h> Partition<'h> {
    fn new(all: Vec<&'h Op>) -> Partition<'h> {
        let mut partition = Partition { ops: Vec::new(), model_ops: Vec::new(), sessions: Vec::new() };
        let mut index: HashMap<&'h str, SessionIndex> = HashMap::new();
        for op in all {
            let mut intern = |session: &'h str| {
                *index.entry(session).or_insert_with(|| {
                    partition.sessions.push(session);
                    (partition.sessions.len() - 1) as SessionIndex
                })
            };
            if let Some(model_op) = model_op(op, &mut intern) {
                partition.ops.push(op);
                partition.model_ops.push(model_op);
            }
        }
        partition
    }

    /// The ops to name (the blocked op, then the end of the deepest order) and the message.
    fn explain(&self, semaphore: &str, capacity: u64, refutation: &Refutation) -> (Vec<OpId>, String) {
        let answered = self.model_ops.iter().filter(|op| op.complete_ns.is_some()).count();
        let blocked =
            refutation.blocked.map_or_else(|| "an answered op".to_owned(), |at| op_summary(self.ops[at]));
        let prefix: Vec<String> = refutation.prefix.iter().map(|&at| op_summary(self.ops[at])).collect();
        let ops = refutation.blocked.iter().chain(&refutation.prefix).map(|&at| self.ops[at].id).collect();
        let message = format!(
            "semaphore `{semaphore}` (capacity {capacity}) is not linearizable: at most {} of {answered} \
             answered ops linearize, then {blocked} cannot be placed. Last ops of that order: [{}]. \
             Model state after them: {}",
            refutation.depth,
            prefix.join("; "),
            self.state_summary(&refutation.state)
        );
        (ops, message)
    }

    fn state_summary(&self, state: &State) -> String {
        let holds: Vec<String> = state
            .holds
            .iter()
            .map(|hold| {
                let token = hold.token.map_or_else(|| "unknown".to_owned(), |token| token.to_string());
                format!("`{}` holds {} (token {token})", self.sessions[hold.session as usize], hold.permits)
            })
            .collect();
        format!("{{{}}}, max token {}", holds.join(", "), state.max_token)
    }
}

/// The model form of `op`, or `None` when its answer neither changes nor constrains the model.
fn model_op<'h>(op: &'h Op, intern: &mut impl FnMut(&'h str) -> SessionIndex) -> Option<ModelOp> {
    let ret = match (&op.kind, op.outcome) {
        (OpKind::Acquire | OpKind::Release | OpKind::CloseSession, Outcome::Unknown) => Return::Unknown,
        (OpKind::Acquire, Outcome::Ok) => Return::Granted { token: op.token? },
        (OpKind::Acquire, Outcome::Fail) if op.detail.as_deref() == Some(UNAVAILABLE) => Return::Unavailable,
        (OpKind::Release, Outcome::Ok) => Return::Released { permits: op.released },
        (OpKind::CloseSession, Outcome::Ok) => Return::Closed,
        (OpKind::Describe, Outcome::Ok) => {
            let mut holders: Vec<(SessionIndex, u64, u64)> = op
                .holders
                .iter()
                .map(|holder| (intern(&holder.session), holder.permits, holder.token))
                .collect();
            holders.sort_unstable();
            Return::Holders(holders)
        }
        (OpKind::Validate { .. }, Outcome::Ok) => Return::Valid(op.valid?),
        _ => return None,
    };
    let call = match op.kind {
        OpKind::Acquire => Call::Acquire { session: intern(&op.session), permits: op.permits },
        OpKind::Release => Call::Release { session: intern(&op.session) },
        OpKind::CloseSession => Call::Close { session: intern(&op.session) },
        OpKind::Describe => Call::Describe,
        OpKind::Validate { token } => Call::Validate { token },
        OpKind::CreateSession { .. }
        | OpKind::Keepalive
        | OpKind::FencedWrite { .. }
        | OpKind::Push
        | OpKind::Claim { .. }
        | OpKind::Ack { .. }
        | OpKind::Nack { .. } => return None,
    };
    let complete_ns = if ret == Return::Unknown { None } else { op.complete_ns };
    Some(ModelOp { invoke_ns: op.invoke_ns, complete_ns, call, ret })
}
