//! The rate-limit workloads (issue 33): T1, `POST /v1/semaphores/{name}/take` throughput and
//! latency from [`CLIENTS`] clients on a semaphore whose rate never binds, against Redis
//! running the usual GCRA script (`redis.rs`); and the accuracy of a rate that binds.
//!
//! - T1: each client takes one permit after another, for the run's duration: takes answered per
//!   second, and each take's latency. Nothing may be refused: the rate ([`OPEN_RATE`]) is far
//!   above what any run reaches, so the figure is the cost of a take, not of the limit.
//! - Accuracy: [`CLIENTS`] clients take as fast as they can (a refused take is sent again at
//!   once) at [`ACCURACY_RATE`] for `--accuracy-secs`. The grants counted must be within 1 % of
//!   `burst + rate × T`, T from the first request sent to the last answer; and no grant may come
//!   early: for every pair of grants in token order (the leader's order, whose clock never goes
//!   back), the grants between them must fit in `burst + rate × D`, D the longest the leader's
//!   time between them can have been (the second's answer less the first's request, plus the
//!   millisecond the leader's clock counts in).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::json;

use crate::api::Api;
use crate::redis::Gcra;
use crate::stats::Samples;
use crate::tasks::join;

/// Clients of T1 and of the accuracy run, each with a connection of its own.
pub const CLIENTS: usize = 32;

/// A rate: `permits` per `per_ms`, at most `burst` at once.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub permits: u64,
    pub per_ms: u64,
    pub burst: u64,
}

impl Rate {
    /// Permits per millisecond.
    fn per_ms_rate(&self) -> f64 {
        self.permits as f64 / self.per_ms as f64
    }

    /// The most grants the rate allows over a window of `window`: `burst + rate × window`.
    pub fn allowed(&self, window: Duration) -> f64 {
        self.burst as f64 + self.per_ms_rate() * window.as_secs_f64() * 1e3
    }
}

/// T1's rate: a million permits a second, a million at once; no run comes near it (the HTTP
/// floor of a machine is some 10^5 requests a second). The same limits on both sides.
pub const OPEN_RATE: Rate = Rate { permits: 1_000_000, per_ms: 1_000, burst: 1_000_000 };

/// The accuracy run's rate: 100 a second, 10 at once.
pub const ACCURACY_RATE: Rate = Rate { permits: 100, per_ms: 1_000, burst: 10 };

/// Where T1 runs.
pub enum Target {
    /// A Permit node (a cluster's leader): its URL.
    Permit(String),
    /// `redis-server`: `host:port`.
    Redis(String),
}

/// One T1 run.
pub struct TakeRun {
    /// Takes answered (all granted) per second.
    pub per_second: f64,
    /// Each take's latency.
    pub latency: Samples,
}

/// The answer to one take.
enum Took {
    Taken { token: u64 },
    Limited,
}

/// `PUT /v1/semaphores/{name}` with `rate`; checks that the answer shows it (a server without
/// rates refuses the field).
pub async fn put_rated(api: &Api, name: &str, rate: Rate) -> anyhow::Result<()> {
    let body = json!({
        "capacity": 1,
        "rate": { "permits": rate.permits, "per_ms": rate.per_ms, "burst": rate.burst },
    });
    let (status, answer) = api.request_json("PUT", &format!("/v1/semaphores/{name}"), Some(body)).await?;
    anyhow::ensure!((200..300).contains(&status), "put semaphore {name} with a rate: {status} {answer}");
    anyhow::ensure!(
        answer["rate"]["permits"].as_u64() == Some(rate.permits)
            && answer["rate"]["burst"].as_u64() == Some(rate.burst),
        "semaphore {name} does not show the rate it was given: {answer}"
    );
    Ok(())
}

