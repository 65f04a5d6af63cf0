//! A thread-safe recorder that many harness tasks share.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use crate::call::{Completion, Invocation};
use crate::history::{History, HistoryError, Op, OpId};

/// Records calls from many tasks against one monotonic clock.
///
/// Cloning is cheap and every clone records into the same history. [`Recorder::invoke`]
/// stamps the send time and returns an [`OpHandle`]; [`OpHandle::complete`] stamps the answer.
/// A handle dropped without completing leaves its op [`Outcome::Unknown`](crate::Outcome), which
/// is what a cancelled or panicked task's call is. The lock is held only to append or update
/// one op, never across an await.
///
/// # Examples
///
/// ```
/// use permit_check::{Completion, Invocation, Outcome, Recorder};
///
/// let recorder = Recorder::new();
/// let call = recorder.invoke(Invocation::acquire(1, "a1", "db", 1));
/// // ... send the request, await the answer ...
/// call.complete(Completion { token: Some(4), ..Completion::ok() });
/// let lost = recorder.invoke(Invocation::release(1, "a1", "db"));
/// lost.complete(Completion::unknown("timeout"));
///
/// let history = recorder.history();
/// assert_eq!(history.ops()[0].token, Some(4));
/// assert_eq!(history.ops()[1].outcome, Outcome::Unknown);
/// assert_eq!(history.ops()[1].complete_ns, None);
/// ```
#[derive(Clone, Debug)]
pub struct Recorder {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    origin: Instant,
    ops: Mutex<Vec<Op>>,
}

/// The pending half of a recorded call; complete it when the answer arrives.
#[must_use = "an op handle that is dropped leaves its call unknown"]
#[derive(Debug)]
pub struct OpHandle {
    recorder: Recorder,
    id: OpId,
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Recorder {
        Recorder { shared: Arc::new(Shared { origin: Instant::now(), ops: Mutex::new(Vec::new()) }) }
    }

    /// Nanoseconds since the recorder was made, from the monotonic clock every op uses. Fault
    /// timelines ([`Isolation`](crate::Isolation)) and final reads should use it too.
    pub fn now_ns(&self) -> u64 {
        // u64 nanoseconds last 584 years; saturate rather than wrap.
        u64::try_from(self.shared.origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Records a call being sent now.
    pub fn invoke(&self, invocation: Invocation) -> OpHandle {
        let mut ops = self.lock();
        let id = ops.len() as OpId;
        // Stamp the time under the lock so ids follow invoke times.
        ops.push(Op::invoked(id, invocation, self.now_ns()));
        OpHandle { recorder: self.clone(), id }
    }

    /// A copy of everything recorded so far.
    pub fn history(&self) -> History {
        self.lock().iter().cloned().collect()
    }

    /// Saves a copy of the history as JSON lines (see [`History::save`]).
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the file cannot be written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), HistoryError> {
        self.history().save(path)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Op>> {
        // A task that panicked mid-record leaves a consistent vector: keep recording.
        self.shared.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Default for Recorder {
    fn default() -> Recorder {
        Recorder::new()
    }
}

impl OpHandle {
    /// The id of the recorded op.
    pub fn id(&self) -> OpId {
        self.id
    }

    /// Records the answer, stamped now.
    pub fn complete(self, completion: Completion) {
        let complete_ns = self.recorder.now_ns();
        let mut ops = self.recorder.lock();
        let index = usize::try_from(self.id).expect("op ids are vector indexes");
        ops[index].complete(complete_ns, completion);
    }
}
