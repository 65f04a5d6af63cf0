//! The recorder shared by every task of one simulation: the history that the checker reads, a
//! trace of the latest events (printed when a seed fails), and the violations found so far.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use permit_server::raft::NodeId;
use tokio::time::Instant;

use crate::history::{Answer, ClientId, Event, History, Operation, Point};

/// Most trace lines kept; older ones are dropped.
const TRACE_LINES_MAX: usize = 2000;

/// Records one simulation.
pub struct Recorder {
    start: Instant,
    inner: Mutex<RecorderState>,
}

#[derive(Default)]
struct RecorderState {
    history: History,
    trace: VecDeque<String>,
    violations: Vec<String>,
    next_op: u64,
}

impl RecorderState {
    fn trace(&mut self, line: String) {
        if self.trace.len() == TRACE_LINES_MAX {
            self.trace.pop_front();
        }
        self.trace.push_back(line);
    }
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder { start: Instant::now(), inner: Mutex::new(RecorderState::default()) })
    }

    fn lock(&self) -> MutexGuard<'_, RecorderState> {
        self.inner.lock().expect("recorder lock")
    }

    /// Simulated time since the start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Records an event now.
    pub fn record(&self, client: ClientId, event: Event) -> Point {
        let at = self.elapsed();
        let mut state = self.lock();
        let point = state.history.push(at, client, event);
        let line = state.history.records.last().expect("just pushed").to_string();
        state.trace(line);
        point
    }

    /// Records that `client` sent `operation` to `node`; returns the id of its answer.
    pub fn invoke(&self, client: ClientId, node: NodeId, operation: Operation) -> u64 {
        let op = {
            let mut state = self.lock();
            state.next_op += 1;
            state.next_op
        };
        self.record(client, Event::Invoked { op, node, operation });
        op
    }

    /// Records the answer to `op`.
    pub fn ack(&self, client: ClientId, op: u64, answer: Answer) {
        self.record(client, Event::Acked { op, answer });
    }

    /// Adds a line to the trace only (faults, leader changes).
    pub fn note(&self, text: impl std::fmt::Display) {
        let line = format!("{:.3}s {text}", self.elapsed().as_secs_f64());
        self.lock().trace(line);
    }

    /// Reports a broken invariant.
    pub fn violation(&self, text: impl std::fmt::Display) {
        let line = format!("{:.3}s VIOLATION {text}", self.elapsed().as_secs_f64());
        let mut state = self.lock();
        state.trace(line.clone());
        state.violations.push(line);
    }

    /// The violations reported so far.
    pub fn violations(&self) -> Vec<String> {
        self.lock().violations.clone()
    }

    /// A copy of the history.
    pub fn history(&self) -> History {
        self.lock().history.clone()
    }

    /// The last `lines` trace lines.
    pub fn trace_tail(&self, lines: usize) -> Vec<String> {
        let state = self.lock();
        state.trace.iter().skip(state.trace.len().saturating_sub(lines)).cloned().collect()
    }
}
