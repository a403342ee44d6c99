//! The runner: one task per exec that spawns the command, reads its pipes,
//! appends each chunk to the log, hands committed events to subscribers,
//! enforces the timeout and kill escalation, and finally settles the
//! workspace and logs the exit event.
//!
//! Flow of one output chunk: pipe read (≤ `READ_CHUNK_BYTES`) → `append`
//! queued to the log writer → committed (the writer sends the event back)
//! → delivered to every live subscriber's bounded channel. Chunks move
//! through that pipeline in order; at most `PIPELINE_DEPTH` are past the
//! read and not yet delivered, and while that window is full the pipes are
//! not read, so a stalled subscriber stalls the command (backpressure).
//! Control (kill, dispose) and timers are served while delivery waits.

use std::ffi::OsString;
use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::stream::{FuturesOrdered, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::process::{process_start_time, signal_group, signal_terminal};
use super::sandbox::Sandbox;
use super::sandbox_runner::{SandboxedChild, SpawnRequest};
use super::{EXIT_LOST, EventKind, ExecError, ExecEvent, PIPELINE_DEPTH, READ_CHUNK_BYTES, Shared};

/// Kill and dispose requests queued for a runner. Senders wait when it is
/// full; the runner reads it whenever it is not finishing.
const CONTROL_CAPACITY: usize = 8;

/// A command the runner has validated and resolved.
#[derive(Debug)]
pub(crate) struct ExecSpec {
    pub program: Program,
    pub cwd: PathBuf,
    pub env: Vec<(OsString, OsString)>,
    pub timeout: Option<Duration>,
}

/// What the runner starts, and how it talks to it.
#[derive(Debug)]
pub(crate) enum Program {
    /// `/bin/sh -c command` with its stdout and stderr on pipes.
    Shell {
        command: String,
        stdin: Option<Vec<u8>>,
        /// Keep the pipe open after `stdin` for `write_stdin`.
        stdin_open: bool,
    },
    /// `argv` on a new pseudo-terminal, as the leader of a session of its
    /// own; the terminal's output is one stream (logged as stdout).
    Pty { argv: Vec<String>, size: PtySize },
}

/// A terminal's window size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PtySize {
    pub cols: u16,
    pub rows: u16,
}

/// One item of an exec's input queue; items reach the command in order.
#[derive(Debug)]
pub(crate) enum Input {
    Bytes(Vec<u8>),
    /// A terminal's new window size (only queued for terminals).
    Resize(PtySize),
}

#[derive(Debug)]
pub(crate) enum Control {
    Kill(i32),
    Dispose,
}

/// Why an exec's live stream ended; read by a subscriber whose channel
/// closed, so it can say why instead of hanging.
#[derive(Debug, Clone)]
pub(crate) enum EndReason {
    Exited,
    Disposed,
    Failed(String),
}

#[derive(Debug)]
pub(crate) struct LiveState {
    /// Highest seq handed to the subscribers (every event up to it is
    /// committed). A subscriber attaching now replays up to it from the log
    /// and receives every later event on its channel.
    pub delivered_through: u64,
    pub subscribers: Vec<mpsc::Sender<ExecEvent>>,
    pub end: Option<EndReason>,
}

/// The shared face of a running exec.
#[derive(Debug)]
pub(crate) struct LiveExec {
    pub id: String,
    /// Set once the log has begun; needed only to replay (after seq 1 is
    /// delivered, which is after it is set).
    pub generation: OnceLock<u64>,
    pub control: mpsc::Sender<Control>,
    /// Set by `dispose` under the live-map lock.
    pub disposing: AtomicBool,
    /// The queue to the stdin writer while stdin is open; taking it closes
    /// stdin after the queued writes.
    pub stdin: Mutex<Option<mpsc::Sender<Input>>>,
    /// Started on a pseudo-terminal: signals reach its whole session.
    pub terminal: bool,
    pub state: Mutex<LiveState>,
    done: watch::Receiver<bool>,
    /// Most events ever in the pipeline at once (for the tests'
    /// memory-bound assertions).
    pub max_in_flight: AtomicUsize,
}

