//! The peer channel's credential. Every node of a cluster is given the same cluster secret
//! (`permit serve --cluster-secret-file FILE`); a node proves who it is with
//! `permit-peer-id: ID` and `permit-peer-auth: hex(HMAC-SHA256(secret, "permit-peer-v1:" + ID))`
//! on every Raft RPC and every forwarded request. See `docs/security.md`, "Peer channel".

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderValue};
use hmac::{Hmac, Mac};
use permit_wire::{PEER_AUTH_HEADER, PEER_ID_HEADER};
use sha2::Sha256;

use crate::raft::NodeId;

/// Fewest bytes a cluster secret may have (after trimming whitespace).
pub const CLUSTER_SECRET_BYTES_MIN: usize = 16;
/// Largest cluster secret file read, in bytes.
const CLUSTER_SECRET_FILE_BYTES_MAX: u64 = 4096;
/// What a credential authenticates, before the node id: a new credential scheme gets a new
/// context so that old credentials cannot be replayed in it.
const CREDENTIAL_CONTEXT: &str = "permit-peer-v1:";
/// How to make a secret, for error messages.
pub const SECRET_HOWTO: &str = "make one with `head -c 32 /dev/urandom | base64 > cluster.secret` \
    and start every node with `--cluster-secret-file cluster.secret` (the same file on every node)";

/// The secret shared by the nodes of a cluster. Its `Debug` output never shows it.
#[derive(Clone)]
pub struct ClusterSecret(Arc<[u8]>);

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(redacted)")
    }
}

/// Why a peer request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerAuthError {
    /// This node has no cluster secret, so it accepts no peer request.
    #[error("this node has no cluster secret and accepts no peer requests")]
    NoSecret,
    /// A header is missing or not ASCII.
    #[error("peer requests need the headers {PEER_ID_HEADER} and {PEER_AUTH_HEADER}")]
    Missing,
    /// The node id is not a number.
    #[error("{PEER_ID_HEADER} is not a node id")]
    BadId,
    /// The credential does not match the id under this node's secret.
    #[error("the peer credential is not valid for this cluster")]
    BadCredential,
}

impl ClusterSecret {
    /// A secret from `bytes` with surrounding whitespace trimmed.
    ///
    /// # Errors
    /// When fewer than [`CLUSTER_SECRET_BYTES_MIN`] bytes remain, or the secret is easy to guess
    /// ([`crate::entropy::check`]).
    pub fn new(bytes: &[u8]) -> anyhow::Result<ClusterSecret> {
        let trimmed = bytes.trim_ascii();
        anyhow::ensure!(
            trimmed.len() >= CLUSTER_SECRET_BYTES_MIN,
            "the cluster secret has {} bytes, fewer than {CLUSTER_SECRET_BYTES_MIN}; {SECRET_HOWTO}",
            trimmed.len()
        );
        crate::entropy::check("the cluster secret", trimmed)
            .map_err(|e| anyhow::anyhow!("{e}; {SECRET_HOWTO}"))?;
        Ok(ClusterSecret(trimmed.into()))
    }

    /// Reads a secret from a file (its content, whitespace trimmed).
    ///
    /// # Errors
    /// When the file cannot be read, is larger than 4 KiB, or the secret is too short.
    pub fn from_file(path: &Path) -> anyhow::Result<ClusterSecret> {
        let size = std::fs::metadata(path)
            .map_err(|e| anyhow::anyhow!("cannot read the cluster secret file {}: {e}", path.display()))?
            .len();
        anyhow::ensure!(
            size <= CLUSTER_SECRET_FILE_BYTES_MAX,
            "the cluster secret file {} has {size} bytes; at most {CLUSTER_SECRET_FILE_BYTES_MAX}",
            path.display()
        );
        let bytes = std::fs::read(path)
            .map_err(|e| anyhow::anyhow!("cannot read the cluster secret file {}: {e}", path.display()))?;
        ClusterSecret::new(&bytes).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    fn mac(&self, node: NodeId) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(CREDENTIAL_CONTEXT.as_bytes());
        mac.update(node.to_string().as_bytes());
        mac
    }

