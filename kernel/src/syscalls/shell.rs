//! `shell.exec` on a workspace, and the workspace's wsd backend.
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

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Notify;
use wsd_client::{ClientOptions, Endpoint, ExecEventKind, ExecRequest, ResumeFrom, WsdHandle};
use wsd_sync::Kind;

use crate::db::now_ms;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::output::{CappedText, Utf8Stream};
use crate::session::Session;
use crate::vfs::{self, Place};
use crate::workspace::{Backend, Workspace};

// The seed's limits are defined once, with the node tools that answer the
// same call on devices: the output cap, the default timeout and how long a
// finished result waits for its poll.
pub use crate::node::{
    COMPLETED_SESSION_RETENTION as FINISHED_SESSION_KEEP, DEFAULT_TIMEOUT_MS, MAX_OUTPUT_CHARS,
    MAX_YIELD_MS, MIN_YIELD_MS,
};
/// How long a finished session's row is kept.
const SESSION_ROW_TTL_MS: i64 = 24 * 3600 * 1000;
/// The name the kernel's watermarks are kept under in every wsd.
const WSD_PEER: &str = "gsv-kernel";

/// How long a starting local wsd gets to open its socket.
const WSD_START_DEADLINE: Duration = Duration::from_secs(10);
/// Longest wait between restarts of a local wsd that keeps dying.
const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(5);

/// A workspace's wsd backend, owned under the workspace's bracket lock.
#[derive(Debug)]
pub struct BackendState {
    dir: PathBuf,
    backend: Backend,
    child: Option<tokio::process::Child>,
    /// The connection to the wsd, made after the child (re)starts.
    handle: Option<WsdHandle>,
    /// Last time a bracket used the wsd (the idle reaper reads it).
    last_used: Instant,
    /// Consecutive starts that did not stay up; drives the backoff.
    restarts: u32,
    last_start: Option<Instant>,
}

/// Where to reach a running wsd.
#[derive(Debug, Clone)]
pub struct WsdAddress {
    /// `unix:/path` or `host:port`.
    pub endpoint: String,
    pub token_file: PathBuf,
    /// True when the local child was (re)started by this call.
    pub started: bool,
}

impl BackendState {
    pub fn new(dir: &Path, backend: Backend) -> BackendState {
        BackendState {
            dir: dir.to_owned(),
            backend,
            child: None,
            handle: None,
            last_used: Instant::now(),
            restarts: 0,
            last_start: None,
        }
    }

