use wsd_sync::ErrorCode;

/// Errors of the exec runner and its log. Every variant maps to exactly one
/// wire [`ErrorCode`] (see [`ExecError::code`]). `Display` is
/// `"{code}: {detail}"`, so a log line is self-describing; a wire error is
/// built from [`ExecError::code`] and [`ExecError::detail`], never by
/// cutting the display text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExecError {
    /// No exec with this id is live or retained (never existed, disposed,
    /// or swept after its TTL).
    NotFound { id: String },
    /// A signal for an exec that is retained but no longer running (it
    /// exited, or was lost with a previous daemon): there is no process
    /// left to signal.
    NotRunning { id: String },
    /// The exec was disposed while this subscriber was attached.
    Disposed { id: String },
    /// `exec` with the id of an exec that is still running.
    Busy { id: String },
    /// The resume point is below the retained window: events with
    /// `seq < first_retained` were evicted.
    Truncated {
        id: String,
        after: u64,
        first_retained: u64,
    },
    /// `write_stdin` on an exec whose stdin is not open (started without
    /// `stdin_open`, closed, or exited).
    StdinClosed { id: String },
    /// `ptyWrite` or `ptyResize` on an exec that was not started on a
    /// terminal.
    NotATerminal { id: String },
    /// `ptyWrite` or `ptyResize` on a terminal whose program has exited.
    TerminalClosed { id: String },
    /// A malformed argument (command, id, env name, signal, ...).
    Invalid(String),
    /// `cwd` is not a directory inside the workspace root.
    InvalidCwd { cwd: String, reason: String },
    /// A documented limit was exceeded (see `DESIGN.md`).
    Limit {
        limit: &'static str,
        max: u64,
        got: u64,
    },
    /// An OS-level failure (spawning, signalling, the log writer thread).
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A SQLite failure in the exec log, or a log whose schema this build
    /// does not understand.
    Storage(String),
    /// The manager is shutting down and accepts no new execs.
    ShuttingDown,
    /// The exec's runner went away without logging an exit event (the
    /// runtime shut down, or its log could not be written). The exec gets an
    /// `EXIT_LOST` exit when the daemon next opens the log.
    RunnerStopped { id: String, reason: String },
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: ", self.code())?;
        self.fmt_detail(f)
    }
}

/// [`ExecError::fmt_detail`] as a `Display`.
struct Detail<'a>(&'a ExecError);

impl std::fmt::Display for Detail<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt_detail(f)
    }
}

impl ExecError {
    /// The message without its code: what a wire error carries.
    pub fn detail(&self) -> String {
        Detail(self).to_string()
    }

    /// The exec id at fault, when there is one.
    pub fn subject(&self) -> Option<&str> {
        match self {
            ExecError::NotFound { id }
            | ExecError::NotRunning { id }
            | ExecError::Disposed { id }
            | ExecError::Busy { id }
            | ExecError::Truncated { id, .. }
            | ExecError::StdinClosed { id }
            | ExecError::NotATerminal { id }
            | ExecError::TerminalClosed { id }
            | ExecError::RunnerStopped { id, .. } => Some(id),
            ExecError::InvalidCwd { cwd, .. } => Some(cwd),
            ExecError::Limit { limit, .. } => Some(limit),
            _ => None,
        }
    }

    fn fmt_detail(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::NotFound { id } => write!(f, "no exec with id {id:?}"),
            ExecError::NotRunning { id } => write!(f, "exec {id:?} is not running (it has exited)"),
            ExecError::Disposed { id } => write!(f, "exec {id:?} was disposed"),
            ExecError::Busy { id } => write!(f, "exec {id:?} is still running"),
            ExecError::Truncated {
                id,
                after,
                first_retained,
            } => write!(
                f,
                "exec {id:?}: cannot resume after seq {after}, the oldest retained event is seq {first_retained}"
            ),
            ExecError::StdinClosed { id } => write!(f, "stdin of exec {id:?} is closed"),
            ExecError::NotATerminal { id } => write!(f, "exec {id:?} is not a terminal"),
            ExecError::TerminalClosed { id } => {
                write!(f, "terminal {id:?} has exited; it takes no more input")
            }
            ExecError::Invalid(m) => f.write_str(m),
            ExecError::InvalidCwd { cwd, reason } => write!(f, "cwd {cwd:?}: {reason}"),
            ExecError::Limit { limit, max, got } => write!(f, "{limit} is {max}, got {got}"),
            ExecError::Io { context, source } => write!(f, "{context}: {source}"),
            ExecError::Storage(m) => write!(f, "exec log: {m}"),
            ExecError::ShuttingDown => f.write_str("wsd is shutting down"),
            ExecError::RunnerStopped { id, reason } => write!(
                f,
                "exec {id:?}: the runner stopped before logging an exit event: {reason}"
            ),
        }
    }

    /// The stable wire code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            ExecError::NotFound { .. }
            | ExecError::NotRunning { .. }
            | ExecError::Disposed { .. } => ErrorCode::NotFound,
            ExecError::Busy { .. } => ErrorCode::ExecBusy,
            ExecError::Truncated { .. } => ErrorCode::LogTruncated,
            ExecError::Invalid(_)
            | ExecError::InvalidCwd { .. }
            | ExecError::StdinClosed { .. }
            | ExecError::NotATerminal { .. }
            | ExecError::TerminalClosed { .. } => ErrorCode::Invalid,
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
        // A damaged page met in a session keeps its close from stamping
        // the log clean, so the next open checks it.
        wsd_sqlite::note_error(&e);
        ExecError::Storage(e.to_string())
    }
}

impl From<wsd_sqlite::OpenError> for ExecError {
    fn from(e: wsd_sqlite::OpenError) -> ExecError {
        ExecError::Storage(e.to_string())
    }
}
