//! Raft RPCs between nodes: HTTP POSTs of postcard bodies to `/raft/{append,vote,snapshot}` on
//! the peer's address (the same address as its client API), each signed for its receiver with
//! this node's [`PeerSigner`] (see [`crate::peer`]) and carrying this node's membership claim,
//! through the node's peer client ([`crate::peer_conn`]), on a connection that the sending task
//! drives itself.
//!
//! A peer that cannot be reached is reported as `Unreachable`, so that openraft backs off instead
//! of retrying in a tight loop. Every RPC has openraft's deadline as its HTTP timeout. A message
//! the peer refused because it was signed for another start of that peer is signed again with
//! the peer's current nonce and sent once more: the peer used none of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::bounds::{term_limit, PeerAnswer};
use super::identity::{ClusterIdentity, CLUSTER_HEADER};
use super::{NodeId, Raft, TypeConfig};
use crate::metrics::{PeerRpcCounts, PeerRpcKind};
use crate::peer::PeerSigner;
use crate::peer_conn::{PeerClient, PeerPool, PeerRequest, PoolLimits, Resend};

/// Path prefix of the peer RPC routes.
const RAFT_PATH_PREFIX: &str = "/raft";

/// The Raft RPCs' connections: a peer must accept one (and finish the TLS handshake, over
/// HTTPS) within 500 ms; at most 4 wait idle per peer (RPCs to one peer in flight at once: its
/// replication stream, a read barrier's round, an election, a snapshot); an answer is at most
/// 1 MiB (they are a few dozen bytes).
const RAFT_POOL: PoolLimits =
    PoolLimits { connect_timeout: Duration::from_millis(500), idle_max: 4, answer_max: 1 << 20 };
/// The `content-type` of every RPC.
static CONTENT_TYPE: hyper::header::HeaderValue =
    hyper::header::HeaderValue::from_static("application/octet-stream");

/// What this node says of itself on its Raft RPCs: its membership claim; and its current term,
/// which bounds the terms it takes from answers. Kept up to date by [`follow`].
#[derive(Debug, Default)]
pub(crate) struct LocalView {
    term: AtomicU64,
    members: RwLock<Arc<str>>,
}

/// Keeps `view` up to date with `raft`'s term and membership until the Raft core stops.
pub(crate) async fn follow(raft: Raft, view: Arc<LocalView>) {
    let mut metrics = raft.metrics();
    // The metrics change with every append and apply; the membership rarely: its claim is made
    // again only when openraft hands over another membership.
    let mut membership = None;
    loop {
        let changed = {
            let current = metrics.borrow_and_update();
            view.term.store(current.current_term, Ordering::Relaxed);
            let same =
                membership.as_ref().is_some_and(|known| Arc::ptr_eq(known, &current.membership_config));
            (!same).then(|| current.membership_config.clone())
        };
        if let Some(current) = changed {
            let claim = super::peer_rpc::claim_of(&current);
            *view.members.write().unwrap_or_else(PoisonError::into_inner) = claim.into();
            membership = Some(current);
        }
        if metrics.changed().await.is_err() {
            return;
        }
    }
}

/// Creates the clients openraft sends peer RPCs with; they share one [`PeerPool`].
#[derive(Clone)]
pub(crate) struct Network {
    pool: PeerPool,
    /// Signs every RPC (none without a cluster secret: peers refuse them).
    signer: Option<Arc<PeerSigner>>,
    view: Arc<LocalView>,
    sent: PeerRpcCounts,
    /// Peers whose last RPC found them unreachable, shared by every client of the network.
    unreachable: PeerReachability,
    /// This node's cluster identity (`raft::identity`).
    identity: Arc<ClusterIdentity>,
}

/// Which peers are known to be down, so that a peer that goes down is logged once (and once more
/// when it answers again) rather than on every retry: openraft retries a down follower twice a
/// second and its own logs of that are filtered out by `permit serve`'s default log filter.
#[derive(Clone, Default)]
struct PeerReachability(Arc<std::sync::Mutex<std::collections::BTreeSet<NodeId>>>);

impl PeerReachability {
    /// Records the outcome of an RPC to `target`, logging a change of its reachability.
    fn record(&self, target: NodeId, addr: &str, error: Option<&dyn std::fmt::Display>) {
        let mut down = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match error {
            Some(error) if down.insert(target) => {
                tracing::warn!(
                    peer = target,
                    %addr,
                    %error,
                    "peer unreachable; retrying quietly (logged again when it answers)"
                );
            }
            None if down.remove(&target) => tracing::info!(peer = target, %addr, "peer answers again"),
            _ => {}
        }
    }
}

impl Network {
    /// A network that sends through `peers` (the node's peer client). RPCs are signed by
    /// `signer` with the claim in `view` (kept up to date by [`follow`]). Every RPC sent is
    /// counted in `sent`.
    pub(crate) fn new(
        peers: &PeerClient,
        signer: Option<Arc<PeerSigner>>,
        view: Arc<LocalView>,
        sent: PeerRpcCounts,
        identity: Arc<ClusterIdentity>,
    ) -> Network {
        let pool = peers.pool(RAFT_POOL);
        Network { pool, signer, view, sent, unreachable: PeerReachability::default(), identity }
    }
}

