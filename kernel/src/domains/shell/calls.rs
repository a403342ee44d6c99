//! `shell.exec` on a workspace: starts a command through the workspace's
//! wsd backend ([`crate::domains::workspace::backend`]) and keeps it as a live
//! session ([`crate::domains::shell::sessions`]) between calls.
//!
//! A new command runs as a bracket under the workspace's lock: push dofs →
//! wsd (a failed push fails the call; nothing runs), then exec. A session
//! task then owns the command's event stream: it keeps the output (tail
//! capped at [`MAX_OUTPUT_CHARS`]), and when the command exits it pulls
//! wsd → dofs under the lock again, so a command's changes land even if
//! nobody polls. While it runs, the workspace follows wsd live
//! ([`super::live`]): its writes reach dofs as wsd settles them, and
//! `fs.write`s reach it. Callers wait for that outcome within a budget; a
//! command still running answers `running` with a `sessionId` to poll. A
//! lost wsd (stream broken and re-attach refused, e.g. the child
//! restarted) is a `failed` outcome, never a silent success.

use gsv_protocol::shell::{ExecArgs, ExecControl, ExecResult, FileChange};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use wsd_client::{ExecEventKind, ExecRequest, ResumeFrom, Signal, WsdError, WsdHandle};
use wsd_sync::{ErrorCode, Kind};

use crate::db::now_ms;
use crate::domains::fs::vfs::{self, Place};
use crate::domains::shell::bracket::StartError;
use crate::domains::shell::live::{LiveHold, Synced, latest_per_path};
use crate::domains::shell::sessions::{Outcome, ShellSession};
use crate::domains::watch::StoreKey;
use crate::domains::workspace::Workspace;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

// The seed's limits are defined once, with the node tools that answer the
// same call on devices: the output cap, the default timeout and how long a
// finished result waits for its poll.
pub use gsv_node::{
    COMPLETED_SESSION_RETENTION as FINISHED_SESSION_KEEP, DEFAULT_TIMEOUT_MS, MAX_OUTPUT_CHARS,
    MAX_YIELD_MS, MIN_YIELD_MS,
};
/// How long a finished session's row is kept.
const SESSION_ROW_TTL_MS: i64 = 24 * 3600 * 1000;

pub async fn exec(k: Arc<Kernel>, s: Arc<Session>, a: ExecArgs) -> Result<ExecResult, KernelError> {
    let budget = a
        .yield_ms
        .map(Duration::from_millis)
        .unwrap_or(k.config.exec_wait)
        .clamp(
            Duration::from_millis(MIN_YIELD_MS),
            Duration::from_millis(MAX_YIELD_MS),
        );
    if let Some(sid) = a
        .session_id
        .as_deref()
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        return match &a.control {
            Some(c) => control_session(&k, &s, sid, c).await,
            None => continue_session(&k, &s, sid, &a.input, budget, a.stream).await,
        };
    }
    if a.control.is_some() {
        return Ok(op_error("control needs the sessionId of a running command"));
    }
    if a.input.trim().is_empty() {
        return Ok(op_error("input must not be empty"));
    }
    let cwd = a.cwd.clone().unwrap_or_else(|| s.identity.cwd.clone());
    let r = match vfs::resolve(&cwd, &s.identity.home) {
        Ok(r) => r,
        Err(e) => return Ok(op_error(&e.to_string())),
    };
    let Place::Workspace { id, sub } = r.place else {
        return Ok(no_workspace(&r.display));
    };
    let row = k.workspaces.visible_row(&k.db, &s.identity, &id).await?;
    if row.is_archived() {
        return Ok(op_error(&format!("Workspace {id} is archived")));
    }
    let w = k.workspaces.open(&row).await?;
    let session_id = format!("sh_{}", crate::domains::accounts::random_hex(12));
    let request = ExecRequest {
        command: a.input.clone(),
        cwd: sub.map(|p| p.into_string()),
        id: Some(session_id.clone()),
        env: a.env.clone().into_iter().collect(),
        // `Some(0)` disables the timeout, as the caller's `timeout: 0`.
        timeout_ms: Some(a.timeout.unwrap_or(DEFAULT_TIMEOUT_MS)),
        stdin_open: a.open_stdin,
        stdin: None,
    };
    // The bracket's first half, under the workspace lock.
    let (handle, started) = {
        let mut backend = w.bracket.lock().await;
        let handle = match backend.handle(&k.workspaces.wsd_bin).await {
            Ok(h) => h,
            Err(e) => return Ok(failed_before_run(&e.to_string())),
        };
        match k
            .sessions
            .pushes
            .push_and_exec(&k.watches, &w, &handle, request)
            .await
        {
            Ok(started) => (handle, started),
            Err(e) => {
                let context = match e {
                    StartError::Push(_) => "push to wsd failed",
                    StartError::Exec(_) => "wsd refused the command",
                };
                return Ok(wsd_failed_before_run(context, e.wsd()));
            }
        }
    };
    let session = Arc::new(ShellSession::new(
        session_id.clone(),
        Some(handle.clone()),
        s.identity.uid,
        row.id.clone(),
    ));
    k.sessions.insert(session.clone());
    tokio::spawn(drive_session(
        k.clone(),
        w,
        session.clone(),
        (handle, started.commits, started.synced),
        started.events,
    ));
    answer(&k, &session, budget, a.stream).await
}

