//! The log's storage errors, typed. openraft's traits and its flush callback take `io::Error`, so
//! the store returns `io::Error`s that carry a [`LogError`] (`From<LogError> for io::Error`);
//! [`LogError::of`] reads it back, and sorts an error from the OS into full or I/O by kind. The
//! wording is the message the fail-stop latch shows.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// What went wrong with the log's storage.
#[derive(Debug)]
pub enum LogError {
    /// The disk is full (`ENOSPC`, or over a quota: `EDQUOT`).
    Full(io::Error),
    /// Another failure of the disk or file system, of kind `kind`.
    Io {
        /// The failure's kind.
        kind: io::ErrorKind,
        /// The error from the OS.
        source: io::Error,
    },
    /// Records that are not what the store wrote: the file, the offset in it, and what is wrong.
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where in it the bad record starts (0 for a file read whole).
        offset: u64,
        /// What is wrong.
        why: String,
    },
    /// Another process holds the log's lock (`raft-log/lock`).
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A record of a format version this build does not read.
    UnknownFormat {
        /// The file, when it was read whole (`meta`, `early`).
        path: Option<PathBuf>,
        /// The version byte found.
        version: u8,
    },
    /// An earlier write failed: the store is latched and refuses every later one.
    Refused,
}

impl LogError {
    /// The log error `e` carries, or what an error from the OS is: full or I/O by kind.
    pub fn of(e: &io::Error) -> LogError {
        if let Some(typed) = e.get_ref().and_then(|inner| inner.downcast_ref::<LogError>()) {
            return typed.copy();
        }
        match e.raw_os_error() {
            Some(libc::ENOSPC | libc::EDQUOT) => LogError::Full(copy(e)),
            _ => LogError::Io { kind: e.kind(), source: copy(e) },
        }
    }

    /// A copy of this error.
    fn copy(&self) -> LogError {
        match self {
            LogError::Full(e) => LogError::Full(copy(e)),
            LogError::Io { kind, source } => LogError::Io { kind: *kind, source: copy(source) },
            LogError::Corrupt { path, offset, why } => {
                LogError::Corrupt { path: path.clone(), offset: *offset, why: why.clone() }
            }
            LogError::Locked { path } => LogError::Locked { path: path.clone() },
            LogError::UnknownFormat { path, version } => {
                LogError::UnknownFormat { path: path.clone(), version: *version }
            }
            LogError::Refused => LogError::Refused,
        }
    }

    /// `e`, the failure to decode file `path` read whole: of an unknown format, or corrupt.
    pub(super) fn in_file(path: PathBuf, e: &io::Error) -> io::Error {
        match LogError::of(e) {
            LogError::UnknownFormat { version, .. } => LogError::UnknownFormat { path: Some(path), version },
            _ => LogError::Corrupt { path, offset: 0, why: e.to_string() },
        }
        .into()
    }

    /// The `io::ErrorKind` of the `io::Error` that carries it.
    fn kind(&self) -> io::ErrorKind {
        match self {
            LogError::Full(e) => e.kind(),
            LogError::Io { kind, .. } => *kind,
            LogError::Corrupt { .. } | LogError::UnknownFormat { .. } => io::ErrorKind::InvalidData,
            LogError::Locked { .. } => io::ErrorKind::WouldBlock,
            LogError::Refused => io::ErrorKind::Other,
        }
    }
}

/// A copy of `e` (an `io::Error` cannot be cloned): rebuilt from its OS code, or its kind and text.
fn copy(e: &io::Error) -> io::Error {
    match e.raw_os_error() {
        Some(code) => io::Error::from_raw_os_error(code),
        None => io::Error::new(e.kind(), e.to_string()),
    }
}

impl fmt::Display for LogError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LogError::Full(e) | LogError::Io { source: e, .. } => e.fmt(f),
            LogError::Corrupt { path, why, .. } => write!(f, "{}: {why}", path.display()),
            LogError::Locked { .. } => f.write_str("it is locked (is another server using this data dir?)"),
            LogError::UnknownFormat { path, version } => {
                if let Some(path) = path {
                    write!(f, "{}: ", path.display())?;
                }
                write!(
                    f,
                    "log format version {version} is not the one this build reads ({}): a newer build wrote it",
                    super::codec::LOG_FORMAT_VERSION
                )
            }
            LogError::Refused => f.write_str("refused after an earlier storage failure"),
        }
    }
}

impl std::error::Error for LogError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LogError::Full(e) | LogError::Io { source: e, .. } => Some(e),
            _ => None,
        }
    }
}

impl From<LogError> for io::Error {
    fn from(e: LogError) -> io::Error {
        io::Error::new(e.kind(), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_from_the_os_is_full_or_io_by_kind_and_a_typed_one_reads_back() {
        let full = io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(matches!(LogError::of(&full), LogError::Full(_)));
        assert_eq!(LogError::of(&full).to_string(), full.to_string(), "the OS's wording");
        let denied = io::Error::from_raw_os_error(libc::EACCES);
        assert!(matches!(LogError::of(&denied), LogError::Io { kind: io::ErrorKind::PermissionDenied, .. }));
        let corrupt: io::Error = LogError::Corrupt {
            path: "/d/0.seg".into(),
            offset: 16,
            why: "CRC mismatch at offset 16".into(),
        }
        .into();
        assert_eq!(corrupt.kind(), io::ErrorKind::InvalidData);
        assert_eq!(corrupt.to_string(), "/d/0.seg: CRC mismatch at offset 16");
        assert!(matches!(LogError::of(&corrupt), LogError::Corrupt { offset: 16, .. }));
        let version: io::Error = LogError::UnknownFormat { path: None, version: 9 }.into();
        let meta = LogError::in_file("/d/meta".into(), &version);
        assert_eq!(
            meta.to_string(),
            "/d/meta: log format version 9 is not the one this build reads (2): a newer build wrote it"
        );
        assert!(matches!(LogError::of(&meta), LogError::UnknownFormat { version: 9, path: Some(_) }));
    }
}