    /// The credential of node `node`: the value of `permit-peer-auth` (lowercase hex).
    pub fn credential(&self, node: NodeId) -> String {
        let tag = self.mac(node).finalize().into_bytes();
        tag.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    /// Whether `credential` (hex) is node `node`'s credential; compared in constant time.
    pub fn verify(&self, node: NodeId, credential: &str) -> bool {
        match decode_hex(credential) {
            Some(tag) => self.mac(node).verify_slice(&tag).is_ok(),
            None => false,
        }
    }

    /// The two headers that authenticate node `node`'s requests.
    pub fn headers(&self, node: NodeId) -> [(&'static str, String); 2] {
        [(PEER_ID_HEADER, node.to_string()), (PEER_AUTH_HEADER, self.credential(node))]
    }

    /// Inserts the two headers that authenticate node `node`'s requests into `headers`.
    pub fn insert_headers(&self, node: NodeId, headers: &mut HeaderMap) {
        for (name, value) in self.headers(node) {
            let value =
                HeaderValue::try_from(value).expect("a node id and a hex credential are header values");
            headers.insert(name, value);
        }
    }
}

/// The node whose valid credential `headers` carry, checked against `secret`.
///
/// # Errors
/// [`PeerAuthError`] when there is no secret, or the headers are missing or do not match.
pub fn authenticate(secret: Option<&ClusterSecret>, headers: &HeaderMap) -> Result<NodeId, PeerAuthError> {
    let secret = secret.ok_or(PeerAuthError::NoSecret)?;
    let id = headers.get(PEER_ID_HEADER).and_then(|v| v.to_str().ok()).ok_or(PeerAuthError::Missing)?;
    let credential =
        headers.get(PEER_AUTH_HEADER).and_then(|v| v.to_str().ok()).ok_or(PeerAuthError::Missing)?;
    let id: NodeId = id.parse().map_err(|_| PeerAuthError::BadId)?;
    if secret.verify(id, credential) {
        Ok(id)
    } else {
        Err(PeerAuthError::BadCredential)
    }
}

/// Bytes of an even-length hex string (either case), or `None`.
fn decode_hex(text: &str) -> Option<Vec<u8>> {
    let pairs = text.as_bytes().chunks_exact(2);
    if !pairs.remainder().is_empty() || text.len() > 128 {
        return None;
    }
    let nibble = |digit: u8| (digit as char).to_digit(16).map(|n| n as u8);
    pairs.map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::new(b"  0123456789abcdef-secret\n").unwrap()
    }

    #[test]
    fn short_secrets_are_refused_after_trimming() {
        assert!(ClusterSecret::new(b"   short secret   \n").is_err());
        assert!(ClusterSecret::new(b"exactly-16-bytes").is_err(), "16 characters are about 98 bits");
        assert!(ClusterSecret::new(b"passwordpassword-passwordpassword").is_err());
        assert!(ClusterSecret::new(b"Zm9vYmFyYmF6cXV4cXV1eHF1dXpxdXV4ZmxvYmJsZQ==").is_ok());
    }

    #[test]
    fn the_debug_output_hides_the_secret() {
        assert!(!format!("{:?}", secret()).contains("0123"));
    }

    #[test]
    fn a_credential_authenticates_its_node_only() {
        let secret = secret();
        let mut headers = HeaderMap::new();
        secret.insert_headers(2, &mut headers);
        assert_eq!(authenticate(Some(&secret), &headers), Ok(2));
        assert_eq!(authenticate(None, &headers), Err(PeerAuthError::NoSecret));
        let other = ClusterSecret::new(b"another-cluster-secret").unwrap();
        assert_eq!(authenticate(Some(&other), &headers), Err(PeerAuthError::BadCredential));
        headers.insert(PEER_ID_HEADER, HeaderValue::from_static("3"));
        assert_eq!(authenticate(Some(&secret), &headers), Err(PeerAuthError::BadCredential));
        headers.insert(PEER_AUTH_HEADER, HeaderValue::from_static("zz"));
        assert_eq!(authenticate(Some(&secret), &headers), Err(PeerAuthError::BadCredential));
        headers.remove(PEER_AUTH_HEADER);
        assert_eq!(authenticate(Some(&secret), &headers), Err(PeerAuthError::Missing));
    }

    #[test]
    fn hex_decoding_refuses_odd_lengths_and_non_digits() {
        assert_eq!(decode_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert_eq!(decode_hex("0a0"), None);
        assert_eq!(decode_hex("0g"), None);
    }
}