type Delivery = Pin<Box<dyn Future<Output = ()> + Send>>;

impl LiveExec {
    pub(crate) fn new(
        id: String,
        terminal: bool,
    ) -> (Arc<LiveExec>, mpsc::Receiver<Control>, watch::Sender<bool>) {
        let (control, control_rx) = mpsc::channel(CONTROL_CAPACITY);
        let (done_tx, done) = watch::channel(false);
        let live = Arc::new(LiveExec {
            id,
            generation: OnceLock::new(),
            control,
            disposing: AtomicBool::new(false),
            stdin: Mutex::new(None),
            terminal,
            state: Mutex::new(LiveState {
                delivered_through: 0,
                subscribers: Vec::new(),
                end: None,
            }),
            done,
            max_in_flight: AtomicUsize::new(0),
        });
        (live, control_rx, done_tx)
    }

    /// Waits until the runner has finished with this exec (its log is final
    /// or deleted), or is gone.
    pub(crate) async fn wait_done(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Marks `event` delivered and returns the future that hands it to every
    /// current subscriber (`None` if there is none). With `end`, the
    /// subscribers are detached after this last event.
    fn deliver(&self, event: ExecEvent, end: Option<EndReason>) -> Option<Delivery> {
        let senders = {
            let mut st = self.state.lock().expect("live state poisoned");
            st.delivered_through = event.seq;
            st.subscribers.retain(|s| !s.is_closed());
            match end {
                Some(reason) => {
                    st.end = Some(reason);
                    std::mem::take(&mut st.subscribers)
                }
                None => st.subscribers.clone(),
            }
        };
        let (last, rest) = senders.split_last()?;
        let (last, rest) = (last.clone(), rest.to_vec());
        Some(Box::pin(async move {
            // A send fails only if the subscriber went away; it is pruned at
            // the next delivery.
            for s in rest {
                let _ = s.send(event.clone()).await;
            }
            let _ = last.send(event).await;
        }))
    }

    /// Ends the live stream without an exit event; subscribers see `reason`.
    fn end(&self, reason: EndReason) {
        let mut st = self.state.lock().expect("live state poisoned");
        st.end = Some(reason);
        st.subscribers.clear();
    }
}

/// SIGKILLs the process group (a terminal's: its whole session) when
/// dropped while armed, so no command outlives its runner, even if the
/// runtime drops the task mid-flight.
struct GroupGuard {
    pgid: i32,
    /// A terminal's: signal its whole session.
    terminal: bool,
    armed: bool,
}

impl GroupGuard {
    fn kill(&self) {
        let kill = nix::sys::signal::Signal::SIGKILL as i32;
        let _ = if self.terminal {
            signal_terminal(self.pgid, kill)
        } else {
            signal_group(self.pgid, kill)
        };
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
        }
    }
}

/// A command's output streams: a pipe each, or one terminal as `out`.
type OutputStream = Pin<Box<dyn AsyncRead + Send>>;

/// The command's first process: a child of ours, or one the sandbox's
/// runner forked (which reports its end to us).
enum Leader {
    Host(Child),
    Sandboxed(SandboxedChild),
}

impl Leader {
    /// Its pid on the host: its process group's (and a terminal's
    /// session's) id. Valid until [`Leader::wait`] returned: the process is
    /// not reaped before.
    fn pid(&self) -> i32 {
        match self {
            Leader::Host(child) => child
                .id()
                .expect("a child that was not waited for has a pid")
                as i32,
            Leader::Sandboxed(child) => child.pid(),
        }
    }

    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            Leader::Host(child) => child.wait().await,
            Leader::Sandboxed(child) => child.wait().await,
        }
    }
}

struct Started {
    child: Leader,
    generation: u64,
    stdin_task: AbortOnDrop,
    out: Option<OutputStream>,
    err: Option<OutputStream>,
}

