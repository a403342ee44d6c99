//! `shell.pty.open|input|resize|attach|list|close` and the delivery of
//! `shell.pty.output`, `shell.pty.exit` and `shell.pty.lagged` to the
//! attached connections.
//!
//! `open` runs the first half of a bracket under the workspace's lock
//! (push dofs → wsd, then `startPty`), as `shell.exec` does; a driver task
//! follows the terminal's log to its exit (indexing output offsets), then
//! pulls wsd → dofs under the lock. Each attachment reads its own wsd
//! subscription from the checkpoint before its offset, drops what lies
//! before the offset, and hands the rest to the connection's queue without
//! waiting: a full queue ends the attachment with `shell.pty.lagged` at
//! the last offset queued, and the client attaches again from there.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use gsv_protocol::frames::Outbound;
use gsv_protocol::pty::{
    MAX_INPUT_BYTES, MAX_OUTPUT_CHUNK, PtyAttachArgs, PtyAttachResult, PtyCloseArgs,
    PtyCloseResult, PtyError, PtyExitSignal, PtyInputArgs, PtyInputResult, PtyLaggedSignal,
    PtyListArgs, PtyListResult, PtyOpenArgs, PtyOpenResult, PtyOutputSignal, PtyResizeArgs,
    PtyResizeResult, PtyStatus,
};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use wsd_client::{ErrorCode, ExecEventKind, PtyRequest, ResumeFrom, Signal, WsdError};

use super::{Attached, Pty};
use crate::db::now_ms;
use crate::domains::fs::vfs::{self, Place};
use crate::domains::workspace::Workspace;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Outgoing, Session};

/// How long an exited terminal stays listed and attachable (its log
/// stays in wsd for wsd's retention).
const EXITED_PTY_KEEP: std::time::Duration = gsv_node::COMPLETED_SESSION_RETENTION;
/// Re-attaches to wsd in a row after a broken event stream before the
/// terminal counts as lost.
const MAX_REATTACHES: u32 = 3;

#[derive(Debug)]
enum Fail {
    Op(PtyError),
    Kernel(KernelError),
}

impl From<PtyError> for Fail {
    fn from(e: PtyError) -> Self {
        Fail::Op(e)
    }
}

impl From<KernelError> for Fail {
    fn from(e: KernelError) -> Self {
        Fail::Kernel(e)
    }
}

/// `{ok:true, …result}` or `{ok:false, error, code}`.
fn finish<T: Serialize>(r: Result<T, Fail>) -> Result<Value, KernelError> {
    match r {
        Ok(v) => {
            let mut v =
                serde_json::to_value(v).map_err(|e| KernelError::internal("shell.pty", e))?;
            v["ok"] = json!(true);
            Ok(v)
        }
        Err(Fail::Op(e)) => {
            Ok(json!({"ok": false, "error": e.to_string(), "code": e.code().as_str()}))
        }
        Err(Fail::Kernel(e)) => Err(e),
    }
}

/// A wsd failure as the caller sees it: a terminal that exited is
/// `closed`, an unknown one `not_found`, anything else `unavailable`.
fn wsd_fail(pty_id: &str, context: &str, e: WsdError) -> PtyError {
    match e.code {
        ErrorCode::Invalid => PtyError::Closed(pty_id.to_owned()),
        ErrorCode::NotFound => PtyError::NotFound(pty_id.to_owned()),
        _ => PtyError::Unavailable(format!("{context}: {e}")),
    }
}

fn owned(k: &Kernel, s: &Session, pty_id: &str) -> Result<Arc<Pty>, Fail> {
    k.ptys
        .get_owned(pty_id, s.identity.uid)
        .ok_or_else(|| PtyError::NotFound(pty_id.to_owned()).into())
}

/// `shell.pty.open`.
pub async fn open(k: Arc<Kernel>, s: Arc<Session>, a: PtyOpenArgs) -> Result<Value, KernelError> {
    finish(open_inner(&k, &s, a).await)
}

