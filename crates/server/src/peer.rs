//! The peer channel's authentication. Every node of a cluster is given the same cluster secret
//! (`permit serve --cluster-secret-file FILE`); every peer request (Raft RPCs and forwarded
//! client requests) carries an authenticator of that one message:
//!
//! `permit-peer-auth: hex(HMAC-SHA256(secret, "permit-peer-v2" | sender | receiver |
//! receiver nonce | sender nonce | counter | method path | SHA-256(body) | membership claim))`
//!
//! with the values it binds in `permit-peer-id`, `permit-peer-nonce`, `permit-peer-body` and
//! `permit-peer-members`. So a captured message is good for nothing else:
//! - not toward another node (the receiver's id is bound), nor with another body, route or
//!   membership claim;
//! - not twice: the receiver keeps a window of the counters it took from each sender nonce
//!   (`ReplayWindow`) and refuses a nonce that sender has since replaced;
//! - not after the receiver restarts: a node draws a new nonce at every start, and a message
//!   made for an earlier one is refused with the current nonce in `permit-peer-nonce`, which
//!   the sender learns and signs the message again with ([`PeerSigner::learn`]).
//!
//! No clock is involved: nodes whose wall clocks disagree (or jump) still talk. See
//! `docs/security.md`, "Peer channel".

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use hmac::{Hmac, Mac};
use permit_wire::{
    PEER_AUTH_HEADER, PEER_BODY_HEADER, PEER_ID_HEADER, PEER_MEMBERS_HEADER, PEER_NONCE_HEADER,
};
use sha2::{Digest, Sha256};

use crate::raft::NodeId;

/// Fewest bytes a cluster secret may have (after trimming whitespace).
const CLUSTER_SECRET_BYTES_MIN: usize = 16;
/// Largest cluster secret file read, in bytes.
const CLUSTER_SECRET_FILE_BYTES_MAX: u64 = 4096;
/// What an authenticator is over, first: a new scheme gets a new context so that messages of an
/// old one cannot be replayed in it.
const CONTEXT: &[u8] = b"permit-peer-v2";
/// How many counters below the highest one taken from a sender are still accepted once (in any
/// order): requests to one peer in flight at once are reordered by at most their number.
const REPLAY_WINDOW: u64 = 1024;
/// How many replaced nonces of one sender a node remembers (a sender draws a new one at each
/// start). Beyond that the oldest is forgotten.
const RETIRED_NONCES_MAX: usize = 64;
/// Longest membership claim accepted, in bytes.
const MEMBERS_CLAIM_BYTES_MAX: usize = 2048;
/// How to make a secret, for error messages.
pub(crate) const SECRET_HOWTO: &str = "make one with `head -c 32 /dev/urandom | base64 > cluster.secret` \
    and start every node with `--cluster-secret-file cluster.secret` (the same file on every node)";

/// The secret shared by the nodes of a cluster. Its `Debug` output never shows it.
#[derive(Clone)]
pub struct ClusterSecret {
    keyed: Arc<Hmac<Sha256>>,
    /// Where the time spent on authenticators is counted (`permit_peer_mac_seconds`), shared
    /// by every copy of this secret: signing, checking, and the body digests they cover.
    spent: Arc<OnceLock<MacSeconds>>,
}

/// The counter of seconds spent on peer authenticators.
pub(crate) type MacSeconds = prometheus_client::metrics::counter::Counter<f64, AtomicU64>;

impl fmt::Debug for ClusterSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ClusterSecret(redacted)")
    }
}