/// The command's process group, for the log (a daemon started after this
/// one crashed kills the group of each exec it finds lost). Not queued at
/// the spawn: it goes with the exec's first output, or on its own once the
/// command has run `ExecConfig::group_record_after`, so a short silent
/// command (the common `true`) costs the log no commit for it: a command
/// that exits sooner never needs it, its exit is logged, and a finished
/// exec's group is not looked for.
struct GroupRecord {
    generation: u64,
    pgid: i32,
    leader_start: Option<u64>,
}

/// Queues the group record unless it was already (it commits with the next
/// group).
async fn record_group(shared: &Shared, id: &str, record: &mut Option<GroupRecord>) {
    let Some(r) = record.take() else { return };
    if let Err(e) = shared
        .writer
        .spawned(id, r.generation, r.pgid, r.leader_start)
        .await
    {
        tracing::warn!(exec = %id, error = %e, "recording the exec's process group");
    }
}

/// Publishes "done" when dropped, whatever path the runner took.
struct DoneGuard(watch::Sender<bool>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.0.send_replace(true);
    }
}

/// Aborts the stdin writer with the runner.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(h) = &self.0 {
            h.abort();
        }
    }
}

enum Outcome {
    /// The leader exited and both pipes closed (or were abandoned); every
    /// event read is committed and delivered.
    Exited(i32),
    Disposed,
    LogFailed(ExecError),
}

/// The runner task. Reports the start (log begun, process spawned) on
/// `started`, then runs the exec to its end.
pub(crate) async fn run(
    shared: Arc<Shared>,
    live: Arc<LiveExec>,
    mut control_rx: mpsc::Receiver<Control>,
    done_tx: watch::Sender<bool>,
    spec: ExecSpec,
    started: oneshot::Sender<Result<(), ExecError>>,
) {
    let done = DoneGuard(done_tx);
    let timeout = spec.timeout;
    let Started {
        mut child,
        generation,
        stdin_task: _stdin_task,
        out,
        err,
    } = match start(&shared, &live, spec).await {
        Ok(started) => started,
        Err(e) => {
            live.end(EndReason::Failed(e.to_string()));
            shared.remove_live(&live);
            let _ = started.send(Err(e));
            return;
        }
    };
    let pgid = child.pid();
    let mut guard = GroupGuard {
        pgid,
        terminal: live.terminal,
        armed: true,
    };
    let _ = started.send(Ok(()));
    // Read now: the leader is not reaped yet (nobody waited), so its /proc
    // entry exists even if it already exited.
    let leader_start = process_start_time(pgid)
        .inspect_err(|e| tracing::warn!(exec = %live.id, pgid, error = %e, "reading the leader's start time"))
        .ok();
    let mut record = Some(GroupRecord {
        generation,
        pgid,
        leader_start,
    });
    tracing::debug!(exec = %live.id, pgid, "exec started");

    let mut seq = 0u64;
    let outcome = pump(
        &shared,
        &live,
        &mut child,
        (out, err),
        &mut control_rx,
        timeout,
        (&mut seq, &mut record),
    )
    .await;
    // From here on a kill finds nothing to signal (`ENOENT`: the group is
    // gone or going) and a dispose is picked up through `disposing`; closing
    // the channel makes their sends return at once instead of waiting on a
    // settle or on a subscriber that is slow to take the exit.
    drop(control_rx);
    match outcome {
        Outcome::Exited(code) => {
            // Members of the group that closed their output and kept running
            // would write behind the settle; an exec is one unit.
            guard.kill();
            guard.armed = false;
            finish(&shared, &live, seq, code, done).await;
        }
        Outcome::Disposed => {
            // SIGKILL was sent; reap the leader, bounded in case it is stuck
            // in uninterruptible sleep.
            let _ = tokio::time::timeout(shared.config.kill_grace, child.wait()).await;
            drop(guard);
            live.end(EndReason::Disposed);
            if let Err(e) = shared.writer.delete_generation(&live.id, generation).await {
                tracing::error!(exec = %live.id, error = %e, "deleting a disposed exec's log failed");
            }
            shared.remove_live(&live);
            tracing::debug!(exec = %live.id, "exec disposed");
        }
        Outcome::LogFailed(e) => {
            // Output that cannot be logged cannot be delivered either; stop
            // the command rather than run it blind. The log keeps no exit
            // event, so the next open records `EXIT_LOST` for it.
            tracing::error!(exec = %live.id, error = %e, "exec log write failed; killing the exec");
            drop(guard);
            live.end(EndReason::Failed(e.to_string()));
            shared.remove_live(&live);
        }
    }
}

