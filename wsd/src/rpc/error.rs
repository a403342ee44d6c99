//! The error every RPC failure becomes: a stable wire code plus a message.

use wsd_sync::{ErrorCode, SyncError};

/// A failure as it crosses the wire: one stable [`ErrorCode`] and a message
/// naming the offending path, hash, id or limit.
///
/// On the wire it is a Cap'n Proto exception whose reason reads
/// `"{code}: {message}"` (see `schema/workspace.capnp`). A broken or closed
/// connection is reported as [`ErrorCode::Shutdown`] with a message starting
/// `connection lost`: the caller's right move is the same as for a daemon
/// that is shutting down, namely to reconnect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WireError {
    pub code: ErrorCode,
    pub message: String,
}

impl WireError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WireError {
        WireError {
            code,
            message: message.into(),
        }
    }

    /// A request over a documented limit (`ELIMIT`), naming the limit.
    pub fn limit(limit: &str, max: usize, got: usize) -> WireError {
        WireError::new(ErrorCode::Limit, format!("{limit} is {max}, got {got}"))
    }

    /// Fails with `ELIMIT` unless `got <= max`.
    pub fn check_limit(limit: &str, max: usize, got: usize) -> Result<(), WireError> {
        if got > max {
            return Err(WireError::limit(limit, max, got));
        }
        Ok(())
    }

    pub(crate) fn connection_lost(detail: impl std::fmt::Display) -> WireError {
        WireError::new(ErrorCode::Shutdown, format!("connection lost: {detail}"))
    }

    /// True for a broken connection or a daemon shutting down: a retry on a
    /// fresh connection may succeed.
    pub fn is_retryable(&self) -> bool {
        self.code == ErrorCode::Shutdown
    }
}

impl From<SyncError> for WireError {
    fn from(e: SyncError) -> WireError {
        let code = e.code();
        if let SyncError::Remote { message, .. } = e {
            return WireError { code, message };
        }
        // `SyncError`'s messages already start with their code; keep the
        // code once, in the field.
        let text = e.to_string();
        let prefix = format!("{code}: ");
        let message = text
            .strip_prefix(&prefix)
            .map(str::to_owned)
            .unwrap_or(text);
        WireError { code, message }
    }
}

impl From<WireError> for SyncError {
    fn from(e: WireError) -> SyncError {
        SyncError::Remote {
            code: e.code,
            message: e.message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sync_error_keeps_its_code_and_loses_the_duplicated_prefix() {
        let e = WireError::from(SyncError::NotFound { path: "a/b".into() });
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(e.message, "a/b: no such file or directory");
        assert_eq!(e.to_string(), "ENOENT: a/b: no such file or directory");
        let back = SyncError::from(e);
        assert_eq!(back.code(), ErrorCode::NotFound);
    }
}