async fn open_inner(k: &Arc<Kernel>, s: &Session, a: PtyOpenArgs) -> Result<PtyOpenResult, Fail> {
    PtyError::check_size(a.cols, a.rows)?;
    let command = a.command.clone().unwrap_or_default();
    if command.first().is_some_and(|p| p.is_empty()) || command.iter().any(|c| c.contains('\0')) {
        return Err(PtyError::invalid("command", "an empty program or a NUL byte").into());
    }
    let (ws_id, sub) = match (&a.workspace_id, &a.cwd) {
        (Some(id), None) => (id.clone(), None),
        (None, cwd) => {
            let cwd = cwd.clone().unwrap_or_else(|| s.identity.cwd.clone());
            let r = vfs::resolve(&cwd, &s.identity.home)
                .map_err(|e| PtyError::invalid("cwd", e.to_string()))?;
            let Place::Workspace { id, sub } = r.place else {
                return Err(PtyError::invalid(
                    "cwd",
                    format!(
                        "{} is not in a workspace (give workspaceId or a cwd under /workspaces/<id>)",
                        r.display
                    ),
                )
                .into());
            };
            (id, sub.map(|p| p.into_string()))
        }
        (Some(_), Some(_)) => {
            return Err(PtyError::invalid("cwd", "give workspaceId or cwd, not both").into());
        }
    };
    let row = crate::domains::workspace::visible_row(&k.db, &s.identity, &ws_id).await?;
    if row.is_archived() {
        return Err(
            PtyError::invalid("workspaceId", format!("workspace {ws_id} is archived")).into(),
        );
    }
    let w = k.workspaces.open(&row).await?;
    let pty_id = format!("pty_{}", crate::domains::accounts::random_hex(12));
    let request = PtyRequest {
        argv: command.clone(),
        cwd: sub,
        id: Some(pty_id.clone()),
        env: a.env.clone().into_iter().collect(),
        cols: a.cols,
        rows: a.rows,
    };
    // The bracket's first half, under the workspace lock.
    let (handle, events) = {
        let mut backend = w.bracket.lock().await;
        let handle = backend
            .handle(&k.workspaces.wsd_bin)
            .await
            .map_err(|e| PtyError::Unavailable(e.to_string()))?;
        handle
            .push(w.dofs.clone())
            .await
            .map_err(|e| PtyError::Unavailable(format!("push to wsd failed: {e}")))?;
        let events = handle.start_pty(request).await.map_err(|e| match e.code {
            ErrorCode::Invalid | ErrorCode::Limit => PtyError::invalid("command", e.to_string()),
            _ => PtyError::Unavailable(format!("wsd refused the terminal: {e}")),
        })?;
        (handle, events)
    };
    let pty = Arc::new(Pty::new(
        pty_id.clone(),
        s.identity.uid,
        row.id.clone(),
        if command.is_empty() {
            vec!["/bin/sh".to_owned()]
        } else {
            command
        },
        now_ms(),
        handle,
        (a.cols, a.rows),
    ));
    k.ptys.insert(pty.clone());
    tokio::spawn(drive(k.clone(), w, pty.clone(), events));
    tracing::info!(pty = %pty_id, workspace = %row.id, "terminal opened");
    // The opener sees the output from its first byte.
    let attached = k.ptys.attach(&pty_id, &s.connection_id);
    let events = pty
        .handle
        .attach(&pty_id, ResumeFrom::Start)
        .await
        .map_err(|e| wsd_fail(&pty_id, "attaching to the terminal", e))?;
    spawn_delivery(k, s, pty, attached, events, 0, 0)?;
    Ok(PtyOpenResult {
        pty_id,
        workspace_id: row.id,
        status: PtyStatus::Running,
    })
}