impl ClusterSecret {
    /// A secret from `bytes` with surrounding whitespace trimmed.
    ///
    /// # Errors
    /// When fewer than `CLUSTER_SECRET_BYTES_MIN` bytes remain, or the secret is easy to guess
    /// (`crate::entropy::check`).
    pub fn new(bytes: &[u8]) -> anyhow::Result<ClusterSecret> {
        let trimmed = bytes.trim_ascii();
        anyhow::ensure!(
            trimmed.len() >= CLUSTER_SECRET_BYTES_MIN,
            "the cluster secret has {} bytes, fewer than {CLUSTER_SECRET_BYTES_MIN}; {SECRET_HOWTO}",
            trimmed.len()
        );
        crate::entropy::check("the cluster secret", trimmed)
            .map_err(|e| anyhow::anyhow!("{e}; {SECRET_HOWTO}"))?;
        // Keyed once: every message's authenticator starts from a copy of this state.
        let keyed = <Hmac<Sha256> as Mac>::new_from_slice(trimmed).expect("HMAC takes keys of any length");
        Ok(ClusterSecret { keyed: Arc::new(keyed), spent: Arc::default() })
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

    /// Counts the time every copy of this secret spends on authenticators in `spent` (the
    /// node's metrics; once).
    pub(crate) fn count_time_in(&self, spent: MacSeconds) {
        let _ = self.spent.set(spent);
    }

    /// Runs `f`, counting its time as time spent on authenticators.
    fn timed<R>(&self, f: impl FnOnce() -> R) -> R {
        let started = std::time::Instant::now();
        let result = f();
        if let Some(spent) = self.spent.get() {
            spent.inc_by(started.elapsed().as_secs_f64());
        }
        result
    }

    /// The authenticator of one message.
    fn mac(&self, message: &Signed<'_>) -> Hmac<Sha256> {
        let mut mac = (*self.keyed).clone();
        mac.update(CONTEXT);
        // Every field has a fixed size or is length-prefixed, so no two messages share an input.
        mac.update(&message.from.to_be_bytes());
        mac.update(&message.to.to_be_bytes());
        mac.update(&message.nonce.receiver.to_be_bytes());
        mac.update(&message.nonce.sender.to_be_bytes());
        mac.update(&message.nonce.counter.to_be_bytes());
        for field in [message.method.as_bytes(), message.path.as_bytes(), message.members.as_bytes()] {
            mac.update(&(field.len() as u64).to_be_bytes());
            mac.update(field);
        }
        mac.update(message.body_sha256);
        mac
    }
}

/// What one authenticator binds.
struct Signed<'a> {
    from: NodeId,
    to: NodeId,
    nonce: Nonce,
    method: &'a str,
    path: &'a str,
    body_sha256: &'a [u8; 32],
    members: &'a str,
}

/// The value of `permit-peer-nonce`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Nonce {
    /// The receiving node's nonce, as the sender knows it (0: not known yet).
    receiver: u64,
    /// The sending node's nonce.
    sender: u64,
    /// The sender's message counter toward this receiver.
    counter: u64,
}

impl Nonce {
    fn header(self) -> HeaderValue {
        let mut text = [b'.'; 50];
        write_hex(&mut text[0..16], self.receiver);
        write_hex(&mut text[17..33], self.sender);
        write_hex(&mut text[34..50], self.counter);
        HeaderValue::from_bytes(&text).expect("hex digits and dots are a header value")
    }

    /// The nonce [`Nonce::header`] wrote: exactly three 16-digit hex fields joined by dots.
    fn parse(text: &str) -> Option<Nonce> {
        let text = text.as_bytes();
        if text.len() != 50 || text[16] != b'.' || text[33] != b'.' {
            return None;
        }
        Some(Nonce {
            receiver: read_hex(&text[0..16])?,
            sender: read_hex(&text[17..33])?,
            counter: read_hex(&text[34..50])?,
        })
    }
}

// The peer headers' names, parsed once: every peer message reads or writes each of them.
static ID: HeaderName = HeaderName::from_static(PEER_ID_HEADER);
static NONCE: HeaderName = HeaderName::from_static(PEER_NONCE_HEADER);
static BODY: HeaderName = HeaderName::from_static(PEER_BODY_HEADER);
static AUTH: HeaderName = HeaderName::from_static(PEER_AUTH_HEADER);
static MEMBERS: HeaderName = HeaderName::from_static(PEER_MEMBERS_HEADER);

