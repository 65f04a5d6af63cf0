//! I7, convergence: replicas that applied the same log prefix have the same state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::report::{Invariant, Report, Violation};

/// One replica's state-machine digest at its applied index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaDigest {
    /// The node id.
    pub node: u64,
    /// The Raft log index it had applied when it computed the digest.
    pub applied_index: u64,
    /// The digest of its state, in any encoding the nodes share.
    pub digest: String,
}

/// Checks that replicas reporting the same applied index report the same digest.
///
/// A check that compares nothing proves nothing: fewer than two replicas at a shared index
/// is a violation too (let the cluster settle, then ask again). `checked` counts the replicas
/// that were compared.
///
/// # Examples
///
/// ```
/// use permit_check::{check_convergence, ReplicaDigest};
///
/// let digest = |node, applied_index, digest: &str| ReplicaDigest { node, applied_index, digest: digest.into() };
/// let report = check_convergence(&[digest(1, 40, "ab12"), digest(2, 40, "ab12"), digest(3, 40, "ff00")]);
/// assert_eq!(report.checked, 3);
/// assert!(report.violations[0].message.contains("node 3"));
/// ```
pub fn check_convergence(replicas: &[ReplicaDigest]) -> Report {
    let mut by_index: BTreeMap<u64, Vec<&ReplicaDigest>> = BTreeMap::new();
    for replica in replicas {
        by_index.entry(replica.applied_index).or_default().push(replica);
    }
    by_index.retain(|_, group| group.len() > 1);
    let mut report = Report::new(by_index.values().map(Vec::len).sum());
    if by_index.is_empty() {
        let message = format!(
            "no two of the {} replicas reported the same applied index: nothing compared",
            replicas.len()
        );
        report.push(Violation::new(Invariant::Convergence, Vec::new(), message));
    }
    for (applied_index, group) in by_index {
        let mut nodes_by_digest: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for replica in group {
            nodes_by_digest.entry(replica.digest.as_str()).or_default().push(replica.node);
        }
        if nodes_by_digest.len() > 1 {
            let groups: Vec<String> = nodes_by_digest
                .iter()
                .map(|(digest, nodes)| {
                    let nodes: Vec<String> = nodes.iter().map(|node| format!("node {node}")).collect();
                    format!("{} → {digest}", nodes.join(", "))
                })
                .collect();
            let message = format!("replicas at applied index {applied_index} diverge: {}", groups.join("; "));
            report.push(Violation::new(Invariant::Convergence, Vec::new(), message));
        }
    }
    report
}
