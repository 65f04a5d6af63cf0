//! The server's configuration: one validated struct, passed explicitly.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::raft::NodeId;

/// Everything a node needs to start. Defaults are the single-node, no-config server.
#[derive(Debug, Clone)]
pub struct Config {
    /// This node's id in the Raft group.
    pub node_id: NodeId,
    /// Address the HTTP API (and peer RPC) listens on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Directory of the Raft log and snapshots.
    pub data_dir: PathBuf,
    /// Every voter of a cluster, by id, with its address (including this node); empty for a
    /// single node.
    pub peers: BTreeMap<NodeId, String>,
    /// Leader heartbeat interval, in ms.
    pub heartbeat_ms: u64,
    /// A follower that hears no leader for a random time in this range starts an election, in ms.
    pub election_timeout_ms: (u64, u64),
    /// Take a snapshot (and compact the log) after this many entries.
    pub snapshot_logs: u64,
    /// Start without forming a cluster: wait to be added to one (`permit cluster add`) or
    /// initialised (`POST /v1/cluster/init`).
    pub join: bool,
    /// The secret shared by every node of a cluster (`--cluster-secret-file`): peer requests
    /// carry a credential derived from it. Required with `peers` or `join`; without it the node
    /// serves no `/raft/*` route.
    pub cluster_secret: Option<crate::peer::ClusterSecret>,
}

/// `permit serve`'s default address.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7376";

impl Default for Config {
    fn default() -> Config {
        Config {
            node_id: 1,
            listen: DEFAULT_LISTEN.parse().expect("valid default address"),
            data_dir: PathBuf::from("permit-data"),
            peers: BTreeMap::new(),
            heartbeat_ms: 100,
            election_timeout_ms: (500, 1000),
            snapshot_logs: 10_000,
            join: false,
            cluster_secret: None,
        }
    }
}

impl Config {
    /// Checks the relations between settings.
    ///
    /// # Errors
    /// A message naming the setting at fault.
    pub fn validate(&self) -> anyhow::Result<()> {
        let (min, max) = self.election_timeout_ms;
        anyhow::ensure!(self.heartbeat_ms >= 10, "heartbeat must be at least 10 ms");
        anyhow::ensure!(min > 2 * self.heartbeat_ms, "election timeout must exceed two heartbeats");
        anyhow::ensure!(max > min, "election timeout range is empty");
        anyhow::ensure!(self.snapshot_logs >= 10, "snapshot interval must be at least 10 entries");
        anyhow::ensure!(!self.join || self.peers.is_empty(), "--join and --peers exclude each other");
        anyhow::ensure!(self.node_id > 0, "node ids start at 1");
        anyhow::ensure!(
            self.cluster_secret.is_some() || (self.peers.is_empty() && !self.join),
            "--peers and --join need --cluster-secret-file: {}",
            crate::peer::SECRET_HOWTO
        );
        if !self.peers.is_empty() {
            anyhow::ensure!(
                self.peers.contains_key(&self.node_id),
                "--peers must include this node's id {}",
                self.node_id
            );
        }
        Ok(())
    }
}