/// How long a command runs before the workspace follows its wsd live. wsd
/// settles a burst of writes 50 ms after it starts, so a live pull before
/// then finds nothing the end-of-command pull would not bring: a shorter
/// command is synced by its bracket alone, without a follower's long poll
/// (an `fs.write` in that time reaches it when the follower starts).
const LIVE_SYNC_AFTER: Duration = Duration::from_millis(50);

/// A hold on `w`'s live sync for a session (a command or a terminal) just
/// started on `handle`, with the store's commit feed for its pushes.
pub fn live_hold(k: &Kernel, w: &Arc<Workspace>, handle: &WsdHandle) -> LiveHold {
    let commits = match k.watches.feed(&StoreKey::Workspace(w.id.clone()), &w.dofs) {
        Ok(rx) => Some(rx),
        Err(e) => {
            tracing::warn!(workspace = %w.id, error = %e, "no commit feed: writes reach wsd at the next command");
            None
        }
    };
    k.sessions.sync.hold(w, handle, commits)
}

/// The live session `sid` of the caller; someone else's looks exactly like
/// a missing one.
fn own_live_session(k: &Kernel, s: &Session, sid: &str) -> Option<Arc<ShellSession>> {
    k.sessions
        .get(sid)
        .filter(|session| session.owner_uid == s.identity.uid && !session.is_answered())
}

async fn control_session(
    k: &Arc<Kernel>,
    s: &Session,
    sid: &str,
    c: &ExecControl,
) -> Result<ExecResult, KernelError> {
    let signal = match c.signal.as_deref().map(str::parse::<Signal>).transpose() {
        Ok(sig) => sig,
        Err(e) => return Ok(op_error(&e.message)),
    };
    let Some(session) = own_live_session(k, s, sid) else {
        return Err(KernelError::UnknownSession(sid.to_owned()));
    };
    if let Some(h) = session.handle.as_ref().filter(|_| !session.is_over()) {
        if let Some(text) = &c.stdin
            && let Err(e) = h.write_stdin(&session.id, text.as_bytes().to_vec()).await
        {
            return Ok(op_error(&format!(
                "stdin is closed for shell session: {sid} ({e})"
            )));
        }
        // The command may have exited meanwhile: closing or signalling
        // what is gone changes nothing, so those failures are not errors.
        if c.close_stdin {
            let _ = h.close_stdin(&session.id).await;
        }
        if let Some(sig) = signal {
            let _ = h.kill(&session.id, sig).await;
        }
    } else if c.stdin.is_some() {
        return Ok(op_error(&format!(
            "stdin is closed for shell session: {sid} (the command already exited)"
        )));
    }
    Ok(ExecResult {
        status: Some(session.status()),
        session_id: Some(sid.to_owned()),
        ..Default::default()
    })
}

