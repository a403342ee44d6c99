//! `proc.ipc.send|call`: a process messages another process of the same
//! owner. The request is a user message of the target (a run starts, or
//! it queues behind the active one) carrying its envelope under
//! [`ipc::REQUEST_KEY`]; a call's reply is the answer of the target's run
//! that took the request. `ipc.reply` / `ipc.timeout` reach the calling
//! process as a message (starting a run there) and the owner's sockets as
//! a signal. The deadline is a timer; killing or resetting the target
//! fails its pending calls. `proc.ipc.deliver` is the kernel's own path
//! ([`deliver_envelope`]): through dispatch it answers 403 to everyone.

use std::sync::Arc;

use futures::future::BoxFuture;
use gsv_protocol::proc::{
    IpcCallArgs, IpcCallResult, IpcDeliverArgs, IpcDeliverCall, IpcSendArgs, IpcSendResult,
    SendResult,
};
use rusqlite::Connection;
use serde_json::{Value, json};

use super::run;
use crate::db::now_ms;
use crate::domains::proc::conversations::{self, DEFAULT, conversation_arg};
use crate::domains::proc::ipc::{self, IpcCall};
use crate::domains::proc::store::{self, ProcRow};
use crate::domains::timers::{Timer, table as timers};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};

/// The timer kind of a call's deadline (`ipc:<callId>`).
pub const TIMER_KIND: &str = "ipc";
/// `timeoutMs` when absent, and its bounds (seed 000).
pub const DEFAULT_TIMEOUT_MS: i64 = 60_000;
pub const MIN_TIMEOUT_MS: i64 = 1_000;
pub const MAX_TIMEOUT_MS: i64 = 10 * 60_000;

fn timer_id(call_id: &str) -> String {
    format!("{TIMER_KIND}:{call_id}")
}

/// The calling process's row; sockets are refused.
pub(super) async fn caller(
    k: &Arc<Kernel>,
    s: &Session,
    call: &str,
) -> Result<ProcRow, KernelError> {
    let refused = || KernelError::PermissionDenied(format!("{call} requires a process caller"));
    if !s.is_process() {
        return Err(refused());
    }
    let pid = s.client_id.clone();
    k.db.call(move |c| store::get(c, &pid))
        .await?
        .ok_or_else(refused)
}

/// Another process of `source`'s owner; a missing one and another
/// owner's answer the same 403.
pub(super) async fn same_owner(
    k: &Arc<Kernel>,
    source: &ProcRow,
    pid: &str,
) -> Result<ProcRow, KernelError> {
    let p = pid.to_owned();
    match k.db.call(move |c| store::get(c, &p)).await? {
        Some(r) if r.owner_uid == source.owner_uid => Ok(r),
        _ => Err(KernelError::AccessDenied {
            kind: "process",
            id: pid.to_owned(),
        }),
    }
}

/// Checks the arguments both calls share; the target and its conversation.
async fn validated(
    k: &Arc<Kernel>,
    call: &str,
    source: &ProcRow,
    a: &IpcSendArgs,
) -> Result<(ProcRow, String), KernelError> {
    let invalid = |reason: String| KernelError::InvalidArgs {
        call: call.to_owned(),
        reason,
    };
    if a.message.trim().is_empty() {
        return Err(invalid("message: must not be empty".into()));
    }
    let conv = conversation_arg(call, a.conversation_id.as_deref())?;
    if a.pid == source.pid {
        return Err(invalid(format!(
            "pid: {} is the calling process (a process cannot message itself)",
            a.pid
        )));
    }
    let target = same_owner(k, source, &a.pid).await?;
    Ok((target, conv))
}

fn envelope(
    source: &ProcRow,
    a: &IpcSendArgs,
    conv: &str,
    call: Option<IpcDeliverCall>,
) -> IpcDeliverArgs {
    IpcDeliverArgs {
        source_pid: source.pid.clone(),
        source: json!({"uid": source.owner_uid, "username": source.username,
                       "pid": source.pid, "label": source.label}),
        conversation_id: Some(conv.to_owned()),
        message: a.message.clone(),
        metadata: a.metadata.clone(),
        sent_at: now_ms(),
        call,
    }
}

