//! The recorded history: one [`Op`] per client call, saved as JSON lines.

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Identifies an [`Op`] inside one [`History`]; violations name ops by it.
pub type OpId = u64;

/// What a client asked for. The arguments that only some kinds carry live here.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpKind {
    /// `POST /v1/sessions`. `Ok` carries the new session id in [`Op::session`].
    CreateSession {
        /// The session's TTL, in milliseconds.
        ttl_ms: u64,
    },
    /// A keepalive of [`Op::session`]. `Ok` means the server extended the session.
    Keepalive,
    /// An acquire of [`Op::permits`] on [`Op::semaphore`] for [`Op::session`]. `Ok` means
    /// granted with [`Op::token`]; `Fail` means definitely not granted, with the error code in
    /// [`Op::detail`] (`unavailable` for a try-acquire that did not fit).
    Acquire,
    /// A release of [`Op::session`]'s hold on [`Op::semaphore`]. `Ok` carries the number of
    /// permits released in [`Op::released`] (0 when nothing was held).
    Release,
    /// `POST /v1/semaphores/{name}/validate`. `Ok` carries the answer in [`Op::valid`].
    Validate {
        /// The token asked about.
        token: u64,
    },
    /// A linearizable read of [`Op::semaphore`]. `Ok` carries every holder in [`Op::holders`].
    Describe,
    /// `DELETE /v1/sessions/{id}`: releases every hold of [`Op::session`].
    CloseSession,
    /// A write to the harness's protected resource named [`Op::semaphore`], carrying a token.
    /// `Ok` means the resource accepted it, `Fail` that it rejected it as stale.
    FencedWrite {
        /// The token the writer presented.
        token: u64,
    },
    /// A push of one item with [`Op::payload`] to the queue named [`Op::semaphore`]. `Ok`
    /// carries the new item's id in [`Op::item`].
    Push,
    /// A claim of at most one item of the queue [`Op::semaphore`] for [`Op::session`]. `Ok`
    /// carries the item claimed, if any: [`Op::item`], [`Op::payload`], [`Op::token`] and
    /// [`Op::attempt`].
    Claim {
        /// Names the claim: a retry after a lost answer sends the same, and gets the same claim.
        request_id: u64,
    },
    /// An ack of [`Op::item`] by [`Op::session`]. `Ok` means the item is gone for good; `Fail`
    /// (`claim_lost`) that nothing changed.
    Ack {
        /// The claim's fencing token.
        token: u64,
    },
    /// A nack of [`Op::item`] by [`Op::session`]: pending again, or dead-lettered.
    Nack {
        /// The claim's fencing token.
        token: u64,
    },
}

/// How a call ended, as far as the client knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The call took effect and its answer is in the op.
    Ok,
    /// The call definitely did not take effect (an error answer such as `409 unavailable`).
    Fail,
    /// Timeout, lost connection or no answer: the call may take effect at any time after
    /// [`Op::invoke_ns`], or never. Checkers treat its completion as +∞.
    Unknown,
}

/// One holder of a semaphore, as a describe answers it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Holder {
    /// The holding session.
    pub session: String,
    /// The permits it holds.
    pub permits: u64,
    /// The token of its grant.
    pub token: u64,
}

/// One client call: what was asked, when, and what came back.
///
/// All times are nanoseconds of one monotonic clock of the harness process (see
/// [`Recorder::now_ns`](crate::Recorder::now_ns)). Fields that do not apply to a kind are
/// `None`, empty or 0.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// Unique within the history.
    pub id: OpId,
    /// The client (harness task) that made the call; a client makes one call at a time.
    pub client: u32,
    /// What was asked.
    pub kind: OpKind,
    /// The semaphore (or, for [`OpKind::FencedWrite`], the protected resource); empty for
    /// session calls.
    #[serde(default)]
    pub semaphore: String,
    /// The session the call acts for; empty when none (a describe, or a create that failed).
    #[serde(default)]
    pub session: String,
    /// Permits asked for by an acquire; 0 for other kinds.
    #[serde(default)]
    pub permits: u64,
    /// When the request was sent.
    pub invoke_ns: u64,
    /// When the answer arrived; `None` while pending and for [`Outcome::Unknown`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete_ns: Option<u64>,
    /// How the call ended.
    pub outcome: Outcome,
    /// The token of an `Ok` acquire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// The node that answered (the `permit-node` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<u64>,
    /// The Raft term of the node that answered (the `permit-raft-term` header).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raft_term: Option<u64>,
    /// The error code of a `Fail` (e.g. `unavailable`), or a note on an `Unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The answer of an `Ok` validate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid: Option<bool>,
    /// The permits an `Ok` release released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<u64>,
    /// The holders an `Ok` describe listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holders: Vec<Holder>,
    /// The queue item: the one an ack or a nack settles, an `Ok` push created or an `Ok` claim
    /// took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    /// The item's payload (JSON text): what a push sent, or what a claim handed out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<String>,
    /// The claims of the item so far, this one included, as an `Ok` claim answered it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
}

