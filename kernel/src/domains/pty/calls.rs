//! `shell.pty.open|input|resize|attach|list|close` and the delivery of
//! `shell.pty.output`, `shell.pty.exit` and `shell.pty.lagged` to the
//! attached connections.
//!
//! `open` runs the first half of a bracket under the workspace's lock
//! (push dofs → wsd, then `startPty`), as `shell.exec` does; a driver task
//! follows the terminal's log to its exit (indexing output offsets), then
//! pulls wsd → dofs under the lock. While it is open the workspace
//! follows wsd live (`domains::shell::live`): what is typed into it
//! reaches dofs as wsd settles it, and `fs.write`s reach the terminal.
//! Each attachment reads its own wsd subscription from the checkpoint
//! before its offset, drops what lies before the offset, and hands the
//! rest to the connection's queue without waiting: a full queue ends the
//! attachment with `shell.pty.lagged` at the last offset queued, and the
//! client attaches again from there. wsd's runner waits for every live
//! subscriber, so an attachment drops its subscription before it waits
//! for the connection: a slow socket costs only its own connection.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use gsv_protocol::OpResult;
use gsv_protocol::frames::Outbound;
use gsv_protocol::pty::{
    MAX_INPUT_BYTES, MAX_OUTPUT_CHUNK, PtyAttachArgs, PtyAttachResult, PtyCloseArgs,
    PtyCloseResult, PtyError, PtyExitSignal, PtyInputArgs, PtyInputResult, PtyLaggedSignal,
    PtyListArgs, PtyListResult, PtyOpenArgs, PtyOpenResult, PtyOutputSignal, PtyResizeArgs,
    PtyResizeResult, PtyStatus,
};
use serde::Serialize;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use wsd_client::{
    ErrorCode, ExecEvent, ExecEventKind, ExecEvents, PtyRequest, ResumeFrom, Signal, WsdError,
};

use super::{Attached, Pty, PtyRow};
use crate::db::now_ms;
use crate::domains::fs::vfs::{self, Place};
use crate::domains::shell::live::LiveHold;
use crate::domains::workspace::{Backend, Workspace};
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

