//! The node tools: what a device driver (`gsv node`) answers when the
//! kernel routes `fs.read|write|edit|delete|search` or `shell.exec` to it.
//!
//! [`NodeTools::handle`] takes a call name and its JSON args (with `target`
//! already removed by the kernel) and returns the JSON `data` of the
//! response. Operation failures — a missing file, a path outside the root,
//! an unknown shell session, bad arguments — are `Ok({ok:false, error,
//! code})`, the reference's second error level; [`ToolError`] is only for
//! what is not an operation result (an unknown call, a cancelled request).
//!
//! Every path resolves inside one [`NodeRoot`]; see `root.rs` for how. This
//! module knows nothing of frames or sockets: the driver connection owns
//! those (see `DESIGN.md`).

pub mod driver;
mod fs;
pub mod output;
mod root;
mod shell;

use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use root::{NodeRoot, PathError};
pub use shell::{
    COMPLETED_SESSION_RETENTION, DEFAULT_TIMEOUT_MS, DEFAULT_YIELD_MS, ExecEvent, ExecEventKind,
    ExecEventOutbox, KILL_GRACE_MS, MAX_OUTPUT_CHARS, MAX_RUNNING_SESSIONS, MAX_YIELD_MS,
    MIN_YIELD_MS, ShellConfig, TAIL_CHARS,
};

pub use fs::{
    MAX_EDIT_BYTES, MAX_IMAGE_BYTES, MAX_READ_CONTENT_BYTES, MAX_SEARCH_FILE_BYTES,
    MAX_SEARCH_LINE_CHARS, MAX_SEARCH_MATCHES,
};

/// The calls a node answers, as `driver.implements` patterns.
pub const IMPLEMENTS: [&str; 6] = [
    "fs.read",
    "fs.write",
    "fs.edit",
    "fs.delete",
    "fs.search",
    "shell.exec",
];

/// A failure that is not an operation result: the driver turns it into a
/// frame-level error (`ok:false`, [`ToolError::code`]) or, for
/// [`ToolError::Cancelled`], sends nothing at all.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    #[error("unknown syscall: {0}")]
    UnknownCall(String),
    #[error("request cancelled")]
    Cancelled,
    #[error("{call} failed inside the node: {message}")]
    Internal { call: String, message: String },
}

impl ToolError {
    /// The frame-level error code (the kernel's failure table).
    pub fn code(&self) -> i64 {
        match self {
            Self::UnknownCall(_) => 404,
            Self::Cancelled => 499,
            Self::Internal { .. } => 500,
        }
    }
}

/// An operation failure, reported as `data: {ok:false, error, code}`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum OpError {
    #[error("Invalid arguments: {0}")]
    InvalidArgs(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Path(#[from] PathError),
    #[error("Failed to {op} '{path}': {source}")]
    Io {
        op: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("Binary file ({content_type}, {size} bytes) - not a text file: '{path}'")]
    Binary {
        path: String,
        content_type: String,
        size: u64,
    },
    #[error("'{path}' is {size} bytes, over the {limit}-byte limit")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("oldString not found in '{path}'")]
    NoMatch { path: String },
    #[error(
        "oldString found {count} times in '{path}'. Use replaceAll: true or provide more context to make it unique."
    )]
    MultipleMatches { path: String, count: usize },
    #[error("Invalid include pattern '{pattern}': {reason}")]
    InvalidInclude { pattern: String, reason: String },
    #[error("Unknown shell session: {0}")]
    UnknownSession(String),
    #[error("stdin is closed for shell session: {0}")]
    StdinClosed(String),
    #[error("Too many running shell commands (at most {0}); wait for one to end or kill one")]
    TooManySessions(usize),
    #[error("Failed to start shell '{shell}': {source}")]
    Spawn {
        shell: String,
        source: std::io::Error,
    },
    #[error("Search cancelled")]
    Cancelled,
}