async fn continue_session(
    k: &Arc<Kernel>,
    s: &Session,
    sid: &str,
    input: &str,
    budget: Duration,
    stream: bool,
) -> Result<ExecResult, KernelError> {
    let live = k.sessions.get(sid);
    let Some(session) = live else {
        // Not in memory: finished and already answered, expired, or from
        // before a kernel restart. The row says which, if it is ours.
        let id = sid.to_owned();
        let row: Option<(i64, String, Option<String>)> =
            k.db.call(move |c| {
                crate::db::opt(c.query_row(
                    "SELECT owner_uid, status, error FROM shell_sessions
                     WHERE session_id = ?1 AND expires_at > ?2",
                    rusqlite::params![id, now_ms()],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
                ))
            })
            .await?;
        return match row {
            Some((owner, status, error)) if owner == s.identity.uid => {
                Ok(already_over(sid, &status, error))
            }
            _ => Err(KernelError::UnknownSession(sid.to_owned())),
        };
    };
    if session.owner_uid != s.identity.uid {
        // Someone else's session looks exactly like a missing one.
        return Err(KernelError::UnknownSession(sid.to_owned()));
    }
    if let Some((status, error)) = session.answered_end() {
        // Answered, its row still being written: what the row will say.
        return Ok(already_over(sid, status, error));
    }
    if !input.is_empty() {
        let finished = session.is_over();
        let written = match (&session.handle, finished) {
            (Some(h), false) => h
                .write_stdin(&session.id, input.as_bytes().to_vec())
                .await
                .map_err(|e| (e.to_string(), Some(e.code))),
            _ => Err(("the command already exited".to_owned(), None)),
        };
        if let Err((e, code)) = written {
            return Ok(ExecResult {
                code: code.map(|c| c.as_str().to_owned()),
                ..op_error(&format!("stdin is closed for shell session: {sid} ({e})"))
            });
        }
    }
    answer(k, &session, budget, stream).await
}

/// The answer to a poll of session `sid`, which ended as `status` (its
/// row's) and was answered already.
fn already_over(sid: &str, status: &str, error: Option<String>) -> ExecResult {
    let error = match status {
        "running" => "the kernel restarted while this command ran; its result is lost".to_owned(),
        _ => error.unwrap_or_else(|| format!("session {sid} already {status} and answered")),
    };
    ExecResult {
        session_id: Some(sid.to_owned()),
        ..ExecResult::failed(error)
    }
}

/// Waits within `budget` (with `stream`, until output). A session still
/// running gets its `running` row first: the caller may poll it after a
/// kernel crash, and must learn that its result is lost. One that is over
/// is forgotten once its final row is written too (see [`drive_session`]),
/// so a poll after this answer finds the row.
async fn answer(
    k: &Arc<Kernel>,
    session: &Arc<ShellSession>,
    budget: Duration,
    stream: bool,
) -> Result<ExecResult, KernelError> {
    let (v, over) = session.wait(budget, stream).await;
    if over {
        if session.mark_answered() {
            k.sessions.remove(&session.id);
        }
    } else if session.needs_running_row()
        && let Err(e) = remember_running(k, session).await
    {
        session.running_row_failed();
        return Err(e);
    }
    Ok(v)
}

