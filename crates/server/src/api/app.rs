//! [`App`]: the one state of the HTTP layer, and its only door to the consensus layer.
//!
//! The handlers, the middleware and the forwarding layer take an `App` and ask it for what they
//! need: propose a command, wait for a linearizable read, read the applied state, the cluster's
//! status and membership changes, this node's standing for auth, the peer channel; the notifier,
//! the observer, the metrics and the settings are plain fields. The raft types they name are the
//! ones this file hands on, so that no other file of `api/` imports `crate::raft` (the tidy test
//! checks it). `node.rs` builds the `App` when it assembles a node.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::http::HeaderValue;
use permit_core::{Command, Outcome};
use permit_wire::ErrorCode;
use tokio::sync::watch;

pub(crate) use crate::raft::contact::Standing;
pub(crate) use crate::raft::identity::{ClusterIdentity, CLUSTER_HEADER};
pub(crate) use crate::raft::membership::MembershipError;
pub(crate) use crate::raft::peer_rpc::{PeerRoute, PeerRpc, Refusal};
pub(crate) use crate::raft::proposer::ProposeError;
pub(crate) use crate::raft::replica::ReplicaState;
pub(crate) use crate::raft::status::{Role, Status};
pub(crate) use crate::raft::version::{speaks, Versions, BUILD};
pub(crate) use crate::raft::NodeId;

use crate::auth::LongPolls;
use crate::config::Config;
use crate::error::ApiError;
use crate::failstop::FailStop;
use crate::metrics::Metrics;
use crate::notify::Notifier;
use crate::observe::Observer;
use crate::peer::{PeerSigner, PeerVerifier};
use crate::peer_conn::PeerPool;
use crate::raft::clock::LeaderClock;
use crate::raft::consensus::Consensus;
use crate::raft::contact::Contact;
use crate::raft::replica::Replica;
use crate::raft::state_machine::Backup;
use crate::raft::RaftMetrics;

/// What the HTTP layer may use of one node (see the module docs).
pub(crate) struct App {
    /// This node's id.
    pub(crate) id: NodeId,
    /// The address its HTTP API listens on.
    pub(crate) addr: SocketAddr,
    /// The configuration it started with.
    pub(crate) config: Config,
    /// The consensus layer, reached only through `App`'s methods.
    pub(crate) replication: Replication,
    /// Long-poll wake-ups.
    pub(crate) notifier: Arc<Notifier>,
    /// Metrics.
    pub(crate) metrics: Arc<Metrics>,
    /// The event ring and the per-object metrics, fed as entries apply.
    pub(crate) observer: Arc<Observer>,
    /// Connections for probing the members' health (`api/cluster.rs`).
    pub(crate) prober: PeerPool,
    /// Connections for forwarding requests to the leader (`api/forward.rs`).
    pub(crate) forwarder: PeerPool,
    /// Signs this node's forwarded requests; none without a cluster secret.
    pub(crate) peer_signer: Option<Arc<PeerSigner>>,
    /// Checks the peer messages this node receives; none without a cluster secret.
    pub(crate) peer_verifier: Option<PeerVerifier>,
    /// Open long-polls per token, for `--long-polls-per-token-max`.
    pub(crate) long_polls: Arc<LongPolls>,
    /// Becomes true when the node starts shutting down; long-polls return early.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Set by the first storage failure or unexpected Raft stop; the HTTP layer then refuses all
    /// work but the health probes (see `failstop`).
    pub(crate) fail_stop: Arc<FailStop>,
    /// This node's cluster identity: Raft messages of another cluster are refused.
    pub(crate) identity: Arc<ClusterIdentity>,
    /// Where new session and token ids come from.
    pub(crate) ids: IdSource,
    /// The values of the headers every answer carries (`permit-node`, `permit-term`,
    /// `permit-leader`), built once per term and leader.
    pub(crate) stamps: Stamps,
}

/// The consensus layer's parts that [`App`] answers from; private to this file.
pub(crate) struct Replication {
    consensus: Arc<Consensus>,
    clock: Arc<LeaderClock>,
    contact: Arc<Contact>,
    removed: watch::Receiver<bool>,
}

impl Replication {
    /// The parts of a node's consensus layer: the consensus itself, leader time as this node
    /// reads it, whether it is in contact with the cluster (for auth), and whether the removal
    /// watcher found it removed.
    pub(crate) fn new(
        consensus: Arc<Consensus>,
        clock: Arc<LeaderClock>,
        contact: Arc<Contact>,
        removed: watch::Receiver<bool>,
    ) -> Replication {
        Replication { consensus, clock, contact, removed }
    }
}

/// Where a node draws new session and token ids: the OS-seeded generator, or, in a simulation
/// (`Config::id_seed`), a generator seeded so that a seed replays the same ids.
pub(crate) struct IdSource(Option<std::sync::Mutex<rand::rngs::StdRng>>);

impl IdSource {
    /// Seeded with `seed`, or from the OS without one.
    pub(crate) fn new(seed: Option<u64>) -> IdSource {
        IdSource(seed.map(|seed| std::sync::Mutex::new(rand::SeedableRng::seed_from_u64(seed))))
    }

