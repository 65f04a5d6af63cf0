//! The network faults in force: cut links, per-link latency and message loss.
//!
//! Links are directed, so a one-way partition is one cut link; isolating a node cuts every link
//! to and from it, and a majority/minority split cuts every link across the two sides.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use permit_server::raft::NodeId;

/// Latency of a link without a latency fault, in simulated ms (drawn uniformly per message).
pub const LATENCY_MS_DEFAULT: (u64, u64) = (1, 5);

/// The faults in force on the simulated network.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// Directed links (from, to) that deliver nothing.
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Latency range of a link, in ms, where it differs from [`LATENCY_MS_DEFAULT`].
    latency_ms: BTreeMap<(NodeId, NodeId), (u64, u64)>,
    /// Chance that a message (request or response) is lost, in thousandths.
    loss_per_mille: u32,
}

impl Faults {
    /// Cuts every link to and from `node`.
    pub fn isolate(&mut self, node: NodeId, nodes: &[NodeId]) {
        for other in nodes.iter().copied().filter(|other| *other != node) {
            self.cut.insert((node, other));
            self.cut.insert((other, node));
        }
    }

    /// Cuts every link between the two sides, both ways.
    pub fn split(&mut self, side_a: &[NodeId], side_b: &[NodeId]) {
        for a in side_a {
            for b in side_b {
                self.cut.insert((*a, *b));
                self.cut.insert((*b, *a));
            }
        }
    }

    /// Cuts the link from `from` to `to` only.
    pub fn cut_one_way(&mut self, from: NodeId, to: NodeId) {
        self.cut.insert((from, to));
    }

    /// Slows the link between `a` and `b`, both ways.
    pub fn slow_link(&mut self, a: NodeId, b: NodeId, range_ms: (u64, u64)) {
        assert!(range_ms.0 <= range_ms.1, "latency range is ordered");
        self.latency_ms.insert((a, b), range_ms);
        self.latency_ms.insert((b, a), range_ms);
    }

    /// Loses this share of messages, in thousandths.
    pub fn set_loss(&mut self, loss_per_mille: u32) {
        assert!(loss_per_mille <= 1000, "a share in thousandths");
        self.loss_per_mille = loss_per_mille;
    }

    /// Removes every fault.
    pub fn heal(&mut self) {
        *self = Faults::default();
    }

    /// Whether the link from `from` to `to` is cut.
    pub fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        self.cut.contains(&(from, to))
    }

    /// The latency range of the link, in ms.
    pub fn latency_ms(&self, from: NodeId, to: NodeId) -> (u64, u64) {
        self.latency_ms.get(&(from, to)).copied().unwrap_or(LATENCY_MS_DEFAULT)
    }

    /// Chance of losing one message, in thousandths.
    pub fn loss_per_mille(&self) -> u32 {
        self.loss_per_mille
    }

    /// Whether any fault is in force.
    pub fn is_healed(&self) -> bool {
        self.cut.is_empty() && self.latency_ms.is_empty() && self.loss_per_mille == 0
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_healed() {
            return f.write_str("healed");
        }
        let cut: Vec<String> = self.cut.iter().map(|(a, b)| format!("{a}->{b}")).collect();
        let slow: Vec<String> =
            self.latency_ms.iter().map(|((a, b), (lo, hi))| format!("{a}->{b}:{lo}-{hi}ms")).collect();
        write!(f, "cut [{}] slow [{}] loss {}/1000", cut.join(" "), slow.join(" "), self.loss_per_mille)
    }
}