/// Why a peer request is not authenticated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PeerAuthError {
    /// This node has no cluster secret, so it accepts no peer request.
    #[error("this node has no cluster secret and accepts no peer requests")]
    NoSecret,
    /// A header is missing or malformed.
    #[error("peer requests need the headers {PEER_ID_HEADER}, {PEER_NONCE_HEADER}, {PEER_BODY_HEADER} and {PEER_AUTH_HEADER}")]
    Missing,
    /// The message was signed for an earlier start of this node (or for none yet).
    #[error("the peer message was made for another start of this node; sign it again with the nonce in {PEER_NONCE_HEADER}")]
    StaleNonce,
    /// The authenticator does not match the message under this node's secret and id.
    #[error("the peer message is not authentic for this node of this cluster")]
    BadCredential,
    /// The message was taken before, or is older than the sender's window.
    #[error("the peer message was received before (a replay)")]
    Replayed,
    /// The body is not the one the message was signed with.
    #[error("the peer message's body is not the one it was signed with")]
    BodyMismatch,
}

/// The sending side of the peer channel of one node: signs each message for its receiver.
pub struct PeerSigner {
    secret: ClusterSecret,
    id: NodeId,
    nonce: u64,
    /// Per receiver: its nonce as last learnt, and the next counter.
    receivers: Mutex<HashMap<NodeId, (u64, u64)>>,
}

impl fmt::Debug for PeerSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerSigner").field("id", &self.id).finish_non_exhaustive()
    }
}

impl PeerSigner {
    /// The signer of node `id`, with a new random nonce.
    pub fn new(secret: ClusterSecret, id: NodeId) -> PeerSigner {
        PeerSigner { secret, id, nonce: new_nonce(), receivers: Mutex::default() }
    }

    /// Inserts into `headers` the peer headers of one message to node `to`: `method` on `path`
    /// (with its query) with `body`, and the sender's membership claim (`""` for none). Returns
    /// the receiver nonce it was signed for, for [`PeerSigner::learn`].
    pub fn sign(
        &self,
        to: NodeId,
        method: &str,
        path: &str,
        body: &[u8],
        members: &str,
        headers: &mut HeaderMap,
    ) -> u64 {
        let nonce = {
            let mut receivers = self.receivers.lock().unwrap_or_else(PoisonError::into_inner);
            let (receiver, next) = receivers.entry(to).or_insert((0, 1));
            let counter = *next;
            *next += 1;
            Nonce { receiver: *receiver, sender: self.nonce, counter }
        };
        let (body_sha256, tag) = self.secret.timed(|| {
            let body_sha256: [u8; 32] = Sha256::digest(body).into();
            let signed =
                Signed { from: self.id, to, nonce, method, path, body_sha256: &body_sha256, members };
            let tag: [u8; 32] = self.secret.mac(&signed).finalize().into_bytes().into();
            (body_sha256, tag)
        });
        headers.insert(ID.clone(), HeaderValue::from(self.id));
        headers.insert(NONCE.clone(), nonce.header());
        headers.insert(BODY.clone(), hex_value(&body_sha256));
        headers.insert(AUTH.clone(), hex_value(&tag));
        if members.is_empty() {
            headers.remove(&MEMBERS);
        } else if let Ok(value) = HeaderValue::try_from(members) {
            headers.insert(MEMBERS.clone(), value);
        }
        nonce.receiver
    }

    /// After node `to` refused a message signed for its nonce `used`: learns its current nonce
    /// from the refusal's `permit-peer-nonce`. True when that is a new one, so that the message
    /// (refused before anything of it was used) may be signed again and resent.
    pub fn learn(&self, to: NodeId, answer: &HeaderMap, used: u64) -> bool {
        let current = answer
            .get(&NONCE)
            .and_then(|value| value.to_str().ok())
            .and_then(|text| u64::from_str_radix(text, 16).ok())
            .filter(|nonce| *nonce != 0);
        let Some(current) = current else { return false };
        let mut receivers = self.receivers.lock().unwrap_or_else(PoisonError::into_inner);
        let (known, _) = receivers.entry(to).or_insert((0, 1));
        *known = current;
        current != used
    }
}

/// The receiving side of the peer channel of one node: checks each message's authenticator
/// and that it was not taken before.
pub(crate) struct PeerVerifier {
    secret: ClusterSecret,
    id: NodeId,
    nonce: u64,
    senders: Mutex<HashMap<NodeId, ReplayWindow>>,
}

