//! Replay: one seed run twice gives the same history, event by event.
//!
//! The seed decides the clients, the faults (storage faults included), the nodes' session ids
//! and openraft's election timeouts (`raft::runtime`); the simulation runs on one thread in
//! paused time, and the server wakes waiters in a fixed order (`biased;` selects, the read
//! barrier's FIFO answers). tokio's runtime RNG itself is seeded only with
//! `--cfg tokio_unstable` (`rng_seed`); CI builds without it, and the seeds still replay, which
//! this test checks: a difference names the seed and the first record where the runs part.
//!
//! `PERMIT_SIM_REPLAY_SEEDS=N` runs the first N CI seeds twice each and prints how many
//! replayed exactly; `PERMIT_SIM_SECONDS=S` sets the simulated time of each run.

use std::time::Duration;

use permit_sim::history::Record;
use permit_sim::seeds::CI_SEEDS;
use permit_sim::{Run, Settings};

/// Simulated seconds of each run in CI.
const SECONDS: u64 = 20;
/// CI seeds run twice each.
const CI_REPLAYS: usize = 2;

fn settings() -> Settings {
    permit_sim::seeds::with_env(Settings { simulated: Duration::from_secs(SECONDS), ..Settings::default() })
}

/// How two runs of one seed compare.
enum Replay {
    /// Equal, record by record.
    Exact,
    /// Equal up to record `at`, where the two runs differ.
    Diverged { at: usize, first: Option<Box<Record>>, second: Option<Box<Record>> },
}

fn compare(a: &Run, b: &Run) -> Replay {
    let (left, right) = (&a.history.records, &b.history.records);
    let at = left.iter().zip(right.iter()).take_while(|(x, y)| x == y).count();
    if at == left.len() && at == right.len() {
        return Replay::Exact;
    }
    Replay::Diverged {
        at,
        first: left.get(at).cloned().map(Box::new),
        second: right.get(at).cloned().map(Box::new),
    }
}

fn describe(seed: u64, replay: &Replay) -> String {
    match replay {
        Replay::Exact => format!("seed {seed} replayed exactly"),
        Replay::Diverged { at, first, second } => format!(
            "seed {seed} replayed {at} records, then:\n  first run:  {}\n  second run: {}",
            first.as_ref().map_or("(end)".to_owned(), ToString::to_string),
            second.as_ref().map_or("(end)".to_owned(), ToString::to_string),
        ),
    }
}

#[test]
fn a_seed_replays_its_history() {
    let count: usize =
        std::env::var("PERMIT_SIM_REPLAY_SEEDS").ok().map_or(0, |n| n.trim().parse().expect("a number"));
    let seeds: Vec<u64> = CI_SEEDS.iter().copied().take(if count > 0 { count } else { CI_REPLAYS }).collect();
    let mut exact = 0;
    let mut broken = Vec::new();
    for seed in &seeds {
        let first = permit_sim::run(*seed, &settings());
        let second = permit_sim::run(*seed, &settings());
        assert!(!first.failed() && !second.failed(), "seed {seed} broke invariants:\n{}", first.report());
        let replay = compare(&first, &second);
        eprintln!("{}", describe(*seed, &replay));
        match replay {
            Replay::Exact => exact += 1,
            Replay::Diverged { .. } => broken.push(*seed),
        }
    }
    let seconds = settings().simulated.as_secs();
    eprintln!("{exact} of {} seeds replayed exactly ({seconds} simulated seconds each)", seeds.len());
    assert!(broken.is_empty(), "seeds {broken:?} did not replay (first difference above)");
}
