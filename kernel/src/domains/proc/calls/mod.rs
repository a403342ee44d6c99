//! `proc.*`: the process registry and the calls forwarded to a process's
//! loop, which runs here too: [`run`] is the agent loop a `proc.send`
//! starts (as `shell.exec` starts a session's driver), [`signal`] what it
//! tells the owner. Every call that names a pid checks that the caller owns it (root
//! owns everything); a pid that does not exist and one the caller may not
//! see answer the same 403, so existence does not leak.

pub mod run;
pub mod signal;

use gsv_protocol::proc::{
    AbortResult, HilArgs, HilResult, HistoryArgs, HistoryResult, KillArgs, KillResult, ListArgs,
    ListResult, PidArgs, ResetResult, SendArgs, SendResult, SpawnArgs, SpawnResult,
};
use std::io::Write as _;
use std::sync::Arc;

use serde_json::{Value, json};
use wsd_sync::SyncPath;

use crate::db::now_ms;
use crate::domains::accounts;
use crate::domains::fs::calls::{ensure_dir, with_store};
use crate::domains::proc::store::{self, ProcRow};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};
use signal::emit;

/// The caller's row for `pid`, or 403.
async fn owned(k: &Arc<Kernel>, s: &Session, pid: &str) -> Result<ProcRow, KernelError> {
    let p = pid.to_owned();
    let row = k.db.call(move |c| store::get(c, &p)).await?;
    match row {
        Some(r) if s.identity.is_root() || r.owner_uid == s.identity.uid => Ok(r),
        _ => Err(KernelError::AccessDenied {
            kind: "process",
            id: pid.to_owned(),
        }),
    }
}

pub async fn spawn(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SpawnArgs,
) -> Result<SpawnResult, KernelError> {
    if let Some(parent) = &a.parent_pid {
        owned(&k, &s, parent).await.map_err(|_| {
            KernelError::PermissionDenied(format!("Cannot spawn under foreign process {parent}"))
        })?;
    }
    // A workspace is created or attached through the workspace syscalls
    // themselves, so their checks (ownership, archived state) apply.
    let workspace_id = match a.workspace {
        None => None,
        Some(w) => match w.mode.as_deref().unwrap_or("new") {
            "none" => None,
            "new" => {
                let mut args = serde_json::Map::new();
                if let Some(l) = w.label.or_else(|| a.label.clone()) {
                    args.insert("label".into(), json!(l));
                }
                let v = run::dispatch_call(&k, &s, "sys.workspace.create", args).await?;
                v["workspace"]["workspaceId"]
                    .as_str()
                    .or_else(|| v["workspace"]["id"].as_str())
                    .map(str::to_owned)
            }
            "attach" => {
                let id = w.workspace_id.ok_or_else(|| {
                    KernelError::BadRequest("workspace.mode attach needs workspaceId".into())
                })?;
                let mut args = serde_json::Map::new();
                args.insert("workspaceId".into(), json!(id));
                run::dispatch_call(&k, &s, "sys.workspace.get", args).await?;
                Some(id)
            }
            m => {
                return Err(KernelError::BadRequest(format!(
                    "workspace.mode must be none, new or attach, not '{m}'"
                )));
            }
        },
    };
    let cwd = match (&workspace_id, &a.cwd) {
        (Some(ws), _) => format!("/workspaces/{ws}"),
        (None, Some(c)) if c.starts_with('/') => c.clone(),
        (None, Some(c)) => format!("{}/{}", s.identity.home.trim_end_matches('/'), c),
        (None, None) => s.identity.home.clone(),
    };
    let label = a
        .label
        .map(|l| l.trim().chars().take(80).collect::<String>())
        .filter(|l| !l.is_empty());
    let row = ProcRow {
        pid: format!("proc:{}", uuid::Uuid::new_v4()),
        owner_uid: s.identity.uid,
        run_as_uid: s.identity.uid,
        username: s.identity.username.clone(),
        interactive: a.interactive.unwrap_or(true),
        parent_pid: a.parent_pid,
        label: label.clone(),
        cwd: cwd.clone(),
        workspace_id: workspace_id.clone(),
        state: "idle".into(),
        active_run_id: None,
        queued_count: 0,
        last_active_at: None,
        created_at: now_ms(),
    };
    let r = row.clone();
    k.db.call(move |c| store::insert(c, &r)).await?;
    tracing::info!(pid = %row.pid, owner = row.owner_uid, %cwd, "process spawned");
    let mut out = SpawnResult {
        ok: true,
        pid: row.pid.clone(),
        cwd,
        label,
        workspace_id,
        run_id: None,
    };
    if let Some(p) = a.prompt.filter(|p| !p.is_empty()) {
        let sent = run::send(k, row, json!({"role": "user", "content": p}), origin(&s)).await?;
        out.run_id = Some(sent.run_id);
    }
    Ok(out)
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let me = s.identity.uid;
    let filter = match a.uid {
        Some(u) if u != me && !s.identity.is_root() => {
            return Err(KernelError::PermissionDenied(format!(
                "proc.list of uid {u} (only your own processes)"
            )));
        }
        Some(u) => Some(u),
        None if s.identity.is_root() => None,
        None => Some(me),
    };
    let rows = k.db.call(move |c| store::list(c, filter)).await?;
    Ok(ListResult {
        processes: rows.iter().map(ProcRow::to_info).collect(),
    })
}

pub async fn send(k: Arc<Kernel>, s: Arc<Session>, a: SendArgs) -> Result<SendResult, KernelError> {
    let row = owned(&k, &s, &a.pid).await?;
    if a.message.is_empty() {
        return Err(KernelError::BadRequest("proc.send needs a message".into()));
    }
    run::send(
        k.clone(),
        row,
        json!({"role": "user", "content": a.message}),
        origin(&s),
    )
    .await
}

