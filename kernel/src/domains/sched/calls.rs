//! `sched.*` calls: user-owned schedules in the kernel database, woken by the
//! one timer table. A schedule's row and its wake timer change together
//! (see [`store`]); when the timer fires the schedule runs in `due` mode,
//! exactly as `sched.run` would run it. Overlap policy `skip`: a schedule
//! whose previous run is still dispatching is skipped, not queued.
//!
//! Ownership: a non-root caller sees and touches only its own schedules;
//! another user's id is answered exactly like a missing one (403 from
//! `update`/`run`, `removed: false` from `remove`).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::{expr, store, types};
use crate::db::now_ms;
use crate::domains::accounts;
use crate::domains::proc::calls::run::dispatch_call;
use crate::domains::proc::store as procs;
use crate::domains::timers::Timer;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};
use types::{
    AddArgs, ListArgs, ListResult, RemoveArgs, RemoveResult, RunArgs, RunMode, RunOutcome,
    RunResult, RunStatus, ScheduleRecord, ScheduleResult, ScheduleState, ScheduleTarget,
    UpdateArgs,
};

/// `sched.list` `limit`: default, and clamped to `1 ..= MAX_LIST_LIMIT`.
pub const DEFAULT_LIST_LIMIT: usize = 100;
pub const MAX_LIST_LIMIT: usize = 500;
/// The profile a `process.spawn` target starts unless it names one.
pub const DEFAULT_SPAWN_PROFILE: &str = "cron";
/// Where the server's default zone for cron schedules is configured.
pub const SERVER_TIMEZONE_KEY: &str = "config/server/timezone";

fn invalid(call: &str, reason: impl Into<String>) -> KernelError {
    KernelError::InvalidArgs {
        call: call.to_owned(),
        reason: reason.into(),
    }
}

fn not_yours(id: &str) -> KernelError {
    KernelError::AccessDenied {
        kind: "schedule",
        id: id.to_owned(),
    }
}

/// The caller's schedule `id` (root's: anyone's), or 403 whether it is
/// missing or another user's.
async fn owned(k: &Kernel, s: &Session, id: &str) -> Result<ScheduleRecord, KernelError> {
    let q = id.to_owned();
    match k.db.call(move |c| store::get(c, &q)).await? {
        Some(r) if s.identity.is_root() || r.owner_uid == s.identity.uid => Ok(r),
        _ => Err(not_yours(id)),
    }
}

async fn server_zone(k: &Kernel) -> Result<Option<String>, KernelError> {
    let entries =
        k.db.call(|c| accounts::config_get(c, accounts::ROOT_UID, Some(SERVER_TIMEZONE_KEY)))
            .await?;
    Ok(entries
        .into_iter()
        .find(|(key, _)| key == SERVER_TIMEZONE_KEY)
        .map(|(_, v)| v.trim().to_owned())
        .filter(|v| !v.is_empty()))
}

fn required_text(call: &str, arg: &str, v: String) -> Result<String, KernelError> {
    let t = v.trim();
    if t.is_empty() {
        return Err(invalid(call, format!("{arg} is required")));
    }
    Ok(t.to_owned())
}