/// openraft's client for one peer: its RPCs go over the pool's connections to that peer.
pub(crate) struct PeerConnection {
    pool: PeerPool,
    /// `host:port` of the peer, as in the membership.
    addr: String,
    signer: Option<Arc<PeerSigner>>,
    view: Arc<LocalView>,
    target: NodeId,
    sent: PeerRpcCounts,
    /// The commit index in the last AppendEntries sent to this peer.
    commit_sent: Option<super::LogId>,
    unreachable: PeerReachability,
    /// This node's cluster identity, sent with every message (`raft::identity`).
    identity: Arc<ClusterIdentity>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConnection {
        PeerConnection {
            pool: self.pool.clone(),
            addr: node.addr.clone(),
            signer: self.signer.clone(),
            view: self.view.clone(),
            target,
            sent: self.sent.clone(),
            commit_sent: None,
            unreachable: self.unreachable.clone(),
            identity: self.identity.clone(),
        }
    }
}

impl PeerConnection {
    /// Sends one RPC (see [`PeerConnection::send`]), logging when the peer stops or starts
    /// answering.
    async fn call<Req, Resp, E>(
        &self,
        kind: PeerRpcKind,
        route: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned + PeerAnswer,
        E: std::error::Error + DeserializeOwned,
    {
        let result = self.send(kind, route, request, option).await;
        match &result {
            Err(RPCError::Unreachable(error)) => {
                self.unreachable.record(self.target, &self.addr, Some(error))
            }
            Err(_) => {}
            Ok(_) => self.unreachable.record(self.target, &self.addr, None),
        }
        result
    }

    async fn send<Req, Resp, E>(
        &self,
        kind: PeerRpcKind,
        route: &str,
        request: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, BasicNode, E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned + PeerAnswer,
        E: std::error::Error + DeserializeOwned,
    {
        self.sent.count(kind);
        let body = postcard::to_allocvec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let path = format!("{RAFT_PATH_PREFIX}/{route}");
        let body = hyper::body::Bytes::from(body);
        let members = self.view.members.read().unwrap_or_else(PoisonError::into_inner).clone();
        let mut resent = false;
        let (status, bytes) = loop {
            let mut headers = hyper::HeaderMap::new();
            headers.insert(hyper::header::CONTENT_TYPE, CONTENT_TYPE.clone());
            if let Some(cluster) =
                self.identity.current().and_then(|id| hyper::header::HeaderValue::from_str(&id).ok())
            {
                headers.insert(CLUSTER_HEADER, cluster);
            }
            let signed_for = self
                .signer
                .as_ref()
                .map(|signer| signer.sign(self.target, "POST", &path, &body, &members, &mut headers));
            let request = PeerRequest {
                method: hyper::Method::POST,
                path: &path,
                headers: &headers,
                body: body.clone(),
                resend: Resend::Once,
            };
            let answer = tokio::time::timeout(option.hard_ttl(), self.pool.send(&self.addr, request))
                .await
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?
                .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
            let status = answer.status();
            // Refused unread because it was signed for another start of the peer: once more.
            if let (Some(signer), Some(used)) = (&self.signer, signed_for) {
                if status == hyper::StatusCode::UNAUTHORIZED
                    && !resent
                    && signer.learn(self.target, answer.headers(), used)
                {
                    resent = true;
                    continue;
                }
            }
            break (status, answer.into_body());
        };
        if !status.is_success() {
            // The answer's error says why (another cluster's node refuses this one, for one).
            let why = String::from_utf8_lossy(&bytes[..bytes.len().min(512)]).into_owned();
            let error = std::io::Error::other(format!("peer answered HTTP {status}: {why}"));
            return Err(RPCError::Unreachable(Unreachable::new(&error)));
        }
        let result: Result<Resp, E> =
            postcard::from_bytes(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let answer = result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))?;
        let limit = term_limit(self.view.term.load(Ordering::Relaxed));
        if answer.max_term() > limit {
            let error = std::io::Error::other(format!("peer answered a term above {limit}"));
            return Err(RPCError::Network(NetworkError::new(&error)));
        }
        Ok(answer)
    }
}

impl RaftNetwork<TypeConfig> for PeerConnection {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let kind = if rpc.entries.is_empty() { PeerRpcKind::Heartbeat } else { PeerRpcKind::Append };
        let new_commit = rpc.leader_commit != self.commit_sent;
        if kind == PeerRpcKind::Heartbeat && new_commit {
            // openraft 0.9 sends each follower an entry-less AppendEntries as soon as a commit
            // advances, to carry the commit index; nothing waits for it. On one worker thread
            // those sends ran before the leader's own apply and the client's answer, woken at
            // the same moment. The tasks already woken go first, so the client is answered
            // before the followers hear of the commit (`docs/performance.md`, *Heartbeats
            // after the apply*). Heartbeats that carry no new commit index (a read barrier's
            // round, the periodic ones) go at once.
            tokio::task::yield_now().await;
        }
        if new_commit {
            self.commit_sent = rpc.leader_commit;
        }
        self.call(kind, "append", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call(PeerRpcKind::Snapshot, "snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        self.call(PeerRpcKind::Vote, "vote", &rpc, &option).await
    }
}
