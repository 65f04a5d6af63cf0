//! The simulation driver: one seed, one 3-node cluster on a current-thread runtime with paused
//! time, random clients and faults for a while, then healing and the final checks.
//!
//! Phases: start the nodes (each forms the cluster from `--peers`); create the semaphores; run
//! the clients and the nemesis for `Settings::simulated`; stop both and heal; converge; read
//! every live session one last time; stop the keepalives and wait every TTL out; drain the
//! queue and read it; check that no permit was lost and that the replicas agree; re-apply the
//! committed log as the network carried it ([`crate::applied`]); shut down; check the history
//! and the committed log.

use std::sync::Arc;
use std::time::Duration;

use permit_core::{Name, Outcome};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::applied::{self, Applied};
use crate::checker;
use crate::client::{MAX_HOLD_MS_MAX, TTLS_MS};
use crate::cluster::{Cluster, RaftSettings};
use crate::gateway::Gateway;
use crate::history::{History, DRIVER};
use crate::liveness;
use crate::observer::Observer;
use crate::policies;
use crate::queue;
use crate::recorder::Recorder;
use crate::router::Router;
use crate::traffic::Traffic;

/// Semaphores the clients share.
const SEMAPHORES: [&str; 3] = ["db", "gpu", "lock"];
/// Longest the cluster gets to converge after healing.
const CONVERGE_PATIENCE: Duration = Duration::from_secs(30);

/// What one simulation runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Simulated time of client traffic and faults.
    pub simulated: Duration,
    /// Number of clients.
    pub clients: u32,
    /// Whether the nemesis injects faults.
    pub faults: bool,
    /// Self-test only: every crash loses the crashed node's last acknowledged log entries (a
    /// disk that lies about fsync), which the checks must catch.
    pub lying_disk: bool,
    /// Whether the queue's producers and consumers run ([`crate::queue`]).
    pub queues: bool,
    /// Whether the takers and holders of the policy semaphores run ([`crate::policies`]).
    pub policies: bool,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            simulated: Duration::from_secs(30),
            clients: 5,
            faults: true,
            lying_disk: false,
            queues: true,
            policies: true,
        }
    }
}

/// Counts of one simulation, for the summary line.
#[derive(Debug, Clone, Default)]
pub struct Stats {
    /// Records in the history.
    pub records: usize,
    /// Grants checked.
    pub grants: usize,
    /// Faults injected.
    pub faults: u64,
    /// Crashes among them.
    pub crashes: u64,
    /// Terms that had a leader.
    pub terms_led: usize,
    /// Largest applied index.
    pub applied_max: u64,
    /// Followers that caught up by installing a snapshot.
    pub snapshot_installs: u64,
    /// Raft messages delivered and lost.
    pub messages: (u64, u64),
    /// Injected fsync failures that stopped a node, and power cuts that tore a log tail.
    pub storage: (u64, u64),
    /// Queue items whose push was acknowledged, acks acknowledged, and items the final read
    /// found dead-lettered.
    pub queue: (usize, usize, usize),
    /// Entries of the committed log re-applied, and the policy events found in it (grants,
    /// takes and hold ends of every semaphore).
    pub replayed: (usize, usize),
}

/// The result of one simulation.
#[derive(Debug, Clone)]
pub struct Run {
    /// Its seed.
    pub seed: u64,
    /// What it ran.
    pub settings: Settings,
    /// Everything the clients did and were told.
    pub history: History,
    /// The committed log re-applied ([`crate::applied`]), when the cluster converged at the end.
    pub applied: Option<Applied>,
    /// Every violation found, by the observer, the driver and the history checker.
    pub violations: Vec<String>,
    /// The last trace lines.
    pub trace: Vec<String>,
    /// Counts.
    pub stats: Stats,
    /// Wall-clock time it took.
    pub wall: Duration,
}

/// Mixed into the seed of openraft's election generator, so that it draws other numbers than
/// the simulation's own generator.
const ELECTION_RNG_SALT: u64 = 0x9e37_79b9_7f4a_7c15;

/// Trace lines kept in a [`Run`].
const TRACE_LINES: usize = 2000;

