//! The README's Rust example, kept compiling: hold one of four permits of `db.orders` while a job
//! runs, with the fencing token passed to what the job touches.
//!
//! ```sh
//! permit serve                                              # blocks: run it in another terminal
//! cargo run -p permit-client --example quickstart           # or PERMIT_SERVER=http://host:7376
//! ```

use std::time::Duration;

use permit_client::{AcquireOptions, Client};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var("PERMIT_SERVER").unwrap_or_else(|_| "http://127.0.0.1:7376".into());
    let mut client = Client::with_endpoints(server.split(','))?;
    if let Ok(secret) = std::env::var("PERMIT_AUTH_TOKEN") {
        client = client.auth_token(secret); // for a server started with --auth
    }
    // Kept alive in the background.
    let session = client.session(Duration::from_secs(10)).await?;
    // Waits its turn (strict FIFO); creates the semaphore with 4 permits on first use, ephemeral
    // (the server deletes it when its last user leaves; `ephemeral: false` keeps it).
    let options = AcquireOptions { capacity: Some(4), ..AcquireOptions::default() };
    let permit = session.acquire_with("db.orders", 1, &options).await?.expect("no timeout was set");
    do_work(permit.token()).await; // pass the token to what you protect
    permit.release().await?;
    session.close().await?;
    Ok(())
}

async fn do_work(token: u64) {
    println!("holding db.orders with fencing token {token}");
    tokio::time::sleep(Duration::from_millis(100)).await;
}