    fn draw(&self) -> [u8; 16] {
        match &self.0 {
            Some(seeded) => rand::Rng::random(&mut *seeded.lock().expect("id source lock")),
            None => rand::random(),
        }
    }
}

impl App {
    /// The applied state (read-only: only the consensus layer writes it).
    pub(crate) fn replica(&self) -> &Replica {
        self.replication.consensus.replica()
    }

    /// Proposes a command and waits until it is applied.
    ///
    /// # Errors
    /// [`ProposeError`] when it cannot be committed by this node.
    pub(crate) async fn propose(&self, command: Command) -> Result<Outcome, ProposeError> {
        self.replication.consensus.propose(command).await
    }

    /// Proposes a command without waiting for it (the `ack_before_commit` injected bug).
    pub(crate) fn propose_detached(&self, command: Command) {
        let proposer = self.replication.consensus.proposer().clone();
        tokio::spawn(async move { proposer.propose(command).await });
    }

    /// Waits until a read of the local state is linearizable (see
    /// `Consensus::ensure_linearizable`).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead or cannot reach a quorum.
    pub(crate) async fn ensure_linearizable(&self) -> Result<(), ProposeError> {
        self.replication.consensus.ensure_linearizable().await
    }

    /// Runs `refresh` on the replica under a confirmed lease authority (see
    /// `Consensus::with_lease_authority`).
    ///
    /// # Errors
    /// [`ProposeError::NotLeader`] when it does not lead, or no longer in the confirmed term.
    pub(crate) async fn with_lease_authority<R>(
        &self,
        refresh: impl FnOnce(&mut ReplicaState) -> R,
    ) -> Result<R, ProposeError> {
        self.replication.consensus.with_lease_authority(refresh).await
    }

    /// Leader time now, as this node reads it; never less than the applied state's.
    pub(crate) fn now_ms(&self, applied_ms: u64) -> u64 {
        self.replication.clock.now_ms(applied_ms)
    }

    /// This node's view of the cluster now.
    pub(crate) fn status(&self) -> Status {
        self.replication.consensus.status()
    }

    /// Whether this node leads now.
    pub(crate) fn leads(&self) -> bool {
        self.replication.consensus.leads()
    }

    /// The leader's id and address, waiting up to `patience` for one to be known.
    pub(crate) async fn leader(&self, patience: Duration) -> Option<(NodeId, String)> {
        self.replication.consensus.leader(patience).await
    }

    /// `f` of the current term and the leader's id and address, if one is known.
    pub(crate) fn term_and_leader<R>(&self, f: impl FnOnce(u64, Option<(NodeId, &str)>) -> R) -> R {
        self.replication.consensus.term_and_leader(f)
    }

    /// This node's Raft metrics, to wait for their next change (an applied entry, a new term or
    /// leader); closed once the Raft core stopped.
    pub(crate) fn raft_metrics(&self) -> watch::Receiver<RaftMetrics> {
        self.replication.consensus.raft().metrics()
    }

    /// Whether the removal watcher found this node removed from the membership.
    pub(crate) fn removed(&self) -> bool {
        *self.replication.removed.borrow()
    }

    /// Whether this node applies the cluster's log now (see `raft::contact`).
    pub(crate) fn standing(&self) -> Standing {
        self.replication.contact.standing()
    }

    /// Each change of [`App::standing`].
    pub(crate) fn standing_changes(&self) -> watch::Receiver<Standing> {
        self.replication.contact.changes()
    }

    /// The peer channel: Raft messages from the other members, as bytes.
    pub(crate) fn peer_rpc(&self) -> &PeerRpc {
        self.replication.consensus.peer_rpc()
    }

    /// Makes a pristine node the first member of a cluster of `members`.
    ///
    /// # Errors
    /// See [`MembershipError`].
    pub(crate) async fn init_cluster(
        &self,
        members: &BTreeMap<NodeId, String>,
    ) -> Result<(), MembershipError> {
        self.replication.consensus.init_cluster(members).await
    }

    /// Adds node `id` at `addr`, as a learner or a voter.
    ///
    /// # Errors
    /// See [`MembershipError`].
    pub(crate) async fn add_member(
        &self,
        id: NodeId,
        addr: &str,
        learner: bool,
    ) -> Result<(), MembershipError> {
        self.replication.consensus.add_member(id, addr, learner).await
    }

    /// Removes node `id` from the membership.
    ///
    /// # Errors
    /// See [`MembershipError`].
    pub(crate) async fn remove_member(&self, id: NodeId) -> Result<(), MembershipError> {
        self.replication.consensus.remove_member(id).await
    }

    /// The applied state as a backup (`GET /v1/snapshot`), to encode off the async runtime.
    pub(crate) fn backup(&self) -> Backup {
        crate::raft::state_machine::backup(&self.replica().read())
    }

