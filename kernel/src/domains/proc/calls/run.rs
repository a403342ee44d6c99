//! The agent loop: one tokio task per active run. Model call → assistant
//! message → each tool call through the kernel's own dispatch (the same
//! capability and `target` routing path as a client call) → tool results
//! → queued messages injected → model again, until an answer without
//! tool calls. Every step is a row first, then a signal.

use gsv_protocol::ai::{ConfigResult, ToolsResult};
use gsv_protocol::proc::{ContextState, HilRequest, Overflow, SendResult};
use std::net::{Ipv4Addr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::compact::{Selector, SummaryKind, compact_now};
use super::signal::{deliver, emit};
use crate::domains::accounts;
use crate::domains::adapter::SurfaceRoute;
use crate::domains::ai;
use crate::domains::proc::RunRoute;
use crate::domains::proc::conversations;
use crate::domains::proc::hil::{self, Decision, Policy};
use crate::domains::proc::provider::{self, Completion, Delta, ProviderConfig, ProviderError};
use crate::domains::proc::store::{self, ProcRow};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};

/// Model calls per run at most; a model that never stops calling tools
/// ends with an error instead of looping forever.
const MAX_STEPS: usize = 64;

/// How a run ended when it did not answer.
#[derive(Debug)]
enum End {
    Aborted,
    Failed(String),
}

/// `proc.send`: starts a run with `message` in conversation `conv`, or
/// queues it behind the active one. A run started for `origin` (a user
/// connection, a chat surface) sends its signals there only; a queued
/// message from a surface names it in its `origin`, so the run it starts
/// later answers there too.
pub async fn send(
    k: Arc<Kernel>,
    row: ProcRow,
    conv: &str,
    message: Value,
    origin: Option<RunRoute>,
) -> Result<SendResult, KernelError> {
    let pid = row.pid.clone();
    let queue = k.procs.queue_lock(&pid).await;
    if let Some((run_id, cancel)) = k.procs.reserve(&pid, conv) {
        if let Some(route) = origin {
            k.procs.route(&run_id, route);
        }
        let (p, r, cv) = (pid.clone(), run_id.clone(), conv.to_owned());
        let stored =
            k.db.call(move |c| {
                store::start_run(c, &p, &cv, &r)?;
                store::append_message(c, &p, &cv, Some(&r), &message)
            })
            .await;
        if let Err(e) = stored {
            k.procs.release(&pid, &run_id);
            k.procs.end_route(&run_id);
            return Err(e);
        }
        tokio::spawn(run_task(k, row, conv.to_owned(), run_id.clone(), cancel));
        return Ok(SendResult {
            ok: true,
            status: "started".to_owned(),
            run_id: Some(run_id),
            queued: None,
            queued_count: None,
        });
    }
    let (p, cv) = (pid.clone(), conv.to_owned());
    let queued =
        k.db.call(move |c| store::enqueue(c, &p, &cv, &message))
            .await?;
    let active = k.procs.active_run(&pid);
    if active.is_none() {
        // The run ended between the check and the insert; its own
        // promotion waits for the queue lock we hold, so promote here.
        promote_locked(&k, &pid).await;
    }
    let run_id = active.or_else(|| k.procs.active_run(&pid));
    // Not held across the signal: its listeners may send to this process.
    drop(queue);
    emit(
        &k,
        row.owner_uid,
        &pid,
        "proc.changed",
        json!({"changes": ["queue"]}),
    )
    .await;
    Ok(SendResult {
        ok: true,
        status: "started".to_owned(),
        run_id,
        queued: Some(true),
        queued_count: Some(queued),
    })
}

/// Starts a run with the oldest queued message when `pid` is idle.
/// Boxed: a run's task promotes the next one, and the two futures would
/// otherwise contain each other.
pub fn promote_queued(k: Arc<Kernel>, pid: String) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let _queue = k.procs.queue_lock(&pid).await;
        promote_locked(&k, &pid).await;
    })
}

/// [`promote_queued`] under the queue lock the caller holds.
async fn promote_locked(k: &Arc<Kernel>, pid: &str) {
    let pid = pid.to_owned();
    let p = pid.clone();
    let Ok(Some(row)) = k.db.call(move |c| store::get(c, &p)).await else {
        return;
    };
    // The run's conversation is the queued message's; reserved under
    // a placeholder until the message is taken off the queue.
    let Some((run_id, cancel)) = k.procs.reserve(&pid, "") else {
        return;
    };
    let (p, r) = (pid.clone(), run_id.clone());
    let next =
        k.db.call(move |c| {
            let mut got = store::dequeue(c, &p, None, 1)?;
            let Some((conv, m)) = got.pop() else {
                return Ok(None);
            };
            store::start_run(c, &p, &conv, &r)?;
            store::append_message(c, &p, &conv, Some(&r), &m)?;
            Ok(Some((conv, SurfaceRoute::from_origin(&m["origin"]))))
        })
        .await;
    match next {
        Ok(Some((conv, origin))) => {
            k.procs.set_conversation(&pid, &run_id, &conv);
            if let Some(surface) = origin {
                k.procs.route(&run_id, RunRoute::Surface(surface));
            }
            tokio::spawn(run_task(k.clone(), row, conv, run_id, cancel));
        }
        Ok(None) => k.procs.release(&pid, &run_id),
        Err(e) => {
            tracing::error!(%pid, error = %e, "promoting a queued message");
            k.procs.release(&pid, &run_id);
        }
    }
}