/// Follows the command to its end, pulls, and records the outcome. After
/// [`LIVE_SYNC_AFTER`] the workspace follows wsd live until then, from
/// `synced` (where the bracket's push left the workspace and the wsd the
/// command runs on) and on `commits` (dofs' commit feed, subscribed before
/// that push).
async fn drive_session(
    k: Arc<Kernel>,
    w: Arc<Workspace>,
    session: Arc<ShellSession>,
    (handle, mut commits, synced): (WsdHandle, Option<watch::Receiver<u64>>, Option<Synced>),
    mut events: wsd_client::ExecEvents,
) {
    let mut last_seq = 0u64;
    let mut reattaches = 0u32;
    let mut reattached = false;
    let mut live: Option<LiveHold> = None;
    let follow_from = tokio::time::sleep(LIVE_SYNC_AFTER);
    tokio::pin!(follow_from);
    let exit = loop {
        let next = tokio::select! {
            next = events.next() => next,
            () = &mut follow_from, if live.is_none() => {
                live = Some(k.sessions.sync.hold_from(&w, &handle, commits.take(), synced));
                continue;
            }
        };
        match next {
            Ok(Some(ev)) => {
                last_seq = ev.seq;
                reattaches = 0;
                match ev.kind {
                    ExecEventKind::Stdout(b) => session.append(&b, false),
                    ExecEventKind::Stderr(b) => session.append(&b, true),
                    ExecEventKind::Exit(code) => break Ok((code, ev.rev)),
                }
            }
            Ok(None) => {
                break Err((
                    "the wsd ended the command's events without an exit".to_owned(),
                    None,
                ));
            }
            Err(e) if e.code == ErrorCode::Timeout => {
                // The wsd stopped answering (frozen, or cut off with its
                // connection open) for the configured deadline: re-attaching
                // would only wait for it again.
                break Err((
                    format!(
                        "lost the command: the wsd at {} stopped answering ({e})",
                        handle.endpoint()
                    ),
                    Some(e.code),
                ));
            }
            Err(e) => {
                // The connection broke: the same wsd still has the log, a
                // restarted one does not (and then refuses the attach).
                reattaches += 1;
                reattached = true;
                if reattaches > 3 {
                    break Err((format!("lost the command: {e}"), Some(e.code)));
                }
                match handle
                    .attach(&session.id, ResumeFrom::After(last_seq))
                    .await
                {
                    Ok(ev) => events = ev,
                    Err(e2) => {
                        let why = match e2.code {
                            ErrorCode::Io | ErrorCode::Timeout | ErrorCode::Shutdown => {
                                "could not be reached again"
                            }
                            _ => "does not know it any more",
                        };
                        break Err((
                            format!(
                                "lost the command: the wsd at {} went away ({e}) and {why} ({e2})",
                                handle.endpoint()
                            ),
                            Some(e2.code),
                        ));
                    }
                }
            }
        }
    };
    let outcome = match exit {
        Err((error, code)) => {
            drop(live);
            Outcome::Failed {
                error,
                exit_code: None,
                code,
            }
        }
        Ok((exit_code, exit_rev)) => {
            // The bracket's second half. What live pulls applied meanwhile
            // counts as the command's changes too; every live round is
            // over or not begun, and none begins after this (the pull
            // below brings what it would).
            let _guard = w.bracket.lock().await;
            let mut applied = live
                .as_ref()
                .map(LiveHold::take_applied)
                .unwrap_or_default();
            drop(live);
            // Nothing to pull when the wsd's rev at the exit (its writes
            // settled) is one dofs had everything through before the
            // command: it wrote nothing, and nobody else did. Said by the
            // same wsd on the same connection (no re-attach), or not used.
            let unchanged =
                !reattached && exit_rev > 0 && synced.is_some_and(|s| exit_rev <= s.wsd_rev);
            let pulled = if unchanged {
                Ok(Vec::new())
            } else {
                handle.pull(w.dofs.clone()).await.map(|r| r.applied)
            };
            match pulled {
                Ok(pulled) => {
                    applied.extend(pulled);
                    let changes = latest_per_path(applied)
                        .iter()
                        .map(|e| FileChange {
                            path: format!("/workspaces/{}/{}", w.id, e.path),
                            kind: match e.kind {
                                None => "deleted",
                                Some(Kind::File) => "file",
                                Some(Kind::Dir) => "dir",
                                Some(Kind::Symlink) => "symlink",
                            }
                            .to_owned(),
                            size: e.size,
                        })
                        .collect();
                    Outcome::Completed { exit_code, changes }
                }
                Err(e) => Outcome::Failed {
                    error: format!(
                        "the command exited {exit_code} but pulling its changes failed: {e}"
                    ),
                    exit_code: Some(exit_code),
                    code: Some(e.code),
                },
            }
        }
    };
    let (status, code, error) = match &outcome {
        Outcome::Completed { exit_code, .. } => ("completed", Some(*exit_code), None),
        Outcome::Failed {
            error, exit_code, ..
        } => ("failed", *exit_code, Some(error.clone())),
    };
    tracing::info!(session = %session.id, workspace = %session.workspace_id, status, "command finished");
    // The answer goes out now; the row is written beside it, and the
    // session stays in memory until both are done (`answer`).
    session.finish(outcome);
    if let Err(e) = remember_end(&k, &session, status, code, error).await {
        tracing::warn!(session = %session.id, error = %e, "could not record a session's end");
    }
    if session.mark_row_final() {
        k.sessions.remove(&session.id);
    }
    // After the answer: a wsd that went away would hold it for a deadline.
    let _ = handle.dispose(&session.id).await;
    // A result nobody polls for is dropped after a while (its row stays).
    let weak = Arc::downgrade(&k);
    drop(k);
    tokio::time::sleep(FINISHED_SESSION_KEEP).await;
    if let Some(k) = weak.upgrade() {
        k.sessions.remove(&session.id);
    }
}

