//! The openraft state machine: an adapter that applies log entries to [`permit_core::State`]
//! inside the [`Replica`], feeds the lessor, wakes long-polls, and builds and installs snapshots.

use std::io::Cursor;
use std::sync::Arc;

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, ErrorSubject, ErrorVerb, RaftSnapshotBuilder, StorageIOError,
    StoredMembership,
};
use permit_core::{Effect, State};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::log::LogSync;
use super::snapshot_store::{Meta, SnapshotStore};
use super::{LogId, NodeId, StorageError, TypeConfig};
use crate::notify::Notifier;
use crate::observe::Observer;
use crate::raft::disk::Blocking;
use crate::raft::replica::Replica;

/// The state machine handed to openraft. Cloning shares everything (clones build snapshots).
#[derive(Clone)]
pub struct StateMachine {
    replica: Arc<Replica>,
    notifier: Arc<Notifier>,
    /// The event ring and per-object metrics, fed with each entry's effects.
    observer: Arc<Observer>,
    snapshots: SnapshotStore,
    /// Poked when the expiry driver may need to re-arm its timer.
    expiry_wake: Arc<Notify>,
    /// What of this node's log is durable: an entry is applied only once it is (gate 1 of
    /// [`super::log::sync`]).
    sync: Arc<LogSync>,
    /// Set when an entry or a snapshot needs a newer build (`raft::version`).
    fail_stop: Arc<crate::failstop::FailStop>,
    /// How snapshot files are written and encoded: on other threads, or in place (a simulated
    /// disk's, see [`super::disk`]).
    blocking: Blocking,
}

fn snapshot_error(verb: ErrorVerb, e: impl std::fmt::Display) -> StorageError {
    StorageError::IO { source: StorageIOError::new(ErrorSubject::Snapshot(None), verb, AnyError::error(e)) }
}

impl StateMachine {
    /// An adapter over `replica`.
    pub fn new(
        replica: Arc<Replica>,
        notifier: Arc<Notifier>,
        observer: Arc<Observer>,
        snapshots: SnapshotStore,
        expiry_wake: Arc<Notify>,
        sync: Arc<LogSync>,
        fail_stop: Arc<crate::failstop::FailStop>,
    ) -> StateMachine {
        StateMachine {
            replica,
            notifier,
            observer,
            snapshots,
            expiry_wake,
            sync,
            fail_stop,
            blocking: Blocking::Threads,
        }
    }

    /// Stops the node, before anything of it is applied, if data at log id `at` needs a newer
    /// feature version than this build speaks (rule 3 of `raft::version`).
    #[allow(clippy::result_large_err)] // openraft's error, returned as its trait methods return it
    fn refuse_newer(&self, needs: u32, at: Option<LogId>) -> Result<(), StorageError> {
        let Some(message) = super::version::refuse_newer(needs) else { return Ok(()) };
        self.fail_stop.upgrade_needed(message.clone());
        let subject = match at {
            Some(log_id) => ErrorSubject::Apply(log_id),
            None => ErrorSubject::Snapshot(None),
        };
        Err(StorageError::IO {
            source: StorageIOError::new(subject, ErrorVerb::Read, AnyError::error(message)),
        })
    }

    /// Runs the snapshot files' blocking work as `blocking` says (the disk's choice, see
    /// [`super::disk::Disk::blocking`]); on other threads without it.
    pub fn with_blocking(mut self, blocking: Blocking) -> StateMachine {
        self.blocking = blocking;
        self
    }

    /// Replaces the state with a snapshot's, re-tracking every session from now.
    fn restore(&self, meta: &Meta, state: State) {
        {
            let mut replica = self.replica.write();
            let sessions = state.sessions().map(|(id, session)| (*id, session.ttl_ms));
            replica.lessor.reset(sessions, Instant::now());
            self.observer.reset(&state);
            replica.state = state;
            replica.last_applied = meta.last_log_id;
            replica.membership = meta.last_membership.clone();
            replica.since_snapshot = 0;
        }
        self.notifier.wake_all();
        self.expiry_wake.notify_one();
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    /// Freezes the state under the replica lock (an O(1) persistent copy), then encodes it and
    /// writes the file on a blocking thread while entries go on being applied: openraft runs
    /// this in a task of its own, so nothing waits for it but the log purge that follows.
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let (meta, view) = {
            let mut replica = self.replica.write();
            replica.since_snapshot = 0;
            (snapshot_meta(&replica), replica.state.snapshot_view())
        };
        let snapshots = self.snapshots.clone();
        let saved_meta = meta.clone();
        let bytes = off_the_runtime(self.blocking, move || {
            if crate::bugs::is(crate::bugs::Bug::SlowSnapshotEncode) {
                std::thread::sleep(crate::bugs::SLOW_SNAPSHOT_ENCODE);
            }
            let bytes = view.encode();
            drop(view);
            snapshots.save(&saved_meta, &bytes).map(|()| bytes)
        })
        .await
        .map_err(|e| snapshot_error(ErrorVerb::Write, e))?;
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) })
    }
}

