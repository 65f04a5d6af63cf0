//! The nemesis: injects one or two faults at a time, holds them for a while, heals them, and
//! rests, until told to stop. Crashed nodes restart when their fault heals.

use std::sync::Arc;
use std::time::Duration;

use permit_server::raft::NodeId;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::Rng;
use tokio::sync::watch;

use crate::client::sleep_or_stop;
use crate::cluster::{Cluster, NODE_IDS};
use crate::recorder::Recorder;
use crate::router::Router;

/// Longest a fault is held, in ms.
pub const FAULT_MS_MAX: u64 = 4000;
/// Largest share of storage faults among the faults drawn (drawn per seed), in thousandths.
const STORAGE_PER_MILLE_MAX: u32 = 300;
/// Longest time appends hang before a power cut, in ms.
const STALL_MS_MAX: u64 = 600;
/// Longest rest between faults, in ms.
const REST_MS_MAX: u64 = 2500;

/// One fault.
#[derive(Debug, Clone, Copy)]
pub enum Fault {
    /// Cut every link of one node (a majority/minority split of 3 nodes).
    Isolate(NodeId),
    /// Cut the link between two nodes both ways; the third still reaches both.
    Bridge(NodeId, NodeId),
    /// Cut one direction of one link.
    OneWay(NodeId, NodeId),
    /// Lose this share of all messages, in thousandths.
    Loss(u32),
    /// Slow the link between two nodes to this latency range, in ms.
    Slow(NodeId, NodeId, (u64, u64)),
    /// Crash a node; it restarts when the fault heals.
    Crash(NodeId),
    /// The node's next log fsync fails (the writes it was to sync left in the file, or gone);
    /// the node must fail-stop. It restarts when the fault heals.
    FsyncFail(NodeId, bool),
    /// The node's log fsyncs hang (its writes are not durable, and an append waits for its
    /// fsync) for this many ms, then it loses power keeping only this many of each file's
    /// unsynced writes whole, and one torn: a torn tail on restart.
    TornTail(NodeId, u64, u64),
}

/// Injects faults into one simulation.
pub struct Nemesis {
    cluster: Arc<Cluster>,
    router: Arc<Router>,
    recorder: Arc<Recorder>,
    rng: StdRng,
    /// Faults injected, crashes among them.
    pub injected: u64,
    /// Crashes injected (power cuts included).
    pub crashes: u64,
    /// This seed's share of storage faults among the faults drawn, in thousandths.
    storage_per_mille: u32,
}

impl Nemesis {
    /// A nemesis for `cluster`.
    pub fn new(
        cluster: Arc<Cluster>,
        router: Arc<Router>,
        recorder: Arc<Recorder>,
        mut rng: StdRng,
    ) -> Nemesis {
        let storage_per_mille = rng.random_range(0..=STORAGE_PER_MILLE_MAX);
        recorder.note(format!("nemesis: storage faults {storage_per_mille}‰ of faults"));
        Nemesis { cluster, router, recorder, rng, injected: 0, crashes: 0, storage_per_mille }
    }

    /// Injects faults until `stop` turns true, then heals everything; returns itself for its
    /// counts.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) -> Nemesis {
        loop {
            let rest = Duration::from_millis(self.rng.random_range(100..=REST_MS_MAX));
            if sleep_or_stop(rest, &mut stop).await {
                break;
            }
            let faults = if self.rng.random_bool(0.25) { 2 } else { 1 };
            for _ in 0..faults {
                let fault = self.draw();
                self.inject(fault).await;
            }
            let hold = Duration::from_millis(self.rng.random_range(200..=FAULT_MS_MAX));
            let stopped = sleep_or_stop(hold, &mut stop).await;
            self.heal().await;
            if stopped {
                break;
            }
        }
        self.heal().await;
        self
    }

    /// Draws a fault; the leader is a favourite target.
    fn draw(&mut self) -> Fault {
        let leader = self.cluster.pick_leader(&mut self.rng).map(|node| node.id);
        let mut ids = NODE_IDS;
        ids.shuffle(&mut self.rng);
        let target = match leader {
            Some(leader) if self.rng.random_bool(0.5) => leader,
            _ => ids[0],
        };
        let other = *ids
            .iter()
            .filter(|id| **id != target)
            .collect::<Vec<_>>()
            .choose(&mut self.rng)
            .expect("3 nodes");
        if self.rng.random_range(0..1000) < self.storage_per_mille {
            return if self.rng.random_bool(0.5) {
                Fault::FsyncFail(target, self.rng.random_bool(0.5))
            } else {
                Fault::TornTail(target, self.rng.random_range(0..=STALL_MS_MAX), self.rng.random_range(0..=3))
            };
        }
        match self.rng.random_range(0..100) {
            0..30 => Fault::Isolate(target),
            30..40 => Fault::Bridge(target, *other),
            40..47 => Fault::OneWay(target, *other),
            47..57 => Fault::Loss(self.rng.random_range(50..=400)),
            57..67 => {
                let low = self.rng.random_range(10..=200);
                Fault::Slow(target, *other, (low, low + self.rng.random_range(0..=300)))
            }
            _ => Fault::Crash(target),
        }
    }

    async fn inject(&mut self, fault: Fault) {
        self.injected += 1;
        self.recorder.note(format!("nemesis: {fault:?}"));
        match fault {
            Fault::Isolate(id) => self.router.with_faults(|f| f.isolate(id, &NODE_IDS)),
            Fault::Bridge(a, b) => self.router.with_faults(|f| f.split(&[a], &[b])),
            Fault::OneWay(from, to) => self.router.with_faults(|f| f.cut_one_way(from, to)),
            Fault::Loss(per_mille) => self.router.with_faults(|f| f.set_loss(per_mille)),
            Fault::Slow(a, b, range) => self.router.with_faults(|f| f.slow_link(a, b, range)),
            Fault::Crash(id) => {
                self.crashes += 1;
                self.cluster.crash(id).await;
            }
            Fault::FsyncFail(id, written) => self.cluster.fail_next_fsync(id, written),
            Fault::TornTail(id, stall_ms, keep) => {
                if self.cluster.node(id).is_none() {
                    return;
                }
                self.crashes += 1;
                self.cluster.stall_appends(id);
                tokio::time::sleep(Duration::from_millis(stall_ms)).await;
                self.cluster.power_cut(id, keep).await;
            }
        }
    }

    /// Heals the network and restarts every crashed node.
    pub async fn heal(&mut self) {
        self.router.with_faults(|f| f.heal());
        self.cluster.clear_storage_faults().await;
        for id in self.cluster.down() {
            if let Err(error) = self.cluster.restart(id).await {
                self.recorder.violation(format!("node {id} does not restart: {error:#}"));
            }
        }
        self.recorder.note("nemesis: healed");
    }
}
