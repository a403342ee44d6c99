use crate::{ChangeCursor, Hash};

/// The stable wire code every error carries, so callers branch without
/// matching strings. The names are the contract's; see `sync-protocol.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    NotFound,
    UnknownHash,
    ExecBusy,
    LogTruncated,
    Shutdown,
    Auth,
    Protocol,
    Invalid,
    Limit,
    Io,
    /// A deadline passed on the caller's side (connect, handshake, or no
    /// progress on a call). Never sent by a daemon; the connection it
    /// happened on is dropped.
    Timeout,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 11] = [
        ErrorCode::NotFound,
        ErrorCode::UnknownHash,
        ErrorCode::ExecBusy,
        ErrorCode::LogTruncated,
        ErrorCode::Shutdown,
        ErrorCode::Auth,
        ErrorCode::Protocol,
        ErrorCode::Invalid,
        ErrorCode::Limit,
        ErrorCode::Io,
        ErrorCode::Timeout,
    ];

    /// The code as it appears on the wire (`ENOENT`, `EUNKNOWN_HASH`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::NotFound => "ENOENT",
            ErrorCode::UnknownHash => "EUNKNOWN_HASH",
            ErrorCode::ExecBusy => "EEXEC_BUSY",
            ErrorCode::LogTruncated => "ELOG_TRUNCATED",
            ErrorCode::Shutdown => "ESHUTDOWN",
            ErrorCode::Auth => "EAUTH",
            ErrorCode::Protocol => "EPROTOCOL",
            ErrorCode::Invalid => "EINVAL",
            ErrorCode::Limit => "ELIMIT",
            ErrorCode::Io => "EIO",
            ErrorCode::Timeout => "ETIMEDOUT",
        }
    }

    /// Parses a wire code; `None` for a code this build does not know.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the sync core and of the stores that implement it. Every variant
/// maps to exactly one [`ErrorCode`]; the message names the path or hash at
/// fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    #[error("ENOENT: {path}: no such file or directory")]
    NotFound { path: String },
    #[error("EUNKNOWN_HASH: object {hash} is not held{}", .path.as_ref().map(|p| format!(" (needed by {p})")).unwrap_or_default())]
    UnknownHash { hash: Hash, path: Option<String> },
    #[error("EINVAL: {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },
    #[error("EINVAL: {0}")]
    Invalid(String),
    #[error("ELIMIT: {limit} is {max}, got {got}")]
    Limit {
        limit: &'static str,
        max: u64,
        got: u64,
    },
    #[error("EPROTOCOL: object {hash} does not match its bytes (sha256 is {actual})")]
    HashMismatch { hash: Hash, actual: Hash },
    #[error("EPROTOCOL: {0}")]
    Protocol(String),
    #[error(
        "EPROTOCOL: cross-side invariant violated: remote applied push cursor {applied} is behind our push cursor {pushed}"
    )]
    InvariantViolated {
        applied: ChangeCursor,
        pushed: ChangeCursor,
    },
    #[error("EIO: {context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("EIO: {0}")]
    Storage(String),
    /// An error that arrived over the wire, with its code preserved.
    #[error("{code}: {message}")]
    Remote { code: ErrorCode, message: String },
}

impl SyncError {
    pub fn code(&self) -> ErrorCode {
        match self {
            SyncError::NotFound { .. } => ErrorCode::NotFound,
            SyncError::UnknownHash { .. } => ErrorCode::UnknownHash,
            SyncError::InvalidPath { .. } | SyncError::Invalid(_) => ErrorCode::Invalid,
            SyncError::Limit { .. } => ErrorCode::Limit,
            SyncError::HashMismatch { .. }
            | SyncError::Protocol(_)
            | SyncError::InvariantViolated { .. } => ErrorCode::Protocol,
            SyncError::Io { .. } | SyncError::Storage(_) => ErrorCode::Io,
            SyncError::Remote { code, .. } => *code,
        }
    }

    pub fn io(context: impl Into<String>, source: std::io::Error) -> SyncError {
        SyncError::Io {
            context: context.into(),
            source,
        }
    }

    /// Checks `got <= max` for the named limit.
    pub fn check_limit(limit: &'static str, max: usize, got: usize) -> Result<(), SyncError> {
        if got > max {
            return Err(SyncError::Limit {
                limit,
                max: max as u64,
                got: got as u64,
            });
        }
        Ok(())
    }
}
