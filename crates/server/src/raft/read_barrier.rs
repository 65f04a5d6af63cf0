//! Batched ReadIndex: one quorum round in flight per node, shared by every linearizable read and
//! keepalive that arrived before it started (etcd's read-index batching).
//!
//! A caller may only use a round that *started after it arrived*: a round already in flight may
//! have read the commit index before the caller's request, so it waits for the next one. Rounds
//! run back to back on a spawned task while callers want them, so that a caller that gives up
//! (its HTTP request is dropped) never strands the others.
//!
//! Keepalives are [`Urgency::Lazy`]: a round wanted only by them starts at least
//! [`LAZY_ROUND_SPACING`] after the previous one started. Each round costs the leader a
//! heartbeat RPC per follower; back to back they would run as often as the round trip allows, under
//! any keepalive load, most of a busy leader's CPU beyond the requests themselves. A keepalive
//! then waits up to that much longer, against a TTL of seconds, and its
//! round still starts after it arrived. A linearizable read is [`Urgency::Now`]: its arrival
//! cuts the spacing short.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, Notify};
use tokio::time::{Duration, Instant};

use crate::raft::proposer::ProposeError;

/// Least time between the starts of two rounds that only [`Urgency::Lazy`] callers want.
pub(crate) const LAZY_ROUND_SPACING: Duration = Duration::from_millis(2);

/// How soon a caller needs its round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Urgency {
    /// As soon as possible: a linearizable read.
    Now,
    /// Within [`LAZY_ROUND_SPACING`] of the previous round's start: a keepalive.
    Lazy,
}

/// The round counter and the callers waiting.
#[derive(Debug)]
pub(crate) struct ReadBarrier {
    rounds: Mutex<Rounds>,
    /// Signalled when an [`Urgency::Now`] caller arrives, to end a lazy round's spacing.
    urgent: Notify,
}

#[derive(Debug, Default)]
struct Rounds {
    /// Rounds started so far.
    started: u64,
    /// The highest round a caller waits for.
    wanted: u64,
    /// The highest round an [`Urgency::Now`] caller waits for.
    wanted_now: u64,
    /// When the last round started.
    last_start: Option<Instant>,
    /// Whether the task that runs rounds is alive.
    running: bool,
    /// The callers waiting, in arrival order, each with the round it needs. They are answered
    /// in that order (a `watch` channel would wake them in an order drawn from tokio's RNG, and
    /// a simulation's seed would not replay).
    waiting: Vec<(u64, oneshot::Sender<Result<(), ProposeError>>)>,
}

impl ReadBarrier {
    /// A barrier with no round run yet.
    pub(crate) fn new() -> Arc<ReadBarrier> {
        Arc::new(ReadBarrier { rounds: Mutex::new(Rounds::default()), urgent: Notify::new() })
    }

