//! The record codec. A record is `len: u32 LE | crc32(payload): u32 LE | payload`; the payload
//! is a kind byte (`KIND_ENTRY` or `KIND_COMMITTED`) then the value, encoded as every stored
//! entry, vote, purge point and commit index is: [`LOG_FORMAT_VERSION`], then postcard.
//!
//! What `record` writes, `parse` reads back whole (asserted on write: no record is longer
//! than the open accepts); what `parse` refuses is a torn or corrupt record, an error for the
//! open to judge (`open.rs`), never a panic.

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::LogError;
use crate::raft::{io_error, LogId};

/// First byte of every stored log entry and metadata value. Bump when the layout changes.
/// Version 2: `ExpireSessions` carries the term that decided it.
pub const LOG_FORMAT_VERSION: u8 = 2;

/// Encodes a stored log entry or metadata value: [`LOG_FORMAT_VERSION`], then postcard.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_extend(value, vec![LOG_FORMAT_VERSION]).expect("encoding to memory cannot fail")
}

/// Decodes a stored log entry or metadata value: [`LOG_FORMAT_VERSION`], then postcard.
///
/// # Errors
/// When the record is empty, of another version, or not a valid encoding of `T`; never panics,
/// whatever the bytes (the property tests in `tests/decoders.rs` feed it random ones).
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, std::io::Error> {
    match bytes.split_first() {
        Some((&LOG_FORMAT_VERSION, body)) => postcard::from_bytes(body).map_err(io_error),
        Some((&version, _)) => Err(LogError::UnknownFormat { path: None, version }.into()),
        None => Err(std::io::Error::other("empty log record")),
    }
}

/// Bytes of a record's header: its length and its CRC.
pub(super) const HEADER: usize = 8;
/// A record that holds a log entry.
pub(super) const KIND_ENTRY: u8 = 1;
/// A record that holds the commit index (a restart hint).
pub(super) const KIND_COMMITTED: u8 = 2;
/// Largest record accepted on open (a length above it is a torn or corrupt header).
pub(super) const RECORD_MAX: usize = 256 * 1024 * 1024;

/// The index of an encoded entry, read from its leading log id without decoding the rest.
pub(super) fn peek_index(body: &[u8]) -> Result<u64, std::io::Error> {
    match body.split_first() {
        Some((&LOG_FORMAT_VERSION, rest)) => {
            postcard::take_from_bytes::<LogId>(rest).map(|(log_id, _)| log_id.index).map_err(io_error)
        }
        Some((&version, _)) => Err(LogError::UnknownFormat { path: None, version }.into()),
        None => Err(std::io::Error::other("empty log record")),
    }
}

/// Appends to `out` the record of kind `kind` holding `body` (an encoded value).
pub(super) fn record(kind: u8, body: &[u8], out: &mut Vec<u8>) {
    // A record the open would refuse as too long would lose the log from it on at the next start.
    assert!(body.len() < RECORD_MAX, "a {}-byte record is longer than the open accepts", body.len() + 1);
    let len = (body.len() + 1) as u32;
    let start = out.len();
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&[kind]);
    hasher.update(body);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&hasher.finalize().to_le_bytes());
    out.push(kind);
    out.extend_from_slice(body);
    assert_eq!(out.len() - start, HEADER + len as usize, "a record is its header and its payload");
}

/// One record read back: its kind and body, or where and why reading stopped.
pub(super) enum Parsed<'a> {
    Record {
        kind: u8,
        body: &'a [u8],
        next: usize,
    },
    /// Zeros: the end of the written part.
    End,
    Bad(String),
}

/// Reads the record at offset `at` of `data` (a segment's bytes).
pub(super) fn parse(data: &[u8], at: usize) -> Parsed<'_> {
    assert!(at <= data.len(), "offset {at} is past the {} bytes read", data.len());
    if at + HEADER > data.len() {
        return if data[at..].iter().all(|b| *b == 0) {
            Parsed::End
        } else {
            Parsed::Bad("torn header".into())
        };
    }
    let len = u32::from_le_bytes(data[at..at + 4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(data[at + 4..at + 8].try_into().expect("4 bytes"));
    if len == 0 && crc == 0 {
        // Zeros end the records only if nothing was written after them: a batch whose first
        // sector never reached the disk, while a later one did, leaves valid records behind a
        // zeroed one. They were never acknowledged; kept, an entry later written over the zeros
        // with the same length would put them back in the log.
        return if data[at..].iter().all(|b| *b == 0) {
            Parsed::End
        } else {
            Parsed::Bad(format!("zeros at offset {at} with records written after them"))
        };
    }
    if len == 0 || len > RECORD_MAX || at + HEADER + len > data.len() {
        return Parsed::Bad(format!("record length {len} at offset {at} runs past the data"));
    }
    let payload = &data[at + HEADER..at + HEADER + len];
    if crc32fast::hash(payload) != crc {
        return Parsed::Bad(format!("CRC mismatch at offset {at}"));
    }
    let next = at + HEADER + len;
    assert!(next <= data.len() && next > at, "a record read ends after it starts, within the data");
    Parsed::Record { kind: payload[0], body: &payload[1..], next }
}