async fn start(shared: &Shared, live: &LiveExec, spec: ExecSpec) -> Result<Started, ExecError> {
    let generation = shared.writer.begin(&live.id).await?;
    let _ = live.generation.set(generation);
    let spawned = match spec.program {
        Program::Shell {
            command,
            stdin,
            stdin_open,
        } => {
            spawn_shell(
                shared, live, &spec.cwd, spec.env, &command, stdin, stdin_open,
            )
            .await
        }
        Program::Pty { argv, size } => {
            spawn_pty(shared, live, &spec.cwd, spec.env, &argv, size).await
        }
    };
    match spawned {
        Ok((child, stdin_task, out, err)) => Ok(Started {
            child,
            generation,
            stdin_task,
            out,
            err,
        }),
        Err(e) => {
            // Leave no half-begun log behind: the call fails as a whole.
            let _ = shared.writer.delete_generation(&live.id, generation).await;
            Err(e)
        }
    }
}

type Spawned = (
    Leader,
    AbortOnDrop,
    Option<OutputStream>,
    Option<OutputStream>,
);

async fn spawn_shell(
    shared: &Shared,
    live: &LiveExec,
    cwd: &std::path::Path,
    env: Vec<(OsString, OsString)>,
    command: &str,
    stdin: Option<Vec<u8>>,
    stdin_open: bool,
) -> Result<Spawned, ExecError> {
    let piped_stdin = stdin.is_some() || stdin_open;
    let (child, stdin_pipe, out, err): (Leader, Option<InputPipe>, OutputStream, OutputStream) =
        match &shared.config.sandbox {
            Some(sandbox) => spawn_shell_sandboxed(sandbox, cwd, env, command, piped_stdin).await?,
            None => {
                let mut cmd = Command::new("/bin/sh");
                cmd.arg("-c")
                    .arg(command)
                    .current_dir(cwd)
                    .process_group(0)
                    .env_clear()
                    .envs(env)
                    .stdin(if piped_stdin {
                        Stdio::piped()
                    } else {
                        Stdio::null()
                    })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                let mut child = cmd
                    .spawn()
                    .map_err(|e| ExecError::io("spawning /bin/sh", e))?;
                let stdin_pipe = child.stdin.take().map(|p| Box::pin(p) as InputPipe);
                let out = Box::pin(child.stdout.take().expect("piped")) as OutputStream;
                let err = Box::pin(child.stderr.take().expect("piped")) as OutputStream;
                (Leader::Host(child), stdin_pipe, out, err)
            }
        };
    let queue = stdin_open.then(|| open_input_queue(live));
    let stdin_task = stdin_pipe.map(|mut pipe| {
        tokio::spawn(async move {
            // EPIPE just means the command exited without reading it all.
            if let Some(bytes) = stdin
                && pipe.write_all(&bytes).await.is_err()
            {
                return;
            }
            if let Some(mut queue) = queue {
                while let Some(input) = queue.recv().await {
                    // Only terminals get resizes queued.
                    let Input::Bytes(bytes) = input else { continue };
                    if pipe.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
            }
            let _ = pipe.shutdown().await;
        })
    });
    Ok((child, AbortOnDrop(stdin_task), Some(out), Some(err)))
}

/// A command's stdin, as we write it.
type InputPipe = Pin<Box<dyn tokio::io::AsyncWrite + Send>>;

/// `/bin/sh -c command` started by the sandbox's runner, on pipes we make.
async fn spawn_shell_sandboxed(
    sandbox: &Sandbox,
    cwd: &std::path::Path,
    env: Vec<(OsString, OsString)>,
    command: &str,
    piped_stdin: bool,
) -> Result<(Leader, Option<InputPipe>, OutputStream, OutputStream), ExecError> {
    use std::os::fd::AsFd;
    use tokio::net::unix::pipe;
    let pipe_err = |e: std::io::Error| ExecError::io("making the command's pipes", e);
    let new_pipe = || {
        rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(|e| pipe_err(e.into()))
    };
    let (in_theirs, in_ours) = if piped_stdin {
        let (r, w) = new_pipe()?;
        (r, Some(w))
    } else {
        let null = std::fs::File::open("/dev/null").map_err(pipe_err)?;
        (std::os::fd::OwnedFd::from(null), None)
    };
    let (out_ours, out_theirs) = new_pipe()?;
    let (err_ours, err_theirs) = new_pipe()?;
    let req = SpawnRequest {
        terminal: false,
        cwd: cwd.to_path_buf(),
        argv: vec!["/bin/sh".into(), "-c".into(), command.into()],
        env,
    };
    let child = sandbox
        .spawn(
            &req,
            &[in_theirs.as_fd(), out_theirs.as_fd(), err_theirs.as_fd()],
        )
        .await
        .map_err(|e| ExecError::io("starting /bin/sh in the sandbox", e))?;
    // Only the command may hold the other ends now: EOF when it is done.
    drop((in_theirs, out_theirs, err_theirs));
    let stdin_pipe = match in_ours {
        Some(w) => Some(Box::pin(pipe::Sender::from_owned_fd(w).map_err(pipe_err)?) as InputPipe),
        None => None,
    };
    let out = Box::pin(pipe::Receiver::from_owned_fd(out_ours).map_err(pipe_err)?) as OutputStream;
    let err = Box::pin(pipe::Receiver::from_owned_fd(err_ours).map_err(pipe_err)?) as OutputStream;
    Ok((Leader::Sandboxed(child), stdin_pipe, out, err))
}

/// Opens a pseudo-terminal of `size` and starts `argv` on it (sandboxed:
/// forked by the sandbox's runner, as the leader of a session of its own
/// with the terminal as its controlling one). The master's read half is
/// the output; its write half serves the input queue.
async fn spawn_pty(
    shared: &Shared,
    live: &LiveExec,
    cwd: &std::path::Path,
    env: Vec<(OsString, OsString)>,
    argv: &[String],
    size: PtySize,
) -> Result<Spawned, ExecError> {
    let pty_err = |what: &str, e: pty_process::Error| {
        ExecError::io(what, std::io::Error::other(e.to_string()))
    };
    let (pty, pts) = pty_process::open().map_err(|e| pty_err("opening a pseudo-terminal", e))?;
    pty.resize(pty_process::Size::new(size.rows, size.cols))
        .map_err(|e| pty_err("setting the terminal size", e))?;
    let child = match &shared.config.sandbox {
        Some(sandbox) => {
            use std::os::fd::AsFd;
            let req = SpawnRequest {
                terminal: true,
                cwd: cwd.to_path_buf(),
                argv: argv.iter().map(OsString::from).collect(),
                env,
            };
            let child = sandbox.spawn(&req, &[pts.as_fd()]).await.map_err(|e| {
                ExecError::io(
                    format!("starting {:?} on a terminal in the sandbox", argv[0]),
                    e,
                )
            })?;
            // The output ends (EIO) only once no slave is open: ours goes.
            drop(pts);
            Leader::Sandboxed(child)
        }
        None => Leader::Host(
            pty_process::Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir(cwd)
                .env_clear()
                .envs(env)
                .spawn(pts)
                .map_err(|e| pty_err(&format!("spawning {:?} on a terminal", argv[0]), e))?,
        ),
    };
    let (read, mut write) = pty.into_split();
    let mut queue = open_input_queue(live);
    let input_task = tokio::spawn(async move {
        while let Some(input) = queue.recv().await {
            let done = match input {
                Input::Bytes(bytes) => write.write_all(&bytes).await.is_err(),
                Input::Resize(s) => write
                    .resize(pty_process::Size::new(s.rows, s.cols))
                    .is_err(),
            };
            // The terminal hung up: the program is gone.
            if done {
                return;
            }
        }
    });
    Ok((
        child,
        AbortOnDrop(Some(input_task)),
        Some(Box::pin(TerminalOutput(read)) as OutputStream),
        None,
    ))
}

/// Opens the exec's input queue (`write_stdin`, `pty_write`, `pty_resize`)
/// and returns its receiving end.
fn open_input_queue(live: &LiveExec) -> mpsc::Receiver<Input> {
    let (tx, rx) = mpsc::channel(super::STDIN_QUEUE_DEPTH);
    *live.stdin.lock().expect("stdin lock poisoned") = Some(tx);
    rx
}

/// A terminal master's read half, where `EIO` (every slave descriptor is
/// closed: the session is gone) is the end of the output, as EOF is on a
/// pipe.
struct TerminalOutput(pty_process::OwnedReadPty);

impl AsyncRead for TerminalOutput {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match Pin::new(&mut self.0).poll_read(cx, buf) {
            std::task::Poll::Ready(Err(e))
                if e.raw_os_error() == Some(nix::errno::Errno::EIO as i32) =>
            {
                std::task::Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(sig)) => 128 + sig,
        (None, None) => EXIT_LOST,
    }
}

async fn read_pipe<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> std::io::Result<usize> {
    match pipe {
        Some(p) => p.read(buf).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

async fn poll_delivery(delivery: &mut Option<Delivery>) {
    match delivery {
        Some(d) => d.await,
        None => std::future::pending().await,
    }
}

/// Allocates the next seq and queues the event for commit, after the
/// group record if that is still to go (so it commits with the event).
async fn append(
    shared: &Shared,
    live: &LiveExec,
    (seq, record): (&mut u64, &mut Option<GroupRecord>),
    kind: EventKind,
) -> Result<oneshot::Receiver<Result<ExecEvent, ExecError>>, ExecError> {
    record_group(shared, &live.id, record).await;
    *seq += 1;
    shared
        .writer
        .append(ExecEvent {
            id: live.id.clone(),
            seq: *seq,
            kind,
            rev: 0,
        })
        .await
}

/// Runs the exec until its leader has exited, both pipes are closed and
/// every event read is committed and delivered.
async fn pump(
    shared: &Shared,
    live: &LiveExec,
    child: &mut Leader,
    (mut stdout, mut stderr): (Option<OutputStream>, Option<OutputStream>),
    control_rx: &mut mpsc::Receiver<Control>,
    timeout: Option<Duration>,
    (seq, record): (&mut u64, &mut Option<GroupRecord>),
) -> Outcome {
    let grace = shared.config.kill_grace;
    let id = live.id.as_str();
    // The leader is its group's (and a terminal's session's) id; it has a
    // pid until it is waited for, below.
    let pgid = child.pid();
    let mut out_buf = vec![0u8; READ_CHUNK_BYTES];
    let mut err_buf = vec![0u8; READ_CHUNK_BYTES];
    let mut pipeline = FuturesOrdered::new();
    let mut delivery: Option<Delivery> = None;
    let mut status: Option<i32> = None;
    let mut timeout_at = timeout.map(|t| Instant::now() + t);
    // SIGKILL to the group when a SIGTERM (or other signal) did not end it.
    let mut escalate_at: Option<Instant> = None;
    // After a SIGKILL, stop waiting for EOF on pipes that a process outside
    // the group (one that called setsid) still holds open.
    let mut abandon_at: Option<Instant> = None;
    let mut shutdown_seen = false;
    let mut control_open = true;
    let record_at = Instant::now() + shared.config.group_record_after;
    let terminal = live.terminal;
    let signal = |sig: i32| {
        let sent = if terminal {
            signal_terminal(pgid, sig)
        } else {
            signal_group(pgid, sig)
        };
        if let Err(e) = sent {
            tracing::warn!(exec = id, pgid, sig, error = %e, "signalling the process group failed");
        }
    };
    loop {
        let in_flight = pipeline.len() + usize::from(delivery.is_some());
        live.max_in_flight.fetch_max(in_flight, Ordering::Relaxed);
        if stdout.is_none()
            && stderr.is_none()
            && in_flight == 0
            && let Some(code) = status
        {
            return Outcome::Exited(code);
        }
        let can_read = in_flight < PIPELINE_DEPTH;
        tokio::select! {
            ctl = control_rx.recv(), if control_open => match ctl {
                Some(Control::Kill(sig)) => {
                    signal(sig);
                    if sig == nix::sys::signal::Signal::SIGKILL as i32 {
                        abandon_at.get_or_insert(Instant::now() + grace);
                    } else {
                        escalate_at.get_or_insert(Instant::now() + grace);
                    }
                }
                Some(Control::Dispose) => {
                    signal(nix::sys::signal::Signal::SIGKILL as i32);
                    return Outcome::Disposed;
                }
                None => control_open = false,
            },
            () = shared.shutdown.cancelled(), if !shutdown_seen => {
                shutdown_seen = true;
                signal(nix::sys::signal::Signal::SIGKILL as i32);
                abandon_at.get_or_insert(Instant::now() + grace);
            }
            () = sleep_until_opt(timeout_at), if timeout_at.is_some() => {
                timeout_at = None;
                tracing::info!(exec = id, "exec timed out; SIGTERM to its group");
                signal(nix::sys::signal::Signal::SIGTERM as i32);
                escalate_at.get_or_insert(Instant::now() + grace);
            }
            () = sleep_until_opt(escalate_at), if escalate_at.is_some() => {
                escalate_at = None;
                tracing::info!(exec = id, "exec still running after the kill grace; SIGKILL to its group");
                signal(nix::sys::signal::Signal::SIGKILL as i32);
                abandon_at.get_or_insert(Instant::now() + grace);
            }
            () = sleep_until_opt(abandon_at), if abandon_at.is_some() && status.is_some() => {
                abandon_at = None;
                if stdout.is_some() || stderr.is_some() {
                    tracing::warn!(exec = id, "output pipes held open by a process outside the group; closing them");
                    stdout = None;
                    stderr = None;
                }
            }
            () = tokio::time::sleep_until(record_at), if record.is_some() => {
                record_group(shared, id, record).await;
            }
            () = poll_delivery(&mut delivery), if delivery.is_some() => delivery = None,
            committed = pipeline.next(), if delivery.is_none() && !pipeline.is_empty() => match committed {
                Some(Ok(Ok(event))) => delivery = live.deliver(event, None),
                Some(Ok(Err(e))) => return Outcome::LogFailed(e),
                Some(Err(_)) => {
                    return Outcome::LogFailed(ExecError::Storage("the log writer dropped an append".into()));
                }
                None => {}
            },
            n = read_pipe(&mut stdout, &mut out_buf), if stdout.is_some() && can_read => match n {
                Ok(0) => stdout = None,
                Ok(n) => match append(shared, live, (&mut *seq, &mut *record), EventKind::Stdout(out_buf[..n].to_vec())).await {
                    Ok(committed) => pipeline.push_back(committed),
                    Err(e) => return Outcome::LogFailed(e),
                },
                Err(e) => {
                    tracing::warn!(exec = id, error = %e, "reading stdout failed");
                    stdout = None;
                }
            },
            n = read_pipe(&mut stderr, &mut err_buf), if stderr.is_some() && can_read => match n {
                Ok(0) => stderr = None,
                Ok(n) => match append(shared, live, (&mut *seq, &mut *record), EventKind::Stderr(err_buf[..n].to_vec())).await {
                    Ok(committed) => pipeline.push_back(committed),
                    Err(e) => return Outcome::LogFailed(e),
                },
                Err(e) => {
                    tracing::warn!(exec = id, error = %e, "reading stderr failed");
                    stderr = None;
                }
            },
            st = child.wait(), if status.is_none() => {
                status = Some(match st {
                    Ok(st) => exit_code(st),
                    Err(e) => {
                        tracing::error!(exec = id, error = %e, "waiting for the exec failed");
                        // Say why on the exec's own stderr (the sandbox's
                        // runner died, for one), not only in our log.
                        let note = format!("wsd: {e}\n").into_bytes();
                        match append(shared, live, (&mut *seq, &mut *record), EventKind::Stderr(note)).await {
                            Ok(committed) => pipeline.push_back(committed),
                            Err(e) => return Outcome::LogFailed(e),
                        }
                        EXIT_LOST
                    }
                });
                if terminal {
                    // The session leader is gone: what is left of its
                    // session (background jobs) holds the terminal open,
                    // and the output ends only when nothing does.
                    signal(nix::sys::signal::Signal::SIGKILL as i32);
                    abandon_at.get_or_insert(Instant::now() + grace);
                }
            }
        }
    }
}

/// Settles the workspace, logs the exit event and hands it out. `seq` is the
/// last output seq.
async fn finish(shared: &Shared, live: &Arc<LiveExec>, mut seq: u64, code: i32, done: DoneGuard) {
    // The store's rev after the settle; 0 ("not said") when it failed.
    let (rev, failure) = match (shared.settle)().await {
        Ok(rev) => (rev, None),
        Err(msg) => (0, Some(msg)),
    };
    if let Some(msg) = failure {
        // Readers treat `exit` as "the workspace has every write"; say on
        // the exec's own stderr that this time it may not.
        tracing::warn!(exec = %live.id, error = %msg, "settling the workspace before exit failed");
        let note = format!("wsd: settling the workspace failed: {msg}\n").into_bytes();
        // The group is gone: nothing to record with the note.
        let logged =
            match append(shared, live, (&mut seq, &mut None), EventKind::Stderr(note)).await {
                Ok(committed) => committed.await.ok().and_then(Result::ok),
                Err(_) => None,
            };
        match logged {
            Some(event) => {
                if let Some(d) = live.deliver(event, None) {
                    d.await;
                }
            }
            // The exit below cannot follow a seq gap; give up like a log failure.
            None => {
                live.end(EndReason::Failed(
                    "writing the settle failure note failed".into(),
                ));
                shared.remove_live(live);
                return;
            }
        }
    }
    let exit_seq = seq + 1;
    let logged = shared.writer.finish(&live.id, exit_seq, code).await;
    // Leave the live map before handing out the exit: a subscriber that is
    // not reading must not keep the id busy. A `get` from here on replays
    // the (committed) exit from the log.
    let disposing = shared.remove_live(live);
    match logged {
        Err(e) => {
            tracing::error!(exec = %live.id, error = %e, "logging the exit event failed");
            live.end(EndReason::Failed(e.to_string()));
        }
        Ok(()) if disposing => {
            live.end(EndReason::Disposed);
            let generation = live.generation.get().copied().unwrap_or_default();
            if let Err(e) = shared.writer.delete_generation(&live.id, generation).await {
                tracing::error!(exec = %live.id, error = %e, "deleting a disposed exec's log failed");
            }
            // `dispose` returns after this: the log is gone.
            drop(done);
        }
        Ok(()) => {
            // Nobody waits on `done` for an exec that was not disposed; free
            // it before a stalled subscriber can delay it.
            drop(done);
            tracing::debug!(exec = %live.id, code, "exec exited");
            let exit = ExecEvent {
                id: live.id.clone(),
                seq: exit_seq,
                kind: EventKind::Exit(code),
                rev,
            };
            if let Some(d) = live.deliver(exit, Some(EndReason::Exited)) {
                d.await;
            }
        }
    }
}