async fn run_task(
    k: Arc<Kernel>,
    row: ProcRow,
    conv: String,
    run_id: String,
    cancel: CancellationToken,
) {
    let (pid, owner) = (row.pid.clone(), row.owner_uid);
    emit(
        &k,
        owner,
        &pid,
        "proc.run.started",
        json!({"runId": run_id, "conversationId": conv}),
    )
    .await;
    // A panic inside the loop must still end the run: otherwise the
    // process stays reserved (every later message queues forever) and its
    // signal route is never forgotten.
    let result = AssertUnwindSafe(run_loop(&k, &row, &conv, &run_id, &cancel))
        .catch_unwind()
        .await
        .unwrap_or_else(|_| {
            tracing::error!(%pid, run = %run_id, "the run's task panicked");
            Err(End::Failed("the run stopped on an internal error".into()))
        });
    let (status, text, usage, error) = match &result {
        Ok(c) => ("completed", c.text.clone(), c.usage.clone(), None),
        Err(End::Aborted) => ("aborted", String::new(), json!({}), None),
        Err(End::Failed(e)) => ("error", String::new(), json!({}), Some(e.clone())),
    };
    let (p, r, err, cv) = (pid.clone(), run_id.clone(), error.clone(), conv.clone());
    let db_status = if status == "completed" { "ok" } else { status };
    if let Err(e) =
        k.db.call(move |c| {
            store::expire_hil(c, &p)?;
            if let Some(err) = &err {
                store::append_message(
                    c,
                    &p,
                    &cv,
                    Some(&r),
                    &json!({"role": "system", "content": format!("Run failed: {err}")}),
                )?;
            }
            store::finish_run(c, &r, db_status, err.as_deref())
        })
        .await
    {
        tracing::error!(%pid, run = %run_id, error = %e, "recording a finished run");
    }
    k.procs.release(&pid, &run_id);
    let mut payload = json!({"runId": run_id, "conversationId": conv, "status": status,
                             "text": text, "usage": usage});
    if let Some(e) = error {
        payload["error"] = json!(e);
    }
    if status == "aborted" {
        payload["aborted"] = json!(true);
    }
    emit(&k, owner, &pid, "proc.run.finished", payload).await;
    promote_queued(k, pid).await;
}

/// The session a process's tool calls run as: its run-as account and
/// that account's capabilities, cwd set to the process's.
pub async fn process_session(k: &Arc<Kernel>, row: &ProcRow) -> Result<Session, KernelError> {
    let uid = row.run_as_uid;
    let (identity, caps) =
        k.db.call(move |c| {
            let id = accounts::identity_by_uid(c, uid)?
                .ok_or_else(|| KernelError::Internal(format!("account uid {uid} is gone")))?;
            let caps = accounts::capabilities(c, &id.gids)?;
            Ok((id, caps))
        })
        .await?;
    Ok(Session {
        connection_id: crate::session::process_connection_id(&row.pid),
        role: Role::User,
        identity: accounts::ProcessIdentity {
            cwd: row.cwd.clone(),
            ..identity
        },
        capabilities: caps,
        client_id: row.pid.clone(),
        peer: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        device: None,
        channel: None,
    })
}

/// The loop's own `ai.config` and `ai.tools` calls, as the process.
async fn run_inputs(
    k: &Arc<Kernel>,
    session: &Arc<Session>,
) -> Result<(ConfigResult, ToolsResult), String> {
    let ask = |call: &'static str| async move {
        dispatch_call(k, session, call, Map::new())
            .await
            .map_err(|e| e.to_string())
    };
    let config =
        serde_json::from_value(ask("ai.config").await?).map_err(|e| format!("ai.config: {e}"))?;
    let tools =
        serde_json::from_value(ask("ai.tools").await?).map_err(|e| format!("ai.tools: {e}"))?;
    Ok((config, tools))
}

/// A call made on a process's behalf: the same gate and dispatch as a
/// client's request in `server.rs` (capability, then `target` routing),
/// kept in this one place so the two cannot drift apart silently.
pub async fn dispatch_call(
    k: &Arc<Kernel>,
    session: &Arc<Session>,
    call: &str,
    args: Map<String, Value>,
) -> Result<Value, KernelError> {
    let entry = k.dispatch.gate(session, call)?;
    crate::routing::run_call(&k.router, entry, k.clone(), session.clone(), call, args).await
}

