//! The `auth` part: what `--auth` costs on W1 and W2, and whether a flood of session creations
//! from one token moves another token's W1 latency.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::api::{set_auth_token, Api};
use crate::server::ServerProcess;
use crate::stats::median;
use crate::workloads;

/// The root secret of the benchmark's `--auth` server.
const ROOT: &str = "permit-bench-root-secret-0123456789abcdef";
/// Clients flooding session creations from one token.
const FLOOD_CLIENTS: usize = 32;

/// The figures of the part, medians over the runs.
pub struct AuthCost {
    pub w1_plain_p50: f64,
    pub w1_auth_p50: f64,
    pub w2_plain_rate: f64,
    pub w2_auth_rate: f64,
    pub w1_flooded_p50: f64,
    pub flood_requests_per_second: f64,
}

/// Runs W1 and W2 on a plain server and on an `--auth` server in alternation, then W1 of one
/// token while 32 clients of another token create sessions as fast as they can.
pub async fn measure(
    bin: &std::path::Path,
    dir: &std::path::Path,
    runs: usize,
    duration: Duration,
) -> anyhow::Result<AuthCost> {
    let plain = ServerProcess::start(bin, "127.0.0.1:0", &dir.join("plain"), &[])?;
    let root_file = dir.join("root.secret");
    std::fs::write(&root_file, ROOT)?;
    let args = ["--auth".to_owned(), "--root-token-file".to_owned(), root_file.display().to_string()];
    let secured = ServerProcess::start(bin, "127.0.0.1:0", &dir.join("auth"), &args)?;
    let root = wait_for_root(&secured.url).await?;
    let victim = create_token(&root, "victim").await?;
    let flooder = create_token(&root, "flooder").await?;
    let (mut w1_plain, mut w1_auth, mut w2_plain, mut w2_auth, mut flooded, mut flood_rate) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for run in 0..runs {
        set_auth_token(None);
        w1_plain
            .push(workloads::uncontended(&plain.url, &format!("a1-{run}"), duration).await?.acquire.p50());
        set_auth_token(Some(victim.clone()));
        w1_auth
            .push(workloads::uncontended(&secured.url, &format!("a1-{run}"), duration).await?.acquire.p50());
        set_auth_token(None);
        let plain_urls = [plain.url.clone()];
        w2_plain.push(
            workloads::contended(&plain_urls, &format!("a2-{run}"), 32, duration).await?.cycles_per_second,
        );
        set_auth_token(Some(victim.clone()));
        let secured_urls = [secured.url.clone()];
        w2_auth.push(
            workloads::contended(&secured_urls, &format!("a2-{run}"), 32, duration).await?.cycles_per_second,
        );
        let (p50, rate) = flooded_w1(&secured.url, &victim, &flooder, &format!("af-{run}"), duration).await?;
        flooded.push(p50);
        flood_rate.push(rate);
    }
    set_auth_token(None);
    Ok(AuthCost {
        w1_plain_p50: median(&w1_plain),
        w1_auth_p50: median(&w1_auth),
        w2_plain_rate: median(&w2_plain),
        w2_auth_rate: median(&w2_auth),
        w1_flooded_p50: median(&flooded),
        flood_requests_per_second: median(&flood_rate),
    })
}

async fn wait_for_root(url: &str) -> anyhow::Result<Api> {
    set_auth_token(Some(ROOT.to_owned()));
    let root = Api::new(url);
    set_auth_token(None);
    for _ in 0..100 {
        if root.get_status("/v1/acl/tokens/self").await? == 200 {
            return Ok(root);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    anyhow::bail!("the root token was not created within 10 s")
}

async fn create_token(root: &Api, name: &str) -> anyhow::Result<String> {
    let rules = json!([
        { "resource": "semaphore", "prefix": "", "access": "admin" },
        { "resource": "session", "prefix": "", "access": "write" },
    ]);
    let (status, body) = root.post_json("/v1/acl/tokens", json!({ "name": name, "rules": rules })).await?;
    anyhow::ensure!(status == 201, "create token: {status} {body}");
    Ok(body["secret"].as_str().context("secret")?.to_owned())
}

/// W1 of `victim` while [`FLOOD_CLIENTS`] clients of `flooder` create sessions in a loop (they
/// reach the per-token cap and are then refused with 429). Returns the W1 acquire p50 and the
/// flood's requests per second.
async fn flooded_w1(
    url: &str,
    victim: &str,
    flooder: &str,
    name: &str,
    duration: Duration,
) -> anyhow::Result<(f64, f64)> {
    set_auth_token(Some(flooder.to_owned()));
    let apis: Vec<Api> = (0..FLOOD_CLIENTS).map(|_| Api::new(url)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let started = std::time::Instant::now();
    let tasks: Vec<_> = apis
        .into_iter()
        .map(|api| {
            let (stop, sent) = (stop.clone(), sent.clone());
            tokio::spawn(async move {
                // Bounded by the stop flag and by a count, whichever comes first.
                for _ in 0..10_000_000u64 {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let _ = api.post_json("/v1/sessions", json!({ "ttl_ms": 2000 })).await;
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    set_auth_token(Some(victim.to_owned()));
    let w1 = workloads::uncontended(url, name, duration).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        let _ = task.await;
    }
    let rate = sent.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64();
    Ok((w1?.acquire.p50(), rate))
}
