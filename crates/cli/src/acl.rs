//! `permit acl token create|list|delete|self`: access tokens of a server started with `--auth`.

use anyhow::Context;
use clap::{Args, Subcommand};
use permit_client::wire::{AclAccess, AclResource, AclRule, TokenView};
use permit_client::Client;

use crate::table;

/// Access-control commands.
#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Access tokens.
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `permit acl token ...`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print its secret (shown only once).
    #[command(after_help = crate::EXIT_CODES_COMMON)]
    Create(CreateArgs),
    /// List tokens (ids, names, rules; never secrets).
    #[command(after_help = crate::EXIT_CODES_COMMON)]
    List,
    /// Delete a token: its sessions close and their permits are freed on every node.
    #[command(after_help = crate::EXIT_CODES_COMMON)]
    Delete(DeleteArgs),
    /// Show the token this command authenticates with.
    #[command(name = "self", after_help = crate::EXIT_CODES_COMMON)]
    Current,
}

/// `permit acl token create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// A name for humans.
    #[arg(long)]
    name: String,
    /// A rule RESOURCE:PREFIX=ACCESS, repeatable: RESOURCE is semaphore, election, session, acl or
    /// cluster; ACCESS is read, write or admin; an empty PREFIX matches every name
    /// (`semaphore:db.=write`, `cluster:=read`).
    #[arg(long = "rule", value_parser = parse_rule)]
    rules: Vec<AclRule>,
    /// Print only the secret (for scripts).
    #[arg(long)]
    quiet: bool,
}

/// `permit acl token delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// The token's id (from `permit acl token list`).
    id: String,
}

/// Parses `RESOURCE:PREFIX=ACCESS`.
fn parse_rule(text: &str) -> Result<AclRule, String> {
    let (scope, access) = text.rsplit_once('=').ok_or("expected RESOURCE:PREFIX=ACCESS")?;
    let (resource, prefix) = scope.split_once(':').unwrap_or((scope, ""));
    let resource = match resource {
        "semaphore" => AclResource::Semaphore,
        "election" => AclResource::Election,
        "session" => AclResource::Session,
        "acl" => AclResource::Acl,
        "cluster" => AclResource::Cluster,
        other => {
            return Err(format!("unknown resource {other:?}: semaphore, election, session, acl or cluster"))
        }
    };
    let access = match access {
        "read" => AclAccess::Read,
        "write" => AclAccess::Write,
        "admin" => AclAccess::Admin,
        other => return Err(format!("unknown access {other:?}: read, write or admin")),
    };
    Ok(AclRule { resource, prefix: prefix.to_owned(), access })
}

fn format_rule(rule: &AclRule) -> String {
    let resource = serde_json::to_value(rule.resource).ok().and_then(|v| v.as_str().map(str::to_owned));
    let access = serde_json::to_value(rule.access).ok().and_then(|v| v.as_str().map(str::to_owned));
    format!("{}:{}={}", resource.unwrap_or_default(), rule.prefix, access.unwrap_or_default())
}

fn rules_text(token: &TokenView) -> String {
    token.rules.iter().map(format_rule).collect::<Vec<_>>().join(" ")
}

/// Runs an acl command.
pub async fn execute(client: &Client, command: AclCommand) -> anyhow::Result<i32> {
    let AclCommand::Token(command) = command;
    match command {
        TokenCommand::Create(args) => {
            let created = client.create_token(&args.name, args.rules).await.context("create token")?;
            if args.quiet {
                println!("{}", created.secret);
            } else {
                println!("id      {}\nname    {}\nsecret  {}", created.id, created.name, created.secret);
                eprintln!("the secret is shown only now; pass it as --auth-token or PERMIT_AUTH_TOKEN");
            }
        }
        TokenCommand::List => {
            let list = client.tokens().await.context("list tokens")?;
            let rows = list
                .tokens
                .iter()
                .map(|t| vec![t.id.clone(), t.name.clone(), t.sessions.to_string(), rules_text(t)])
                .collect::<Vec<_>>();
            print!("{}", table::format(&["ID", "NAME", "SESSIONS", "RULES"], &rows));
        }
        TokenCommand::Delete(args) => {
            client.delete_token(&args.id).await.context("delete token")?;
        }
        TokenCommand::Current => {
            let token = client.token_self().await.context("token self")?;
            println!("id      {}\nname    {}\nrules   {}", token.id, token.name, rules_text(&token));
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_print_back() {
        for text in ["semaphore:db.=write", "cluster:=read", "session:=admin", "election:a:b=read"] {
            assert_eq!(format_rule(&parse_rule(text).unwrap()), text);
        }
        assert!(parse_rule("semaphore:db.").is_err());
        assert!(parse_rule("disk:x=read").is_err());
        assert!(parse_rule("semaphore:x=all").is_err());
    }
}
