//! The `snap` part: W1 acquires while the node takes snapshots of a large state.
//!
//! A node started with a low `--snapshot-logs` is populated with `n` sessions, then one client
//! runs W1 while a monitor polls `/v1/health` every 5 ms. A snapshot's window opens at the
//! first poll that sees the applied index reach the next snapshot's index (openraft starts
//! building right after that apply) and closes at the first poll that sees `snapshot_index`
//! move; an acquire that overlaps a window counts as "during a snapshot", the others as
//! "outside". The monitor polls `/v1/health`, not `/metrics`: at this shape (1 000 semaphores
//! with series of their own) a render takes milliseconds of a core, and polling it that often
//! would make the tail it measures its own.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::api::Api;
use crate::stats::Samples;

/// What the `snap` part measured.
pub struct SnapshotStall {
    /// Acquires that overlapped a snapshot window.
    pub during: Samples,
    /// Acquires that did not.
    pub outside: Samples,
    /// Windows seen, as (opened, closed) offsets from the start.
    pub windows: Vec<Duration>,
    /// Acquire cycles per second over the whole run.
    pub cycles_per_second: f64,
}

/// Semaphores the `snap` part's sessions hold permits of (the `big` part's shape).
const SEMAPHORES: usize = 1000;

/// Creates `count` sessions, each holding one permit of one of [`SEMAPHORES`] semaphores, with
/// `clients` concurrent kept-alive clients. Holds matter: a session's hold names its semaphore,
/// which the snapshot encodes per session, and the semaphores encode their holders; 1 M bare
/// sessions encode in tens of milliseconds and hide the stall this part is about.
pub async fn sessions(url: &str, count: usize, clients: usize) -> anyhow::Result<()> {
    let admin = Api::new(url);
    for i in 0..SEMAPHORES {
        admin.semaphore(&format!("snap-{i}"), count.div_ceil(SEMAPHORES) as u64).await?;
    }
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (url, next) = (url.to_owned(), next.clone());
            tokio::spawn(async move {
                let api = Api::new(&url);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= count {
                        break;
                    }
                    let session = api.session(86_400_000).await?;
                    let name = format!("snap-{}", i % SEMAPHORES);
                    api.acquire(&name, &session, 1, 0).await?.context("populate acquire refused")?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    Ok(())
}

/// One poll of `/v1/health`: (sent at, answered at, applied index, snapshot index).
type Poll = (Instant, Instant, u64, u64);

/// Runs W1 on `url` for `duration` while polling its health report; classifies every acquire.
pub async fn stall(url: &str, duration: Duration) -> anyhow::Result<SnapshotStall> {
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let (url, stop) = (url.to_owned(), stop.clone());
        tokio::spawn(async move {
            let http = crate::api_client();
            let mut polls: Vec<Poll> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                let body: serde_json::Value =
                    http.get(format!("{url}/v1/health")).send().await?.json().await?;
                let answered = Instant::now();
                let index =
                    |field: &str| body[field].as_u64().with_context(|| format!("health without {field}"));
                let (applied, snapshot) = (index("applied_index")?, index("snapshot_index")?);
                polls.push((sent, answered, applied, snapshot));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            anyhow::Ok(polls)
        })
    };
    let api = Api::new(url);
    let name = "snap-w1";
    api.semaphore(name, 4).await?;
    let session = api.session(600_000).await?;
    let mut spans = Vec::new();
    let started = Instant::now();
    while started.elapsed() < duration {
        let t = Instant::now();
        api.acquire(name, &session, 1, 0).await?.context("uncontended acquire refused")?;
        spans.push((t, Instant::now()));
        api.release(name, &session).await?;
    }
    let cycles_per_second = spans.len() as f64 / started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let polls = monitor.await??;
    // A window opens when the poll before the first one that saw the new snapshot's index
    // applied was sent (the build started after that poll read a lower index: wide by one
    // poll interval at most) and closes when the first poll showing the snapshot answered.
    let mut windows = Vec::new();
    let mut last_snapshot = polls.first().map_or(0, |p| p.3);
    for (i, poll) in polls.iter().enumerate() {
        if poll.3 != last_snapshot {
            let index = poll.3;
            let opened = polls[..i].iter().rev().find(|p| p.2 < index).map_or(started, |p| p.0);
            windows.push((opened, poll.1));
            last_snapshot = index;
        }
    }
    let (mut during, mut outside) = (Samples::default(), Samples::default());
    for (start, end) in &spans {
        let overlaps = windows.iter().any(|(open, close)| start < close && end > open);
        if overlaps {
            during.push(*end - *start);
        } else {
            outside.push(*end - *start);
        }
    }
    let windows = windows.iter().map(|(open, close)| *close - *open).collect();
    Ok(SnapshotStall { during, outside, windows, cycles_per_second })
}
