//! `wsd serve`: wires the workspace store, the exec runner and the RPC
//! server together, and runs them until a shutdown signal.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;

use crate::exec::{self, ExecConfig, ExecManager, SettleHook};
use crate::rpc::{
    Backend, ExecBackend, ExecEvent, ExecEvents, ExecRequest, ExecSignal, Listener, PtyRequest,
    ResumeFrom, ServeError, ServerConfig, Token, WireError,
};
use crate::store::{StoreError, StoreOptions, WorkspaceStore};
use wsd_sync::Store;

/// Everything `wsd serve` needs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub root: PathBuf,
    pub state_dir: PathBuf,
    /// `host:port` or `unix:/path`, at least one.
    pub listen: Vec<String>,
    pub token: Option<Token>,
    pub store: StoreOptions,
    /// Output bytes retained per exec log ([`ExecConfig::per_exec_cap`]);
    /// older events are evicted first. `None`: the default (16 MiB).
    pub exec_log_cap: Option<u64>,
    /// How long a new connection has to complete `Bootstrap.connect`;
    /// `None`: [`ServerConfig`]'s default (10 s).
    pub handshake_timeout: Option<std::time::Duration>,
    /// Run every exec under bubblewrap (`wsd serve --sandbox`). The state
    /// directory and unix-socket listeners are added to its hidden paths.
    pub sandbox: Option<exec::SandboxConfig>,
    /// How often acknowledged tombstones are pruned; `None`: [`PRUNE_EVERY`].
    pub prune_every: Option<std::time::Duration>,
}

impl DaemonConfig {
    /// `root` served on one loopback listener on a free port, state in
    /// `state_dir`, no token, no sandbox, every other setting its default:
    /// the daemon a test, a benchmark or an embedding program starts.
    pub fn local(root: PathBuf, state_dir: PathBuf) -> DaemonConfig {
        DaemonConfig {
            root,
            state_dir,
            listen: vec!["127.0.0.1:0".to_owned()],
            token: None,
            store: StoreOptions::default(),
            exec_log_cap: None,
            handshake_timeout: None,
            sandbox: None,
            prune_every: None,
        }
    }
}

/// [`run`] on a thread of its own, with the current-thread runtime and
/// `LocalSet` that `wsd serve` uses, for a program (a test, a benchmark)
/// that embeds the daemon beside its own runtime. Stopped gracefully and
/// joined when dropped.
#[derive(Debug)]
pub struct Background {
    /// The bound addresses, in the order of [`DaemonConfig::listen`].
    pub addrs: Vec<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), DaemonError>>>,
}

impl Background {
    /// Starts the daemon and returns once it listens, or with the error
    /// that kept it from starting.
    pub fn start(config: DaemonConfig) -> Result<Background, DaemonError> {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("wsd-daemon".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|source| DaemonError::Runtime { source })?;
                tokio::task::LocalSet::new().block_on(
                    &rt,
                    run(
                        config,
                        |addrs| {
                            let _ = addr_tx.send(addrs.to_vec());
                        },
                        async {
                            let _ = stopped.await;
                        },
                    ),
                )
            })
            .map_err(|source| DaemonError::Runtime { source })?;
        match addr_rx.recv() {
            Ok(addrs) => Ok(Background {
                addrs,
                stop: Some(stop),
                thread: Some(thread),
            }),
            // It ended before listening: its error says why.
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => Err(DaemonError::Runtime {
                    source: std::io::Error::other("the daemon stopped before it listened"),
                }),
                Err(panic) => std::panic::resume_unwind(panic),
            },
        }
    }

    /// The first bound address.
    pub fn addr(&self) -> &str {
        &self.addrs[0]
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    #[error("opening the workspace {root}: {source}")]
    Store { root: PathBuf, source: StoreError },
    #[error("opening the exec log {path}: {source}")]
    Exec {
        path: PathBuf,
        source: exec::ExecError,
    },
    #[error("listening on {addr}: {source}")]
    Listen {
        addr: String,
        source: std::io::Error,
    },
    #[error(
        "another wsd serve is already running on {path} (one daemon per workspace root and state directory)"
    )]
    AlreadyRunning { path: PathBuf },
    #[error("locking {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Sandbox(#[from] exec::SandboxError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("starting the daemon's thread: {source}")]
    Runtime { source: std::io::Error },
}

