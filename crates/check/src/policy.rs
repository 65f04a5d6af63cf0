//! The semaphore policy promises seen from the clients, in real time (the harness's clock):
//!
//! - **P1 rate** ([`check_takes_within_rate`]): counted from the moment the rated semaphore's
//!   `PUT` was sent, the takes answered `200` by any instant t are at most
//!   `burst + permits × (t − start) / per_ms + slack`. The server promises the bound on leader
//!   time; it holds in real time because leader time never runs ahead of the leader's monotonic
//!   clock (a new leader continues from the largest applied time, and an election's time does
//!   not count), so as long as no node's monotonic clock runs fast (wall-clock jumps do not
//!   matter) the leader time between the `PUT` and a grant is at most the real time between
//!   them. The `slack` (the caller's, documented where it runs) absorbs rounding.
//! - **P2 lock-delay** ([`check_lock_delay`]): on a capacity-1 semaphore, a grant with a larger
//!   token than a hold ended by an acknowledged revoke is answered no earlier than the revoke's
//!   send time plus `lock_delay_ms` (with one permit, that grant came after the revoke ended
//!   the hold).

use crate::report::{Invariant, Report, Violation};

/// A rate as the semaphore's `PUT` set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Permits per period.
    pub permits: u64,
    /// The period in ms.
    pub per_ms: u64,
    /// Most permits at once.
    pub burst: u64,
}

/// Checks P1 over the answer times (ns) of takes answered `200` of one permit each, for a
/// semaphore whose rate was set by a `PUT` sent at `start_ns` (before every take was sent).
pub fn check_takes_within_rate(answered_ns: &[u64], start_ns: u64, rate: RateLimit, slack: u64) -> Report {
    let mut times = answered_ns.to_vec();
    times.sort_unstable();
    let mut report = Report::new(times.len());
    for (count, at) in times.iter().enumerate() {
        let taken = count as u128 + 1;
        let elapsed_ns = u128::from(at.saturating_sub(start_ns));
        // taken ≤ burst + slack + permits × elapsed / per_ms, in integers.
        let allowed_scaled = u128::from(rate.burst + slack) * u128::from(rate.per_ms) * 1_000_000
            + u128::from(rate.permits) * elapsed_ns;
        if taken * u128::from(rate.per_ms) * 1_000_000 > allowed_scaled {
            let allowed = allowed_scaled as f64 / (rate.per_ms as f64 * 1e6);
            report.push(Violation::new(
                Invariant::Rate,
                Vec::new(),
                format!(
                    "{taken} takes answered within {:.3} s of the rate being set, more than the burst of {} \
                     plus {}/{} ms plus a slack of {slack} ({allowed:.2})",
                    elapsed_ns as f64 / 1e9,
                    rate.burst,
                    rate.permits,
                    rate.per_ms,
                ),
            ));
            return report;
        }
    }
    report
}

/// An acknowledged revoke of a capacity-1 semaphore's hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Revoked {
    /// The semaphore.
    pub semaphore: String,
    /// When the revoke was sent (ns).
    pub sent_ns: u64,
    /// The token of the hold it ended.
    pub token: u64,
}

/// A grant of such a semaphore, as its acquire's answer showed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The semaphore.
    pub semaphore: String,
    /// When the answer arrived (ns).
    pub answered_ns: u64,
    /// Its token.
    pub token: u64,
}

/// Checks P2: every grant with a larger token than a revoked hold of the same semaphore is
/// answered at least `lock_delay_ms` after that revoke was sent.
pub fn check_lock_delay(revokes: &[Revoked], grants: &[Granted], lock_delay_ms: u64) -> Report {
    let mut report = Report::new(grants.len());
    for revoke in revokes {
        let earliest = revoke.sent_ns + lock_delay_ms * 1_000_000;
        let early = |grant: &&Granted| {
            grant.semaphore == revoke.semaphore && grant.token > revoke.token && grant.answered_ns < earliest
        };
        for grant in grants.iter().filter(early) {
            report.push(Violation::new(
                Invariant::LockDelay,
                Vec::new(),
                format!(
                    "{}: token {} answered {:.3} s after the revoke of token {} was sent, inside the lock-delay \
                     of {lock_delay_ms} ms",
                    grant.semaphore,
                    grant.token,
                    grant.answered_ns.saturating_sub(revoke.sent_ns) as f64 / 1e9,
                    revoke.token
                ),
            ));
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const RATE: RateLimit = RateLimit { permits: 20, per_ms: 1000, burst: 5 };
    const MS: u64 = 1_000_000;

    #[test]
    fn takes_at_the_rate_pass_and_one_more_is_reported() {
        // The burst at once, then one every 50 ms: exactly the bound.
        let mut times: Vec<u64> = vec![10 * MS; 5];
        times.extend((1..=40).map(|i| 10 * MS + i * 50 * MS));
        assert!(check_takes_within_rate(&times, 10 * MS, RATE, 0).is_ok());
        let mut early = times.clone();
        early.push(10 * MS + 1000 * MS);
        let report = check_takes_within_rate(&early, 10 * MS, RATE, 0);
        assert_eq!(report.violations.len(), 1, "{report}");
        assert_eq!(report.violations[0].invariant, Invariant::Rate);
        // The slack lets exactly that many more through.
        assert!(check_takes_within_rate(&early, 10 * MS, RATE, 1).is_ok());
    }

    #[test]
    fn a_grant_inside_the_lock_delay_after_a_revoke_is_reported() {
        let (a, b) = ("a".to_owned(), "b".to_owned());
        let revokes = [Revoked { semaphore: a.clone(), sent_ns: 100 * MS, token: 7 }];
        let on_time = [
            Granted { semaphore: a.clone(), answered_ns: 1100 * MS, token: 8 },
            Granted { semaphore: a.clone(), answered_ns: 150 * MS, token: 6 },
            Granted { semaphore: b, answered_ns: 150 * MS, token: 9 },
        ];
        assert!(check_lock_delay(&revokes, &on_time, 1000).is_ok());
        let early = [Granted { semaphore: a, answered_ns: 1100 * MS - 1, token: 8 }];
        let report = check_lock_delay(&revokes, &early, 1000);
        assert_eq!(report.violations.len(), 1, "{report}");
        assert_eq!(report.violations[0].invariant, Invariant::LockDelay);
    }
}