pub async fn send(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: IpcSendArgs,
) -> Result<IpcSendResult, KernelError> {
    let source = caller(&k, &s, "proc.ipc.send").await?;
    let (target, conv) = validated(&k, "proc.ipc.send", &source, &a).await?;
    let env = envelope(&source, &a, &conv, None);
    let sent = deliver_envelope(&k, target.clone(), &env).await?;
    Ok(IpcSendResult {
        ok: true,
        status: "started".into(),
        pid: target.pid,
        source_pid: source.pid,
        conversation_id: conv,
        run_id: sent.run_id,
        queued: sent.queued,
    })
}

pub async fn call(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: IpcCallArgs,
) -> Result<IpcCallResult, KernelError> {
    let source = caller(&k, &s, "proc.ipc.call").await?;
    let (target, conv) = validated(&k, "proc.ipc.call", &source, &a.send).await?;
    let timeout = a
        .timeout_ms
        .unwrap_or(DEFAULT_TIMEOUT_MS)
        .clamp(MIN_TIMEOUT_MS, MAX_TIMEOUT_MS);
    let created_at = now_ms();
    let record = IpcCall {
        call_id: format!("ipc_{}", uuid::Uuid::new_v4().simple()),
        uid: source.owner_uid,
        source_pid: source.pid.clone(),
        source_run_id: k.procs.active_run(&source.pid),
        source_conversation_id: k
            .procs
            .active_conversation(&source.pid)
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| DEFAULT.to_owned()),
        target_pid: target.pid.clone(),
        target_conversation_id: conv.clone(),
        target_run_id: None,
        status: "pending".into(),
        deadline_at: created_at + timeout,
        created_at,
        response: None,
        error: None,
    };
    // The row and its deadline exist before the request does, so a run
    // that answers at once finds its call.
    let r = record.clone();
    k.db.call(move |c| {
        let tx = c.transaction()?;
        ipc::insert(&tx, &r)?;
        timers::arm(
            &tx,
            &timer_id(&r.call_id),
            r.deadline_at,
            TIMER_KIND,
            &r.call_id,
        )?;
        tx.commit()?;
        Ok(())
    })
    .await?;
    k.timers.poke();
    let env = envelope(
        &source,
        &a.send,
        &conv,
        Some(IpcDeliverCall {
            call_id: record.call_id.clone(),
            reply_to_pid: source.pid.clone(),
            deadline_at: record.deadline_at,
        }),
    );
    let sent = match deliver_envelope(&k, target.clone(), &env).await {
        Ok(sent) => sent,
        Err(e) => {
            let id = record.call_id.clone();
            k.db.call(move |c| {
                ipc::delete(c, &id)?;
                timers::cancel(c, &timer_id(&id))?;
                Ok(())
            })
            .await?;
            return Err(e);
        }
    };
    let (id, run_id) = (record.call_id.clone(), sent.run_id.clone());
    k.db.call(move |c| ipc::set_target_run(c, &id, run_id.as_deref()))
        .await?;
    Ok(IpcCallResult {
        ok: true,
        status: "started".into(),
        call_id: record.call_id,
        pid: target.pid,
        source_pid: source.pid,
        conversation_id: conv,
        run_id: sent.run_id,
        deadline_at: record.deadline_at,
        queued: sent.queued,
    })
}

/// `proc.ipc.deliver` through dispatch: kernel-only. Sockets are refused
/// by the gate (internal call); a process is refused here, since an
/// envelope it wrote could claim any sender.
pub async fn deliver(
    _k: Arc<Kernel>,
    _s: Arc<Session>,
    _a: IpcDeliverArgs,
) -> Result<IpcSendResult, KernelError> {
    Err(KernelError::PermissionDenied("proc.ipc.deliver".into()))
}

