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
    /// Longest wait for a client's complete request head (and TLS handshake); an idle
    /// keep-alive connection is closed after it too.
    pub header_read_timeout: std::time::Duration,
    /// Most connections open at once; more are closed as soon as they are accepted.
    pub connections_max: usize,
    /// Serve HTTPS (and reach peers over HTTPS) with these files.
    pub tls: Option<crate::tls::TlsConfig>,
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
            header_read_timeout: crate::listener::HEADER_READ_TIMEOUT_DEFAULT,
            connections_max: crate::listener::CONNECTIONS_MAX_DEFAULT,
            tls: None,
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
            (1..=crate::listener::CONNECTIONS_MAX_LIMIT).contains(&self.connections_max),
            "--connections-max must be 1 to {}",
            crate::listener::CONNECTIONS_MAX_LIMIT
        );
        anyhow::ensure!(!self.header_read_timeout.is_zero(), "--header-read-timeout must be positive");
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
