//! The `Shell` half of the server: decodes calls for the [`ExecBackend`]
//! and pumps each subscription's events into the caller's sink.
//!
//! [`ExecBackend`]: super::ExecBackend

use std::rc::Rc;

use futures::future::LocalBoxFuture;

use wsd_schema::workspace_capnp as wire;
use wsd_sync::ErrorCode;

use super::WireError;
use super::conn::{Conn, run_call};
use super::convert::{
    exec_event_to, exec_request_from, pty_request_from, resume_from, signal_from, text,
    wire_error_to,
};
use super::exec_backend::{DynExecBackend, DynExecEvents};
use super::limits::{MAX_PTY_WRITE_BYTES, MAX_STDIN_WRITE_BYTES};
use super::stream::{self, StreamWindow, message_bytes};

/// Reads the store's current rev on the store thread, after every call
/// queued before it (so after the settle that preceded an exit), for an
/// exit that does not carry its settle's rev (one replayed from the log).
pub(crate) type CurrentRev = Rc<dyn Fn() -> LocalBoxFuture<'static, Result<u64, WireError>>>;

pub(crate) struct ShellServer {
    exec: Option<Rc<dyn DynExecBackend>>,
    conn: Rc<Conn>,
    current_rev: CurrentRev,
}

impl ShellServer {
    pub(crate) fn new(
        exec: Option<Rc<dyn DynExecBackend>>,
        conn: Rc<Conn>,
        current_rev: CurrentRev,
    ) -> Self {
        ShellServer {
            exec,
            conn,
            current_rev,
        }
    }

    fn backend(&self) -> Result<Rc<dyn DynExecBackend>, WireError> {
        self.exec
            .clone()
            .ok_or_else(|| WireError::new(ErrorCode::Io, "exec not available"))
    }
}

/// Starts delivering `events` into `sink` on a local task; the returned
/// capability aborts the delivery when the caller drops it. The exit goes
/// with the store's rev after the command's settle (`ExecEvent.rev`; for
/// one replayed from the log, the rev as of its sending).
fn subscribe(
    mut events: Box<dyn DynExecEvents>,
    sink: wire::exec_event_sink::Client,
    current_rev: CurrentRev,
) -> wire::exec_subscription::Client {
    let task = tokio::task::spawn_local(async move {
        let mut window = StreamWindow::new();
        loop {
            match events.next().await {
                Ok(Some(mut event)) => {
                    if event.is_exit() && event.rev == 0 {
                        // 0 ("not said") if the store cannot answer: the
                        // caller then pulls as it would anyway.
                        event.rev = current_rev().await.unwrap_or(0);
                    }
                    let mut req = stream::exec_event_call(&sink);
                    exec_event_to(req.get().init_event(), &event);
                    let size = message_bytes(req.get().into_reader().total_size());
                    // Waits while the caller's stream window is full: this is
                    // where a slow reader slows the runner.
                    if let Err(e) = window.send(req, size).await {
                        tracing::debug!(error = %e, "exec event sink failed; delivery stops");
                        return;
                    }
                }
                Ok(None) => {
                    if let Err(e) = window.finish().await {
                        tracing::debug!(error = %e, "exec event sink failed; delivery stops");
                        return;
                    }
                    let _ = sink.end_request().send().promise.await;
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "exec event subscription failed");
                    let _ = window.finish().await;
                    let mut req = sink.end_request();
                    wire_error_to(req.get().init_error(), &e);
                    let _ = req.send().promise.await;
                    return;
                }
            }
        }
    });
    capnp_rpc::new_client(Subscription {
        task: task.abort_handle(),
    })
}

/// Holds a delivery task alive; capnp drops it when the caller releases the
/// capability (or the connection ends).
struct Subscription {
    task: tokio::task::AbortHandle,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl wire::exec_subscription::Server for Subscription {}

impl wire::shell::Server for ShellServer {
    async fn exec(
        self: Rc<Self>,
        params: wire::shell::ExecParams,
        mut results: wire::shell::ExecResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "exec", async {
            let backend = self.backend()?;
            let p = params.get()?;
            let request = exec_request_from(p.get_request()?)?;
            let sink = p.get_events()?;
            let (id, events) = backend.exec(request).await?;
            tracing::debug!(id, "exec started");
            let mut r = results.get();
            r.set_id(id.as_str());
            r.set_subscription(subscribe(events, sink, self.current_rev.clone()));
            Ok(())
        })
        .await
    }