/// Follows terminal `pty` to its exit: indexes output offsets, records the
/// exit, pulls the workspace, and forgets the terminal a while later.
async fn drive(
    k: Arc<Kernel>,
    w: Arc<Workspace>,
    pty: Arc<Pty>,
    mut events: wsd_client::ExecEvents,
) {
    let mut last_seq = 0u64;
    let mut reattaches = 0u32;
    let code = loop {
        match events.next().await {
            Ok(Some(ev)) => {
                last_seq = ev.seq;
                reattaches = 0;
                match ev.kind {
                    ExecEventKind::Stdout(b) | ExecEventKind::Stderr(b) => {
                        pty.record_output(ev.seq, b.len())
                    }
                    ExecEventKind::Exit(code) => break Some(code),
                }
            }
            Ok(None) => break None,
            Err(e) => {
                reattaches += 1;
                if reattaches > MAX_REATTACHES {
                    tracing::warn!(pty = %pty.id, error = %e, "lost the terminal's wsd");
                    break None;
                }
                match pty
                    .handle
                    .attach(&pty.id, ResumeFrom::After(last_seq))
                    .await
                {
                    Ok(ev) => events = ev,
                    Err(e2) => {
                        tracing::warn!(pty = %pty.id, error = %e, again = %e2, "lost the terminal's wsd");
                        break None;
                    }
                }
            }
        }
    };
    // A terminal whose log is gone counts as ended (-1, as wsd's lost exit).
    let code = code.unwrap_or(-1);
    pty.record_exit(code);
    {
        // The bracket's second half: what the terminal changed lands in dofs.
        let _guard = w.bracket.lock().await;
        if let Err(e) = pty.handle.pull(w.dofs.clone()).await {
            tracing::warn!(pty = %pty.id, error = %e, "pulling a terminal's changes failed");
        }
    }
    tracing::info!(pty = %pty.id, code, "terminal exited");
    let weak = Arc::downgrade(&k);
    drop(k);
    tokio::time::sleep(EXITED_PTY_KEEP).await;
    if let Some(k) = weak.upgrade() {
        k.ptys.remove(&pty.id);
    }
}

/// `shell.pty.attach`.
pub async fn attach(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PtyAttachArgs,
) -> Result<Value, KernelError> {
    finish(attach_inner(&k, &s, a).await)
}

async fn attach_inner(
    k: &Arc<Kernel>,
    s: &Session,
    a: PtyAttachArgs,
) -> Result<PtyAttachResult, Fail> {
    let pty = owned(k, s, &a.pty_id)?;
    let after = a.after.unwrap_or(0);
    let (seq, offset) = pty.checkpoint_before(after);
    let from = if seq == 0 {
        ResumeFrom::Start
    } else {
        ResumeFrom::After(seq)
    };
    let attached = k.ptys.attach(&pty.id, &s.connection_id);
    let events = match pty.handle.attach(&pty.id, from).await {
        Ok(ev) => ev,
        Err(e) => {
            k.ptys
                .detached(&pty.id, &s.connection_id, attached.generation);
            return Err(match e.code {
                ErrorCode::LogTruncated => PtyError::Truncated {
                    pty_id: pty.id.clone(),
                    after,
                    available: pty.output_bytes(),
                },
                _ => wsd_fail(&pty.id, "attaching to the terminal", e),
            }
            .into());
        }
    };
    let status = pty.status();
    let pty_id = pty.id.clone();
    spawn_delivery(k, s, pty, attached, events, offset, after)?;
    Ok(PtyAttachResult {
        pty_id,
        status,
        offset: after,
    })
}

/// Starts the delivery of `events` (which begin at output `offset`) to the
/// caller's connection from output offset `after` on.
fn spawn_delivery(
    k: &Arc<Kernel>,
    s: &Session,
    pty: Arc<Pty>,
    attached: Attached,
    events: wsd_client::ExecEvents,
    offset: u64,
    after: u64,
) -> Result<(), Fail> {
    let Some(tx) = k.pool.sender(&s.connection_id) else {
        k.ptys
            .detached(&pty.id, &s.connection_id, attached.generation);
        return Err(KernelError::Cancelled("the connection closed".into()).into());
    };
    let delivery = Delivery {
        pty,
        tx,
        offset,
        after,
    };
    let (k, conn) = (k.clone(), s.connection_id.clone());
    tokio::spawn(async move {
        let generation = attached.generation;
        let pty_id = delivery.pty.id.clone();
        delivery.run(attached, events).await;
        k.ptys.detached(&pty_id, &conn, generation);
    });
    Ok(())
}

