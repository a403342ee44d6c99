//! Local agents for one-shot transfers (git's fsmonitor model): a process
//! that watches LOCAL_DIR listens on `STATE/agent.sock`, and a `wsd push`,
//! `pull` or `sync` of the same LOCAL_DIR with the same remote asks it to
//! make the transfer instead of opening the index and walking the whole
//! tree itself. The agent's store is watched, so its settle looks only at
//! what inotify reported (behind a cookie barrier, so every write made
//! before the request is seen); a no-op push then costs a process start
//! and one round trip on the socket.
//!
//! Two kinds serve: a running `wsd sync --watch`, and the on-demand agent
//! (`wsd agent run`) that a one-shot transfer starts in the background when
//! none answered (unless `--no-agent` or `WSD_AGENT=off`). One agent per state
//! directory: the on-demand one holds `STATE/agent.lock` for its lifetime
//! and binds the socket only after its first settle, so a push never waits
//! for an agent that is still walking; it walks by itself meanwhile. The
//! on-demand agent exits after an idle timeout, when LOCAL_DIR, its state
//! directory, its socket or its index is removed or replaced, on SIGTERM,
//! and on `wsd agent stop`.
//!
//! The agent answers only a transfer it would make the same way: same
//! root, same remote, same `.wsdignore` and remembered excludes (one with
//! `--exclude`/`--no-exclude` or `--dry-run` never asks), and the on-demand
//! one only while its watcher can vouch for its view (no lost events, no
//! watch limit reached, its index the one it opened). Anything else, or no
//! agent, and the command walks as before. The socket is the user's own (mode
//! 0600, in the state directory).

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

/// The agent's socket, in LOCAL_DIR's state directory.
pub(crate) const AGENT_SOCKET: &str = "agent.sock";
/// Held (`flock`) by the on-demand agent for its whole life: one per state
/// directory.
pub(crate) const AGENT_LOCK: &str = "agent.lock";
/// The on-demand agent's stdout and stderr.
pub(crate) const AGENT_LOG: &str = "agent.log";
/// `off` (or `0`, `no`, `false`): no one-shot transfer starts an agent.
pub(crate) const AGENT_ENV: &str = "WSD_AGENT";
/// Seconds without a transfer asked of it after which the on-demand agent
/// exits.
pub(crate) const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 600;
/// The log is started afresh by an agent that finds it larger.
const LOG_KEEP_BYTES: u64 = 1 << 20;
/// How long a push waits for a retiring agent's lock before starting its
/// successor.
const RETIRE_WAIT: Duration = Duration::from_secs(2);
/// How long `wsd agent stop` waits for the agent to let go of its lock.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest request line the agent reads.
const MAX_REQUEST: u64 = 1 << 20;
/// How long the agent waits for a connected client's request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// What a one-shot transfer asks: everything that decides what it would
/// send or fetch.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct TransferRequest {
    /// LOCAL_DIR, canonical.
    pub root: PathBuf,
    /// `--remote`.
    pub remote: String,
    /// `.wsdignore`'s patterns as the client read them.
    pub wsdignore: Vec<String>,
    /// The remembered excludes as the client read them.
    pub remembered: Vec<String>,
}

/// A client's request, one JSON line.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Request {
    Push(TransferRequest),
    /// `wsd pull` (an agent from before pulls were served cannot parse it
    /// and answers `Refused`).
    Pull(TransferRequest),
    /// `wsd sync` without `--watch`: pull, then push.
    Sync(TransferRequest),
    /// Who serves (`wsd agent status`).
    Status,
    /// Exit (`wsd agent stop`); a `sync --watch` refuses.
    Stop,
}

