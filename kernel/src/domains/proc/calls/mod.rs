//! `proc.*`: the process registry and the calls forwarded to a process's
//! loop, which runs here too: [`run`] is the agent loop a `proc.send`
//! starts (as `shell.exec` starts a session's driver), [`signal`] what it
//! tells the owner, [`conversation`] the `proc.conversation.*` calls.
//! Every call that names a pid checks that the caller owns it (root
//! owns everything); a pid that does not exist and one the caller may not
//! see answer the same 403, so existence does not leak. A call without
//! `pid` goes to the caller's home process `init:{uid}`, which
//! `sys.connect` starts or reconciles ([`ensure_init`]).

pub mod archive;
pub mod compact;
pub mod conversation;
pub mod ipc;
pub mod run;
pub mod signal;
pub mod signal_watch;

use gsv_protocol::proc::{
    AbortResult, ArchiveEntry, HilArgs, HilResult, HistoryArgs, HistoryResult, KillArgs,
    KillResult, ListArgs, ListResult, PidArgs, ProfileListResult, ResetResult, SendArgs,
    SendResult, SpawnArgs, SpawnResult,
};
use std::sync::Arc;

use serde_json::{Value, json};

use crate::db::now_ms;
use crate::domains::accounts::{self, ProcessIdentity};
use crate::domains::proc::RunRoute;
use crate::domains::proc::conversations::{self, DEFAULT};
use crate::domains::proc::profiles::{self, INIT};
use crate::domains::proc::store::{self, ProcRow};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};
use archive::{sessions_dir, write_archive};
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

/// The home process id of `uid`.
pub fn init_pid(uid: i64) -> String {
    format!("init:{uid}")
}

/// Starts the home process of `identity` or reconciles it (its account
/// name, its profile, its `default` conversation); its row.
pub async fn ensure_init(
    k: &Arc<Kernel>,
    identity: &ProcessIdentity,
) -> Result<ProcRow, KernelError> {
    let fresh = ProcRow {
        pid: init_pid(identity.uid),
        owner_uid: identity.uid,
        run_as_uid: identity.uid,
        username: identity.username.clone(),
        interactive: true,
        parent_pid: None,
        label: Some("init".to_owned()),
        cwd: identity.home.clone(),
        workspace_id: None,
        state: "idle".into(),
        active_run_id: None,
        queued_count: 0,
        last_active_at: None,
        created_at: now_ms(),
        profile: INIT.to_owned(),
    };
    k.db.call(move |c| {
        let tx = c.transaction()?;
        match store::get(&tx, &fresh.pid)? {
            None => store::insert(&tx, &fresh)?,
            Some(_) => store::reconcile_init(&tx, &fresh.pid, &fresh.username)?,
        }
        conversations::ensure(&tx, &fresh.pid, DEFAULT)?;
        let row = store::get(&tx, &fresh.pid)?
            .ok_or_else(|| KernelError::Internal("home process row vanished".into()))?;
        tx.commit()?;
        Ok(row)
    })
    .await
}

/// The process a call names, or the caller's home process without `pid`.
pub async fn target(
    k: &Arc<Kernel>,
    s: &Session,
    pid: Option<&str>,
) -> Result<ProcRow, KernelError> {
    match pid {
        Some(p) => owned(k, s, p).await,
        None => ensure_init(k, &s.identity).await,
    }
}

pub async fn profile_list(
    _k: Arc<Kernel>,
    _s: Arc<Session>,
    _a: serde_json::Map<String, Value>,
) -> Result<ProfileListResult, KernelError> {
    Ok(ProfileListResult {
        profiles: profiles::SYSTEM.iter().map(|p| p.info()).collect(),
    })
}

pub async fn spawn(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SpawnArgs,
) -> Result<SpawnResult, KernelError> {
    spawn_as(k, s, a, false).await
}

/// `proc.spawn` on the kernel's own behalf (a schedule's `process.spawn`
/// target): the caller's capability was checked by its gate, and a
/// profile users may not start (`cron`) is allowed.
pub async fn spawn_internal(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SpawnArgs,
) -> Result<SpawnResult, KernelError> {
    spawn_as(k, s, a, true).await
}

