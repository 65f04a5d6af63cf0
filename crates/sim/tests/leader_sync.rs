//! A leader reports its appends to openraft before their fsync, so that the fsync runs beside
//! the replication (`permit_server::raft::log::sync`). openraft then counts the leader in a quorum
//! before its copy is durable; nothing such a commit decides may become visible until it is.
//!
//! The scenario: one follower is cut off, the leader's fsyncs hang, and a write is proposed. The
//! other follower writes the entry durably and openraft commits it (the leader counted). Yet:
//! - the leader does not apply it, so the write is not acknowledged (gate 1: without it, a power
//!   cut on the leader and an election between it and the cut-off follower would lose an
//!   acknowledged write);
//! - the follower that holds it does not apply it either (gate 2: the commit index it is sent is
//!   clamped to the leader's durable log id);
//!
//! and once the disk answers again, the next write goes down the in-place path (gate 7), which
//! syncs both, and both are applied.
//!
//! With gate 1 or gate 2 taken out of the code, the scenario fails its first or its second
//! assertion (checked by hand when they were written).

use std::sync::Arc;
use std::time::Duration;

use permit_core::{Command, Name, Outcome};
use permit_server::Node;
use permit_sim::cluster::NODE_IDS;
use permit_sim::scenario::Scenario;
use tokio::time::{sleep, Instant};

async fn wait_for(what: &str, patience: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience;
    while !ready() {
        assert!(Instant::now() < deadline, "{what} within {patience:?}");
        sleep(Duration::from_millis(1)).await;
    }
}

fn last_log_index(node: &Node) -> u64 {
    node.consensus().raft().metrics().borrow().last_log_index.unwrap_or(0)
}

fn last_applied(node: &Node) -> u64 {
    node.consensus().raft().metrics().borrow().last_applied.map_or(0, |id| id.index)
}

fn put(node: &Arc<Node>, name: &str) -> tokio::task::JoinHandle<Option<Outcome>> {
    let node = node.clone();
    let name = Name::new(name).expect("valid name");
    tokio::spawn(async move { node.propose(Command::PutSemaphore { name, capacity: 1 }).await.ok() })
}

/// Runs the scenario with ids seeded by `seed`.
async fn scenario(seed: u64) {
    let Scenario { router, cluster, gateway, mut rng } = Scenario::start(seed).await;
    let leader = gateway.leader(&mut rng).await.expect("a leader");
    let sync = leader.consensus().log_sync().clone();
    wait_for("the leader overlaps its fsyncs", Duration::from_secs(5), || sync.overlap()).await;
    let mut followers = NODE_IDS.iter().copied().filter(|id| *id != leader.id);
    let (holder, cut_off) = (followers.next().expect("a follower"), followers.next().expect("two"));
    let holder = cluster.node(holder).expect("running");

    router.with_faults(|faults| faults.isolate(cut_off, &NODE_IDS));
    cluster.stall_appends(leader.id);
    let applied_before = last_applied(&leader);
    let first = put(&leader, "first");
    let index = last_applied(&leader).max(last_log_index(&leader)) + 1;
    wait_for("the follower holds the entry", Duration::from_secs(5), || last_log_index(&holder) >= index)
        .await;
    // Time for openraft to commit it (leader counted), for the commit-carrying heartbeats and
    // for an apply: none of it may show.
    sleep(Duration::from_millis(300)).await;
    assert!(
        !first.is_finished() && last_applied(&leader) < index,
        "gate 1: the leader applied (and acknowledged) entry {index} before its own copy was durable \
         (applied {} from {applied_before})",
        last_applied(&leader)
    );
    assert!(
        last_applied(&holder) < index,
        "gate 2: a follower applied entry {index}, which only it and a non-durable leader hold"
    );

    // The disk answers again. The hung sync never ends; the next append, past `SYNC_STALL`,
    // syncs in place what is pending, and both entries are applied everywhere reachable. (The
    // first write's proposer may have given up meanwhile: its client was told "outcome unknown".)
    cluster.clear_storage_faults().await;
    let second = tokio::time::timeout(Duration::from_secs(5), put(&leader, "second"))
        .await
        .expect("the second write acknowledged once the disk answers")
        .expect("no panic");
    assert_eq!(second, Some(Outcome::SemaphoreCreated));
    assert!(last_applied(&leader) > index, "the leader applied both entries");
    wait_for("the follower applies both", Duration::from_secs(5), || last_applied(&holder) > index).await;
    let _ = first.await;
    cluster.shutdown().await;
}

#[test]
fn nothing_a_leader_commits_shows_before_its_own_copy_is_durable() {
    for seed in [1, 2] {
        Scenario::runtime().block_on(scenario(seed));
    }
}