impl fmt::Debug for PeerVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerVerifier").field("id", &self.id).finish_non_exhaustive()
    }
}

/// A peer message whose headers are authentic; its body still has to match ([`PeerHead::check_body`]).
#[derive(Debug, Clone)]
pub(crate) struct PeerHead {
    /// The node that sent it.
    pub(crate) sender: NodeId,
    body_sha256: [u8; 32],
    /// The secret it was checked with (its body's digest counts as authenticator time).
    secret: ClusterSecret,
    /// The sender's membership claim (`permit-peer-members`), `""` when it sent none.
    pub(crate) members: String,
}

impl PeerHead {
    /// Whether `body` is the body the message was signed with.
    ///
    /// # Errors
    /// [`PeerAuthError::BodyMismatch`] when it is not.
    pub(crate) fn check_body(&self, body: &[u8]) -> Result<(), PeerAuthError> {
        let digest: [u8; 32] = self.secret.timed(|| Sha256::digest(body).into());
        if digest == self.body_sha256 {
            Ok(())
        } else {
            Err(PeerAuthError::BodyMismatch)
        }
    }
}

impl PeerVerifier {
    /// The verifier of node `id`, with a new random nonce.
    pub(crate) fn new(secret: ClusterSecret, id: NodeId) -> PeerVerifier {
        PeerVerifier { secret, id, nonce: new_nonce(), senders: Mutex::default() }
    }

    /// This start's nonce, as the `permit-peer-nonce` header of a refusal.
    pub(crate) fn nonce_header(&self) -> (HeaderName, HeaderValue) {
        let value = HeaderValue::try_from(format!("{:016x}", self.nonce)).expect("hex digits");
        (NONCE.clone(), value)
    }

    /// Checks the peer headers of a request (`method` on `path`, with its query) before its body
    /// is read: they must be authentic for this node, made for this start of it, and not taken
    /// before. A message that passes is recorded, so that it is not taken again.
    ///
    /// # Errors
    /// [`PeerAuthError`] saying which check failed.
    pub(crate) fn verify_head(
        &self,
        method: &str,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<PeerHead, PeerAuthError> {
        let head = Head::parse(headers)?;
        if head.nonce.receiver != self.nonce {
            return Err(PeerAuthError::StaleNonce);
        }
        if !self.secret.timed(|| head.authentic(&self.secret, self.id, method, path)) {
            return Err(PeerAuthError::BadCredential);
        }
        // Only an authentic message moves a window: forged ones cannot refuse good ones.
        let mut senders = self.senders.lock().unwrap_or_else(PoisonError::into_inner);
        let window = senders.entry(head.sender).or_insert_with(|| ReplayWindow::new(head.nonce.sender));
        if !window.take(head.nonce.sender, head.nonce.counter) {
            return Err(PeerAuthError::Replayed);
        }
        Ok(PeerHead {
            sender: head.sender,
            body_sha256: head.body_sha256,
            secret: self.secret.clone(),
            members: head.members.to_owned(),
        })
    }
}

/// Whether `headers` carry a peer signature made with `secret` for node `to` (for any start of
/// it), checked without taking the message: for deciding where a request or connection belongs
/// (a peer's connection slot, the `Host` check), never for accepting a message, which is
/// [`PeerVerifier::verify_head`]'s job.
pub(crate) fn signed_for(
    secret: &ClusterSecret,
    to: NodeId,
    method: &str,
    path: &str,
    headers: &HeaderMap,
) -> bool {
    secret.timed(|| Head::parse(headers).is_ok_and(|head| head.authentic(secret, to, method, path)))
}

/// The peer headers of a request, parsed.
struct Head<'a> {
    sender: NodeId,
    nonce: Nonce,
    body_sha256: [u8; 32],
    tag: [u8; 32],
    members: &'a str,
}