/// The kernel's delivery of a validated envelope: a user message in the
/// target's conversation that starts a run or queues.
pub async fn deliver_envelope(
    k: &Arc<Kernel>,
    target: ProcRow,
    env: &IpcDeliverArgs,
) -> Result<SendResult, KernelError> {
    let conv = env
        .conversation_id
        .clone()
        .unwrap_or_else(|| DEFAULT.to_owned());
    let (p, cv) = (target.pid.clone(), conv.clone());
    let status =
        k.db.call(move |c| conversations::ensure_status(c, &p, &cv))
            .await?;
    if status.as_deref() == Some("closed") {
        return Err(KernelError::Conflict(format!(
            "Conversation is closed: {conv} (of {})",
            target.pid
        )));
    }
    let mut text = match &env.call {
        Some(c) => format!(
            "[IPC call {} from {}: your final answer in this run is sent back as the reply]\n{}",
            c.call_id, env.source_pid, env.message
        ),
        None => format!("[IPC message from {}]\n{}", env.source_pid, env.message),
    };
    if let Some(m) = env.metadata.as_ref().filter(|m| !m.is_empty()) {
        text.push_str(&format!("\n[metadata] {}", Value::Object(m.clone())));
    }
    let mut carried =
        json!({"sourcePid": env.source_pid, "source": env.source, "sentAt": env.sent_at});
    if let Some(m) = &env.metadata {
        carried["metadata"] = json!(m);
    }
    if let Some(c) = &env.call {
        carried["callId"] = json!(c.call_id);
        carried["replyToPid"] = json!(c.reply_to_pid);
        carried["deadlineAt"] = json!(c.deadline_at);
    }
    let mut message = json!({"role": "user", "content": text});
    message[ipc::REQUEST_KEY] = carried;
    run::send(k.clone(), target, &conv, message, None).await
}

/// A run of `pid` finished (its `proc.run.finished` payload): the calls
/// whose request it took are answered with its text, or failed with its
/// error.
pub fn on_run_finished(k: Arc<Kernel>, pid: String, payload: Value) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let Some(run_id) = payload["runId"].as_str().map(str::to_owned) else {
            return;
        };
        let (status, error) = match payload["status"].as_str() {
            Some("completed") => ("completed", None),
            Some("aborted") => ("aborted", Some("Target run was aborted".to_owned())),
            _ => (
                "error",
                Some(format!(
                    "Target run failed: {}",
                    payload["error"].as_str().unwrap_or("unknown error")
                )),
            ),
        };
        let response = (status == "completed")
            .then(|| json!({"text": payload["text"], "usage": payload["usage"]}));
        let pending = move |c: &Connection| ipc::pending_of_run(c, &pid, &run_id);
        if let Err(e) = settle(&k, pending, response, error).await {
            tracing::error!(error = %e, "settling IPC calls of a finished run");
        }
    })
}

/// Completes the calls `pending` picks with `response` or `error` and
/// cancels their deadlines (one transaction), then delivers each reply.
async fn settle<F>(
    k: &Arc<Kernel>,
    pending: F,
    response: Option<Value>,
    error: Option<String>,
) -> Result<(), KernelError>
where
    F: FnOnce(&Connection) -> Result<Vec<String>, KernelError> + Send + 'static,
{
    let settled =
        k.db.call(move |c| {
            let mut settled = Vec::new();
            for id in pending(c)? {
                if ipc::complete(c, &id, response.as_ref(), error.as_deref())? {
                    timers::cancel(c, &timer_id(&id))?;
                    settled.push(id);
                }
            }
            Ok(settled)
        })
        .await?;
    for id in settled {
        deliver_reply(k.clone(), id).await;
    }
    Ok(())
}

