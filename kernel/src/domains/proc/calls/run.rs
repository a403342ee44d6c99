//! The agent loop: one tokio task per active run. Model call → assistant
//! message → each tool call through the kernel's own dispatch (the same
//! capability and `target` routing path as a client call) → tool results
//! → queued messages injected → model again, until an answer without
//! tool calls. Every step is a row first, then a signal.

use gsv_protocol::codemode as codemode_args;
use gsv_protocol::proc::SendResult;
use gsv_protocol::shell::ShellToolArgs;
use gsv_protocol::{Targeted, fs, tool_parameters};
use schemars::JsonSchema;
use std::net::{Ipv4Addr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::signal::{deliver, emit};
use crate::domains::proc::hil::{self, Decision};
use crate::domains::proc::provider::{self, Completion, Delta, ProviderConfig, ProviderError};
use crate::domains::proc::store::{self, ProcRow};
use crate::domains::{accounts, codemode};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};

/// Model calls per run at most; a model that never stops calling tools
/// ends with an error instead of looping forever.
const MAX_STEPS: usize = 64;
const DEFAULT_MAX_CONTEXT_BYTES: usize = 64 * 1024;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The tool names the model sees and the syscall each one is.
pub const TOOLS: &[(&str, &str)] = &[
    ("Read", "fs.read"),
    ("Write", "fs.write"),
    ("Edit", "fs.edit"),
    ("Delete", "fs.delete"),
    ("Search", "fs.search"),
    ("Shell", "shell.exec"),
    ("CodeMode", "codemode.exec"),
];

/// How a run ended when it did not answer.
#[derive(Debug)]
enum End {
    Aborted,
    Failed(String),
}

/// `proc.send`: starts a run with `message`, or queues it behind the
/// active one. A run started for `origin` (a user connection) sends its
/// signals there only.
pub async fn send(
    k: Arc<Kernel>,
    row: ProcRow,
    message: Value,
    origin: Option<&str>,
) -> Result<SendResult, KernelError> {
    let pid = row.pid.clone();
    if let Some((run_id, cancel)) = k.procs.reserve(&pid) {
        if let Some(conn) = origin {
            k.procs.route(&run_id, conn);
        }
        let (p, r) = (pid.clone(), run_id.clone());
        let stored =
            k.db.call(move |c| {
                store::start_run(c, &p, &r)?;
                store::append_message(c, &p, Some(&r), &message)
            })
            .await;
        if let Err(e) = stored {
            k.procs.release(&pid, &run_id);
            k.procs.end_route(&run_id);
            return Err(e);
        }
        tokio::spawn(run_task(k, row, run_id.clone(), cancel));
        return Ok(SendResult {
            ok: true,
            status: "started".to_owned(),
            run_id: Some(run_id),
            queued: None,
            queued_count: None,
        });
    }
    let p = pid.clone();
    let queued = k.db.call(move |c| store::enqueue(c, &p, &message)).await?;
    let active = k.procs.active_run(&pid);
    if active.is_none() {
        // The run ended between the check and the insert: nobody else
        // will look at the queue, so promote it here.
        promote_queued(k.clone(), pid.clone()).await;
    }
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
        run_id: active.or_else(|| k.procs.active_run(&pid)),
        queued: Some(true),
        queued_count: Some(queued),
    })
}

/// Starts a run with the oldest queued message when `pid` is idle.
/// Boxed: a run's task promotes the next one, and the two futures would
/// otherwise contain each other.
pub fn promote_queued(k: Arc<Kernel>, pid: String) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let p = pid.clone();
        let Ok(Some(row)) = k.db.call(move |c| store::get(c, &p)).await else {
            return;
        };
        let Some((run_id, cancel)) = k.procs.reserve(&pid) else {
            return;
        };
        let (p, r) = (pid.clone(), run_id.clone());
        let next =
            k.db.call(move |c| {
                let mut got = store::dequeue(c, &p, 1)?;
                let Some(m) = got.pop() else {
                    return Ok(false);
                };
                store::start_run(c, &p, &r)?;
                store::append_message(c, &p, Some(&r), &m)?;
                Ok(true)
            })
            .await;
        match next {
            Ok(true) => {
                tokio::spawn(run_task(k, row, run_id, cancel));
            }
            Ok(false) => k.procs.release(&pid, &run_id),
            Err(e) => {
                tracing::error!(%pid, error = %e, "promoting a queued message");
                k.procs.release(&pid, &run_id);
            }
        }
    })
}

