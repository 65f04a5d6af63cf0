//! The Wing–Gong/Lowe search with memoisation, as in Porcupine, over one partition.
//!
//! Calls and returns sit in one doubly linked list ordered by time (calls before returns at
//! equal times, so touching ops count as concurrent). The search linearizes the first call it
//! can, lifts it out of the list and starts again from the head; reaching a return means the
//! op it closes could not be placed before it, so it backtracks. A configuration (set of
//! linearized ops, model state) seen once is never explored again: that memo is what makes
//! long histories with little concurrency cheap. Ops without a return (unknown outcome) are
//! optional: the search succeeds once every answered op is linearized.
//!
//! Unknown calls are kept out of the list, in their own invoke-ordered array: at each
//! configuration the search first tries the answered calls before the first return, and only
//! then the unknown calls invoked by that return. The candidates are the same as with one list,
//! so the search is as complete; the order matters because an unknown call stays a candidate
//! for the rest of the history, and trying it first at every step (as one list would, for it
//! sits before every later call) explores "it took effect here" again and again before the
//! usual answer, "it never took effect". A failover that leaves hundreds of open calls then
//! costs little instead of exhausting the budget.

use std::collections::HashSet;
use std::time::Instant;

use super::model::{step, ModelOp, State};

const NIL: usize = usize::MAX;
const HEAD: usize = 0;
/// How many linearized ops a refutation quotes.
const PREFIX_QUOTED: usize = 6;

/// How the search ended.
#[derive(Debug)]
pub(crate) enum Verdict {
    Linearizable,
    Refuted(Refutation),
    OutOfBudget,
}

/// What the deepest attempt reached before every order failed.
#[derive(Clone, Debug, Default)]
pub(crate) struct Refutation {
    /// Answered ops linearized by the deepest attempt.
    pub depth: usize,
    /// The last ops of that attempt (indexes into the partition), oldest first.
    pub prefix: Vec<usize>,
    /// The answered op that attempt could not place.
    pub blocked: Option<usize>,
    /// The model state after the prefix.
    pub state: State,
}

/// The step and time allowance of one search.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allowance {
    pub steps_max: u64,
    pub deadline: Instant,
}

/// Searches a linearization of `ops` from the empty state; returns the verdict and the
/// steps used.
pub(crate) fn search(capacity: u64, ops: &[ModelOp], allowance: Allowance) -> (Verdict, u64) {
    let mut search = Search::new(ops);
    let mut cursor = Cursor::Answered(search.list.next[HEAD]);
    let mut steps = 0;
    loop {
        if search.pending == 0 {
            return (Verdict::Linearizable, steps);
        }
        steps += 1;
        let out_of_time = steps % 1024 == 0 && Instant::now() >= allowance.deadline;
        if steps > allowance.steps_max || out_of_time {
            return (Verdict::OutOfBudget, steps);
        }
        cursor = match cursor {
            Cursor::Answered(entry) => {
                // Entries before the first remaining return are all calls, and one remains while
                // an answered op is pending, so the scan meets a return before the end of the list.
                assert_ne!(entry, NIL, "the scan passed the last return");
                if search.list.is_call[entry] {
                    search.try_pick(capacity, Pick::Answered(entry))
                } else {
                    Cursor::Unknown { at: 0, first_return: entry }
                }
            }
            Cursor::Unknown { at, first_return } => {
                let limit = ops[search.list.op[first_return]].complete_ns.expect("a return has a time");
                match search.unknown.get(at) {
                    Some(&op) if ops[op].invoke_ns <= limit => {
                        search.try_pick(capacity, Pick::Unknown { at, first_return })
                    }
                    // No candidate is left before the first return: its op cannot be placed.
                    _ => {
                        search.note_blocked(first_return);
                        match search.backtrack() {
                            Some(next) => next,
                            None => return (Verdict::Refuted(search.best), steps),
                        }
                    }
                }
            }
        };
    }
}