impl OpError {
    fn code(&self) -> &'static str {
        match self {
            Self::InvalidArgs(_) | Self::Invalid(_) | Self::InvalidInclude { .. } => {
                "invalid_argument"
            }
            Self::Path(e) => e.code(),
            Self::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => "not_found",
            Self::Io { .. } | Self::Spawn { .. } => "io",
            Self::Binary { .. } => "binary_file",
            Self::TooLarge { .. } => "too_large",
            Self::NoMatch { .. } => "no_match",
            Self::MultipleMatches { .. } => "multiple_matches",
            Self::UnknownSession(_) => "unknown_session",
            Self::StdinClosed(_) => "stdin_closed",
            Self::TooManySessions(_) => "too_many_sessions",
            Self::Cancelled => "cancelled",
        }
    }

    fn into_data(self) -> Value {
        json!({"ok": false, "error": self.to_string(), "code": self.code()})
    }
}

/// The node's tool set over one root. Clones share the root and the shell
/// sessions.
#[derive(Debug, Clone)]
pub struct NodeTools {
    root: Arc<NodeRoot>,
    shells: Arc<shell::ShellSessions>,
}

fn parse<T: DeserializeOwned>(args: Value) -> Result<T, OpError> {
    serde_json::from_value(args).map_err(|e| OpError::InvalidArgs(e.to_string()))
}

impl NodeTools {
    pub fn new(root: NodeRoot) -> Self {
        Self::with_config(root, ShellConfig::default())
    }

    pub fn with_config(root: NodeRoot, shell: ShellConfig) -> Self {
        Self {
            root: Arc::new(root),
            shells: Arc::new(shell::ShellSessions::new(shell)),
        }
    }

    pub fn root(&self) -> &NodeRoot {
        &self.root
    }

    /// Exec events (`exec.status` payloads) for the driver to send.
    pub fn exec_events(&self) -> Arc<ExecEventOutbox> {
        self.shells.events.clone()
    }

    /// Answers one call. Dropping the returned future cancels it: a search
    /// stops between files, and a `shell.exec` still inside its first wait
    /// has its process group killed (a poll of a background session does
    /// not kill it).
    pub async fn handle(&self, call: &str, args: Value) -> Result<Value, ToolError> {
        let cancel = CancellationToken::new();
        // Cancels the blocking search when this future is dropped.
        let _guard = cancel.clone().drop_guard();
        self.run(call, args, &cancel).await
    }

    /// [`Self::handle`], also ending when `cancel` fires (then
    /// `Err(Cancelled)`, and the driver sends no response).
    pub async fn handle_cancellable(
        &self,
        call: &str,
        args: Value,
        cancel: &CancellationToken,
    ) -> Result<Value, ToolError> {
        let inner = cancel.child_token();
        let _guard = inner.clone().drop_guard();
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(ToolError::Cancelled),
            r = self.run(call, args, &inner) => r,
        }
    }

    async fn run(
        &self,
        call: &str,
        args: Value,
        cancel: &CancellationToken,
    ) -> Result<Value, ToolError> {
        let outcome = match call {
            "fs.read" => self.blocking(call, args, fs::read).await?,
            "fs.write" => self.blocking(call, args, fs::write).await?,
            "fs.edit" => self.blocking(call, args, fs::edit).await?,
            "fs.delete" => self.blocking(call, args, fs::delete).await?,
            "fs.search" => {
                let cancel = cancel.clone();
                self.blocking(call, args, move |root, a| fs::search(root, a, &cancel))
                    .await?
            }
            "shell.exec" => match parse(args) {
                Ok(a) => self.shells.exec(&self.root, a).await,
                Err(e) => Err(e),
            },
            other => return Err(ToolError::UnknownCall(other.to_owned())),
        };
        match outcome {
            Ok(data) => Ok(data),
            Err(OpError::Cancelled) => Err(ToolError::Cancelled),
            Err(e) => {
                tracing::debug!(event = "node.tool.failed", call, error = %e);
                Ok(e.into_data())
            }
        }
    }

    /// Runs a filesystem tool on the blocking pool.
    async fn blocking<A, F>(
        &self,
        call: &str,
        args: Value,
        f: F,
    ) -> Result<Result<Value, OpError>, ToolError>
    where
        A: DeserializeOwned + Send + 'static,
        F: FnOnce(&NodeRoot, A) -> Result<Value, OpError> + Send + 'static,
    {
        let args: A = match parse(args) {
            Ok(a) => a,
            Err(e) => return Ok(Err(e)),
        };
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || f(&root, args))
            .await
            .map_err(|e| ToolError::Internal {
                call: call.to_owned(),
                message: e.to_string(),
            })
    }
}