/// The connection a run started by `s` reports to: a user's socket; a
/// process or service caller has no socket of its own to watch.
fn origin(s: &Session) -> Option<&str> {
    (s.role == Role::User).then_some(s.connection_id.as_str())
}

pub async fn history(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: HistoryArgs,
) -> Result<HistoryResult, KernelError> {
    let row = owned(&k, &s, &a.pid).await?;
    let p = row.pid.clone();
    let all = k.db.call(move |c| store::messages(c, &p)).await?;
    let total = all.len();
    let offset = a.offset.unwrap_or(0).min(total);
    let limit = a.limit.unwrap_or(total);
    let messages: Vec<Value> = all.into_iter().skip(offset).take(limit).collect();
    Ok(HistoryResult {
        ok: true,
        pid: row.pid,
        truncated: offset + messages.len() < total,
        messages,
        message_count: total,
    })
}

pub async fn abort(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PidArgs,
) -> Result<AbortResult, KernelError> {
    let row = owned(&k, &s, &a.pid).await?;
    let run_id = k.procs.abort(&row.pid);
    Ok(AbortResult {
        ok: true,
        pid: row.pid,
        aborted: run_id.is_some(),
        run_id,
    })
}

pub async fn hil(k: Arc<Kernel>, s: Arc<Session>, a: HilArgs) -> Result<HilResult, KernelError> {
    let approve = match a.decision.as_str() {
        "approve" | "allow" => true,
        "deny" => false,
        d => {
            return Err(KernelError::BadRequest(format!(
                "decision must be approve or deny, not '{d}'"
            )));
        }
    };
    let q = a.request_id.clone();
    let pending = k.db.call(move |c| store::pending_hil(c, &q)).await?;
    let unknown = || KernelError::AccessDenied {
        kind: "approval request",
        id: a.request_id.clone(),
    };
    let (pid, call) = pending.ok_or_else(unknown)?;
    if a.pid.as_ref().is_some_and(|p| *p != pid) {
        return Err(unknown());
    }
    let row = owned(&k, &s, &pid).await.map_err(|_| unknown())?;
    let (q, p, c, remember) = (a.request_id.clone(), pid.clone(), call.clone(), a.remember);
    k.db.call(move |db| {
        store::settle_hil(db, &q, if approve { "approved" } else { "denied" })?;
        if approve && remember {
            store::allow(db, &p, &c)?;
        }
        Ok(())
    })
    .await?;
    let delivered = k.procs.answer_hil(&row.pid, &a.request_id, approve);
    Ok(HilResult {
        ok: true,
        pid: row.pid,
        request_id: a.request_id,
        decision: a.decision,
        resumed: delivered,
    })
}

pub async fn reset(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PidArgs,
) -> Result<ResetResult, KernelError> {
    let row = owned(&k, &s, &a.pid).await?;
    k.procs.abort(&row.pid);
    let (archive, archived) = archive_history(&k, &row).await?;
    let p = row.pid.clone();
    k.db.call(move |c| {
        store::clear_messages(c, &p)?;
        store::clear_queue(c, &p)
    })
    .await?;
    emit(
        &k,
        row.owner_uid,
        &row.pid,
        "proc.changed",
        json!({"changes": ["messages", "reset"]}),
    )
    .await;
    Ok(ResetResult {
        ok: true,
        pid: row.pid,
        archive_path: archive.clone(),
        archived_messages: archived,
        archived_to: archive,
    })
}

pub async fn kill(k: Arc<Kernel>, s: Arc<Session>, a: KillArgs) -> Result<KillResult, KernelError> {
    let row = owned(&k, &s, &a.pid).await?;
    k.procs.abort(&row.pid);
    let archive = if a.archive.unwrap_or(true) {
        archive_history(&k, &row).await?.0
    } else {
        None
    };
    let p = row.pid.clone();
    k.db.call(move |c| store::delete(c, &p)).await?;
    tracing::info!(pid = %row.pid, "process killed");
    Ok(KillResult {
        ok: true,
        pid: row.pid,
        archive_path: archive,
    })
}

/// Writes the history as gzip JSONL to
/// `/var/sessions/<user>/<pid>/<archiveId>.jsonl.gz`, with how many
/// messages it holds; `None` when empty.
async fn archive_history(
    k: &Arc<Kernel>,
    row: &ProcRow,
) -> Result<(Option<String>, usize), KernelError> {
    let p = row.pid.clone();
    let messages = k.db.call(move |c| store::messages(c, &p)).await?;
    if messages.is_empty() {
        return Ok((None, 0));
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for m in &messages {
        writeln!(gz, "{m}").map_err(|e| KernelError::internal("compressing history", e))?;
    }
    let bytes = gz
        .finish()
        .map_err(|e| KernelError::internal("compressing history", e))?;
    // `:` is legal in dofs names but awkward in shells; the archive keeps
    // the pid's uuid part.
    let dir = format!(
        "var/sessions/{}/{}",
        row.username,
        row.pid.trim_start_matches("proc:")
    );
    ensure_dir(&k.system, &dir).await?;
    let file = format!("{dir}/{}.jsonl.gz", accounts::random_hex(8));
    let path = SyncPath::canonicalize(&file).map_err(|e| KernelError::internal(&file, e))?;
    with_store(&k.system, move |d| d.write_file(&path, &bytes[..]))
        .await?
        .map_err(|e| KernelError::internal(&format!("writing /{file}"), e))?;
    Ok((Some(format!("/{file}")), messages.len()))
}
