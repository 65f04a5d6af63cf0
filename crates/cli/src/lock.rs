//! `permit lock`: hold permits of a semaphore from a shell, without a command, until SIGINT or
//! SIGTERM.

use std::time::Duration;

use permit_client::{AcquireOptions, Client};

use crate::run::{Held, Hold};
use crate::{parse_duration, EXIT_CODES_LOCK, TTL_DEFAULT};

/// `permit lock <semaphore> [-n PERMITS] [--capacity N] [--ttl 10s] [--timeout D]`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_LOCK)]
pub struct LockArgs {
    /// The semaphore: 1-128 bytes of [A-Za-z0-9._:-].
    pub semaphore: String,
    /// Permits to hold.
    #[arg(short = 'n', long, default_value_t = 1)]
    pub permits: u64,
    /// Create the semaphore with this capacity if it does not exist. A semaphore made this way
    /// is ephemeral: the server deletes it when its last holder and waiter leave (see --keep).
    #[arg(long)]
    pub capacity: Option<u64>,
    /// Keep a semaphore that --capacity creates after everyone leaves.
    #[arg(long, requires = "capacity")]
    pub keep: bool,
    /// Session TTL: how soon the permits come back if this process dies or is cut off.
    #[arg(long, default_value = TTL_DEFAULT, value_parser = parse_duration)]
    pub ttl: Duration,
    /// Give up waiting after this long and exit with 75 (default: wait as long as it takes).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Session name shown by `permit show` (default: `permit lock`, the semaphore and this
    /// process id).
    #[arg(long)]
    pub name: Option<String>,
}

/// Runs `permit lock`.
pub(crate) async fn lock(client: &Client, args: LockArgs) -> anyhow::Result<i32> {
    let name =
        args.name.unwrap_or_else(|| format!("permit lock {} (pid {})", args.semaphore, std::process::id()));
    let options = AcquireOptions {
        capacity: args.capacity,
        max_hold: None,
        timeout: args.timeout,
        ephemeral: !args.keep,
    };
    let hold = Hold {
        what: format!("{} permit(s) of semaphore {}", args.permits, args.semaphore),
        ttl: args.ttl,
        session_name: name,
        timeout: args.timeout,
        job: None,
    };
    let (semaphore, permits) = (args.semaphore, args.permits);
    hold.run(client, |session| async move {
        let permit = session.acquire_with(&semaphore, permits, &options).await?;
        Ok(permit.map(|permit| (Held::Permit(permit), Vec::new())))
    })
    .await
}