/// A dispatched call's outcome as the model sees it: output or error text.
pub async fn syscall(
    k: &Arc<Kernel>,
    session: &Arc<Session>,
    call: &str,
    args: Map<String, Value>,
) -> Result<Value, String> {
    match dispatch_call(k, session, call, args).await {
        Ok(v) if v.get("ok") == Some(&Value::Bool(false)) => Err(v
            .get("error")
            .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned))
            .unwrap_or_else(|| "failed".into())),
        Ok(v) => Ok(v),
        Err(e) => Err(e.to_string()),
    }
}

/// `[section]` blocks joined by `---`, cut at `maxContextBytes`: the
/// system's and the profile's context files of `ai.config`, the home's
/// `context.d`, the process.
async fn system_prompt(
    k: &Arc<Kernel>,
    row: &ProcRow,
    session: &Arc<Session>,
    ai: &ConfigResult,
) -> String {
    let max = ai.max_context_bytes as usize;
    let mut sections = Vec::new();
    for f in &ai.system_context_files {
        sections.push(format!("[system.{}]\n{}", f.name, f.text));
    }
    for f in &ai.profile_context_files {
        sections.push(format!("[profile.{}.{}]\n{}", ai.profile, f.name, f.text));
    }
    // The home's context.d is read through fs.* like any file the account
    // may read; a missing directory is simply no section.
    let dir = format!("{}/context.d", session.identity.home);
    if let Ok(listing) = syscall(k, session, "fs.read", obj(json!({"path": dir}))).await {
        let mut files: Vec<String> = listing["files"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .filter(|f| f.ends_with(".md"))
            .map(str::to_owned)
            .collect();
        files.sort();
        for f in files {
            let path = format!("{dir}/{f}");
            if let Ok(v) = syscall(k, session, "fs.read", obj(json!({"path": path}))).await {
                let text = strip_line_numbers(v["content"].as_str().unwrap_or(""));
                sections.push(format!("[home.{f}]\n{text}"));
            }
        }
    }
    sections.push(format!(
        "[process]\npid: {}\nuser: {}\ncwd: {}\nTools take paths relative to cwd. \
         Shell runs in the process's workspace.",
        row.pid, row.username, row.cwd
    ));
    let mut out = sections.join("\n---\n");
    if out.len() > max {
        let mut cut = max;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

/// `fs.read` numbers lines as `{n}\t`; the prompt wants the text.
fn strip_line_numbers(s: &str) -> String {
    s.lines()
        .map(|l| l.split_once('\t').map_or(l, |(_, t)| t))
        .collect::<Vec<_>>()
        .join("\n")
}

fn obj(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// What the `tool` message of an image read says in place of the image.
const IMAGE_ATTACHED: &str = "(image attached in the next message)";

/// What it says instead when the model takes no images (`config/ai/images`).
const IMAGE_NOT_SENT: &str =
    "(image not shown: this model does not accept image input; config/ai/images is false)";

/// The text that introduces the images of the tool results before it.
const IMAGES_FROM_TOOLS: &str = "Attached image(s) from tool result:";

/// A `Read` result that is an image (`fs.read`'s `kind:"image"`): the
/// tool message's text (the result without the base64) and the image as
/// OpenAI `image_url` parts (data URLs), or none when the model does not
/// accept images (`images` false; the text says so). Chat completions
/// take text only in a `tool` message, so the images follow in a user
/// message, as the reference gateway's provider layer sends them.
fn image_result(m: &Value, images: bool) -> Option<(String, Vec<Value>)> {
    if m["toolName"] != "Read" || m["isError"] == true {
        return None;
    }
    let text = m["content"].as_str()?;
    // Most results are text reads: skip the parse unless it can be an image.
    if !text.starts_with('{') || !text.contains(r#""kind":"image""#) {
        return None;
    }
    let mut result: Value = serde_json::from_str(text).ok()?;
    if result["kind"] != "image" {
        return None;
    }
    let parts: Vec<Value> = result["content"]
        .as_array()?
        .iter()
        .filter(|c| c["type"] == "image")
        .filter_map(|c| {
            let (data, mime) = (c["data"].as_str()?, c["mimeType"].as_str()?);
            Some(json!({"type": "image_url",
                        "image_url": {"url": format!("data:{mime};base64,{data}")}}))
        })
        .collect();
    if parts.is_empty() {
        return None;
    }
    if !images {
        result["content"] = json!(IMAGE_NOT_SENT);
        return Some((result.to_string(), Vec::new()));
    }
    result["content"] = json!(IMAGE_ATTACHED);
    Some((result.to_string(), parts))
}

/// Stored messages in the OpenAI chat form. A tool call left without a
/// result (the run was aborted or the kernel stopped mid-call) gets a
/// synthetic error result: servers refuse a history with a dangling call,
/// and the model should know the call did not complete. Images read by
/// `Read` follow the turn's tool messages as one user message of
/// `image_url` parts when the model accepts images (`images`, from
/// `config/ai/images`, on unless set), else their tool message says why
/// they are missing.
fn to_openai(system: &str, history: &[Value], images_accepted: bool) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": system})];
    let mut open: Vec<Value> = Vec::new();
    let mut images: Vec<Value> = Vec::new();
    let close = |out: &mut Vec<Value>, open: &mut Vec<Value>, images: &mut Vec<Value>| {
        for id in open.drain(..) {
            out.push(json!({"role": "tool", "tool_call_id": id,
                "content": "Error: interrupted before this tool call finished"}));
        }
        // After every tool message of the turn: a tool call's results must
        // follow it directly.
        if !images.is_empty() {
            let mut content = vec![json!({"type": "text", "text": IMAGES_FROM_TOOLS})];
            content.append(images);
            out.push(json!({"role": "user", "content": content}));
        }
    };
    for m in history {
        if m["role"] == "toolResult" {
            open.retain(|id| *id != m["toolCallId"]);
        } else {
            close(&mut out, &mut open, &mut images);
        }
        match m["role"].as_str() {
            Some("user") | Some("system") => {
                out.push(json!({"role": m["role"], "content": m["content"]}));
            }
            Some("assistant") => {
                let calls: Vec<Value> = m["toolCalls"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| {
                        json!({"id": c["id"], "type": "function",
                               "function": {"name": c["name"], "arguments": c["arguments"]}})
                    })
                    .collect();
                let mut a = json!({"role": "assistant", "content": m["content"]});
                if !calls.is_empty() {
                    open.extend(calls.iter().map(|c| c["id"].clone()));
                    a["tool_calls"] = json!(calls);
                }
                out.push(a);
            }
            Some("toolResult") => {
                let content = match image_result(m, images_accepted) {
                    Some((text, parts)) => {
                        images.extend(parts);
                        json!(text)
                    }
                    None => m["content"].clone(),
                };
                out.push(json!({
                    "role": "tool", "tool_call_id": m["toolCallId"], "content": content,
                }));
            }
            _ => {}
        }
    }
    close(&mut out, &mut open, &mut images);
    out
}

async fn run_loop(
    k: &Arc<Kernel>,
    row: &ProcRow,
    conv: &str,
    run_id: &str,
    cancel: &CancellationToken,
) -> Result<Completion, End> {
    let session = Arc::new(
        process_session(k, row)
            .await
            .map_err(|e| End::Failed(e.to_string()))?,
    );
    let (ai, offered) = run_inputs(k, &session).await.map_err(End::Failed)?;
    let cfg = ProviderConfig::from_ai_config(&ai).map_err(End::Failed)?;
    let policy = hil::approval_policy(&ai, row.run_as_uid).map_err(End::Failed)?;
    let system = system_prompt(k, row, &session, &ai).await;
    let tools: Vec<Value> = offered
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema}})
        })
        .collect();
    let pid = row.pid.clone();
    let failed = |e: KernelError| End::Failed(e.to_string());
    let stream = RunStream {
        run_id,
        conversation_id: conv,
        seq: AtomicU64::new(0),
    };
    for _ in 0..MAX_STEPS {
        let (p, cv) = (pid.clone(), conv.to_owned());
        let mut history =
            k.db.call(move |c| store::messages(c, &p, &cv))
                .await
                .map_err(failed)?;
        let mut messages = to_openai(&system, &history, cfg.images);
        if preflight(k, row, conv, &cfg, &messages).await? {
            let (p, cv) = (pid.clone(), conv.to_owned());
            history =
                k.db.call(move |c| store::messages(c, &p, &cv))
                    .await
                    .map_err(failed)?;
            messages = to_openai(&system, &history, cfg.images);
        }
        let completion = tokio::select! {
            _ = cancel.cancelled() => return Err(End::Aborted),
            r = call_with_retries(k, row, &cfg, &messages, &tools, &stream) => r,
        }
        .map_err(|e| End::Failed(e.to_string()))?;
        record_context(k, row, conv, &cfg, &messages, &completion).await;
        let calls: Vec<Value> = completion
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
            .collect();
        let mut msg = json!({"role": "assistant", "content": completion.text});
        if !completion.thinking.is_empty() {
            msg["thinking"] = json!(completion.thinking);
        }
        if !calls.is_empty() {
            msg["toolCalls"] = json!(calls);
        }
        let (p, r, cv) = (pid.clone(), run_id.to_owned(), conv.to_owned());
        k.db.call(move |c| store::append_message(c, &p, &cv, Some(&r), &msg))
            .await
            .map_err(failed)?;
        let mut output = json!({"runId": run_id, "conversationId": conv,
                                "text": completion.text});
        if !completion.thinking.is_empty() {
            output["thinking"] = json!(completion.thinking);
        }
        deliver(k, row.owner_uid, "proc.run.output", with_pid(output, &pid));
        if completion.tool_calls.is_empty() {
            return Ok(completion);
        }
        for tc in &completion.tool_calls {
            let (output, is_error) = tokio::select! {
                _ = cancel.cancelled() => return Err(End::Aborted),
                r = run_tool(k, row, run_id, &session, policy.as_ref(), tc) => r,
            };
            let content = match &output {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let result = json!({"role": "toolResult", "toolCallId": tc.id,
                "toolName": tc.name, "content": content, "isError": is_error});
            let (p, r, cv) = (pid.clone(), run_id.to_owned(), conv.to_owned());
            k.db.call(move |c| store::append_message(c, &p, &cv, Some(&r), &result))
                .await
                .map_err(failed)?;
            let mut payload = json!({"runId": run_id, "conversationId": conv,
                "toolCallId": tc.id, "toolName": tc.name, "isError": is_error});
            payload[if is_error { "error" } else { "output" }] = output;
            emit(k, row.owner_uid, &pid, "proc.run.tool.finished", payload).await;
        }
        // The tool-result boundary: follow-ups sent to this conversation
        // during this run join it before the next model call.
        let (p, r, cv) = (pid.clone(), run_id.to_owned(), conv.to_owned());
        let injected =
            k.db.call(move |c| {
                let msgs = store::dequeue(c, &p, Some(&cv), i64::MAX)?;
                for (_, m) in &msgs {
                    store::append_message(c, &p, &cv, Some(&r), m)?;
                }
                Ok(msgs.len())
            })
            .await
            .map_err(failed)?;
        if injected > 0 {
            emit(
                k,
                row.owner_uid,
                &pid,
                "proc.changed",
                json!({"runId": run_id, "conversationId": conv, "changes": ["messages"]}),
            )
            .await;
        }
    }
    Err(End::Failed(format!(
        "the model called tools {MAX_STEPS} times without answering"
    )))
}

