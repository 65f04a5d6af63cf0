//! The in-memory network: Raft RPCs go straight to the target's `Raft` handle, after a simulated
//! latency, unless a [`Faults`] cut or a seeded coin toss loses them.
//!
//! A cut link answers `Unreachable` (openraft then backs off, as it does for a refused TCP
//! connection); a lost message answers a network error after the latency, and a lost response
//! means the target did handle the request. Every RPC takes at least 1 ms of simulated time, so
//! a retry loop can never spin without the clock moving.
//!
//! The router also keeps the log as the wire carried it ([`Router::committed_log`]): every entry
//! a leader sent in an `AppendEntries`, the one of the highest leader per index. A committed
//! entry reached a follower that way (a majority of 3 is the leader and a follower), and no
//! later leader sends another entry at its index (Raft's leader completeness), so up to the
//! committed index this is the committed log, read outside the nodes under test.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use openraft::EntryPayload;
use permit_core::Batch;
use permit_server::raft::{NodeId, Raft, TypeConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::faults::Faults;

/// Routes RPCs between the nodes of one simulation.
pub struct Router {
    inner: Mutex<RouterState>,
}

struct RouterState {
    /// The Raft handle of every running node.
    rafts: BTreeMap<NodeId, Raft>,
    faults: Faults,
    rng: StdRng,
    /// Messages delivered and lost, for the summary.
    delivered: u64,
    lost: u64,
    /// Per index: the entry of the highest leader sent at that index (its leader's (term, node)
    /// and its batch; `None` for a blank or membership entry).
    wire: BTreeMap<u64, ((u64, NodeId), Option<Batch>)>,
}

/// Why an RPC failed in the simulated network.
#[derive(Debug, Clone, Copy)]
enum Failure {
    /// The link is cut or the target is down.
    Unreachable(&'static str),
    /// The message was lost.
    Lost(&'static str),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(why) => write!(f, "unreachable: {why}"),
            Failure::Lost(why) => write!(f, "lost: {why}"),
        }
    }
}

impl std::error::Error for Failure {}

impl Router {
    /// A router with no nodes and no faults; its coin tosses come from `seed`.
    pub fn new(seed: u64) -> Arc<Router> {
        let state = RouterState {
            rafts: BTreeMap::new(),
            faults: Faults::default(),
            rng: StdRng::seed_from_u64(seed),
            delivered: 0,
            lost: 0,
            wire: BTreeMap::new(),
        };
        Arc::new(Router { inner: Mutex::new(state) })
    }

    fn lock(&self) -> MutexGuard<'_, RouterState> {
        self.inner.lock().expect("router lock")
    }

    /// Makes `raft` reachable as node `id` (after it started).
    pub fn attach(&self, id: NodeId, raft: Raft) {
        self.lock().rafts.insert(id, raft);
    }

    /// Makes node `id` unreachable (it crashed).
    pub fn detach(&self, id: NodeId) {
        self.lock().rafts.remove(&id);
    }

    /// Changes the faults in force.
    pub fn with_faults<R>(&self, change: impl FnOnce(&mut Faults) -> R) -> R {
        change(&mut self.lock().faults)
    }

    /// The faults in force.
    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    /// Messages delivered and lost so far.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.lock();
        (state.delivered, state.lost)
    }

    /// The committed log up to `committed` (an index every node applied): per index, the term
    /// and batch of the entry of the highest leader sent there (`None` for a blank or membership
    /// entry). An index missing here was never sent, which Raft does not allow for a committed
    /// one.
    pub fn committed_log(&self, committed: u64) -> BTreeMap<u64, (u64, Option<Batch>)> {
        let state = self.lock();
        state
            .wire
            .range(..=committed)
            .map(|(index, ((term, _), batch))| (*index, (*term, batch.clone())))
            .collect()
    }

    /// Notes the entries of an `AppendEntries` as sent.
    fn sent(&self, rpc: &AppendEntriesRequest<TypeConfig>) {
        let mut state = self.lock();
        for entry in &rpc.entries {
            let leader = (entry.log_id.leader_id.term, entry.log_id.leader_id.node_id);
            let known = state.wire.get(&entry.log_id.index).map(|(known, _)| *known);
            if known.is_some_and(|known| known >= leader) {
                continue;
            }
            let batch = match &entry.payload {
                EntryPayload::Normal(batch) => Some(batch.clone()),
                EntryPayload::Blank | EntryPayload::Membership(_) => None,
            };
            state.wire.insert(entry.log_id.index, (leader, batch));
        }
    }

    /// The network factory of node `from`.
    pub fn network(self: &Arc<Router>, from: NodeId) -> RouterNetwork {
        RouterNetwork { router: self.clone(), from }
    }

    /// Draws the latency of one message on the link and whether it is lost.
    fn toss(&self, from: NodeId, to: NodeId) -> (Duration, bool) {
        let mut state = self.lock();
        let (low, high) = state.faults.latency_ms(from, to);
        let loss = state.faults.loss_per_mille();
        let latency_ms = state.rng.random_range(low.max(1)..=high.max(1));
        let lost = loss > 0 && state.rng.random_range(0..1000) < loss;
        if lost {
            state.lost += 1;
        } else {
            state.delivered += 1;
        }
        (Duration::from_millis(latency_ms), lost)
    }

    /// Carries one message from `from` to `to`: waits out its latency, then fails if the link is
    /// cut (checked on arrival) or the message is lost.
    async fn carry(&self, from: NodeId, to: NodeId) -> Result<(), Failure> {
        let (latency, lost) = self.toss(from, to);
        tokio::time::sleep(latency).await;
        if self.lock().faults.is_cut(from, to) {
            return Err(Failure::Unreachable("link cut"));
        }
        if lost {
            return Err(Failure::Lost("message dropped"));
        }
        Ok(())
    }

    fn raft(&self, id: NodeId) -> Option<Raft> {
        self.lock().rafts.get(&id).cloned()
    }
}

