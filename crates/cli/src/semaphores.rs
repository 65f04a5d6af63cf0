//! `permit ls`, `permit show`, `permit set-capacity` and `permit delete`.

use anyhow::Context;
use permit_client::wire::SemaphoreView;
use permit_client::Client;

use crate::table;

/// `permit ls [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct LsArgs {
    /// Print a JSON array of `{name, capacity, held, available, holders, waiters}`.
    #[arg(long)]
    pub json: bool,
}

/// `permit show <semaphore> [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct ShowArgs {
    /// The semaphore.
    pub semaphore: String,
    /// Print the semaphore as JSON, as `GET /v1/semaphores/{name}` returns it.
    #[arg(long)]
    pub json: bool,
}

/// `permit set-capacity <semaphore> <capacity>`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct SetCapacityArgs {
    /// The semaphore (created if it does not exist).
    pub semaphore: String,
    /// The capacity in permits: 1-1000000. Shrinking below what is held keeps the holders;
    /// nothing is granted until holdings fit.
    pub capacity: u64,
}

/// `permit delete <semaphore>`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct DeleteArgs {
    /// The semaphore; refused while anyone holds or waits on it.
    pub semaphore: String,
}

/// `permit sessions [--json]`
#[derive(clap::Args, Debug)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct SessionsArgs {
    /// Print a JSON array of `{id, name, ttl_ms, remaining_ms, holds, waits}`.
    #[arg(long)]
    pub json: bool,
}

/// Most sessions `permit sessions` prints; the server pages, the CLI stops here.
const SESSIONS_SHOWN_MAX: usize = 100_000;

/// Runs `permit sessions`.
pub(crate) async fn sessions(client: &Client, args: SessionsArgs) -> anyhow::Result<i32> {
    let mut all = Vec::new();
    let mut after: Option<String> = None;
    while all.len() < SESSIONS_SHOWN_MAX {
        let page = client.list_sessions(after.as_deref(), 1000).await.context("cannot list sessions")?;
        all.extend(page.sessions);
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            vec![
                s.id.clone(),
                s.name.clone().unwrap_or_default(),
                format!("{}ms", s.ttl_ms),
                s.remaining_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms}ms")),
                s.holds.to_string(),
                s.waits.to_string(),
            ]
        })
        .collect();
    print!("{}", table::format(&["ID", "NAME", "TTL", "REMAINING", "HOLDS", "WAITS"], &rows));
    Ok(0)
}

/// Runs `permit ls`.
pub(crate) async fn ls(client: &Client, args: LsArgs) -> anyhow::Result<i32> {
    let semaphores = client.all_semaphores().await.context("cannot list semaphores")?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&semaphores)?);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = semaphores
        .iter()
        .map(|s| {
            vec![
                s.name.clone(),
                s.capacity.to_string(),
                s.held.to_string(),
                s.available.to_string(),
                s.holders.to_string(),
                s.waiters.to_string(),
            ]
        })
        .collect();
    print!("{}", table::format(&["NAME", "CAPACITY", "HELD", "AVAILABLE", "HOLDERS", "WAITERS"], &rows));
    Ok(0)
}

/// Runs `permit show`.
pub(crate) async fn show(client: &Client, args: ShowArgs) -> anyhow::Result<i32> {
    let view = client
        .get_semaphore(&args.semaphore)
        .await
        .with_context(|| format!("cannot read semaphore {}", args.semaphore))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&view)?);
    } else {
        print!("{}", describe(&view));
    }
    Ok(0)
}

/// The human-readable form of a semaphore: a summary line, then holders and waiters.
fn describe(view: &SemaphoreView) -> String {
    let mut text = format!(
        "{}: capacity {}, held {}, available {}, {} waiting\n",
        view.name,
        view.capacity,
        view.held,
        view.available,
        view.waiters.len()
    );
    if !view.holders.is_empty() {
        let rows: Vec<Vec<String>> = view
            .holders
            .iter()
            .map(|h| {
                vec![
                    h.session.clone(),
                    h.session_name.clone().unwrap_or_default(),
                    h.permits.to_string(),
                    h.token.to_string(),
                    h.expires_in_ms.map_or_else(|| "-".to_owned(), |ms| format!("{ms}ms")),
                ]
            })
            .collect();
        text.push_str("\nholders:\n");
        text.push_str(&table::format(&["SESSION", "NAME", "PERMITS", "TOKEN", "MAX_HOLD_LEFT"], &rows));
    }
    if !view.waiters.is_empty() {
        let rows: Vec<Vec<String>> = view
            .waiters
            .iter()
            .map(|w| {
                vec![
                    w.position.to_string(),
                    w.session.clone(),
                    w.session_name.clone().unwrap_or_default(),
                    w.permits.to_string(),
                ]
            })
            .collect();
        text.push_str("\nwaiters:\n");
        text.push_str(&table::format(&["POSITION", "SESSION", "NAME", "PERMITS"], &rows));
    }
    text
}

/// Runs `permit set-capacity`.
pub(crate) async fn set_capacity(client: &Client, args: SetCapacityArgs) -> anyhow::Result<i32> {
    let view = client
        .put_semaphore(&args.semaphore, args.capacity)
        .await
        .with_context(|| format!("cannot set the capacity of {}", args.semaphore))?;
    println!("{}: capacity {}, held {}, available {}", view.name, view.capacity, view.held, view.available);
    Ok(0)
}

/// Runs `permit delete`.
pub(crate) async fn delete(client: &Client, args: DeleteArgs) -> anyhow::Result<i32> {
    client
        .delete_semaphore(&args.semaphore)
        .await
        .with_context(|| format!("cannot delete semaphore {}", args.semaphore))?;
    println!("deleted {}", args.semaphore);
    Ok(0)
}
