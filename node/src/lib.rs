//! The node tools: what a device driver (`gsv node`) answers when the
//! kernel routes `fs.read|write|edit|delete|search|watch|unwatch` or
//! `shell.exec` to it.
//!
//! [`NodeTools::handle`] takes a call name and its JSON args (with `target`
//! already removed by the kernel) and returns the JSON `data` of the
//! response. Operation failures — a missing file, a path outside the root,
//! an unknown shell session, bad arguments — are `Ok({ok:false, error,
//! code})`, the reference's second error level; [`ToolError`] is only for
//! what is not an operation result (an unknown call, a cancelled request).
//! The `fs.*` calls answer in the one contract of `gsv_protocol::fs`
//! (shapes, output format, [`gsv_protocol::fs::FsError`]).
//!
//! Every path resolves inside one [`NodeRoot`]; see `root.rs` for how. This
//! module knows nothing of frames or sockets: the driver connection owns
//! those (see `DESIGN.md`).

pub mod driver;
mod fs;
pub mod output;
mod root;
mod shell;
mod watch;

use std::sync::Arc;

use gsv_protocol::OpResult;
use gsv_protocol::fs::FsError;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

pub use root::{NodeRoot, PathError};
pub use shell::{
    COMPLETED_SESSION_RETENTION, DEFAULT_TIMEOUT_MS, DEFAULT_YIELD_MS, ExecEvent, ExecEventKind,
    ExecEventOutbox, KILL_GRACE_MS, MAX_OUTPUT_CHARS, MAX_RUNNING_SESSIONS, MAX_YIELD_MS,
    MIN_YIELD_MS, ShellConfig, TAIL_CHARS,
};

pub use fs::MAX_SEARCH_FILE_BYTES;
pub use watch::{DEBOUNCE, WatchSignal};

/// The calls a node answers, as `driver.implements` patterns.
pub const IMPLEMENTS: [&str; 8] = [
    "fs.read",
    "fs.write",
    "fs.edit",
    "fs.delete",
    "fs.search",
    "fs.watch",
    "fs.unwatch",
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

/// A `shell.exec` operation failure, reported as `data: {ok:false, error,
/// code}` (`fs.*` failures are [`FsError`]s).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum OpError {
    #[error("Invalid arguments: {0}")]
    InvalidArgs(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Path(#[from] PathError),
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
}

impl OpError {
    fn code(&self) -> &'static str {
        match self {
            Self::InvalidArgs(_) | Self::Invalid(_) => "invalid_argument",
            Self::Path(e) => e.code(),
            Self::Spawn { .. } => "io",
            Self::UnknownSession(_) => "unknown_session",
            Self::StdinClosed(_) => "stdin_closed",
            Self::TooManySessions(_) => "too_many_sessions",
        }
    }

    fn into_data(self) -> Value {
        json!({"ok": false, "error": self.to_string(), "code": self.code()})
    }
}

/// The node's tool set over one root. Clones share the root, the shell
/// sessions and the watches.
#[derive(Debug, Clone)]
pub struct NodeTools {
    root: Arc<NodeRoot>,
    shells: Arc<shell::ShellSessions>,
    watches: Arc<watch::NodeWatches>,
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
            watches: Arc::default(),
        }
    }

    pub fn root(&self) -> &NodeRoot {
        &self.root
    }

    /// Exec events (`exec.status` payloads) for the driver to send.
    pub fn exec_events(&self) -> Arc<ExecEventOutbox> {
        self.shells.events.clone()
    }

    /// A new kernel connection: earlier watches stop, and the signals
    /// (`fs.changed`, `fs.watch.ended`) of the watches opened from now on
    /// come out of the receiver, for the driver to send.
    pub fn watch_signals(&self) -> tokio::sync::mpsc::Receiver<WatchSignal> {
        self.watches.connect()
    }

    /// The kernel connection dropped: every watch stops.
    pub fn stop_watches(&self) {
        self.watches.disconnect();
    }

    /// Watches running now.
    pub fn watch_count(&self) -> usize {
        self.watches.count()
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
            "fs.read" => return self.fs(call, args, fs::read).await,
            "fs.write" => return self.fs(call, args, fs::write).await,
            "fs.edit" => return self.fs(call, args, fs::edit).await,
            "fs.delete" => return self.fs(call, args, fs::delete).await,
            "fs.search" => {
                let cancel = cancel.clone();
                return self
                    .fs(call, args, move |root, a| fs::search(root, a, &cancel))
                    .await;
            }
            "fs.watch" | "fs.unwatch" => return self.watch_call(call, args),
            "shell.exec" => match parse(args) {
                Ok(a) => self.shells.exec(&self.root, a).await,
                Err(e) => Err(e),
            },
            other => return Err(ToolError::UnknownCall(other.to_owned())),
        };
        match outcome {
            Ok(data) => Ok(data),
            Err(e) => {
                tracing::debug!(event = "node.tool.failed", call, error = %e);
                Ok(e.into_data())
            }
        }
    }

    /// `fs.watch` / `fs.unwatch`: answered at once (the watcher runs on).
    fn watch_call(&self, call: &str, args: Value) -> Result<Value, ToolError> {
        let bad = |e: serde_json::Error| {
            gsv_protocol::watch::WatchFailure::Op(FsError::InvalidArgs(e.to_string()).into())
        };
        let answer = if call == "fs.watch" {
            match serde_json::from_value(args) {
                Ok(a) => serde_json::to_value(self.watches.watch(&self.root, a)),
                Err(e) => serde_json::to_value(OpResult::<(), _>::Failed(bad(e))),
            }
        } else {
            match serde_json::from_value(args) {
                Ok(a) => serde_json::to_value(self.watches.unwatch(a)),
                Err(e) => serde_json::to_value(OpResult::<(), _>::Failed(bad(e))),
            }
        };
        answer.map_err(|e| ToolError::Internal {
            call: call.to_owned(),
            message: e.to_string(),
        })
    }

    /// Runs a filesystem tool on the blocking pool; its answer is the
    /// contract's `OpResult` (a cancelled search answers nothing).
    async fn fs<A, T, F>(&self, call: &str, args: Value, f: F) -> Result<Value, ToolError>
    where
        A: DeserializeOwned + Send + 'static,
        T: Serialize + Send + 'static,
        F: FnOnce(&NodeRoot, A) -> Result<T, FsError> + Send + 'static,
    {
        let outcome = match serde_json::from_value::<A>(args) {
            Err(e) => Err(FsError::InvalidArgs(e.to_string())),
            Ok(args) => {
                let root = self.root.clone();
                tokio::task::spawn_blocking(move || f(&root, args))
                    .await
                    .map_err(|e| ToolError::Internal {
                        call: call.to_owned(),
                        message: e.to_string(),
                    })?
            }
        };
        if let Err(e) = &outcome {
            if matches!(e, FsError::Cancelled { .. }) {
                return Err(ToolError::Cancelled);
            }
            tracing::debug!(event = "node.tool.failed", call, error = %e);
        }
        serde_json::to_value(OpResult::from(outcome)).map_err(|e| ToolError::Internal {
            call: call.to_owned(),
            message: e.to_string(),
        })
    }
}
