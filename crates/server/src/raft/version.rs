//! Versioned clusters (docs/operations.md, *Upgrading*).
//!
//! Each build speaks a feature version ([`speaks`], [`permit_core::FEATURE_VERSION`]); a member
//! that reports none (a build from before versioning) speaks version 1. The cluster's version
//! lives in the replicated state ([`permit_core::State::cluster_version`]): the leader raises it
//! through the log ([`Command::SetClusterVersion`]) once every member, voter or learner, answers
//! its health probe with that version or newer ([`agree`]), and nothing lowers it. Three rules
//! keep every member able to decode every entry it is sent:
//!
//! 1. A command that needs a newer version than the cluster's is refused before it is proposed
//!    (`Consensus::propose`, 409 `feature_unavailable`); the state machine refuses it too.
//! 2. A member is added only if it speaks the cluster's version (`api/cluster.rs`), checked on a
//!    linearizable read under [`Versions::changes`], which a raise holds too: no member can
//!    slip in between a raise's probe and its commit.
//! 3. A replica never applies a batch that needs more than it speaks, nor loads a state whose
//!    version is above it ([`refuse_newer`]): it stops with a message that names the version
//!    to run. Such a batch can only come after the raise to its version, which this build
//!    decodes, so the stop comes before any entry it could not decode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use permit_core::Command;
use tokio::sync::watch;

use super::leadership::Leading;
use super::proposer::Proposer;
use super::replica::Replica;
use super::{NodeId, Raft};
use crate::peer_conn::PeerPool;

/// This build's name for humans: the crate version, and the commit when the build sets
/// `PERMIT_BUILD` (`0.1.0+d9fc6e4`).
pub(crate) const BUILD: &str = match option_env!("PERMIT_BUILD") {
    Some(build) => build,
    None => env!("CARGO_PKG_VERSION"),
};

/// How often a leader whose cluster is below its own version probes the members again.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// Longest wait for a member's health answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// The feature version this node speaks: [`permit_core::FEATURE_VERSION`], or 1 when a test
/// injects `speaks_version_1` (to stand for an older build).
pub(crate) fn speaks() -> u32 {
    if crate::bugs::is(crate::bugs::Bug::SpeaksVersion1) {
        1
    } else {
        permit_core::FEATURE_VERSION
    }
}

/// Why this node cannot go on with data that needs feature version `needs`, or `None` when it
/// speaks it.
pub(crate) fn refuse_newer(needs: u32) -> Option<String> {
    let speaks = speaks();
    (needs > speaks).then(|| {
        format!(
            "this node's cluster is at feature version {needs}, and this build (permit {BUILD}) \
             speaks version {speaks}: start this node with a build that speaks version {needs} or \
             newer. A cluster's version never goes down; to run an older build, restore a backup \
             taken before the upgrade (`permit serve --restore`) as a new cluster"
        )
    })
}

/// What the leader last learnt of the members' versions, and the lock that orders raises and
/// additions.
#[derive(Debug, Default)]
pub(crate) struct Versions {
    /// Each member's version as its last probe answered (`None`: no answer).
    members: Mutex<BTreeMap<NodeId, Option<u32>>>,
    /// Held by a raise from its probe to its commit, and by an addition from its check to its
    /// membership change (rule 2 of the module).
    pub(crate) changes: tokio::sync::Mutex<()>,
}

impl Versions {
    /// The members that do not speak `needs` as last probed (those that did not answer too),
    /// with their versions.
    pub(crate) fn older_than(&self, needs: u32) -> Vec<(NodeId, Option<u32>)> {
        let members = self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        members
            .iter()
            .filter(|(_, version)| version.is_none_or(|v| v < needs))
            .map(|(id, v)| (*id, *v))
            .collect()
    }

    fn record(&self, probed: BTreeMap<NodeId, Option<u32>>) {
        *self.members.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = probed;
    }
}

/// The message of a refusal for want of version `needs` (the cluster is at `cluster`),
/// naming the members that hold it back.
pub(crate) fn unavailable_message(needs: u32, cluster: u32, older: &[(NodeId, Option<u32>)]) -> String {
    let mut message =
        format!("this needs cluster feature version {needs}, and the cluster is at version {cluster}");
    if older.is_empty() {
        message.push_str(": the leader has not yet found every member speaking it; retry in a moment");
    } else {
        let named: Vec<String> = older
            .iter()
            .map(|(id, version)| match version {
                Some(version) => format!("node {id} (version {version})"),
                None => format!("node {id} (not answering)"),
            })
            .collect();
        message.push_str(&format!(
            "; older or unreachable: {}. Upgrade them (docs/operations.md, Upgrading)",
            named.join(", ")
        ));
    }
    message
}

/// The leader's side of the agreement: while this node leads and the cluster's version is below
/// what this node speaks, probe every member each [`PROBE_EVERY`] and raise the version to the
/// lowest they speak once that is higher. Members other than this node are probed over HTTP,
/// or, in a simulation (`probe_peers` false: one build runs every node), taken to speak this
/// node's version.
pub(crate) struct Agreement {
    pub(crate) id: NodeId,
    pub(crate) raft: Raft,
    pub(crate) replica: Arc<Replica>,
    pub(crate) proposer: Proposer,
    pub(crate) leading: watch::Receiver<Leading>,
    pub(crate) prober: PeerPool,
    pub(crate) probe_peers: bool,
    pub(crate) versions: Arc<Versions>,
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl Agreement {
    pub(crate) async fn run(mut self) {
        loop {
            if *self.shutdown.borrow() {
                return;
            }
            let leading = self.leading.borrow_and_update().is_some();
            // Below the newest version any build speaks, so that a leader that speaks less still
            // learns which members hold the cluster back (its refusals name them).
            if leading && self.replica.read().state.cluster_version() < permit_core::FEATURE_VERSION {
                if let Err(error) = self.raise().await {
                    tracing::debug!(%error, "cluster version not raised yet");
                }
            }
            tokio::select! {
                changed = self.leading.changed() => if changed.is_err() { return },
                _ = self.shutdown.changed() => {}
                () = tokio::time::sleep(PROBE_EVERY) => {}
            }
        }
    }

    /// Probes the members and proposes the raise if they all speak more than the cluster's
    /// version.
    async fn raise(&self) -> Result<(), crate::raft::proposer::ProposeError> {
        let _changes = self.versions.changes.lock().await;
        let members: Vec<(NodeId, String)> = {
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow();
            let members = metrics.membership_config.membership().nodes();
            members.map(|(id, node)| (*id, node.addr.clone())).collect()
        };
        let probes = members.iter().map(|(id, addr)| async move {
            let version = if *id == self.id || !self.probe_peers {
                Some(speaks())
            } else {
                let health = self.prober.health(addr, PROBE_TIMEOUT).await;
                // A member from before versioning answers without a version: 1.
                health.map(|(_, health)| health.feature_version.unwrap_or(1))
            };
            (*id, version)
        });
        let probed: BTreeMap<NodeId, Option<u32>> =
            futures::future::join_all(probes).await.into_iter().collect();
        let lowest = probed.values().copied().collect::<Option<Vec<u32>>>().and_then(|v| v.into_iter().min());
        self.versions.record(probed);
        let cluster = self.replica.read().state.cluster_version();
        match lowest {
            Some(version) if version > cluster => {
                let outcome = self.proposer.propose(Command::SetClusterVersion { version }).await?;
                tracing::info!(from = cluster, ?outcome, "cluster feature version raised");
                Ok(())
            }
            _ => Ok(()),
        }
    }
}