/// One take of one permit, answered at once.
async fn take(api: &Api, path: &str) -> anyhow::Result<Took> {
    let (status, answer) =
        api.request_json("POST", path, Some(json!({ "permits": 1, "wait_ms": 0 }))).await?;
    match status {
        200 => {
            Ok(Took::Taken { token: answer["token"].as_u64().context("a take answered without a token")? })
        }
        429 if answer["error"]["code"] == "rate_limited" => Ok(Took::Limited),
        _ => bail!("take: {status} {answer}"),
    }
}

/// One client's connection in T1.
enum Client {
    Permit { api: Api, path: String },
    Redis(Gcra),
}

impl Client {
    /// One take that must be granted; a Permit take's token must exceed the client's last.
    async fn take(&mut self, last_token: &mut u64) -> anyhow::Result<()> {
        match self {
            Client::Permit { api, path } => match take(api, path).await? {
                Took::Taken { token } => {
                    anyhow::ensure!(token > *last_token, "take token {token} after {last_token}");
                    *last_token = token;
                    Ok(())
                }
                Took::Limited => bail!("the rate bound: a take was refused (it must never bind in T1)"),
            },
            Client::Redis(gcra) => {
                anyhow::ensure!(
                    gcra.take().await?,
                    "the GCRA limiter refused a request (it must never bind in T1)"
                );
                Ok(())
            }
        }
    }
}

/// T1 on `target`, on a new semaphore (or limiter key) `name` with [`OPEN_RATE`], for `duration`.
pub async fn throughput(target: &Target, name: &str, duration: Duration) -> anyhow::Result<TakeRun> {
    let mut clients = Vec::with_capacity(CLIENTS);
    match target {
        Target::Permit(url) => {
            put_rated(&Api::new(url), name, OPEN_RATE).await?;
            for _ in 0..CLIENTS {
                clients
                    .push(Client::Permit { api: Api::new(url), path: format!("/v1/semaphores/{name}/take") });
            }
        }
        Target::Redis(addr) => {
            let period = Duration::from_millis(OPEN_RATE.per_ms);
            for _ in 0..CLIENTS {
                clients.push(Client::Redis(
                    Gcra::open(addr, name, OPEN_RATE.permits, period, OPEN_RATE.burst).await?,
                ));
            }
        }
    }
    let started = Instant::now();
    let end = started + duration;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                let mut latency = Samples::default();
                let mut last_token = 0;
                while Instant::now() < end {
                    let sent = Instant::now();
                    client.take(&mut last_token).await?;
                    latency.push(sent.elapsed());
                }
                anyhow::Ok(latency)
            })
        })
        .collect();
    let mut latency = Samples::default();
    for task in tasks {
        latency.extend(&join(task, "take").await?);
    }
    let elapsed = started.elapsed().as_secs_f64();
    Ok(TakeRun { per_second: latency.len() as f64 / elapsed, latency })
}

/// One accuracy run.
pub struct Accuracy {
    /// Takes granted.
    pub granted: u64,
    /// Takes refused (`rate_limited`).
    pub refused: u64,
    /// From the first request sent to the last answer.
    pub window: Duration,
    /// `burst + rate × window`.
    pub expected: f64,
    /// The largest excess of grants over what the rate allows in any window between two grants
    /// (negative: every window within the rate).
    pub worst_excess: f64,
    /// Pairs of grants with more grants between them than the rate allows.
    pub early: u64,
}

/// A grant seen by a client: its token, when its request was sent and when it was answered.
#[derive(Clone, Copy)]
struct Grant {
    token: u64,
    sent: Instant,
    answered: Instant,
}