/// The network factory handed to one node's Raft.
pub struct RouterNetwork {
    router: Arc<Router>,
    from: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for RouterNetwork {
    type Network = Connection;

    async fn new_client(&mut self, target: NodeId, _node: &BasicNode) -> Connection {
        Connection { router: self.router.clone(), from: self.from, to: target }
    }
}

/// One node's connection to a peer.
pub struct Connection {
    router: Arc<Router>,
    from: NodeId,
    to: NodeId,
}

type RpcResult<Resp, E> = Result<Resp, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl Connection {
    /// Sends a request and carries the response back, within openraft's deadline.
    async fn send<Resp, E, Fut>(
        &self,
        option: &RPCOption,
        call: impl FnOnce(Raft) -> Fut,
    ) -> RpcResult<Resp, E>
    where
        Fut: Future<Output = Result<Resp, RaftError<NodeId, E>>>,
        E: std::error::Error,
    {
        let exchange = async {
            self.router.carry(self.from, self.to).await?;
            let raft = self.router.raft(self.to).ok_or(Failure::Unreachable("node down"))?;
            let answer = call(raft).await;
            self.router.carry(self.to, self.from).await?;
            Ok::<_, Failure>(answer)
        };
        match tokio::time::timeout(option.hard_ttl(), exchange).await {
            Err(_) => Err(RPCError::Network(NetworkError::new(&Failure::Lost("deadline passed")))),
            Ok(Err(failure @ Failure::Unreachable(_))) => {
                Err(RPCError::Unreachable(Unreachable::new(&failure)))
            }
            Ok(Err(failure @ Failure::Lost(_))) => Err(RPCError::Network(NetworkError::new(&failure))),
            Ok(Ok(Ok(response))) => Ok(response),
            Ok(Ok(Err(RaftError::Fatal(fatal)))) => Err(RPCError::Unreachable(Unreachable::new(&fatal))),
            Ok(Ok(Err(error))) => Err(RPCError::RemoteError(RemoteError::new(self.to, error))),
        }
    }
}

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        self.router.sent(&rpc);
        self.send(&option, |raft| async move { raft.append_entries(rpc).await }).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.send(&option, |raft| async move { raft.install_snapshot(rpc).await }).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.send(&option, |raft| async move { raft.vote(rpc).await }).await
    }
}
