//! Prometheus metrics, served as text at `GET /metrics`.
//!
//! Counters and histograms are updated where things happen; gauges of the state (sessions,
//! holders, waiters, Raft state, and per-semaphore figures for the first
//! [`PER_SEMAPHORE_SERIES_MAX`] semaphores by name) are computed at scrape time.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Most semaphores that get their own labelled series, to bound the scrape size.
pub const PER_SEMAPHORE_SERIES_MAX: usize = 1000;

type Labels = Vec<(String, String)>;

/// All metrics of one node.
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    request_seconds: Family<Labels, Histogram>,
    batch_commands: Histogram,
    write_seconds: Histogram,
    /// Duration of each log append (redb commit with fsync).
    pub append_seconds: Histogram,
    sessions_expired: Counter,
    holds_expired: Counter,
    /// ReadIndex rounds (quorum confirmations) run for linearizable reads and keepalives.
    pub read_rounds: Counter,
    /// Linearizable reads and keepalives that waited for a ReadIndex round.
    pub read_barrier_waits: Counter,
    connections_open: Gauge,
    connections_refused: Family<Labels, Counter>,
    /// Gauges set at scrape time.
    pub gauges: StateGauges,
    scrapes: AtomicU64,
}

/// Gauges describing the state and Raft, refreshed at each scrape.
#[derive(Default)]
pub struct StateGauges {
    /// Live sessions.
    pub sessions: Gauge,
    /// Semaphores.
    pub semaphores: Gauge,
    /// Elections with a leader or candidates.
    pub elections: Gauge,
    /// Holds over all objects.
    pub holds: Gauge,
    /// Waiters over all objects.
    pub waiters: Gauge,
    /// The largest fencing token issued.
    pub last_token: Gauge,
    /// Current Raft term.
    pub raft_term: Gauge,
    /// 1 when this node is the Raft leader.
    pub raft_is_leader: Gauge,
    /// Last log index on this node.
    pub raft_last_log_index: Gauge,
    /// Last applied log index on this node.
    pub raft_applied_index: Gauge,
    /// Last log index in this node's latest snapshot.
    pub raft_snapshot_index: Gauge,
    /// Last log index purged from this node's log (compaction).
    pub raft_purged_index: Gauge,
    /// Per-semaphore capacity.
    pub semaphore_capacity: Family<Labels, Gauge>,
    /// Per-semaphore permits held.
    pub semaphore_held: Family<Labels, Gauge>,
    /// Per-semaphore waiters.
    pub semaphore_waiters: Family<Labels, Gauge>,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("permit");
        let requests = Family::<Labels, Counter>::default();
        registry.register("http_requests", "HTTP requests by route, method and status", requests.clone());
        let request_seconds = Family::<Labels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_05, 2.0, 20))
        });
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route",
            request_seconds.clone(),
        );
        let batch_commands = Histogram::new(exponential_buckets(1.0, 2.0, 13));
        registry.register(
            "proposal_batch_commands",
            "Commands per log entry (group commit)",
            batch_commands.clone(),
        );
        let write_seconds = Histogram::new(exponential_buckets(0.000_025, 1.5, 30));
        registry.register(
            "raft_write_duration_seconds",
            "Time from handing a batch to Raft to its outcome (append, fsync, commit, apply)",
            write_seconds.clone(),
        );
        let append_seconds = Histogram::new(exponential_buckets(0.000_025, 1.5, 30));
        registry.register(
            "log_append_duration_seconds",
            "One log append: redb commit and fsync",
            append_seconds.clone(),
        );
        let sessions_expired = Counter::default();
        registry.register("sessions_expired", "Sessions expired by the leader", sessions_expired.clone());
        let holds_expired = Counter::default();
        registry.register("holds_expired", "Holds released by max_hold_ms", holds_expired.clone());
        let read_rounds = Counter::default();
        registry.register(
            "read_index_rounds",
            "ReadIndex rounds (one quorum confirmation each) run for linearizable reads and keepalives",
            read_rounds.clone(),
        );
        let read_barrier_waits = Counter::default();
        registry.register(
            "read_barrier_waits",
            "Linearizable reads and keepalives served by a ReadIndex round (several share one)",
            read_barrier_waits.clone(),
        );
        let connections_open = Gauge::default();
        registry.register("connections_open", "Open client and peer connections", connections_open.clone());
        let connections_refused = Family::<Labels, Counter>::default();
        registry.register(
            "connections_refused",
            "Connections closed without serving by reason: cap, plain_http (on a TLS port), tls_handshake",
            connections_refused.clone(),
        );
        let gauges = StateGauges::default();
        let g = &gauges;
        registry.register("sessions", "Live sessions", g.sessions.clone());
        registry.register("semaphores", "Semaphores", g.semaphores.clone());
        registry.register("elections", "Elections with a leader or candidates", g.elections.clone());
        registry.register("holds", "Holds over all semaphores and elections", g.holds.clone());
        registry.register("waiters", "Queued acquires over all semaphores and elections", g.waiters.clone());
        registry.register("last_token", "Largest fencing token issued", g.last_token.clone());
        registry.register("raft_term", "Current Raft term", g.raft_term.clone());
        registry.register("raft_is_leader", "1 if this node is the Raft leader", g.raft_is_leader.clone());
        registry.register(
            "raft_last_log_index",
            "Last Raft log index on this node",
            g.raft_last_log_index.clone(),
        );
        registry.register("raft_applied_index", "Last applied Raft log index", g.raft_applied_index.clone());
        registry.register(
            "raft_snapshot_index",
            "Last log index in the latest snapshot",
            g.raft_snapshot_index.clone(),
        );
        registry.register(
            "raft_purged_index",
            "Last log index removed by compaction",
            g.raft_purged_index.clone(),
        );
        registry.register("semaphore_capacity", "Capacity per semaphore", g.semaphore_capacity.clone());
        registry.register("semaphore_held", "Permits held per semaphore", g.semaphore_held.clone());
        registry.register("semaphore_waiters", "Waiters per semaphore", g.semaphore_waiters.clone());
        Metrics {
            registry,
            requests,
            request_seconds,
            batch_commands,
            write_seconds,
            append_seconds,
            sessions_expired,
            holds_expired,
            read_rounds,
            read_barrier_waits,
            connections_open,
            connections_refused,
            gauges,
            scrapes: AtomicU64::new(0),
        }
    }

    /// Counts one HTTP request.
    pub fn observe_request(&self, route: &str, method: &str, status: u16, seconds: f64) {
        let labels = vec![
            ("route".to_owned(), route.to_owned()),
            ("method".to_owned(), method.to_owned()),
            ("status".to_owned(), status.to_string()),
        ];
        self.requests.get_or_create(&labels).inc();
        self.request_seconds.get_or_create(&vec![("route".to_owned(), route.to_owned())]).observe(seconds);
    }

    /// Records the size of one proposed batch.
    pub fn observe_batch(&self, commands: usize) {
        self.batch_commands.observe(commands as f64);
    }

    /// Records how long one batch took to commit and apply.
    pub fn observe_write(&self, seconds: f64) {
        self.write_seconds.observe(seconds);
    }

    /// Counts expired sessions.
    pub fn sessions_expired(&self, count: u64) {
        self.sessions_expired.inc_by(count);
    }

    /// Counts holds released by `max_hold_ms`.
    pub fn holds_expired(&self, count: u64) {
        self.holds_expired.inc_by(count);
    }

    /// Counts an accepted connection as open.
    pub fn connection_opened(&self) {
        self.connections_open.inc();
    }

    /// Counts an open connection as closed.
    pub fn connection_closed(&self) {
        self.connections_open.dec();
    }

    /// Counts a connection closed without being served, by reason.
    pub fn connection_refused(&self, reason: &str) {
        self.connections_refused.get_or_create(&vec![("reason".to_owned(), reason.to_owned())]).inc();
    }

    /// Renders every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        self.scrapes.fetch_add(1, Ordering::Relaxed);
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// The label set of one semaphore's series.
pub fn semaphore_labels(name: &str) -> Labels {
    vec![("semaphore".to_owned(), name.to_owned())]
}