/// Fails the pending calls to `pid` (to its conversation `conv` only,
/// when given): the target was killed or reset.
pub async fn fail_pending_to(k: &Arc<Kernel>, pid: &str, conv: Option<&str>, reason: &str) {
    let (p, cv) = (pid.to_owned(), conv.map(str::to_owned));
    let pending = move |c: &Connection| ipc::pending_to(c, &p, cv.as_deref());
    if let Err(e) = settle(k, pending, None, Some(reason.to_owned())).await {
        tracing::error!(%pid, error = %e, "failing IPC calls to a cleared process");
    }
}

/// A call's deadline: a call still pending times out.
pub async fn on_timer(k: Arc<Kernel>, timer: Timer) {
    let id = timer.payload.clone();
    let i = id.clone();
    match k.db.call(move |c| ipc::time_out(c, &i)).await {
        Ok(true) => deliver_reply(k, id).await,
        Ok(false) => {}
        Err(e) => tracing::error!(call = %id, error = %e, "timing out an IPC call"),
    }
}

/// Delivers the replies a stopped kernel settled but did not deliver.
pub async fn recover(k: &Arc<Kernel>) -> Result<(), KernelError> {
    for id in k.db.call(|c| ipc::undelivered(c)).await? {
        deliver_reply(k.clone(), id).await;
    }
    Ok(())
}

/// Sends settled call `call_id`'s `ipc.reply` / `ipc.timeout` to the
/// owner's sockets and, as a message, to the calling process (a run
/// starts there); then the row goes.
fn deliver_reply(k: Arc<Kernel>, call_id: String) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let id = call_id.clone();
        let found =
            k.db.call(move |c| {
                let Some(call) = ipc::get(c, &id)? else {
                    return Ok(None);
                };
                let source = store::get(c, &call.source_pid)?;
                Ok(Some((call, source)))
            })
            .await;
        let (call, source) = match found {
            Ok(Some(found)) => found,
            Ok(None) => return,
            Err(e) => {
                tracing::error!(call = %call_id, error = %e, "reading a settled IPC call");
                return;
            }
        };
        let payload = call.payload();
        k.pool
            .signal_user(call.uid, Role::User, call.signal(), payload.clone());
        match source {
            None => tracing::warn!(call = %call_id, source = %call.source_pid,
                                   "IPC reply dropped: the calling process is gone"),
            Some(source) => {
                let text = match (call.status.as_str(), &call.error) {
                    ("timed_out", _) => format!(
                        "[ipc.timeout] IPC call {} to {} timed out",
                        call.call_id, call.target_pid
                    ),
                    (_, Some(e)) => format!(
                        "[ipc.reply] IPC call {} to {} failed: {e}",
                        call.call_id, call.target_pid
                    ),
                    _ => format!(
                        "[ipc.reply] IPC call {} answered by {}:\n{}",
                        call.call_id,
                        call.target_pid,
                        call.response
                            .as_ref()
                            .and_then(|r| r["text"].as_str())
                            .unwrap_or("")
                    ),
                };
                let conv = reply_conversation(&k, &source, &call.source_conversation_id).await;
                let message = json!({"role": "user", "content": text, "ipcReply": payload});
                if let Err(e) = run::send(k.clone(), source, &conv, message, None).await {
                    tracing::warn!(call = %call_id, error = %e, "IPC reply not delivered");
                }
            }
        }
        let id = call_id.clone();
        if let Err(e) = k.db.call(move |c| ipc::delete(c, &id)).await {
            tracing::error!(call = %call_id, error = %e, "removing a delivered IPC call");
        }
    })
}

/// The conversation a reply goes to: the one the call was made from,
/// else `default` when that one was closed since.
async fn reply_conversation(k: &Arc<Kernel>, source: &ProcRow, conv: &str) -> String {
    let (p, cv) = (source.pid.clone(), conv.to_owned());
    let open = k
        .db
        .call(move |c| Ok(conversations::get(c, &p, &cv)?.is_some_and(|c| c.status != "closed")))
        .await
        .unwrap_or(false);
    if open {
        conv.to_owned()
    } else {
        DEFAULT.to_owned()
    }
}