/// The error code a try-acquire answers when the permits are not free; an `Acquire` `Fail`
/// with this [`Op::detail`] claims the semaphore was full, and the linearizability checker
/// holds it to that.
pub const UNAVAILABLE: &str = "unavailable";

impl Op {
    /// Whether the call is known to have taken effect.
    pub fn is_ok(&self) -> bool {
        self.outcome == Outcome::Ok
    }

    /// The completion time checkers use: `complete_ns`, or +∞ (`u64::MAX`) for an unknown or
    /// still pending call.
    pub fn complete_or_infinity_ns(&self) -> u64 {
        match (self.outcome, self.complete_ns) {
            (Outcome::Unknown, _) | (_, None) => u64::MAX,
            (_, Some(complete_ns)) => complete_ns,
        }
    }
}

/// A history could not be saved or loaded.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// Reading or writing the file failed.
    #[error("history file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A line is not a JSON [`Op`] (lines count from 1).
    #[error("history line {line}: {source}")]
    Json {
        /// The line number, from 1.
        line: usize,
        /// The underlying error.
        source: serde_json::Error,
    },
}

/// Every call the clients made, in the order they were recorded.
///
/// Saved as JSON lines, one [`Op`] per line, so a failed run's history can be kept and
/// checked again.
///
/// # Examples
///
/// ```
/// use permit_check::{Completion, History, Invocation, Op};
///
/// let mut history = History::new();
/// let mut create = Op::invoked(0, Invocation::create_session(1, 2000), 0);
/// create.complete(1_000_000, Completion { session: Some("a1".into()), ..Completion::ok() });
/// history.push(create);
/// let text = history.to_json_lines();
/// assert_eq!(History::from_json_lines(&text)?, history);
/// # Ok::<(), permit_check::HistoryError>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    ops: Vec<Op>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Appends one op. Ids are the caller's; [`check_well_formed`](crate::check_well_formed)
    /// reports duplicates.
    pub fn push(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// Every op, in recording order.
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// The number of ops.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether there are no ops.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// The history as JSON lines, one op per line.
    pub fn to_json_lines(&self) -> String {
        let mut text = String::new();
        for op in &self.ops {
            // An `Op` has only string keys and plain values, so it always serialises.
            text.push_str(&serde_json::to_string(op).expect("an Op serialises to JSON"));
            text.push('\n');
        }
        text
    }

    /// Parses JSON lines; blank lines are skipped.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Json`] with the first bad line.
    pub fn from_json_lines(text: &str) -> Result<History, HistoryError> {
        let mut history = History::new();
        for (index, line) in text.lines().enumerate() {
            history.push_json_line(index + 1, line)?;
        }
        Ok(history)
    }

    /// Writes the history to `path` as JSON lines, replacing the file.
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the file cannot be written.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), HistoryError> {
        let path = path.as_ref();
        let io_error = |source| HistoryError::Io { path: path.to_path_buf(), source };
        let mut writer = BufWriter::new(File::create(path).map_err(io_error)?);
        writer.write_all(self.to_json_lines().as_bytes()).map_err(io_error)?;
        writer.flush().map_err(io_error)
    }

    /// Reads a history written by [`History::save`].
    ///
    /// # Errors
    ///
    /// [`HistoryError::Io`] if the file cannot be read, [`HistoryError::Json`] for a bad line.
    pub fn load(path: impl AsRef<Path>) -> Result<History, HistoryError> {
        let path = path.as_ref();
        let io_error = |source| HistoryError::Io { path: path.to_path_buf(), source };
        let reader = BufReader::new(File::open(path).map_err(io_error)?);
        let mut history = History::new();
        for (index, line) in reader.lines().enumerate() {
            history.push_json_line(index + 1, &line.map_err(io_error)?)?;
        }
        Ok(history)
    }

    fn push_json_line(&mut self, line_number: usize, line: &str) -> Result<(), HistoryError> {
        if line.trim().is_empty() {
            return Ok(());
        }
        let op =
            serde_json::from_str(line).map_err(|source| HistoryError::Json { line: line_number, source })?;
        self.push(op);
        Ok(())
    }
}

impl FromIterator<Op> for History {
    fn from_iter<I: IntoIterator<Item = Op>>(ops: I) -> History {
        History { ops: ops.into_iter().collect() }
    }
}
