//! `shell.exec` on the node: commands run by the login shell in their own
//! process group, waited on for a bounded "yield" window, and kept as
//! background sessions when they outlive it.
//!
//! A session's process is owned by one waiter task, which also enforces
//! the timeout (SIGTERM to the group, SIGKILL to the group
//! [`KILL_GRACE_MS`] later) and drops the session [`ShellConfig::retention`]
//! after exit if nobody collected the result. Requests only read the
//! shared [`SessionState`], write stdin, or signal the group.

use std::collections::{HashMap, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::output::{CappedText, Utf8Stream, last_chars};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStdin;
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

use super::{NodeRoot, OpError};

/// Each of `output`, `stdout`, `stderr` and the not-yet-returned part keeps
/// only its last this-many characters.
pub const MAX_OUTPUT_CHARS: usize = 200_000;
/// `tail` is the last this-many characters of `output`.
pub const TAIL_CHARS: usize = 4_000;
/// A command's timeout when the call gives none (`timeout: 0` disables it).
pub const DEFAULT_TIMEOUT_MS: u64 = 300_000;
/// How long a call waits for the command before answering `running`.
pub const DEFAULT_YIELD_MS: u64 = 5_000;
/// `yieldMs` is clamped into this range.
pub const MIN_YIELD_MS: u64 = 250;
pub const MAX_YIELD_MS: u64 = 30_000;
/// Between SIGTERM and SIGKILL to a timed-out command's process group.
pub const KILL_GRACE_MS: u64 = 250;
/// Finished sessions nobody collected are dropped this long after exit.
pub const COMPLETED_SESSION_RETENTION: Duration = Duration::from_secs(10 * 60);
/// The exec-event outbox holds at most this many events (oldest dropped).
pub const EXEC_EVENT_OUTBOX_CAP: usize = 2048;
/// How many commands may run at once by default.
pub const MAX_RUNNING_SESSIONS: usize = 256;
/// `log` returns this many lines when the call gives no `limit`.
pub const DEFAULT_LOG_LIMIT: usize = 200;
/// After the shell exits, how long its output pipes may take to drain; a
/// grandchild that left the group and kept the pipe open is not waited on.
const OUTPUT_DRAIN_GRACE: Duration = Duration::from_millis(500);
/// `kill` waits this long for the process to be reaped before answering.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Tunables of the shell tool.
#[derive(Debug, Clone)]
pub struct ShellConfig {
    /// How long a finished, uncollected session is kept.
    pub retention: Duration,
    /// The shell; `None`: `$SHELL` when it names an absolute executable
    /// file, else `/bin/sh` (the reference's choice).
    pub shell: Option<PathBuf>,
    /// Run it as a login shell (`-lc`, the reference's choice) rather than
    /// `-c`. A login shell reads the user's profile, so commands see the
    /// environment an interactive user would, at the price of the profile's
    /// start-up time on every command (about 250 ms for a typical bash).
    pub login: bool,
    /// At most this many commands run at once; more are refused until one
    /// ends (a node must not be exhausted by a caller starting background
    /// commands in a loop).
    pub max_running: usize,
}

impl Default for ShellConfig {
    fn default() -> Self {
        Self {
            retention: COMPLETED_SESSION_RETENTION,
            shell: None,
            login: true,
            max_running: MAX_RUNNING_SESSIONS,
        }
    }
}

/// What a continuation does with its session. Without `action`, a
/// non-empty `input` is written to stdin and an empty one polls.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ShellAction {
    Poll,
    Log,
    Write,
    Submit,
    Kill,
    List,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ShellArgs {
    /// `command` is the older tools' name.
    #[serde(default, alias = "command")]
    input: String,
    /// `workdir` is the older tools' name.
    #[serde(default, alias = "workdir")]
    cwd: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    yield_ms: Option<u64>,
    #[serde(default)]
    action: Option<ShellAction>,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

/// The kind of an `exec.status` event.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ExecEventKind {
    Started,
    Finished,
    Failed,
    TimedOut,
}

/// The payload of an `exec.status` signal (the reference's
/// `DeviceExecEventParams`), emitted only for backgrounded sessions.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ExecEvent {
    pub event_id: String,
    pub session_id: String,
    pub event: ExecEventKind,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_tail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
}

/// Exec events waiting for the driver connection to send them. In memory
/// only: they are lost when the node restarts, like its sessions.
#[derive(Debug, Default)]
pub struct ExecEventOutbox {
    queue: Mutex<VecDeque<ExecEvent>>,
    notify: Notify,
}

