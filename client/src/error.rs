//! The error every wsd call fails with: a stable wire code, a message, and
//! the path, hash, id or address at fault.

use wsd_sync::{ErrorCode, SyncError};

/// A failure of a wsd call, on either side of the wire: one stable
/// [`ErrorCode`] (defined once, in `wsd-sync`), a message naming the
/// offending path, hash, id, limit or address, and that subject on its own
/// when there is one, so a caller never has to dig it out of the message.
///
/// On the wire it is a Cap'n Proto exception whose reason reads
/// `"{code}: {message}"`, followed by `"\nsubject: {subject}"` when there is
/// a subject (see `schema/workspace.capnp`); [`crate::convert`] is the one
/// place that encodes and decodes it. A broken or closed connection is
/// reported as [`ErrorCode::Shutdown`] with a message starting
/// `connection lost`: the caller's right move is the same as for a daemon
/// that is shutting down, namely to reconnect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct WsdError {
    pub code: ErrorCode,
    pub message: String,
    /// The path, hash, exec id or address at fault, when the error has one.
    pub subject: Option<String>,
}

impl WsdError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> WsdError {
        WsdError {
            code,
            message: message.into(),
            subject: None,
        }
    }

    /// The same error, naming `subject` as the thing at fault.
    pub fn with_subject(mut self, subject: impl Into<String>) -> WsdError {
        self.subject = Some(subject.into());
        self
    }

    /// A request over a documented limit (`ELIMIT`), naming the limit.
    pub fn limit(limit: &str, max: usize, got: usize) -> WsdError {
        WsdError::new(ErrorCode::Limit, format!("{limit} is {max}, got {got}")).with_subject(limit)
    }

    /// Fails with `ELIMIT` unless `got <= max`.
    pub fn check_limit(limit: &str, max: usize, got: usize) -> Result<(), WsdError> {
        if got > max {
            return Err(WsdError::limit(limit, max, got));
        }
        Ok(())
    }

    /// A connection that broke or closed (`ESHUTDOWN`, retryable).
    pub fn connection_lost(detail: impl std::fmt::Display) -> WsdError {
        WsdError::new(ErrorCode::Shutdown, format!("connection lost: {detail}"))
    }

    /// True for a broken connection or a daemon shutting down: a retry on a
    /// fresh connection may succeed.
    pub fn is_retryable(&self) -> bool {
        self.code == ErrorCode::Shutdown
    }
}

/// The path or hash a [`SyncError`] names, taken from its fields.
fn sync_subject(e: &SyncError) -> Option<String> {
    match e {
        SyncError::NotFound { path } | SyncError::InvalidPath { path, .. } => Some(path.clone()),
        SyncError::UnknownHash { hash, .. } | SyncError::HashMismatch { hash, .. } => {
            Some(hash.to_string())
        }
        SyncError::Limit { limit, .. } => Some((*limit).to_owned()),
        _ => None,
    }
}

impl From<SyncError> for WsdError {
    fn from(e: SyncError) -> WsdError {
        WsdError {
            code: e.code(),
            message: e.detail(),
            subject: sync_subject(&e),
        }
    }
}

impl From<WsdError> for SyncError {
    fn from(e: WsdError) -> SyncError {
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
    fn a_sync_error_keeps_its_code_and_subject_and_loses_the_duplicated_prefix() {
        let e = WsdError::from(SyncError::NotFound { path: "a/b".into() });
        assert_eq!(e.code, ErrorCode::NotFound);
        assert_eq!(e.message, "a/b: no such file or directory");
        assert_eq!(e.subject.as_deref(), Some("a/b"));
        assert_eq!(e.to_string(), "ENOENT: a/b: no such file or directory");
        let back = SyncError::from(e);
        assert_eq!(back.code(), ErrorCode::NotFound);
    }

    #[test]
    fn a_limit_error_names_the_limit_as_its_subject() {
        let e = WsdError::check_limit("entries per next", 4, 5).unwrap_err();
        assert_eq!(e.code, ErrorCode::Limit);
        assert_eq!(e.subject.as_deref(), Some("entries per next"));
    }
}
