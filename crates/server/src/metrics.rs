//! Prometheus metrics, served as text at `GET /metrics`.
//!
//! Counters, histograms and gauges are updated where things happen: requests in the API
//! middleware, the state's figures as entries apply (`observe.rs`). A scrape sets only the Raft
//! gauges, the clock-dependent per-object gauges and the `process_*` figures: O(series), never a
//! walk of the state. Objects past `--metrics-names-max` share the series labelled
//! `crate::observe::OVERFLOW_LABEL`. `docs/observability.md` lists every metric.

use std::sync::atomic::AtomicU64;

use permit_core::{EventKind, Kind};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `--metrics-names-max`'s default: most semaphores and elections with series of their own.
pub const METRICS_NAMES_MAX_DEFAULT: usize = 1000;

/// A label set.
pub(crate) type Labels = Vec<(String, String)>;

/// Buckets of the wait and hold time histograms, in seconds.
const OBJECT_SECONDS_BUCKETS: [f64; 18] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
    3600.0,
];

/// Buckets of the long-poll duration histogram, in seconds.
const LONG_POLL_BUCKETS: [f64; 12] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 60.0];

/// The per-object gauges of one series ([`Metrics::object_series`]).
#[derive(Clone)]
pub(crate) struct ObjectGauges {
    /// Capacity (semaphores).
    pub(crate) capacity: Gauge,
    /// Permits held (semaphores).
    pub(crate) held: Gauge,
    /// Holders (for an election, 1 while it has a leader).
    pub(crate) holders: Gauge,
    /// Queued acquires (election candidates).
    pub(crate) waiters: Gauge,
}

/// The clock-dependent gauges of one series, set at each scrape ([`Metrics::clock_series`]).
pub(crate) struct ClockGauges {
    oldest_waiter: Gauge<f64, AtomicU64>,
    /// Elections only.
    tenure: Option<Gauge<f64, AtomicU64>>,
}

impl ClockGauges {
    /// Sets how long the oldest waiter has waited and (elections) how long the leader has led
    /// (0 without one), in seconds.
    pub(crate) fn set(&self, oldest_waiter: f64, tenure: Option<f64>) {
        self.oldest_waiter.set(oldest_waiter);
        if let Some(gauge) = &self.tenure {
            gauge.set(tenure.unwrap_or(0.0));
        }
    }
}

/// How a hold can end, as the `ended` label of `permit_*_hold_seconds` names it.
const HOLD_ENDS: [EventKind; 3] = [EventKind::Released, EventKind::Expired, EventKind::Revoked];

/// The labels of an object's hold-duration series for holds that ended as `how`.
fn hold_labels(labels: &Labels, how: EventKind) -> Labels {
    let mut with = labels.clone();
    with.push(("ended".to_owned(), how.as_str().to_owned()));
    with
}

/// The counting series of one object (grants, waits, hold ends), each looked up in its family
/// on first use and kept: a lookup builds and hashes the label vector. Valid until
/// [`Metrics::forget_object`] drops the object's series.
#[derive(Default)]
pub(crate) struct ObjectCounts {
    grants: Option<Counter>,
    wait_seconds: Option<Histogram>,
    expirations: Option<Counter>,
    /// By how the hold ended, in the order of [`HOLD_ENDS`].
    hold_seconds: [Option<Histogram>; HOLD_ENDS.len()],
    /// Takes served and refused by the rate.
    takes: [Option<Counter>; 2],
}

/// One semaphore's policy gauges at a scrape: its series' labels, what its rate grants now (if it
/// has one), and the permits each group holds.
pub(crate) type PolicyGauges = (Labels, Option<u64>, Vec<(String, u64)>);

/// The `result` label of `permit_semaphore_takes_total`, served first.
const TAKE_RESULTS: [&str; 2] = ["taken", "rate_limited"];

/// The labels of an object's take series with `result`.
fn take_labels(labels: &Labels, result: &str) -> Labels {
    let mut with = labels.clone();
    with.push(("result".to_owned(), result.to_owned()));
    with
}

/// The labelled families of one kind of object.
#[derive(Clone)]
struct ObjectFamilies {
    capacity: Family<Labels, Gauge>,
    held: Family<Labels, Gauge>,
    holders: Family<Labels, Gauge>,
    waiters: Family<Labels, Gauge>,
    oldest_waiter_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    grants: Family<Labels, Counter>,
    try_refusals: Family<Labels, Counter>,
    timeouts: Family<Labels, Counter>,
    expirations: Family<Labels, Counter>,
    wait_seconds: Family<Labels, Histogram>,
    hold_seconds: Family<Labels, Histogram>,
    leader_changes: Family<Labels, Counter>,
    tenure_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    takes: Family<Labels, Counter>,
    delayed: Family<Labels, Gauge>,
    rate_available: Family<Labels, Gauge>,
    group_held: Family<Labels, Gauge>,
}

