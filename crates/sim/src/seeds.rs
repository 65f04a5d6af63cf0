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

/// The seeds CI runs on every build: Fibonacci numbers, and one whose power cut tears a log
/// tail (the histories change with the timings; `tests/simulation.rs` requires a torn tail of
/// the set).
pub const CI_SEEDS: [u64; 21] = [
    1,
    2,
    3,
    5,
    8,
    13,
    21,
    34,
    55,
    89,
    144,
    233,
    377,
    610,
    987,
    1597,
    2584,
    4181,
    6765,
    10946,
    14_090_432_268_714_412_960,
];

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

/// Wall time one seed may take before [`run_all`] declares it stuck. A seed normally takes a
/// second or two (the clock is simulated); one that runs far longer is spinning without ever
/// letting simulated time advance, a livelock that would otherwise hang the test suite.
pub const SEED_WALL_TIME_MAX: Duration = Duration::from_secs(180);

/// Runs `seeds` on `threads` threads (each seed on a runtime of its own), printing a summary
/// line per seed as it ends; returns the runs in the order of `seeds`.
///
/// A seed still running after [`SEED_WALL_TIME_MAX`] ends the process with exit code 101 and
/// a message naming the seed (a spinning thread cannot be stopped, and the test must not hang).
pub fn run_all(seeds: &[u64], settings: &Settings, threads: usize) -> Vec<Run> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let runs = std::sync::Mutex::new(Vec::with_capacity(seeds.len()));
    // The seed each thread is running, and since when.
    let running = std::sync::Mutex::new(vec![None::<(u64, std::time::Instant)>; threads.max(1)]);
    std::thread::scope(|scope| {
        for slot in 0..threads.max(1) {
            let (next, runs, running) = (&next, &runs, &running);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(seed) = seeds.get(i) else { return };
                running.lock().expect("running lock")[slot] = Some((*seed, std::time::Instant::now()));
                let result = run(*seed, settings);
                running.lock().expect("running lock")[slot] = None;
                eprintln!("{}", result.summary());
                runs.lock().expect("runs lock").push((i, result));
            });
        }
        // Watchdog: bounded by the seeds' count times the limit.
        while runs.lock().expect("runs lock").len() < seeds.len() {
            std::thread::sleep(Duration::from_millis(100));
            let stuck = running
                .lock()
                .expect("running lock")
                .iter()
                .flatten()
                .find(|(_, since)| since.elapsed() > SEED_WALL_TIME_MAX)
                .copied();
            if let Some((seed, _)) = stuck {
                use std::io::Write;
                // Straight to stderr: the test harness's capture would be lost with the exit.
                let _ = writeln!(
                    std::io::stderr(),
                    "permit-sim: seed {seed} still running after {SEED_WALL_TIME_MAX:?} of wall time: a \
                     livelock? Replay it with PERMIT_SIM_SEED={seed}"
                );
                std::process::exit(101);
            }
        }
    });
    let mut runs = runs.into_inner().expect("runs lock");
    runs.sort_by_key(|(i, _)| *i);
    runs.into_iter().map(|(_, run)| run).collect()
}
