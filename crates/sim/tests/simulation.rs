//! The simulated cluster under random faults: CI's fixed seeds plus one random seed per run, or
//! a replay or a soak through `PERMIT_SIM_SEED` / `PERMIT_SIM_SEEDS` (see `permit_sim::seeds`).

use std::time::Duration;

use permit_sim::seeds::{self, CI_SEEDS};
use permit_sim::{Run, Settings};

/// Simulated seconds of traffic per CI seed.
const CI_SECONDS: u64 = 60;
/// Threads running seeds side by side (CI has 2 cores).
const THREADS: usize = 2;

/// Node logs on stderr when `PERMIT_SIM_LOG` holds a filter (`info`, `openraft=debug`, ...).
fn init_logs() {
    if let Ok(filter) = std::env::var("PERMIT_SIM_LOG") {
        let _ =
            tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::new(filter)).try_init();
    }
}

fn settings() -> Settings {
    seeds::with_env(Settings { simulated: Duration::from_secs(CI_SECONDS), ..Settings::default() })
}

fn assert_all_pass(runs: &[Run]) {
    if std::env::var_os("PERMIT_SIM_REPORT").is_some() {
        for run in runs.iter().filter(|run| !run.failed()) {
            eprintln!("{}", run.report());
        }
    }
    let failed: Vec<&Run> = runs.iter().filter(|run| run.failed()).collect();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("permit-sim");
    for run in &failed {
        eprintln!("{}", run.report());
        match run.save(&dir) {
            Ok(path) => eprintln!("seed {}: history and trace kept in {}", run.seed, path.display()),
            Err(error) => eprintln!("seed {}: cannot keep the history: {error}", run.seed),
        }
    }
    let seeds: Vec<u64> = failed.iter().map(|run| run.seed).collect();
    assert!(seeds.is_empty(), "seeds {seeds:?} broke invariants (reports above)");
}

/// CI's fixed seeds plus one random seed, or what `PERMIT_SIM_SEED` / `PERMIT_SIM_SEEDS` ask for.
fn chosen_seeds() -> Vec<u64> {
    match (seeds::replay_seed(), seeds::soak_seeds()) {
        (Some(seed), _) => vec![seed],
        (None, Some(count)) => (0..count).map(|_| rand::random()).collect(),
        (None, None) => CI_SEEDS.iter().copied().chain([rand::random()]).collect(),
    }
}

/// The faults really happened, summed over many seeds: crashes, lost messages, leader changes
/// and followers catching up by snapshot.
fn assert_faults_happened(runs: &[Run]) {
    let sum = |count: fn(&Run) -> u64| runs.iter().map(count).sum::<u64>();
    let crashes = sum(|run| run.stats.crashes);
    let lost = sum(|run| run.stats.messages.1);
    let leaders = sum(|run| run.stats.terms_led as u64);
    let installs = sum(|run| run.stats.snapshot_installs);
    let fsync_failures = sum(|run| run.stats.storage.0);
    let torn_tails = sum(|run| run.stats.storage.1);
    eprintln!(
        "over {} seeds: {crashes} crashes, {lost} messages lost, {leaders} terms led, {installs} snapshot \
         installs, {fsync_failures} fsync failures, {torn_tails} torn tails",
        runs.len()
    );
    assert!(crashes > 0 && lost > 0 && installs > 0, "the nemesis did not exercise every fault");
    assert!(fsync_failures > 0 && torn_tails > 0, "the nemesis did not exercise the storage faults");
    assert!(leaders > 2 * runs.len() as u64, "leaders hardly changed");
}

#[test]
fn sim_seeds_keep_every_invariant_under_faults() {
    init_logs();
    let seeds = chosen_seeds();
    eprintln!("permit-sim seeds: {seeds:?} (replay one with PERMIT_SIM_SEED=N)");
    let runs = seeds::run_all(&seeds, &settings(), THREADS);
    assert_all_pass(&runs);
    if runs.len() >= CI_SEEDS.len() {
        assert_faults_happened(&runs);
    }
}

/// The storage checks can fail: with a disk that lies about fsync (every crash loses the
/// crashed node's last acknowledged entries), the same nemesis and checkers find violations.
/// Without the queue and policy traffic: its seeds and threshold were chosen for the semaphore
/// traffic.
#[test]
fn sim_catches_a_disk_that_loses_acknowledged_entries() {
    const SEEDS: [u64; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
    let settings = Settings {
        simulated: Duration::from_secs(30),
        lying_disk: true,
        queues: false,
        policies: false,
        ..Settings::default()
    };
    let runs = seeds::run_all(&SEEDS, &settings, THREADS);
    let caught: Vec<u64> = runs.iter().filter(|run| run.failed()).map(|run| run.seed).collect();
    let mut in_history = 0;
    for run in runs.iter().filter(|run| run.failed()) {
        let history = run.violations.iter().filter(|v| v.starts_with("history:")).count();
        in_history += history;
        eprintln!(
            "seed {}: {} violations ({history} in the history), the first: {}",
            run.seed,
            run.violations.len(),
            run.violations.first().map_or("", String::as_str)
        );
    }
    eprintln!("a lying disk was caught in seeds {caught:?} of {SEEDS:?}");
    // Seeds replay exactly, so these counts are the same on every run.
    assert!(
        caught.len() * 4 >= SEEDS.len() * 3,
        "a lying disk went unnoticed in more than a quarter of the seeds: caught in {caught:?}"
    );
    assert!(in_history > 0, "the history checks never noticed acknowledged work lost");
}