impl ObjectFamilies {
    fn new() -> ObjectFamilies {
        let seconds = || Histogram::new(OBJECT_SECONDS_BUCKETS);
        ObjectFamilies {
            capacity: Family::default(),
            held: Family::default(),
            holders: Family::default(),
            waiters: Family::default(),
            oldest_waiter_seconds: Family::default(),
            grants: Family::default(),
            try_refusals: Family::default(),
            timeouts: Family::default(),
            expirations: Family::default(),
            wait_seconds: Family::new_with_constructor(seconds),
            hold_seconds: Family::new_with_constructor(seconds),
            leader_changes: Family::default(),
            tenure_seconds: Family::default(),
            takes: Family::default(),
            delayed: Family::default(),
            rate_available: Family::default(),
            group_held: Family::default(),
        }
    }

    fn forget(&self, labels: &Labels) {
        self.capacity.remove(labels);
        self.held.remove(labels);
        self.holders.remove(labels);
        self.waiters.remove(labels);
        self.oldest_waiter_seconds.remove(labels);
        self.grants.remove(labels);
        self.try_refusals.remove(labels);
        self.timeouts.remove(labels);
        self.expirations.remove(labels);
        self.wait_seconds.remove(labels);
        self.leader_changes.remove(labels);
        self.tenure_seconds.remove(labels);
        self.delayed.remove(labels);
        self.rate_available.remove(labels);
        for result in TAKE_RESULTS {
            self.takes.remove(&take_labels(labels, result));
        }
        for how in HOLD_ENDS {
            self.hold_seconds.remove(&hold_labels(labels, how));
        }
    }
}

/// The labelled families of queues (label `queue`).
#[derive(Clone)]
pub(crate) struct QueueFamilies {
    /// Items by `state` (pending, delayed, claimed).
    items: Family<Labels, Gauge>,
    /// Blocked claims.
    claimers: Family<Labels, Gauge>,
    /// How long the next item to be claimed has been in the queue.
    oldest_pending_seconds: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Items by `event` (pushed, claimed, acked, nacked, dead).
    events: Family<Labels, Counter>,
    /// Time from entering the queue to each claim.
    claim_wait_seconds: Family<Labels, Histogram>,
    /// Time from claim to ack.
    processing_seconds: Family<Labels, Histogram>,
}

/// The item states of `permit_queue_items`, in the order of [`QueueSeries::items`].
pub(crate) const QUEUE_ITEM_STATES: [&str; 3] = ["pending", "delayed", "claimed"];

/// The events of `permit_queue_events_total`, in the order of [`QueueSeries::events`].
const QUEUE_EVENT_KINDS: [EventKind; 5] =
    [EventKind::Pushed, EventKind::Claimed, EventKind::Acked, EventKind::Nacked, EventKind::Dead];

/// The series of one queue that its applies move, looked up once: a lookup clones and hashes
/// the labels, and every queue command moves some of them.
#[derive(Clone)]
pub(crate) struct QueueSeries {
    /// Items by state, in the order of [`QUEUE_ITEM_STATES`].
    pub(crate) items: [Gauge; 3],
    /// Blocked claims.
    pub(crate) claimers: Gauge,
    /// Events by kind, in the order of [`QUEUE_EVENT_KINDS`].
    events: [Counter; 5],
    claim_wait_seconds: Histogram,
    processing_seconds: Histogram,
}

impl QueueSeries {
    /// Counts `n` queue events of `kind` (`pushed`, `claimed`, `acked`, `nacked`, `dead`).
    pub(crate) fn count(&self, kind: EventKind, n: u64) {
        if let Some(i) = QUEUE_EVENT_KINDS.iter().position(|k| *k == kind) {
            self.events[i].inc_by(n);
        }
    }

    /// Records how long a claimed item waited (`Claimed`), or how long an acked one was held
    /// (`Acked`).
    pub(crate) fn observe(&self, kind: EventKind, seconds: f64) {
        match kind {
            EventKind::Claimed => self.claim_wait_seconds.observe(seconds),
            EventKind::Acked => self.processing_seconds.observe(seconds),
            _ => {}
        }
    }
}

impl QueueFamilies {
    fn new() -> QueueFamilies {
        let seconds = || Histogram::new(OBJECT_SECONDS_BUCKETS);
        QueueFamilies {
            items: Family::default(),
            claimers: Family::default(),
            oldest_pending_seconds: Family::default(),
            events: Family::default(),
            claim_wait_seconds: Family::new_with_constructor(seconds),
            processing_seconds: Family::new_with_constructor(seconds),
        }
    }

    fn register(&self, registry: &mut Registry) {
        registry.register(
            "queue_items",
            "Items per queue and state (pending, delayed, claimed)",
            self.items.clone(),
        );
        registry.register(
            "queue_claimers",
            "Claims blocked waiting for an item, per queue",
            self.claimers.clone(),
        );
        registry.register(
            "queue_oldest_pending_seconds",
            "How long the next item to be claimed has been in each queue (0 with none pending)",
            self.oldest_pending_seconds.clone(),
        );
        registry.register(
            "queue_events",
            "Items per queue by event: pushed, claimed, acked, nacked (a claim that ended without an ack), dead",
            self.events.clone(),
        );
        registry.register(
            "queue_claim_wait_seconds",
            "Time from an item entering the queue to each claim of it (leader time)",
            self.claim_wait_seconds.clone(),
        );
        registry.register(
            "queue_processing_seconds",
            "Time from a claim to its ack (leader time)",
            self.processing_seconds.clone(),
        );
    }
}

