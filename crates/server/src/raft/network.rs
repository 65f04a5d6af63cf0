//! Raft RPCs between nodes: HTTP POSTs of postcard bodies to `/raft/{append,vote,snapshot}` on
//! the peer's address (the same address as its client API), each with this node's peer
//! credential (`permit-peer-id`, `permit-peer-auth`; see [`crate::peer`]), over a connection
//! that the sending task drives itself ([`crate::peer_conn`]).
//!
//! A peer that cannot be reached is reported as `Unreachable`, so that openraft backs off instead
//! of retrying in a tight loop. Every RPC has openraft's deadline as its HTTP timeout.

use std::sync::Arc;
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

use super::bounds::{PeerAnswer, RAFT_TERM_MAX};
use super::{NodeId, TypeConfig};
use crate::metrics::{PeerRpcCounts, PeerRpcKind};
use crate::peer::ClusterSecret;
use crate::peer_conn::{PeerPool, PeerPoolConfig, PeerRequest, Resend};

/// Path prefix of the peer RPC routes.
pub const RAFT_PATH_PREFIX: &str = "/raft";

/// Longest a peer may take to accept a TCP connection (and finish the TLS handshake, over HTTPS).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// The most idle connections kept per peer (RPCs to one peer in flight at once: its replication
/// stream, a read barrier's round, an election, a snapshot).
const IDLE_PER_PEER_MAX: usize = 4;
/// The largest answer a peer may send to an RPC (they are a few dozen bytes).
const ANSWER_BYTES_MAX: usize = 1 << 20;

/// Creates the clients openraft sends peer RPCs with; they share one [`PeerPool`].
#[derive(Clone)]
pub struct Network {
    pool: PeerPool,
    /// `content-type` and the peer credential, on every RPC.
    headers: Arc<hyper::HeaderMap>,
    sent: PeerRpcCounts,
}

impl Network {
    /// A network dialling from `local` when it is a specific address (so peers and
    /// fault-injecting proxies see which node connects), over HTTPS when `tls` is set. Requests carry node `id`'s credential under `secret` (none without a
    /// secret: peers refuse them). Every RPC sent is counted in `sent`.
    ///
    /// # Errors
    /// When a TLS file cannot be read.
    pub fn new(
        local: Option<std::net::IpAddr>,
        id: NodeId,
        secret: Option<&ClusterSecret>,
        tls: Option<&crate::tls::TlsConfig>,
        sent: PeerRpcCounts,
    ) -> anyhow::Result<Network> {
        let tls = tls.map(crate::tls::peer_client_config).transpose()?;
        let pool = PeerPool::new(PeerPoolConfig {
            local,
            tls,
            connect_timeout: CONNECT_TIMEOUT,
            idle_max: IDLE_PER_PEER_MAX,
            answer_max: ANSWER_BYTES_MAX,
        });
        let mut headers = hyper::HeaderMap::new();
        headers.insert(
            hyper::header::CONTENT_TYPE,
            hyper::header::HeaderValue::from_static("application/octet-stream"),
        );
        if let Some(secret) = secret {
            secret.insert_headers(id, &mut headers);
        }
        Ok(Network { pool, headers: Arc::new(headers), sent })
    }
}

/// openraft's client for one peer: its RPCs go over the pool's connections to that peer.
pub struct PeerConnection {
    pool: PeerPool,
    /// `host:port` of the peer, as in the membership.
    addr: String,
    headers: Arc<hyper::HeaderMap>,
    target: NodeId,
    sent: PeerRpcCounts,
    /// The commit index in the last AppendEntries sent to this peer.
    commit_sent: Option<super::LogId>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerConnection;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerConnection {
        PeerConnection {
            pool: self.pool.clone(),
            addr: node.addr.clone(),
            headers: self.headers.clone(),
            target,
            sent: self.sent.clone(),
            commit_sent: None,
        }
    }
}

impl PeerConnection {
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
        self.sent.count(kind);
        let body = postcard::to_allocvec(request).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let path = format!("{RAFT_PATH_PREFIX}/{route}");
        let request = PeerRequest {
            method: hyper::Method::POST,
            path: &path,
            headers: &self.headers,
            body: body.into(),
            resend: Resend::Once,
        };
        let answer = tokio::time::timeout(option.hard_ttl(), self.pool.send(&self.addr, request))
            .await
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&e)))?;
        let (status, bytes) = (answer.status(), answer.into_body());
        if !status.is_success() {
            let error = std::io::Error::other(format!("peer answered HTTP {status}"));
            return Err(RPCError::Unreachable(Unreachable::new(&error)));
        }
        let result: Result<Resp, E> =
            postcard::from_bytes(&bytes).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let answer = result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))?;
        if answer.max_term() > RAFT_TERM_MAX {
            let error = std::io::Error::other(format!("peer answered a term above {RAFT_TERM_MAX}"));
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
            // the same moment. Letting the tasks already woken go first took 3-node W1 from
            // 0.879 to 0.801 ms, and W2 up 1.00-1.11x (`docs/performance.md`, *Heartbeats
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