/// Records that the session is running, unless its end is recorded
/// already (the command ended while this answer was on its way).
async fn remember_running(k: &Arc<Kernel>, session: &ShellSession) -> Result<(), KernelError> {
    let (id, ws, owner) = (
        session.id.clone(),
        session.workspace_id.clone(),
        session.owner_uid,
    );
    k.db.call(move |c| {
        let now = now_ms();
        c.prepare_cached(
            "INSERT INTO shell_sessions(session_id, workspace_id, owner_uid, exec_id, status,
                created_at, updated_at, expires_at)
             VALUES (?1, ?2, ?3, ?1, 'running', ?4, ?4, ?5)
             ON CONFLICT(session_id) DO NOTHING",
        )?
        .execute(rusqlite::params![
            id,
            ws,
            owner,
            now,
            now + SESSION_ROW_TTL_MS
        ])?;
        Ok(())
    })
    .await
}

/// Upserts the session's final row, and prunes expired rows now and then
/// ([`crate::domains::shell::sessions::Sessions::prune_due`]).
async fn remember_end(
    k: &Arc<Kernel>,
    session: &ShellSession,
    status: &'static str,
    exit_code: Option<i32>,
    error: Option<String>,
) -> Result<(), KernelError> {
    let (id, ws, owner) = (
        session.id.clone(),
        session.workspace_id.clone(),
        session.owner_uid,
    );
    let now = now_ms();
    let prune = k.sessions.prune_due(now);
    k.db.call(move |c| {
        if prune {
            c.prepare_cached("DELETE FROM shell_sessions WHERE expires_at <= ?1")?
                .execute([now])?;
        }
        c.prepare_cached(
            "INSERT INTO shell_sessions(session_id, workspace_id, owner_uid, exec_id, status,
                exit_code, error, created_at, updated_at, expires_at)
             VALUES (?1, ?2, ?3, ?1, ?4, ?5, ?6, ?7, ?7, ?8)
             ON CONFLICT(session_id) DO UPDATE SET status = excluded.status,
                exit_code = excluded.exit_code, error = excluded.error,
                updated_at = excluded.updated_at, expires_at = excluded.expires_at",
        )?
        .execute(rusqlite::params![
            id,
            ws,
            owner,
            status,
            exit_code,
            error,
            now,
            now + SESSION_ROW_TTL_MS
        ])?;
        Ok(())
    })
    .await
}

fn op_error(message: &str) -> ExecResult {
    ExecResult::refused(message)
}

/// A new command whose cwd is not in a workspace (the reference CLI's
/// `gsv shell` sends none, so it lands in the caller's home). The
/// reference runs such a command in its own in-worker shell; this kernel
/// runs commands only through a workspace's wsd or on a device, so it
/// answers in the shape of a command that failed before it ran: still an
/// operation error (`ok:false, error`) for API callers, and the message on
/// `stderr`, the field the reference CLI prints, so a `gsv shell` user
/// reads why and what to do instead of nothing.
fn no_workspace(cwd: &str) -> ExecResult {
    let error = format!(
        "shell.exec runs in a workspace or on a device: give a cwd under /workspaces/<id> \
         or a target device (cwd was {cwd})"
    );
    ExecResult {
        ok: Some(false),
        stdout: Some(String::new()),
        stderr: Some(format!("{error}\n")),
        ..ExecResult::failed(error)
    }
}

fn failed_before_run(error: &str) -> ExecResult {
    ExecResult::failed(error)
}

/// A wsd call that failed before the command ran: its code goes to the
/// caller as `code`, not only inside the message.
fn wsd_failed_before_run(context: &str, e: &WsdError) -> ExecResult {
    ExecResult {
        code: Some(e.code.as_str().to_owned()),
        ..ExecResult::failed(format!("{context}: {e}"))
    }
}