fn with_pid(mut v: Value, pid: &str) -> Value {
    v["pid"] = json!(pid);
    v["timestamp"] = json!(crate::db::now_ms());
    v
}

/// Input tokens of `messages` by the seed's estimate: JSON characters ÷ 4
/// × 1.15.
fn estimate_tokens(messages: &[Value]) -> u64 {
    let chars: usize = messages.iter().map(|m| m.to_string().len()).sum();
    ((chars as f64 / 4.0) * 1.15).ceil() as u64
}

/// Pressure of `tokens` in a window of `window` with `max_output`
/// reserved for the answer.
fn pressure(tokens: u64, window: u64, max_output: u64) -> f64 {
    let room = if window > max_output {
        window - max_output
    } else {
        window
    };
    tokens as f64 / room.max(1) as f64
}

/// Records the pressure the model call saw: the provider's reported
/// prompt tokens when it sent usage, else the estimate.
async fn record_context(
    k: &Arc<Kernel>,
    row: &ProcRow,
    conv: &str,
    cfg: &ProviderConfig,
    messages: &[Value],
    completion: &Completion,
) {
    let reported = completion.usage["prompt_tokens"].as_u64();
    let state = ContextState {
        input_tokens: reported.unwrap_or_else(|| estimate_tokens(messages)),
        source: if reported.is_some() {
            "provider"
        } else {
            "estimate"
        }
        .to_owned(),
        context_window_tokens: cfg.context_window_tokens,
        pressure: cfg.context_window_tokens.map(|w| {
            pressure(
                reported.unwrap_or_else(|| estimate_tokens(messages)),
                w,
                cfg.max_tokens,
            )
        }),
        measured_at: crate::db::now_ms(),
    };
    let (p, cv) = (row.pid.clone(), conv.to_owned());
    if let Err(e) =
        k.db.call(move |c| conversations::set_context(c, &p, &cv, &state))
            .await
    {
        tracing::warn!(pid = %row.pid, error = %e, "recording context pressure");
    }
}

