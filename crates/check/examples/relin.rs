//! Re-runs the linearizability check on a saved history, for instance one that a fault run
//! kept under `target/faults/` (set `PERMIT_FAULTS_KEEP=1` to keep passing runs too):
//!
//! ```text
//! cargo run --release -p permit-check --example relin -- target/faults/<run>/history.jsonl lin=2
//! ```
//!
//! The arguments after the path name the semaphores to check and their capacities; the budget
//! is 500 million steps or 300 s (`PERMIT_CHECK_STEPS` sets the steps).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use permit_check::{check_linearizability, History, Outcome, SearchBudget};

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().expect("history path");
    let capacities: BTreeMap<String, u64> = args
        .map(|arg| {
            let (name, capacity) = arg.split_once('=').expect("name=capacity");
            (name.to_owned(), capacity.parse().expect("capacity"))
        })
        .collect();
    let history = History::load(&path).expect("history loads");
    let only: History = history
        .ops()
        .iter()
        .filter(|op| capacities.contains_key(&op.semaphore) || op.semaphore.is_empty())
        .cloned()
        .collect();
    let unknown =
        only.ops().iter().filter(|op| op.outcome == Outcome::Unknown && !op.semaphore.is_empty()).count();
    println!("{} ops on {:?}, {unknown} unknown", only.len(), capacities.keys().collect::<Vec<_>>());
    let started = Instant::now();
    let steps_max =
        std::env::var("PERMIT_CHECK_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(500_000_000);
    let budget = SearchBudget { steps_max, time_max: Duration::from_secs(300) };
    let report = check_linearizability(&only, &capacities, budget);
    println!("{:.2?}: {report}", started.elapsed());
}