/// Where the scan for the next call to linearize is.
#[derive(Clone, Copy, Debug)]
enum Cursor {
    /// At a node of the list of answered calls and returns.
    Answered(usize),
    /// At `unknown[at]`, the answered calls before `first_return` having been tried.
    Unknown { at: usize, first_return: usize },
}

/// A call chosen for linearization.
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// An answered call, by its list node.
    Answered(usize),
    /// `unknown[at]`, tried while `first_return` was the first return.
    Unknown { at: usize, first_return: usize },
}

/// A frame of the backtracking stack: a linearized call, the state before it, and the
/// successor states not tried yet.
struct Frame {
    pick: Pick,
    prior: State,
    successors: Vec<State>,
    next_successor: usize,
}

struct Search<'a> {
    ops: &'a [ModelOp],
    list: EventList,
    /// The calls that never answered, by invoke time (they are not in `list`).
    unknown: Vec<usize>,
    state: State,
    linearized: Bitset,
    seen: HashSet<(Bitset, State)>,
    stack: Vec<Frame>,
    /// Answered ops not linearized yet.
    pending: usize,
    answered: usize,
    best: Refutation,
}

impl<'a> Search<'a> {
    fn new(ops: &'a [ModelOp]) -> Search<'a> {
        let answered = ops.iter().filter(|op| op.complete_ns.is_some()).count();
        let mut unknown: Vec<usize> = (0..ops.len()).filter(|&op| ops[op].complete_ns.is_none()).collect();
        unknown.sort_by_key(|&op| (ops[op].invoke_ns, op));
        Search {
            ops,
            list: EventList::new(ops),
            unknown,
            state: State::default(),
            linearized: Bitset::new(ops.len()),
            seen: HashSet::new(),
            stack: Vec::new(),
            pending: answered,
            answered,
            best: Refutation::default(),
        }
    }

    fn op(&self, pick: Pick) -> usize {
        match pick {
            Pick::Answered(node) => self.list.op[node],
            Pick::Unknown { at, .. } => self.unknown[at],
        }
    }

    /// Tries to linearize `pick` (unless it already is); the scan goes on from the start of the
    /// list when it could, else after `pick`.
    fn try_pick(&mut self, capacity: u64, pick: Pick) -> Cursor {
        let op = self.op(pick);
        if !self.linearized.contains(op) {
            let successors = step(capacity, &self.state, &self.ops[op]);
            if self.descend(pick, successors, 0) {
                return self.restart();
            }
        }
        self.after(pick)
    }

    /// The scan position at the start of the list (after a linearization).
    fn restart(&self) -> Cursor {
        Cursor::Answered(self.list.next[HEAD])
    }

    /// The scan position after `pick`, with the list as it was when `pick` was tried.
    fn after(&self, pick: Pick) -> Cursor {
        match pick {
            Pick::Answered(node) => Cursor::Answered(self.list.next[node]),
            Pick::Unknown { at, first_return } => Cursor::Unknown { at: at + 1, first_return },
        }
    }

    /// Linearizes `pick` into the first of `successors[from..]` whose configuration is new;
    /// false when there is none.
    fn descend(&mut self, pick: Pick, successors: Vec<State>, from: usize) -> bool {
        let op = self.op(pick);
        self.linearized.insert(op);
        for index in from..successors.len() {
            if self.seen.insert((self.linearized.clone(), successors[index].clone())) {
                let prior = std::mem::replace(&mut self.state, successors[index].clone());
                self.stack.push(Frame { pick, prior, successors, next_successor: index + 1 });
                if let Pick::Answered(node) = pick {
                    self.list.lift(node);
                }
                if self.ops[op].complete_ns.is_some() {
                    self.pending -= 1;
                }
                self.note_progress();
                return true;
            }
        }
        self.linearized.remove(op);
        false
    }

    /// Undoes the last linearization and tries its next successor; else resumes the scan after
    /// it. `None` when nothing is left to undo: no order works.
    fn backtrack(&mut self) -> Option<Cursor> {
        let frame = self.stack.pop()?;
        let op = self.op(frame.pick);
        if let Pick::Answered(node) = frame.pick {
            self.list.unlift(node);
        }
        self.linearized.remove(op);
        self.state = frame.prior;
        if self.ops[op].complete_ns.is_some() {
            self.pending += 1;
        }
        if self.descend(frame.pick, frame.successors, frame.next_successor) {
            return Some(self.restart());
        }
        Some(self.after(frame.pick))
    }

    fn note_progress(&mut self) {
        let depth = self.answered - self.pending;
        if depth > self.best.depth {
            let quoted = self.stack.len().saturating_sub(PREFIX_QUOTED);
            let prefix = self.stack[quoted..].iter().map(|frame| self.op(frame.pick)).collect();
            self.best = Refutation { depth, prefix, blocked: None, state: self.state.clone() };
        }
    }

    fn note_blocked(&mut self, return_node: usize) {
        if self.answered - self.pending == self.best.depth && self.best.blocked.is_none() {
            self.best.blocked = Some(self.list.op[return_node]);
        }
    }
}

/// The calls and returns of a partition in one doubly linked list, node 0 being the head.
struct EventList {
    next: Vec<usize>,
    prev: Vec<usize>,
    op: Vec<usize>,
    is_call: Vec<bool>,
    /// For a call, its return node.
    return_of: Vec<usize>,
}

impl EventList {
    fn new(ops: &[ModelOp]) -> EventList {
        let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(ops.len() * 2);
        for (index, op) in ops.iter().enumerate() {
            if let Some(complete_ns) = op.complete_ns {
                events.push((op.invoke_ns, false, index));
                events.push((complete_ns, true, index));
            }
        }
        // `false` sorts first: calls before returns at equal times.
        events.sort_unstable();
        let nodes = events.len() + 1;
        let mut list = EventList {
            next: (1..=nodes).map(|next| if next == nodes { NIL } else { next }).collect(),
            prev: (0..nodes).map(|node| node.wrapping_sub(1)).collect(),
            op: vec![NIL; nodes],
            is_call: vec![false; nodes],
            return_of: vec![NIL; nodes],
        };
        let mut call_of = vec![NIL; ops.len()];
        for (position, &(_, is_return, index)) in events.iter().enumerate() {
            let node = position + 1;
            list.op[node] = index;
            list.is_call[node] = !is_return;
            if is_return {
                list.return_of[call_of[index]] = node;
            } else {
                call_of[index] = node;
            }
        }
        list
    }

    fn lift(&mut self, call: usize) {
        self.unlink(call);
        self.unlink(self.return_of[call]);
    }

    /// Exactly reverses `lift`: the removed nodes kept their neighbours.
    fn unlift(&mut self, call: usize) {
        self.relink(self.return_of[call]);
        self.relink(call);
    }

    fn unlink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = next;
        if next != NIL {
            self.prev[next] = prev;
        }
    }

    fn relink(&mut self, node: usize) {
        let (prev, next) = (self.prev[node], self.next[node]);
        self.next[prev] = node;
        if next != NIL {
            self.prev[next] = node;
        }
    }
}

/// The set of linearized ops.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Bitset {
    words: Vec<u64>,
}

impl Bitset {
    fn new(bits: usize) -> Bitset {
        Bitset { words: vec![0; bits.div_ceil(64)] }
    }

    fn insert(&mut self, bit: usize) {
        self.words[bit / 64] |= 1 << (bit % 64);
    }

    fn remove(&mut self, bit: usize) {
        self.words[bit / 64] &= !(1 << (bit % 64));
    }

    fn contains(&self, bit: usize) -> bool {
        self.words[bit / 64] & (1 << (bit % 64)) != 0
    }
}
