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
use wsd_client::{ExecEvent, ExecRequest, PtyRequest, ResumeFrom, Signal as ExecSignal};
use wsd_sync::ErrorCode;

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

    /// Signals the process group; `ENOENT` once the exec is not running.
    async fn kill(&self, id: &str, signal: ExecSignal) -> Result<(), WireError>;

    /// Drops the exec's log, killing it first if it is still live.
    async fn dispose(&self, id: &str) -> Result<(), WireError>;

    /// Queues bytes for the stdin of an exec started with `stdin_open`.
    async fn write_stdin(&self, id: &str, bytes: Vec<u8>) -> Result<(), WireError>;

    /// Closes the stdin of an exec after its queued writes.
    async fn close_stdin(&self, id: &str) -> Result<(), WireError>;

    /// The ids of the commands still running, in any order (for `status`).
    async fn live(&self) -> Vec<String>;

    /// Starts a program on a new pseudo-terminal; returns its id and a
    /// subscription from seq 1. A runner without terminals answers `EIO`.
    async fn start_pty(&self, request: PtyRequest) -> Result<(String, Self::Events), WireError> {
        let _ = request;
        Err(no_terminals())
    }

    /// Queues typed input for a terminal.
    async fn pty_write(&self, id: &str, bytes: Vec<u8>) -> Result<(), WireError> {
        let _ = (id, bytes);
        Err(no_terminals())
    }

    /// Sets a terminal's window size.
    async fn pty_resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), WireError> {
        let _ = (id, cols, rows);
        Err(no_terminals())
    }
}

fn no_terminals() -> WireError {
    WireError::new(ErrorCode::Io, "this exec runner has no terminals")
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
    fn write_stdin<'a>(
        &'a self,
        id: &'a str,
        bytes: Vec<u8>,
    ) -> LocalBoxFuture<'a, Result<(), WireError>>;
    fn close_stdin<'a>(&'a self, id: &'a str) -> LocalBoxFuture<'a, Result<(), WireError>>;
    fn live(&self) -> LocalBoxFuture<'_, Vec<String>>;
    fn start_pty(&self, request: PtyRequest) -> LocalBoxFuture<'_, Result<Started, WireError>>;
    fn pty_write<'a>(
        &'a self,
        id: &'a str,
        bytes: Vec<u8>,
    ) -> LocalBoxFuture<'a, Result<(), WireError>>;
    fn pty_resize<'a>(
        &'a self,
        id: &'a str,
        cols: u16,
        rows: u16,
    ) -> LocalBoxFuture<'a, Result<(), WireError>>;
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

    fn write_stdin<'a>(
        &'a self,
        id: &'a str,
        bytes: Vec<u8>,
    ) -> LocalBoxFuture<'a, Result<(), WireError>> {
        Box::pin(ExecBackend::write_stdin(self, id, bytes))
    }

    fn close_stdin<'a>(&'a self, id: &'a str) -> LocalBoxFuture<'a, Result<(), WireError>> {
        Box::pin(ExecBackend::close_stdin(self, id))
    }

    fn live(&self) -> LocalBoxFuture<'_, Vec<String>> {
        Box::pin(ExecBackend::live(self))
    }

    fn start_pty(&self, request: PtyRequest) -> LocalBoxFuture<'_, Result<Started, WireError>> {
        Box::pin(async move {
            let (id, events) = ExecBackend::start_pty(self, request).await?;
            Ok((id, Box::new(events) as Box<dyn DynExecEvents>))
        })
    }

    fn pty_write<'a>(
        &'a self,
        id: &'a str,
        bytes: Vec<u8>,
    ) -> LocalBoxFuture<'a, Result<(), WireError>> {
        Box::pin(ExecBackend::pty_write(self, id, bytes))
    }

    fn pty_resize<'a>(
        &'a self,
        id: &'a str,
        cols: u16,
        rows: u16,
    ) -> LocalBoxFuture<'a, Result<(), WireError>> {
        Box::pin(ExecBackend::pty_resize(self, id, cols, rows))
    }
}