impl ExecEventOutbox {
    fn push(&self, event: ExecEvent) {
        let mut q = lock(&self.queue);
        if q.len() == EXEC_EVENT_OUTBOX_CAP {
            q.pop_front();
            warn!(
                event = "node.exec.outbox_drop_oldest",
                "exec event outbox full"
            );
        }
        q.push_back(event);
        drop(q);
        self.notify.notify_one();
    }

    /// Takes every queued event, oldest first.
    pub fn drain(&self) -> Vec<ExecEvent> {
        lock(&self.queue).drain(..).collect()
    }

    /// Puts events the driver failed to send back at the front, in order.
    pub fn requeue(&self, events: Vec<ExecEvent>) {
        let mut q = lock(&self.queue);
        for e in events.into_iter().rev() {
            if q.len() == EXEC_EVENT_OUTBOX_CAP {
                break;
            }
            q.push_front(e);
        }
    }

    /// Resolves when an event has been queued since the last wait.
    pub async fn wait(&self) {
        self.notify.notified().await;
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding one of these short locks leaves plain data
    // behind, still consistent enough to report; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[derive(Debug, Clone, Copy)]
struct Exit {
    code: Option<i32>,
    signal: Option<i32>,
    timed_out: bool,
    ended_at: u64,
}

impl Exit {
    fn failed(&self) -> bool {
        self.timed_out || self.code != Some(0)
    }

    fn error(&self) -> Option<String> {
        if self.timed_out {
            Some("Command timed out".into())
        } else if let Some(sig) = self.signal {
            Some(format!("Command failed: {}", signal_name(sig)))
        } else {
            match self.code {
                Some(0) => None,
                Some(c) => Some(format!("Command exited with code {c}")),
                None => Some("Command failed".into()),
            }
        }
    }

    fn event_kind(&self) -> ExecEventKind {
        if self.timed_out {
            ExecEventKind::TimedOut
        } else if self.failed() {
            ExecEventKind::Failed
        } else {
            ExecEventKind::Finished
        }
    }
}

fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        6 => "SIGABRT",
        9 => "SIGKILL",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return format!("SIG{sig}"),
    };
    name.to_owned()
}

#[derive(Debug)]
struct SessionState {
    output: CappedText,
    stdout: CappedText,
    stderr: CappedText,
    /// Output produced since the last result handed to a caller.
    pending: CappedText,
    exit: Option<Exit>,
}

#[derive(Debug)]
struct Session {
    id: String,
    pid: u32,
    cwd: PathBuf,
    started_at: u64,
    state: Mutex<SessionState>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    exited: watch::Receiver<bool>,
    backgrounded: AtomicBool,
}

impl Session {
    fn append(&self, text: &str, is_stderr: bool) {
        if text.is_empty() {
            return;
        }
        let mut st = lock(&self.state);
        st.output.push(text);
        st.pending.push(text);
        if is_stderr {
            st.stderr.push(text);
        } else {
            st.stdout.push(text);
        }
    }

    fn exit(&self) -> Option<Exit> {
        lock(&self.state).exit
    }

    /// Signals the whole process group, unless the command is already
    /// known to be over (then the pid may belong to someone else).
    fn signal_group(&self, sig: Signal) {
        let st = lock(&self.state);
        if st.exit.is_none() {
            signal_group(self.pid, sig);
        }
    }

