//! The two halves of an [`Op`]: what is known when a call is sent ([`Invocation`]) and what
//! is learnt when its answer arrives ([`Completion`]).

use crate::history::{Holder, Op, OpId, OpKind, Outcome};

/// A call as it is sent: who asks for what.
///
/// # Examples
///
/// ```
/// use permit_check::{Invocation, OpKind};
///
/// let acquire = Invocation::acquire(3, "a1", "db", 2);
/// assert_eq!(acquire.kind, OpKind::Acquire);
/// assert_eq!(acquire.permits, 2);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invocation {
    /// The calling client.
    pub client: u32,
    /// What is asked.
    pub kind: OpKind,
    /// The semaphore, or the protected resource of a fenced write; empty for session calls.
    pub semaphore: String,
    /// The session; empty for a create or a describe.
    pub session: String,
    /// Permits asked for by an acquire, else 0.
    pub permits: u64,
    /// The queue item an ack or a nack settles.
    pub item: Option<String>,
    /// The payload a push sends.
    pub payload: Option<String>,
}

impl Invocation {
    /// Creates a session with `ttl_ms`; its id arrives with the [`Completion`].
    pub fn create_session(client: u32, ttl_ms: u64) -> Invocation {
        Invocation::new(client, OpKind::CreateSession { ttl_ms }, "", "", 0)
    }

    /// Keeps `session` alive.
    pub fn keepalive(client: u32, session: &str) -> Invocation {
        Invocation::new(client, OpKind::Keepalive, "", session, 0)
    }

    /// Acquires `permits` of `semaphore` for `session`.
    pub fn acquire(client: u32, session: &str, semaphore: &str, permits: u64) -> Invocation {
        Invocation::new(client, OpKind::Acquire, semaphore, session, permits)
    }

    /// Releases `session`'s hold on `semaphore`.
    pub fn release(client: u32, session: &str, semaphore: &str) -> Invocation {
        Invocation::new(client, OpKind::Release, semaphore, session, 0)
    }

    /// Asks whether `token` belongs to a current holder of `semaphore`.
    pub fn validate(client: u32, semaphore: &str, token: u64) -> Invocation {
        Invocation::new(client, OpKind::Validate { token }, semaphore, "", 0)
    }

    /// Reads the holders of `semaphore`.
    pub fn describe(client: u32, semaphore: &str) -> Invocation {
        Invocation::new(client, OpKind::Describe, semaphore, "", 0)
    }

    /// Closes `session`, releasing its holds.
    pub fn close_session(client: u32, session: &str) -> Invocation {
        Invocation::new(client, OpKind::CloseSession, "", session, 0)
    }

    /// Writes to the protected `resource` with `token`, on behalf of `session`.
    pub fn fenced_write(client: u32, session: &str, resource: &str, token: u64) -> Invocation {
        Invocation::new(client, OpKind::FencedWrite { token }, resource, session, 0)
    }

    /// Pushes one item with `payload` (JSON text) to `queue`.
    pub fn push(client: u32, queue: &str, payload: &str) -> Invocation {
        Invocation {
            payload: Some(payload.to_owned()),
            ..Invocation::new(client, OpKind::Push, queue, "", 0)
        }
    }

    /// Claims at most one item of `queue` for `session`, naming the claim `request_id`.
    pub fn claim(client: u32, session: &str, queue: &str, request_id: u64) -> Invocation {
        Invocation::new(client, OpKind::Claim { request_id }, queue, session, 0)
    }

    /// Acks `item` of `queue`, claimed by `session` with `token`.
    pub fn ack(client: u32, session: &str, queue: &str, item: &str, token: u64) -> Invocation {
        Invocation {
            item: Some(item.to_owned()),
            ..Invocation::new(client, OpKind::Ack { token }, queue, session, 0)
        }
    }

    /// Nacks `item` of `queue`, claimed by `session` with `token`.
    pub fn nack(client: u32, session: &str, queue: &str, item: &str, token: u64) -> Invocation {
        Invocation {
            item: Some(item.to_owned()),
            ..Invocation::new(client, OpKind::Nack { token }, queue, session, 0)
        }
    }

    fn new(client: u32, kind: OpKind, semaphore: &str, session: &str, permits: u64) -> Invocation {
        Invocation {
            client,
            kind,
            semaphore: semaphore.to_owned(),
            session: session.to_owned(),
            permits,
            item: None,
            payload: None,
        }
    }
}