/// The agent's answer.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Reply {
    /// The push ran; its summary, as `--json` prints it.
    Pushed(serde_json::Value),
    /// The pull ran; its summary (with the conflict copies it made).
    Pulled(serde_json::Value),
    /// The sync ran: its pull's summary, then its push's.
    Synced {
        pull: serde_json::Value,
        push: serde_json::Value,
    },
    /// Not a transfer the agent makes the same way, its view cannot be
    /// vouched for, or its transfer failed: the client makes it by itself.
    Refused(String),
    /// Refused, and exiting: it can no longer serve (its excludes, index
    /// or connection went stale); the client starts a fresh one.
    Retiring(String),
    Status(AgentStatus),
    /// Exiting, as asked.
    Stopping,
}

/// Which process serves a directory's one-shot transfers.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub(crate) enum AgentKind {
    /// `wsd agent run`, started by a push or by hand.
    OnDemand,
    /// A running `wsd sync --watch`.
    SyncWatch,
}

/// What `wsd agent status` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AgentStatus {
    pub pid: u32,
    pub kind: AgentKind,
    pub root: PathBuf,
    pub remote: String,
    /// Seconds without a request before it exits (none for `sync --watch`).
    pub idle_timeout_secs: Option<u64>,
    /// Pushes it made for clients (a sync counts as a pull and a push).
    pub pushes: u64,
    /// Pulls it made for clients (absent from an agent older than those).
    #[serde(default)]
    pub pulls: u64,
}

/// A request as the agent handles it: a transfer, or about the agent.
#[derive(Debug)]
pub(crate) enum Asking {
    Transfer(Transfer, TransferRequest),
    Status,
    Stop,
}

impl From<Request> for Asking {
    fn from(req: Request) -> Asking {
        match req {
            Request::Push(r) => Asking::Transfer(Transfer::Push, r),
            Request::Pull(r) => Asking::Transfer(Transfer::Pull, r),
            Request::Sync(r) => Asking::Transfer(Transfer::Sync, r),
            Request::Status => Asking::Status,
            Request::Stop => Asking::Stop,
        }
    }
}

/// What an agent made for clients (`wsd agent status`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Served {
    pub pushes: u64,
    pub pulls: u64,
}

impl Served {
    /// Counts a transfer made.
    pub(crate) fn count(&mut self, t: Transfer) {
        self.pushes += u64::from(t.pushes());
        self.pulls += u64::from(t.pulls());
    }
}

/// Which transfer a one-shot command asks of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transfer {
    Push,
    Pull,
    Sync,
}

impl Transfer {
    /// The request asking for this transfer.
    pub(crate) fn request(self, req: TransferRequest) -> Request {
        match self {
            Transfer::Push => Request::Push(req),
            Transfer::Pull => Request::Pull(req),
            Transfer::Sync => Request::Sync(req),
        }
    }

    /// Whether it pulls first (pull, sync).
    pub(crate) fn pulls(self) -> bool {
        self != Transfer::Push
    }

    /// Whether it pushes (push, sync).
    pub(crate) fn pushes(self) -> bool {
        self != Transfer::Pull
    }
}

/// The agent's listening socket.
#[derive(Debug)]
pub(crate) struct Agent {
    listener: tokio::net::UnixListener,
    path: PathBuf,
    /// The socket file's inode: removed at exit only if it is still ours
    /// (another agent may have replaced a socket it took for dead).
    ino: Option<u64>,
}