fn optional_text(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// Trims the target's text and refuses what is missing; a process it
/// names must be the caller's (root: anyone's).
async fn check_target(
    k: &Kernel,
    s: &Session,
    call: &str,
    t: ScheduleTarget,
) -> Result<ScheduleTarget, KernelError> {
    let t = match t {
        ScheduleTarget::ProcessSpawn {
            profile,
            label,
            prompt,
            parent_pid,
            workspace,
            mounts,
            assignment,
        } => ScheduleTarget::ProcessSpawn {
            profile: optional_text(profile),
            label: optional_text(label),
            prompt: required_text(call, "target.prompt", prompt)?,
            parent_pid: optional_text(parent_pid),
            workspace,
            mounts,
            assignment,
        },
        ScheduleTarget::ProcessEvent {
            pid,
            conversation_id,
            message,
            data,
        } => ScheduleTarget::ProcessEvent {
            pid: required_text(call, "target.pid", pid)?,
            conversation_id: optional_text(conversation_id),
            message: required_text(call, "target.message", message)?,
            data,
        },
    };
    let named = match &t {
        ScheduleTarget::ProcessSpawn { parent_pid, .. } => parent_pid.clone(),
        ScheduleTarget::ProcessEvent { pid, .. } => Some(pid.clone()),
    };
    if let Some(pid) = named {
        let p = pid.clone();
        let row = k.db.call(move |c| procs::get(c, &p)).await?;
        if !row.is_some_and(|r| s.identity.is_root() || r.owner_uid == s.identity.uid) {
            return Err(KernelError::AccessDenied {
                kind: "process",
                id: pid,
            });
        }
    }
    Ok(t)
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    // The reference's rule: only root chooses whose schedules it sees.
    let owner = if s.identity.is_root() {
        a.owner_uid
    } else {
        Some(s.identity.uid)
    };
    let limit = a.limit.map_or(DEFAULT_LIST_LIMIT, |l| {
        (l.trunc().max(1.0) as usize).min(MAX_LIST_LIMIT)
    });
    let offset = a.offset.map_or(0, |o| o.trunc().max(0.0) as usize);
    let include_disabled = a.include_disabled.unwrap_or(false);
    let (schedules, count) =
        k.db.call(move |c| store::list(c, owner, include_disabled, limit, offset))
            .await?;
    Ok(ListResult { schedules, count })
}

pub async fn add(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: AddArgs,
) -> Result<ScheduleResult, KernelError> {
    const CALL: &str = "sched.add";
    let name = required_text(CALL, "name", a.name)?;
    let zone = server_zone(&k).await?;
    let expression = expr::normalize(a.expression, "expression", zone.as_deref())
        .map_err(|e| invalid(CALL, e.0))?;
    let target = check_target(&k, &s, CALL, a.target).await?;
    let now = now_ms();
    let enabled = a.enabled.unwrap_or(true);
    let next = if enabled {
        expr::next_run(&expression, now).map_err(|e| invalid(CALL, format!("expression: {e}")))?
    } else {
        None
    };
    let schedule = ScheduleRecord {
        id: uuid::Uuid::new_v4().to_string(),
        owner_uid: s.identity.uid,
        name,
        description: optional_text(a.description),
        enabled,
        expression,
        target,
        overlap_policy: Default::default(),
        created_at_ms: now,
        updated_at_ms: now,
        state: ScheduleState {
            next_run_at_ms: next,
            running_at_ms: None,
            last_run_at_ms: None,
            last_status: None,
            last_error: None,
            last_duration_ms: None,
            run_count: 0,
        },
    };
    let stored = schedule.clone();
    k.db.call(move |c| store::insert(c, &stored)).await?;
    k.timers.poke();
    tracing::info!(id = %schedule.id, owner = schedule.owner_uid, next = ?next, "schedule added");
    Ok(ScheduleResult { schedule })
}

pub async fn update(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: UpdateArgs,
) -> Result<ScheduleResult, KernelError> {
    const CALL: &str = "sched.update";
    let mut schedule = owned(&k, &s, &a.id).await?;
    let p = a.patch;
    if let Some(name) = p.name {
        schedule.name = required_text(CALL, "patch.name", name)?;
    }
    if let Some(d) = p.description {
        schedule.description = optional_text(d);
    }
    if let Some(t) = p.target {
        schedule.target = check_target(&k, &s, CALL, t).await?;
    }
    let rearm = p.expression.is_some() || p.enabled.is_some();
    if let Some(e) = p.expression {
        let zone = server_zone(&k).await?;
        schedule.expression = expr::normalize(e, "patch.expression", zone.as_deref())
            .map_err(|e| invalid(CALL, e.0))?;
    }
    if let Some(on) = p.enabled {
        schedule.enabled = on;
    }
    let now = now_ms();
    if rearm {
        schedule.state.next_run_at_ms = if schedule.enabled {
            expr::next_run(&schedule.expression, now)
                .map_err(|e| invalid(CALL, format!("patch.expression: {e}")))?
        } else {
            None
        };
    }
    schedule.updated_at_ms = now;
    let stored = schedule.clone();
    k.db.call(move |c| store::save(c, &stored)).await?;
    k.timers.poke();
    Ok(ScheduleResult { schedule })
}

pub async fn remove(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: RemoveArgs,
) -> Result<RemoveResult, KernelError> {
    let Ok(schedule) = owned(&k, &s, &a.id).await else {
        return Ok(RemoveResult { removed: false });
    };
    let removed = k.db.call(move |c| store::remove(c, &schedule.id)).await?;
    k.timers.poke();
    Ok(RemoveResult { removed })
}

pub async fn run(k: Arc<Kernel>, s: Arc<Session>, a: RunArgs) -> Result<RunResult, KernelError> {
    let mode = a.mode.unwrap_or_default();
    let ids = match (&a.id, mode) {
        (None, RunMode::Force) => {
            return Err(invalid("sched.run", "mode \"force\" requires an id"));
        }
        (Some(id), _) => vec![owned(&k, &s, id).await?.id],
        (None, RunMode::Due) => {
            let owner = (!s.identity.is_root()).then_some(s.identity.uid);
            let now = now_ms();
            k.db.call(move |c| store::due_ids(c, now, owner)).await?
        }
    };
    let mut results = Vec::with_capacity(ids.len());
    for id in ids {
        results.push(run_one(&k, &id, mode).await?);
    }
    Ok(RunResult {
        ran: results
            .iter()
            .filter(|r| r.status != RunStatus::Skipped)
            .count(),
        results,
    })
}

fn skipped(id: &str, reason: &str) -> RunOutcome {
    RunOutcome {
        schedule_id: id.to_owned(),
        status: RunStatus::Skipped,
        error: Some(reason.to_owned()),
        summary: None,
        duration_ms: 0,
        next_run_at_ms: None,
    }
}

/// Runs schedule `id` once: `due` only when enabled and due, `force`
/// regardless (and its next run stays). Its state and wake are written
/// when the target has been dispatched.
async fn run_one(k: &Arc<Kernel>, id: &str, mode: RunMode) -> Result<RunOutcome, KernelError> {
    let now = now_ms();
    let q = id.to_owned();
    let Some(before) = k.db.call(move |c| store::get(c, &q)).await? else {
        return Ok(skipped(id, "schedule was removed"));
    };
    if mode == RunMode::Due {
        if !before.enabled {
            return Ok(skipped(id, "schedule is disabled"));
        }
        if before.state.next_run_at_ms.is_none_or(|at| at > now) {
            return Ok(skipped(id, "schedule is not due"));
        }
    }
    let q = id.to_owned();
    let Some(before) = k.db.call(move |c| store::mark_running(c, &q, now)).await? else {
        return Ok(skipped(id, "schedule is already running"));
    };
    let started = now_ms();
    let dispatched = dispatch_target(k, &before).await;
    let finished = now_ms();
    let (status, error, summary) = match dispatched {
        Ok(summary) => (RunStatus::Ok, None, Some(summary)),
        Err(e) => (RunStatus::Error, Some(e), None),
    };
    tracing::info!(id, ?status, error = ?error, "schedule ran");
    let last_error = error.clone();
    let q = id.to_owned();
    let after =
        k.db.call(move |c| {
            let Some(mut s) = store::get(c, &q)? else {
                return Ok(None);
            };
            // An update while it ran already chose the next run.
            let changed = s.updated_at_ms != before.updated_at_ms;
            if mode == RunMode::Due && !changed {
                let scheduled = before.state.next_run_at_ms.unwrap_or(finished);
                if expr::is_one_shot(&s.expression) {
                    s.enabled = false;
                    s.state.next_run_at_ms = None;
                } else {
                    s.state.next_run_at_ms =
                        expr::next_run(&s.expression, finished.max(scheduled)).unwrap_or(None);
                }
            }
            s.state.running_at_ms = None;
            s.state.last_run_at_ms = Some(finished);
            s.state.last_status = Some(status);
            s.state.last_error = last_error;
            s.state.last_duration_ms = Some(finished - started);
            s.state.run_count += 1;
            store::save(c, &s)?;
            Ok(Some(s))
        })
        .await?;
    k.timers.poke();
    Ok(RunOutcome {
        schedule_id: id.to_owned(),
        status,
        error,
        summary,
        duration_ms: finished - started,
        next_run_at_ms: Some(after.and_then(|s| s.state.next_run_at_ms)),
    })
}

/// The owner's session a schedule's target runs as: the owner's account
/// and capabilities (checked again at every run), no socket of its own.
async fn owner_session(k: &Kernel, s: &ScheduleRecord) -> Result<Session, String> {
    let uid = s.owner_uid;
    let found =
        k.db.call(move |c| {
            let Some(id) = accounts::identity_by_uid(c, uid)? else {
                return Ok(None);
            };
            let caps = accounts::capabilities(c, &id.gids)?;
            Ok(Some((id, caps)))
        })
        .await
        .map_err(|e| e.to_string())?;
    let (identity, capabilities) =
        found.ok_or_else(|| format!("Cannot resolve schedule owner uid {uid}"))?;
    Ok(Session {
        connection_id: format!("schedule:{}", s.id),
        role: Role::User,
        identity,
        capabilities,
        client_id: format!("schedule:{}", s.id),
        peer: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
        device: None,
    })
}

/// Does what the schedule says, through the same gate as the owner's own
/// `proc.spawn` / `proc.send`; a one-line summary, or why it failed.
async fn dispatch_target(k: &Arc<Kernel>, s: &ScheduleRecord) -> Result<String, String> {
    let session = Arc::new(owner_session(k, s).await?);
    let (call, args) = match &s.target {
        ScheduleTarget::ProcessSpawn {
            profile,
            label,
            prompt,
            parent_pid,
            workspace,
            ..
        } => {
            let mut args = Map::new();
            args.insert(
                "profile".into(),
                json!(profile.as_deref().unwrap_or(DEFAULT_SPAWN_PROFILE)),
            );
            args.insert("label".into(), json!(label.as_deref().unwrap_or(&s.name)));
            args.insert("prompt".into(), json!(prompt));
            if let Some(p) = parent_pid {
                args.insert("parentPid".into(), json!(p));
            }
            if let Some(w) = workspace {
                args.insert("workspace".into(), w.clone());
            }
            ("proc.spawn", args)
        }
        ScheduleTarget::ProcessEvent {
            pid,
            conversation_id,
            message,
            data,
        } => {
            let p = pid.clone();
            let row =
                k.db.call(move |c| procs::get(c, &p))
                    .await
                    .map_err(|e| e.to_string())?;
            match row {
                None => return Err(format!("Process not found: {pid}")),
                Some(r) if r.owner_uid != s.owner_uid && s.owner_uid != accounts::ROOT_UID => {
                    return Err(format!(
                        "Permission denied: schedule {} cannot access process {pid}",
                        s.id
                    ));
                }
                Some(_) => {}
            }
            let mut text = message.clone();
            if let Some(d) = data {
                text.push_str("\n\n");
                text.push_str(&Value::Object(d.clone()).to_string());
            }
            let mut args = Map::new();
            args.insert("pid".into(), json!(pid));
            args.insert("message".into(), json!(text));
            if let Some(c) = conversation_id {
                args.insert("conversationId".into(), json!(c));
            }
            ("proc.send", args)
        }
    };
    let out = if call == "proc.spawn" {
        // The owner's gate, then the kernel-internal spawn: `cron` is not
        // a profile users may start themselves.
        k.dispatch.gate(&session, call).map_err(|e| e.to_string())?;
        let a: gsv_protocol::proc::SpawnArgs =
            serde_json::from_value(Value::Object(args)).map_err(|e| e.to_string())?;
        let r = crate::domains::proc::calls::spawn_internal(k.clone(), session.clone(), a)
            .await
            .map_err(|e| e.to_string())?;
        serde_json::to_value(r).map_err(|e| e.to_string())?
    } else {
        dispatch_call(k, &session, call, args)
            .await
            .map_err(|e| e.to_string())?
    };
    if out.get("ok") == Some(&Value::Bool(false)) {
        return Err(out["error"]
            .as_str()
            .map_or_else(|| out["error"].to_string(), str::to_owned));
    }
    Ok(match &s.target {
        ScheduleTarget::ProcessSpawn { profile, .. } => format!(
            "spawned process {} (profile {})",
            out["pid"].as_str().unwrap_or("?"),
            profile.as_deref().unwrap_or(DEFAULT_SPAWN_PROFILE)
        ),
        ScheduleTarget::ProcessEvent { pid, .. } => format!("delivered event to process {pid}"),
    })
}

/// A schedule's wake fired: it runs as `sched.run {id, mode:"due"}` would.
pub async fn on_timer(k: Arc<Kernel>, timer: Timer) {
    let Some(id) = store::id_of_timer(&timer.id) else {
        tracing::warn!(timer = %timer.id, "schedule timer without an id");
        return;
    };
    match run_one(&k, id, RunMode::Due).await {
        Ok(o) if o.status == RunStatus::Skipped => {
            tracing::debug!(id, reason = ?o.error, "scheduled run skipped");
        }
        Ok(_) => {}
        Err(e) => tracing::error!(id, error = %e, "scheduled run"),
    }
}

/// At start: runs a stopped kernel left dispatching end as errors (and
/// move on to their next run, so nothing is dispatched twice), and every
/// armed schedule has its wake. Schedules that fell due while the kernel
/// was down then fire from the timer task.
pub async fn recover(k: &Kernel) -> Result<(), KernelError> {
    let now = now_ms();
    let interrupted =
        k.db.call(move |c| {
            let stale = store::interrupted(c)?;
            for mut s in stale.iter().cloned() {
                let started = s.state.running_at_ms.unwrap_or(now);
                if expr::is_one_shot(&s.expression) {
                    s.enabled = false;
                    s.state.next_run_at_ms = None;
                } else if s.enabled {
                    s.state.next_run_at_ms = expr::next_run(&s.expression, now).unwrap_or(None);
                }
                s.state.running_at_ms = None;
                s.state.last_run_at_ms = Some(now);
                s.state.last_status = Some(RunStatus::Error);
                s.state.last_error = Some("the kernel stopped during this run".into());
                s.state.last_duration_ms = Some((now - started).max(0));
                s.state.run_count += 1;
                store::save(c, &s)?;
            }
            store::rearm_all(c)?;
            Ok(stale.len())
        })
        .await?;
    if interrupted > 0 {
        tracing::warn!(interrupted, "scheduled runs interrupted by a kernel stop");
    }
    Ok(())
}
