//! Exec: the runner and the durable, resumable event log (the `shell` half
//! of the contract in `shared/design/exec.md`; on-disk format and constants
//! in `DESIGN.md` beside this file).
//!
//! [`ExecManager`] starts `/bin/sh -c command` in its own process group,
//! inside the workspace root, with an allowlisted environment. Every output
//! chunk becomes an event with a per-exec `seq` (from 1, across stdout and
//! stderr) that is committed to SQLite before any subscriber sees it; the
//! last event is `exit`, written only after the settle hook has run. A
//! [`Subscription`] replays retained events from the log and then follows
//! the live stream; dropping it detaches without affecting the command.
//!
//! With a [`Sandbox`] (`wsd serve --sandbox`) the shell runs under
//! bubblewrap and sees only the workspace and a read-only system (see
//! [`sandbox`]); without one, the cwd check is about intent, not isolation
//! (see [`process`]).
//!
//! What it deliberately does not do: interpret output (payloads are raw
//! bytes) or speak capnp (the RPC layer adapts this API).
//!
//! Runtime: every method is `async` and cancellation-safe; internal tasks
//! are spawned with `tokio::spawn` and are `Send`, so the manager works on a
//! multi-thread runtime and on a current-thread runtime inside a `LocalSet`.
//! The runtime must have IO and time enabled (`enable_all`), because child
//! processes are reaped through its signal driver. SQLite never runs on the
//! caller's thread after `open`: writes go to one writer thread, reads run
//! on `spawn_blocking`.

mod error;
mod log;
pub mod process;
mod runner;
pub mod sandbox;
mod sandbox_limits;
pub mod sandbox_runner;
mod subscription;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use error::ExecError;
pub use sandbox::{Sandbox, SandboxConfig, SandboxError, SandboxLimits, SandboxNetwork};
pub use subscription::Subscription;

use log::{DeleteOutcome, ExecLogReader, ExecLogWriter, LogCaps};
use runner::{Control, ExecSpec, Input, LiveExec, Program, PtySize};

/// Exit code of an exec whose runner died with the daemon (or could not
/// write its log): the real status is unknown. Real codes are `0..=255`
/// (`128 + n` for a command killed by signal `n`), so a negative value
/// cannot be mistaken for one.
pub const EXIT_LOST: i32 = -1;

/// Longest `command`, in bytes. Below Linux's 128 KiB limit on one `argv`
/// string, so a command that passes this check can be spawned.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Longest caller-chosen `id`, in bytes (printable ASCII, no spaces).
pub const MAX_ID_BYTES: usize = 128;
/// Most per-call environment variables.
pub const MAX_ENV_VARS: usize = 256;
/// Most bytes of per-call environment (`name=value\0` summed).
pub const MAX_ENV_BYTES: usize = 64 * 1024;
/// Most `stdin` bytes one call may pass.
pub const MAX_STDIN_BYTES: usize = 8 * 1024 * 1024;
/// Most bytes one `write_stdin` call may pass (the wire's limit).
pub const MAX_STDIN_WRITE_BYTES: usize = wsd_client::limits::MAX_STDIN_WRITE_BYTES;
/// `write_stdin` calls queued ahead of the command's reading; one more
/// waits, so a command that does not read its stdin bounds the memory.
pub const STDIN_QUEUE_DEPTH: usize = 4;
/// Most live subscribers attached to one exec at a time.
pub const MAX_SUBSCRIBERS_PER_EXEC: usize = 16;
/// Largest read from a child's pipe, so the largest output event payload.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Events of one exec read from its pipes but not yet handed to every
/// subscriber (queued for commit, committed, or being delivered). When the
/// window is full the runner stops reading the pipes and the command blocks
/// in `write(2)`, as under a slow pipe. With `READ_CHUNK_BYTES` this bounds
/// an exec's in-flight output to 1 MiB.
pub const PIPELINE_DEPTH: usize = 16;
/// Capacity, in events, of each live subscriber's channel (at most 1 MiB).
/// A subscriber that stops reading fills it, then stalls the runner.
pub const SUBSCRIBER_WINDOW: usize = 16;

