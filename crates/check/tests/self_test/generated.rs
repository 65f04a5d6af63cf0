//! Correct histories from the serial reference model must pass every history checker.

use permit_check::{
    check_capacity, check_durability, check_linearizability, check_tokens, check_well_formed, ClockAllowance,
    SearchBudget,
};
use proptest::prelude::*;

use crate::serial::{generate, Generated, Workload};

fn check_all(generated: &Generated) -> Result<(), TestCaseError> {
    let Generated { history, capacities, final_read } = generated;
    let allowance = ClockAllowance::default();
    let reports = [
        ("well-formed", check_well_formed(history)),
        ("capacity", check_capacity(history, capacities, allowance)),
        ("tokens", check_tokens(history)),
        ("linearizability", check_linearizability(history, capacities, SearchBudget::default())),
        ("durability", check_durability(history, final_read, allowance)),
    ];
    for (name, report) in reports {
        prop_assert!(report.is_ok(), "{name}: {report}\nhistory:\n{}", history.to_json_lines());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn histories_of_a_correct_serial_execution_always_pass(
        seed in any::<u64>(),
        clients in 1u32..=5,
        ops_per_client in 1usize..=30,
        capacities in prop::collection::vec(1u64..=3, 1..=2),
        unknown_per_mille in prop::sample::select(vec![0u64, 30, 150]),
    ) {
        let workload = Workload { clients, ops_per_client, capacities, unknown_per_mille };
        check_all(&generate(seed, &workload))?;
    }
}

#[test]
fn a_large_generated_history_with_lost_answers_passes() {
    for seed in 0..4 {
        let workload =
            Workload { clients: 5, ops_per_client: 200, capacities: vec![1, 3], unknown_per_mille: 5 };
        let generated = generate(seed, &workload);
        assert!(generated.history.len() > 50, "seed {seed}");
        if let Err(error) = check_all(&generated) {
            panic!("seed {seed}: {error}");
        }
    }
}