/// The run preflight (seed 000): measures the pressure the next model call
/// would see and applies the conversation's overflow policy. `fail` ends
/// the run before any model call, `auto-compact` compacts with a
/// model-written summary, `manual` does nothing. True when it compacted.
async fn preflight(
    k: &Arc<Kernel>,
    row: &ProcRow,
    conv: &str,
    cfg: &ProviderConfig,
    messages: &[Value],
) -> Result<bool, End> {
    let Some(window) = cfg.context_window_tokens else {
        return Ok(false);
    };
    let (p, cv) = (row.pid.clone(), conv.to_owned());
    let (policy, last) =
        k.db.call(move |c| {
            Ok((
                conversations::policy(c, &p, &cv)?,
                conversations::context(c, &p, &cv)?,
            ))
        })
        .await
        .map_err(|e| End::Failed(e.to_string()))?;
    // The provider's count of an earlier, shorter prompt is a floor for
    // this one; the estimate covers what was added since.
    let reported = last
        .filter(|s| s.source == "provider")
        .map_or(0, |s| s.input_tokens);
    let tokens = estimate_tokens(messages).max(reported);
    let now = pressure(tokens, window, cfg.max_tokens);
    if now < policy.compact_at_pressure {
        return Ok(false);
    }
    match policy.overflow {
        Overflow::Manual => Ok(false),
        Overflow::Fail => Err(End::Failed(format!(
            "Context pressure {now:.2} reached {:.2} in conversation {conv} \
             (overflow policy fail): compact or reset it",
            policy.compact_at_pressure
        ))),
        Overflow::AutoCompact => {
            let selector = Selector::KeepLast(policy.keep_last as usize);
            match compact_now(k, row, conv, selector, SummaryKind::Generate).await {
                Ok(Some(r)) => {
                    emit(
                        k,
                        row.owner_uid,
                        &row.pid,
                        "proc.changed",
                        json!({"conversationId": conv, "changes": ["messages", "compacted"],
                               "segmentId": r.segment.id}),
                    )
                    .await;
                    Ok(true)
                }
                Ok(None) => Ok(false),
                Err(e) => Err(End::Failed(format!("auto-compaction failed: {e}"))),
            }
        }
    }
}