/// Defaults of [`ExecConfig`].
pub const DEFAULT_TTL: Duration = Duration::from_secs(5 * 60);
pub const DEFAULT_SWEEP_INTERVAL: Duration = Duration::from_secs(30);
pub const DEFAULT_PER_EXEC_CAP: u64 = 16 * 1024 * 1024;
pub const DEFAULT_GLOBAL_CAP: u64 = 256 * 1024 * 1024;
pub const DEFAULT_MAX_CONCURRENT: usize = 64;
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(5);
/// How long a command runs without output before its process group is
/// recorded in the log on its own (output records it at once; a command
/// that exits sooner is never recorded: its exit is).
pub const DEFAULT_GROUP_RECORD_AFTER: Duration = Duration::from_millis(20);

/// Called after a command's process group is gone and its output is
/// logged, before its `exit` event is logged: the store stamps every write
/// the command made, so a `fetchChanges` after `exit` sees them. The future
/// (awaited on the runner's task: it must wait without blocking, e.g. on
/// the store thread) yields the store's rev after that settle, which goes
/// out with the live exit event (`ExecEvent::rev`). An error is logged and
/// noted on the exec's stderr; the exit still follows.
pub type SettleHook =
    Arc<dyn Fn() -> futures::future::BoxFuture<'static, Result<u64, String>> + Send + Sync>;

/// Configuration of an [`ExecManager`]. Build with [`ExecConfig::new`] and
/// adjust fields.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ExecConfig {
    /// The workspace root; every `cwd` resolves inside it.
    pub root: PathBuf,
    /// The exec log database. Its own file: its writer thread must be the
    /// only writer of that database.
    pub db_path: PathBuf,
    /// How long a finished exec's log is kept.
    pub ttl: Duration,
    /// How often expired logs are swept (a log may outlive `ttl` by this).
    pub sweep_interval: Duration,
    /// Output bytes retained per exec; the oldest events go first.
    pub per_exec_cap: u64,
    /// Output bytes retained over all execs; finished execs' oldest events
    /// go first, then live execs' oldest.
    pub global_cap: u64,
    /// Execs running at once; one more is `ELIMIT`.
    pub max_concurrent: usize,
    /// Time between SIGTERM (timeout or kill) and SIGKILL to the group.
    pub kill_grace: Duration,
    /// Timeout of a call that passes none; `None` means no timeout.
    pub default_timeout: Option<Duration>,
    /// A command's process group is recorded in the log (for a daemon that
    /// restarts after a crash to kill it) with its first output, or after
    /// it ran this long without any.
    pub group_record_after: Duration,
    /// The daemon environment that [`process::ENV_ALLOWLIST`] filters.
    /// `new` captures the process environment; tests pass their own.
    pub daemon_env: Vec<(OsString, OsString)>,
    /// Run every command in this sandbox; `None` runs them on the host.
    pub sandbox: Option<Sandbox>,
}

impl ExecConfig {
    pub fn new(root: impl Into<PathBuf>, db_path: impl Into<PathBuf>) -> ExecConfig {
        ExecConfig {
            root: root.into(),
            db_path: db_path.into(),
            ttl: DEFAULT_TTL,
            sweep_interval: DEFAULT_SWEEP_INTERVAL,
            per_exec_cap: DEFAULT_PER_EXEC_CAP,
            global_cap: DEFAULT_GLOBAL_CAP,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            kill_grace: DEFAULT_KILL_GRACE,
            default_timeout: None,
            group_record_after: DEFAULT_GROUP_RECORD_AFTER,
            daemon_env: std::env::vars_os().collect(),
            sandbox: None,
        }
    }
}