/// The applies that re-applying `batch` costs: one per command, and one per item of a push (a
/// push of 1000 items is one command but a thousand inserts and events).
fn replay_weight(batch: &permit_core::Batch) -> u64 {
    let weight = |command: &permit_core::Command| match command {
        permit_core::Command::Push { items, .. } => items.len().max(1) as u64,
        _ => 1,
    };
    batch.commands.iter().map(weight).sum()
}

/// The tokens that `batch` deleted (its outcomes answer its commands one for one): their
/// long-polls and event streams end at once (`Notifier::revoke`).
fn deleted_tokens<'a>(
    batch: &'a permit_core::Batch,
    outcomes: &'a [permit_core::Outcome],
) -> impl Iterator<Item = permit_core::TokenId> + 'a {
    batch.commands.iter().zip(outcomes).filter_map(|(command, outcome)| match (command, outcome) {
        (permit_core::Command::DeleteToken { id }, permit_core::Outcome::TokenDeleted { .. }) => Some(*id),
        _ => None,
    })
}

/// How much lower than the server's threads a snapshot encode runs (a nice value): a weight of
/// about a tenth against a request's thread when both want a core.
const SNAPSHOT_NICE: libc::c_int = 10;

/// Runs `f` on a thread of its own at a lower priority ([`SNAPSHOT_NICE`]) with
/// [`Blocking::Threads`], so that requests preempt the encode rather than wait behind it: at
/// 1 M sessions it takes a core for most of a second. [`Blocking::InPlace`] (the simulation, in
/// paused time) runs it in place, so that a seed replays the same way.
async fn off_the_runtime(
    blocking: Blocking,
    f: impl FnOnce() -> std::io::Result<Vec<u8>> + Send + 'static,
) -> std::io::Result<Vec<u8>> {
    match blocking {
        Blocking::Threads => {
            let (done, result) = tokio::sync::oneshot::channel();
            // Its own thread, not the blocking pool's: a pool thread would keep the lower
            // priority for the log's fsyncs after this, and raising it back needs a privilege.
            std::thread::Builder::new().name("permit-snapshot".into()).spawn(move || {
                // SAFETY: setpriority has no memory preconditions; on Linux `who = 0` with
                // PRIO_PROCESS names the calling thread. A failure leaves the priority as it is.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, SNAPSHOT_NICE) };
                let _ = done.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
            })?;
            match result.await {
                Ok(Ok(result)) => result,
                Ok(Err(panic)) => std::panic::resume_unwind(panic),
                Err(_) => Err(std::io::Error::other("the snapshot thread ended without a result")),
            }
        }
        Blocking::InPlace => f(),
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, StoredMembership<NodeId, BasicNode>), StorageError> {
        let replica = self.replica.write();
        Ok((replica.last_applied, replica.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<permit_core::Outcome>>, StorageError>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let entries: Vec<_> = entries.into_iter().collect();
        if let Some(last) = entries.last() {
            // A leader reports its appends before their fsync (`log::sync`): what they commit
            // becomes visible only once this node's copy is durable too.
            self.sync.wait_durable(last.log_id.index).await.map_err(|e| StorageError::IO {
                source: StorageIOError::apply(last.log_id, AnyError::error(e)),
            })?;
            // Gate 1: a committed entry is never truncated, so it stays durable once it is.
            assert!(
                self.sync.durable().is_some_and(|durable| durable.index >= last.log_id.index),
                "gate 1: entry {} applied before it is durable",
                last.log_id
            );
        }
        for entry in &entries {
            if let EntryPayload::Normal(batch) = &entry.payload {
                self.refuse_newer(batch.feature_version(), Some(entry.log_id))?;
            }
        }
        let mut effects = Vec::new();
        let mut replies = Vec::new();
        let mut revoked = Vec::new();
        {
            let mut replica = self.replica.write();
            for entry in entries {
                let index = entry.log_id.index;
                replica.last_applied = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Normal(batch) => {
                        replica.since_snapshot += replay_weight(&batch);
                        let term = entry.log_id.leader_id.term;
                        let first = effects.len();
                        let outcomes = replica.state.apply(index, term, &batch, &mut effects);
                        revoked.extend(deleted_tokens(&batch, &outcomes));
                        replies.push(outcomes);
                        self.observer.on_entry(index, replica.state.now_ms(), &effects[first..]);
                        self.observer.on_queues(&replica.state, &effects[first..]);
                    }
                    EntryPayload::Blank => {
                        replica.state.skip(index);
                        replies.push(Vec::new());
                    }
                    EntryPayload::Membership(membership) => {
                        replica.state.skip(index);
                        replica.membership = StoredMembership::new(Some(entry.log_id), membership);
                        replies.push(Vec::new());
                    }
                }
            }
            let now = Instant::now();
            for effect in &effects {
                match effect {
                    Effect::SessionCreated { id, ttl_ms } => replica.lessor.on_created(*id, *ttl_ms, now),
                    Effect::SessionRemoved { id } => replica.lessor.on_removed(*id),
                    _ => {}
                }
            }
        }
        self.notifier.dispatch(&effects);
        self.notifier.revoke(&revoked);
        let rearm = effects.iter().any(|e| {
            matches!(
                e,
                Effect::SessionCreated { .. }
                    | Effect::HoldDeadlineSet { .. }
                    | Effect::ItemDueSet { .. }
                    | Effect::PolicyDueSet { .. }
            )
        });
        if rearm {
            self.expiry_wake.notify_one();
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let state = State::decode_snapshot(&bytes).map_err(|e| snapshot_error(ErrorVerb::Read, e))?;
        self.refuse_newer(state.cluster_version(), None)?;
        // `api/raft.rs` refuses a snapshot whose state is not at its metadata's index before
        // openraft gets here; refusing it here stops openraft's core, which is still better
        // than installing a state that disagrees with the log.
        let index = meta.last_log_id.map_or(0, |id| id.index);
        if state.applied_index() != index {
            let mismatch = format!("snapshot state at {} but meta at {index}", state.applied_index());
            return Err(snapshot_error(ErrorVerb::Read, mismatch));
        }
        self.blocking
            .run(|| self.snapshots.save(meta, &bytes))
            .map_err(|e| snapshot_error(ErrorVerb::Write, e))?;
        self.restore(meta, state);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        let loaded =
            self.blocking.run(|| self.snapshots.load()).map_err(|e| snapshot_error(ErrorVerb::Read, e))?;
        Ok(loaded.map(|(meta, bytes)| Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) }))
    }
}