impl<'a> Head<'a> {
    fn parse(headers: &'a HeaderMap) -> Result<Head<'a>, PeerAuthError> {
        let text = |name: &HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
        let sender: NodeId = text(&ID).and_then(|id| id.parse().ok()).ok_or(PeerAuthError::Missing)?;
        let nonce = text(&NONCE).and_then(Nonce::parse).ok_or(PeerAuthError::Missing)?;
        let body_sha256 = text(&BODY).and_then(decode_hex32).ok_or(PeerAuthError::Missing)?;
        let tag = text(&AUTH).and_then(decode_hex32).ok_or(PeerAuthError::Missing)?;
        let members = match headers.get(&MEMBERS) {
            None => "",
            Some(value) => value
                .to_str()
                .ok()
                .filter(|claim| claim.len() <= MEMBERS_CLAIM_BYTES_MAX)
                .ok_or(PeerAuthError::Missing)?,
        };
        Ok(Head { sender, nonce, body_sha256, tag, members })
    }

    /// Whether the authenticator is the one of this message to node `to` under `secret`.
    fn authentic(&self, secret: &ClusterSecret, to: NodeId, method: &str, path: &str) -> bool {
        let signed = Signed {
            from: self.sender,
            to,
            nonce: self.nonce,
            method,
            path,
            body_sha256: &self.body_sha256,
            members: self.members,
        };
        secret.mac(&signed).verify_slice(&self.tag).is_ok()
    }
}

/// The counters taken from one sender: those of its current nonce within [`REPLAY_WINDOW`] of
/// the highest, and the nonces it had before (a message of a replaced nonce is a replay).
#[derive(Debug)]
struct ReplayWindow {
    sender_nonce: u64,
    highest: u64,
    /// Bit `c % REPLAY_WINDOW` is set when counter `c` (within the window) was taken.
    taken: [u64; (REPLAY_WINDOW / 64) as usize],
    retired: VecDeque<u64>,
}

impl ReplayWindow {
    fn new(sender_nonce: u64) -> ReplayWindow {
        ReplayWindow {
            sender_nonce,
            highest: 0,
            taken: [0; (REPLAY_WINDOW / 64) as usize],
            retired: VecDeque::new(),
        }
    }

    fn bit(counter: u64) -> (usize, u64) {
        let slot = counter % REPLAY_WINDOW;
        ((slot / 64) as usize, 1 << (slot % 64))
    }

    /// Takes `counter` of `sender_nonce`; false when it was taken before or is too old.
    fn take(&mut self, sender_nonce: u64, counter: u64) -> bool {
        if sender_nonce != self.sender_nonce {
            if self.retired.contains(&sender_nonce) {
                return false;
            }
            // The sender restarted: its old nonce is retired for good.
            if self.retired.len() == RETIRED_NONCES_MAX {
                self.retired.pop_front();
            }
            self.retired.push_back(self.sender_nonce);
            *self = ReplayWindow {
                retired: std::mem::take(&mut self.retired),
                ..ReplayWindow::new(sender_nonce)
            };
        }
        if counter == 0 {
            return false;
        }
        let (word, mask) = ReplayWindow::bit(counter);
        if counter > self.highest {
            let advance = counter - self.highest;
            if advance >= REPLAY_WINDOW {
                self.taken = [0; (REPLAY_WINDOW / 64) as usize];
            } else {
                for cleared in self.highest + 1..counter {
                    let (word, mask) = ReplayWindow::bit(cleared);
                    self.taken[word] &= !mask;
                }
            }
            self.highest = counter;
        } else if self.highest - counter >= REPLAY_WINDOW || self.taken[word] & mask != 0 {
            return false;
        }
        self.taken[word] |= mask;
        true
    }
}

/// A nonce for this start of the node: random, never 0 (0 means "not known yet").
fn new_nonce() -> u64 {
    rand::random::<u64>() | 1
}

/// Writes `value` as 16 lowercase hex digits into `out`.
fn write_hex(out: &mut [u8], value: u64) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, digit) in out.iter_mut().enumerate().take(16) {
        *digit = DIGITS[((value >> (60 - 4 * i)) & 0xf) as usize];
    }
}

fn hex_value(bytes: &[u8; 32]) -> HeaderValue {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = [0u8; 64];
    for (pair, byte) in text.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    HeaderValue::from_bytes(&text).expect("hex digits are a header value")
}

