//! `permit cluster status|add|remove`: membership of a cluster.

use anyhow::Context;
use clap::{Args, Subcommand};
use permit_client::Client;

use crate::table;

/// Cluster membership commands.
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Show the leader, the term, and every member's role and indexes.
    Status(StatusArgs),
    /// Add a node started with `permit serve --join`: it joins as a learner, catches up (by
    /// snapshot if far behind), then becomes a voter.
    Add(AddArgs),
    /// Remove a node from the cluster (if it leads, another node takes over).
    Remove(RemoveArgs),
}

/// `permit cluster status`.
#[derive(Debug, Args)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct StatusArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// `permit cluster add`.
#[derive(Debug, Args)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct AddArgs {
    /// The new node's id.
    id: u64,
    /// Its address, HOST:PORT (as given to its --listen).
    addr: String,
    /// Keep it a non-voting learner.
    #[arg(long)]
    learner: bool,
}

/// `permit cluster remove`.
#[derive(Debug, Args)]
#[command(after_help = crate::EXIT_CODES_COMMON)]
pub struct RemoveArgs {
    /// The node to remove.
    id: u64,
}

/// Runs a cluster command.
pub async fn execute(client: &Client, command: ClusterCommand) -> anyhow::Result<i32> {
    match command {
        ClusterCommand::Status(args) => {
            let view = client.cluster().await.context("cluster status")?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print_view(&view);
            }
        }
        ClusterCommand::Add(args) => {
            let view = client.add_member(args.id, &args.addr, args.learner).await.context("add member")?;
            print_view(&view);
        }
        ClusterCommand::Remove(args) => {
            client.remove_member(args.id).await.context("remove member")?;
            println!("node {} removed", args.id);
        }
    }
    Ok(0)
}

fn print_view(view: &permit_client::wire::ClusterView) {
    let leader = view.leader.map_or_else(|| "none".to_owned(), |id| id.to_string());
    let version = view
        .feature_version
        .map_or_else(|| "1 (a build from before versioning)".to_owned(), |v| v.to_string());
    println!("leader {leader}, term {}, cluster feature version {version}", view.term);
    let rows: Vec<Vec<String>> = view
        .members
        .iter()
        .map(|m| {
            let role = match m.role {
                permit_client::wire::MemberRole::Voter => "voter",
                permit_client::wire::MemberRole::Learner => "learner",
            };
            let index = |i: Option<u64>| i.map_or_else(|| "-".to_owned(), |i| i.to_string());
            vec![
                m.id.to_string(),
                m.addr.clone(),
                if m.leader { format!("{role} (leader)") } else { role.to_owned() },
                index(m.matched_index),
                index(m.applied_index),
                if m.reachable { "yes".to_owned() } else { "no".to_owned() },
                m.feature_version.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                m.build.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    print!(
        "{}",
        table::format(
            &["ID", "ADDRESS", "ROLE", "MATCHED", "APPLIED", "REACHABLE", "VERSION", "BUILD"],
            &rows
        )
    );
}

/// Backups of the whole state.
#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent backup (sessions, semaphores, holds, queues, elections, tokens, the
    /// fencing-token counter) to FILE; `permit serve --restore FILE` starts a new cluster from it.
    #[command(after_help = crate::EXIT_CODES_COMMON)]
    Save(SaveArgs),
}

/// `permit snapshot save`.
#[derive(Debug, Args)]
pub struct SaveArgs {
    /// Where to write the backup (written to FILE.tmp, fsynced, then renamed).
    file: std::path::PathBuf,
}

/// Runs a snapshot command.
pub async fn snapshot(client: &Client, command: SnapshotCommand) -> anyhow::Result<i32> {
    let SnapshotCommand::Save(args) = command;
    let bytes = client.snapshot().await.context("save a snapshot")?;
    let temp = args.file.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, &args.file)
    };
    write().with_context(|| format!("cannot write {}", args.file.display()))?;
    println!("saved {} bytes to {}", bytes.len(), args.file.display());
    Ok(0)
}