/// One `exec` call: the type the wire, the client and the CLI share.
pub use wsd_client::ExecRequest;
/// One `startPty` call, likewise.
pub use wsd_client::PtyRequest;
/// The largest terminal width or height; 0 is `EINVAL`.
pub use wsd_client::limits::MAX_PTY_DIMENSION;
/// Most bytes one `pty_write` may pass (the wire's limit).
pub const MAX_PTY_WRITE_BYTES: usize = wsd_client::limits::MAX_PTY_WRITE_BYTES;
/// A terminal's program when the request names none.
pub const DEFAULT_PTY_PROGRAM: &str = "/bin/sh";
/// `TERM` of a terminal's program unless the request sets it.
pub const DEFAULT_PTY_TERM: &str = "xterm-256color";

/// The exec's events: the types the wire, the client and the CLI share.
/// An exit code is the command's, `128 + n` if it was killed by signal `n`,
/// or [`EXIT_LOST`].
pub use wsd_client::{ExecEvent, ExecEventKind as EventKind};

/// Where a [`ExecManager::get`] subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Every retained event from seq 1 (`ELOG_TRUNCATED` if seq 1 is gone).
    All,
    /// Events with `seq > n` (`ELOG_TRUNCATED` if some of them are gone).
    Seq(u64),
    /// Only events logged from now on (an ended stream for a finished exec).
    Tail,
}

/// Runs commands and keeps their event logs. Cheap to clone; the runner
/// tasks and the log writer stop once every clone is dropped (live commands
/// are then killed: SIGKILL to their groups).
#[derive(Clone)]
pub struct ExecManager {
    shared: Arc<Shared>,
    _owner: Arc<OwnerGuard>,
}

impl std::fmt::Debug for ExecManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecManager")
            .field("root", &self.shared.root)
            .field("db_path", &self.shared.config.db_path)
            .finish_non_exhaustive()
    }
}

/// Cancels the shutdown token when the last `ExecManager` clone drops.
#[derive(Debug)]
struct OwnerGuard(CancellationToken);

