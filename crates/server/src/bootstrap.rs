//! The cluster's token salt and root token, created once per cluster by its first leader with
//! `--auth` (see [`bootstrap_root`]).

use std::sync::Arc;

use permit_core::Token;
use tokio::sync::watch;

use crate::auth::{new_secret, secret_hash};
use crate::config::Config;
use crate::raft::consensus::Consensus;

/// Shortest secret the server accepts for the root token, in bytes.
const ROOT_SECRET_BYTES_MIN: usize = 16;

/// Name of the file in the data dir that holds a generated root secret.
const ROOT_TOKEN_FILE: &str = "root-token";

/// Creates the cluster's token salt and, with it, the root token, once per cluster: when this node
/// leads and the replicated state has never had them. The secret is the configured one
/// (`PERMIT_ROOT_TOKEN`, `--root-token-file`) or one generated into `DATA_DIR/root-token`
/// (mode 0600). A cluster made before salts gets its salt from its first leader that has this
/// code; its tokens made before keep their plain SHA-256. Ends when both exist.
pub(crate) async fn bootstrap_root(
    consensus: Arc<Consensus>,
    config: Config,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut leading = consensus.leading().clone();
    loop {
        let done = {
            let state = &consensus.replica().read().state;
            state.root_created() && state.token_salt().is_some()
        };
        if done || *shutdown.borrow() {
            return;
        }
        if leading.borrow_and_update().is_some() {
            // Done once applied (the loop's check); a command another leader's beat changed
            // nothing, and the next look decides what is still missing.
            if let Err(error) = propose_root(&consensus, &config).await {
                tracing::warn!(%error, "root token not created yet; will retry");
            }
        }
        tokio::select! {
            changed = leading.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => {}
            () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
        }
    }
}

async fn propose_root(consensus: &Consensus, config: &Config) -> anyhow::Result<()> {
    let (salt, root_created) = {
        let state = &consensus.replica().read().state;
        (state.token_salt().copied(), state.root_created())
    };
    // A new cluster draws its salt (256 bits from the OS's CSPRNG) and creates the root token
    // under it in one command; one made before salts gets a salt alone. A concurrent leader's
    // command may win: then this one changes nothing and the caller's loop looks again.
    let (salt, new_salt) = match salt {
        Some(salt) => (salt, false),
        None => (rand::random(), true),
    };
    let (root, file) = if root_created {
        (None, None)
    } else {
        let (secret, file) = match &config.root_token {
            Some(secret) => (secret.clone(), None),
            None => {
                let path = config.data_dir.join(ROOT_TOKEN_FILE);
                (read_or_create_secret(&path)?, Some(path))
            }
        };
        let token = Token {
            name: "root".to_owned(),
            secret_hash: secret_hash(Some(&salt), &secret),
            rules: permit_core::root_rules(),
        };
        (Some(token), file)
    };
    let command = match (new_salt, root) {
        (true, root) => permit_core::Command::SetTokenSalt { salt, root },
        (false, Some(token)) => permit_core::Command::CreateToken { id: permit_core::ROOT_TOKEN_ID, token },
        (false, None) => return Ok(()),
    };
    match consensus.propose(command).await.map_err(|e| anyhow::anyhow!("{e:?}"))? {
        permit_core::Outcome::TokenSaltSet | permit_core::Outcome::TokenCreated => {
            if new_salt {
                tracing::info!("token salt created");
            }
            match (root_created, file) {
                (true, _) => {}
                (false, Some(path)) => {
                    tracing::info!(path = %path.display(), "root token created; its secret is in this file")
                }
                (false, None) => tracing::info!("root token created from the configured secret"),
            }
        }
        permit_core::Outcome::Refused(permit_core::Refusal::TokenExists) => {}
        other => anyhow::bail!("unexpected outcome {other:?}"),
    }
    Ok(())
}

/// The secret in `path`, or a new one written there (mode 0600, fsynced) if it does not exist.
fn read_or_create_secret(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read_to_string(path) {
        Ok(secret) if secret.trim().len() >= ROOT_SECRET_BYTES_MIN => return Ok(secret.trim().to_owned()),
        Ok(_) => {
            anyhow::bail!("{} holds no secret of at least {ROOT_SECRET_BYTES_MIN} bytes", path.display())
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
        Err(error) => anyhow::bail!("cannot read {}: {error}", path.display()),
    }
    let secret = new_secret();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot create {}: {e}", path.display()))?;
    file.write_all(format!("{secret}\n").as_bytes())?;
    file.sync_all()?;
    Ok(secret)
}