/// The methods HTTP defines; a request's `method` label is one of these or `OTHER`.
const STANDARD_METHODS: [&str; 9] =
    ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"];

/// The request series of one route template.
#[derive(Default)]
struct RouteSeries {
    /// Its `permit_http_request_duration_seconds` histogram, once it had a request.
    seconds: Option<Histogram>,
    /// Its `permit_http_long_poll_duration_seconds` histogram, once it had a long-poll.
    long_poll_seconds: Option<Histogram>,
    /// Its `permit_http_requests` counters by method and status.
    counts: Vec<(String, u16, Counter)>,
}

/// All metrics of one node.
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    request_seconds: Family<Labels, Histogram>,
    batch_commands: Histogram,
    write_seconds: Histogram,
    forwards: Family<Labels, Counter>,
    forward_seconds: Histogram,
    handoff_waited: Counter,
    handoff_missed: Counter,
    /// Duration of each log append: the segment log's write and its fdatasync.
    pub(crate) append_seconds: Histogram,
    sessions_expired: Counter,
    sessions_created: Counter,
    sessions_closed: Counter,
    keepalives: Counter,
    keepalive_batch_sessions: Histogram,
    holds_expired: Counter,
    long_poll_seconds: Family<Labels, Histogram>,
    /// The request series by route template, so that a request looks up its series by one
    /// string: a labelled family's lookup builds and hashes every label string (twice per
    /// request).
    routes: std::sync::Mutex<std::collections::HashMap<String, RouteSeries>>,
    semaphore: ObjectFamilies,
    election: ObjectFamilies,
    queue: QueueFamilies,
    /// ReadIndex rounds (quorum confirmations) run for linearizable reads and keepalives.
    pub(crate) read_rounds: Counter,
    /// Linearizable reads and keepalives that waited for a ReadIndex round.
    pub(crate) read_barrier_waits: Counter,
    /// Peer RPCs this node sent, by kind (counted by the peer network before each send).
    pub(crate) peer_rpcs_sent: PeerRpcCounts,
    /// Seconds spent on peer message authenticators (`peer::ClusterSecret`).
    pub(crate) peer_mac_seconds: crate::peer::MacSeconds,
    /// Peer RPCs this node received and admitted, by kind.
    pub(crate) peer_rpcs_received: PeerRpcCounts,
    connections_open: Gauge,
    connections_refused: Family<Labels, Counter>,
    /// Gauges set at scrape time.
    pub(crate) gauges: StateGauges,
    /// One render at a time: renders run on the blocking pool (see `api::system::metrics`), and
    /// concurrent scrapes must not take a thread each. The permit moves into the render, so a
    /// scraper that hangs up does not free it before the render ends.
    pub(crate) renders: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Gauges describing the state and Raft, refreshed at each scrape.
#[derive(Default)]
pub(crate) struct StateGauges {
    /// Live sessions.
    pub(crate) sessions: Gauge,
    /// Semaphores.
    pub(crate) semaphores: Gauge,
    /// Elections with a leader or candidates.
    pub(crate) elections: Gauge,
    /// Queues.
    pub(crate) queues: Gauge,
    /// Holds over all objects.
    pub(crate) holds: Gauge,
    /// Waiters over all objects.
    pub(crate) waiters: Gauge,
    /// The largest fencing token issued.
    pub(crate) last_token: Gauge,
    /// Current Raft term.
    pub(crate) raft_term: Gauge,
    /// 1 when this node is the Raft leader.
    pub(crate) raft_is_leader: Gauge,
    /// Last log index on this node.
    pub(crate) raft_last_log_index: Gauge,
    /// Last applied log index on this node.
    pub(crate) raft_applied_index: Gauge,
    /// Last log index in this node's latest snapshot.
    pub(crate) raft_snapshot_index: Gauge,
    /// Last log index purged from this node's log (compaction).
    pub(crate) raft_purged_index: Gauge,
}

