//! The workloads W1-W4, scale and failover.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::api::Api;
use crate::stats::{coefficient_of_variation, Samples};

/// W1: one client, capacity 4, loop {acquire 1; release}.
pub struct Uncontended {
    pub cycles_per_second: f64,
    pub acquire: Samples,
    pub release: Samples,
}

pub async fn uncontended(url: &str, name: &str, duration: Duration) -> anyhow::Result<Uncontended> {
    let api = Api::new(url);
    api.semaphore(name, 4).await?;
    let session = api.session(60_000).await?;
    let (mut acquire, mut release) = (Samples::default(), Samples::default());
    let started = Instant::now();
    let mut cycles = 0u64;
    while started.elapsed() < duration {
        let t = Instant::now();
        api.acquire(name, &session, 1, 0).await?.context("uncontended acquire refused")?;
        acquire.push(t.elapsed());
        let t = Instant::now();
        api.release(name, &session).await?;
        release.push(t.elapsed());
        cycles += 1;
    }
    Ok(Uncontended { cycles_per_second: cycles as f64 / started.elapsed().as_secs_f64(), acquire, release })
}

/// W2: 32 clients, capacity 4, loop {blocking acquire; release}.
pub struct Contended {
    pub cycles_per_second: f64,
    pub wait: Samples,
    pub fairness_cv: f64,
    pub max_holders_seen: i64,
}

impl Contended {
    /// The figures of one contended run from its clients' tasks, each ending with its cycles and
    /// acquire waits; `max_holders` is the most holders the clients saw at once.
    pub async fn gather(
        tasks: Vec<tokio::task::JoinHandle<anyhow::Result<(u64, Samples)>>>,
        started: Instant,
        max_holders: &AtomicI64,
    ) -> anyhow::Result<Contended> {
        let mut wait = Samples::default();
        let mut per_client = Vec::new();
        for task in tasks {
            let (cycles, samples) = task.await??;
            per_client.push(cycles as f64);
            wait.extend(&samples);
        }
        let total: f64 = per_client.iter().sum();
        Ok(Contended {
            cycles_per_second: total / started.elapsed().as_secs_f64(),
            wait,
            fairness_cv: coefficient_of_variation(&per_client),
            max_holders_seen: max_holders.load(Ordering::SeqCst),
        })
    }
}