/// The meta of a snapshot of `replica` as it stands.
fn snapshot_meta(replica: &crate::raft::replica::ReplicaState) -> Meta {
    let snapshot_id = match replica.last_applied {
        Some(id) => format!("{}-{}", id.leader_id.term, id.index),
        None => "0-0".to_owned(),
    };
    Meta { last_log_id: replica.last_applied, last_membership: replica.membership.clone(), snapshot_id }
}

/// A backup of the applied state (`GET /v1/snapshot`), frozen under the lock by [`backup`]
/// and encoded outside it by [`Backup::encode`].
pub(crate) struct Backup {
    meta: Meta,
    view: permit_core::SnapshotView,
}

/// The applied state as it stands, to encode as a backup: O(1), so cheap under the lock.
pub(crate) fn backup(replica: &crate::raft::replica::ReplicaState) -> Backup {
    Backup { meta: snapshot_meta(replica), view: replica.state.snapshot_view() }
}

impl Backup {
    /// The bytes of a snapshot file, which `permit serve --restore` starts a new cluster from.
    /// It walks the whole state: call it off the async runtime.
    ///
    /// # Errors
    /// When the meta does not encode (never, in practice).
    pub(crate) fn encode(self) -> std::io::Result<Vec<u8>> {
        super::snapshot_store::encode(&self.meta, &self.view.encode())
    }
}