async fn call_with_retries(
    k: &Arc<Kernel>,
    row: &ProcRow,
    cfg: &ProviderConfig,
    messages: &[Value],
    tools: &[Value],
    stream: &RunStream<'_>,
) -> Result<Completion, ProviderError> {
    let (conv, run_id) = (stream.conversation_id, stream.run_id);
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(cfg.retry_base)
        .with_max_delay(Duration::from_secs(30))
        .with_max_times(cfg.max_retries)
        .build();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let send = |event: Value| {
            // Too frequent to project onto the row: the queue length is
            // the one the last projected signal saw.
            deliver(
                k,
                row.owner_uid,
                "proc.run.stream",
                json!({"pid": row.pid, "runId": run_id, "conversationId": conv,
                       "seq": stream.seq.fetch_add(1, Ordering::Relaxed),
                       "timestamp": crate::db::now_ms(),
                       "event": event, "queuedCount": k.procs.queued(&row.pid)}),
            );
        };
        let mut blocks = Blocks::default();
        let on_delta = |d: Delta| {
            for event in blocks.events(d) {
                send(event);
            }
        };
        let result = provider::complete(k.procs.http(), cfg, messages, tools, on_delta).await;
        if let Some(end) = blocks.close() {
            send(end);
        }
        match result {
            Ok(c) => {
                send(
                    json!({"type": "done", "reason": if c.tool_calls.is_empty() { "stop" } else { "toolUse" }}),
                );
                return Ok(c);
            }
            Err(e) if e.retryable() => match delays.next() {
                Some(delay) => {
                    tracing::warn!(pid = %row.pid, attempt, error = %e, "model call failed; retrying");
                    emit(
                        k,
                        row.owner_uid,
                        &row.pid,
                        "proc.run.retrying",
                        json!({"runId": run_id, "attempt": attempt,
                               "delayMs": delay.as_millis() as u64, "error": e.to_string()}),
                    )
                    .await;
                    tokio::time::sleep(delay).await;
                }
                None => return Err(e),
            },
            Err(e) => {
                send(json!({"type": "error", "error": e.to_string()}));
                return Err(e);
            }
        }
    }
}

/// The block structure of a streamed answer (seed 002's events): each
/// text, thinking or tool-call block opens with `*_start`, carries
/// `*_delta`s and closes with `*_end` when the next block starts or the
/// answer ends. `contentIndex` numbers the blocks of one answer.
#[derive(Debug, Default)]
struct Blocks {
    /// The open block: its kind and, for a tool call, the provider's index.
    open: Option<(&'static str, u64)>,
    next_index: u64,
}

impl Blocks {
    fn events(&mut self, d: Delta) -> Vec<Value> {
        let (kind, key, mut delta) = match d {
            Delta::Text(t) => ("text", 0, json!({"delta": t})),
            Delta::Thinking(t) => ("thinking", 0, json!({"delta": t})),
            Delta::ToolCall {
                index,
                id,
                name,
                arguments,
            } => (
                "toolcall",
                index,
                json!({"id": id, "name": name, "delta": arguments}),
            ),
        };
        let mut out = Vec::new();
        if self.open != Some((kind, key)) {
            out.extend(self.close());
            self.open = Some((kind, key));
            self.next_index += 1;
            out.push(json!({"type": format!("{kind}_start"), "contentIndex": self.next_index - 1}));
        }
        delta["type"] = json!(format!("{kind}_delta"));
        delta["contentIndex"] = json!(self.next_index - 1);
        out.push(delta);
        out
    }

    fn close(&mut self) -> Option<Value> {
        let (kind, _) = self.open.take()?;
        Some(json!({"type": format!("{kind}_end"), "contentIndex": self.next_index - 1}))
    }
}

/// Per run: where its `proc.run.stream` signals belong and the sequence
/// number of the next one.
#[derive(Debug)]
struct RunStream<'a> {
    run_id: &'a str,
    conversation_id: &'a str,
    seq: AtomicU64,
}