pub async fn contended(
    urls: &[String],
    name: &str,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Contended> {
    contended_as(urls, name, clients, duration, false).await
}

/// W2 with clients spread over `urls`; with `follow_leader`, each client first asks its node
/// which node leads (`permit-leader`) and sends everything there when that is one of `urls`, as
/// `permit-client` does with several endpoints.
pub async fn contended_as(
    urls: &[String],
    name: &str,
    clients: usize,
    duration: Duration,
    follow_leader: bool,
) -> anyhow::Result<Contended> {
    let admin = Api::new(&urls[0]);
    admin.semaphore(name, 4).await?;
    let holders = Arc::new(AtomicI64::new(0));
    let max_holders = Arc::new(AtomicI64::new(0));
    let mut apis = Vec::new();
    for i in 0..clients {
        let mut api = Api::new(&urls[i % urls.len()]);
        if follow_leader {
            if let Some(leader) = api.leader_hint().await?.filter(|hint| urls.contains(hint)) {
                api = Api::new(&leader);
            }
        }
        let session = api.session(120_000).await?;
        apis.push((api, session));
    }
    let end = Instant::now() + duration;
    let started = Instant::now();
    let tasks: Vec<_> = apis
        .into_iter()
        .map(|(api, session)| {
            let (holders, max_holders, name) = (holders.clone(), max_holders.clone(), name.to_owned());
            tokio::spawn(async move {
                let mut wait = Samples::default();
                let mut cycles = 0u64;
                while Instant::now() < end {
                    let t = Instant::now();
                    while api.acquire(&name, &session, 1, 30_000).await?.is_none() {}
                    wait.push(t.elapsed());
                    let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    max_holders.fetch_max(now_holding, Ordering::SeqCst);
                    holders.fetch_sub(1, Ordering::SeqCst);
                    api.release(&name, &session).await?;
                    cycles += 1;
                }
                anyhow::Ok((cycles, wait))
            })
        })
        .collect();
    Contended::gather(tasks, started, &max_holders).await
}

/// W3: capacity 1, A holds, B waits, A releases: time from A's release reply to B's grant.
pub async fn handoff(url: &str, name: &str, rounds: usize) -> anyhow::Result<Samples> {
    let (a, b) = (Api::new(url), Api::new(url));
    a.semaphore(name, 1).await?;
    let (sa, sb) = (a.session(60_000).await?, b.session(60_000).await?);
    let observer = Api::new(url);
    let mut samples = Samples::default();
    for _ in 0..rounds {
        a.acquire(name, &sa, 1, 0).await?.context("A acquires")?;
        let waiter = {
            let (b, sb, name) = (b.clone(), sb.clone(), name.to_owned());
            tokio::spawn(async move {
                let token = b.acquire(&name, &sb, 1, 10_000).await;
                (token, Instant::now())
            })
        };
        // Wait until B is queued (not measured).
        let queued = Instant::now() + Duration::from_secs(5);
        loop {
            let view: serde_json::Value =
                observer_get(&observer, &format!("/v1/semaphores/{name}?stale=true")).await?;
            if view["waiters"].as_array().is_some_and(|w| !w.is_empty()) {
                break;
            }
            if Instant::now() > queued {
                bail!("B never queued");
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        a.release(name, &sa).await?;
        let released = Instant::now();
        let (token, granted) = waiter.await?;
        token?.context("B granted")?;
        samples.push(granted.saturating_duration_since(released));
        b.release(name, &sb).await?;
    }
    Ok(samples)
}

async fn observer_get(api: &Api, path: &str) -> anyhow::Result<serde_json::Value> {
    let answer = crate::api_client().get(format!("{}{path}", api.url)).send().await?;
    Ok(answer.json().await?)
}

/// W4: a holder with TTL `ttl` vanishes: time from its last contact (the create's reply) to
/// the waiter's grant.
pub async fn reclaim(url: &str, name: &str, ttl: Duration, trials: usize) -> anyhow::Result<Samples> {
    let api = Api::new(url);
    api.semaphore(name, 1).await?;
    let mut samples = Samples::default();
    for _ in 0..trials {
        let holder = api.session(ttl.as_millis() as u64).await?;
        let last_contact = Instant::now();
        api.acquire(name, &holder, 1, 0).await?.context("holder acquires")?;
        let waiter_api = Api::new(url);
        let waiter = waiter_api.session(60_000).await?;
        while waiter_api.acquire(name, &waiter, 1, 30_000).await?.is_none() {}
        samples.push(last_contact.elapsed());
        waiter_api.release(name, &waiter).await?;
    }
    Ok(samples)
}

/// Creates `count` sessions, each holding 1 permit of semaphore `{prefix}{i % semaphores}`
/// (created large enough), with `clients` concurrent clients. Returns the sessions.
pub async fn populate(
    url: &str,
    prefix: &str,
    count: usize,
    semaphores: usize,
    clients: usize,
) -> anyhow::Result<Vec<String>> {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (url, prefix, next) = (url.to_owned(), prefix.to_owned(), next.clone());
            tokio::spawn(async move {
                let api = Api::new(&url);
                // One client (and kept-alive connection) per task: a client per request made
                // the populate of the `scrape` part reconnect every time.
                let http = crate::api_client();
                let mut sessions = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= count {
                        return anyhow::Ok(sessions);
                    }
                    let session = api.session(86_400_000).await?;
                    let capacity = count.div_ceil(semaphores).max(1);
                    let body = serde_json::json!({ "session": session, "capacity": capacity });
                    let answer = http
                        .post(format!("{url}/v1/semaphores/{prefix}{}/acquire", i % semaphores))
                        .json(&body)
                        .send()
                        .await?;
                    anyhow::ensure!(answer.status().as_u16() == 200, "populate acquire {}", answer.status());
                    sessions.push(session);
                }
            })
        })
        .collect();
    let mut sessions = Vec::with_capacity(count);
    for task in tasks {
        sessions.extend(task.await??);
    }
    Ok(sessions)
}

/// Queues `count` waiters (sessions with 1-permit blocking acquires) on `name`, which is held.
pub async fn queue_waiters(url: &str, name: &str, count: usize, clients: usize) -> anyhow::Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (url, name, next) = (url.to_owned(), name.to_owned(), next.clone());
            tokio::spawn(async move {
                let api = Api::new(&url);
                while (next.fetch_add(1, Ordering::Relaxed) as usize) < count {
                    let session = api.session(86_400_000).await?;
                    anyhow::ensure!(
                        api.acquire(&name, &session, 1, 1).await?.is_none(),
                        "waiter was granted"
                    );
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

/// Leader `kill -9` to the first successful acquire through another node, `trials` times.
pub async fn failover(nodes: &mut [crate::server::ServerProcess], trials: usize) -> anyhow::Result<Samples> {
    let http = crate::api_client();
    let mut samples = Samples::default();
    for trial in 0..trials {
        let leader = crate::server::leader(&http, nodes, Duration::from_secs(20)).await?;
        let other = (leader + 1) % nodes.len();
        let api = Api::new(&nodes[other].url);
        let session = api.session(60_000).await?;
        let name = format!("failover{trial}");
        api.semaphore(&name, 1).await?;
        let killed = Instant::now();
        nodes[leader].kill();
        loop {
            if let Ok(Some(_)) = api.acquire(&name, &session, 1, 0).await {
                break;
            }
            anyhow::ensure!(killed.elapsed() < Duration::from_secs(30), "no failover within 30 s");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        samples.push(killed.elapsed());
        nodes[leader].restart()?;
        // Let the restarted node catch up before the next trial.
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    Ok(samples)
}