/// One attachment's delivery.
struct Delivery {
    pty: Arc<Pty>,
    tx: mpsc::Sender<Outgoing>,
    /// The output offset of the next event's first byte.
    offset: u64,
    /// Output before this offset is not sent.
    after: u64,
}

/// How handing output to the connection went.
enum Sent {
    Queued,
    /// The queue is full at this offset.
    Full(u64),
    Gone,
}

impl Delivery {
    async fn run(mut self, attached: Attached, mut events: wsd_client::ExecEvents) {
        let Attached { cancel, start, .. } = attached;
        // The call's answer goes first (the server starts us once queued).
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = start => {}
        }
        let mut last_seq = 0u64;
        let mut reattaches = 0u32;
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.tx.closed() => return,
                ev = events.next() => ev,
            };
            match next {
                Ok(Some(ev)) => {
                    last_seq = ev.seq;
                    reattaches = 0;
                    match ev.kind {
                        ExecEventKind::Stdout(b) | ExecEventKind::Stderr(b) => {
                            match self.send_output(&b) {
                                Sent::Queued => {}
                                Sent::Gone => return,
                                Sent::Full(at) => {
                                    let lagged = PtyLaggedSignal {
                                        pty_id: self.pty.id.clone(),
                                        offset: at,
                                    };
                                    self.send_waiting(&cancel, "shell.pty.lagged", lagged).await;
                                    return;
                                }
                            }
                        }
                        ExecEventKind::Exit(code) => {
                            let exit = PtyExitSignal {
                                pty_id: self.pty.id.clone(),
                                exit_code: code,
                                signal: self.pty.ending_signal(code),
                            };
                            self.send_waiting(&cancel, "shell.pty.exit", exit).await;
                            return;
                        }
                    }
                }
                Ok(None) => return,
                Err(e) => {
                    reattaches += 1;
                    let again = if reattaches > MAX_REATTACHES {
                        Err(e)
                    } else {
                        self.pty
                            .handle
                            .attach(&self.pty.id, ResumeFrom::After(last_seq))
                            .await
                    };
                    match again {
                        Ok(ev) => events = ev,
                        Err(e) => {
                            // The client attaches again (and learns why).
                            tracing::warn!(pty = %self.pty.id, error = %e, "a terminal attachment lost wsd");
                            let lagged = PtyLaggedSignal {
                                pty_id: self.pty.id.clone(),
                                offset: self.offset.max(self.after),
                            };
                            self.send_waiting(&cancel, "shell.pty.lagged", lagged).await;
                            return;
                        }
                    }
                }
            }
        }
    }

    /// Queues the part of `bytes` at or after `self.after`, in chunks of
    /// at most [`MAX_OUTPUT_CHUNK`], without waiting.
    fn send_output(&mut self, bytes: &[u8]) -> Sent {
        let start = self.offset;
        self.offset += bytes.len() as u64;
        if self.offset <= self.after {
            return Sent::Queued;
        }
        let skip = self.after.saturating_sub(start) as usize;
        let mut at = start + skip as u64;
        for chunk in bytes[skip..].chunks(MAX_OUTPUT_CHUNK) {
            let text = sig_text(
                "shell.pty.output",
                PtyOutputSignal {
                    pty_id: self.pty.id.clone(),
                    offset: at,
                    data_base64: STANDARD.encode(chunk),
                },
            );
            match self.tx.try_send(Outgoing::Text(text)) {
                Ok(()) => at += chunk.len() as u64,
                Err(mpsc::error::TrySendError::Full(_)) => return Sent::Full(at),
                Err(mpsc::error::TrySendError::Closed(_)) => return Sent::Gone,
            }
        }
        Sent::Queued
    }

    /// Sends a signal once the connection's queue has room.
    async fn send_waiting(
        &self,
        cancel: &tokio_util::sync::CancellationToken,
        signal: &str,
        payload: impl Serialize,
    ) {
        let text = sig_text(signal, payload);
        tokio::select! {
            _ = cancel.cancelled() => {}
            permit = self.tx.reserve() => if let Ok(p) = permit { p.send(Outgoing::Text(text)) },
        }
    }
}