async fn run_task(k: Arc<Kernel>, row: ProcRow, run_id: String, cancel: CancellationToken) {
    let (pid, owner) = (row.pid.clone(), row.owner_uid);
    emit(
        &k,
        owner,
        &pid,
        "proc.run.started",
        json!({"runId": run_id}),
    )
    .await;
    // A panic inside the loop must still end the run: otherwise the
    // process stays reserved (every later message queues forever) and its
    // signal route is never forgotten.
    let result = AssertUnwindSafe(run_loop(&k, &row, &run_id, &cancel))
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
    let (p, r, err) = (pid.clone(), run_id.clone(), error.clone());
    let db_status = if status == "completed" { "ok" } else { status };
    if let Err(e) =
        k.db.call(move |c| {
            store::expire_hil(c, &p)?;
            if let Some(err) = &err {
                store::append_message(
                    c,
                    &p,
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
    let mut payload = json!({"runId": run_id, "status": status, "text": text, "usage": usage});
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
    })
}

/// Provider settings for `uid`, or a message naming the missing key.
async fn provider_config(k: &Arc<Kernel>, uid: i64) -> Result<ProviderConfig, String> {
    let get = |name: &'static str| async move {
        k.db.call(move |c| store::ai_config(c, uid, name))
            .await
            .map_err(|e| e.to_string())
    };
    let provider = get("provider").await?.unwrap_or_else(|| "openai".into());
    if !matches!(provider.as_str(), "openai" | "openai-compatible") {
        return Err(format!(
            "config/ai/provider is '{provider}': only \"openai\" (any OpenAI-compatible server) is supported"
        ));
    }
    let model = get("model").await?.ok_or(
        "No model configured: run `gsv config set ai.model NAME` and `gsv config set ai.base_url URL` (config/ai/model, config/ai/base_url)",
    )?;
    let base_url = get("base_url")
        .await?
        .unwrap_or_else(|| "https://api.openai.com/v1".into());
    let num = |v: Option<String>, key: &str| -> Result<Option<u64>, String> {
        v.map(|s| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("config/ai/{key} must be a whole number, not '{s}'"))
        })
        .transpose()
    };
    Ok(ProviderConfig {
        provider,
        model,
        api_key: get("api_key").await?,
        base_url,
        timeout: num(get("timeout_ms").await?, "timeout_ms")?
            .map_or(DEFAULT_TIMEOUT, Duration::from_millis),
        max_retries: num(get("max_retries").await?, "max_retries")?.unwrap_or(3) as usize,
        retry_base: Duration::from_millis(
            num(get("retry_base_ms").await?, "retry_base_ms")?.unwrap_or(500),
        ),
    })
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

