//! Group commit: gathers the commands of concurrent requests into one log entry.
//!
//! openraft 0.9 makes one fsync per leader append, so one command per entry would cap writes at
//! one fsync each. The proposer takes every command waiting in its queue (up to
//! `COMMANDS_PER_BATCH_MAX`) into one [`Batch`], writes it, and answers each request with its own
//! outcome. While one batch is being written the next one fills up.
//!
//! A batch whose apply ended queued waits (a release granting the queue's head) has just
//! answered those waiters, and their clients' next commands (typically their releases) are on
//! the way. Cutting the next batch at its first command left the later ones for the batch
//! after, so a handoff took two writes instead of one. So the proposer waits for one
//! command from each woken session before it cuts, but no longer than about one write
//! (`HandoffWait`): a session that sends nothing costs the commands already queued about what
//! catching a straggler in the next batch would. The wait only chooses which commands share
//! the next fsync; a release is still durable before its successor is granted. A queue item's
//! ack wakes its session the same way: the worker claims its next item at once, and a claim that
//! would block then shares a write with the pushes that arrive beside it, as many as recent such
//! batches carried (producers answered together push again together).

use std::sync::Arc;
use std::time::Duration;

use openraft::error::ClientWriteError;
use permit_core::limits::COMMANDS_PER_BATCH_MAX;
use permit_core::{Batch, Command, Outcome, SessionId};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::raft::clock::LeaderClock;
use crate::raft::replica::Replica;
use crate::raft::{NodeId, Raft};

/// Most commands queued for the proposer before requests wait to enqueue (back-pressure).
const QUEUE_CAPACITY: usize = 16 * 1024;
/// Times the proposer yields to other tasks before it cuts a batch, when the last batch had
/// more than one command (requests arrive together). After a batch of one (a lone client) it
/// cuts at once: the yields would find nothing to add and only delay that client's acquire
/// (`docs/performance.md`, *Server CPU per request*).
const COALESCE_YIELDS: usize = 2;
/// A batch is cut once its commands' encoded size reaches this many bytes, so that one log entry
/// stays under `crate::raft::bounds::ENTRY_BYTES_MAX`, which allows one more command of this size
/// (the largest command, an expiry of 1024 sessions, is about 17 KiB; an acquire with a 4 KiB
/// election value about 4.3 KiB).
pub(crate) const BATCH_BYTES_SOFT_MAX: usize = 256 * 1024;
/// Most the proposer waits for the commands of the sessions a batch woke (see [`HandoffWait`]),
/// however slow the writes have been.
const HANDOFF_WAIT_MAX: Duration = Duration::from_millis(5);
/// Longest wait for one batch to commit before its requests are answered `Timeout`.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a proposal did not produce an outcome.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ProposeError {
    /// This node is not the leader.
    #[error("not the leader")]
    NotLeader {
        /// The leader, if this node knows it.
        leader: Option<(NodeId, String)>,
    },
    /// The node is shutting down.
    #[error("shutting down")]
    ShuttingDown,
    /// Not committed within the commit timeout: the outcome is unknown.
    #[error("not committed in time")]
    Timeout,
    /// The command needs a newer cluster feature version (`raft::version`); nothing was
    /// proposed.
    #[error("needs cluster feature version {needs}; the cluster is at {cluster}")]
    FeatureUnavailable {
        /// The version the command needs.
        needs: u32,
        /// The cluster's version.
        cluster: u32,
        /// The members that do not speak `needs` as the leader last probed them, with their
        /// versions (`None`: no answer).
        older: Vec<(NodeId, Option<u32>)>,
    },
}

struct Proposal {
    command: Command,
    reply: oneshot::Sender<Result<Outcome, ProposeError>>,
}

/// Handle to the proposer task.
#[derive(Clone)]
pub(crate) struct Proposer {
    queue: mpsc::Sender<Proposal>,
}

impl Proposer {
    /// Starts the proposer task for `raft`.
    pub(crate) fn start(
        raft: Raft,
        clock: Arc<LeaderClock>,
        replica: Arc<Replica>,
        metrics: Arc<Metrics>,
        notifier: Arc<Notifier>,
    ) -> Proposer {
        let (queue, receiver) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(run(raft, clock, replica, metrics, notifier, receiver));
        Proposer { queue }
    }