fn sig_text(signal: &str, payload: impl Serialize) -> String {
    Outbound::Sig {
        signal: signal.to_owned(),
        payload: serde_json::to_value(payload).unwrap_or(Value::Null),
        seq: None,
    }
    .to_text()
}

/// `shell.pty.input`.
pub async fn input(k: Arc<Kernel>, s: Arc<Session>, a: PtyInputArgs) -> Result<Value, KernelError> {
    finish(input_inner(&k, &s, a).await)
}

async fn input_inner(
    k: &Arc<Kernel>,
    s: &Session,
    a: PtyInputArgs,
) -> Result<PtyInputResult, Fail> {
    let bytes = match (a.data, a.data_base64) {
        (Some(text), None) => text.into_bytes(),
        (None, Some(b64)) => STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| PtyError::invalid("dataBase64", format!("not base64: {e}")))?,
        _ => {
            return Err(
                PtyError::invalid("data", "give exactly one of data and dataBase64").into(),
            );
        }
    };
    if bytes.len() > MAX_INPUT_BYTES {
        return Err(PtyError::TooLarge {
            what: "input",
            max: MAX_INPUT_BYTES,
            got: bytes.len(),
        }
        .into());
    }
    let pty = owned(k, s, &a.pty_id)?;
    if pty.exit_code().is_some() {
        return Err(PtyError::Closed(pty.id.clone()).into());
    }
    let n = bytes.len();
    pty.handle
        .pty_write(&pty.id, bytes)
        .await
        .map_err(|e| wsd_fail(&pty.id, "writing to the terminal", e))?;
    Ok(PtyInputResult {
        pty_id: pty.id.clone(),
        bytes: n,
    })
}

/// `shell.pty.resize`.
pub async fn resize(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PtyResizeArgs,
) -> Result<Value, KernelError> {
    finish(resize_inner(&k, &s, a).await)
}

async fn resize_inner(
    k: &Arc<Kernel>,
    s: &Session,
    a: PtyResizeArgs,
) -> Result<PtyResizeResult, Fail> {
    PtyError::check_size(a.cols, a.rows)?;
    let pty = owned(k, s, &a.pty_id)?;
    if pty.exit_code().is_some() {
        return Err(PtyError::Closed(pty.id.clone()).into());
    }
    pty.handle
        .pty_resize(&pty.id, a.cols, a.rows)
        .await
        .map_err(|e| wsd_fail(&pty.id, "resizing the terminal", e))?;
    pty.set_size(a.cols, a.rows);
    Ok(PtyResizeResult {
        pty_id: pty.id.clone(),
        cols: a.cols,
        rows: a.rows,
    })
}

/// `shell.pty.list`.
pub async fn list(k: Arc<Kernel>, s: Arc<Session>, _: PtyListArgs) -> Result<Value, KernelError> {
    let ptys = k
        .ptys
        .list(s.identity.uid)
        .iter()
        .map(|p| p.info())
        .collect();
    finish::<PtyListResult>(Ok(PtyListResult { ptys }))
}

/// `shell.pty.close`.
pub async fn close(k: Arc<Kernel>, s: Arc<Session>, a: PtyCloseArgs) -> Result<Value, KernelError> {
    finish(close_inner(&k, &s, a).await)
}

async fn close_inner(
    k: &Arc<Kernel>,
    s: &Session,
    a: PtyCloseArgs,
) -> Result<PtyCloseResult, Fail> {
    let signal = match a.signal.as_deref() {
        None => Signal::Hup,
        Some(name) => name
            .parse::<Signal>()
            .map_err(|e| PtyError::invalid("signal", e.message))?,
    };
    let pty = owned(k, s, &a.pty_id)?;
    if pty.exit_code().is_none() {
        pty.note_close(signal);
        match pty.handle.kill(&pty.id, signal).await {
            // Exited meanwhile: closing what is gone changes nothing.
            Ok(()) => {}
            Err(e) if e.code == ErrorCode::NotFound => {}
            Err(e) => return Err(wsd_fail(&pty.id, "closing the terminal", e).into()),
        }
    }
    Ok(PtyCloseResult {
        pty_id: pty.id.clone(),
        status: pty.status(),
    })
}
