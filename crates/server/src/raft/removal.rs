//! Removal from the membership: a node that was removed from the cluster says so (health 503
//! `removed`), logs it once, and stops campaigning, until it is added back.
//!
//! A removed node often never learns of its removal from its own log: the leader stops
//! replicating to it as soon as it appends the membership without it, so the node's last
//! membership may still list it. So the node decides from two sources:
//! - its own membership, when that no longer lists it (or never did, once initialised);
//! - when it has known no leader for [`LEADERLESS_PATIENCE_TIMEOUTS`] election timeouts, the
//!   health of the other members: a ready member (one that knows a leader) whose membership
//!   does not list this node proves the removal; one that lists it proves the opposite.
//!
//! Campaigning is switched with openraft's runtime config (`elect(false)` / `elect(true)`): a
//! removed node's term then stays put, and it cannot disturb the cluster with votes.

use std::time::Duration;

use permit_wire::Health;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::peer_conn::PeerPool;
use crate::raft::{NodeId, Raft};

/// How often the removal watcher looks at the membership.
pub(crate) const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long a member stays leaderless (in maximal election timeouts) before it asks the others.
const LEADERLESS_PATIENCE_TIMEOUTS: u32 = 2;
/// Longest wait for another member's health answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// What the removal watcher needs.
pub(crate) struct RemovalWatch {
    /// The node's Raft handle.
    pub(crate) raft: Raft,
    /// This node's id.
    pub(crate) id: NodeId,
    /// Connections for probing the other members' health, from the node's peer client (so
    /// over HTTPS on a TLS cluster).
    pub(crate) prober: PeerPool,
    /// The longest election timeout.
    pub(crate) election_timeout_max: Duration,
    /// Set to true while this node is removed.
    pub(crate) removed: watch::Sender<bool>,
    /// Whether to ask the other members' HTTP health (off in simulations).
    pub(crate) probe_peers: bool,
}

/// What this node can tell from its own membership.
enum LocalView {
    /// Not initialised (started with `--join` and not added yet): not removed.
    Pristine,
    /// Its membership does not list it.
    Absent,
    /// Its membership lists it, and it knows a leader.
    LedMember,
    /// Its membership lists it, but it knows no leader: ask the other members.
    LeaderlessMember(Vec<String>),
}

impl RemovalWatch {
    /// Runs the watcher until the Raft core stops.
    pub(crate) async fn run(self) {
        let mut leaderless_since: Option<Instant> = None;
        let patience = self.election_timeout_max * LEADERLESS_PATIENCE_TIMEOUTS;
        loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let Some(view) = self.local_view() else { return };
            let verdict = match view {
                LocalView::Pristine | LocalView::LedMember => Some((false, "its own membership")),
                LocalView::Absent => Some((true, "its own membership")),
                LocalView::LeaderlessMember(peers) => {
                    let since = *leaderless_since.get_or_insert_with(Instant::now);
                    if self.probe_peers && since.elapsed() >= patience {
                        self.ask(&peers).await.map(|removed| (removed, "the other members' health"))
                    } else {
                        None
                    }
                }
            };
            if !matches!(self.local_view(), Some(LocalView::LeaderlessMember(_))) {
                leaderless_since = None;
            }
            if let Some((removed, source)) = verdict {
                self.apply(removed, source);
            }
        }
    }

    /// This node's membership view, or `None` once the core stopped.
    fn local_view(&self) -> Option<LocalView> {
        let metrics = self.raft.metrics().borrow().clone();
        if metrics.running_state.is_err() {
            return None;
        }
        let membership = metrics.membership_config.membership();
        if membership.nodes().next().is_none() {
            return Some(LocalView::Pristine);
        }
        if membership.get_node(&self.id).is_none() {
            return Some(LocalView::Absent);
        }
        if metrics.current_leader.is_some() {
            return Some(LocalView::LedMember);
        }
        let peers = membership.nodes().filter(|(id, _)| **id != self.id).map(|(_, n)| n.addr.clone());
        Some(LocalView::LeaderlessMember(peers.collect()))
    }

    /// Asks the other members: `Some(true)` when a ready one does not list this node,
    /// `Some(false)` when one lists it, `None` when no ready member answered.
    async fn ask(&self, peers: &[String]) -> Option<bool> {
        let probes = peers.iter().map(|addr| async move {
            let (status, health) = self.prober.health(addr, PROBE_TIMEOUT).await?;
            status.is_success().then_some(health)
        });
        let answers = futures::future::join_all(probes).await;
        let ready: Vec<Health> = answers.into_iter().flatten().filter(|h| h.reason.is_none()).collect();
        if ready.iter().any(|h| h.members.contains(&self.id)) {
            Some(false)
        } else if ready.iter().any(|h| !h.members.is_empty()) {
            Some(true)
        } else {
            None
        }
    }

    /// Records the verdict; on a change, logs it once and switches campaigning.
    fn apply(&self, removed: bool, source: &str) {
        let changed = self.removed.send_if_modified(|current| std::mem::replace(current, removed) != removed);
        if !changed {
            return;
        }
        self.raft.runtime_config().elect(!removed);
        if removed {
            tracing::warn!(
                node = self.id,
                source,
                "this node was removed from the cluster's membership: it stops campaigning and \
                 answers health 503 `removed` until it is added back (or stop it)"
            );
        } else {
            tracing::info!(node = self.id, source, "this node is a member again: it campaigns again");
        }
    }
}
