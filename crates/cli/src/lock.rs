//! `permit lock`: hold permits of a semaphore from a shell, without a command, until SIGINT or
//! SIGTERM.

use permit_client::Client;

use crate::run::{Held, PermitArgs};
use crate::EXIT_CODES_LOCK;

/// `permit lock <semaphore> [-n PERMITS] [--capacity N] [--group G] [--ttl 10s] [--timeout D]`
#[derive(clap::Args, Debug)]
#[command(after_help = EXIT_CODES_LOCK)]
pub struct LockArgs {
    /// The semaphore and how to hold it.
    #[command(flatten)]
    pub permit: PermitArgs,
    /// Session name shown by `permit show` (default: `permit lock`, the semaphore and this
    /// process id).
    #[arg(long)]
    pub name: Option<String>,
}

/// Runs `permit lock`.
pub(crate) async fn lock(client: &Client, args: LockArgs) -> anyhow::Result<i32> {
    let options = args.permit.options(None);
    let hold = args.permit.hold("lock", args.name, None);
    let (semaphore, permits) = (args.permit.semaphore, args.permit.permits);
    hold.run(client, |session| async move {
        let permit = session.acquire_with(&semaphore, permits, &options).await?;
        Ok(permit.map(|permit| (Held::Permit(permit), Vec::new())))
    })
    .await
}
