//! `shell.exec` on a workspace: starts a command through the workspace's
//! wsd backend ([`crate::domains::workspace::backend`]) and keeps it as a live
//! session ([`crate::domains::shell::sessions`]) between calls.
//!
//! A new command runs as a bracket under the workspace's lock: push dofs →
//! wsd (a failed push fails the call; nothing runs), then exec. A session
//! task then owns the command's event stream: it keeps the output (tail
//! capped at [`MAX_OUTPUT_CHARS`]), and when the command exits it pulls
//! wsd → dofs under the lock again, so a command's changes land even if
//! nobody polls. Callers wait for that outcome within a budget; a command
//! still running answers `running` with a `sessionId` to poll. A lost wsd
//! (stream broken and re-attach refused, e.g. the child restarted) is a
//! `failed` outcome, never a silent success.

use gsv_protocol::shell::{ExecArgs, ExecControl, ExecResult, FileChange};
use std::sync::Arc;
use std::time::Duration;

use wsd_client::{ExecEventKind, ExecRequest, ResumeFrom, Signal, WsdError, WsdHandle};
use wsd_sync::{ErrorCode, Kind};

use crate::db::now_ms;
use crate::domains::fs::vfs::{self, Place};
use crate::domains::shell::sessions::{Outcome, ShellSession};
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
    let row = crate::domains::workspace::visible_row(&k.db, &s.identity, &id).await?;
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
    let started = {
        let mut backend = w.bracket.lock().await;
        let handle = match backend.handle(&k.workspaces.wsd_bin).await {
            Ok(h) => h,
            Err(e) => return Ok(failed_before_run(&e.to_string())),
        };
        if let Err(e) = handle.push(w.dofs.clone()).await {
            return Ok(wsd_failed_before_run("push to wsd failed", &e));
        }
        match handle.exec(request).await {
            Ok(events) => (handle, events),
            Err(e) => return Ok(wsd_failed_before_run("wsd refused the command", &e)),
        }
    };
    let session = Arc::new(ShellSession::new(
        session_id.clone(),
        Some(started.0.clone()),
        s.identity.uid,
        row.id.clone(),
    ));
    k.sessions.insert(session.clone());
    remember_row(&k, &session, "running", None, None).await?;
    tokio::spawn(drive_session(
        k.clone(),
        w,
        session.clone(),
        started.0,
        started.1,
    ));
    Ok(answer(&k, &session, budget, a.stream).await)
}

/// The live session `sid` of the caller; someone else's looks exactly like
/// a missing one.
fn own_live_session(k: &Kernel, s: &Session, sid: &str) -> Option<Arc<ShellSession>> {
    k.sessions
        .get(sid)
        .filter(|session| session.owner_uid == s.identity.uid)
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
                let error = match status.as_str() {
                    "running" => {
                        "the kernel restarted while this command ran; its result is lost".to_owned()
                    }
                    _ => error
                        .unwrap_or_else(|| format!("session {sid} already {status} and answered")),
                };
                Ok(ExecResult {
                    session_id: Some(sid.to_owned()),
                    ..ExecResult::failed(error)
                })
            }
            _ => Err(KernelError::UnknownSession(sid.to_owned())),
        };
    };
    if session.owner_uid != s.identity.uid {
        // Someone else's session looks exactly like a missing one.
        return Err(KernelError::UnknownSession(sid.to_owned()));
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
    Ok(answer(k, &session, budget, stream).await)
}

/// Waits within `budget` (with `stream`, until output) and, when the
/// session is over, forgets it.
async fn answer(
    k: &Arc<Kernel>,
    session: &Arc<ShellSession>,
    budget: Duration,
    stream: bool,
) -> ExecResult {
    let (v, over) = session.wait(budget, stream).await;
    if over {
        k.sessions.remove(&session.id);
    }
    v
}

/// Follows the command to its end, pulls, and records the outcome.
async fn drive_session(
    k: Arc<Kernel>,
    w: Arc<Workspace>,
    session: Arc<ShellSession>,
    handle: WsdHandle,
    mut events: wsd_client::ExecEvents,
) {
    let mut last_seq = 0u64;
    let mut reattaches = 0u32;
    let exit = loop {
        match events.next().await {
            Ok(Some(ev)) => {
                last_seq = ev.seq;
                reattaches = 0;
                match ev.kind {
                    ExecEventKind::Stdout(b) => session.append(&b, false),
                    ExecEventKind::Stderr(b) => session.append(&b, true),
                    ExecEventKind::Exit(code) => break Ok(code),
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
        Err((error, code)) => Outcome::Failed {
            error,
            exit_code: None,
            code,
        },
        Ok(exit_code) => {
            // The bracket's second half.
            let _guard = w.bracket.lock().await;
            match handle.pull(w.dofs.clone()).await {
                Ok(report) => {
                    let changes = report
                        .applied
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
    if let Err(e) = remember_row(&k, &session, status, code, error).await {
        tracing::warn!(session = %session.id, error = %e, "could not record a session's end");
    }
    tracing::info!(session = %session.id, workspace = %session.workspace_id, status, "command finished");
    session.finish(outcome);
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

/// Upserts the session's row and prunes expired rows.
async fn remember_row(
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
    k.db.call(move |c| {
        let now = now_ms();
        c.execute("DELETE FROM shell_sessions WHERE expires_at <= ?1", [now])?;
        c.execute(
            "INSERT INTO shell_sessions(session_id, workspace_id, owner_uid, exec_id, status,
                exit_code, error, created_at, updated_at, expires_at)
             VALUES (?1, ?2, ?3, ?1, ?4, ?5, ?6, ?7, ?7, ?8)
             ON CONFLICT(session_id) DO UPDATE SET status = excluded.status,
                exit_code = excluded.exit_code, error = excluded.error,
                updated_at = excluded.updated_at, expires_at = excluded.expires_at",
            rusqlite::params![
                id,
                ws,
                owner,
                status,
                exit_code,
                error,
                now,
                now + SESSION_ROW_TTL_MS
            ],
        )?;
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
