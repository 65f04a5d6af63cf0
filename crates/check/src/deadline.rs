//! The client's conservative session deadlines, from recorded creates and keepalives.

use std::collections::HashMap;

use crate::history::{History, OpKind};

/// How much the checker lets the server's clock disagree with the harness's.
///
/// A client may rely on a session for `ttl · (1 − rate_error) − margin` after the *send* time
/// of its create or of an acknowledged keepalive: `rate_error` (ε) allows the server's clock to
/// run that much faster, `margin_ns` (δ) covers scheduling slack.
///
/// # Examples
///
/// ```
/// use permit_check::ClockAllowance;
///
/// let allowance = ClockAllowance { rate_error: 0.05, margin_ns: 50_000_000 };
/// // 2 s · 0.95 − 50 ms = 1.85 s
/// assert_eq!(allowance.trusted_ns(2000), 1_850_000_000);
/// assert_eq!(ClockAllowance::default(), allowance);
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockAllowance {
    /// ε: the fraction by which the server's clock may run faster than the harness's; clamped
    /// to `0.0..=1.0`.
    pub rate_error: f64,
    /// δ: a fixed margin, in nanoseconds.
    pub margin_ns: u64,
}

impl ClockAllowance {
    /// How long after a refresh's send time a client may rely on a session of `ttl_ms`.
    pub fn trusted_ns(&self, ttl_ms: u64) -> u64 {
        let ttl_ns = ttl_ms.saturating_mul(1_000_000) as f64;
        let scaled_ns = ttl_ns * (1.0 - self.rate_error.clamp(0.0, 1.0));
        // The float-to-int cast saturates, and the product is below u64::MAX anyway.
        (scaled_ns as u64).saturating_sub(self.margin_ns)
    }
}

impl Default for ClockAllowance {
    /// ε = 5 %, δ = 50 ms, as in the test plan.
    fn default() -> ClockAllowance {
        ClockAllowance { rate_error: 0.05, margin_ns: 50_000_000 }
    }
}

/// Every session's conservative deadline over time, as its client knows it.
///
/// A refresh is an `Ok` create or keepalive. Once the client has its answer (at the refresh's
/// completion) it may rely on the session until the refresh's *invoke* time plus
/// [`ClockAllowance::trusted_ns`]. Only sessions with an `Ok` [`OpKind::CreateSession`] in
/// the history are known (their TTL comes from it).
///
/// # Examples
///
/// ```
/// use permit_check::{ClockAllowance, Completion, History, Invocation, Op, SessionDeadlines};
///
/// let ms = 1_000_000;
/// let allowance = ClockAllowance { rate_error: 0.0, margin_ns: 0 };
/// let mut create = Op::invoked(0, Invocation::create_session(1, 1000), 0);
/// create.complete(10 * ms, Completion { session: Some("a".into()), ..Completion::ok() });
/// let mut keepalive = Op::invoked(1, Invocation::keepalive(1, "a"), 500 * ms);
/// keepalive.complete(520 * ms, Completion::ok());
/// let history: History = [create, keepalive].into_iter().collect();
///
/// let deadlines = SessionDeadlines::new(&history, allowance);
/// assert_eq!(deadlines.deadline_at("a", 100 * ms), Some(1000 * ms));
/// assert_eq!(deadlines.deadline_at("a", 600 * ms), Some(1500 * ms));
/// assert_eq!(deadlines.lapse_after("a", 100 * ms), Some(1500 * ms));
/// assert_eq!(deadlines.lapse_after("nobody", 0), None);
/// ```
#[derive(Clone, Debug, Default)]
pub struct SessionDeadlines {
    sessions: HashMap<String, Refreshes>,
}

#[derive(Clone, Debug)]
struct Refreshes {
    ttl_ms: u64,
    /// Sorted by `known_ns`.
    steps: Vec<Step>,
}

#[derive(Clone, Copy, Debug)]
struct Step {
    /// When the client learnt of the refresh (its completion).
    known_ns: u64,
    /// The deadline from then on: the latest refresh invoke known so far, plus trust.
    deadline_ns: u64,
    /// When the client stops relying, if it relies from this step on without interruption.
    lapse_ns: u64,
}

impl SessionDeadlines {
    /// Collects every session's refreshes from `history`.
    pub fn new(history: &History, allowance: ClockAllowance) -> SessionDeadlines {
        let mut refreshes: HashMap<String, (u64, Vec<(u64, u64)>)> = HashMap::new();
        for op in history.ops().iter().filter(|op| op.is_ok()) {
            if let (OpKind::CreateSession { ttl_ms }, false) = (&op.kind, op.session.is_empty()) {
                refreshes.entry(op.session.clone()).or_insert((*ttl_ms, Vec::new()));
            }
        }
        for op in history.ops().iter().filter(|op| op.is_ok()) {
            let is_refresh = matches!(op.kind, OpKind::CreateSession { .. } | OpKind::Keepalive);
            if let (true, Some(complete_ns)) = (is_refresh, op.complete_ns) {
                if let Some((_, times)) = refreshes.get_mut(&op.session) {
                    times.push((complete_ns, op.invoke_ns));
                }
            }
        }
        let sessions = refreshes
            .into_iter()
            .map(|(session, (ttl_ms, times))| (session, Refreshes::new(ttl_ms, times, allowance)))
            .collect();
        SessionDeadlines { sessions }
    }

    /// The TTL of a known session.
    pub fn ttl_ms(&self, session: &str) -> Option<u64> {
        self.sessions.get(session).map(|refreshes| refreshes.ttl_ms)
    }

    /// The deadline the client knows at `t_ns`: from the latest refresh answered by then.
    /// `None` for an unknown session or before its create was answered.
    pub fn deadline_at(&self, session: &str, t_ns: u64) -> Option<u64> {
        let refreshes = self.sessions.get(session)?;
        refreshes.last_known_by(t_ns).map(|step| step.deadline_ns)
    }

    /// The first instant at or after `t_ns` at which a client relying on the session from
    /// `t_ns` must stop: the deadline it knows, extended by each refresh answered before that
    /// deadline passed. A value ≤ `t_ns` means it could not rely on it at `t_ns` at all.
    /// `None` for an unknown session.
    pub fn lapse_after(&self, session: &str, t_ns: u64) -> Option<u64> {
        let refreshes = self.sessions.get(session)?;
        Some(refreshes.last_known_by(t_ns).map_or(t_ns, |step| step.lapse_ns))
    }
}

impl Refreshes {
    fn new(ttl_ms: u64, mut times: Vec<(u64, u64)>, allowance: ClockAllowance) -> Refreshes {
        times.sort_unstable();
        let trusted_ns = allowance.trusted_ns(ttl_ms);
        let mut deadline_ns = 0;
        let mut steps: Vec<Step> = times
            .into_iter()
            .map(|(known_ns, invoke_ns)| {
                deadline_ns = deadline_ns.max(invoke_ns.saturating_add(trusted_ns));
                Step { known_ns, deadline_ns, lapse_ns: deadline_ns }
            })
            .collect();
        // A refresh answered before the current deadline passed carries the client over;
        // one answered after it comes too late for a client that had to stop.
        for index in (0..steps.len().saturating_sub(1)).rev() {
            if steps[index + 1].known_ns < steps[index].deadline_ns {
                steps[index].lapse_ns = steps[index + 1].lapse_ns;
            }
        }
        Refreshes { ttl_ms, steps }
    }

    fn last_known_by(&self, t_ns: u64) -> Option<&Step> {
        let count = self.steps.partition_point(|step| step.known_ns <= t_ns);
        count.checked_sub(1).map(|index| &self.steps[index])
    }
}
