//! Whether this node is applying the cluster's log now: with `--auth`, a node that is not (it
//! was removed from the membership and left running, or it has been cut off from its leader or,
//! as leader, from its quorum for longer than the election bound) serves no token-checked route,
//! not even a `?stale=true` read, and ends its event streams: its state no longer receives the
//! deletion of a token, so it would go on serving that token for as long as it runs.
//!
//! [`Contact::standing`] answers at once from Raft's metrics and one sample:
//! - a pristine node (started with `--join`, not added yet) holds no replicated state; it stays
//!   in contact, so that the configured root secret can reach `POST /v1/cluster/init`;
//! - a node whose membership does not list it, or that the removal watcher found removed, is
//!   [`Standing::Removed`];
//! - a leader is in contact while a quorum acknowledged it within the bound (openraft's
//!   `millis_since_quorum_ack`, refreshed at every tick of its core; a single voter acknowledges
//!   itself);
//! - a follower or learner is in contact while it heard from the leader it knows within the
//!   bound: the last time that leader's appends or heartbeats refreshed its vote, which
//!   [`Contact::run`] samples from the Raft core every [`CHECK_EVERY`] (so a sample lags by at
//!   most that: a silence is seen at most that late);
//! - a node that knows no leader (an election, or a candidate cut off from the others) is not.
//!
//! [`Contact::run`] also publishes each change of the standing, so that event streams and
//! blocking reads held open on this node end when it falls out of contact.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::raft::{NodeId, Raft};

/// How often the contact watcher samples the Raft core and publishes the standing.
pub(crate) const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Whether this node applies the cluster's log now (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Standing {
    /// It applies the log: a leader with its quorum, a follower or learner hearing from its
    /// leader, a single node, or a pristine node.
    InContact,
    /// It is not a member (removed, and left running).
    Removed,
    /// It has had no leader, or no quorum, for longer than the bound.
    OutOfContact,
}

/// One node's view of its own contact with the cluster (see the module docs).
pub(crate) struct Contact {
    raft: Raft,
    id: NodeId,
    /// Longest silence of the leader (or, on a leader, of its quorum) that still counts as
    /// contact: the longest election timeout, after which the followers elect another leader.
    bound: Duration,
    /// True while the removal watcher finds this node removed.
    removed: watch::Receiver<bool>,
    /// When this node last heard from the leader it knows, as last sampled.
    heard: Mutex<Option<Instant>>,
    /// Each change of the standing, as [`Contact::run`] sees it.
    changes: watch::Sender<Standing>,
}

impl Contact {
    /// The contact of node `id`, silent for at most `bound`; `removed` is the removal
    /// watcher's verdict. Nothing is sampled until [`Contact::run`] runs: a follower counts as
    /// out of contact until then.
    pub(crate) fn new(raft: Raft, id: NodeId, bound: Duration, removed: watch::Receiver<bool>) -> Contact {
        let (changes, _) = watch::channel(Standing::OutOfContact);
        Contact { raft, id, bound, removed, heard: Mutex::new(None), changes }
    }

    /// This node's standing now.
    pub(crate) fn standing(&self) -> Standing {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        if metrics.running_state.is_err() {
            return Standing::OutOfContact;
        }
        let membership = metrics.membership_config.membership();
        if membership.nodes().next().is_none() {
            return Standing::InContact;
        }
        if *self.removed.borrow() || membership.get_node(&self.id).is_none() {
            return Standing::Removed;
        }
        let in_contact = match metrics.current_leader {
            None => false,
            Some(leader) if leader == self.id => {
                metrics.millis_since_quorum_ack.is_some_and(|ms| Duration::from_millis(ms) <= self.bound)
            }
            Some(_) => self.heard.lock().expect("contact lock").is_some_and(|at| at.elapsed() <= self.bound),
        };
        if in_contact {
            Standing::InContact
        } else {
            Standing::OutOfContact
        }
    }

    /// A receiver of the standing's changes (it sees the current standing at once).
    pub(crate) fn changes(&self) -> watch::Receiver<Standing> {
        self.changes.subscribe()
    }

    /// Samples when this node last heard from its leader and publishes the standing, every
    /// [`CHECK_EVERY`], until the Raft core stops.
    pub(crate) async fn run(self: std::sync::Arc<Contact>) {
        loop {
            let Ok(heard) = self.raft.with_raft_state(|state| state.vote_last_modified()).await else {
                return;
            };
            *self.heard.lock().expect("contact lock") = heard;
            let standing = self.standing();
            self.changes.send_if_modified(|current| std::mem::replace(current, standing) != standing);
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }
}
