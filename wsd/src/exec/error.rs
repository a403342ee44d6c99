use wsd_sync::ErrorCode;

/// Errors of the exec runner and its log. Every variant maps to exactly one
/// wire [`ErrorCode`] (see [`ExecError::code`]); the message starts with that
/// code so a log line or a wire message is self-describing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// No exec with this id is live or retained (never existed, disposed,
    /// or swept after its TTL).
    #[error("ENOENT: no exec with id {id:?}")]
    NotFound { id: String },
    /// The exec was disposed while this subscriber was attached.
    #[error("ENOENT: exec {id:?} was disposed")]
    Disposed { id: String },
    /// `exec` with the id of an exec that is still running.
    #[error("EEXEC_BUSY: exec {id:?} is still running")]
    Busy { id: String },
    /// The resume point is below the retained window: events with
    /// `seq < first_retained` were evicted.
    #[error(
        "ELOG_TRUNCATED: exec {id:?}: cannot resume after seq {after}, the oldest retained event is seq {first_retained}"
    )]
    Truncated {
        id: String,
        after: u64,
        first_retained: u64,
    },
    /// `write_stdin` on an exec whose stdin is not open (started without
    /// `stdin_open`, closed, or exited).
    #[error("EINVAL: stdin of exec {id:?} is closed")]
    StdinClosed { id: String },
    /// A malformed argument (command, id, env name, signal, ...).
    #[error("EINVAL: {0}")]
    Invalid(String),
    /// `cwd` is not a directory inside the workspace root.
    #[error("EINVAL: cwd {cwd:?}: {reason}")]
    InvalidCwd { cwd: String, reason: String },
    /// A documented limit was exceeded (see `DESIGN.md`).
    #[error("ELIMIT: {limit} is {max}, got {got}")]
    Limit {
        limit: &'static str,
        max: u64,
        got: u64,
    },
    /// An OS-level failure (spawning, signalling, the log writer thread).
    #[error("EIO: {context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A SQLite failure in the exec log, or a log whose schema this build
    /// does not understand.
    #[error("EIO: exec log: {0}")]
    Storage(String),
    /// The manager is shutting down and accepts no new execs.
    #[error("ESHUTDOWN: wsd is shutting down")]
    ShuttingDown,
    /// The exec's runner went away without logging an exit event (the
    /// runtime shut down, or its log could not be written). The exec gets an
    /// `EXIT_LOST` exit when the daemon next opens the log.
    #[error("EIO: exec {id:?}: the runner stopped before logging an exit event: {reason}")]
    RunnerStopped { id: String, reason: String },
}

impl ExecError {
    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ExecError::NotFound { .. } | ExecError::Disposed { .. } => ErrorCode::NotFound,
            ExecError::Busy { .. } => ErrorCode::ExecBusy,
            ExecError::Truncated { .. } => ErrorCode::LogTruncated,
            ExecError::Invalid(_)
            | ExecError::InvalidCwd { .. }
            | ExecError::StdinClosed { .. } => ErrorCode::Invalid,
            ExecError::Limit { .. } => ErrorCode::Limit,
            ExecError::ShuttingDown => ErrorCode::Shutdown,
            ExecError::Io { .. } | ExecError::Storage(_) | ExecError::RunnerStopped { .. } => {
                ErrorCode::Io
            }
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> ExecError {
        ExecError::Io {
            context: context.into(),
            source,
        }
    }

    /// Checks `got <= max` for the named limit.
    pub(crate) fn check_limit(
        limit: &'static str,
        max: usize,
        got: usize,
    ) -> Result<(), ExecError> {
        if got > max {
            return Err(ExecError::Limit {
                limit,
                max: max as u64,
                got: got as u64,
            });
        }
        Ok(())
    }
}

impl From<rusqlite::Error> for ExecError {
    fn from(e: rusqlite::Error) -> ExecError {
        ExecError::Storage(e.to_string())
    }
}