    async fn get_exec(
        self: Rc<Self>,
        params: wire::shell::GetExecParams,
        mut results: wire::shell::GetExecResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "getExec", async {
            let backend = self.backend()?;
            let p = params.get()?;
            let id = text(p.get_id(), "exec id")?;
            let from = resume_from(p.has_after(), p.get_after())?;
            let sink = p.get_events()?;
            let events = backend.get(&id, from).await?;
            let mut r = results.get();
            r.set_id(id.as_str());
            r.set_subscription(subscribe(events, sink, self.current_rev.clone()));
            Ok(())
        })
        .await
    }

    async fn kill_exec(
        self: Rc<Self>,
        params: wire::shell::KillExecParams,
        _: wire::shell::KillExecResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "killExec", async {
            let backend = self.backend()?;
            let p = params.get()?;
            let id = text(p.get_id(), "exec id")?;
            backend.kill(&id, signal_from(p.get_signal())?).await
        })
        .await
    }

    async fn dispose_exec(
        self: Rc<Self>,
        params: wire::shell::DisposeExecParams,
        _: wire::shell::DisposeExecResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "disposeExec", async {
            let backend = self.backend()?;
            let id = text(params.get()?.get_id(), "exec id")?;
            backend.dispose(&id).await
        })
        .await
    }

    async fn write_stdin(
        self: Rc<Self>,
        params: wire::shell::WriteStdinParams,
        _: wire::shell::WriteStdinResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "writeStdin", async {
            let backend = self.backend()?;
            let p = params.get()?;
            let id = text(p.get_id(), "exec id")?;
            let data = p.get_data()?;
            WireError::check_limit("stdin bytes per write", MAX_STDIN_WRITE_BYTES, data.len())?;
            backend.write_stdin(&id, data.to_vec()).await
        })
        .await
    }

    async fn close_stdin(
        self: Rc<Self>,
        params: wire::shell::CloseStdinParams,
        _: wire::shell::CloseStdinResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "closeStdin", async {
            let backend = self.backend()?;
            let id = text(params.get()?.get_id(), "exec id")?;
            backend.close_stdin(&id).await
        })
        .await
    }

    async fn start_pty(
        self: Rc<Self>,
        params: wire::shell::StartPtyParams,
        mut results: wire::shell::StartPtyResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "startPty", async {
            let backend = self.backend()?;
            let p = params.get()?;
            let request = pty_request_from(p.get_request()?)?;
            let sink = p.get_events()?;
            let (id, events) = backend.start_pty(request).await?;
            tracing::debug!(id, "terminal started");
            let mut r = results.get();
            r.set_id(id.as_str());
            r.set_subscription(subscribe(events, sink, self.current_rev.clone()));
            Ok(())
        })
        .await
    }

    async fn pty_write(
        self: Rc<Self>,
        params: wire::shell::PtyWriteParams,
        _: wire::shell::PtyWriteResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "ptyWrite", async {
            let backend = self.backend()?;
            let p = params.get()?;
            let id = text(p.get_id(), "exec id")?;
            let data = p.get_data()?;
            WireError::check_limit(
                "terminal input bytes per write",
                MAX_PTY_WRITE_BYTES,
                data.len(),
            )?;
            backend.pty_write(&id, data.to_vec()).await
        })
        .await
    }

    async fn pty_resize(
        self: Rc<Self>,
        params: wire::shell::PtyResizeParams,
        _: wire::shell::PtyResizeResults,
    ) -> Result<(), capnp::Error> {
        run_call(&self.conn, "ptyResize", async {
            let backend = self.backend()?;
            let p = params.get()?;
            let id = text(p.get_id(), "exec id")?;
            backend.pty_resize(&id, p.get_cols(), p.get_rows()).await
        })
        .await
    }
}