impl Drop for OwnerGuard {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// State shared by the manager handles and the runner tasks.
pub(crate) struct Shared {
    config: ExecConfig,
    /// `config.root`, canonicalized once at open.
    root: PathBuf,
    writer: ExecLogWriter,
    reader: Arc<ExecLogReader>,
    /// Execs whose runner has not finished. An entry is inserted before its
    /// log begins and removed after its exit event is committed, so an
    /// unfinished log row always has an entry (outside a crash).
    live: Mutex<HashMap<String, Arc<LiveExec>>>,
    settle: SettleHook,
    shutdown: CancellationToken,
    /// Notified whenever an entry leaves `live` (for `shutdown`).
    live_changed: Notify,
}

impl Shared {
    /// Removes `exec` from the live map if it is still the entry under its
    /// id (a newer exec may have reused the id). Returns whether a dispose
    /// was requested for it.
    pub(crate) fn remove_live(&self, exec: &Arc<LiveExec>) -> bool {
        let mut live = self.live.lock().expect("live map poisoned");
        if live.get(&exec.id).is_some_and(|e| Arc::ptr_eq(e, exec)) {
            live.remove(&exec.id);
        }
        let disposing = exec.disposing.load(std::sync::atomic::Ordering::SeqCst);
        drop(live);
        self.live_changed.notify_waiters();
        disposing
    }
}

impl ExecManager {
    /// Opens (or creates) the log at `config.db_path`, gives execs that were
    /// running when the previous daemon stopped an [`EXIT_LOST`] exit event,
    /// starts the log writer thread and the retention sweep. Must be called
    /// inside a tokio runtime. Blocks briefly (schema check and repair).
    ///
    /// One manager per database: a second manager on the same file would
    /// declare the first one's running execs lost.
    pub fn open(config: ExecConfig, settle: SettleHook) -> Result<ExecManager, ExecError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            ExecError::Invalid("ExecManager::open must be called inside a tokio runtime".into())
        })?;
        if config.max_concurrent == 0 || config.per_exec_cap == 0 || config.global_cap == 0 {
            return Err(ExecError::Invalid(
                "max_concurrent, per_exec_cap and global_cap must be positive".into(),
            ));
        }
        let root = std::fs::canonicalize(&config.root)
            .map_err(|e| ExecError::io(format!("workspace root {}", config.root.display()), e))?;
        let caps = LogCaps {
            per_exec: config.per_exec_cap,
            global: config.global_cap,
        };
        let mut config = config;
        if config.sandbox.is_some() {
            config.daemon_env = sandbox::sandboxed_env(&config.daemon_env);
        }
        let (writer, report) = ExecLogWriter::open(&config.db_path, caps)?;
        process::stop_ignoring_inherited_signals();
        for id in &report.lost {
            tracing::warn!(exec = %id, code = EXIT_LOST, "exec was running when wsd stopped; logged as lost");
        }
        for g in &report.groups {
            match process::kill_orphaned_group(g.pgid, g.leader_start) {
                Ok(outcome) => {
                    tracing::warn!(exec = %g.id, pgid = g.pgid, ?outcome, "process group left by the previous daemon")
                }
                Err(e) => {
                    tracing::error!(exec = %g.id, pgid = g.pgid, error = %e, "killing the process group left by the previous daemon")
                }
            }
        }
        tracing::info!(
            db = %config.db_path.display(),
            retained = report.retained,
            lost = report.lost.len(),
            "exec log opened"
        );
        let shutdown = CancellationToken::new();
        let shared = Arc::new(Shared {
            reader: Arc::new(writer.reader()),
            config,
            root,
            writer,
            live: Mutex::new(HashMap::new()),
            settle,
            shutdown: shutdown.clone(),
            live_changed: Notify::new(),
        });
        handle.spawn(sweep_loop(
            shared.writer.clone(),
            shared.config.ttl,
            shared.config.sweep_interval,
            shutdown.clone(),
        ));
        Ok(ExecManager {
            shared,
            _owner: Arc::new(OwnerGuard(shutdown)),
        })
    }

    /// Starts a command and returns its id and a subscription that sees
    /// every event from seq 1. Errors: `EINVAL` (empty command, bad id, env
    /// name or cwd), `ELIMIT` (see the `MAX_*` constants and
    /// `max_concurrent`), `EEXEC_BUSY` (the id is live), `EIO` (log or
    /// spawn failure), `ESHUTDOWN` after [`ExecManager::shutdown`].
    ///
    /// Cancelling this future after the exec was registered does not stop
    /// the command; it runs detached and its output is logged.
    pub async fn exec(&self, req: ExecRequest) -> Result<(String, Subscription), ExecError> {
        let shared = &self.shared;
        if shared.shutdown.is_cancelled() {
            return Err(ExecError::ShuttingDown);
        }
        validate_command(&req.command)?;
        let id = match req.id {
            Some(id) => {
                validate_id(&id)?;
                id
            }
            // 32 lowercase hex digits, the format ids always had.
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        validate_env(&req.env)?;
        if let Some(stdin) = &req.stdin {
            ExecError::check_limit("stdin size (bytes)", MAX_STDIN_BYTES, stdin.len())?;
        }
        let cwd = self.resolve_cwd(req.cwd.as_deref()).await?;
        let timeout = match req.timeout_ms {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => shared.config.default_timeout,
        };
        let spec = ExecSpec {
            program: Program::Shell {
                command: req.command,
                stdin: req.stdin,
                stdin_open: req.stdin_open,
            },
            cwd,
            env: process::command_env(&shared.config.daemon_env, &req.env),
            timeout,
        };
        self.launch(id, spec, false).await
    }

    /// Starts `argv` (empty: [`DEFAULT_PTY_PROGRAM`]) on a new
    /// pseudo-terminal of `cols` x `rows`, as the leader of a session of
    /// its own, with no timeout; its output is logged as stdout events.
    /// Errors as [`ExecManager::exec`], and `EINVAL` for a size of 0 or an
    /// argument with NUL, `ELIMIT` over [`MAX_PTY_DIMENSION`] or
    /// [`MAX_COMMAND_BYTES`] of arguments.
    pub async fn start_pty(&self, req: PtyRequest) -> Result<(String, Subscription), ExecError> {
        let shared = &self.shared;
        if shared.shutdown.is_cancelled() {
            return Err(ExecError::ShuttingDown);
        }
        let argv = if req.argv.is_empty() {
            vec![DEFAULT_PTY_PROGRAM.to_owned()]
        } else {
            req.argv
        };
        validate_argv(&argv)?;
        let size = validate_size(req.cols, req.rows)?;
        let id = match req.id {
            Some(id) => {
                validate_id(&id)?;
                id
            }
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        validate_env(&req.env)?;
        let cwd = self.resolve_cwd(req.cwd.as_deref()).await?;
        let mut env = vec![("TERM".to_owned(), DEFAULT_PTY_TERM.to_owned())];
        env.extend(req.env);
        let spec = ExecSpec {
            program: Program::Pty { argv, size },
            cwd,
            env: process::command_env(&shared.config.daemon_env, &env),
            timeout: None,
        };
        self.launch(id, spec, true).await
    }

    /// `cwd` checked and resolved under the root (`None`, `""`, `"."`: the
    /// root).
    async fn resolve_cwd(&self, cwd: Option<&str>) -> Result<PathBuf, ExecError> {
        match cwd {
            // The root itself needs no filesystem check: skip the hop to a
            // blocking thread, whose wake-up dominates a short command's
            // latency on a busy machine.
            None | Some("" | ".") => Ok(self.shared.root.clone()),
            Some(cwd) => {
                let root = self.shared.root.clone();
                let cwd = cwd.to_owned();
                tokio::task::spawn_blocking(move || process::resolve_cwd(&root, Some(&cwd)))
                    .await
                    .map_err(|e| ExecError::Storage(format!("cwd check task failed: {e}")))?
            }
        }
    }

    /// Registers exec `id` and starts its runner; answers once it runs.
    async fn launch(
        &self,
        id: String,
        spec: ExecSpec,
        terminal: bool,
    ) -> Result<(String, Subscription), ExecError> {
        let shared = &self.shared;
        let (live, control_rx, done_tx) = LiveExec::new(id.clone(), terminal);
        let subscription = {
            let mut map = shared.live.lock().expect("live map poisoned");
            if map.contains_key(&id) {
                return Err(ExecError::Busy { id });
            }
            ExecError::check_limit(
                "concurrent execs",
                shared.config.max_concurrent,
                map.len() + 1,
            )?;
            map.insert(id.clone(), live.clone());
            // Attached before the runner starts, so it sees seq 1.
            Subscription::first(shared.reader.clone(), live.clone())
        };
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(runner::run(
            shared.clone(),
            live,
            control_rx,
            done_tx,
            spec,
            started_tx,
        ));
        match started_rx.await {
            Ok(Ok(())) => Ok((id, subscription)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ExecError::RunnerStopped {
                id,
                reason: "runtime shut down".into(),
            }),
        }
    }

    /// Attaches to an exec's events (see [`After`]). A live exec's
    /// subscription replays from the log and then follows the live stream;
    /// a finished one's ends after the exit event. Errors: `ENOENT` (unknown,
    /// disposed or expired id), `ELOG_TRUNCATED` (the resume point is below
    /// the retained window; the exec and other subscribers are unaffected),
    /// `ELIMIT` (`MAX_SUBSCRIBERS_PER_EXEC`).
    pub async fn get(&self, id: &str, after: After) -> Result<Subscription, ExecError> {
        let shared = &self.shared;
        // Two rounds cover an exec that starts between the live-map check
        // and the log lookup.
        for _ in 0..2 {
            let live = shared
                .live
                .lock()
                .expect("live map poisoned")
                .get(id)
                .cloned();
            if let Some(live) = live {
                return Subscription::attach_live(shared.reader.clone(), live, after).await;
            }
            let meta = read_meta(&shared.reader, id).await?;
            match meta {
                None => return Err(ExecError::NotFound { id: id.to_owned() }),
                Some(m) if m.finished => {
                    return Subscription::attach_finished(shared.reader.clone(), id, m, after)
                        .await;
                }
                Some(_) => tokio::task::yield_now().await,
            }
        }
        Err(ExecError::RunnerStopped {
            id: id.to_owned(),
            reason: "log has no exit and no runner".into(),
        })
    }

    /// Sends `signal` (default `TERM`; names with or without `SIG`, or
    /// numbers) to the exec's whole process group; if the exec is still
    /// running `kill_grace` later, its group gets SIGKILL. Errors: `ENOENT`
    /// (unknown id, or [`ExecError::NotRunning`] once the exec has exited:
    /// a caller must not believe it stopped something), `EINVAL` (signal).
    pub async fn kill(&self, id: &str, signal: Option<&str>) -> Result<(), ExecError> {
        self.kill_with(id, process::parse_signal(signal.unwrap_or("TERM"))?)
            .await
    }

    /// [`ExecManager::kill`] with one of the wire's signals, as the RPC
    /// server passes it (no name to parse on the way).
    pub async fn signal(&self, id: &str, signal: wsd_client::Signal) -> Result<(), ExecError> {
        self.kill_with(id, signal.number()).await
    }

    async fn kill_with(&self, id: &str, sig: i32) -> Result<(), ExecError> {
        let live = self
            .shared
            .live
            .lock()
            .expect("live map poisoned")
            .get(id)
            .cloned();
        let not_running = || ExecError::NotRunning { id: id.to_owned() };
        if let Some(live) = live {
            // A closed channel means the runner is past its exit.
            return live
                .control
                .send(Control::Kill(sig))
                .await
                .map_err(|_| not_running());
        }
        match read_meta(&self.shared.reader, id).await? {
            Some(_) => Err(not_running()),
            None => Err(ExecError::NotFound { id: id.to_owned() }),
        }
    }

    /// Queues `bytes` for the stdin of a live exec started with
    /// `stdin_open`, waiting while [`STDIN_QUEUE_DEPTH`] writes are queued.
    /// Errors: `ELIMIT` ([`MAX_STDIN_WRITE_BYTES`]), `ENOENT` (unknown id),
    /// `EINVAL` (stdin not open: never opened, closed, or the exec exited).
    pub async fn write_stdin(&self, id: &str, bytes: Vec<u8>) -> Result<(), ExecError> {
        ExecError::check_limit("stdin bytes per write", MAX_STDIN_WRITE_BYTES, bytes.len())?;
        let closed = || ExecError::StdinClosed { id: id.to_owned() };
        let Some(live) = self.live(id) else {
            return match read_meta(&self.shared.reader, id).await? {
                Some(_) => Err(closed()),
                None => Err(ExecError::NotFound { id: id.to_owned() }),
            };
        };
        let queue = live.stdin.lock().expect("stdin lock poisoned").clone();
        let queue = queue.ok_or_else(closed)?;
        queue.send(Input::Bytes(bytes)).await.map_err(|_| closed())
    }

    /// Queues `bytes` as typed input of terminal `id`, in order with
    /// [`ExecManager::pty_resize`], waiting while [`STDIN_QUEUE_DEPTH`]
    /// inputs are queued. Errors: `ELIMIT` ([`MAX_PTY_WRITE_BYTES`]),
    /// `ENOENT` (unknown id), `EINVAL` (not a terminal, or exited).
    pub async fn pty_write(&self, id: &str, bytes: Vec<u8>) -> Result<(), ExecError> {
        ExecError::check_limit(
            "terminal input bytes per write",
            MAX_PTY_WRITE_BYTES,
            bytes.len(),
        )?;
        self.terminal_input(id, Input::Bytes(bytes)).await
    }

    /// Sets the window size of terminal `id` (its program gets SIGWINCH),
    /// queued in order with [`ExecManager::pty_write`]. Errors: `EINVAL`
    /// (a size of 0, not a terminal, exited), `ELIMIT`
    /// ([`MAX_PTY_DIMENSION`]), `ENOENT` (unknown id).
    pub async fn pty_resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), ExecError> {
        let size = validate_size(cols, rows)?;
        self.terminal_input(id, Input::Resize(size)).await
    }

    async fn terminal_input(&self, id: &str, input: Input) -> Result<(), ExecError> {
        let closed = || ExecError::TerminalClosed { id: id.to_owned() };
        let Some(live) = self.live(id) else {
            return match read_meta(&self.shared.reader, id).await? {
                Some(_) => Err(closed()),
                None => Err(ExecError::NotFound { id: id.to_owned() }),
            };
        };
        if !live.terminal {
            return Err(ExecError::NotATerminal { id: id.to_owned() });
        }
        let queue = live.stdin.lock().expect("stdin lock poisoned").clone();
        let queue = queue.ok_or_else(closed)?;
        queue.send(input).await.map_err(|_| closed())
    }

    /// Closes the stdin of a live exec once the queued writes reached it.
    /// Idempotent; an exited exec's stdin is already closed. Unknown id:
    /// `ENOENT`.
    pub async fn close_stdin(&self, id: &str) -> Result<(), ExecError> {
        if let Some(live) = self.live(id) {
            live.stdin.lock().expect("stdin lock poisoned").take();
            return Ok(());
        }
        match read_meta(&self.shared.reader, id).await? {
            Some(_) => Ok(()),
            None => Err(ExecError::NotFound { id: id.to_owned() }),
        }
    }

    fn live(&self, id: &str) -> Option<Arc<LiveExec>> {
        self.shared
            .live
            .lock()
            .expect("live map poisoned")
            .get(id)
            .cloned()
    }

    /// The ids of the commands whose runner has not finished.
    pub fn live_ids(&self) -> Vec<String> {
        let live = self.shared.live.lock().expect("live map poisoned");
        live.keys().cloned().collect()
    }

    /// Drops an exec's log; a later `get` is `ENOENT`. A live exec is killed
    /// first (SIGKILL to its group) and its subscribers end with `ENOENT`.
    /// Returns once the log is gone to every reader (a finished exec's rows
    /// are deleted with the log's next commit, a sweep's at the latest; a
    /// crash before that leaves them to the TTL). Unknown id: `ENOENT`.
    pub async fn dispose(&self, id: &str) -> Result<(), ExecError> {
        let shared = &self.shared;
        for _ in 0..2 {
            let live = {
                let map = shared.live.lock().expect("live map poisoned");
                let live = map.get(id).cloned();
                if let Some(l) = &live {
                    // Set under the map lock: the runner reads it under the
                    // same lock when it removes itself.
                    l.disposing.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                live
            };
            if let Some(live) = live {
                let _ = live.control.send(Control::Dispose).await;
                live.wait_done().await;
                return Ok(());
            }
            match shared.writer.forget_finished(id).await? {
                DeleteOutcome::Deleted => return Ok(()),
                DeleteOutcome::NotFound => return Err(ExecError::NotFound { id: id.to_owned() }),
                // Started between our two looks; go round again.
                DeleteOutcome::Live => tokio::task::yield_now().await,
            }
        }
        Err(ExecError::RunnerStopped {
            id: id.to_owned(),
            reason: "log has no exit and no runner".into(),
        })
    }

    /// Stops accepting execs (`ESHUTDOWN`), kills every live exec (SIGKILL
    /// to its group) and waits until each has logged its exit.
    pub async fn shutdown(&self) {
        self.shared.shutdown.cancel();
        loop {
            let changed = self.shared.live_changed.notified();
            if self
                .shared
                .live
                .lock()
                .expect("live map poisoned")
                .is_empty()
            {
                return;
            }
            changed.await;
        }
    }

    /// [`ExecManager::shutdown`], then closes the log database (a clean
    /// stop leaves no `-wal`/`-shm` files). Calls after it fail with `EIO`.
    pub async fn close(&self) {
        self.shutdown().await;
        self.shared.reader.close();
        self.shared.writer.close().await;
    }

    /// Deletes finished execs older than the TTL now (the periodic sweep
    /// does the same every `sweep_interval`).
    #[cfg(test)]
    pub(crate) async fn sweep(&self) -> Result<usize, ExecError> {
        let cutoff = log::now_ms() - self.shared.config.ttl.as_millis() as i64;
        self.shared.writer.sweep(cutoff).await
    }
}

async fn read_meta(
    reader: &Arc<ExecLogReader>,
    id: &str,
) -> Result<Option<log::MetaRow>, ExecError> {
    let reader = reader.clone();
    let id = id.to_owned();
    tokio::task::spawn_blocking(move || reader.meta(&id))
        .await
        .map_err(|e| ExecError::Storage(format!("log read task failed: {e}")))?
}

async fn sweep_loop(
    writer: ExecLogWriter,
    ttl: Duration,
    interval: Duration,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let cutoff = log::now_ms() - ttl.as_millis() as i64;
        match writer.sweep(cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(expired = n, "exec log sweep"),
            Err(e) => tracing::warn!(error = %e, "exec log sweep failed"),
        }
    }
}

