//! A cluster of full Permit nodes in one process, each with its data dir in one temporary
//! directory, connected by the [`Router`]. A crash shuts a node down and drops it: its memory is
//! gone, its disk stays, and a restart starts a new node on the same data dir.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::ServerState;
use permit_server::raft::NodeId;
use permit_server::{Config, Node};
use rand::seq::IndexedRandom;
use rand::Rng;

use crate::disk::SimDisk;
use crate::observer::Observer;
use crate::recorder::Recorder;
use crate::router::Router;

/// The node ids of the simulated cluster.
pub const NODE_IDS: [NodeId; 3] = [1, 2, 3];

/// Attempts to reopen a data dir whose previous node is still letting go of its files.
const REOPEN_ATTEMPTS: u32 = 50;

/// Raft timing and compaction of every node, and the seed of their id sources.
#[derive(Debug, Clone, Copy)]
pub struct RaftSettings {
    /// Leader heartbeat interval, in ms.
    pub heartbeat_ms: u64,
    /// Election timeout range, in ms.
    pub election_timeout_ms: (u64, u64),
    /// Snapshot (and compact the log) after this many entries.
    pub snapshot_logs: u64,
    /// Seeds each node's source of new session ids (mixed with its id and its start count,
    /// so that a restarted node does not hand out the ids of its previous run again).
    pub id_seed: u64,
}

/// The nodes of one simulation.
pub struct Cluster {
    router: Arc<Router>,
    observer: Arc<Observer>,
    recorder: Arc<Recorder>,
    settings: RaftSettings,
    root: tempfile::TempDir,
    nodes: Mutex<BTreeMap<NodeId, Option<Arc<Node>>>>,
    /// Each node's disk (its Raft log's and snapshots'), kept across its restarts.
    disks: BTreeMap<NodeId, SimDisk>,
    /// Nodes found fail-stopped by an injected fsync failure.
    fsync_failures: AtomicU64,
    /// Power cuts that tore unsynced writes.
    torn_tails: AtomicU64,
    /// Node starts so far.
    launches: AtomicU64,
    /// Self-test: every crash loses acknowledged entries (see `Settings::lying_disk`).
    lying_disk: std::sync::atomic::AtomicBool,
}

/// Syncs of segment files a lying disk takes back at each crash (each one an append of at
/// least one acknowledged entry, mostly).
const LIE_SYNCS: usize = 20;