/// Runs one tool call: map, approve, dispatch. `(output or error, is_error)`.
async fn run_tool(
    k: &Arc<Kernel>,
    row: &ProcRow,
    run_id: &str,
    session: &Arc<Session>,
    policy: Option<&Policy>,
    tc: &provider::ToolCall,
) -> (Value, bool) {
    let Some(&(_, call)) = ai::tools::TOOLS.iter().find(|(n, _)| *n == tc.name) else {
        return (json!(format!("Unknown tool: {}", tc.name)), true);
    };
    let args = if tc.arguments.trim().is_empty() {
        Map::new()
    } else {
        match serde_json::from_str::<Value>(&tc.arguments) {
            Ok(Value::Object(m)) => m,
            _ => {
                return (
                    json!(format!("{}: arguments are not a JSON object", tc.name)),
                    true,
                );
            }
        }
    };
    let args = with_cwd(args, call, &row.cwd);
    if let Err(refused) = approve(
        k,
        row,
        session,
        Some(run_id),
        policy,
        ToolRef {
            call_id: &tc.id,
            name: &tc.name,
        },
        call,
        &args,
    )
    .await
    {
        return (json!(refused), true);
    }
    let conv = active_conversation(k, row);
    emit(
        k,
        row.owner_uid,
        &row.pid,
        "proc.run.tool.started",
        json!({"runId": run_id, "conversationId": conv, "toolCallId": tc.id,
               "toolName": tc.name, "syscall": call, "args": args}),
    )
    .await;
    match syscall(k, session, call, args).await {
        // A CodeMode block that failed is a failed tool call.
        Ok(v) => {
            let failed = v.get("status").and_then(Value::as_str) == Some("failed");
            (v, call == "codemode.exec" && failed)
        }
        Err(e) => (json!(e), true),
    }
}

fn active_conversation(k: &Kernel, row: &ProcRow) -> String {
    k.procs
        .active_conversation(&row.pid)
        .unwrap_or_else(|| conversations::DEFAULT.to_owned())
}

/// The model's tool call an approval request belongs to.
#[derive(Debug, Clone, Copy)]
pub struct ToolRef<'a> {
    pub call_id: &'a str,
    pub name: &'a str,
}

/// Asks the process's owner before `call` runs when the approval policy
/// says so (the tool's own calls and CodeMode's nested ones alike); the
/// error is the tool-result text. Asking needs an active run.
#[allow(clippy::too_many_arguments)]
pub async fn approve(
    k: &Arc<Kernel>,
    row: &ProcRow,
    session: &Session,
    run_id: Option<&str>,
    policy: Option<&Policy>,
    tool: ToolRef<'_>,
    call: &str,
    args: &Map<String, Value>,
) -> Result<(), String> {
    let (p, c) = (row.pid.clone(), call.to_owned());
    let remembered =
        k.db.call(move |db| store::is_allowed(db, &p, &c))
            .await
            .unwrap_or(false);
    let decision = if remembered {
        Decision::Auto
    } else {
        hil::decide_with(
            policy,
            call,
            &Value::Object(args.clone()),
            &row.cwd,
            &session.identity.home,
        )
    };
    if decision == Decision::Deny {
        return Err(format!("{call} is denied by the approval policy"));
    }
    if let Decision::Ask(tags) = decision {
        if !row.interactive {
            return Err(format!(
                "{call} needs approval ({}) and this process is not interactive",
                tags.join(", ")
            ));
        }
        let Some(run_id) = run_id else {
            return Err(format!(
                "{call} needs approval ({}) and no run of this process is active to ask in",
                tags.join(", ")
            ));
        };
        let conv = active_conversation(k, row);
        let request_id = format!("hil_{}", accounts::random_hex(12));
        let (tx, rx) = oneshot::channel();
        if !k.procs.await_hil(&row.pid, run_id, request_id.clone(), tx) {
            return Err("the run ended before approval".into());
        }
        let request = HilRequest {
            request_id: request_id.clone(),
            run_id: run_id.to_owned(),
            conversation_id: conv.clone(),
            call_id: tool.call_id.to_owned(),
            tool_name: tool.name.to_owned(),
            syscall: call.to_owned(),
            args: Value::Object(args.clone()),
            created_at: crate::db::now_ms(),
        };
        let p = row.pid.clone();
        k.db.call(move |db| store::insert_hil(db, &p, &request))
            .await
            .map_err(|e| e.to_string())?;
        emit(
            k,
            row.owner_uid,
            &row.pid,
            "proc.run.hil.requested",
            json!({"runId": run_id, "conversationId": conv, "requestId": request_id,
                   "toolCallId": tool.call_id, "toolName": tool.name, "syscall": call,
                   "args": args, "tags": tags}),
        )
        .await;
        // An aborted run drops the sender; that reads as a denial.
        if !rx.await.unwrap_or(false) {
            return Err(format!("{call} was denied by the user"));
        }
    }
    Ok(())
}