/// The value of each ASCII hex digit (either case); [`NOT_HEX`] for every other byte. Every
/// peer message's headers are decoded with it, so it is a table rather than a parse per digit.
const HEX_VALUES: [u8; 256] = {
    let mut table = [NOT_HEX; 256];
    let mut i = 0;
    while i < 10 {
        table[b'0' as usize + i] = i as u8;
        i += 1;
    }
    let mut i = 0;
    while i < 6 {
        table[b'a' as usize + i] = 10 + i as u8;
        table[b'A' as usize + i] = 10 + i as u8;
        i += 1;
    }
    table
};
const NOT_HEX: u8 = 0xff;

/// The value of 16 hex digits, or `None`.
fn read_hex(digits: &[u8]) -> Option<u64> {
    let mut value = 0u64;
    let mut invalid = 0u8;
    for &digit in digits {
        let nibble = HEX_VALUES[usize::from(digit)];
        invalid |= nibble & 0xf0;
        value = value << 4 | u64::from(nibble & 0xf);
    }
    (digits.len() == 16 && invalid == 0).then_some(value)
}

/// The 32 bytes of a 64-digit hex string (either case), or `None`.
fn decode_hex32(text: &str) -> Option<[u8; 32]> {
    let text = text.as_bytes();
    if text.len() != 64 {
        return None;
    }
    let mut bytes = [0u8; 32];
    let mut invalid = 0u8;
    for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
        let (high, low) = (HEX_VALUES[usize::from(pair[0])], HEX_VALUES[usize::from(pair[1])]);
        invalid |= (high | low) & 0xf0;
        *byte = high << 4 | (low & 0xf);
    }
    (invalid == 0).then_some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ClusterSecret {
        ClusterSecret::new(b"  0123456789abcdef-secret\n").unwrap()
    }

    /// A message from node 2 to `verifier`'s node, signed for its current nonce.
    fn signed(signer: &PeerSigner, verifier: &PeerVerifier, to: NodeId, body: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let used = signer.sign(to, "POST", "/raft/append", body, "1.1.0:1,2", &mut headers);
        let mut refusal = HeaderMap::new();
        let (name, value) = verifier.nonce_header();
        refusal.insert(name, value);
        if signer.learn(to, &refusal, used) {
            signer.sign(to, "POST", "/raft/append", body, "1.1.0:1,2", &mut headers);
        }
        headers
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
    fn a_message_is_good_once_for_its_receiver_route_and_body() {
        let signer = PeerSigner::new(secret(), 2);
        let node1 = PeerVerifier::new(secret(), 1);
        let node3 = PeerVerifier::new(secret(), 3);
        let headers = signed(&signer, &node1, 1, b"body");
        let head = node1.verify_head("POST", "/raft/append", &headers).unwrap();
        assert_eq!((head.sender, head.members.as_str()), (2, "1.1.0:1,2"));
        assert_eq!(head.check_body(b"body"), Ok(()));
        assert_eq!(head.check_body(b"another body"), Err(PeerAuthError::BodyMismatch));
        // Once only.
        assert_eq!(node1.verify_head("POST", "/raft/append", &headers).unwrap_err(), PeerAuthError::Replayed);
        // Not toward another node, even one whose nonce it was made for.
        let mut to_node3 = headers.clone();
        let value = HeaderValue::try_from(format!(
            "{:016x}.{}",
            node3.nonce,
            headers[PEER_NONCE_HEADER].to_str().unwrap().split_once('.').unwrap().1
        ))
        .unwrap();
        to_node3.insert(PEER_NONCE_HEADER, value);
        assert_eq!(
            node3.verify_head("POST", "/raft/append", &to_node3).unwrap_err(),
            PeerAuthError::BadCredential
        );
        // Not on another route, nor with another membership claim.
        let fresh = signed(&signer, &node1, 1, b"body");
        assert_eq!(
            node1.verify_head("POST", "/raft/vote", &fresh).unwrap_err(),
            PeerAuthError::BadCredential
        );
        let mut claimed = fresh.clone();
        claimed.insert(PEER_MEMBERS_HEADER, HeaderValue::from_static("9.9.9:2"));
        assert_eq!(
            node1.verify_head("POST", "/raft/append", &claimed).unwrap_err(),
            PeerAuthError::BadCredential
        );
        assert!(node1.verify_head("POST", "/raft/append", &fresh).is_ok());
    }

    #[test]
    fn a_message_for_another_start_or_secret_is_refused() {
        let signer = PeerSigner::new(secret(), 2);
        let node1 = PeerVerifier::new(secret(), 1);
        let mut headers = HeaderMap::new();
        signer.sign(1, "POST", "/raft/vote", b"", "", &mut headers);
        assert_eq!(node1.verify_head("POST", "/raft/vote", &headers).unwrap_err(), PeerAuthError::StaleNonce);
        let restarted = PeerVerifier::new(secret(), 1);
        let headers = signed(&signer, &node1, 1, b"");
        assert_eq!(
            restarted.verify_head("POST", "/raft/vote", &headers).unwrap_err(),
            PeerAuthError::StaleNonce
        );
        let other =
            PeerSigner::new(ClusterSecret::new(b"an0ther-Cluster-Secret-9f8e7d6c5b4a3f2e1d").unwrap(), 2);
        let forged = signed(&other, &node1, 1, b"");
        assert_eq!(
            node1.verify_head("POST", "/raft/vote", &forged).unwrap_err(),
            PeerAuthError::BadCredential
        );
        let mut missing = headers.clone();
        missing.remove(PEER_BODY_HEADER);
        assert_eq!(node1.verify_head("POST", "/raft/vote", &missing).unwrap_err(), PeerAuthError::Missing);
    }

    #[test]
    fn the_window_takes_each_counter_once_in_any_order_and_retires_old_nonces() {
        let mut window = ReplayWindow::new(7);
        for counter in [5, 3, 4, 1, 2] {
            assert!(window.take(7, counter), "{counter}");
        }
        assert!(!window.take(7, 3));
        assert!(window.take(7, 5 + REPLAY_WINDOW));
        assert!(!window.take(7, 5), "older than the window");
        assert!(window.take(7, 6 + 5), "a gap inside the window is still open");
        assert!(!window.take(7, 0));
        // The sender restarted with nonce 8: nonce 7 is retired for good.
        assert!(window.take(8, 1));
        assert!(!window.take(7, 10_000));
        assert!(window.take(8, 2));
    }

    #[test]
    fn hex_reads_back_and_refuses_other_lengths_and_non_digits() {
        let bytes: [u8; 32] = std::array::from_fn(|i| (i * 37) as u8);
        let value = hex_value(&bytes);
        assert_eq!(decode_hex32(value.to_str().unwrap()), Some(bytes));
        assert_eq!(decode_hex32(&value.to_str().unwrap().to_uppercase()), Some(bytes));
        assert_eq!(decode_hex32(&value.to_str().unwrap()[1..]), None);
        assert_eq!(decode_hex32(&"0g".repeat(32)), None);
        let nonce = Nonce { receiver: 0xfedc_ba98_7654_3210, sender: 1, counter: 0x2a };
        assert_eq!(nonce.header(), "fedcba9876543210.0000000000000001.000000000000002a");
        assert_eq!(Nonce::parse(nonce.header().to_str().unwrap()), Some(nonce));
        for bad in [
            "fedcba9876543210.0000000000000001.00000000000002a",
            "fedcba9876543210.0000000000000001.000000000000002a.",
            "fedcba9876543210-0000000000000001.000000000000002a",
            "fedcba987654321g.0000000000000001.000000000000002a",
            "fedcba9876543210.000000000000000 .000000000000002a",
            "+edcba9876543210.0000000000000001.000000000000002a",
        ] {
            assert_eq!(Nonce::parse(bad), None, "{bad}");
        }
        for byte in 0..=255u8 {
            let expected = (byte as char).to_digit(16).map(|digit| digit as u8);
            let table = HEX_VALUES[usize::from(byte)];
            assert_eq!((table != NOT_HEX).then_some(table), expected, "{byte}");
        }
    }
}