/// Runs one simulation with `seed` on a runtime of its own, on this thread.
///
/// # Panics
/// When the runtime cannot be built.
pub fn run(seed: u64, settings: &Settings) -> Run {
    crate::panics::install_hook();
    let _ = crate::panics::take();
    let wall = std::time::Instant::now();
    // openraft's election timeouts: drawn from a generator seeded by the seed (all the nodes
    // run on this thread), so that the seed replays the same elections.
    permit_server::raft::runtime::seed_election_rng(Some(seed.rotate_left(32) ^ ELECTION_RNG_SALT));
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().start_paused(true);
    // tokio's own random choices (`select!` without `biased;`, which waiter of a `watch` wakes
    // first) follow the seed only with `--cfg tokio_unstable`; CI builds without it.
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let runtime = builder.build().expect("a current-thread runtime");
    let (recorder, observer, (stats, applied)) = runtime.block_on(async {
        let recorder = Recorder::new();
        let observer = Observer::new(recorder.clone());
        let simulated = simulate(seed, settings, recorder.clone(), observer.clone()).await;
        (recorder, observer, simulated)
    });
    drop(runtime);
    permit_server::raft::runtime::seed_election_rng(None);
    let mut violations = recorder.violations();
    violations.extend(crate::panics::take().into_iter().map(|panic| format!("panic: {panic}")));
    let history = recorder.history();
    violations.extend(checker::check(&history).into_iter().map(|violation| format!("history: {violation}")));
    if let Some(applied) = &applied {
        let seen = observer.leader_ms_seen();
        let found = checker::check_applied(applied, &seen);
        violations.extend(found.into_iter().map(|violation| format!("log: {violation}")));
    }
    if !violations.is_empty() {
        // Context for a failed run: sessions that vanished from a leader before its deadline.
        violations.extend(observer.early_expiries().into_iter().map(|early| {
            format!(
                "context: session {} vanished from leader {} {:?} before its deadline there",
                early.session, early.node, early.early_by
            )
        }));
    }
    let grants = checker::Facts::of(&history).grants.len();
    let queue = queue::counts(&history);
    Run {
        seed,
        settings: settings.clone(),
        violations,
        trace: recorder.trace_tail(TRACE_LINES),
        stats: Stats {
            records: history.records.len(),
            grants,
            queue,
            replayed: applied
                .as_ref()
                .map_or((0, 0), |applied| (applied.leader_ms.len(), applied.events.len())),
            ..stats
        },
        applied,
        history,
        wall: wall.elapsed(),
    }
}

/// Runs the simulation; returns its counts and, when the cluster converged at the end, the
/// committed log re-applied.
async fn simulate(
    seed: u64,
    settings: &Settings,
    recorder: Arc<Recorder>,
    observer: Arc<Observer>,
) -> (Stats, Option<Applied>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let router = Router::new(rng.random());
    let raft = RaftSettings {
        heartbeat_ms: 100,
        election_timeout_ms: (500, 1000),
        snapshot_logs: rng.random_range(10..=120),
        id_seed: rng.random(),
    };
    recorder.note(format!("seed {seed}: {settings:?}, {raft:?}"));
    let cluster = match Cluster::start(router.clone(), observer.clone(), recorder.clone(), raft).await {
        Ok(cluster) => cluster,
        Err(error) => {
            recorder.violation(format!("the cluster does not start: {error:#}"));
            return (Stats::default(), None);
        }
    };
    cluster.set_lying_disk(settings.lying_disk);
    let names: Vec<Name> = SEMAPHORES.iter().map(|name| Name::new(*name).expect("valid name")).collect();
    let driver = Gateway::new(cluster.clone(), recorder.clone(), DRIVER);
    let queues_made = !settings.queues || create_queue(&driver, &mut rng).await;
    if !create_semaphores(&driver, &mut rng, &names).await || !queues_made {
        cluster.shutdown().await;
        return (Stats::default(), None);
    }
    if settings.policies && !policies::create(&driver, &mut rng).await {
        cluster.shutdown().await;
        return (Stats::default(), None);
    }

    let queue_clients = if settings.queues { queue::PRODUCERS + queue::CONSUMERS } else { 0 };
    let mut traffic = Traffic::start(
        &cluster,
        &router,
        &recorder,
        &mut rng,
        (settings.clients, queue_clients, settings.policies, settings.faults),
        &names,
    );
    tokio::time::sleep(settings.simulated).await;
    recorder.note("traffic ends; healing");
    let (faults, crashes) = traffic.stop_clients_and_faults().await;
    heal_and_check(&cluster, &recorder, &observer, &mut traffic, &mut rng, (&names, settings.queues)).await;
    let applied = replay(&cluster, &router, &recorder, &observer).await;
    let stats = Stats {
        faults,
        crashes,
        terms_led: observer.terms_led(),
        applied_max: observer.applied_max(),
        snapshot_installs: observer.snapshot_installs(),
        messages: router.counts(),
        storage: cluster.storage_counts(),
        ..Stats::default()
    };
    cluster.shutdown().await;
    (stats, applied)
}