/// Advisory locks held for the daemon's lifetime: one daemon per root and
/// per state directory. `flock` on the directories themselves, so nothing
/// is written into the synced tree; the kernel drops them when the process
/// dies, however it dies.
#[derive(Debug)]
struct WorkspaceLock(#[allow(dead_code)] std::fs::File);

impl WorkspaceLock {
    fn acquire(dir: &std::path::Path) -> Result<WorkspaceLock, DaemonError> {
        let lock_err = |source| DaemonError::Lock {
            path: dir.to_path_buf(),
            source,
        };
        let f = std::fs::File::open(dir).map_err(lock_err)?;
        match f.try_lock() {
            Ok(()) => Ok(WorkspaceLock(f)),
            Err(std::fs::TryLockError::WouldBlock) => Err(DaemonError::AlreadyRunning {
                path: dir.to_path_buf(),
            }),
            Err(std::fs::TryLockError::Error(e)) => Err(lock_err(e)),
        }
    }
}

/// Name of the exec log database in the state directory.
pub const EXEC_DB_FILE: &str = "exec.sqlite3";

/// Runs the daemon until `shutdown` resolves, then stops accepting, lets the
/// in-flight store transaction finish and stops the exec runner. Must run
/// inside a [`tokio::task::LocalSet`]. `on_listening` gets the bound
/// addresses (useful with port 0).
pub async fn run(
    config: DaemonConfig,
    on_listening: impl FnOnce(&[String]),
    shutdown: impl Future<Output = ()>,
) -> Result<(), DaemonError> {
    // Order matters: lock, then bind, then open the databases, so a daemon
    // that cannot start (already running, address taken) leaves nothing on
    // disk beyond the state directory itself.
    let _root_lock = WorkspaceLock::acquire(&config.root)?;
    std::fs::create_dir_all(&config.state_dir).map_err(|source| DaemonError::Lock {
        path: config.state_dir.clone(),
        source,
    })?;
    let _state_lock = WorkspaceLock::acquire(&config.state_dir)?;
    let mut listeners = Vec::new();
    let mut bound = Vec::new();
    for addr in &config.listen {
        let l = Listener::bind(addr)
            .await
            .map_err(|source| DaemonError::Listen {
                addr: addr.clone(),
                source,
            })?;
        bound.push(l.local_addr().unwrap_or_else(|_| addr.clone()));
        listeners.push(l);
    }
    let store = WorkspaceStore::open(&config.root, &config.state_dir, config.store.clone())
        .map_err(|source| DaemonError::Store {
            root: config.root.clone(),
            source,
        })?;
    let root = store.root().to_owned();
    let hint = Arc::new(tokio::sync::Notify::new());
    store.set_change_hook({
        let hint = hint.clone();
        move |_: Option<&std::path::Path>| hint.notify_one()
    });
    let backend = Backend::new(store)?.with_root(root).with_change_hint(hint);
    let caller = backend.store_caller();
    let settle: SettleHook = Arc::new(move || {
        let caller = caller.clone();
        Box::pin(async move {
            caller
                .call(|s| {
                    s.settle()?;
                    s.current_rev()
                })
                .await
                .map_err(|e| e.to_string())
        })
    });
    let exec_db = config.state_dir.join(EXEC_DB_FILE);
    let mut exec_config = ExecConfig::new(&config.root, &exec_db);
    if let Some(cap) = config.exec_log_cap {
        exec_config.per_exec_cap = cap;
    }
    if let Some(sandbox) = &config.sandbox {
        let mut sandbox = sandbox.clone();
        sandbox.hidden.push(config.state_dir.clone());
        sandbox.hidden.extend(
            config
                .listen
                .iter()
                .filter_map(|addr| addr.strip_prefix("unix:"))
                .map(PathBuf::from),
        );
        let sandbox = exec::Sandbox::new(&config.root, &sandbox)?;
        tracing::info!(network = ?config.sandbox.as_ref().map(|s| s.network), "commands run sandboxed (bwrap)");
        exec_config.sandbox = Some(sandbox);
    }
    let manager = ExecManager::open(exec_config, settle).map_err(|source| DaemonError::Exec {
        path: exec_db,
        source,
    })?;
    let backend = backend.with_exec(ExecAdapter(manager.clone()));
    let pruner = tokio::task::spawn_local(prune_periodically(
        backend.store_caller(),
        config.prune_every.unwrap_or(PRUNE_EVERY),
    ));
    on_listening(&bound);
    let mut server_config = ServerConfig {
        token: config.token.clone(),
        ..ServerConfig::default()
    };
    if let Some(t) = config.handshake_timeout {
        server_config.handshake_timeout = t;
    }
    tracing::info!(root = %config.root.display(), state = %config.state_dir.display(), "serving");
    let result = crate::rpc::serve(listeners, backend, server_config, shutdown).await;
    pruner.abort();
    manager.close().await;
    result.map(|_| ()).map_err(DaemonError::from)
}

/// How often the daemon prunes the tombstones every registered peer has
/// acknowledged (never one a peer still needs: `prune_tombstones`).
pub const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Prunes every `every` on the store thread, until the server stops (then
/// the store calls fail and the task is aborted).
async fn prune_periodically(
    store: crate::rpc::StoreCaller<WorkspaceStore>,
    every: std::time::Duration,
) {
    loop {
        tokio::time::sleep(every).await;
        let caller = store.clone();
        let done =
            tokio::task::spawn_blocking(move || caller.call_blocking(|s| s.prune_tombstones()))
                .await;
        match done {
            Ok(Ok(0)) => {}
            Ok(Ok(pruned)) => tracing::info!(pruned, "pruned tombstones"),
            Ok(Err(e)) => tracing::warn!(error = %e, "pruning tombstones"),
            Err(e) => tracing::warn!(error = %e, "pruning tombstones"),
        }
    }
}

/// The exec runner as the RPC server's shell half sees it.
struct ExecAdapter(ExecManager);

/// One subscription, converted event by event.
struct EventsAdapter(exec::Subscription);

fn wire(e: exec::ExecError) -> WireError {
    let error = WireError::new(e.code(), e.detail());
    match e.subject() {
        Some(subject) => error.with_subject(subject),
        None => error,
    }
}

impl ExecEvents for EventsAdapter {
    async fn next(&mut self) -> Result<Option<ExecEvent>, WireError> {
        match self.0.next().await {
            None => Ok(None),
            Some(Err(e)) => Err(wire(e)),
            Some(Ok(e)) => Ok(Some(e)),
        }
    }
}

impl ExecBackend for ExecAdapter {
    type Events = EventsAdapter;

    async fn exec(&self, r: ExecRequest) -> Result<(String, EventsAdapter), WireError> {
        let (id, sub) = self.0.exec(r).await.map_err(wire)?;
        Ok((id, EventsAdapter(sub)))
    }

    async fn get(&self, id: &str, from: ResumeFrom) -> Result<EventsAdapter, WireError> {
        let after = match from {
            ResumeFrom::Start => exec::After::All,
            ResumeFrom::After(n) => exec::After::Seq(n),
            ResumeFrom::Tail => exec::After::Tail,
        };
        Ok(EventsAdapter(self.0.get(id, after).await.map_err(wire)?))
    }

    async fn kill(&self, id: &str, signal: ExecSignal) -> Result<(), WireError> {
        self.0.signal(id, signal).await.map_err(wire)
    }

    async fn dispose(&self, id: &str) -> Result<(), WireError> {
        self.0.dispose(id).await.map_err(wire)
    }

    async fn write_stdin(&self, id: &str, bytes: Vec<u8>) -> Result<(), WireError> {
        self.0.write_stdin(id, bytes).await.map_err(wire)
    }

    async fn close_stdin(&self, id: &str) -> Result<(), WireError> {
        self.0.close_stdin(id).await.map_err(wire)
    }

    async fn live(&self) -> Vec<String> {
        self.0.live_ids()
    }

    async fn start_pty(&self, r: PtyRequest) -> Result<(String, EventsAdapter), WireError> {
        let (id, sub) = self.0.start_pty(r).await.map_err(wire)?;
        Ok((id, EventsAdapter(sub)))
    }

    async fn pty_write(&self, id: &str, bytes: Vec<u8>) -> Result<(), WireError> {
        self.0.pty_write(id, bytes).await.map_err(wire)
    }

    async fn pty_resize(&self, id: &str, cols: u16, rows: u16) -> Result<(), WireError> {
        self.0.pty_resize(id, cols, rows).await.map_err(wire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_errors_carry_their_code_once() {
        let e = wire(exec::ExecError::NotFound { id: "x".into() });
        assert_eq!(e.code, wsd_sync::ErrorCode::NotFound);
        assert_eq!(e.message, "no exec with id \"x\"");
        assert_eq!(e.to_string(), "ENOENT: no exec with id \"x\"");
        assert_eq!(e.subject.as_deref(), Some("x"));
    }
}
