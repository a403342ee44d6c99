//! The seam between the RPC server's `shell` half and the exec runner.
//!
//! The server decodes a `Shell` call, calls the [`ExecBackend`], and pumps
//! the returned [`ExecEvents`] into the caller's flow-controlled event sink.
//! The runner owns everything else (process groups, the durable log,
//! retention, limits). Both sides run on the server's `LocalSet` thread, so
//! nothing here needs to be `Send`; blocking work (SQLite, waiting on
//! pipes) belongs on the runner's own threads.

use futures::future::LocalBoxFuture;

use super::WireError;

/// A command to start (`Shell.exec`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// Run as `/bin/sh -c command`.
    pub command: String,
    /// Relative to the workspace root; `None` is the root. Outside the root
    /// is `EINVAL` (the runner checks).
    pub cwd: Option<String>,
    /// `None`: the runner picks a fresh unique id. A live id is `EEXEC_BUSY`.
    pub id: Option<String>,
    /// Added to the runner's allowlisted environment.
    pub env: Vec<(String, String)>,
    /// Written to the command's stdin, then the pipe is closed.
    pub stdin: Option<Vec<u8>>,
    pub timeout_ms: Option<u64>,
}

/// Where a re-attaching reader starts (`Shell.getExec`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResumeFrom {
    /// Every retained event from seq 1.
    #[default]
    Start,
    /// Events with `seq > n`; older than the retained log is `ELOG_TRUNCATED`.
    After(u64),
    /// Only events logged from now on.
    Tail,
}

/// The signal `killExec` sends to the exec's process group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExecSignal {
    #[default]
    Term,
    Kill,
    Int,
    Hup,
}

/// What one event carries. Payloads are bytes, never re-encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEventKind {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The exit status; always the last event of an exec.
    Exit(i32),
}

/// One logged event of an exec. `seq` starts at 1 and grows by one per
/// event of that exec, across stdout and stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecEvent {
    pub id: String,
    pub seq: u64,
    pub kind: ExecEventKind,
}

/// A live subscription to one exec's events.
#[allow(async_fn_in_trait)]
pub trait ExecEvents {
    /// The next event in seq order, waiting for it if the command has not
    /// produced it yet; `Ok(None)` once the exit event has been returned.
    /// The server awaits the caller's acknowledgement of each event before
    /// calling `next` again, so an implementation that reads the command's
    /// pipes on demand gets end-to-end backpressure. Dropping the
    /// subscription detaches the reader; the exec keeps running.
    async fn next(&mut self) -> Result<Option<ExecEvent>, WireError>;
}

/// The exec runner as the RPC server sees it. Errors carry their wire code:
/// `ENOENT` (unknown or disposed id), `EEXEC_BUSY`, `ELOG_TRUNCATED`,
/// `EINVAL`, `ELIMIT`, `EIO`.
#[allow(async_fn_in_trait)]
pub trait ExecBackend: 'static {
    type Events: ExecEvents + 'static;

    /// Starts a command; returns its id and a subscription from seq 1.
    async fn exec(&self, request: ExecRequest) -> Result<(String, Self::Events), WireError>;

    /// Re-attaches to a live or finished exec.
    async fn get(&self, id: &str, from: ResumeFrom) -> Result<Self::Events, WireError>;

    /// Signals the process group; a no-op once the exec exited.
    async fn kill(&self, id: &str, signal: ExecSignal) -> Result<(), WireError>;

    /// Drops the exec's log, killing it first if it is still live.
    async fn dispose(&self, id: &str) -> Result<(), WireError>;
}

/// The object-safe face of [`ExecBackend`] the server stores, so the server
/// is not generic over the runner and "no runner" is simply `None`.
/// A started exec as the server holds it: its id and its subscription.
pub(crate) type Started = (String, Box<dyn DynExecEvents>);

pub(crate) trait DynExecBackend {
    fn exec(&self, request: ExecRequest) -> LocalBoxFuture<'_, Result<Started, WireError>>;
    fn get<'a>(
        &'a self,
        id: &'a str,
        from: ResumeFrom,
    ) -> LocalBoxFuture<'a, Result<Box<dyn DynExecEvents>, WireError>>;
    fn kill<'a>(
        &'a self,
        id: &'a str,
        signal: ExecSignal,
    ) -> LocalBoxFuture<'a, Result<(), WireError>>;
    fn dispose<'a>(&'a self, id: &'a str) -> LocalBoxFuture<'a, Result<(), WireError>>;
}

pub(crate) trait DynExecEvents {
    fn next(&mut self) -> LocalBoxFuture<'_, Result<Option<ExecEvent>, WireError>>;
}

impl<T: ExecEvents> DynExecEvents for T {
    fn next(&mut self) -> LocalBoxFuture<'_, Result<Option<ExecEvent>, WireError>> {
        Box::pin(ExecEvents::next(self))
    }
}

impl<T: ExecBackend> DynExecBackend for T {
    fn exec(&self, request: ExecRequest) -> LocalBoxFuture<'_, Result<Started, WireError>> {
        Box::pin(async move {
            let (id, events) = ExecBackend::exec(self, request).await?;
            Ok((id, Box::new(events) as Box<dyn DynExecEvents>))
        })
    }

    fn get<'a>(
        &'a self,
        id: &'a str,
        from: ResumeFrom,
    ) -> LocalBoxFuture<'a, Result<Box<dyn DynExecEvents>, WireError>> {
        Box::pin(async move {
            let events = ExecBackend::get(self, id, from).await?;
            Ok(Box::new(events) as Box<dyn DynExecEvents>)
        })
    }

    fn kill<'a>(
        &'a self,
        id: &'a str,
        signal: ExecSignal,
    ) -> LocalBoxFuture<'a, Result<(), WireError>> {
        Box::pin(ExecBackend::kill(self, id, signal))
    }

    fn dispose<'a>(&'a self, id: &'a str) -> LocalBoxFuture<'a, Result<(), WireError>> {
        Box::pin(ExecBackend::dispose(self, id))
    }
}
