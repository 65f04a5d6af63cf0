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
    /// Client authentication and ACLs (`--auth`).
    pub auth: bool,
    /// The root token's secret for the bootstrap (`PERMIT_ROOT_TOKEN`, `--root-token-file`);
    /// `None` generates one into `DATA_DIR/root-token`.
    pub root_token: Option<String>,
    /// Most live sessions one token may have (`--sessions-per-token-max`).
    pub sessions_per_token_max: u64,
    /// Most semaphores, elections and queues one token may have created that still exist
    /// (`--objects-per-token-max`).
    pub objects_per_token_max: u64,
    /// Most long-polls one token may have open on this node (`--long-polls-per-token-max`).
    pub long_polls_per_token_max: u32,
    /// `/metrics` without a token even with `--auth` (`--metrics-public`).
    pub metrics_public: bool,
    /// Listen on a non-loopback address without `--auth` (`--allow-unauthenticated`).
    pub allow_unauthenticated: bool,
    /// The secret shared by every node of a cluster (`--cluster-secret-file`): peer requests
    /// carry a credential derived from it. Required with `peers` or `join`; without it the node
    /// serves no `/raft/*` route.
    pub cluster_secret: Option<crate::peer::ClusterSecret>,
    /// Longest wait for a client's complete request head (and TLS handshake); an idle
    /// keep-alive connection is closed after it too.
    pub header_read_timeout: std::time::Duration,
    /// Most client connections open at once; more are closed as soon as they are accepted (a
    /// node with a cluster secret keeps `listener::PEER_CONNECTIONS_RESERVED` more for peers).
    pub connections_max: usize,
    /// Most client connections open at once from one source address
    /// (`--connections-per-client-max`).
    pub connections_per_client_max: usize,
    /// Start a new single-node cluster from this backup (`--restore`, `GET /v1/snapshot`); the
    /// data dir must be empty.
    pub restore: Option<PathBuf>,
    /// Serve HTTPS (and reach peers over HTTPS) with these files.
    pub tls: Option<crate::tls::TlsConfig>,
    /// Most semaphores and elections with metric series of their own (`--metrics-names-max`),
    /// and semaphores with a history; the others are summed under the label value `_other`
    /// and have no history.
    pub metrics_names_max: usize,
    /// The disk the Raft log is stored on: the operating system's files
    /// ([`crate::raft::disk::OsDisk`]), or a simulation's disk.
    #[doc(hidden)]
    pub disk: std::sync::Arc<dyn crate::raft::disk::Disk>,
    /// Seeds the generator of new session and token ids (a simulation's; `permit serve` draws
    /// them from the OS-seeded generator).
    #[doc(hidden)]
    pub id_seed: Option<u64>,
    /// Called once the start has read the log and the snapshot, before the node serves:
    /// `permit serve` hands back to the system the memory its allocator kept from that load
    /// (whole segments and snapshot files read, then freed). mimalloc returns freed pages only
    /// during later allocations, which an idle node does not make, so a restarted node would
    /// keep its load's buffers resident.
    pub after_load: Option<fn()>,
}

/// The file of the redb log store that earlier versions kept in a data dir: such a data dir is
/// refused (see `raft::consensus`).
pub(crate) const REDB_LOG: &str = "raft-log.redb";
/// The segment log's directory in a data dir.
pub(crate) const SEGMENT_LOG: &str = "raft-log";

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
            auth: false,
            root_token: None,
            sessions_per_token_max: 10_000,
            objects_per_token_max: 10_000,
            long_polls_per_token_max: 1_000,
            metrics_public: false,
            allow_unauthenticated: false,
            cluster_secret: None,
            header_read_timeout: crate::listener::HEADER_READ_TIMEOUT_DEFAULT,
            metrics_names_max: crate::metrics::METRICS_NAMES_MAX_DEFAULT,
            connections_max: crate::listener::CONNECTIONS_MAX_DEFAULT,
            connections_per_client_max: crate::listener::CONNECTIONS_PER_CLIENT_MAX_DEFAULT,
            tls: None,
            restore: None,
            disk: crate::raft::disk::OsDisk::shared(),
            id_seed: None,
            after_load: None,
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
        anyhow::ensure!(
            self.restore.is_none() || (self.peers.is_empty() && !self.join),
            "--restore starts a single node; add the others with `permit cluster add`"
        );
        anyhow::ensure!(self.node_id > 0, "node ids start at 1");
        anyhow::ensure!(
            self.auth || self.allow_unauthenticated || self.listen.ip().is_loopback(),
            "listening on {} without --auth lets anyone on the network hold, release and reconfigure \
             everything: add --auth, or --allow-unauthenticated to mean it",
            self.listen.ip()
        );
        if let Some(secret) = &self.root_token {
            // The root secret opens everything: refuse one that can be guessed (docs/security.md).
            crate::entropy::check(
                "the root token's secret (PERMIT_ROOT_TOKEN or --root-token-file)",
                secret.as_bytes(),
            )?;
        }
        anyhow::ensure!(self.sessions_per_token_max >= 1, "--sessions-per-token-max must be at least 1");
        anyhow::ensure!(self.objects_per_token_max >= 1, "--objects-per-token-max must be at least 1");
        anyhow::ensure!(self.long_polls_per_token_max >= 1, "--long-polls-per-token-max must be at least 1");
        anyhow::ensure!(
            self.cluster_secret.is_some() || (self.peers.is_empty() && !self.join),
            "--peers and --join need --cluster-secret-file: {}",
            crate::peer::SECRET_HOWTO
        );
        anyhow::ensure!(
            (1..=crate::listener::CONNECTIONS_MAX_LIMIT).contains(&self.connections_max),
            "--connections-max must be 1 to {}",
            crate::listener::CONNECTIONS_MAX_LIMIT
        );
        anyhow::ensure!(
            (1..=crate::listener::CONNECTIONS_MAX_LIMIT).contains(&self.connections_per_client_max),
            "--connections-per-client-max must be 1 to {}",
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
