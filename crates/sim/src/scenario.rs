//! A simulated cluster for a hand-written scenario (`tests/stale_expiry.rs`,
//! `tests/leader_sync.rs`): the random runs' Raft settings, ids seeded by the scenario's seed,
//! and a gateway that records as client 0.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::cluster::{Cluster, RaftSettings};
use crate::gateway::Gateway;
use crate::observer::Observer;
use crate::recorder::Recorder;
use crate::router::Router;

/// A started cluster and what a scenario drives it with.
pub struct Scenario {
    /// The in-memory network, to cut and heal links.
    pub router: Arc<Router>,
    /// The nodes.
    pub cluster: Arc<Cluster>,
    /// Client 0's way in (finds the leader, runs operations).
    pub gateway: Gateway,
    /// The scenario's own random numbers, seeded like the cluster.
    pub rng: StdRng,
}

impl Scenario {
    /// A current-thread runtime in paused time, as the random runs use: run a scenario with
    /// `Scenario::runtime().block_on(...)`.
    ///
    /// # Panics
    /// When the runtime cannot be built.
    pub fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime")
    }

    /// Starts a 3-node cluster seeded by `seed` (heartbeats every 100 ms, elections after
    /// 500-1000 ms, snapshots every 10 000 entries).
    ///
    /// # Panics
    /// When the cluster does not start.
    pub async fn start(seed: u64) -> Scenario {
        let recorder = Recorder::new();
        let router = Router::new(seed);
        let observer = Observer::new(recorder.clone());
        let settings = RaftSettings {
            heartbeat_ms: 100,
            election_timeout_ms: (500, 1000),
            snapshot_logs: 10_000,
            id_seed: seed,
        };
        let cluster =
            Cluster::start(router.clone(), observer, recorder.clone(), settings).await.expect("cluster");
        let gateway = Gateway::new(cluster.clone(), recorder, 0);
        Scenario { router, cluster, gateway, rng: StdRng::seed_from_u64(seed) }
    }
}