/// Once the cluster converged: re-applies the committed log as the network carried it, up to
/// the index every node applied, and checks that it ends in the state the nodes reached there.
async fn replay(
    cluster: &Arc<Cluster>,
    router: &Router,
    recorder: &Arc<Recorder>,
    observer: &Observer,
) -> Option<Applied> {
    if !liveness::converge(cluster, recorder, CONVERGE_PATIENCE).await {
        return None;
    }
    let committed = observer.applied_max();
    let applied = applied::replay(&router.committed_log(committed));
    let replayed = applied.state.applied_index();
    if applied.problems.is_empty() && replayed == committed {
        let digest = applied.state.digest();
        if observer.digest_at(committed).is_some_and(|known| known != digest) {
            recorder.violation(format!(
                "the committed log re-applied up to index {committed} ends in digest {digest:x}, the nodes \
                 had {:x}",
                observer.digest_at(committed).unwrap_or(0)
            ));
        }
    } else if applied.problems.is_empty() {
        recorder.violation(format!("the committed log re-applied ends at index {replayed}, not {committed}"));
    }
    Some(applied)
}

/// After healing: converge, read every live session one last time (durability), let every TTL
/// pass, drain the queue and read it, then check that no permit was lost and that the replicas
/// agree.
async fn heal_and_check(
    cluster: &Arc<Cluster>,
    recorder: &Arc<Recorder>,
    observer: &Observer,
    traffic: &mut Traffic,
    rng: &mut StdRng,
    (names, queues): (&[Name], bool),
) {
    if liveness::converge(cluster, recorder, CONVERGE_PATIENCE).await {
        liveness::read_sessions(&traffic.sessions(), rng).await;
    }
    traffic.stop_keepalives().await;
    let ttl_ms_max = TTLS_MS.iter().max().copied().unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(2 * ttl_ms_max + MAX_HOLD_MS_MAX + 2000)).await;
    let driver = Gateway::new(cluster.clone(), recorder.clone(), DRIVER);
    if queues && liveness::converge(cluster, recorder, CONVERGE_PATIENCE).await {
        queue::drain_and_read(&driver, rng).await;
    }
    if liveness::converge(cluster, recorder, CONVERGE_PATIENCE).await {
        liveness::check_no_permit_lost(&driver, rng, names).await;
    }
    if liveness::converge(cluster, recorder, CONVERGE_PATIENCE).await {
        liveness::check_replicas_agree(cluster, recorder, observer.applied_max());
    }
}

/// Creates the clients' queue; false (and a violation) when no leader answers.
async fn create_queue(driver: &Gateway, rng: &mut StdRng) -> bool {
    for _ in 0..10 {
        if let Some(Outcome::QueuePut { .. }) =
            driver.put_queue(rng, &queue::name(), queue::MAX_ATTEMPTS).await
        {
            return true;
        }
    }
    driver.recorder().violation(format!("queue {} could not be created: no leader answers", queue::QUEUE));
    false
}

/// Creates the semaphores with random capacities; false (and a violation) when no leader
/// answers.
async fn create_semaphores(driver: &Gateway, rng: &mut StdRng, names: &[Name]) -> bool {
    for name in names {
        let capacity = rng.random_range(1..=4);
        let mut created = false;
        for _ in 0..10 {
            if let Some(Outcome::SemaphoreCreated | Outcome::SemaphoreUpdated) =
                driver.put_semaphore(rng, name, capacity).await
            {
                created = true;
                break;
            }
        }
        if !created {
            driver.recorder().violation(format!("semaphore {name} could not be created: no leader answers"));
            return false;
        }
    }
    true
}