    async fn wait_exit(&self, window: Duration) -> bool {
        let mut rx = self.exited.clone();
        tokio::time::timeout(window, rx.wait_for(|done| *done))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The answer for a caller right now, and whether it is the final one;
    /// hands over the pending output.
    fn result(&self) -> (Value, bool) {
        let mut st = lock(&self.state);
        let truncated = st.output.overflowed
            || st.stdout.overflowed
            || st.stderr.overflowed
            || st.pending.overflowed;
        let output = st.pending.take();
        st.pending.overflowed = false;
        let tail = last_chars(st.output.text(), TAIL_CHARS).to_owned();
        let finished = st.exit.is_some();
        let value = match st.exit {
            None => json!({
                "ok": true,
                "status": "running",
                "sessionId": self.id,
                "pid": self.pid,
                "startedAt": self.started_at,
                "output": output,
                "tail": tail,
                "cwd": self.cwd,
                "truncated": truncated,
            }),
            Some(exit) => json!({
                "ok": true,
                "status": if exit.failed() { "failed" } else { "completed" },
                "sessionId": self.id,
                "pid": self.pid,
                "exitCode": exit.code,
                "signal": exit.signal.map(signal_name),
                "error": exit.error(),
                "timedOut": exit.timed_out,
                "startedAt": self.started_at,
                "endedAt": exit.ended_at,
                "durationMs": exit.ended_at.saturating_sub(self.started_at),
                "stdout": st.stdout.text(),
                "stderr": st.stderr.text(),
                "output": output,
                "tail": tail,
                "truncated": truncated,
                "cwd": self.cwd,
            }),
        };
        (value, finished)
    }
}

fn signal_group(pid: u32, sig: Signal) {
    // pid 0 or 1 would address our own group or every process we may
    // signal; a spawned child never has either, this is a last guard.
    let Some(pgid) = i32::try_from(pid).ok().filter(|p| *p > 1) else {
        return;
    };
    let Some(pgid) = Pid::from_raw(pgid) else {
        return;
    };
    match rustix::process::kill_process_group(pgid, sig) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => {}
        Err(e) => warn!(event = "node.shell.signal_failed", pid, ?sig, error = %e),
    }
}

/// Kills a foreground command's group if its request goes away (dropped
/// or cancelled) before the command was answered or backgrounded.
struct KillGroupOnDrop {
    session: Arc<Session>,
    armed: bool,
}

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if self.armed {
            self.session.signal_group(Signal::KILL);
        }
    }
}

/// The registry of shell sessions of one node.
#[derive(Debug, Default)]
pub(crate) struct ShellSessions {
    sessions: Mutex<HashMap<String, Arc<Session>>>,
    pub(crate) events: Arc<ExecEventOutbox>,
    config: ShellConfig,
}

