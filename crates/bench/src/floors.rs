//! The machine's floors, measured in the same run: an HTTP/1.1 keep-alive round trip through
//! the same stack (axum server in its own process, the client `--client` names), and an fdatasync of a 4 KiB
//! append on the data disk.

use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::stats::Samples;

/// Serves `POST /floor` with a small JSON answer, like an acquire's; prints its address. For
/// the `keepalive` part's floor it also answers `POST /v1/sessions` (a fresh id) and `POST
/// /v1/sessions/{id}/keepalive` and `POST /v1/sessions/keepalive` (renewing every id) as Permit
/// does, without doing anything.
pub fn serve_floor() -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let ids = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let app = axum::Router::new()
            .route(
                "/floor",
                axum::routing::post(|axum::Json(body): axum::Json<serde_json::Value>| async move {
                    let _ = body;
                    axum::Json(serde_json::json!({ "status": "acquired", "permits": 1, "token": 123456 }))
                }),
            )
            .route(
                "/v1/sessions",
                axum::routing::post(move |axum::Json(body): axum::Json<serde_json::Value>| async move {
                    let id = ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let answer = serde_json::json!({ "id": format!("{id:032x}"), "ttl_ms": body["ttl_ms"] });
                    (axum::http::StatusCode::CREATED, axum::Json(answer))
                }),
            )
            .route(
                "/v1/sessions/keepalive",
                axum::routing::post(|axum::Json(body): axum::Json<serde_json::Value>| async move {
                    let renewed: Vec<serde_json::Value> = body["sessions"]
                        .as_array()
                        .map(|ids| {
                            ids.iter().map(|id| serde_json::json!({ "id": id, "ttl_ms": 10_000 })).collect()
                        })
                        .unwrap_or_default();
                    axum::Json(serde_json::json!({ "sessions": renewed }))
                }),
            )
            .route(
                "/v1/sessions/{id}/keepalive",
                axum::routing::post(|axum::extract::Path(id): axum::extract::Path<String>| async move {
                    let _ = id;
                    axum::Json(serde_json::json!({ "ttl_ms": 10_000 }))
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("permit listening on http://{} (floor)", listener.local_addr()?);
        axum::serve(listener, app).await?;
        Ok(())
    })
}

/// Round trips to the floor server: (1-client latencies, 32-client requests per second).
pub async fn http_floor(url: &str, duration: Duration) -> anyhow::Result<(Samples, f64)> {
    let client = crate::api::Api::new(url);
    let body = serde_json::json!({ "session": "0123456789abcdef0123456789abcdef", "permits": 1 });
    let mut single = Samples::default();
    let end = Instant::now() + duration;
    while Instant::now() < end {
        let started = Instant::now();
        let (status, _) = client.post_json("/floor", body.clone()).await?;
        anyhow::ensure!(status == 200, "floor answered {status}");
        single.push(started.elapsed());
    }
    let count = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let end = Instant::now() + duration;
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (url, body, count) = (url.to_owned(), body.clone(), count.clone());
            tokio::spawn(async move {
                let client = crate::api::Api::new(&url);
                while Instant::now() < end {
                    let (status, _) = client.post_json("/floor", body.clone()).await?;
                    anyhow::ensure!(status == 200, "floor answered {status}");
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for task in tasks {
        task.await??;
    }
    let rate = count.load(std::sync::atomic::Ordering::Relaxed) as f64 / duration.as_secs_f64();
    Ok((single, rate))
}

/// fdatasync of 4 KiB appends in `dir`.
pub fn fsync_floor(dir: &Path, count: usize) -> anyhow::Result<Samples> {
    let path = dir.join("fsync-floor.bin");
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(&path).context("open")?;
    let block = vec![0xabu8; 4096];
    let mut samples = Samples::default();
    for _ in 0..count {
        let started = Instant::now();
        file.write_all(&block)?;
        // SAFETY: fdatasync on a file descriptor we own.
        let result = unsafe { libc::fdatasync(file.as_raw_fd()) };
        anyhow::ensure!(result == 0, "fdatasync failed");
        samples.push(started.elapsed());
    }
    drop(file);
    let _ = std::fs::remove_file(path);
    Ok(samples)
}
