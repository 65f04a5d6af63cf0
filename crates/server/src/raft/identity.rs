//! The cluster identity: a random label that `permit recover` gives the data dir it turns into a
//! new cluster (`cluster-id` in the data dir). A node that has one sends it with every Raft
//! message (`permit-cluster`) and takes Raft messages only from nodes that send the same, so
//! that the members of the cluster before the recovery, if they come back with their data, are
//! refused with a message that says why. A pristine node (started with `--join`, never a
//! member) takes the identity of the first leader that reaches it; a node with data and no
//! identity, or another one, refuses such a leader.
//!
//! A cluster never recovered has no identity, and nodes of builds that know none send none:
//! they meet only each other.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The file in the data dir that holds the identity.
pub(crate) const CLUSTER_ID_FILE: &str = "cluster-id";
/// The header that carries it on Raft messages.
pub(crate) const CLUSTER_HEADER: &str = "permit-cluster";

/// This node's cluster identity, if it has one.
#[derive(Debug)]
pub struct ClusterIdentity {
    path: PathBuf,
    id: RwLock<Option<String>>,
}

impl ClusterIdentity {
    /// Gives the data dir `data_dir` a new identity, durably; returns it.
    ///
    /// # Errors
    /// When the file cannot be written and synced.
    pub fn create(data_dir: &Path) -> std::io::Result<String> {
        let id: String = rand::random::<[u8; 16]>().iter().map(|b| format!("{b:02x}")).collect();
        write_durably(&data_dir.join(CLUSTER_ID_FILE), &id)?;
        Ok(id)
    }

    /// The identity of the data dir `data_dir` (none when it has no file).
    ///
    /// # Errors
    /// When the file exists but cannot be read.
    pub(crate) fn open(data_dir: &Path) -> std::io::Result<Arc<ClusterIdentity>> {
        let path = data_dir.join(CLUSTER_ID_FILE);
        let id = match std::fs::read_to_string(&path) {
            Ok(text) => Some(text.trim().to_owned()).filter(|id| !id.is_empty()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(std::io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display())))
            }
        };
        Ok(Arc::new(ClusterIdentity { path, id: RwLock::new(id) }))
    }

    /// This node's identity.
    pub(crate) fn current(&self) -> Option<String> {
        self.id.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Whether to take a Raft message that carries `theirs`; a pristine node (`pristine` is
    /// asked only when it matters) takes the identity it carries. The error says why not, for
    /// the sender.
    pub(crate) fn admit(&self, theirs: Option<&str>, pristine: impl FnOnce() -> bool) -> Result<(), String> {
        let mine = self.current();
        match (mine.as_deref(), theirs) {
            (Some(mine), Some(theirs)) if mine == theirs => Ok(()),
            (None, None) => Ok(()),
            (Some(mine), theirs) => Err(format!(
                "this node belongs to cluster {mine}, made by `permit recover`, and the sender's data \
                 belongs to {}: wipe the sender's data dir and add it back with `permit cluster add`",
                theirs.map_or_else(
                    || "the cluster before that recovery".to_owned(),
                    |id| format!("cluster {id}")
                )
            )),
            (None, Some(theirs)) if pristine() => self.adopt(theirs),
            (None, Some(theirs)) => Err(format!(
                "this node's data belongs to a cluster that `permit recover` replaced with cluster \
                 {theirs}: wipe this node's data dir and add it back with `permit cluster add`"
            )),
        }
    }

    /// Takes `id` as this node's identity, durably, before the message that carried it is used.
    fn adopt(&self, id: &str) -> Result<(), String> {
        let valid = id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit());
        if !valid {
            return Err(format!("{CLUSTER_HEADER} must be 32 hex digits"));
        }
        let mut current = self.id.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if current.is_none() {
            write_durably(&self.path, id)
                .map_err(|e| format!("cannot write {}: {e}", self.path.display()))?;
            tracing::info!(cluster = id, "joined a cluster made by `permit recover`: took its identity");
            *current = Some(id.to_owned());
        }
        if current.as_deref() == Some(id) {
            Ok(())
        } else {
            Err("this node took another cluster's identity meanwhile".to_owned())
        }
    }
}

/// Writes `path` with `text` so that after a crash it holds all of it or nothing.
fn write_durably(path: &Path, text: &str) -> std::io::Result<()> {
    let temp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&temp)?;
    file.write_all(format!("{text}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temp, path)?;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pristine_node_takes_the_identity_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let none = ClusterIdentity::open(dir.path()).unwrap();
        assert_eq!(none.current(), None);
        assert!(none.admit(None, || false).is_ok(), "a cluster never recovered");
        let id = ClusterIdentity::create(dir.path()).unwrap();
        let recovered = ClusterIdentity::open(dir.path()).unwrap();
        assert_eq!(recovered.current().as_deref(), Some(id.as_str()));
        assert!(recovered.admit(Some(&id), || false).is_ok());
        let old = recovered.admit(None, || false).unwrap_err();
        assert!(old.contains("the cluster before that recovery"), "{old}");
        assert!(recovered.admit(Some(&"0".repeat(32)), || false).is_err());

        let other = tempfile::tempdir().unwrap();
        let with_data = ClusterIdentity::open(other.path()).unwrap();
        let refused = with_data.admit(Some(&id), || false).unwrap_err();
        assert!(refused.contains("wipe this node's data dir"), "{refused}");
        let joiner = ClusterIdentity::open(other.path()).unwrap();
        assert!(joiner.admit(Some("not hex"), || true).is_err());
        assert!(joiner.admit(Some(&id), || true).is_ok(), "a pristine node takes it");
        assert_eq!(ClusterIdentity::open(other.path()).unwrap().current(), Some(id), "durably");
    }
}