impl Agent {
    /// Listens on `STATE/agent.sock`. A socket file nobody answers on is a
    /// dead agent's and is replaced; one that answers belongs to another
    /// agent of the same directory, and then this one serves none (`None`).
    pub(crate) fn bind(state: &Path) -> Result<Option<Agent>> {
        let path = state.join(AGENT_SOCKET);
        if std::os::unix::net::UnixStream::connect(&path).is_ok() {
            tracing::warn!(socket = %path.display(),
                "another agent serves this directory's pushes");
            return Ok(None);
        }
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing {}", path.display()));
            }
            _ => {}
        }
        let listener = tokio::net::UnixListener::bind(&path)
            .with_context(|| format!("listening on {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("restricting {}", path.display()))?;
        let ino = std::fs::symlink_metadata(&path).ok().map(|m| m.ino());
        Ok(Some(Agent {
            listener,
            path,
            ino,
        }))
    }

    /// Whether `STATE/agent.sock` is still this agent's: removed or
    /// replaced, no client reaches it any more.
    pub(crate) fn socket_is_ours(&self) -> bool {
        std::fs::symlink_metadata(&self.path)
            .ok()
            .is_some_and(|m| Some(m.ino()) == self.ino)
    }

    /// The next client. Cancel-safe (only the accept), so it can race the
    /// session's other wake-ups; read its request with [`read_request`].
    pub(crate) async fn accept(&self) -> Result<tokio::net::UnixStream> {
        let (conn, _) = self
            .listener
            .accept()
            .await
            .with_context(|| format!("accepting on {}", self.path.display()))?;
        Ok(conn)
    }
}

/// A connected client's request; one that sends no valid request in time
/// is answered `Refused` (`None`).
pub(crate) async fn read_request(conn: &mut tokio::net::UnixStream) -> Option<Request> {
    let mut line = String::new();
    let read = tokio::time::timeout(
        REQUEST_TIMEOUT,
        tokio::io::BufReader::new((&mut *conn).take(MAX_REQUEST)).read_line(&mut line),
    )
    .await;
    match read.map(|r| r.map(|_| serde_json::from_str::<Request>(&line))) {
        Ok(Ok(Ok(req))) => Some(req),
        other => {
            tracing::debug!(?other, "an agent client sent no valid request");
            let _ = answer(conn, &Reply::Refused("no valid request".into())).await;
            None
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.socket_is_ours() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Sends `reply` as one JSON line.
pub(crate) async fn answer(conn: &mut tokio::net::UnixStream, reply: &Reply) -> Result<()> {
    let mut line = serde_json::to_vec(reply)?;
    line.push(b'\n');
    conn.write_all(&line).await?;
    Ok(())
}

/// How asking an agent went.
#[derive(Debug)]
pub(crate) enum Asked {
    /// No socket, or nobody listening on it (a dead agent's).
    NoAgent,
    /// It accepted and then went away without answering (stopped
    /// mid-request): the caller does the work itself.
    Gone,
    Answered(Reply),
}

/// Sends `req` to the agent of the state directory `state`, if one runs.
pub(crate) fn ask(state: &Path, req: &Request) -> Result<Asked> {
    let path = state.join(AGENT_SOCKET);
    let Ok(mut conn) = std::os::unix::net::UnixStream::connect(&path) else {
        return Ok(Asked::NoAgent);
    };
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    if conn.write_all(&line).is_err() {
        return Ok(Asked::Gone);
    }
    let mut reply = String::new();
    if BufReader::new(conn).read_line(&mut reply).is_err() || reply.is_empty() {
        // A transfer is idempotent whether or not it got anywhere.
        return Ok(Asked::Gone);
    }
    let reply = serde_json::from_str::<Reply>(&reply)
        .with_context(|| format!("reading the answer of {}", path.display()))?;
    Ok(Asked::Answered(reply))
}

/// The on-demand agent's lock, taken without waiting: `None` while another
/// process (an agent, running or starting) holds it.
pub(crate) fn try_lock(state: &Path) -> Result<Option<File>> {
    let path = state.join(AGENT_LOCK);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(std::fs::TryLockError::WouldBlock) => Ok(None),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(e).with_context(|| format!("locking {}", path.display()))
        }
    }
}

/// Whether a one-shot transfer may start an agent: not with `WSD_AGENT=off`.
pub(crate) fn on_demand_enabled() -> bool {
    std::env::var(AGENT_ENV).map_or(true, |v| {
        !matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "off" | "0" | "no" | "false"
        )
    })
}