/// `$SHELL` when it names an absolute, executable file, else `/bin/sh`.
fn login_shell() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("SHELL")
        .map(PathBuf::from)
        .filter(|p| {
            p.is_absolute()
                && std::fs::metadata(p)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
        .unwrap_or_else(|| PathBuf::from("/bin/sh"))
}

fn clamp_yield(ms: Option<u64>) -> Duration {
    Duration::from_millis(
        ms.unwrap_or(DEFAULT_YIELD_MS)
            .clamp(MIN_YIELD_MS, MAX_YIELD_MS),
    )
}

impl ShellSessions {
    pub(crate) fn new(config: ShellConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    pub(crate) async fn exec(
        self: &Arc<Self>,
        root: &NodeRoot,
        args: ShellArgs,
    ) -> Result<Value, OpError> {
        if args.action == Some(ShellAction::List) {
            return Ok(self.list());
        }
        match args.session_id.clone().filter(|id| !id.is_empty()) {
            Some(id) => self.continue_session(&id, args).await,
            None if args.action.is_some() => Err(OpError::Invalid(
                "sessionId is required for this action".into(),
            )),
            None => self.start(root, args).await,
        }
    }

    fn get(&self, id: &str) -> Result<Arc<Session>, OpError> {
        lock(&self.sessions)
            .get(id)
            .cloned()
            .ok_or_else(|| OpError::UnknownSession(id.to_owned()))
    }

    fn remove(&self, session: &Arc<Session>) {
        let mut map = lock(&self.sessions);
        if map
            .get(&session.id)
            .is_some_and(|s| Arc::ptr_eq(s, session))
        {
            map.remove(&session.id);
        }
    }

    fn list(&self) -> Value {
        let mut sessions: Vec<Arc<Session>> = lock(&self.sessions).values().cloned().collect();
        sessions.sort_by_key(|s| std::cmp::Reverse(s.started_at));
        let rows: Vec<Value> = sessions
            .iter()
            .map(|s| {
                let exit = s.exit();
                json!({
                    "sessionId": s.id,
                    "pid": s.pid,
                    "status": match exit { None => "running", Some(e) if e.failed() => "failed", Some(_) => "completed" },
                    "startedAt": s.started_at,
                    "endedAt": exit.map(|e| e.ended_at),
                    "exitCode": exit.and_then(|e| e.code),
                    "cwd": s.cwd,
                })
            })
            .collect();
        json!({"ok": true, "sessions": rows})
    }

    async fn start(self: &Arc<Self>, root: &NodeRoot, args: ShellArgs) -> Result<Value, OpError> {
        if args.input.trim().is_empty() {
            return Err(OpError::Invalid("input must not be empty".into()));
        }
        let running = lock(&self.sessions)
            .values()
            .filter(|s| s.exit().is_none())
            .count();
        if running >= self.config.max_running {
            return Err(OpError::TooManySessions(self.config.max_running));
        }
        let cwd = root.resolve_dir(args.cwd.as_deref().filter(|c| !c.is_empty()).unwrap_or("."))?;
        let shell = self.config.shell.clone().unwrap_or_else(login_shell);
        let mut child = tokio::process::Command::new(&shell)
            .arg(if self.config.login { "-lc" } else { "-c" })
            .arg(&args.input)
            .current_dir(&cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|source| OpError::Spawn {
                shell: shell.display().to_string(),
                source,
            })?;
        let pid = child.id().unwrap_or(0);
        let (exited_tx, exited_rx) = watch::channel(false);
        let session = Arc::new(Session {
            id: uuid::Uuid::new_v4().to_string(),
            pid,
            cwd,
            started_at: now_ms(),
            state: Mutex::new(SessionState {
                output: CappedText::new(MAX_OUTPUT_CHARS),
                stdout: CappedText::new(MAX_OUTPUT_CHARS),
                stderr: CappedText::new(MAX_OUTPUT_CHARS),
                pending: CappedText::new(MAX_OUTPUT_CHARS),
                exit: None,
            }),
            stdin: tokio::sync::Mutex::new(child.stdin.take()),
            exited: exited_rx,
            backgrounded: AtomicBool::new(false),
        });
        debug!(event = "node.shell.started", session = %session.id, pid, "shell command started");
        lock(&self.sessions).insert(session.id.clone(), session.clone());
        let mut guard = KillGroupOnDrop {
            session: session.clone(),
            armed: true,
        };
        let readers = [
            child.stdout.take().map(|s| pump(s, session.clone(), false)),
            child.stderr.take().map(|s| pump(s, session.clone(), true)),
        ];
        let timeout = match args.timeout.unwrap_or(DEFAULT_TIMEOUT_MS) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        };
        tokio::spawn(
            self.clone()
                .watch(child, session.clone(), readers, timeout, exited_tx),
        );

        if args.background {
            guard.armed = false;
            return Ok(self.answer(&session));
        }
        session.wait_exit(clamp_yield(args.yield_ms)).await;
        guard.armed = false;
        Ok(self.answer(&session))
    }

    /// The waiter: owns the child, enforces the timeout, records the exit,
    /// reports it for background sessions, and forgets the session after
    /// the retention time.
    async fn watch(
        self: Arc<Self>,
        mut child: tokio::process::Child,
        session: Arc<Session>,
        readers: [Option<tokio::task::JoinHandle<()>>; 2],
        timeout: Option<Duration>,
        exited: watch::Sender<bool>,
    ) {
        let mut timed_out = false;
        let waited = match timeout {
            None => child.wait().await,
            Some(limit) => tokio::select! {
                status = child.wait() => status,
                () = tokio::time::sleep(limit) => {
                    timed_out = true;
                    signal_group(session.pid, Signal::TERM);
                    tokio::time::sleep(Duration::from_millis(KILL_GRACE_MS)).await;
                    // Whatever ignored SIGTERM, or outlived the shell, dies now.
                    signal_group(session.pid, Signal::KILL);
                    child.wait().await
                }
            },
        };
        for reader in readers.into_iter().flatten() {
            let abort = reader.abort_handle();
            if tokio::time::timeout(OUTPUT_DRAIN_GRACE, reader)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        let exit = match waited {
            Ok(status) => Exit {
                code: status.code(),
                signal: status.signal(),
                timed_out,
                ended_at: now_ms(),
            },
            Err(e) => {
                warn!(event = "node.shell.wait_failed", session = %session.id, error = %e);
                Exit {
                    code: None,
                    signal: None,
                    timed_out,
                    ended_at: now_ms(),
                }
            }
        };
        let backgrounded = {
            let mut st = lock(&session.state);
            st.exit = Some(exit);
            session.backgrounded.load(Ordering::Acquire)
        };
        *session.stdin.lock().await = None;
        exited.send_replace(true);
        if backgrounded {
            self.events.push(ExecEvent {
                event_id: uuid::Uuid::new_v4().to_string(),
                session_id: session.id.clone(),
                event: exit.event_kind(),
                exit_code: exit.code,
                signal: exit.signal.map(signal_name),
                output_tail: Some(
                    last_chars(lock(&session.state).output.text(), TAIL_CHARS).to_owned(),
                ),
                started_at: Some(session.started_at),
                ended_at: Some(exit.ended_at),
            });
        }
        tokio::time::sleep(self.config.retention).await;
        self.remove(&session);
    }

    /// The result for a caller: a finished session is handed over and
    /// forgotten; a running one becomes a background session.
    fn answer(&self, session: &Arc<Session>) -> Value {
        // Decided under the state lock, which the waiter holds while it
        // records the exit: either this is the final answer, or the waiter
        // will see the session as backgrounded and report its end.
        let first_background = {
            let st = lock(&session.state);
            st.exit.is_none() && !session.backgrounded.swap(true, Ordering::AcqRel)
        };
        if first_background {
            self.events.push(ExecEvent {
                event_id: uuid::Uuid::new_v4().to_string(),
                session_id: session.id.clone(),
                event: ExecEventKind::Started,
                exit_code: None,
                signal: None,
                output_tail: None,
                started_at: Some(session.started_at),
                ended_at: None,
            });
        }
        let (result, finished) = session.result();
        if finished {
            self.remove(session);
        }
        result
    }

    async fn continue_session(&self, id: &str, args: ShellArgs) -> Result<Value, OpError> {
        let session = self.get(id)?;
        let action = args.action.unwrap_or(if args.input.is_empty() {
            ShellAction::Poll
        } else {
            ShellAction::Write
        });
        match action {
            ShellAction::Log => return Ok(log(&session, args.offset, args.limit)),
            ShellAction::Kill => {
                session.signal_group(Signal::KILL);
                session.wait_exit(KILL_WAIT).await;
                return Ok(self.answer(&session));
            }
            ShellAction::Write | ShellAction::Submit => {
                let mut data = args.input.into_bytes();
                if action == ShellAction::Submit {
                    data.push(b'\n');
                }
                write_stdin(&session, &data).await?;
            }
            ShellAction::Poll | ShellAction::List => {}
        }
        session.wait_exit(clamp_yield(args.yield_ms)).await;
        Ok(self.answer(&session))
    }
}

async fn write_stdin(session: &Session, data: &[u8]) -> Result<(), OpError> {
    let closed = || OpError::StdinClosed(session.id.clone());
    let mut stdin = session.stdin.lock().await;
    let pipe = stdin.as_mut().ok_or_else(closed)?;
    let written = async {
        pipe.write_all(data).await?;
        pipe.flush().await
    };
    if written.await.is_err() {
        *stdin = None;
        return Err(closed());
    }
    Ok(())
}

/// Lines `offset..offset+limit` of the session's captured output.
fn log(session: &Session, offset: Option<usize>, limit: Option<usize>) -> Value {
    let st = lock(&session.state);
    let text = st.output.text();
    let offset = offset.unwrap_or(0);
    let limit = limit.unwrap_or(DEFAULT_LOG_LIMIT).max(1);
    let total_lines = text.lines().count();
    let window: Vec<&str> = text.lines().skip(offset).take(limit).collect();
    let status = match st.exit {
        None => "running",
        Some(e) if e.failed() => "failed",
        Some(_) => "completed",
    };
    json!({
        "ok": true,
        "sessionId": session.id,
        "status": status,
        "output": window.join("\n"),
        "offset": offset,
        "lines": window.len(),
        "totalLines": total_lines,
        "totalChars": text.chars().count(),
        "truncated": st.output.overflowed,
    })
}

/// Copies one output pipe into the session, 4 KiB at a time.
fn pump(
    mut pipe: impl AsyncRead + Unpin + Send + 'static,
    session: Arc<Session>,
    is_stderr: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        let mut utf8 = Utf8Stream::default();
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => session.append(&utf8.decode(&buf[..n]), is_stderr),
            }
        }
        session.append(&utf8.finish(), is_stderr);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yield_is_clamped_to_its_range() {
        assert_eq!(clamp_yield(None), Duration::from_millis(DEFAULT_YIELD_MS));
        assert_eq!(clamp_yield(Some(1)), Duration::from_millis(MIN_YIELD_MS));
        assert_eq!(
            clamp_yield(Some(10_000_000)),
            Duration::from_millis(MAX_YIELD_MS)
        );
    }
}
