//! A work queue from Rust: push three items, then work on them until the queue stays empty for
//! two seconds, acking what succeeds and nacking what fails (it is retried after a delay).
//!
//! ```sh
//! permit serve                                              # blocks: run it in another terminal
//! cargo run -p permit-client --example worker               # or PERMIT_SERVER=http://host:7376
//! ```

use std::time::Duration;

use permit_client::{Client, PushOptions};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var("PERMIT_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7376".into());
    let mut client = Client::with_endpoints(server.split(','))?;
    if let Ok(secret) = std::env::var("PERMIT_AUTH_TOKEN") {
        client = client.auth_token(secret); // for a server started with --auth
    }
    // Pushing creates the queue; the keys make a second run of this example add nothing while
    // the first one's items are still queued.
    for n in 1..=3 {
        let options = PushOptions { key: Some(format!("example-{n}")), ..PushOptions::default() };
        let pushed =
            client.push_with("examples.thumbnails", &serde_json::json!({ "image": n }), &options).await?;
        println!("pushed item {} (seq {})", pushed.id, pushed.seq);
    }
    // The claims are leases of this session: if the process dies, its items go back at once.
    let session = client.session(Duration::from_secs(10)).await?;
    while let Some(item) = session.claim_timeout("examples.thumbnails", Duration::from_secs(2)).await? {
        tokio::select! {
            done = render(item.payload(), item.attempt(), item.token()) => match done {
                Ok(()) => item.ack().await?,
                Err(why) => {
                    let state = item.nack(Duration::from_secs(1), Some(&why)).await?;
                    println!("nacked: {why}; the item is {state:?} now");
                }
            },
            () = item.lost() => eprintln!("lost the session: item {} goes to another worker", item.id()),
        }
    }
    session.close().await?;
    Ok(())
}

/// Pretends to render a thumbnail; fails on the first attempt of image 2. Pass `token` to what
/// you write, so that a stalled worker's late write can be refused.
async fn render(payload: &str, attempt: u32, token: u64) -> Result<(), String> {
    println!("rendering {payload} (attempt {attempt}) with fencing token {token}");
    tokio::time::sleep(Duration::from_millis(100)).await;
    if payload.contains('2') && attempt == 1 {
        return Err("the renderer was busy".into());
    }
    Ok(())
}