    /// A new claim request id (below 2^53, as clients pick theirs), from this node's id source.
    pub(crate) fn new_claim_request_id(&self) -> u64 {
        let bytes = self.ids.draw();
        u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) & permit_wire::CLAIM_REQUEST_ID_MAX
    }

    /// A new session id, from this node's id source (random, or seeded in a simulation).
    pub(crate) fn new_session_id(&self) -> permit_core::SessionId {
        permit_core::SessionId::from_bytes(self.ids.draw())
    }

    /// What the leader knows of the members' feature versions, and the lock that orders
    /// additions and raises (`raft::version`).
    pub(crate) fn versions(&self) -> &Arc<Versions> {
        self.replication.consensus.versions()
    }

    /// A new token id, from this node's id source.
    pub(crate) fn new_token_id(&self) -> permit_core::TokenId {
        permit_core::TokenId::from_bytes(self.ids.draw())
    }
}

/// A command that this node could not commit, as the HTTP answer.
impl From<ProposeError> for ApiError {
    fn from(error: ProposeError) -> ApiError {
        match error {
            ProposeError::NotLeader { leader } => ApiError::new(
                ErrorCode::NoLeader,
                match leader {
                    Some((id, addr)) => format!("this node is not the leader; node {id} at {addr} is"),
                    None => "no leader is known; the outcome of a write is unknown, retry it".to_owned(),
                },
            ),
            ProposeError::ShuttingDown => {
                ApiError::new(ErrorCode::ShuttingDown, "the server is shutting down")
            }
            ProposeError::Timeout => ApiError::new(
                ErrorCode::Timeout,
                "not committed in time (is a quorum reachable?); the outcome is unknown, retry it",
            ),
            ProposeError::FeatureUnavailable { needs, cluster, older } => ApiError::new(
                ErrorCode::FeatureUnavailable,
                crate::raft::version::unavailable_message(needs, cluster, &older),
            ),
        }
    }
}

/// The values of the headers every answer carries, built once and reused while the term and
/// the leader stay the same: formatting them for each answer cost more than the rest of it.
pub(crate) struct Stamps {
    /// `permit-node`: this node's id.
    node: HeaderValue,
    /// The scheme of the peers' URLs (`https` when they serve TLS).
    scheme: &'static str,
    /// The term, the leader and its address they were built for, with the `permit-term` and
    /// `permit-leader` values.
    built: Mutex<Option<Built>>,
}

struct Built {
    term: u64,
    leader: Option<(NodeId, String)>,
    term_value: HeaderValue,
    leader_value: Option<HeaderValue>,
}

impl Stamps {
    /// The stamps of node `id`, whose peers' URLs have `scheme`.
    pub(crate) fn new(id: NodeId, scheme: &'static str) -> Stamps {
        Stamps { node: HeaderValue::from(id), scheme, built: Mutex::new(None) }
    }

    /// The `permit-node` value: this node's id.
    pub(crate) fn node(&self) -> &HeaderValue {
        &self.node
    }

    /// The `permit-term` value, and the `permit-leader` one (`scheme://addr`) when a leader is
    /// known and its URL is a valid header value.
    pub(crate) fn values(
        &self,
        term: u64,
        leader: Option<(NodeId, &str)>,
    ) -> (HeaderValue, Option<HeaderValue>) {
        let mut built = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(b) = &*built {
            let same_leader = match (&b.leader, leader) {
                (Some((id, addr)), Some((leader, leader_addr))) => *id == leader && addr == leader_addr,
                (None, None) => true,
                _ => false,
            };
            if b.term == term && same_leader {
                return (b.term_value.clone(), b.leader_value.clone());
            }
        }
        let leader_value =
            leader.and_then(|(_, addr)| HeaderValue::try_from(format!("{}://{addr}", self.scheme)).ok());
        let fresh = Built {
            term,
            leader: leader.map(|(id, addr)| (id, addr.to_owned())),
            term_value: HeaderValue::from(term),
            leader_value,
        };
        let values = (fresh.term_value.clone(), fresh.leader_value.clone());
        *built = Some(fresh);
        values
    }
}

#[cfg(test)]
mod tests {
    use super::Stamps;

    /// The cached values follow the term and the leader: a change of either rebuilds them.
    #[test]
    fn stamps_follow_the_term_and_the_leader() {
        let stamps = Stamps::new(7, "https");
        assert_eq!(stamps.node, "7");
        let (term, leader) = stamps.values(3, None);
        assert_eq!((term, leader), ("3".parse().unwrap(), None));
        let (term, leader) = stamps.values(3, Some((1, "127.0.0.1:9000")));
        assert_eq!(term, "3");
        assert_eq!(leader.unwrap(), "https://127.0.0.1:9000");
        let (term, leader) = stamps.values(4, Some((1, "127.0.0.1:9000")));
        assert_eq!(term, "4");
        assert_eq!(leader.unwrap(), "https://127.0.0.1:9000");
        let (_, leader) = stamps.values(4, Some((2, "127.0.0.1:9001")));
        assert_eq!(leader.unwrap(), "https://127.0.0.1:9001");
        let (_, leader) = stamps.values(4, Some((2, "127.0.0.1:9002")));
        assert_eq!(leader.unwrap(), "https://127.0.0.1:9002", "a leader's new address");
        let (term, leader) = stamps.values(5, None);
        assert_eq!((term, leader), ("5".parse().unwrap(), None));
    }
}