/// The accuracy run on `url`, on a new semaphore `name` with `rate`, for `duration`.
pub async fn accuracy(url: &str, name: &str, rate: Rate, duration: Duration) -> anyhow::Result<Accuracy> {
    put_rated(&Api::new(url), name, rate).await?;
    let path: Arc<str> = Arc::from(format!("/v1/semaphores/{name}/take"));
    let apis: Vec<Api> = (0..CLIENTS).map(|_| Api::new(url)).collect();
    let started = Instant::now();
    let end = started + duration;
    let tasks: Vec<_> = apis
        .into_iter()
        .map(|api| {
            let path = path.clone();
            tokio::spawn(async move {
                let (mut grants, mut refused) = (Vec::new(), 0u64);
                while Instant::now() < end {
                    let sent = Instant::now();
                    match take(&api, &path).await? {
                        Took::Taken { token } => grants.push(Grant { token, sent, answered: Instant::now() }),
                        Took::Limited => refused += 1,
                    }
                }
                anyhow::Ok((grants, refused, Instant::now()))
            })
        })
        .collect();
    let (mut grants, mut refused, mut last) = (Vec::new(), 0, started);
    for task in tasks {
        let (some, refusals, done) = join(task, "take").await?;
        grants.extend(some);
        refused += refusals;
        last = last.max(done);
    }
    let window = last - started;
    grants.sort_by_key(|grant| grant.token);
    anyhow::ensure!(grants.windows(2).all(|pair| pair[0].token < pair[1].token), "two takes with one token");
    let (worst_excess, early) = early_grants(&grants, rate);
    Ok(Accuracy {
        granted: grants.len() as u64,
        refused,
        window,
        expected: rate.allowed(window),
        worst_excess,
        early,
    })
}

/// The leader's clock counts whole milliseconds: a window on it may read up to this much longer
/// than the real time it spans.
const LEADER_CLOCK_GRAIN: Duration = Duration::from_millis(1);

/// Over every pair of `grants` (in token order, the leader's), the largest excess of the grants
/// from the first to the second over what `rate` allows in the longest time the leader can have
/// seen between them, and how many pairs exceed it. Sound: a server that keeps the rate never
/// exceeds it here; an early grant by more than a round trip's worth of the rate always does.
fn early_grants(grants: &[Grant], rate: Rate) -> (f64, u64) {
    let (mut worst, mut early) = (f64::NEG_INFINITY, 0);
    for (i, first) in grants.iter().enumerate() {
        for (n, last) in grants[i..].iter().enumerate() {
            let longest = last.answered.saturating_duration_since(first.sent) + LEADER_CLOCK_GRAIN;
            let excess = (n + 1) as f64 - rate.allowed(longest);
            worst = worst.max(excess);
            if excess > 1e-9 {
                early += 1;
            }
        }
    }
    (worst, early)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(times_ms: &[(u64, u64)]) -> Vec<Grant> {
        let zero = Instant::now();
        times_ms
            .iter()
            .enumerate()
            .map(|(i, &(sent, answered))| Grant {
                token: i as u64 + 1,
                sent: zero + Duration::from_millis(sent),
                answered: zero + Duration::from_millis(answered),
            })
            .collect()
    }

    #[test]
    fn grants_at_the_rate_are_not_early_and_one_more_is() {
        let rate = Rate { permits: 100, per_ms: 1_000, burst: 2 };
        // The burst at once, then one every 10 ms: exactly the rate.
        let mut at: Vec<(u64, u64)> = vec![(0, 1), (0, 1)];
        at.extend((1..50).map(|k| (k * 10, k * 10 + 1)));
        let (worst, early) = early_grants(&grants(&at), rate);
        assert_eq!(early, 0, "worst excess {worst}");
        assert!(worst <= 0.0);
        // A third grant in the burst's millisecond is early.
        at.insert(2, (0, 1));
        let (worst, early) = early_grants(&grants(&at), rate);
        assert!(early > 0 && worst > 0.5, "{early} early, worst {worst}");
    }

    #[test]
    fn the_allowed_count_grows_with_the_window() {
        assert_eq!(ACCURACY_RATE.allowed(Duration::from_secs(60)), 10.0 + 6000.0);
        assert_eq!(OPEN_RATE.allowed(Duration::ZERO), 1_000_000.0);
    }
}