/// Makes a new data dir start from the backup in `file`: the state of the backup, as a cluster
/// whose only voter is node `id` at `addr` (grow it with `permit cluster add`). The backup's
/// log ids are rewritten to term 0, so that this cluster's first election (term 1) follows them.
///
/// With a configured root secret (`PERMIT_ROOT_TOKEN`, `--root-token-file`), that secret
/// becomes the root token's (the backup's root secret stops working; a root deleted before the
/// backup is made again). Every token of the backup is logged: a token deleted after the backup
/// authenticates again, and only the operator knows which to delete.
///
/// # Errors
/// When the data dir holds a log or a snapshot already, the file is not a consistent backup, or
/// the root secret is another restored token's.
pub(crate) fn restore(
    file: &std::path::Path,
    snapshots: &SnapshotStore,
    log_path: &std::path::Path,
    id: NodeId,
    addr: &str,
    root_secret: Option<&str>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !log_path.exists() && snapshots.load()?.is_none(),
        "--restore starts a new cluster: the data dir must be empty, but {} holds one",
        log_path.parent().map_or_else(String::new, |dir| dir.display().to_string())
    );
    let bytes = std::fs::read(file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
    let (meta, state_bytes) =
        super::snapshot_store::decode(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let mut state =
        State::decode_snapshot(&state_bytes).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    if let Some(message) = super::version::refuse_newer(state.cluster_version()) {
        anyhow::bail!("{}: {message}", file.display());
    }
    let index = meta.last_log_id.map(|log_id| log_id.index);
    anyhow::ensure!(
        index.is_some() && index == Some(state.applied_index()),
        "{}: the backup's state is not at its meta's log index",
        file.display()
    );
    let log_id = openraft::LogId::new(openraft::CommittedLeaderId::new(0, id), state.applied_index());
    let membership = openraft::Membership::new(
        vec![std::collections::BTreeSet::from([id])],
        std::collections::BTreeMap::from([(id, BasicNode::new(addr))]),
    );
    let meta = Meta {
        last_log_id: Some(log_id),
        last_membership: StoredMembership::new(Some(log_id), membership),
        snapshot_id: format!("restored-{}", log_id.index),
    };
    if let Some(secret) = root_secret {
        // A backup made before salts gets its salt here, so that the root secret is stored
        // salted (its other tokens keep their plain SHA-256).
        if state.install_token_salt(rand::random()) {
            tracing::info!("restore: token salt created");
        }
        let hash = crate::auth::secret_hash(state.token_salt(), secret);
        state.install_root_secret(hash).map_err(|refusal| {
            anyhow::anyhow!("the configured root secret cannot become the root token's: {refusal}")
        })?;
        tracing::warn!(
            "restore: the root token's secret is the configured one (PERMIT_ROOT_TOKEN or --root-token-file)"
        );
    }
    for (token_id, token) in state.tokens() {
        tracing::warn!(
            token = %token_id,
            name = %token.name,
            "restore: brought back token {token_id} ({}); if it was deleted after the backup, delete it \
             again: permit acl token delete {token_id}",
            token.name
        );
    }
    snapshots.save(&meta, &state.encode_snapshot())?;
    tracing::info!(
        file = %file.display(),
        index = log_id.index,
        sessions = state.session_count(),
        tokens = state.tokens().len(),
        "restored a backup"
    );
    Ok(())
}

/// Loads the latest snapshot from disk as the starting state of a node.
///
/// # Errors
/// When the snapshot exists but cannot be read or decoded.
pub(crate) fn load_replica(snapshots: &SnapshotStore) -> anyhow::Result<crate::raft::replica::ReplicaState> {
    let mut replica = crate::raft::replica::ReplicaState::default();
    let started = std::time::Instant::now();
    if let Some((meta, bytes)) = snapshots.load()? {
        let read = started.elapsed();
        // The session deadlines are indexed while the state's invariants are checked.
        let (state, lessor) = State::decode_snapshot_with(&bytes, |state| {
            let mut lessor = crate::lessor::Lessor::default();
            lessor.reset(state.sessions().map(|(id, session)| (*id, session.ttl_ms)), Instant::now());
            lessor
        })?;
        let index = meta.last_log_id.map_or(0, |id| id.index);
        anyhow::ensure!(
            state.applied_index() == index,
            "snapshot state at {} but meta at {index}",
            state.applied_index()
        );
        if let Some(message) = super::version::refuse_newer(state.cluster_version()) {
            anyhow::bail!("{message}");
        }
        tracing::info!(
            bytes = bytes.len(),
            sessions = state.session_count(),
            objects = state.object_count(),
            read_ms = read.as_millis() as u64,
            decode_check_and_index_ms = (started.elapsed() - read).as_millis() as u64,
            "snapshot loaded"
        );
        replica.lessor = lessor;
        replica.state = state;
        replica.last_applied = meta.last_log_id;
        replica.membership = meta.last_membership;
    }
    Ok(replica)
}

#[cfg(test)]
mod tests {
    /// The encode runs on a thread of its own at the lower priority, and the runtime's threads
    /// keep theirs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_snapshot_encodes_on_a_thread_of_lower_priority() {
        // SAFETY: getpriority has no memory preconditions (-1 is also a valid nice value, but
        // errno is not needed here: the values compared are ours).
        let nice = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = nice();
        let seen = super::off_the_runtime(super::Blocking::Threads, move || {
            let name = std::thread::current().name().map(str::to_owned);
            Ok(format!("{} {}", nice(), name.unwrap_or_default()).into_bytes())
        })
        .await
        .unwrap();
        let expected = format!("{} permit-snapshot", before.max(super::SNAPSHOT_NICE));
        assert_eq!(String::from_utf8(seen).unwrap(), expected);
        assert_eq!(nice(), before, "the caller's thread keeps its priority");
    }
}