/// Starts `wsd agent run ARGS` in the background for the state directory
/// `state`, unless an agent holds its lock already: a process of its own
/// session (no terminal's signals reach it), stdin from /dev/null, stdout
/// and stderr to `STATE/agent.log`. Not waited for: it outlives us.
/// `successor`: the agent that answered is exiting (it said
/// [`Reply::Retiring`]), so its lock is waited for a little.
pub(crate) fn start(state: &Path, args: &[std::ffi::OsString], successor: bool) -> Result<()> {
    if std::os::unix::net::UnixStream::connect(state.join(AGENT_SOCKET)).is_ok() && !successor {
        // One serves (a `sync --watch`, or for another remote).
        return Ok(());
    }
    let deadline = Instant::now()
        + if successor {
            RETIRE_WAIT
        } else {
            Duration::ZERO
        };
    loop {
        match try_lock(state)? {
            // Released here: the agent takes it itself, and of two pushes
            // starting one at once, one agent keeps it and the other exits.
            Some(_free) => break,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            None => return Ok(()),
        }
    }
    let log_path = state.join(AGENT_LOG);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding the wsd binary")?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("agent")
        .arg("run")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().context("duplicating the agent log")?)
        .stderr(log);
    use std::os::unix::process::CommandExt;
    // SAFETY: between fork and exec only setsid(2), which is
    // async-signal-safe and touches no memory of ours.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::setsid()
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    let child = cmd.spawn().context("starting the agent")?;
    tracing::debug!(pid = child.id(), "started an agent");
    Ok(())
}

/// The on-demand agent's side of [`start`]: its lock (`None`: another
/// agent has it, this one exits), and its log cut back when it grew large.
pub(crate) fn take_lock(state: &Path) -> Result<Option<File>> {
    let Some(lock) = try_lock(state)? else {
        return Ok(None);
    };
    let log = state.join(AGENT_LOG);
    if std::fs::metadata(&log).is_ok_and(|m| m.len() > LOG_KEEP_BYTES)
        && let Ok(f) = std::fs::OpenOptions::new().write(true).open(&log)
    {
        let _ = f.set_len(0);
    }
    Ok(Some(lock))
}

/// What `wsd agent stop` found.
#[derive(Debug)]
pub(crate) enum StopOutcome {
    /// No agent answered.
    NoAgent,
    /// The agent with this pid exited.
    Exited(u32),
    /// The agent would not stop, and why (a `sync --watch`).
    Refused(String),
}

/// Asks the agent of `state` to exit and waits until it has let go of its
/// lock.
pub(crate) fn stop(state: &Path) -> Result<StopOutcome> {
    let pid = match ask(state, &Request::Status)? {
        Asked::Answered(Reply::Status(st)) => st.pid,
        Asked::Answered(Reply::Refused(why)) => return Ok(StopOutcome::Refused(why)),
        _ => return Ok(StopOutcome::NoAgent),
    };
    match ask(state, &Request::Stop)? {
        Asked::Answered(Reply::Stopping) | Asked::Gone => {}
        Asked::Answered(Reply::Refused(why)) => return Ok(StopOutcome::Refused(why)),
        Asked::Answered(Reply::Retiring(_)) => {}
        Asked::NoAgent => return Ok(StopOutcome::NoAgent),
        Asked::Answered(other) => anyhow::bail!("unexpected answer to stop: {other:?}"),
    }
    // It lets go of its lock before its index is closed: wait for both.
    let deadline = Instant::now() + STOP_TIMEOUT;
    while try_lock(state)?.is_none() || running(pid) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the agent (pid {pid}) did not exit within {STOP_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(StopOutcome::Exited(pid))
}

/// Whether process `pid` runs (one that exited and waits for its reaper,
/// state `Z`, does not).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
        })
        .is_some_and(|exited| !exited)
}

/// What identifies a file or directory: removed-and-recreated is another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub(crate) fn of(path: &Path) -> Option<FileId> {
        std::fs::metadata(path).ok().map(|m| FileId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}
