//! The kernel value every connection and handler shares: configuration,
//! the database, the system store, the workspaces, the connection pool and
//! the syscall table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use wsd_dofs::Dofs;

use crate::accounts;
use crate::db::Db;
use crate::dispatch::{self, Dispatch};
use crate::error::KernelError;
use crate::routing::Router;
use crate::session::ConnectionPool;
use crate::workspace::Workspaces;

/// The protocol version this kernel speaks (`sys.connect` `protocol`).
pub const PROTOCOL: i64 = 2;

/// Kernel settings (`gsv serve` flags).
#[derive(Debug, Clone)]
pub struct KernelConfig {
    /// Everything lives under here (see ARCHITECTURE.md, "kernel").
    pub data_dir: PathBuf,
    /// A socket that has not completed `sys.connect` by then is closed.
    pub handshake_timeout: Duration,
    /// Sockets that have not authenticated yet, at most; separate from
    /// `max_connections` so idle or slow peers cost only themselves.
    pub max_pending: usize,
    /// Authenticated sockets, at most.
    pub max_connections: usize,
    /// Largest text frame; larger closes the socket with 1009.
    pub max_frame_bytes: usize,
    /// The `wsd` binary for local workspaces.
    pub wsd_bin: PathBuf,
    /// How long `shell.exec` waits for a command before answering `running`.
    pub exec_wait: Duration,
    /// TTL of a routed call other than `shell.exec` (reference §3.5: 60 s).
    pub routed_call_ttl: Duration,
    /// A local wsd unused this long (and running nothing) is stopped.
    pub wsd_idle_stop: Duration,
}

impl KernelConfig {
    /// Defaults for a data directory.
    pub fn new(data_dir: PathBuf) -> KernelConfig {
        KernelConfig {
            data_dir,
            handshake_timeout: Duration::from_secs(10),
            max_pending: 64,
            max_connections: 4096,
            max_frame_bytes: 16 << 20,
            wsd_bin: default_wsd_bin(),
            exec_wait: Duration::from_secs(5),
            routed_call_ttl: Duration::from_secs(60),
            wsd_idle_stop: Duration::from_secs(10 * 60),
        }
    }
}

/// `wsd` beside the running executable, else `wsd` on `PATH`.
pub fn default_wsd_bin() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("wsd")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("wsd"))
}

/// The shared kernel.
#[derive(Debug)]
pub struct Kernel {
    pub config: KernelConfig,
    pub db: Db,
    /// The `/home`, `/etc`, `/var`, `/root` tree.
    pub system: Arc<Mutex<Dofs>>,
    pub workspaces: Workspaces,
    pub pool: ConnectionPool,
    /// Live device drivers and routed calls waiting for them.
    pub router: Router,
    /// Live `shell.exec` sessions.
    pub sessions: crate::syscalls::shell::Sessions,
    pub dispatch: Dispatch,
    /// Active agent runs (the rest of a process is rows).
    pub procs: crate::proc::Procs,
    /// Permits for sockets that have not authenticated yet.
    pub pending: Arc<Semaphore>,
    /// Permits for authenticated sockets.
    pub connected: Arc<Semaphore>,
    /// Failed logins per (username, address), for the growing delay.
    pub login_failures: Mutex<HashMap<(String, IpAddr), u32>>,
}

impl Kernel {
    /// Opens (creating) the data directory: database, system store, root's
    /// accounts.
    pub async fn open(config: KernelConfig) -> Result<Arc<Kernel>, KernelError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(dir.join("workspaces"))
            .map_err(|e| KernelError::internal(&format!("creating {}", dir.display()), e))?;
        let db = Db::open(&dir.join("kernel.sqlite3"))?;
        db.call(accounts::bootstrap).await?;
        db.call(crate::routing::reset_at_start).await?;
        let sys_path = dir.join("system.dofs");
        let system = tokio::task::spawn_blocking(move || Dofs::open(&sys_path))
            .await
            .map_err(|e| KernelError::internal("opening system.dofs", e))?
            .map_err(|e| KernelError::internal("opening system.dofs", e))?;
        let system = Arc::new(Mutex::new(system));
        crate::syscalls::fs::ensure_dir(&system, "root").await?;
        let kernel = Arc::new(Kernel {
            workspaces: Workspaces::new(dir.join("workspaces"), config.wsd_bin.clone()),
            pending: Arc::new(Semaphore::new(config.max_pending)),
            connected: Arc::new(Semaphore::new(config.max_connections)),
            config,
            db,
            system,
            pool: ConnectionPool::default(),
            router: Router::default(),
            sessions: Default::default(),
            dispatch: dispatch::table(),
            procs: crate::proc::Procs::default(),
            login_failures: Mutex::new(HashMap::new()),
        });
        tokio::spawn(reap_idle_children(Arc::downgrade(&kernel)));
        crate::proc::recover(&kernel).await?;
        Ok(kernel)
    }

    /// Stops local `wsd` children (the kernel is going away).
    pub async fn shutdown(&self) {
        self.workspaces.shutdown().await;
    }
}

/// Stops idle local wsd children now and then; ends with the kernel.
async fn reap_idle_children(kernel: std::sync::Weak<Kernel>) {
    loop {
        let every = match kernel.upgrade() {
            Some(k) => (k.config.wsd_idle_stop / 4)
                .clamp(Duration::from_millis(50), Duration::from_secs(30)),
            None => return,
        };
        tokio::time::sleep(every).await;
        let Some(k) = kernel.upgrade() else { return };
        let idle = k.config.wsd_idle_stop;
        k.workspaces
            .stop_idle(idle, |id| k.sessions.running_in(id))
            .await;
    }
}
