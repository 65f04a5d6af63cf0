//! Which seeds to run: a fixed list for CI, one random seed per run, and environment variables
//! to replay one seed or run many.
//!
//! - `PERMIT_SIM_SEED=N`: run seed N (replay a failure).
//! - `PERMIT_SIM_SEEDS=N`: run N random seeds (a soak), each printed.
//! - `PERMIT_SIM_SECONDS=S`: simulated seconds of traffic per seed.
//! - `PERMIT_SIM_REPORT=1`: print the report (last events) of passing seeds too.
//! - `PERMIT_SIM_TRACE=N`: print the last N events of a report.
//! - `PERMIT_SIM_LOG=FILTER`: the nodes' tracing logs on stderr (e.g. `info,openraft=debug`).
//! - `PERMIT_SIM_DIR=DIR`: where the nodes' data dirs go (default `/dev/shm`, else the temp dir).

use std::time::Duration;

use crate::simulation::{run, Run, Settings};

/// The seeds CI runs on every build.
pub const CI_SEEDS: [u64; 20] =
    [1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987, 1597, 2584, 4181, 6765, 10946];

/// The seed in `PERMIT_SIM_SEED`, if set.
///
/// # Panics
/// When it is set but not a number.
pub fn replay_seed() -> Option<u64> {
    let text = std::env::var("PERMIT_SIM_SEED").ok()?;
    Some(text.trim().parse().expect("PERMIT_SIM_SEED is a u64"))
}

/// How many random seeds `PERMIT_SIM_SEEDS` asks for, if set.
///
/// # Panics
/// When it is set but not a number.
pub fn soak_seeds() -> Option<u64> {
    let text = std::env::var("PERMIT_SIM_SEEDS").ok()?;
    Some(text.trim().parse().expect("PERMIT_SIM_SEEDS is a number"))
}

/// `settings` with the simulated time from `PERMIT_SIM_SECONDS`, if set.
///
/// # Panics
/// When it is set but not a number.
pub fn with_env(settings: Settings) -> Settings {
    match std::env::var("PERMIT_SIM_SECONDS") {
        Ok(text) => Settings {
            simulated: Duration::from_secs(text.trim().parse().expect("PERMIT_SIM_SECONDS is a number")),
            ..settings
        },
        Err(_) => settings,
    }
}

/// Runs `seeds` on `threads` threads (each seed on a runtime of its own), printing a summary
/// line per seed as it ends; returns the runs in the order of `seeds`.
pub fn run_all(seeds: &[u64], settings: &Settings, threads: usize) -> Vec<Run> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let runs = std::sync::Mutex::new(Vec::with_capacity(seeds.len()));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(seed) = seeds.get(i) else { return };
                let result = run(*seed, settings);
                eprintln!("{}", result.summary());
                runs.lock().expect("runs lock").push((i, result));
            });
        }
    });
    let mut runs = runs.into_inner().expect("runs lock");
    runs.sort_by_key(|(i, _)| *i);
    runs.into_iter().map(|(_, run)| run).collect()
}