    /// Proposes one command and waits until it is committed and applied.
    ///
    /// # Errors
    /// [`ProposeError`] when this node cannot commit it.
    ///
    /// # Cancel safety
    /// Dropping the future does not withdraw the command: it may still be applied.
    pub(crate) async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        let (reply, outcome) = oneshot::channel();
        self.queue.send(Proposal { command, reply }).await.map_err(|_| ProposeError::ShuttingDown)?;
        outcome.await.map_err(|_| ProposeError::ShuttingDown)?
    }
}

async fn run(
    raft: Raft,
    clock: Arc<LeaderClock>,
    replica: Arc<Replica>,
    metrics: Arc<Metrics>,
    notifier: Arc<Notifier>,
    mut receiver: mpsc::Receiver<Proposal>,
) {
    let mut proposals = Vec::with_capacity(64);
    let mut handoff = HandoffWait::default();
    let mut last_batch = 0;
    loop {
        // Proposals left over from a batch cut by size go first, without waiting.
        if proposals.is_empty() {
            if receiver.recv_many(&mut proposals, COMMANDS_PER_BATCH_MAX).await == 0 {
                break;
            }
            // Let handlers that are ready (requests already in their sockets) enqueue too, so
            // that they share this fsync: a yield costs microseconds, a fixed delay would cost
            // latency. Not after a batch of one: nothing came along with it.
            if last_batch > 1 {
                for _ in 0..COALESCE_YIELDS {
                    tokio::task::yield_now().await;
                }
            }
        }
        take_queued(&mut receiver, &mut proposals);
        handoff.wait(&mut receiver, &mut proposals, &metrics).await;
        handoff.wait_for_push(&mut receiver, &mut proposals, &replica).await;
        let cut = batch_cut(&proposals);
        let (commands, replies): (Vec<Command>, Vec<_>) =
            proposals.drain(..cut).map(|proposal| (proposal.command, proposal.reply)).unzip();
        // An ack that claims next wakes its session, unless its claim is left waiting: then the
        // session sends nothing until a push serves it (see `HandoffWait::written`).
        let acks_claiming: Vec<(usize, SessionId)> = commands
            .iter()
            .enumerate()
            .filter_map(|(at, command)| match command {
                Command::AckAndClaim { session, .. } => Some((at, *session)),
                _ => None,
            })
            .collect();
        metrics.observe_batch(commands.len());
        last_batch = commands.len();
        let batch = Batch { now_ms: clock.now_ms(replica.now_ms()), commands };
        // The runtime's clock, not the wall's: the handoff waits as long as writes take, and in
        // the simulation's paused time a real-time measure would make a seed's waits depend on
        // the machine's load (a seed then did not replay).
        let started = Instant::now();
        // One batch in flight at a time: while it is written, the next one fills up. A batch
        // that cannot commit (a leader cut off from its quorum) is answered `Timeout` and no
        // longer holds up the ones behind it.
        let result = match raft.client_write_ff(batch).await {
            Ok(pending) => match tokio::time::timeout(COMMIT_TIMEOUT, pending).await {
                Ok(Ok(result)) => result.map_err(not_leader),
                Ok(Err(_)) | Err(_) if raft.metrics().borrow().running_state.is_err() => {
                    Err(ProposeError::ShuttingDown)
                }
                Ok(Err(_)) => Err(ProposeError::NotLeader { leader: None }),
                Err(_) => Err(ProposeError::Timeout),
            },
            Err(_) => Err(ProposeError::ShuttingDown),
        };
        let written = started.elapsed();
        metrics.observe_write(written.as_secs_f64());
        handoff.written(result.is_ok().then_some(written), &notifier);
        if let Ok(response) = &result {
            for (at, session) in &acks_claiming {
                let waiting = matches!(response.data.get(*at), Some(Outcome::ClaimWaiting));
                if let Some(woken) =
                    handoff.woken.iter().position(|woken| woken == session).filter(|_| waiting)
                {
                    handoff.woken.remove(woken);
                }
            }
        }
        match result {
            Ok(response) => {
                debug_assert_eq!(response.data.len(), replies.len(), "one outcome per command");
                for (reply, outcome) in replies.into_iter().zip(response.data) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(error) => {
                for reply in replies {
                    let _ = reply.send(Err(error.clone()));
                }
            }
        }
    }
}

/// Waiting for the next commands of the sessions whose waits the last batch ended.
#[derive(Default)]
struct HandoffWait {
    /// Sessions woken by the last batch's apply that have not proposed since.
    woken: Vec<SessionId>,
    /// When the last batch's outcome arrived.
    since: Option<Instant>,
    /// Moving average of a successful batch's write (append, fsync, commit, apply; each capped
    /// at [`HANDOFF_WAIT_MAX`]), in seconds: the most the next batch waits.
    write_seconds: f64,
    /// The pushes that the last [`PUSHES_REMEMBERED`] batches with a blocked claim carried for
    /// the claims' queues, oldest overwritten first: [`HandoffWait::wait_for_push`] expects as
    /// many as the most of them.
    pushes: [usize; PUSHES_REMEMBERED],
    /// Batches with a blocked claim so far (where the next count in `pushes` goes).
    blocked_batches: usize,
}

/// Batches with a blocked claim whose pushes [`HandoffWait::wait_for_push`] remembers: enough
/// that a batch a straggling producer missed does not lower the expectation, few enough that
/// producers that stopped pushing stop being waited for within a few batches.
const PUSHES_REMEMBERED: usize = 8;

impl HandoffWait {
    /// Records that a batch was written in `written` (`None`: it failed) and collects the
    /// sessions its apply woke.
    fn written(&mut self, written: Option<Duration>, notifier: &Notifier) {
        if let Some(written) = written {
            let seconds = written.min(HANDOFF_WAIT_MAX).as_secs_f64();
            self.write_seconds = if self.write_seconds == 0.0 {
                seconds
            } else {
                0.875 * self.write_seconds + 0.125 * seconds
            };
        }
        self.since = Some(Instant::now());
        self.woken.clear();
        notifier.take_woken(&mut self.woken);
    }

    /// Receives into `proposals` until each woken session has a command there, the batch is
    /// full, or one write's time has passed since the last batch's outcome. Sleeps on the
    /// queue meanwhile (spinning on yields took the CPU that the woken clients' requests need,
    /// and did not pay on 2 cores). tokio's timer rounds the deadline up to its millisecond
    /// tick, so a session that sends nothing costs the batch up to a write plus about 1 ms.
    async fn wait(
        &mut self,
        receiver: &mut mpsc::Receiver<Proposal>,
        proposals: &mut Vec<Proposal>,
        metrics: &Metrics,
    ) {
        if self.woken.is_empty() {
            return;
        }
        let waited_for = self.woken.len();
        let deadline = self.since.unwrap_or_else(Instant::now) + Duration::from_secs_f64(self.write_seconds);
        let mut scanned = 0;
        loop {
            for proposal in &proposals[scanned..] {
                if let Some(session) = session_of(&proposal.command) {
                    self.woken.retain(|woken| *woken != session);
                }
            }
            scanned = proposals.len();
            if self.woken.is_empty() || proposals.len() >= COMMANDS_PER_BATCH_MAX {
                break;
            }
            match tokio::time::timeout_at(deadline, receiver.recv()).await {
                Ok(Some(proposal)) => proposals.push(proposal),
                Ok(None) | Err(_) => break,
            }
            take_queued(receiver, proposals);
        }
        metrics.observe_handoff_wait(waited_for, self.woken.len());
        self.woken.clear();
    }
}

impl HandoffWait {
    /// A batch with a claim that would block (its queue has nothing pending) waits for pushes to
    /// that queue, no longer than one write's time: in a worker's loop the next push is usually
    /// on its way, and written in one entry with it, the claim is served by the push's apply
    /// instead of a write later. It waits for as many pushes as recent such batches carried
    /// (at least one): producers whose pushes the last batch answered push again a few µs
    /// apart, and cutting at the first left the others a whole write behind. Like
    /// [`HandoffWait::wait`], it only chooses which commands share a write.
    async fn wait_for_push(
        &mut self,
        receiver: &mut mpsc::Receiver<Proposal>,
        proposals: &mut Vec<Proposal>,
        replica: &Replica,
    ) {
        let mut blocked: Vec<&permit_core::Name> = Vec::new();
        {
            let replica = replica.read();
            for proposal in proposals.iter() {
                if let Command::Claim { queue, wait_ms, .. } | Command::AckAndClaim { queue, wait_ms, .. } =
                    &proposal.command
                {
                    let empty = replica.state.queue(queue).is_some_and(|q| q.first_pending().is_none());
                    if *wait_ms > 0 && empty && !blocked.contains(&queue) {
                        blocked.push(queue);
                    }
                }
            }
        }
        if blocked.is_empty() {
            return;
        }
        let blocked: Vec<permit_core::Name> = blocked.into_iter().cloned().collect();
        let pushed = |proposal: &Proposal| matches!(&proposal.command, Command::Push { queue, .. } if blocked.contains(queue));
        let expected = self.pushes.iter().copied().max().unwrap_or(0).max(1);
        let deadline = Instant::now() + Duration::from_secs_f64(self.write_seconds);
        let mut scanned = 0;
        let mut pushes = 0;
        loop {
            pushes += proposals[scanned..].iter().filter(|proposal| pushed(proposal)).count();
            scanned = proposals.len();
            if pushes >= expected || proposals.len() >= COMMANDS_PER_BATCH_MAX {
                break;
            }
            match tokio::time::timeout_at(deadline, receiver.recv()).await {
                Ok(Some(proposal)) => proposals.push(proposal),
                Ok(None) | Err(_) => break,
            }
            take_queued(receiver, proposals);
        }
        self.pushes[self.blocked_batches % PUSHES_REMEMBERED] = pushes;
        self.blocked_batches = self.blocked_batches.wrapping_add(1);
    }
}

/// Moves the proposals queued now into `proposals`, up to a batch's worth.
fn take_queued(receiver: &mut mpsc::Receiver<Proposal>, proposals: &mut Vec<Proposal>) {
    while proposals.len() < COMMANDS_PER_BATCH_MAX {
        match receiver.try_recv() {
            Ok(proposal) => proposals.push(proposal),
            Err(_) => break,
        }
    }
}

/// The session on whose behalf `command` is proposed, if it is one session's request.
fn session_of(command: &Command) -> Option<SessionId> {
    match command {
        Command::Acquire(acquire)
        | Command::AcquireEphemeral(acquire)
        | Command::AcquireBy { acquire, .. }
        | Command::AcquireInGroup { acquire, .. } => Some(acquire.session),
        Command::Release { session, .. }
        | Command::CloseSession { id: session }
        | Command::Claim { session, .. }
        | Command::CancelClaim { session, .. }
        | Command::Ack { session, .. }
        | Command::Nack { session, .. }
        | Command::AckAndClaim { session, .. } => Some(*session),
        // Listed, not a wildcard: a new command must be placed here (the queue commands were
        // missed behind a wildcard, and every handoff waited out the whole wait).
        Command::CreateSession { .. }
        | Command::ExpireSessions { .. }
        | Command::PutSemaphore { .. }
        | Command::DeleteSemaphore { .. }
        | Command::ExpireHolds
        | Command::CreateOwnedSession { .. }
        | Command::CreateToken { .. }
        | Command::DeleteToken { .. }
        | Command::Revoke { .. }
        | Command::PutSemaphoreBy { .. }
        | Command::SetTokenSalt { .. }
        | Command::SetClusterVersion { .. }
        | Command::Proclaim { .. }
        | Command::PutQueue { .. }
        | Command::DeleteQueue { .. }
        | Command::Push { .. }
        | Command::RemoveItem { .. }
        | Command::PromoteDueItems
        | Command::PutSemaphorePolicy { .. }
        | Command::Take { .. }
        | Command::CancelTake { .. }
        | Command::PolicyTick => None,
    }
}

/// How many of `proposals` (at least one) go into the next batch: all of them, or as many as
/// reach [`BATCH_BYTES_SOFT_MAX`] encoded bytes.
fn batch_cut(proposals: &[Proposal]) -> usize {
    let mut bytes = 0;
    for (taken, proposal) in proposals.iter().enumerate() {
        if bytes >= BATCH_BYTES_SOFT_MAX {
            return taken.max(1);
        }
        bytes += postcard::experimental::serialized_size(&proposal.command).unwrap_or(BATCH_BYTES_SOFT_MAX);
    }
    proposals.len()
}

fn not_leader(error: ClientWriteError<NodeId, openraft::BasicNode>) -> ProposeError {
    match error {
        ClientWriteError::ForwardToLeader(forward) => ProposeError::NotLeader {
            leader: forward.leader_id.zip(forward.leader_node.map(|node| node.addr)),
        },
        ClientWriteError::ChangeMembershipError(_) => unreachable!("the proposer never changes membership"),
    }
}

#[cfg(test)]
mod tests {
    use permit_core::{Name, QueueSettings};

    use super::*;

    /// A proposal whose outcome nobody awaits.
    fn proposal(command: Command) -> Proposal {
        Proposal { command, reply: oneshot::channel().0 }
    }

    /// Producers whose pushes a batch answered push again a few µs apart: a batch with a claim
    /// that would block waits for as many pushes as recent such batches carried, not only the
    /// first, and no longer than one write when they do not come.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_claim_waits_for_as_many_pushes_as_recent_batches_carried() {
        let queue = Name::new("jobs").expect("a name");
        let replica = Replica::default();
        let create =
            Command::PutQueue { name: queue.clone(), settings: QueueSettings::default(), creator: None };
        let version = Command::SetClusterVersion { version: permit_core::FEATURE_VERSION };
        let batch = Batch { now_ms: 1, commands: vec![version, create] };
        let outcomes = replica.write().state.apply(1, 1, &batch, &mut Vec::new());
        assert!(outcomes.iter().all(|outcome| !matches!(outcome, Outcome::Refused(_))), "{outcomes:?}");
        let session = SessionId::from_bytes([7; 16]);
        let claim = Command::Claim { queue: queue.clone(), session, request: 1, max: 1, wait_ms: 1000 };
        let push = Command::Push { queue: queue.clone(), items: Vec::new(), creator: None };
        let (sender, mut receiver) = mpsc::channel(16);
        // tokio's timer ticks in milliseconds: a write of 10 ms, pushes 1 ms apart.
        let mut handoff = HandoffWait { write_seconds: 0.010, ..HandoffWait::default() };

        // A batch that came with three pushes: cut at once.
        let mut proposals: Vec<Proposal> =
            [&claim, &push, &push, &push].into_iter().cloned().map(proposal).collect();
        let started = Instant::now();
        handoff.wait_for_push(&mut receiver, &mut proposals, &replica).await;
        assert_eq!((proposals.len(), started.elapsed()), (4, Duration::ZERO));

        // The next has one push so far; two more come 1 ms apart: it waits for them.
        let mut proposals: Vec<Proposal> = [&claim, &push].into_iter().cloned().map(proposal).collect();
        let later = tokio::spawn({
            let (sender, push) = (sender.clone(), push.clone());
            async move {
                for _ in 0..2 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    sender.send(proposal(push.clone())).await.expect("the receiver lives");
                }
            }
        });
        let started = Instant::now();
        handoff.wait_for_push(&mut receiver, &mut proposals, &replica).await;
        assert_eq!(proposals.len(), 4, "the two later pushes share the write");
        assert!(started.elapsed() < Duration::from_millis(5), "no longer than the pushes took");
        later.await.expect("sent");

        // Pushes that do not come are waited for one write at most.
        let mut proposals: Vec<Proposal> = [&claim, &push].into_iter().cloned().map(proposal).collect();
        let started = Instant::now();
        handoff.wait_for_push(&mut receiver, &mut proposals, &replica).await;
        assert_eq!(proposals.len(), 2);
        assert_eq!(started.elapsed(), Duration::from_millis(10), "one write's time");

        // A batch whose claim would not block (an item is pending) does not wait.
        let item = permit_core::NewItem { payload: String::from("1").into(), delay_ms: 0, key: None };
        let pushed = Command::Push { queue: queue.clone(), items: vec![item], creator: None };
        replica.write().state.apply(2, 1, &Batch { now_ms: 2, commands: vec![pushed] }, &mut Vec::new());
        let mut proposals: Vec<Proposal> = [&claim].into_iter().cloned().map(proposal).collect();
        let started = Instant::now();
        handoff.wait_for_push(&mut receiver, &mut proposals, &replica).await;
        assert_eq!((proposals.len(), started.elapsed()), (1, Duration::ZERO));
    }

    /// A claim answered by an apply (a push handed its items to the blocked claimer) wakes its
    /// session, whose client sends its ack or nack next, then its next claim: each of these must
    /// count as that session's command, or every such batch waits out the whole handoff wait.
    #[test]
    fn queue_commands_are_their_sessions() {
        let session = SessionId::from_bytes([7; 16]);
        let queue = Name::new("jobs").expect("a name");
        let commands = [
            Command::Claim { queue: queue.clone(), session, request: 1, max: 1, wait_ms: 1000 },
            Command::CancelClaim { queue: queue.clone(), session, request: 1 },
            Command::Ack { queue: queue.clone(), id: 1, session, token: 2 },
            Command::Nack { queue: queue.clone(), id: 1, session, token: 2, delay_ms: 0, error: None },
            Command::AckAndClaim {
                queue: queue.clone(),
                id: 1,
                session,
                token: 2,
                request: 3,
                max: 1,
                wait_ms: 1,
            },
        ];
        for command in &commands {
            assert_eq!(session_of(command), Some(session), "{command:?}");
        }
        assert_eq!(session_of(&Command::Push { queue, items: Vec::new(), creator: None }), None);
    }
}