/// `[section]` blocks joined by `---`, cut at `max` bytes.
async fn system_prompt(k: &Arc<Kernel>, row: &ProcRow, session: &Arc<Session>) -> String {
    let uid = row.owner_uid;
    let (sys, max) =
        k.db.call(move |c| {
            Ok((
                store::system_context(c)?,
                store::ai_config(c, uid, "max_context_bytes")?,
            ))
        })
        .await
        .unwrap_or_default();
    let max = max
        .and_then(|m| m.trim().parse::<usize>().ok())
        .unwrap_or(DEFAULT_MAX_CONTEXT_BYTES);
    let mut sections = Vec::new();
    for (key, text) in sys {
        let name = key.trim_start_matches("config/ai/context.d/");
        sections.push(format!("[system.{name}]\n{text}"));
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

/// The tool definitions in OpenAI `tools` form. Each tool's parameters
/// are the schema of its syscall's argument type (with `target`), so the
/// model sees exactly what the call accepts.
pub fn tool_defs() -> Vec<Value> {
    fn def<T: JsonSchema>(name: &str, description: &str) -> Value {
        json!({"type": "function", "function": {
            "name": name, "description": description,
            "parameters": tool_parameters::<Targeted<T>>()}})
    }
    vec![
        def::<fs::ReadArgs>("Read", "Read a file (numbered lines) or list a directory."),
        def::<fs::WriteArgs>("Write", "Create or replace a file."),
        def::<fs::EditArgs>("Edit", "Replace an exact string in a file."),
        def::<fs::DeleteArgs>(
            "Delete",
            "Delete a file or directory (asks the user first).",
        ),
        def::<fs::SearchArgs>("Search", "Search file contents for a literal string."),
        def::<ShellToolArgs>("Shell", "Run a shell command in the workspace."),
        json!({"type": "function", "function": {
            "name": "CodeMode", "description": codemode::TOOL_DESCRIPTION,
            "parameters": tool_parameters::<codemode_args::ExecArgs>()}}),
    ]
}

/// Stored messages in the OpenAI chat form. A tool call left without a
/// result (the run was aborted or the kernel stopped mid-call) gets a
/// synthetic error result: servers refuse a history with a dangling call,
/// and the model should know the call did not complete.
fn to_openai(system: &str, history: &[Value]) -> Vec<Value> {
    let mut out = vec![json!({"role": "system", "content": system})];
    let mut open: Vec<Value> = Vec::new();
    let close = |out: &mut Vec<Value>, open: &mut Vec<Value>| {
        for id in open.drain(..) {
            out.push(json!({"role": "tool", "tool_call_id": id,
                "content": "Error: interrupted before this tool call finished"}));
        }
    };
    for m in history {
        if m["role"] == "toolResult" {
            open.retain(|id| *id != m["toolCallId"]);
        } else {
            close(&mut out, &mut open);
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
            Some("toolResult") => out.push(json!({
                "role": "tool", "tool_call_id": m["toolCallId"], "content": m["content"],
            })),
            _ => {}
        }
    }
    close(&mut out, &mut open);
    out
}

async fn run_loop(
    k: &Arc<Kernel>,
    row: &ProcRow,
    run_id: &str,
    cancel: &CancellationToken,
) -> Result<Completion, End> {
    let cfg = provider_config(k, row.owner_uid)
        .await
        .map_err(End::Failed)?;
    let session = Arc::new(
        process_session(k, row)
            .await
            .map_err(|e| End::Failed(e.to_string()))?,
    );
    let system = system_prompt(k, row, &session).await;
    let tools = codemode::calls::with_mcp_declarations(k, &session, tool_defs()).await;
    let pid = row.pid.clone();
    for _ in 0..MAX_STEPS {
        let p = pid.clone();
        let history =
            k.db.call(move |c| store::messages(c, &p))
                .await
                .map_err(|e| End::Failed(e.to_string()))?;
        let messages = to_openai(&system, &history);
        let completion = tokio::select! {
            _ = cancel.cancelled() => return Err(End::Aborted),
            r = call_with_retries(k, row, run_id, &cfg, &messages, &tools) => r,
        }
        .map_err(|e| End::Failed(e.to_string()))?;
        let calls: Vec<Value> = completion
            .tool_calls
            .iter()
            .map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments}))
            .collect();
        let mut msg = json!({"role": "assistant", "content": completion.text});
        if !calls.is_empty() {
            msg["toolCalls"] = json!(calls);
        }
        let (p, r) = (pid.clone(), run_id.to_owned());
        k.db.call(move |c| store::append_message(c, &p, Some(&r), &msg))
            .await
            .map_err(|e| End::Failed(e.to_string()))?;
        if completion.tool_calls.is_empty() {
            return Ok(completion);
        }
        for tc in &completion.tool_calls {
            let (output, is_error) = tokio::select! {
                _ = cancel.cancelled() => return Err(End::Aborted),
                r = run_tool(k, row, run_id, &session, tc) => r,
            };
            let content = match &output {
                Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let result = json!({"role": "toolResult", "toolCallId": tc.id,
                "toolName": tc.name, "content": content, "isError": is_error});
            let (p, r) = (pid.clone(), run_id.to_owned());
            k.db.call(move |c| store::append_message(c, &p, Some(&r), &result))
                .await
                .map_err(|e| End::Failed(e.to_string()))?;
            let mut payload = json!({"runId": run_id, "toolCallId": tc.id,
                "toolName": tc.name, "isError": is_error});
            payload[if is_error { "error" } else { "output" }] = output;
            emit(k, row.owner_uid, &pid, "proc.run.tool.finished", payload).await;
        }
        // The tool-result boundary: follow-ups sent during this run join
        // it before the next model call.
        let (p, r) = (pid.clone(), run_id.to_owned());
        let injected =
            k.db.call(move |c| {
                let msgs = store::dequeue(c, &p, i64::MAX)?;
                for m in &msgs {
                    store::append_message(c, &p, Some(&r), m)?;
                }
                Ok(msgs.len())
            })
            .await
            .map_err(|e| End::Failed(e.to_string()))?;
        if injected > 0 {
            emit(
                k,
                row.owner_uid,
                &pid,
                "proc.changed",
                json!({"runId": run_id, "changes": ["messages"]}),
            )
            .await;
        }
    }
    Err(End::Failed(format!(
        "the model called tools {MAX_STEPS} times without answering"
    )))
}

