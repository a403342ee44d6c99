//! A workspace's wsd backend: where it is ([`Backend`]) and, for a local
//! one, the child process the kernel starts, restarts with backoff and
//! stops when idle ([`BackendState`]). Owned under the workspace's bracket
//! lock, so one caller at a time starts or talks to it.
//!
//! A local child runs in a process group of its own and its pid is kept
//! in `wsd.pid`, so it outlives a kernel that crashes; a graceful shutdown
//! stops it unless a terminal runs in it ([`BackendState::leave_running`]).
//! The next kernel stops such a leftover before it starts a new child,
//! except where a terminal still runs in it: there it adopts the leftover
//! ([`BackendState::adopt_leftover`]) and the terminal goes on.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::{Duration, Instant};

use wsd_client::{
    ClientOptions, DEFAULT_CALL_TIMEOUT, DEFAULT_CONNECT_TIMEOUT, DEFAULT_HANDSHAKE_TIMEOUT,
    Endpoint, WsdHandle,
};

use crate::error::KernelError;

/// How a workspace reaches its wsd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// The kernel runs `wsd serve` on a unix socket under the workspace dir.
    Local,
    /// A wsd already running elsewhere (e.g. in a container).
    Remote {
        address: String,
        token_file: PathBuf,
    },
}

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
    child: Option<LocalChild>,
    /// The connection to the wsd, made after the child (re)starts.
    handle: Option<WsdHandle>,
    /// Last time a bracket used the wsd (the idle reaper reads it).
    last_used: Instant,
    /// Consecutive starts that did not stay up; drives the backoff.
    restarts: u32,
    last_start: Option<Instant>,
    /// A local child runs with `wsd serve --sandbox`.
    sandbox: bool,
    /// The deadline of every wsd call (`KernelConfig::wsd_timeout`).
    call_timeout: Duration,
}

/// A local wsd process: started by this kernel, or adopted from the
/// kernel before it (not this kernel's child: watched and signalled by
/// pid).
#[derive(Debug)]
enum LocalChild {
    Spawned(tokio::process::Child),
    Adopted(i32),
}

impl LocalChild {
    fn alive(&mut self) -> bool {
        match self {
            LocalChild::Spawned(c) => matches!(c.try_wait(), Ok(None)),
            LocalChild::Adopted(pid) => process_alive(*pid),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            LocalChild::Spawned(c) => c.id(),
            LocalChild::Adopted(pid) => u32::try_from(*pid).ok(),
        }
    }