/// A call's answer. Build it from [`Completion::ok`], [`Completion::fail`] or
/// [`Completion::unknown`] and fill in what the answer carried with struct update syntax.
///
/// # Examples
///
/// ```
/// use permit_check::{Completion, Outcome};
///
/// let granted = Completion { token: Some(17), node: Some(2), raft_term: Some(5), ..Completion::ok() };
/// assert_eq!(granted.outcome, Outcome::Ok);
/// let full = Completion::fail("unavailable");
/// assert_eq!(full.detail.as_deref(), Some("unavailable"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// How the call ended.
    pub outcome: Outcome,
    /// The session id a create answered (replaces [`Op::session`]).
    pub session: Option<String>,
    /// The token of a grant.
    pub token: Option<u64>,
    /// The node that answered.
    pub node: Option<u64>,
    /// That node's Raft term.
    pub raft_term: Option<u64>,
    /// The error code of a failure, or a note on an unknown outcome.
    pub detail: Option<String>,
    /// The answer of a validate.
    pub valid: Option<bool>,
    /// The permits a release released.
    pub released: Option<u64>,
    /// The holders a describe listed.
    pub holders: Vec<Holder>,
    /// The item a push created or a claim took.
    pub item: Option<String>,
    /// The payload of the item a claim took.
    pub payload: Option<String>,
    /// The attempt of the item a claim took.
    pub attempt: Option<u32>,
}

impl Completion {
    /// A successful answer carrying nothing yet.
    pub fn ok() -> Completion {
        Completion::with_outcome(Outcome::Ok, None)
    }

    /// An error answer that proves the call had no effect, with its error code.
    pub fn fail(code: impl Into<String>) -> Completion {
        Completion::with_outcome(Outcome::Fail, Some(code.into()))
    }

    /// No usable answer (timeout, lost connection), with a note saying why.
    pub fn unknown(note: impl Into<String>) -> Completion {
        Completion::with_outcome(Outcome::Unknown, Some(note.into()))
    }

    fn with_outcome(outcome: Outcome, detail: Option<String>) -> Completion {
        Completion {
            outcome,
            session: None,
            token: None,
            node: None,
            raft_term: None,
            detail,
            valid: None,
            released: None,
            holders: Vec::new(),
            item: None,
            payload: None,
            attempt: None,
        }
    }
}

impl Op {
    /// A call just sent: outcome [`Outcome::Unknown`] until [`Op::complete`] is called, which
    /// is also what it stays if the answer never comes.
    pub fn invoked(id: OpId, invocation: Invocation, invoke_ns: u64) -> Op {
        Op {
            id,
            client: invocation.client,
            kind: invocation.kind,
            semaphore: invocation.semaphore,
            session: invocation.session,
            permits: invocation.permits,
            invoke_ns,
            complete_ns: None,
            outcome: Outcome::Unknown,
            token: None,
            node: None,
            raft_term: None,
            detail: None,
            valid: None,
            released: None,
            holders: Vec::new(),
            item: invocation.item,
            payload: invocation.payload,
            attempt: None,
        }
    }

    /// Records the answer. An unknown outcome keeps `complete_ns` at `None` (completion +∞)
    /// and writes the time it was given up on into the detail.
    pub fn complete(&mut self, complete_ns: u64, completion: Completion) {
        self.outcome = completion.outcome;
        self.complete_ns = match completion.outcome {
            Outcome::Unknown => None,
            Outcome::Ok | Outcome::Fail => Some(complete_ns),
        };
        if let Some(session) = completion.session {
            self.session = session;
        }
        self.token = completion.token;
        self.node = completion.node;
        self.raft_term = completion.raft_term;
        self.detail = match (completion.outcome, completion.detail) {
            (Outcome::Unknown, note) => {
                Some(format!("{} (given up at {complete_ns} ns)", note.unwrap_or_default()))
            }
            (_, detail) => detail,
        };
        self.valid = completion.valid;
        self.released = completion.released;
        self.holders = completion.holders;
        if let Some(item) = completion.item {
            self.item = Some(item);
        }
        if let Some(payload) = completion.payload {
            self.payload = Some(payload);
        }
        self.attempt = completion.attempt;
    }
}
