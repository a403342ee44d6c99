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
/// fault. `Display` is `"{code}: {detail}"` ([`SyncError::detail`] is the
/// part after the code), so a wire error is built from the parts, never by
/// cutting a display string.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SyncError {
    NotFound {
        path: String,
    },
    UnknownHash {
        hash: Hash,
        path: Option<String>,
    },
    InvalidPath {
        path: String,
        reason: &'static str,
    },
    Invalid(String),
    Limit {
        limit: &'static str,
        max: u64,
        got: u64,
    },
    HashMismatch {
        hash: Hash,
        actual: Hash,
    },
    Protocol(String),
    InvariantViolated {
        applied: ChangeCursor,
        pushed: ChangeCursor,
    },
    Io {
        context: String,
        source: std::io::Error,
    },
    Storage(String),
    /// An error that arrived over the wire, with its code preserved.
    Remote {
        code: ErrorCode,
        message: String,
    },
}

impl std::fmt::Display for SyncError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.code())?;
        self.fmt_detail(f)
    }
}

/// [`SyncError::fmt_detail`] as a `Display`.
struct Detail<'a>(&'a SyncError);

impl std::fmt::Display for Detail<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt_detail(f)
    }
}

impl SyncError {
    /// The message without its code: what a wire error carries.
    pub fn detail(&self) -> String {
        Detail(self).to_string()
    }

    fn fmt_detail(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SyncError::NotFound { path } => write!(f, "{path}: no such file or directory"),
            SyncError::UnknownHash { hash, path } => {
                write!(f, "object {hash} is not held")?;
                match path {
                    Some(p) => write!(f, " (needed by {p})"),
                    None => Ok(()),
                }
            }
            SyncError::InvalidPath { path, reason } => write!(f, "{path:?}: {reason}"),
            SyncError::Invalid(m) | SyncError::Protocol(m) | SyncError::Storage(m) => {
                f.write_str(m)
            }
            SyncError::Limit { limit, max, got } => write!(f, "{limit} is {max}, got {got}"),
            SyncError::HashMismatch { hash, actual } => write!(
                f,
                "object {hash} does not match its bytes (sha256 is {actual})"
            ),
            SyncError::InvariantViolated { applied, pushed } => write!(
                f,
                "cross-side invariant violated: remote applied push cursor {applied} is behind our push cursor {pushed}"
            ),
            SyncError::Io { context, source } => write!(f, "{context}: {source}"),
            SyncError::Remote { message, .. } => f.write_str(message),
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_display_is_the_code_then_the_detail() {
        let errors = [
            SyncError::NotFound { path: "a/b".into() },
            SyncError::Invalid("bad".into()),
            SyncError::Limit {
                limit: "entries per push",
                max: 4,
                got: 5,
            },
            SyncError::Remote {
                code: ErrorCode::Auth,
                message: "no".into(),
            },
        ];
        for e in errors {
            assert_eq!(e.to_string(), format!("{}: {}", e.code(), e.detail()));
        }
        let e = SyncError::NotFound { path: "a/b".into() };
        assert_eq!(e.to_string(), "ENOENT: a/b: no such file or directory");
    }
}