impl Metrics {
    /// Registers every metric.
    pub(crate) fn new() -> Metrics {
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
        let forwards = Family::<Labels, Counter>::default();
        registry.register(
            "forwarded_requests",
            "Requests this node forwarded to the leader, by kind: request, long_poll (a waiting acquire or campaign, a blocking read)",
            forwards.clone(),
        );
        let forward_seconds = Histogram::new(exponential_buckets(0.000_025, 1.5, 30));
        registry.register(
            "forward_duration_seconds",
            "A forwarded request that is not a long-poll: from sending it to the leader to its whole answer read",
            forward_seconds.clone(),
        );
        let append_seconds = Histogram::new(exponential_buckets(0.000_025, 1.5, 30));
        registry.register(
            "log_append_duration_seconds",
            "One log append: the segment log's write and fdatasync",
            append_seconds.clone(),
        );
        let sessions_expired =
            counter(&mut registry, "sessions_expired", "Sessions expired (as applied on this node)");
        let sessions_created =
            counter(&mut registry, "sessions_created", "Sessions created (as applied on this node)");
        let sessions_closed = counter(
            &mut registry,
            "sessions_closed",
            "Sessions closed by their client or with their token (as applied on this node)",
        );
        let keepalives =
            counter(&mut registry, "session_keepalives", "Keepalives answered by this node (the leader)");
        let keepalive_batch_sessions = Histogram::new(exponential_buckets(1.0, 2.0, 11));
        registry.register(
            "session_keepalive_batch_sessions",
            "Session ids per batched keepalive (POST /v1/sessions/keepalive) answered by this node",
            keepalive_batch_sessions.clone(),
        );
        let long_poll_seconds =
            Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(LONG_POLL_BUCKETS));
        registry.register(
            "http_long_poll_duration_seconds",
            "Duration of long-polls (waiting acquires and campaigns, blocking reads; an event stream until its headers) by route; they are not in http_request_duration_seconds",
            long_poll_seconds.clone(),
        );
        let semaphore = ObjectFamilies::new();
        let election = ObjectFamilies::new();
        register_objects(&mut registry, &semaphore, &election);
        let build_info = Family::<Labels, Gauge>::default();
        registry.register("build_info", "Always 1, labelled with the server's version", build_info.clone());
        build_info.get_or_create(&vec![("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned())]).set(1);
        let holds_expired = counter(&mut registry, "holds_expired", "Holds released by max_hold_ms");
        let read_rounds = counter(
            &mut registry,
            "read_index_rounds",
            "ReadIndex rounds (one quorum confirmation each) run for linearizable reads and keepalives",
        );
        let read_barrier_waits = counter(
            &mut registry,
            "read_barrier_waits",
            "Linearizable reads and keepalives served by a ReadIndex round (several share one)",
        );
        let peer_rpcs_sent = PeerRpcCounts::register(
            &mut registry,
            "peer_rpcs_sent",
            "Raft RPCs sent to peers by kind: append (with entries), heartbeat (append without entries: heartbeats and ReadIndex confirmations), vote, snapshot (one per chunk)",
        );
        let peer_mac_seconds = crate::peer::MacSeconds::default();
        registry.register(
            "peer_mac_seconds",
            "Time this node spent computing and checking peer message authenticators (HMAC-SHA256 of each Raft RPC and forwarded request, with the SHA-256 of its body), to price them against the node's CPU",
            peer_mac_seconds.clone(),
        );
        let peer_rpcs_received = PeerRpcCounts::register(
            &mut registry,
            "peer_rpcs_received",
            "Raft RPCs received from peers and admitted (decoded, sender checked), by kind as in peer_rpcs_sent",
        );
        let handoff_waited = counter(
            &mut registry,
            "proposal_handoff_waited",
            "Sessions woken by a batch (a granted or ended wait) whose next command the proposer waited for",
        );
        let handoff_missed = counter(
            &mut registry,
            "proposal_handoff_missed",
            "Woken sessions that proposed nothing within one write's time, so the batch was cut without them",
        );
        let connections_open = Gauge::default();
        registry.register("connections_open", "Open client and peer connections", connections_open.clone());
        let connections_refused = Family::<Labels, Counter>::default();
        registry.register(
            "connections_refused",
            "Connections closed without serving by reason: cap, per_client, plain_http (on a TLS port), tls_handshake",
            connections_refused.clone(),
        );
        let gauges = StateGauges::default();
        let g = &gauges;
        registry.register("sessions", "Live sessions", g.sessions.clone());
        registry.register("semaphores", "Semaphores", g.semaphores.clone());
        registry.register("elections", "Elections with a leader or candidates", g.elections.clone());
        registry.register("queues", "Work queues", g.queues.clone());
        let queue = QueueFamilies::new();
        queue.register(&mut registry);
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
        Metrics {
            registry,
            requests,
            request_seconds,
            batch_commands,
            write_seconds,
            forwards,
            forward_seconds,
            handoff_waited,
            handoff_missed,
            append_seconds,
            sessions_expired,
            sessions_created,
            sessions_closed,
            keepalives,
            keepalive_batch_sessions,
            holds_expired,
            long_poll_seconds,
            routes: Default::default(),
            semaphore,
            election,
            queue,
            read_rounds,
            read_barrier_waits,
            peer_rpcs_sent,
            peer_mac_seconds,
            peer_rpcs_received,
            connections_open,
            connections_refused,
            gauges,
            renders: std::sync::Arc::new(tokio::sync::Semaphore::new(1)),
        }
    }

    /// Counts one HTTP request to the route template `route` (a long-poll's duration goes to
    /// its own histogram, not the request latency one). A method that HTTP does not define is
    /// counted as `OTHER`, so that requests cannot add series without bound.
    pub(crate) fn observe_request(
        &self,
        route: &str,
        method: &str,
        status: u16,
        seconds: f64,
        long_poll: bool,
    ) {
        let method = if STANDARD_METHODS.contains(&method) { method } else { "OTHER" };
        let (count, histogram) = {
            let mut routes = self.routes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            // One lookup for a route seen before (every request but its first).
            match routes.get_mut(route) {
                Some(series) => self.route_handles(series, route, method, status, long_poll),
                None => {
                    let series = routes.entry(route.to_owned()).or_default();
                    self.route_handles(series, route, method, status, long_poll)
                }
            }
        };
        count.inc();
        histogram.observe(seconds);
    }

    /// The request counter of (`method`, `status`) and the duration histogram of `route`'s
    /// `series`, created on first use.
    fn route_handles(
        &self,
        series: &mut RouteSeries,
        route: &str,
        method: &str,
        status: u16,
        long_poll: bool,
    ) -> (Counter, Histogram) {
        let count = match series.counts.iter().find(|(m, s, _)| *m == method && *s == status) {
            Some((_, _, count)) => count.clone(),
            None => {
                let labels = vec![
                    ("route".to_owned(), route.to_owned()),
                    ("method".to_owned(), method.to_owned()),
                    ("status".to_owned(), status.to_string()),
                ];
                let count = self.requests.get_or_create(&labels).clone();
                series.counts.push((method.to_owned(), status, count.clone()));
                count
            }
        };
        let (slot, family) = if long_poll {
            (&mut series.long_poll_seconds, &self.long_poll_seconds)
        } else {
            (&mut series.seconds, &self.request_seconds)
        };
        let histogram = slot
            .get_or_insert_with(|| {
                family.get_or_create(&vec![("route".to_owned(), route.to_owned())]).clone()
            })
            .clone();
        (count, histogram)
    }

    fn families(&self, kind: Kind) -> &ObjectFamilies {
        match kind {
            Kind::Semaphore => &self.semaphore,
            Kind::Election => &self.election,
            Kind::Queue => unreachable!("queues have no permit series (the observer tracks them apart)"),
        }
    }

    /// The gauges of the series `labels` of an object of `kind` (created at zero if new). The
    /// handles stay valid until [`Metrics::forget_object`] drops the series.
    pub(crate) fn object_series(&self, kind: Kind, labels: &Labels) -> ObjectGauges {
        let f = self.families(kind);
        ObjectGauges {
            capacity: f.capacity.get_or_create(labels).clone(),
            held: f.held.get_or_create(labels).clone(),
            holders: f.holders.get_or_create(labels).clone(),
            waiters: f.waiters.get_or_create(labels).clone(),
        }
    }

    /// Runs `change` on one object's `gauges`, and keeps the totals over all objects
    /// (`permit_holds`, `permit_waiters`) in step.
    pub(crate) fn change_object<R>(&self, gauges: &ObjectGauges, change: impl FnOnce(&ObjectGauges) -> R) {
        let (holders, waiters) = (gauges.holders.get(), gauges.waiters.get());
        change(gauges);
        self.gauges.holds.inc_by(gauges.holders.get() - holders);
        self.gauges.waiters.inc_by(gauges.waiters.get() - waiters);
    }

    /// The gauge counting objects of `kind`.
    pub(crate) fn objects_gauge(&self, kind: Kind) -> &Gauge {
        match kind {
            Kind::Semaphore => &self.gauges.semaphores,
            Kind::Election => &self.gauges.elections,
            Kind::Queue => unreachable!("queues have no permit series (the observer tracks them apart)"),
        }
    }

    /// Drops every series of an object (it was deleted, or the gauges are rebuilt). The totals
    /// lose what it held.
    pub(crate) fn forget_object(&self, labels: &Labels) {
        for f in [&self.semaphore, &self.election] {
            if let Some(holders) = f.holders.get(labels) {
                self.gauges.holds.dec_by(holders.get());
            }
            if let Some(waiters) = f.waiters.get(labels) {
                self.gauges.waiters.dec_by(waiters.get());
            }
            f.forget(labels);
        }
    }

    /// Zeroes the object totals before the per-object gauges are rebuilt.
    pub(crate) fn reset_object_totals(&self) {
        for gauge in
            [&self.gauges.semaphores, &self.gauges.elections, &self.gauges.holds, &self.gauges.waiters]
        {
            gauge.set(0);
        }
    }

    /// Sets the session count (after a snapshot was installed).
    pub(crate) fn set_totals(&self, sessions: i64) {
        self.gauges.sessions.set(sessions);
    }

    /// Counts a created session.
    pub(crate) fn session_created(&self) {
        self.sessions_created.inc();
        self.gauges.sessions.inc();
    }

    /// Counts a session that expired or was closed.
    pub(crate) fn session_ended(&self, expired: bool) {
        if expired { &self.sessions_expired } else { &self.sessions_closed }.inc();
        self.gauges.sessions.dec();
    }

    /// Counts a keepalive answered.
    pub(crate) fn keepalive(&self) {
        self.keepalives.inc();
    }

    /// Counts a batched keepalive of `ids` sessions, `renewed` of which were renewed.
    pub(crate) fn keepalive_batch(&self, ids: u64, renewed: u64) {
        self.keepalive_batch_sessions.observe(ids as f64);
        self.keepalives.inc_by(renewed);
    }

    /// Counts a grant that waited `waited` seconds in the queue (0 for an immediate one), in
    /// the series `labels` of an object of `kind` (whose handles `series` keeps).
    pub(crate) fn granted(&self, kind: Kind, labels: &Labels, series: &mut ObjectCounts, waited: f64) {
        let f = self.families(kind);
        series.grants.get_or_insert_with(|| f.grants.get_or_create(labels).clone()).inc();
        series
            .wait_seconds
            .get_or_insert_with(|| f.wait_seconds.get_or_create(labels).clone())
            .observe(waited);
    }

    /// Counts a try-acquire refused.
    pub(crate) fn try_acquire_refused(&self, kind: Kind, labels: &Labels) {
        self.families(kind).try_refusals.get_or_create(labels).inc();
    }

    /// Counts a long-poll acquire that timed out still queued.
    pub(crate) fn acquire_timed_out(&self, kind: Kind, labels: &Labels) {
        self.families(kind).timeouts.get_or_create(labels).inc();
    }

    /// Records a hold that lasted `held` seconds and ended as `how` (released, expired or
    /// revoked), as [`Metrics::granted`] counts.
    pub(crate) fn hold_ended(
        &self,
        kind: Kind,
        labels: &Labels,
        series: &mut ObjectCounts,
        how: EventKind,
        held: f64,
    ) {
        let f = self.families(kind);
        if how == EventKind::Expired {
            series.expirations.get_or_insert_with(|| f.expirations.get_or_create(labels).clone()).inc();
        }
        let slot = HOLD_ENDS.iter().position(|end| *end == how).unwrap_or(HOLD_ENDS.len() - 1);
        let histogram = series.hold_seconds[slot]
            .get_or_insert_with(|| f.hold_seconds.get_or_create(&hold_labels(labels, how)).clone());
        histogram.observe(held);
    }

    /// Counts a take of the semaphore series `labels`: served, or refused by the rate.
    pub(crate) fn take_answered(&self, labels: &Labels, series: &mut ObjectCounts, taken: bool) {
        let slot = usize::from(!taken);
        let f = &self.semaphore;
        series.takes[slot]
            .get_or_insert_with(|| f.takes.get_or_create(&take_labels(labels, TAKE_RESULTS[slot])).clone())
            .inc();
    }

    /// Sets, at a scrape, what each semaphore's rate would grant now and what each group holds:
    /// `(series labels, rate available, [(group, held)])` per semaphore with a policy and a
    /// series of its own. Group series are rebuilt each time (groups come and go with holds).
    pub(crate) fn set_policy_gauges(&self, policies: Vec<PolicyGauges>) {
        let f = &self.semaphore;
        f.group_held.clear();
        for (labels, available, groups) in policies {
            match available {
                Some(available) => {
                    f.rate_available.get_or_create(&labels).set(available as i64);
                }
                None => {
                    f.rate_available.remove(&labels);
                }
            }
            for (group, held) in groups {
                let mut with = labels.clone();
                with.push(("group".to_owned(), group));
                f.group_held.get_or_create(&with).set(held as i64);
            }
        }
    }

    /// Moves the permits kept out by the lock-delay in the semaphore series `labels`.
    pub(crate) fn delayed_permits(&self, labels: &Labels, delta: i64) {
        self.semaphore.delayed.get_or_create(labels).inc_by(delta);
    }

    /// The gauges of the queue series `labels` (created at zero if new).
    pub(crate) fn queue_series(&self, labels: &Labels) -> QueueSeries {
        let q = &self.queue;
        let with = |key: &str, value: &str| {
            let mut with = labels.clone();
            with.push((key.to_owned(), value.to_owned()));
            with
        };
        QueueSeries {
            items: QUEUE_ITEM_STATES.map(|state| q.items.get_or_create(&with("state", state)).clone()),
            claimers: q.claimers.get_or_create(labels).clone(),
            events: QUEUE_EVENT_KINDS
                .map(|kind| q.events.get_or_create(&with("event", kind.as_str())).clone()),
            claim_wait_seconds: q.claim_wait_seconds.get_or_create(labels).clone(),
            processing_seconds: q.processing_seconds.get_or_create(labels).clone(),
        }
    }

    /// Sets how long the next item to be claimed has waited in the queue series `labels`.
    pub(crate) fn queue_oldest_pending(&self, labels: &Labels, seconds: f64) {
        self.queue.oldest_pending_seconds.get_or_create(labels).set(seconds);
    }

    /// Drops every series of a queue (it was deleted, or the gauges are rebuilt).
    pub(crate) fn forget_queue(&self, labels: &Labels) {
        let q = &self.queue;
        for state in QUEUE_ITEM_STATES {
            let mut with = labels.clone();
            with.push(("state".to_owned(), state.to_owned()));
            q.items.remove(&with);
        }
        for kind in QUEUE_EVENT_KINDS {
            let mut with = labels.clone();
            with.push(("event".to_owned(), kind.as_str().to_owned()));
            q.events.remove(&with);
        }
        q.claimers.remove(labels);
        q.oldest_pending_seconds.remove(labels);
        q.claim_wait_seconds.remove(labels);
        q.processing_seconds.remove(labels);
    }

    /// Counts an election's change of leader.
    pub(crate) fn leader_changed(&self, labels: &Labels) {
        self.election.leader_changes.get_or_create(labels).inc();
    }

    /// The clock-dependent gauges of the series `labels` of an object of `kind` (created if
    /// new), valid until [`Metrics::forget_object`] drops the series.
    pub(crate) fn clock_series(&self, kind: Kind, labels: &Labels) -> ClockGauges {
        let f = self.families(kind);
        ClockGauges {
            oldest_waiter: f.oldest_waiter_seconds.get_or_create(labels).clone(),
            tenure: (kind == Kind::Election).then(|| f.tenure_seconds.get_or_create(labels).clone()),
        }
    }

    /// Records the size of one proposed batch.
    pub(crate) fn observe_batch(&self, commands: usize) {
        self.batch_commands.observe(commands as f64);
    }

    /// Records one wait of the proposer for the next commands of `woken` sessions, of which
    /// `missed` sent none in time.
    pub(crate) fn observe_handoff_wait(&self, woken: usize, missed: usize) {
        self.handoff_waited.inc_by(woken as u64);
        self.handoff_missed.inc_by(missed as u64);
    }

    /// Records one request forwarded to the leader; `seconds` is how long the leader took to
    /// answer it, recorded unless it was a long-poll (whose time is the wait's).
    pub(crate) fn observe_forward(&self, long_poll: bool, seconds: f64) {
        let kind = if long_poll { "long_poll" } else { "request" };
        self.forwards.get_or_create(&vec![("kind".to_owned(), kind.to_owned())]).inc();
        if !long_poll {
            self.forward_seconds.observe(seconds);
        }
    }

    /// Records how long one batch took to commit and apply.
    pub(crate) fn observe_write(&self, seconds: f64) {
        self.write_seconds.observe(seconds);
    }

    /// Counts holds released by `max_hold_ms`.
    pub(crate) fn holds_expired(&self, count: u64) {
        self.holds_expired.inc_by(count);
    }

    /// Counts an accepted connection as open.
    pub(crate) fn connection_opened(&self) {
        self.connections_open.inc();
    }

    /// Counts an open connection as closed.
    pub(crate) fn connection_closed(&self) {
        self.connections_open.dec();
    }

    /// Counts a connection closed without being served, by reason.
    pub(crate) fn connection_refused(&self, reason: &str) {
        self.connections_refused.get_or_create(&vec![("reason".to_owned(), reason.to_owned())]).inc();
    }

    /// Renders every metric in the Prometheus text format.
    pub(crate) fn render(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        // The process figures are unprefixed, as every exporter names them.
        let eof = text.rfind("# EOF").unwrap_or(text.len());
        text.insert_str(eof, &process_metrics());
        text
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// The kinds of peer RPC, as counted in `permit_peer_rpcs_{sent,received}_total{kind}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerRpcKind {
    /// AppendEntries carrying log entries.
    Append,
    /// AppendEntries without entries: a heartbeat or a ReadIndex confirmation.
    Heartbeat,
    /// RequestVote.
    Vote,
    /// InstallSnapshot, one chunk.
    Snapshot,
}

/// One counter per [`PeerRpcKind`], each a series of one labelled family; cloned into the peer
/// network and the peer routes so that counting costs one atomic add, no label lookup.
#[derive(Debug, Clone, Default)]
pub(crate) struct PeerRpcCounts {
    append: Counter,
    heartbeat: Counter,
    vote: Counter,
    snapshot: Counter,
}

impl PeerRpcCounts {
    fn register(registry: &mut Registry, name: &str, help: &str) -> PeerRpcCounts {
        let family = Family::<Labels, Counter>::default();
        registry.register(name, help, family.clone());
        let series = |kind: &str| family.get_or_create(&vec![("kind".to_owned(), kind.to_owned())]).clone();
        PeerRpcCounts {
            append: series("append"),
            heartbeat: series("heartbeat"),
            vote: series("vote"),
            snapshot: series("snapshot"),
        }
    }

    /// Counts one RPC of `kind`.
    pub(crate) fn count(&self, kind: PeerRpcKind) {
        match kind {
            PeerRpcKind::Append => self.append.inc(),
            PeerRpcKind::Heartbeat => self.heartbeat.inc(),
            PeerRpcKind::Vote => self.vote.inc(),
            PeerRpcKind::Snapshot => self.snapshot.inc(),
        };
    }
}

/// A counter registered as `name` (Prometheus adds `_total`).
fn counter(registry: &mut Registry, name: &str, help: &str) -> Counter {
    let counter = Counter::default();
    registry.register(name, help, counter.clone());
    counter
}

fn register_objects(registry: &mut Registry, s: &ObjectFamilies, e: &ObjectFamilies) {
    registry.register("semaphore_capacity", "Capacity per semaphore", s.capacity.clone());
    registry.register("semaphore_held", "Permits held per semaphore", s.held.clone());
    registry.register("semaphore_holders", "Holders per semaphore", s.holders.clone());
    registry.register("semaphore_waiters", "Waiters per semaphore", s.waiters.clone());
    registry.register(
        "semaphore_oldest_waiter_seconds",
        "How long the longest waiter of each semaphore has waited (0 without waiters)",
        s.oldest_waiter_seconds.clone(),
    );
    registry.register(
        "semaphore_grants",
        "Grants per semaphore (at once or from the queue)",
        s.grants.clone(),
    );
    registry.register(
        "semaphore_try_acquire_refusals",
        "Try-acquires (wait_ms 0) refused per semaphore",
        s.try_refusals.clone(),
    );
    registry.register(
        "semaphore_acquire_timeouts",
        "Waiting acquires whose long-poll ended still queued (202) on this node, per semaphore",
        s.timeouts.clone(),
    );
    registry.register(
        "semaphore_expirations",
        "Holds ended by expiry (session TTL or max_hold_ms) per semaphore",
        s.expirations.clone(),
    );
    registry.register(
        "semaphore_wait_seconds",
        "Time from queued to granted (leader time), per semaphore; immediate grants count as 0",
        s.wait_seconds.clone(),
    );
    registry.register(
        "semaphore_hold_seconds",
        "Time from granted to the end of the hold (leader time), per semaphore and how it ended",
        s.hold_seconds.clone(),
    );
    registry.register(
        "semaphore_takes",
        "Takes (POST /v1/semaphores/{name}/take) per semaphore, by result: taken or rate_limited",
        s.takes.clone(),
    );
    registry.register(
        "semaphore_rate_available",
        "Permits the semaphore's rate would grant now (semaphores with a rate; set at each scrape)",
        s.rate_available.clone(),
    );
    registry.register(
        "semaphore_group_held",
        "Permits held per group of each semaphore (label group; set at each scrape)",
        s.group_held.clone(),
    );
    registry.register(
        "semaphore_delayed_permits",
        "Permits of failed holds that the lock-delay keeps out of circulation, per semaphore",
        s.delayed.clone(),
    );
    registry.register("election_has_leader", "1 while the election has a leader", e.holders.clone());
    registry.register("election_candidates", "Candidates queued per election", e.waiters.clone());
    registry.register(
        "election_oldest_candidate_seconds",
        "How long the longest queued candidate of each election has waited",
        e.oldest_waiter_seconds.clone(),
    );
    registry.register(
        "election_leader_changes",
        "Leader changes per election (to a leader or to none)",
        e.leader_changes.clone(),
    );
    registry.register(
        "election_leader_tenure_seconds",
        "How long the current leader of each election has led, as seen by this node (0 without one)",
        e.tenure_seconds.clone(),
    );
    registry.register(
        "election_hold_seconds",
        "Leaderships by how long they lasted and how they ended",
        e.hold_seconds.clone(),
    );
}

/// `process_*` figures of this process from `/proc` (empty where there is none).
fn process_metrics() -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return out };
    // Fields after the command (which may hold spaces), numbered from 3 (state).
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // Clock ticks and page size are 100 and 4096 on Linux on every architecture we build for.
    let cpu = (field(14) + field(15)) / 100.0;
    let threads = field(20);
    let virtual_bytes = field(23);
    let resident_bytes = field(24) * 4096.0;
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines().find_map(|line| line.strip_prefix("btime ").and_then(|v| v.trim().parse::<f64>().ok()))
    });
    let start = boot.map(|boot| boot + field(22) / 100.0);
    let fds = std::fs::read_dir("/proc/self/fd").map(|dir| dir.count()).unwrap_or(0);
    let max_fds = std::fs::read_to_string("/proc/self/limits").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(3)?.parse::<f64>().ok())
    });
    let mut metric = |name: &str, kind: &str, help: &str, value: f64| {
        let family = name.strip_suffix("_total").unwrap_or(name);
        let _ = write!(out, "# HELP {family} {help}\n# TYPE {family} {kind}\n{name} {value}\n");
    };
    metric("process_cpu_seconds_total", "counter", "User and system CPU time spent in seconds.", cpu);
    metric("process_resident_memory_bytes", "gauge", "Resident memory size in bytes.", resident_bytes);
    metric("process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.", virtual_bytes);
    metric("process_threads", "gauge", "Number of OS threads in the process.", threads);
    metric("process_open_fds", "gauge", "Number of open file descriptors.", fds as f64);
    if let Some(max_fds) = max_fds {
        metric("process_max_fds", "gauge", "Maximum number of open file descriptors.", max_fds);
    }
    if let Some(start) = start {
        metric(
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            start,
        );
    }
    out
}