async fn call_with_retries(
    k: &Arc<Kernel>,
    row: &ProcRow,
    run_id: &str,
    cfg: &ProviderConfig,
    messages: &[Value],
    tools: &[Value],
) -> Result<Completion, ProviderError> {
    let mut delays = ExponentialBuilder::default()
        .with_min_delay(cfg.retry_base)
        .with_max_delay(Duration::from_secs(30))
        .with_max_times(cfg.max_retries)
        .build();
    let mut attempt = 0;
    loop {
        attempt += 1;
        let on_delta = |d: Delta| {
            let event = match d {
                Delta::Text(t) => json!({"type": "text_delta", "delta": t}),
                Delta::ToolCall {
                    index,
                    id,
                    name,
                    arguments,
                } => json!({"type": "toolcall_delta", "contentIndex": index,
                    "id": id, "name": name, "delta": arguments}),
            };
            // Too frequent to project onto the row: the queue length is
            // the one the last projected signal saw.
            deliver(
                k,
                row.owner_uid,
                "proc.run.stream",
                json!({"pid": row.pid, "runId": run_id, "timestamp": crate::db::now_ms(),
                       "event": event, "queuedCount": k.procs.queued(&row.pid)}),
            );
        };
        match provider::complete(k.procs.http(), cfg, messages, tools, on_delta).await {
            Ok(c) => return Ok(c),
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
            Err(e) => return Err(e),
        }
    }
}

/// Runs one tool call: map, approve, dispatch. `(output or error, is_error)`.
async fn run_tool(
    k: &Arc<Kernel>,
    row: &ProcRow,
    run_id: &str,
    session: &Arc<Session>,
    tc: &provider::ToolCall,
) -> (Value, bool) {
    let Some(&(_, call)) = TOOLS.iter().find(|(n, _)| *n == tc.name) else {
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
    emit(
        k,
        row.owner_uid,
        &row.pid,
        "proc.run.tool.started",
        json!({"runId": run_id, "toolCallId": tc.id, "toolName": tc.name,
               "syscall": call, "args": args}),
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

/// The model's tool call an approval request belongs to.
#[derive(Debug, Clone, Copy)]
pub struct ToolRef<'a> {
    pub call_id: &'a str,
    pub name: &'a str,
}

/// Asks the process's owner before `call` runs when the approval policy
/// says so (the tool's own calls and CodeMode's nested ones alike); the
/// error is the tool-result text. Asking needs an active run.
pub async fn approve(
    k: &Arc<Kernel>,
    row: &ProcRow,
    session: &Session,
    run_id: Option<&str>,
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
        hil::decide(
            call,
            &Value::Object(args.clone()),
            &row.cwd,
            &session.identity.home,
        )
    };
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
        let request_id = format!("hil_{}", accounts::random_hex(12));
        let (tx, rx) = oneshot::channel();
        if !k.procs.await_hil(&row.pid, run_id, request_id.clone(), tx) {
            return Err("the run ended before approval".into());
        }
        let (p, r, q, c, a) = (
            row.pid.clone(),
            run_id.to_owned(),
            request_id.clone(),
            call.to_owned(),
            Value::Object(args.clone()),
        );
        if let Err(e) =
            k.db.call(move |db| store::insert_hil(db, &q, &p, &r, &c, &a))
                .await
        {
            return Err(e.to_string());
        }
        emit(
            k,
            row.owner_uid,
            &row.pid,
            "proc.run.hil.requested",
            json!({"runId": run_id, "requestId": request_id, "toolCallId": tool.call_id,
                   "toolName": tool.name, "syscall": call, "args": args, "tags": tags}),
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
    for (pid, run_id) in stale {
        let msg = "the kernel stopped during this run".to_owned();
        let (p, r, m) = (pid.clone(), run_id.clone(), msg.clone());
        let owner =
            k.db.call(move |c| {
                store::finish_run(c, &r, "error", Some(&m))?;
                store::append_message(
                    c,
                    &p,
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
    fn tool_parameters_are_the_syscall_argument_schemas_with_a_target() {
        let defs = tool_defs();
        let names: Vec<_> = defs.iter().map(|d| d["function"]["name"].clone()).collect();
        assert_eq!(names, TOOLS.iter().map(|t| json!(t.0)).collect::<Vec<_>>());
        let params = |name: &str| {
            defs.iter()
                .find(|d| d["function"]["name"] == name)
                .map(|d| d["function"]["parameters"].clone())
                .unwrap()
        };
        let read = params("Read");
        assert_eq!(read["type"], "object");
        assert_eq!(read["required"], json!(["path"]));
        for key in ["path", "offset", "limit", "target"] {
            assert!(read["properties"].get(key).is_some(), "{key}: {read}");
        }
        let edit = params("Edit");
        let mut req: Vec<_> = edit["required"].as_array().unwrap().clone();
        req.sort_by_key(|v| v.to_string());
        assert_eq!(
            req,
            vec![json!("newString"), json!("oldString"), json!("path")]
        );
        assert!(edit["properties"].get("replaceAll").is_some(), "{edit}");
        let shell = params("Shell");
        for key in ["command", "timeout", "sessionId", "target"] {
            assert!(shell["properties"].get(key).is_some(), "{key}: {shell}");
        }
        assert!(serde_json::to_string(&defs).unwrap().find("$ref").is_none());
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