async fn spawn_as(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SpawnArgs,
    internal: bool,
) -> Result<SpawnResult, KernelError> {
    let profile_id = a
        .profile
        .clone()
        .unwrap_or_else(|| profiles::TASK.to_owned());
    let profile = profiles::get(&profile_id).ok_or_else(|| KernelError::InvalidArgs {
        call: "proc.spawn".into(),
        reason: format!(
            "profile: unknown profile '{profile_id}' (one of {})",
            profiles::SYSTEM
                .iter()
                .map(|p| p.id)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    })?;
    if !profile.startable && !internal {
        return Err(KernelError::PermissionDenied(format!(
            "proc.spawn: profile {} is not startable",
            profile.id
        )));
    }
    if profile.singleton {
        let row = ensure_init(&k, &s.identity).await?;
        return spawned(k, &s, row, a.prompt).await;
    }
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
        interactive: a.interactive.unwrap_or(profile.interactive),
        parent_pid: a.parent_pid,
        label,
        cwd: cwd.clone(),
        workspace_id,
        state: "idle".into(),
        active_run_id: None,
        queued_count: 0,
        last_active_at: None,
        created_at: now_ms(),
        profile: profile.id.to_owned(),
    };
    let r = row.clone();
    k.db.call(move |c| {
        store::insert(c, &r)?;
        conversations::ensure(c, &r.pid, DEFAULT)?;
        Ok(())
    })
    .await?;
    tracing::info!(pid = %row.pid, owner = row.owner_uid, %cwd, "process spawned");
    spawned(k, &s, row, a.prompt).await
}