/// `{ok:true, …result}`, or an operation error as `{ok:false, error,
/// code}`; a kernel fault stays a frame error.
fn finish<T>(r: Result<T, Fail>) -> Result<OpResult<T>, KernelError> {
    match r {
        Ok(v) => Ok(OpResult::done(v)),
        Err(Fail::Op(e)) => Ok(OpResult::Failed(e.into())),
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

/// The caller's terminal `pty_id`; one that ended with the previous
/// kernel is `closed`, anything else (someone else's too) `not_found`.
fn owned(k: &Kernel, s: &Session, pty_id: &str) -> Result<Arc<Pty>, Fail> {
    if let Some(p) = k.ptys.get_owned(pty_id, s.identity.uid) {
        return Ok(p);
    }
    if k.ptys.ended(pty_id, s.identity.uid) {
        return Err(PtyError::EndedWithKernel(pty_id.to_owned()).into());
    }
    Err(PtyError::NotFound(pty_id.to_owned()).into())
}

/// `shell.pty.open`.
pub async fn open(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PtyOpenArgs,
) -> Result<OpResult<PtyOpenResult>, KernelError> {
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
    let row = k.workspaces.visible_row(&k.db, &s.identity, &ws_id).await?;
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
    let pty_row = PtyRow {
        id: pty_id.clone(),
        owner_uid: pty.owner_uid,
        workspace_id: row.id.clone(),
        command: pty.command.clone(),
        cols: a.cols,
        rows: a.rows,
        created_at: pty.created_at,
    };
    if let Err(e) = k.db.call(move |c| super::insert_row(c, &pty_row)).await {
        // A terminal without its row would not survive a restart: none.
        let _ = pty.handle.kill(&pty_id, Signal::Kill).await;
        return Err(e.into());
    }
    k.ptys.insert(pty.clone());
    // What the terminal writes reaches dofs while it is open.
    let live = crate::domains::shell::calls::live_hold(k, &w, &pty.handle);
    tokio::spawn(drive(k.clone(), w, pty.clone(), events, live));
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

/// Follows terminal `pty` to its exit: indexes output offsets (in memory
/// and in its row), records the exit, pulls the workspace, and forgets
/// the terminal a while later. At kernel shutdown it stops where it is:
/// the terminal may go on in its wsd for the next kernel.
async fn drive(
    k: Arc<Kernel>,
    w: Arc<Workspace>,
    pty: Arc<Pty>,
    mut events: ExecEvents,
    live: LiveHold,
) {
    let stopping = k.ptys.stopping();
    let mut last_seq = pty.last_checkpoint().0;
    let mut reattaches = 0u32;
    let code = loop {
        let next = tokio::select! {
            biased;
            _ = stopping.cancelled() => return,
            next = events.next() => next,
        };
        match next {
            Ok(Some(ev)) => {
                last_seq = ev.seq;
                reattaches = 0;
                match ev.kind {
                    ExecEventKind::Stdout(b) | ExecEventKind::Stderr(b) => {
                        if let Some((seq, bytes)) = pty.record_output(ev.seq, b.len()) {
                            let id = pty.id.clone();
                            let saved =
                                k.db.call(move |c| super::add_checkpoint(c, &id, seq, bytes))
                                    .await;
                            if let Err(e) = saved {
                                tracing::warn!(pty = %pty.id, error = %e, "could not save a terminal's offset index");
                            }
                        }
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
    drop(live);
    tracing::info!(pty = %pty.id, code, "terminal exited");
    let weak = Arc::downgrade(&k);
    drop(k);
    tokio::select! {
        _ = stopping.cancelled() => return,
        _ = tokio::time::sleep(EXITED_PTY_KEEP) => {}
    }
    if let Some(k) = weak.upgrade() {
        k.ptys.remove(&pty.id);
        let id = pty.id.clone();
        if let Err(e) = k.db.call(move |c| super::delete_row(c, &id)).await {
            tracing::warn!(pty = %pty.id, error = %e, "could not forget a terminal's row");
        }
    }
}

/// At start: takes up the terminals a previous kernel left. One whose wsd
/// outlived that kernel (a remote backend, or a local child the kernel
/// left running, by a crash or because a graceful shutdown leaves children
/// with running terminals up; adopted here) is driven again from the end
/// of its saved offset index; one whose wsd did not (it was stopped or
/// died, or runs another wsd binary), or that wsd no longer knows, is
/// forgotten and answers `closed` from then on.
pub async fn recover(k: &Arc<Kernel>) -> Result<(), KernelError> {
    for (row, index) in k.db.call(|c| super::all_rows(c)).await? {
        match resume(k, &row, index).await {
            Ok(()) => {
                tracing::info!(pty = %row.id, workspace = %row.workspace_id, "terminal taken up again")
            }
            Err(why) => {
                tracing::info!(pty = %row.id, workspace = %row.workspace_id, %why, "terminal ended with the previous kernel");
                k.ptys.mark_ended(&row.id, row.owner_uid);
                let id = row.id.clone();
                k.db.call(move |c| super::delete_row(c, &id)).await?;
            }
        }
    }
    Ok(())
}

/// Why a terminal could not be taken up again.
#[derive(Debug, thiserror::Error)]
enum ResumeError {
    #[error("its workspace is gone or archived")]
    NoWorkspace,
    #[error(
        "its workspace's local wsd stopped with the previous kernel (or runs another wsd binary)"
    )]
    LocalBackend,
    #[error("{0}")]
    Kernel(#[from] KernelError),
    #[error("its wsd does not have it any more: {0}")]
    Wsd(#[from] WsdError),
}

async fn resume(
    k: &Arc<Kernel>,
    row: &PtyRow,
    index: super::OffsetIndex,
) -> Result<(), ResumeError> {
    let wid = row.workspace_id.clone();
    let ws =
        k.db.call(move |c| crate::domains::workspace::get_row(c, &wid))
            .await?
            .filter(|w| !w.is_archived())
            .ok_or(ResumeError::NoWorkspace)?;
    let w = k.workspaces.open(&ws).await?;
    let handle = {
        let mut backend = w.bracket.lock().await;
        if ws.backend == Backend::Local && !backend.adopt_leftover(&k.workspaces.wsd_bin) {
            backend.stop_leftover().await;
            return Err(ResumeError::LocalBackend);
        }
        backend.handle(&k.workspaces.wsd_bin).await?
    };
    let from = match index.last() {
        Some(&(seq, _)) => ResumeFrom::After(seq),
        None => ResumeFrom::Start,
    };
    let events = handle.attach(&row.id, from).await?;
    let pty = Arc::new(Pty::new(
        row.id.clone(),
        row.owner_uid,
        row.workspace_id.clone(),
        row.command.clone(),
        row.created_at,
        handle,
        (row.cols, row.rows),
    ));
    pty.restore_index(index);
    k.ptys.insert(pty.clone());
    let live = crate::domains::shell::calls::live_hold(k, &w, &pty.handle);
    tokio::spawn(drive(k.clone(), w, pty, events, live));
    Ok(())
}

/// `shell.pty.attach`.
pub async fn attach(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PtyAttachArgs,
) -> Result<OpResult<PtyAttachResult>, KernelError> {
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
    events: ExecEvents,
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
        last_seq: 0,
        reattaches: 0,
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

/// Output an attachment holds back while its call's answer waits for room
/// in the connection's queue; more means the connection is too slow.
const MAX_EARLY_OUTPUT_BYTES: usize = 1024 * 1024;

/// One read of a terminal's wsd subscription.
type Next = Result<Option<ExecEvent>, WsdError>;

/// One attachment's delivery.
///
/// wsd's runner waits for every subscriber of a terminal before it reads
/// the terminal again, so a subscription left unread stalls the terminal
/// for everyone attached (and its driver). A delivery therefore always
/// reads its subscription promptly: it never waits for the connection
/// while holding it, and drops it before any wait (a lag, the exit).
struct Delivery {
    pty: Arc<Pty>,
    tx: mpsc::Sender<Outgoing>,
    /// The output offset of the next event's first byte.
    offset: u64,
    /// Output before this offset is not sent.
    after: u64,
    /// The seq of the last event read (re-attaching to wsd resumes after it).
    last_seq: u64,
    /// Re-attaches to wsd in a row after a broken event stream.
    reattaches: u32,
}

/// How handing output to the connection went.
enum Sent {
    Queued,
    /// The queue is full at this offset.
    Full(u64),
    Gone,
}

/// What to do after one read of the subscription.
enum Flow {
    Go,
    /// Stop reading; send this signal (if any) once the queue has room.
    End(Option<String>),
}

impl Delivery {
    async fn run(mut self, attached: Attached, events: ExecEvents) {
        let Attached { cancel, start, .. } = attached;
        let Some((early, events)) = self.until_started(&cancel, start, events).await else {
            return;
        };
        let Some(mut events) = events else {
            // The answer waited on a full queue while the output piled up:
            // the client attaches again from where it asked to start.
            let lagged = self.lagged_text(self.after);
            self.send_waiting(&cancel, lagged).await;
            return;
        };
        let mut flow = Flow::Go;
        for next in early {
            flow = self.step(&mut events, next).await;
            if let Flow::End(_) = flow {
                break;
            }
        }
        while let Flow::Go = flow {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.tx.closed() => return,
                next = events.next() => next,
            };
            flow = self.step(&mut events, next).await;
        }
        drop(events);
        if let Flow::End(Some(last)) = flow {
            self.send_waiting(&cancel, last).await;
        }
    }

    /// Waits until the call's answer is queued (the output must follow
    /// it), reading the subscription meanwhile: what came, and the
    /// subscription, or none if more than [`MAX_EARLY_OUTPUT_BYTES`] came
    /// (it is dropped at once). `None`: the attachment ended first.
    async fn until_started(
        &self,
        cancel: &CancellationToken,
        start: oneshot::Receiver<()>,
        mut events: ExecEvents,
    ) -> Option<(Vec<Next>, Option<ExecEvents>)> {
        tokio::pin!(start);
        let mut early = Vec::new();
        let mut bytes = 0usize;
        let mut reading = true;
        loop {
            tokio::select! {
                biased;
                _ = cancel.cancelled() => return None,
                _ = self.tx.closed() => return None,
                started = &mut start => {
                    return started.ok().map(|()| (early, Some(events)));
                }
                next = events.next(), if reading => {
                    // The stream ends after an error or its end.
                    reading = matches!(next, Ok(Some(_)));
                    if let Ok(Some(ev)) = &next {
                        bytes += ev.kind.payload_len();
                    }
                    early.push(next);
                    if bytes > MAX_EARLY_OUTPUT_BYTES {
                        drop(events);
                        tokio::select! {
                            _ = cancel.cancelled() => return None,
                            _ = self.tx.closed() => return None,
                            started = &mut start => return started.ok().map(|()| (Vec::new(), None)),
                        }
                    }
                }
            }
        }
    }

    /// Handles one read of the subscription; a broken stream is attached
    /// again in place (up to [`MAX_REATTACHES`] times in a row).
    async fn step(&mut self, events: &mut ExecEvents, next: Next) -> Flow {
        match next {
            Ok(Some(ev)) => {
                self.last_seq = ev.seq;
                self.reattaches = 0;
                match ev.kind {
                    ExecEventKind::Stdout(b) | ExecEventKind::Stderr(b) => {
                        match self.send_output(&b) {
                            Sent::Queued => Flow::Go,
                            Sent::Gone => Flow::End(None),
                            Sent::Full(at) => Flow::End(Some(self.lagged_text(at))),
                        }
                    }
                    ExecEventKind::Exit(code) => {
                        let exit = PtyExitSignal {
                            pty_id: self.pty.id.clone(),
                            exit_code: code,
                            signal: self.pty.ending_signal(code),
                        };
                        Flow::End(Some(sig_text("shell.pty.exit", exit)))
                    }
                }
            }
            Ok(None) => Flow::End(None),
            Err(e) => {
                self.reattaches += 1;
                let again = if self.reattaches > MAX_REATTACHES {
                    Err(e)
                } else {
                    self.pty
                        .handle
                        .attach(&self.pty.id, ResumeFrom::After(self.last_seq))
                        .await
                };
                match again {
                    Ok(ev) => {
                        *events = ev;
                        Flow::Go
                    }
                    Err(e) => {
                        // The client attaches again (and learns why).
                        tracing::warn!(pty = %self.pty.id, error = %e, "a terminal attachment lost wsd");
                        Flow::End(Some(self.lagged_text(self.offset.max(self.after))))
                    }
                }
            }
        }
    }

    fn lagged_text(&self, offset: u64) -> String {
        sig_text(
            "shell.pty.lagged",
            PtyLaggedSignal {
                pty_id: self.pty.id.clone(),
                offset,
            },
        )
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

    /// Sends a signal's `text` once the connection's queue has room.
    async fn send_waiting(&self, cancel: &CancellationToken, text: String) {
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
pub async fn input(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PtyInputArgs,
) -> Result<OpResult<PtyInputResult>, KernelError> {
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
) -> Result<OpResult<PtyResizeResult>, KernelError> {
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
    let (id, cols, rows) = (pty.id.clone(), a.cols, a.rows);
    k.db.call(move |c| super::set_size(c, &id, cols, rows))
        .await?;
    Ok(PtyResizeResult {
        pty_id: pty.id.clone(),
        cols: a.cols,
        rows: a.rows,
    })
}

/// `shell.pty.list`.
pub async fn list(
    k: Arc<Kernel>,
    s: Arc<Session>,
    _: PtyListArgs,
) -> Result<OpResult<PtyListResult>, KernelError> {
    let ptys = k
        .ptys
        .list(s.identity.uid)
        .iter()
        .map(|p| p.info())
        .collect();
    Ok(OpResult::done(PtyListResult { ptys }))
}

/// `shell.pty.close`.
pub async fn close(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PtyCloseArgs,
) -> Result<OpResult<PtyCloseResult>, KernelError> {
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