/// Relative paths are the process's cwd's; `Shell` runs in its cwd (its
/// workspace) unless the model names another. A call for a device keeps
/// its paths and cwd as given: the kernel's cwd means nothing there, and
/// the device resolves relative paths against its own root.
pub fn with_cwd(mut args: Map<String, Value>, call: &str, cwd: &str) -> Map<String, Value> {
    let on_device =
        matches!(args.get("target"), Some(Value::String(t)) if !t.is_empty() && t != "gsv");
    if call == "shell.exec"
        && let Some(c) = args.remove("command")
    {
        // The model's `command` is the syscall's `input` (reference shape).
        args.entry("input").or_insert(c);
    }
    if on_device {
        return args;
    }
    for key in ["path"] {
        if let Some(Value::String(p)) = args.get(key)
            && !p.starts_with('/')
            && !p.starts_with('~')
        {
            let joined = if p.is_empty() || p == "." {
                cwd.to_owned()
            } else {
                format!("{}/{}", cwd.trim_end_matches('/'), p)
            };
            args.insert(key.to_owned(), json!(joined));
        }
    }
    if call == "shell.exec" {
        args.entry("cwd").or_insert_with(|| json!(cwd));
    }
    args
}

/// Ends runs a stopped kernel left `running` and restarts queued work.
pub async fn recover(k: &Arc<Kernel>) -> Result<(), KernelError> {
    let stale = k.db.call(|c| store::interrupted_runs(c)).await?;
    for (pid, run_id, conv) in stale {
        let msg = "the kernel stopped during this run".to_owned();
        let (p, r, m) = (pid.clone(), run_id.clone(), msg.clone());
        let owner =
            k.db.call(move |c| {
                store::finish_run(c, &r, "error", Some(&m))?;
                store::append_message(
                    c,
                    &p,
                    &conv,
                    Some(&r),
                    &json!({"role": "system", "content": format!("Run failed: {m}")}),
                )?;
                store::expire_hil(c, &p)?;
                Ok(store::get(c, &p)?.map(|row| row.owner_uid))
            })
            .await?;
        tracing::warn!(%pid, run = %run_id, "run interrupted by a kernel stop");
        if let Some(owner) = owner {
            emit(
                k,
                owner,
                &pid,
                "proc.run.finished",
                json!({"runId": run_id, "status": "error", "text": "", "usage": {}, "error": msg}),
            )
            .await;
        }
    }
    for pid in k.db.call(|c| store::pids_with_queue(c)).await? {
        promote_queued(k.clone(), pid).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_images_follow_all_of_the_turns_tool_messages_as_image_url_parts() {
        let image = json!({"ok": true, "path": "/a.png", "size": 3, "kind": "image",
            "contentType": "image/png",
            "content": [{"type": "image", "data": "AAEC", "mimeType": "image/png"}]});
        let history = vec![
            json!({"role": "user", "content": "look"}),
            json!({"role": "assistant", "content": "", "toolCalls": [
                {"id": "a", "name": "Read", "arguments": "{}"},
                {"id": "b", "name": "Read", "arguments": "{}"},
                {"id": "c", "name": "Read", "arguments": "{}"}]}),
            json!({"role": "toolResult", "toolCallId": "a", "toolName": "Read",
                   "content": image.to_string(), "isError": false}),
            // A text read that mentions an image kind stays text.
            json!({"role": "toolResult", "toolCallId": "b", "toolName": "Read",
                   "content": r#"1	"kind":"image""#, "isError": false}),
            json!({"role": "user", "content": "and?"}),
        ];
        let out = to_openai("sys", &history, true);
        let roles: Vec<&str> = out.iter().map(|m| m["role"].as_str().unwrap()).collect();
        assert_eq!(
            roles,
            [
                "system",
                "user",
                "assistant",
                "tool",
                "tool",
                "tool",
                "user",
                "user"
            ]
        );
        let first: Value = serde_json::from_str(out[3]["content"].as_str().unwrap()).unwrap();
        assert_eq!(first["content"], IMAGE_ATTACHED);
        assert_eq!(first["contentType"], "image/png");
        assert_eq!(out[4]["content"], r#"1	"kind":"image""#);
        // The interrupted call's synthetic result comes before the images.
        assert_eq!(out[5]["tool_call_id"], "c");
        assert_eq!(
            out[6]["content"],
            json!([{"type": "text", "text": IMAGES_FROM_TOOLS},
                   {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAEC"}}])
        );
        assert_eq!(out[7]["content"], "and?");
    }

    #[test]
    fn tool_paths_join_the_process_cwd_natively_but_stay_as_given_for_a_device() {
        let native = with_cwd(obj(json!({"path": "a.txt"})), "fs.read", "/home/alice");
        assert_eq!(native["path"], "/home/alice/a.txt");
        let device = with_cwd(
            obj(json!({"path": "a.txt", "target": "laptop"})),
            "fs.read",
            "/home/alice",
        );
        assert_eq!(device["path"], "a.txt");
        let shell = with_cwd(
            obj(json!({"command": "ls", "target": "laptop"})),
            "shell.exec",
            "/home/alice",
        );
        assert_eq!(shell, obj(json!({"input": "ls", "target": "laptop"})));
        let gsv = with_cwd(
            obj(json!({"command": "ls", "target": "gsv"})),
            "shell.exec",
            "/workspaces/w1",
        );
        assert_eq!(gsv["cwd"], "/workspaces/w1");
    }
}