/// The answer to a spawn of `row`, once its first prompt (if any) has
/// started a run.
async fn spawned(
    k: Arc<Kernel>,
    s: &Session,
    row: ProcRow,
    prompt: Option<String>,
) -> Result<SpawnResult, KernelError> {
    let mut out = SpawnResult {
        ok: true,
        pid: row.pid.clone(),
        profile: row.profile.clone(),
        cwd: row.cwd.clone(),
        label: row.label.clone(),
        workspace_id: row.workspace_id.clone(),
        run_id: None,
    };
    if let Some(p) = prompt.filter(|p| !p.is_empty()) {
        let sent = run::send(
            k,
            row,
            DEFAULT,
            json!({"role": "user", "content": p}),
            origin(s),
        )
        .await?;
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
    let route = origin(&s);
    send_routed(k, s, a, route).await
}

/// `proc.send` whose run reports along `route` (an adapter's message: its
/// chat surface, which the stored message names as its `origin`).
pub async fn send_routed(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SendArgs,
    route: Option<RunRoute>,
) -> Result<SendResult, KernelError> {
    if a.message.is_empty() {
        return Err(KernelError::InvalidArgs {
            call: "proc.send".into(),
            reason: "message: must not be empty".into(),
        });
    }
    let conv = conversations::conversation_arg("proc.send", a.conversation_id.as_deref())?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let (p, cv) = (row.pid.clone(), conv.clone());
    let status =
        k.db.call(move |c| conversations::ensure_status(c, &p, &cv))
            .await?;
    if status.as_deref() == Some("closed") {
        return Err(KernelError::Conflict(format!(
            "Conversation is closed: {conv} (reopen it with proc.conversation.open)"
        )));
    }
    let mut message = json!({"role": "user", "content": a.message});
    if let Some(RunRoute::Surface(surface)) = &route {
        message["origin"] = surface.to_origin();
    }
    run::send(k.clone(), row, &conv, message, route).await
}

/// Where a run started by `s` reports: a user's socket; a process or
/// service caller has no socket of its own to watch.
fn origin(s: &Session) -> Option<RunRoute> {
    (s.role == Role::User).then(|| RunRoute::Connection(s.connection_id.clone()))
}

pub async fn history(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: HistoryArgs,
) -> Result<HistoryResult, KernelError> {
    let conv = conversations::conversation_arg("proc.history", a.conversation_id.as_deref())?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let offset = a.offset.unwrap_or(0);
    let limit = conversations::page_limit(a.limit);
    let (p, cv) = (row.pid.clone(), conv.clone());
    let (messages, total, context, pending_hil) =
        k.db.call(move |c| {
            let (m, total) = store::messages_page(c, &p, &cv, offset, limit)?;
            Ok((
                m,
                total,
                conversations::context(c, &p, &cv)?,
                store::pending_hil_of(c, &p)?,
            ))
        })
        .await?;
    Ok(HistoryResult {
        ok: true,
        pid: row.pid,
        conversation_id: conv,
        truncated: offset + messages.len() < total,
        messages,
        message_count: total,
        context,
        pending_hil,
    })
}

pub async fn abort(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PidArgs,
) -> Result<AbortResult, KernelError> {
    let row = target(&k, &s, a.pid.as_deref()).await?;
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
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let cleared = clear_process(&k, &row, true).await?;
    Ok(ResetResult {
        ok: true,
        pid: row.pid,
        archive_path: cleared.first_path(),
        archived_messages: cleared.messages(),
        archived_to: cleared.dir,
        archives: cleared.archives,
    })
}

/// `proc.kill`: clears the process's state like a reset (archiving unless
/// `archive: false`); the registry row stays (seed 000).
pub async fn kill(k: Arc<Kernel>, s: Arc<Session>, a: KillArgs) -> Result<KillResult, KernelError> {
    let row = owned(&k, &s, &a.pid).await?;
    if a.remove && row.profile == INIT {
        return Err(KernelError::InvalidArgs {
            call: "proc.kill".into(),
            reason: format!("remove: the home process {} is never removed", row.pid),
        });
    }
    let cleared = clear_process(&k, &row, a.archive.unwrap_or(true)).await?;
    if a.remove {
        let p = row.pid.clone();
        k.db.call(move |c| store::delete(c, &p)).await?;
    }
    tracing::info!(pid = %row.pid, removed = a.remove, "process killed");
    Ok(KillResult {
        ok: true,
        pid: row.pid,
        archive_path: cleared.first_path(),
        archived_messages: cleared.messages(),
        archived_to: cleared.dir,
        archives: cleared.archives,
    })
}

/// What a reset or kill archived.
struct Cleared {
    dir: Option<String>,
    archives: Vec<ArchiveEntry>,
}

impl Cleared {
    fn messages(&self) -> usize {
        self.archives.iter().map(|a| a.messages).sum()
    }

    /// The `default` conversation's archive, else the first.
    fn first_path(&self) -> Option<String> {
        self.archives
            .iter()
            .find(|a| a.conversation_id == DEFAULT)
            .or(self.archives.first())
            .map(|a| a.path.clone())
    }
}

/// Aborts the run, archives every non-empty conversation under one
/// `/var/sessions/<user>/<pid>/<archiveId>/` (when `archive`), clears
/// messages, queue, approvals and remembered rules, and bumps every
/// conversation's generation.
async fn clear_process(
    k: &Arc<Kernel>,
    row: &ProcRow,
    archive: bool,
) -> Result<Cleared, KernelError> {
    k.procs.abort(&row.pid);
    ipc::fail_pending_to(
        k,
        &row.pid,
        None,
        &format!("Target process {} was reset or killed", row.pid),
    )
    .await;
    let p = row.pid.clone();
    let convs = k.db.call(move |c| conversations::list(c, &p, true)).await?;
    let mut archives = Vec::new();
    let archive_dir = format!("{}/{}", sessions_dir(row), accounts::random_hex(8));
    if archive {
        for conv in convs.iter().filter(|c| c.message_count > 0) {
            let (p, cv) = (row.pid.clone(), conv.id.clone());
            let messages = k.db.call(move |c| store::messages(c, &p, &cv)).await?;
            let path =
                write_archive(k, &archive_dir, &format!("{}.jsonl.gz", conv.id), &messages).await?;
            archives.push(ArchiveEntry {
                conversation_id: conv.id.clone(),
                generation: conv.generation,
                messages: messages.len(),
                path,
            });
        }
    }
    let p = row.pid.clone();
    k.db.call(move |c| {
        let tx = c.transaction()?;
        store::clear_state(&tx, &p)?;
        for conv in &convs {
            conversations::next_generation(&tx, &p, &conv.id)?;
        }
        store::project(&tx, &p, "idle", None, 0)?;
        tx.commit()?;
        Ok(())
    })
    .await?;
    emit(
        k,
        row.owner_uid,
        &row.pid,
        "proc.changed",
        json!({"changes": ["messages", "reset"]}),
    )
    .await;
    Ok(Cleared {
        dir: (!archives.is_empty()).then(|| format!("/{archive_dir}")),
        archives,
    })
}