fn validate_command(command: &str) -> Result<(), ExecError> {
    if command.trim().is_empty() {
        return Err(ExecError::Invalid("command is empty".into()));
    }
    if command.contains('\0') {
        return Err(ExecError::Invalid("command contains NUL".into()));
    }
    ExecError::check_limit("command length (bytes)", MAX_COMMAND_BYTES, command.len())
}

fn validate_argv(argv: &[String]) -> Result<(), ExecError> {
    if argv[0].is_empty() {
        return Err(ExecError::Invalid("argv[0] (the program) is empty".into()));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ExecError::Invalid("argv contains NUL".into()));
    }
    let bytes: usize = argv.iter().map(|a| a.len() + 1).sum();
    ExecError::check_limit("argv length (bytes)", MAX_COMMAND_BYTES, bytes)
}

fn validate_size(cols: u16, rows: u16) -> Result<PtySize, ExecError> {
    if cols == 0 || rows == 0 {
        return Err(ExecError::Invalid(format!(
            "terminal size {cols}x{rows}: columns and rows must be at least 1"
        )));
    }
    let max = usize::from(MAX_PTY_DIMENSION);
    ExecError::check_limit("terminal columns", max, usize::from(cols))?;
    ExecError::check_limit("terminal rows", max, usize::from(rows))?;
    Ok(PtySize { cols, rows })
}

fn validate_id(id: &str) -> Result<(), ExecError> {
    ExecError::check_limit("exec id length (bytes)", MAX_ID_BYTES, id.len())?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(ExecError::Invalid(format!(
            "exec id {id:?} must be 1.. printable ASCII characters without spaces"
        )));
    }
    Ok(())
}

fn validate_env(env: &[(String, String)]) -> Result<(), ExecError> {
    ExecError::check_limit("env variables", MAX_ENV_VARS, env.len())?;
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    ExecError::check_limit("env size (bytes)", MAX_ENV_BYTES, bytes)?;
    for (k, v) in env {
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(ExecError::Invalid(format!(
                "env variable {k:?}: bad name or NUL in value"
            )));
        }
    }
    Ok(())
}