    /// Waits for a round that started after this call and returns its result; starts the task
    /// that runs rounds (with `confirm`, one quorum round) if none is running.
    ///
    /// # Errors
    /// The round's error.
    pub(crate) async fn wait<F, Fut>(
        self: &Arc<ReadBarrier>,
        urgency: Urgency,
        confirm: F,
    ) -> Result<(), ProposeError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ProposeError>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut rounds = self.rounds.lock().expect("read barrier lock");
            let round = rounds.started + 1;
            rounds.wanted = rounds.wanted.max(round);
            if urgency == Urgency::Now {
                rounds.wanted_now = rounds.wanted_now.max(round);
            }
            rounds.waiting.push((round, tx));
            let start = !rounds.running;
            rounds.running = true;
            start
        };
        if urgency == Urgency::Now {
            self.urgent.notify_one();
        }
        if start {
            tokio::spawn(self.clone().run(confirm));
        }
        rx.await.unwrap_or(Err(ProposeError::ShuttingDown))
    }

    /// Runs rounds back to back while a caller waits for one not yet started.
    async fn run<F, Fut>(self: Arc<ReadBarrier>, confirm: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ProposeError>> + Send + 'static,
    {
        loop {
            let round = {
                let mut rounds = self.rounds.lock().expect("read barrier lock");
                if rounds.started >= rounds.wanted {
                    rounds.running = false;
                    return;
                }
                let next = rounds.started + 1;
                let spaced_until = rounds.last_start.map(|last| last + LAZY_ROUND_SPACING);
                match spaced_until {
                    Some(until) if rounds.wanted_now < next && Instant::now() < until => Err(until),
                    _ => {
                        rounds.started = next;
                        rounds.last_start = Some(Instant::now());
                        Ok(next)
                    }
                }
            };
            let round = match round {
                Ok(round) => round,
                Err(until) => {
                    // Only keepalives want the next round: space it, unless a read arrives.
                    let _ = tokio::time::timeout_at(until, self.urgent.notified()).await;
                    continue;
                }
            };
            let result = confirm().await;
            let answered: Vec<_> = {
                let mut rounds = self.rounds.lock().expect("read barrier lock");
                let (done, later) =
                    std::mem::take(&mut rounds.waiting).into_iter().partition(|(r, _)| *r <= round);
                rounds.waiting = later;
                done
            };
            for (_, caller) in answered {
                // A caller that gave up dropped its receiver; the others are answered anyway.
                let _ = caller.send(result.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A round that takes `length` and records when it started.
    fn round(
        started: Arc<Mutex<Vec<tokio::time::Instant>>>,
        length: Duration,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), ProposeError>> + Send>>
           + Send
           + Sync
           + 'static {
        move || {
            let started = started.clone();
            Box::pin(async move {
                started.lock().unwrap().push(tokio::time::Instant::now());
                tokio::time::sleep(length).await;
                Ok(())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_rounds_and_each_uses_one_that_started_after_it_arrived() {
        let barrier = ReadBarrier::new();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let mut callers = Vec::new();
        for i in 0..100u64 {
            let (barrier, starts) = (barrier.clone(), starts.clone());
            callers.push(tokio::spawn(async move {
                // Arrivals spread over 50 ms: five rounds' worth.
                tokio::time::sleep(Duration::from_micros(500 * i)).await;
                let arrived = tokio::time::Instant::now();
                barrier.wait(Urgency::Now, round(starts.clone(), Duration::from_millis(10))).await.unwrap();
                let starts = starts.lock().unwrap();
                // Some round started at or after the arrival and has completed (10 ms later).
                assert!(
                    starts.iter().any(|start| *start >= arrived),
                    "no round started after the caller arrived"
                );
            }));
        }
        for caller in callers {
            caller.await.unwrap();
        }
        let rounds = starts.lock().unwrap().len();
        assert!((2..=10).contains(&rounds), "100 callers over 50 ms shared {rounds} rounds of 10 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn rounds_wanted_only_by_keepalives_are_spaced_and_a_read_cuts_the_spacing_short() {
        let barrier = ReadBarrier::new();
        let starts = Arc::new(Mutex::new(Vec::new()));
        // 200 keepalives arriving every 0.1 ms for 20 ms: back to back, rounds of 0.5 ms would
        // run about 40 times; spaced, at most one per LAZY_ROUND_SPACING (2 ms).
        let mut callers = Vec::new();
        for i in 0..200u64 {
            let (barrier, starts) = (barrier.clone(), starts.clone());
            callers.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_micros(100 * i)).await;
                let arrived = tokio::time::Instant::now();
                barrier.wait(Urgency::Lazy, round(starts.clone(), Duration::from_micros(500))).await.unwrap();
                let starts = starts.lock().unwrap();
                assert!(
                    starts.iter().any(|start| *start >= arrived),
                    "no round started after the keepalive arrived"
                );
                tokio::time::Instant::now() - arrived
            }));
        }
        let mut slowest = Duration::ZERO;
        for caller in callers {
            slowest = slowest.max(caller.await.unwrap());
        }
        let lazy = starts.lock().unwrap().clone();
        assert!((9..=12).contains(&lazy.len()), "{} rounds for 20 ms of keepalives", lazy.len());
        for pair in lazy.windows(2) {
            assert!(pair[1] - pair[0] >= LAZY_ROUND_SPACING, "rounds {:?} apart", pair[1] - pair[0]);
        }
        assert!(
            slowest <= 2 * LAZY_ROUND_SPACING + Duration::from_millis(1),
            "a keepalive waited {slowest:?}"
        );

        // A keepalive's round (instant here) starts at t; a second keepalive at t + 1 ms has
        // its round spaced to t + 2 ms; a read arriving at t + 1.3 ms gets that round at once,
        // and it serves the second keepalive too. (The paused clock is advanced by hand: tokio's
        // timers have a 1 ms tick.)
        starts.lock().unwrap().clear();
        tokio::time::sleep(Duration::from_millis(10)).await;
        let instant = Duration::ZERO;
        barrier.wait(Urgency::Lazy, round(starts.clone(), instant)).await.unwrap();
        tokio::time::advance(Duration::from_millis(1)).await;
        let second = {
            let (barrier, starts) = (barrier.clone(), starts.clone());
            tokio::spawn(async move { barrier.wait(Urgency::Lazy, round(starts, instant)).await })
        };
        tokio::time::advance(Duration::from_micros(300)).await;
        let read_arrived = tokio::time::Instant::now();
        barrier.wait(Urgency::Now, round(starts.clone(), instant)).await.unwrap();
        second.await.unwrap().unwrap();
        let rounds = starts.lock().unwrap().clone();
        assert_eq!(rounds.len(), 2, "the read's round also served the second keepalive");
        assert_eq!(rounds[1], read_arrived, "the read's round waited for the spacing");
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_reaches_every_caller_of_the_round_and_the_next_round_runs_again() {
        let barrier = ReadBarrier::new();
        let fail = || async { Err(ProposeError::NotLeader { leader: None }) };
        assert!(matches!(barrier.wait(Urgency::Now, fail).await, Err(ProposeError::NotLeader { .. })));
        assert!(barrier.wait(Urgency::Lazy, || async { Ok(()) }).await.is_ok());
    }
}