    /// Stops the process and waits (bounded) for its exit.
    async fn stop(self) {
        match self {
            LocalChild::Spawned(mut c) => {
                let _ = c.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(5), c.wait()).await;
            }
            LocalChild::Adopted(pid) => terminate(pid).await,
        }
    }
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
            sandbox: false,
            call_timeout: DEFAULT_CALL_TIMEOUT,
        }
    }

    /// The deadline of every call to the wsd: one that does not answer
    /// within it (frozen, or cut off with its connection still open) fails
    /// the call instead of holding it. Dial and handshake get at most the
    /// client's defaults.
    pub fn with_call_timeout(mut self, timeout: Duration) -> BackendState {
        self.call_timeout = timeout;
        self
    }

    /// Whether a local child sandboxes its commands (`wsd serve --sandbox`).
    pub fn with_sandbox(mut self, sandbox: bool) -> BackendState {
        self.sandbox = sandbox;
        self
    }

    /// The local child's socket path.
    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("wsd.sock")
    }

    /// The process id of the local child, if running.
    pub fn child_pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(LocalChild::pid)
    }

    /// Takes over the local wsd a crashed kernel left running for this
    /// workspace, if there is one, it runs this kernel's wsd binary and
    /// sandbox setting, and no child runs yet: the terminals in it go on.
    /// Whether there is one now (`handle` then connects to it; one that
    /// does not answer is stopped and replaced).
    pub fn adopt_leftover(&mut self, wsd_bin: &Path) -> bool {
        if self.backend != Backend::Local {
            return false;
        }
        if let Some(c) = self.child.as_mut() {
            return c.alive();
        }
        let Some(pid) = leftover_pid(&self.dir.join("wsd.pid"), &self.socket_path()) else {
            return false;
        };
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok();
        let same_bin = exe.is_some_and(|e| std::fs::canonicalize(wsd_bin).is_ok_and(|b| b == e));
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let sandboxed = cmdline.split(|b| *b == 0).any(|a| a == b"--sandbox");
        if !same_bin || sandboxed != self.sandbox {
            tracing::info!(pid, dir = %self.dir.display(), same_bin, sandboxed, "not adopting a leftover wsd that differs from this kernel's");
            return false;
        }
        tracing::info!(pid, dir = %self.dir.display(), "adopting the wsd a previous kernel left running");
        self.child = Some(LocalChild::Adopted(pid));
        self.handle = None;
        // Not a restart: no backoff if it dies now.
        self.last_start = None;
        true
    }

    /// Stops a local wsd an earlier kernel left running for this workspace
    /// that [`BackendState::adopt_leftover`] would not take (another wsd
    /// binary or sandbox setting): its terminals cannot be driven, and
    /// nothing else would stop it until the workspace is next used.
    pub async fn stop_leftover(&mut self) {
        if self.backend == Backend::Local && self.child.is_none() {
            stop_stale_child(&self.dir.join("wsd.pid"), &self.socket_path()).await;
        }
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
                let alive = self.child.as_mut().is_some_and(LocalChild::alive);
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
        let mut command = tokio::process::Command::new(wsd_bin);
        command.arg("serve");
        if self.sandbox {
            command.arg("--sandbox");
        }
        // A group of its own: a signal to the kernel's group (a Ctrl-C in
        // its terminal) reaches the kernel, which stops it in order.
        let child = command
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
            .process_group(0)
            .spawn()
            .map_err(|e| {
                KernelError::Unavailable(format!("cannot start {}: {e}", wsd_bin.display()))
            })?;
        if let Some(pid) = child.id()
            && let Err(e) = std::fs::write(self.dir.join("wsd.pid"), pid.to_string())
        {
            tracing::warn!(dir = %self.dir.display(), error = %e, "cannot record the wsd pid");
        }
        self.child = Some(LocalChild::Spawned(child));
        self.last_start = Some(Instant::now());
        let deadline = Instant::now() + WSD_START_DEADLINE;
        loop {
            if tokio::net::UnixStream::connect(&sock).await.is_ok() {
                tracing::info!(dir = %self.dir.display(), "local wsd started");
                return Ok(());
            }
            if let Some(LocalChild::Spawned(c)) = self.child.as_mut()
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
            connect_timeout: self.call_timeout.min(DEFAULT_CONNECT_TIMEOUT),
            handshake_timeout: self.call_timeout.min(DEFAULT_HANDSHAKE_TIMEOUT),
            call_timeout: self.call_timeout,
            ..ClientOptions::default()
        };
        let h = match WsdHandle::connect(endpoint, opts).await {
            Ok(h) => h,
            Err(e) => {
                // An adopted wsd that does not answer (or not to our token)
                // is stopped: the next call starts a child of our own.
                if matches!(self.child, Some(LocalChild::Adopted(_))) {
                    self.stop().await;
                }
                return Err(KernelError::Unavailable(format!(
                    "connecting to wsd at {}: {e}",
                    addr.endpoint
                )));
            }
        };
        self.handle = Some(h.clone());
        Ok(h)
    }

    /// Whether a local child runs and has been unused for `idle`.
    pub fn idle_child(&mut self, idle: Duration) -> bool {
        let alive = self.child.as_mut().is_some_and(LocalChild::alive);
        alive && self.last_used.elapsed() >= idle
    }

    /// Lets go of the local child without stopping it (kernel shutdown
    /// while a terminal runs in it): it keeps running in its own process
    /// group, its pid in `wsd.pid`, for the next kernel to adopt. Its pid,
    /// if one was running.
    pub fn leave_running(&mut self) -> Option<u32> {
        self.handle = None;
        let mut child = self.child.take()?;
        if !child.alive() {
            return None;
        }
        let pid = child.pid();
        if let LocalChild::Spawned(c) = child {
            // Dropping a `Child` spawned with `kill_on_drop` kills it; this
            // one must outlive the kernel, as after a crash.
            std::mem::forget(c);
        }
        pid
    }

    /// Stops the local child, if any.
    pub async fn stop(&mut self) {
        self.handle = None;
        if let Some(c) = self.child.take() {
            c.stop().await;
        }
    }
}

/// Stops a wsd left running for this workspace by a kernel that died
/// without stopping it (SIGKILL, crash): the pid recorded at its start,
/// only if that process still serves this workspace's socket (a recycled
/// pid belongs to someone else and is left alone).
async fn stop_stale_child(pid_file: &Path, sock: &Path) {
    let Some(pid) = leftover_pid(pid_file, sock) else {
        return;
    };
    tracing::warn!(pid, socket = %sock.display(), "stopping a wsd left over from an earlier kernel");
    terminate(pid).await;
}

/// The pid recorded in `pid_file` if that process is alive and serves
/// socket `sock` (a recycled pid belongs to someone else).
fn leftover_pid(pid_file: &Path, sock: &Path) -> Option<i32> {
    let pid = std::fs::read_to_string(pid_file)
        .ok()
        .and_then(|t| t.trim().parse::<i32>().ok())?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let want = format!("unix:{}", sock.display());
    let ours = cmdline.split(|b| *b == 0).any(|arg| arg == want.as_bytes());
    (ours && process_alive(pid)).then_some(pid)
}

/// SIGTERM to wsd `pid` (not this kernel's child), SIGKILL after a grace,
/// and waits for its exit: it holds the workspace's lock until it has
/// exited, and a new child refuses to start beside it.
async fn terminate(pid: i32) {
    let Some(p) = rustix::process::Pid::from_raw(pid) else {
        return;
    };
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
            tracing::warn!(
                pid,
                "the leftover wsd is still there after SIGKILL; going on"
            );
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
    f.write_all(crate::domains::accounts::random_hex(32).as_bytes())
        .map_err(|e| KernelError::internal(&format!("writing {}", path.display()), e))
}
