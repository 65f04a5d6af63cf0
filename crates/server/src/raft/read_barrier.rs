//! Batched ReadIndex: one quorum round in flight per node, shared by every linearizable read and
//! keepalive that arrived before it started (etcd's read-index batching).
//!
//! A caller may only use a round that *started after it arrived*: a round already in flight may
//! have read the commit index before the caller's request, so it waits for the next one. Rounds
//! run back to back on a spawned task while callers want them, so that a caller that gives up
//! (its HTTP request is dropped) never strands the others.

use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::raft::proposer::ProposeError;

/// The round counter and the callers waiting.
#[derive(Debug)]
pub struct ReadBarrier {
    rounds: Mutex<Rounds>,
}

#[derive(Debug, Default)]
struct Rounds {
    /// Rounds started so far.
    started: u64,
    /// The highest round a caller waits for.
    wanted: u64,
    /// Whether the task that runs rounds is alive.
    running: bool,
    /// The callers waiting, in arrival order, each with the round it needs. They are answered
    /// in that order (a `watch` channel would wake them in an order drawn from tokio's RNG, and
    /// a simulation's seed would not replay).
    waiting: Vec<(u64, oneshot::Sender<Result<(), ProposeError>>)>,
}

impl ReadBarrier {
    /// A barrier with no round run yet.
    pub fn new() -> Arc<ReadBarrier> {
        Arc::new(ReadBarrier { rounds: Mutex::new(Rounds::default()) })
    }

    /// Waits for a round that started after this call and returns its result; starts the task
    /// that runs rounds (with `confirm`, one quorum round) if none is running.
    ///
    /// # Errors
    /// The round's error.
    pub async fn wait<F, Fut>(self: &Arc<ReadBarrier>, confirm: F) -> Result<(), ProposeError>
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), ProposeError>> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut rounds = self.rounds.lock().expect("read barrier lock");
            let round = rounds.started + 1;
            rounds.wanted = rounds.wanted.max(round);
            rounds.waiting.push((round, tx));
            let start = !rounds.running;
            rounds.running = true;
            start
        };
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
                rounds.started += 1;
                rounds.started
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
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    /// A round that takes 10 ms and records when it started.
    fn slow_round(
        started: Arc<Mutex<Vec<tokio::time::Instant>>>,
        count: Arc<AtomicU64>,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), ProposeError>> + Send>>
           + Send
           + Sync
           + 'static {
        move || {
            let (started, count) = (started.clone(), count.clone());
            Box::pin(async move {
                started.lock().unwrap().push(tokio::time::Instant::now());
                count.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                Ok(())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_callers_share_rounds_and_each_uses_one_that_started_after_it_arrived() {
        let barrier = ReadBarrier::new();
        let starts = Arc::new(Mutex::new(Vec::new()));
        let count = Arc::new(AtomicU64::new(0));
        let mut callers = Vec::new();
        for i in 0..100u64 {
            let (barrier, starts, count) = (barrier.clone(), starts.clone(), count.clone());
            callers.push(tokio::spawn(async move {
                // Arrivals spread over 50 ms: five rounds' worth.
                tokio::time::sleep(Duration::from_micros(500 * i)).await;
                let arrived = tokio::time::Instant::now();
                barrier.wait(slow_round(starts.clone(), count)).await.unwrap();
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
        let rounds = count.load(Ordering::SeqCst);
        assert!((2..=10).contains(&rounds), "100 callers over 50 ms shared {rounds} rounds of 10 ms");
    }

    #[tokio::test(start_paused = true)]
    async fn an_error_reaches_every_caller_of_the_round_and_the_next_round_runs_again() {
        let barrier = ReadBarrier::new();
        let fail = || async { Err(ProposeError::NotLeader { leader: None }) };
        assert!(matches!(barrier.wait(fail).await, Err(ProposeError::NotLeader { .. })));
        assert!(barrier.wait(|| async { Ok(()) }).await.is_ok());
    }
}
