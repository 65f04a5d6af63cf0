//! `permit-faults`: runs fault scenarios against real `permit serve` processes, for longer soaks
//! than CI runs. Failed runs keep their history, node logs and report under `--out`.
//!
//! ```sh
//! cargo build --release -p permit -p permit-faults
//! target/release/permit-faults --scenarios F1,F3,F5 --seeds 10 --time-per 25s
//! ```
//! `PF` (not in the default set) runs the semaphore policy scenario ([`permit_faults::policy`]),
//! with its wall-clock jumps when libfaketime is installed.
//! Self-test bugs need a test build of the server (`permit-server/bug-injection`); the CI tests in
//! `crates/permit/tests/faults` run those.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use permit_faults::scenario::{run, Scenario, STANDARD};

/// Fault scenarios against real Permit processes.
#[derive(Parser)]
#[command(name = "permit-faults")]
struct Args {
    /// Scenarios to run (default: all standard ones).
    #[arg(long, value_delimiter = ',')]
    scenarios: Vec<String>,
    /// Seeds per scenario (1, 2, ...).
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// How long each fault lasts; warm-up and run-on are 2/3 of it each.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    time_per: Duration,
    /// The `permit` binary (default: next to this one).
    #[arg(long)]
    permit_bin: Option<PathBuf>,
    /// Where failed runs keep their artefacts.
    #[arg(long, default_value = "target/faults")]
    out: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = args
        .permit_bin
        .clone()
        .unwrap_or_else(|| std::env::current_exe().expect("current exe").with_file_name("permit"));
    let names: Vec<String> = if args.scenarios.is_empty() {
        STANDARD.iter().map(|s| s.to_string()).collect()
    } else {
        args.scenarios.clone()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut failed = 0;
    println!("| scenario | seed | ops checked | checks | fault evidence |\n|---|---|---|---|---|");
    for name in &names {
        if name == "PF" {
            let clock_jump = permit_faults::cluster::faketime_library().is_some();
            for seed in 1..=args.seeds {
                let outcome =
                    runtime.block_on(permit_faults::policy::run(&bin, &args.out, seed, clock_jump))?;
                let verdict = match outcome.report.is_ok() {
                    true => "all pass".to_owned(),
                    false => format!("FAILED: {}", outcome.report),
                };
                let (taken, refused, lost) = outcome.takes;
                println!(
                    "| PF | {seed} | {taken} takes 200, {refused} 429, {lost} failed; {} lock-delayed grants | {verdict} \
                     | {} |",
                    outcome.delayed_grants,
                    outcome.notes.join("; ")
                );
                failed += usize::from(!outcome.report.is_ok());
            }
            continue;
        }
        let (mut scenario, must_fail): (Scenario, bool) =
            Scenario::standard(name).ok_or_else(|| anyhow::anyhow!("unknown scenario {name}"))?;
        scenario.fault_for = scenario.fault_for.max(args.time_per);
        scenario.settle = args.time_per * 2 / 3;
        for seed in 1..=args.seeds {
            let outcome = runtime.block_on(run(&scenario, &bin, &args.out, seed))?;
            let passed = outcome.report.is_ok() != must_fail;
            let verdict = match (outcome.report.is_ok(), must_fail) {
                (true, false) => "all pass".to_owned(),
                (false, true) => {
                    format!("violation reported, as expected ({} found)", outcome.report.violations.len())
                }
                (true, true) => "MISSED the expected violation".to_owned(),
                (false, false) => format!(
                    "FAILED: {} violations, see {}",
                    outcome.report.violations.len(),
                    outcome.dir.display()
                ),
            };
            println!("| {name} | {seed} | {} | {verdict} | {} |", outcome.ops, outcome.notes.join("; "));
            failed += usize::from(!passed);
        }
    }
    anyhow::ensure!(failed == 0, "{failed} run(s) failed");
    Ok(())
}