    /// The local child's socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("wsd.sock")
    }

    /// The process id of the local child, if running.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(|c| c.id())
    }

    /// The address of the wsd, starting (or restarting) the local child if
    /// it is not running.
    pub async fn ensure_running(&mut self, wsd_bin: &Path) -> Result<WsdAddress, KernelError> {
        match &self.backend {
            Backend::Remote {
                address,
                token_file,
            } => Ok(WsdAddress {
                endpoint: address.clone(),
                token_file: token_file.clone(),
                started: false,
            }),
            Backend::Local => {
                let alive = match self.child.as_mut() {
                    Some(c) => matches!(c.try_wait(), Ok(None)),
                    None => false,
                };
                let token_file = self.dir.join("wsd.token");
                let endpoint = format!("unix:{}", self.socket_path().display());
                if alive {
                    return Ok(WsdAddress {
                        endpoint,
                        token_file,
                        started: false,
                    });
                }
                self.start(wsd_bin, &token_file).await?;
                Ok(WsdAddress {
                    endpoint,
                    token_file,
                    started: true,
                })
            }
        }
    }

    async fn start(&mut self, wsd_bin: &Path, token_file: &Path) -> Result<(), KernelError> {
        if let Some(prev) = self.last_start
            && prev.elapsed() < Duration::from_secs(30)
        {
            self.restarts += 1;
            let backoff =
                Duration::from_millis(100u64 << self.restarts.min(6)).min(MAX_RESTART_BACKOFF);
            tracing::warn!(dir = %self.dir.display(), restarts = self.restarts, ?backoff, "local wsd died; restarting");
            tokio::time::sleep(backoff).await;
        } else {
            self.restarts = 0;
        }
        let dir = self.dir.clone();
        let tf = token_file.to_owned();
        tokio::task::spawn_blocking(move || write_token_file(&dir, &tf))
            .await
            .map_err(|e| KernelError::internal("writing a wsd token", e))??;
        let sock = self.socket_path();
        stop_stale_child(&self.dir.join("wsd.pid"), &sock).await;
        let _ = std::fs::remove_file(&sock);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("wsd.log"))
            .map_err(|e| KernelError::internal("opening wsd.log", e))?;
        let child = tokio::process::Command::new(wsd_bin)
            .arg("serve")
            .arg("--root")
            .arg(self.dir.join("root"))
            .arg("--state")
            .arg(self.dir.join("state"))
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--token-file")
            .arg(token_file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| {
                KernelError::Unavailable(format!("cannot start {}: {e}", wsd_bin.display()))
            })?;
        if let Some(pid) = child.id()
            && let Err(e) = std::fs::write(self.dir.join("wsd.pid"), pid.to_string())
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot record the wsd pid");
        }
        self.child = Some(child);
        self.last_start = Some(Instant::now());
        let deadline = Instant::now() + WSD_START_DEADLINE;
        loop {
            if tokio::net::UnixStream::connect(&sock).await.is_ok() {
                tracing::info!(dir = %self.dir.display(), "local wsd started");
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(KernelError::Unavailable(format!(
                    "wsd for {} exited at start ({status}); see {}",
                    self.dir.display(),
                    self.dir.join("wsd.log").display()
                )));
            }
            if Instant::now() > deadline {
                self.stop().await;
                return Err(KernelError::Unavailable(format!(
                    "wsd for {} did not open {} within {WSD_START_DEADLINE:?}",
                    self.dir.display(),
                    sock.display()
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A connected handle, (re)starting the local child and reconnecting
    /// when it is not running.
    pub async fn handle(&mut self, wsd_bin: &Path) -> Result<WsdHandle, KernelError> {
        self.last_used = Instant::now();
        let addr = self.ensure_running(wsd_bin).await?;
        if addr.started {
            self.handle = None;
        }
        if let Some(h) = &self.handle {
            return Ok(h.clone());
        }
        let token = tokio::fs::read(&addr.token_file).await.map_err(|e| {
            KernelError::Unavailable(format!(
                "reading the wsd token {}: {e}",
                addr.token_file.display()
            ))
        })?;
        let endpoint = Endpoint::from_str(&addr.endpoint).map_err(|e| {
            KernelError::Unavailable(format!("bad wsd address {}: {e}", addr.endpoint))
        })?;
        let opts = ClientOptions {
            token: Some(token.trim_ascii().to_vec()),
            peer: WSD_PEER.to_owned(),
            ..ClientOptions::default()
        };
        let h = WsdHandle::connect(endpoint, opts).await.map_err(|e| {
            KernelError::Unavailable(format!("connecting to wsd at {}: {e}", addr.endpoint))
        })?;
        self.handle = Some(h.clone());
        Ok(h)
    }

    /// Whether a local child runs and has been unused for `idle`.
    pub fn idle_child(&mut self, idle: Duration) -> bool {
        let alive = self
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        alive && self.last_used.elapsed() >= idle
    }

    /// Stops the local child, if any.
    pub async fn stop(&mut self) {
        self.handle = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
        }
    }
}

/// Stops a wsd left running for this workspace by a kernel that died
/// without stopping it (SIGKILL, crash): the pid recorded at its start,
/// only if that process still serves this workspace's socket (a recycled
/// pid belongs to someone else and is left alone).
async fn stop_stale_child(pid_file: &Path, sock: &Path) {
    let Some(pid) = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())
    else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let want = format!("unix:{}", sock.display());
    let ours = cmdline.split(|b| *b == 0).any(|arg| arg == want.as_bytes());
    let (true, Some(p)) = (ours, rustix::process::Pid::from_raw(pid)) else {
        return;
    };
    tracing::warn!(pid, socket = %sock.display(), "stopping a wsd left over from an earlier kernel");
    // It holds the workspace's lock until it has exited, and a new child
    // refuses to start beside it: wait for the exit (SIGKILL after a grace).
    let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
    let start = Instant::now();
    let mut killed = false;
    while process_alive(pid) {
        if !killed && start.elapsed() > STALE_WSD_GRACE {
            tracing::warn!(pid, "the leftover wsd ignored SIGTERM; sending SIGKILL");
            let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
            killed = true;
        }
        if start.elapsed() > 2 * STALE_WSD_GRACE {
            tracing::warn!(pid, "the leftover wsd is still there; starting anyway");
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a leftover wsd gets to exit after SIGTERM before SIGKILL.
const STALE_WSD_GRACE: Duration = Duration::from_secs(5);

/// Whether `pid` names a process that has not exited (a zombie has).
fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Creates the token file (mode 0600) once; an existing one is kept so a
/// restarted child accepts the same token.
fn write_token_file(dir: &Path, path: &Path) -> Result<(), KernelError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).map_err(|e| KernelError::internal("workspace dir", e))?;
    if path.exists() {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| KernelError::internal(&format!("creating {}", path.display()), e))?;
    f.write_all(crate::accounts::random_hex(32).as_bytes())
        .map_err(|e| KernelError::internal(&format!("writing {}", path.display()), e))
}

/// How a command ended.
#[derive(Debug, Clone)]
enum Outcome {
    Completed {
        exit_code: i32,
        changes: Vec<Value>,
    },
    Failed {
        error: String,
        exit_code: Option<i32>,
    },
}

#[derive(Debug)]
struct SessionState {
    /// Everything (its last [`MAX_OUTPUT_CHARS`]), returned with the final
    /// result.
    output: CappedText,
    /// What no `running` answer has returned yet.
    pending: CappedText,
    utf8: Utf8Stream,
    outcome: Option<Outcome>,
}

impl Default for SessionState {
    fn default() -> Self {
        SessionState {
            output: CappedText::new(MAX_OUTPUT_CHARS),
            pending: CappedText::new(MAX_OUTPUT_CHARS),
            utf8: Utf8Stream::default(),
            outcome: None,
        }
    }
}

/// One running (or just finished) command.
#[derive(Debug)]
pub struct ShellSession {
    pub id: String,
    /// The wsd connection the command runs on (for stdin writes).
    handle: Option<WsdHandle>,
    pub owner_uid: i64,
    pub workspace_id: String,
    state: Mutex<SessionState>,
    changed: Notify,
}

impl ShellSession {
    fn append(&self, bytes: &[u8]) {
        let mut st = self.state.lock().unwrap();
        let text = st.utf8.decode(bytes);
        st.output.push(&text);
        st.pending.push(&text);
        drop(st);
        self.changed.notify_waiters();
    }

    fn finish(&self, outcome: Outcome) {
        let mut st = self.state.lock().unwrap();
        let rest = st.utf8.finish();
        st.output.push(&rest);
        st.outcome = Some(outcome);
        drop(st);
        self.changed.notify_waiters();
    }

    /// Waits until the command ends or `budget` passes, then answers.
    /// Returns the result and whether the session is over.
    async fn wait(&self, budget: Duration) -> (Value, bool) {
        let deadline = tokio::time::Instant::now() + budget;
        loop {
            let notified = self.changed.notified();
            {
                let mut st = self.state.lock().unwrap();
                if let Some(outcome) = st.outcome.clone() {
                    let (output, truncated) = st.output.take_flagged();
                    return (self.final_result(outcome, output, truncated), true);
                }
                if tokio::time::Instant::now() >= deadline {
                    let (output, truncated) = st.pending.take_flagged();
                    let mut v =
                        json!({"status": "running", "sessionId": self.id, "output": output});
                    if truncated {
                        v["truncated"] = json!(true);
                    }
                    return (v, false);
                }
            }
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }

    fn final_result(&self, outcome: Outcome, output: String, truncated: bool) -> Value {
        let mut v = match outcome {
            Outcome::Completed { exit_code, changes } => json!({
                "status": "completed",
                "exitCode": exit_code,
                "output": output,
                "sessionId": self.id,
                "changes": changes,
            }),
            Outcome::Failed { error, exit_code } => {
                let mut v = json!({
                    "status": "failed",
                    "output": output,
                    "error": error,
                    "sessionId": self.id,
                });
                if let Some(c) = exit_code {
                    v["exitCode"] = json!(c);
                }
                v
            }
        };
        if truncated {
            v["truncated"] = json!(true);
        }
        v
    }
}

/// Live shell sessions by id (their rows are in `shell_sessions`).
#[derive(Debug, Default)]
pub struct Sessions {
    live: Mutex<HashMap<String, Arc<ShellSession>>>,
}

impl Sessions {
    /// Whether a command still runs in workspace `id`.
    pub fn running_in(&self, id: &str) -> bool {
        self.live
            .lock()
            .unwrap()
            .values()
            .any(|s| s.workspace_id == id && s.state.lock().unwrap().outcome.is_none())
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecArgs {
    cwd: Option<String>,
    #[serde(default)]
    input: String,
    session_id: Option<String>,
    /// Milliseconds; 0 disables the timeout.
    timeout: Option<u64>,
    /// How long to wait for the command before answering `running`.
    yield_ms: Option<u64>,
}

pub async fn exec(k: Arc<Kernel>, s: Arc<Session>, a: ExecArgs) -> Result<Value, KernelError> {
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
        return continue_session(&k, &s, sid, &a.input, budget).await;
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
        return Ok(op_error(&format!(
            "shell.exec runs in a workspace: give a cwd under /workspaces/<id> (got {})",
            r.display
        )));
    };
    let row = crate::syscalls::workspace::visible_row(&k, &s, &id).await?;
    if row.is_archived() {
        return Ok(op_error(&format!("Workspace {id} is archived")));
    }
    let w = k.workspaces.open(&row).await?;
    let session_id = format!("sh_{}", crate::accounts::random_hex(12));
    let request = ExecRequest {
        command: a.input.clone(),
        cwd: sub.map(|p| p.into_string()),
        id: Some(session_id.clone()),
        // `Some(0)` disables the timeout, as the caller's `timeout: 0`.
        timeout_ms: Some(a.timeout.unwrap_or(DEFAULT_TIMEOUT_MS)),
        // Kept open so later calls with the sessionId can write to it.
        stdin_open: true,
        ..ExecRequest::default()
    };
    // The bracket's first half, under the workspace lock.
    let started = {
        let mut backend = w.bracket.lock().await;
        let handle = match backend.handle(&k.workspaces.wsd_bin).await {
            Ok(h) => h,
            Err(e) => return Ok(failed_before_run(&e.to_string())),
        };
        if let Err(e) = handle.push(w.dofs.clone()).await {
            return Ok(failed_before_run(&format!("push to wsd failed: {e}")));
        }
        match handle.exec(request).await {
            Ok(events) => (handle, events),
            Err(e) => return Ok(failed_before_run(&format!("wsd refused the command: {e}"))),
        }
    };
    let session = Arc::new(ShellSession {
        id: session_id.clone(),
        handle: Some(started.0.clone()),
        owner_uid: s.identity.uid,
        workspace_id: row.id.clone(),
        state: Mutex::default(),
        changed: Notify::new(),
    });
    k.sessions
        .live
        .lock()
        .unwrap()
        .insert(session_id.clone(), session.clone());
    remember_row(&k, &session, "running", None, None).await?;
    tokio::spawn(drive_session(
        k.clone(),
        w,
        session.clone(),
        started.0,
        started.1,
    ));
    Ok(answer(&k, &session, budget).await)
}

async fn continue_session(
    k: &Arc<Kernel>,
    s: &Session,
    sid: &str,
    input: &str,
    budget: Duration,
) -> Result<Value, KernelError> {
    let live = k.sessions.live.lock().unwrap().get(sid).cloned();
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
                Ok(json!({"status": "failed", "output": "", "error": error, "sessionId": sid}))
            }
            _ => Err(KernelError::UnknownSession(sid.to_owned())),
        };
    };
    if session.owner_uid != s.identity.uid {
        // Someone else's session looks exactly like a missing one.
        return Err(KernelError::UnknownSession(sid.to_owned()));
    }
    if !input.is_empty() {
        let finished = session.state.lock().unwrap().outcome.is_some();
        let written = match (&session.handle, finished) {
            (Some(h), false) => h
                .write_stdin(&session.id, input.as_bytes().to_vec())
                .await
                .map_err(|e| e.to_string()),
            _ => Err("the command already exited".to_owned()),
        };
        if let Err(e) = written {
            return Ok(op_error(&format!(
                "stdin is closed for shell session: {sid} ({e})"
            )));
        }
    }
    Ok(answer(k, &session, budget).await)
}

/// Waits within `budget` and, when the session is over, forgets it.
async fn answer(k: &Arc<Kernel>, session: &Arc<ShellSession>, budget: Duration) -> Value {
    let (v, over) = session.wait(budget).await;
    if over {
        k.sessions.live.lock().unwrap().remove(&session.id);
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
                    ExecEventKind::Stdout(b) | ExecEventKind::Stderr(b) => session.append(&b),
                    ExecEventKind::Exit(code) => break Ok(code),
                }
            }
            Ok(None) => break Err("the wsd ended the command's events without an exit".to_owned()),
            Err(e) => {
                // The connection broke: the same wsd still has the log, a
                // restarted one does not (and then refuses the attach).
                reattaches += 1;
                if reattaches > 3 {
                    break Err(format!("lost the command: {e}"));
                }
                match handle
                    .attach(&session.id, ResumeFrom::After(last_seq))
                    .await
                {
                    Ok(ev) => events = ev,
                    Err(e2) => {
                        break Err(format!(
                            "lost the command: the wsd went away ({e}) and does not know it any more ({e2})"
                        ));
                    }
                }
            }
        }
    };
    let outcome = match exit {
        Err(error) => Outcome::Failed {
            error,
            exit_code: None,
        },
        Ok(exit_code) => {
            // The bracket's second half.
            let _guard = w.bracket.lock().await;
            match handle.pull(w.dofs.clone()).await {
                Ok(report) => {
                    let changes = report
                        .applied
                        .iter()
                        .map(|e| {
                            json!({
                                "path": format!("/workspaces/{}/{}", w.id, e.path),
                                "kind": match e.kind {
                                    None => "deleted",
                                    Some(Kind::File) => "file",
                                    Some(Kind::Dir) => "dir",
                                    Some(Kind::Symlink) => "symlink",
                                },
                                "size": e.size,
                            })
                        })
                        .collect();
                    Outcome::Completed { exit_code, changes }
                }
                Err(e) => Outcome::Failed {
                    error: format!(
                        "the command exited {exit_code} but pulling its changes failed: {e}"
                    ),
                    exit_code: Some(exit_code),
                },
            }
        }
    };
    let _ = handle.dispose(&session.id).await;
    let (status, code, error) = match &outcome {
        Outcome::Completed { exit_code, .. } => ("completed", Some(*exit_code), None),
        Outcome::Failed { error, exit_code } => ("failed", *exit_code, Some(error.clone())),
    };
    if let Err(e) = remember_row(&k, &session, status, code, error).await {
        tracing::warn!(session = %session.id, error = %e, "could not record a session's end");
    }
    tracing::info!(session = %session.id, workspace = %session.workspace_id, status, "command finished");
    session.finish(outcome);
    // A result nobody polls for is dropped after a while (its row stays).
    let weak = Arc::downgrade(&k);
    drop(k);
    tokio::time::sleep(FINISHED_SESSION_KEEP).await;
    if let Some(k) = weak.upgrade() {
        k.sessions.live.lock().unwrap().remove(&session.id);
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

fn op_error(message: &str) -> Value {
    json!({"ok": false, "error": message})
}

fn failed_before_run(error: &str) -> Value {
    json!({"status": "failed", "output": "", "error": error})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session() -> ShellSession {
        ShellSession {
            id: "sh_t".into(),
            handle: None,
            owner_uid: 1000,
            workspace_id: "ws_t".into(),
            state: Mutex::default(),
            changed: Notify::new(),
        }
    }

    #[test]
    fn a_character_split_across_events_is_joined_not_mangled() {
        let s = session();
        let bytes = "né".as_bytes();
        s.append(&bytes[..2]);
        s.append(&bytes[2..]);
        let st = s.state.lock().unwrap();
        assert_eq!(st.output.text(), "né");
    }

    #[tokio::test]
    async fn waiting_answers_running_with_pending_output_then_the_final_result() {
        let s = session();
        s.append(b"first ");
        let (v, over) = s.wait(Duration::from_millis(10)).await;
        assert!(!over);
        assert_eq!(
            v,
            json!({"status": "running", "sessionId": "sh_t", "output": "first "})
        );
        s.append(b"second");
        s.finish(Outcome::Completed {
            exit_code: 0,
            changes: vec![],
        });
        let (v, over) = s.wait(Duration::from_secs(5)).await;
        assert!(over);
        assert_eq!(v["status"], "completed");
        assert_eq!(
            v["output"], "first second",
            "the final result carries all output"
        );
    }
}
