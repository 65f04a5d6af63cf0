//! The encoding of the segment log's records (`segment_log.rs`): every stored entry, vote,
//! purge point and commit index is [`LOG_FORMAT_VERSION`], then postcard.

use serde::de::DeserializeOwned;
use serde::Serialize;

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
        Some((&LOG_FORMAT_VERSION, body)) => postcard::from_bytes(body).map_err(super::io_error),
        Some((version, _)) => Err(std::io::Error::other(format!("log format version {version} unsupported"))),
        None => Err(std::io::Error::other("empty log record")),
    }
}