impl Cluster {
    /// Starts every node; each forms the cluster from the same `--peers` list, as `permit serve`
    /// does.
    ///
    /// # Errors
    /// When the temporary directory cannot be made or a node cannot start.
    pub async fn start(
        router: Arc<Router>,
        observer: Arc<Observer>,
        recorder: Arc<Recorder>,
        settings: RaftSettings,
    ) -> anyhow::Result<Arc<Cluster>> {
        let root = tempfile::Builder::new().prefix("permit-sim-").tempdir_in(scratch_dir())?;
        let cluster = Arc::new(Cluster {
            router,
            observer,
            recorder,
            settings,
            root,
            nodes: Mutex::new(NODE_IDS.iter().map(|id| (*id, None)).collect()),
            disks: NODE_IDS.iter().map(|id| (*id, SimDisk::new())).collect(),
            fsync_failures: AtomicU64::new(0),
            torn_tails: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            lying_disk: std::sync::atomic::AtomicBool::new(false),
        });
        for id in NODE_IDS {
            cluster.launch(id).await?;
        }
        Ok(cluster)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<NodeId, Option<Arc<Node>>>> {
        self.nodes.lock().expect("cluster lock")
    }

    fn config(&self, id: NodeId) -> Config {
        Config {
            node_id: id,
            listen: address(id),
            data_dir: self.data_dir(id),
            peers: NODE_IDS.iter().map(|peer| (*peer, address(*peer).to_string())).collect(),
            heartbeat_ms: self.settings.heartbeat_ms,
            election_timeout_ms: self.settings.election_timeout_ms,
            snapshot_logs: self.settings.snapshot_logs,
            join: false,
            // The in-memory network carries no credential; the secret only satisfies the
            // configuration check for `peers`.
            cluster_secret: Some(
                permit_server::peer::ClusterSecret::new(b"simulation-cluster-secret").expect("long enough"),
            ),
            disk: self.disks[&id].mount(),
            id_seed: Some(self.settings.id_seed ^ (id << 48) ^ self.launches.fetch_add(1, Ordering::Relaxed)),
            ..Config::default()
        }
    }

    /// Where node `id` keeps its Raft log and snapshots.
    pub fn data_dir(&self, id: NodeId) -> PathBuf {
        self.root.path().join(format!("node-{id}"))
    }

    /// Starts node `id` on its data dir, retrying while the previous run still holds its files.
    async fn launch(&self, id: NodeId) -> anyhow::Result<()> {
        let mut attempt = 0;
        let node = loop {
            attempt += 1;
            match Node::start_with(self.config(id), address(id), self.router.network(id)).await {
                Ok(node) => break node,
                Err(error) if attempt < REOPEN_ATTEMPTS => {
                    self.recorder.note(format!("node {id} cannot start yet: {error:#}"));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => return Err(error.context(format!("node {id} does not start"))),
            }
        };
        self.router.attach(id, node.consensus().raft().clone());
        self.observer.watch(id, &node);
        self.lock().insert(id, Some(node));
        self.recorder.note(format!("node {id} started"));
        Ok(())
    }

    /// Node `id`, if it runs.
    pub fn node(&self, id: NodeId) -> Option<Arc<Node>> {
        self.lock().get(&id).cloned().flatten()
    }

    /// The nodes that run.
    pub fn running(&self) -> Vec<Arc<Node>> {
        self.lock().values().flatten().cloned().collect()
    }

    /// The ids of the nodes that are down.
    pub fn down(&self) -> Vec<NodeId> {
        self.lock().iter().filter(|(_, node)| node.is_none()).map(|(id, _)| *id).collect()
    }

    /// The running nodes that believe they lead (a deposed leader cut off from the others may
    /// still believe it), but not one that failed (it refuses all work, as over HTTP).
    pub fn leaders(&self) -> Vec<Arc<Node>> {
        self.running()
            .into_iter()
            .filter(|node| node.failure().is_none())
            .filter(|node| node.consensus().raft().metrics().borrow().state == ServerState::Leader)
            .collect()
    }

    /// One of the nodes that believe they lead, chosen with `rng`.
    pub fn pick_leader(&self, rng: &mut impl Rng) -> Option<Arc<Node>> {
        self.leaders().choose(rng).cloned()
    }

    /// Self-test: makes every crash lose the crashed node's last acknowledged entries.
    pub fn set_lying_disk(&self, lying: bool) {
        self.lying_disk.store(lying, Ordering::Relaxed);
    }

    /// Crashes node `id`: shuts it down and drops it. Its disk stays (all of it, unless the
    /// disk lies: see [`Cluster::set_lying_disk`]).
    pub async fn crash(&self, id: NodeId) {
        let Some(node) = self.lock().get_mut(&id).and_then(Option::take) else { return };
        self.recorder.note(format!("node {id} crashes"));
        if self.lying_disk.load(Ordering::Relaxed) {
            self.observer.storage_fault(id);
            self.disks[&id].lie_about_fsync(LIE_SYNCS);
            let cut = self.disks[&id].power_cut(0);
            self.recorder
                .note(format!("node {id}'s disk lied: {} acknowledged syncs taken back", cut.lied_syncs));
        }
        self.router.detach(id);
        self.observer.stopping(id);
        node.shutdown().await;
    }

    /// Makes node `id`'s next log fsync fail (`written`: the writes it was to sync stay in the
    /// file, else they are gone from it too); the node must fail-stop.
    pub fn fail_next_fsync(&self, id: NodeId, written: bool) {
        self.observer.storage_fault(id);
        self.disks[&id].fail_next_sync(written);
    }

    /// Makes node `id`'s log fsyncs hang: its writes are not durable, and a writer that waits
    /// for a sync waits, until the fault is disarmed or the power is cut.
    pub fn stall_appends(&self, id: NodeId) {
        self.observer.storage_fault(id);
        self.disks[&id].hang_syncs();
    }

    /// Cuts node `id`'s power: its disk keeps what was durable and the first `keep` of each
    /// file's unsynced writes, then a torn one (a torn tail, never acknowledged), and the node
    /// crashes.
    pub async fn power_cut(&self, id: NodeId, keep: u64) {
        self.observer.storage_fault(id);
        let cut = self.disks[&id].power_cut(usize::try_from(keep).expect("a small count"));
        if cut.torn_writes > 0 {
            self.torn_tails.fetch_add(1, Ordering::Relaxed);
            self.recorder.note(format!("node {id} loses power: {} unsynced writes torn", cut.torn_writes));
        } else {
            self.recorder.note(format!("node {id} loses power: nothing unsynced"));
        }
        self.crash(id).await;
    }

    /// Disarms every storage fault that has not fired, and crashes the nodes that fail-stopped
    /// (a supervisor restarts them).
    pub async fn clear_storage_faults(&self) {
        for disk in self.disks.values() {
            disk.disarm();
        }
        for node in self.running() {
            if let Some(failure) = node.failure() {
                self.fsync_failures.fetch_add(1, Ordering::Relaxed);
                self.recorder.note(format!("node {} fail-stopped: {failure}", node.id));
                self.crash(node.id).await;
            }
        }
    }

    /// Fsync failures that stopped a node, and power cuts that tore a tail.
    pub fn storage_counts(&self) -> (u64, u64) {
        (self.fsync_failures.load(Ordering::Relaxed), self.torn_tails.load(Ordering::Relaxed))
    }

    /// Restarts node `id` on its data dir, if it is down.
    ///
    /// # Errors
    /// When it does not start.
    pub async fn restart(&self, id: NodeId) -> anyhow::Result<()> {
        if self.node(id).is_some() {
            return Ok(());
        }
        self.launch(id).await
    }

    /// Shuts every node down (the end of the simulation).
    pub async fn shutdown(&self) {
        for id in NODE_IDS {
            self.crash(id).await;
        }
    }
}

/// The address node `id` claims. Nothing listens there: RPCs go through the router.
fn address(id: NodeId) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 17_000 + u16::try_from(id).expect("small node ids")))
}

/// Where data dirs go: `PERMIT_SIM_DIR`, else `/dev/shm` when it exists, else the system's
/// temporary directory. A node makes its data dir there, but its log and snapshots are on its
/// simulated disk.
fn scratch_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PERMIT_SIM_DIR") {
        return PathBuf::from(dir);
    }
    let shm = PathBuf::from("/dev/shm");
    if shm.is_dir() {
        return shm;
    }
    std::env::temp_dir()
}
