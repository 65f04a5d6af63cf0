//! I6, no permit lost forever: after the faults heal and TTLs pass, the capacity comes back.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::report::{seconds, Invariant, Report, Violation};

/// What a fresh client got when, after the run, it tried to acquire a semaphore's whole
/// capacity.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreshAcquire {
    /// The semaphore.
    pub semaphore: String,
    /// The permits the fresh client obtained (0 if it gave up).
    pub permits_acquired: u64,
    /// How long it took, or how long it tried before giving up.
    pub elapsed_ns: u64,
}

/// Checks that for every semaphore in `capacities` a fresh client acquired the whole capacity
/// within `within_ns`. A semaphore without a result is a violation. `checked` counts the
/// semaphores.
///
/// # Examples
///
/// ```
/// use std::collections::BTreeMap;
/// use permit_check::{check_no_permit_lost, FreshAcquire};
///
/// let capacities = BTreeMap::from([("db".to_owned(), 3), ("jobs".to_owned(), 1)]);
/// let results = [
///     FreshAcquire { semaphore: "db".into(), permits_acquired: 3, elapsed_ns: 20_000_000 },
///     FreshAcquire { semaphore: "jobs".into(), permits_acquired: 0, elapsed_ns: 10_000_000_000 },
/// ];
/// let report = check_no_permit_lost(&capacities, &results, 10_000_000_000);
/// assert_eq!(report.violations.len(), 1);
/// assert!(report.violations[0].message.contains("`jobs`"));
/// ```
pub fn check_no_permit_lost(
    capacities: &BTreeMap<String, u64>,
    results: &[FreshAcquire],
    within_ns: u64,
) -> Report {
    let mut report = Report::new(capacities.len());
    for (semaphore, &capacity) in capacities {
        let result = results.iter().find(|result| &result.semaphore == semaphore);
        let message = match result {
            None => format!("no fresh acquire was tried on `{semaphore}`"),
            Some(result) if result.permits_acquired < capacity => format!(
                "a fresh client got only {} of the {capacity} permits of `{semaphore}` in {}",
                result.permits_acquired,
                seconds(result.elapsed_ns)
            ),
            Some(result) if result.elapsed_ns > within_ns => format!(
                "a fresh client needed {} to acquire the {capacity} permits of `{semaphore}`, more than {}",
                seconds(result.elapsed_ns),
                seconds(within_ns)
            ),
            Some(_) => continue,
        };
        report.push(Violation::new(Invariant::NoPermitLost, Vec::new(), message));
    }
    report
}
