//! The kernel value every connection and handler shares: configuration,
//! the database, the system store, the workspaces, the connection pool,
//! the live routes, shell sessions and process runs, and the syscall table.
//!
//! This is state only: every field's type comes from a module below this
//! one, and the operations that take a `Kernel` (routing, syscalls,
//! processes, the server) sit above it. Building one is `boot`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use wsd_dofs::Dofs;

use crate::db::Db;
use crate::dispatch::Dispatch;
use crate::domains::device::Devices;
use crate::domains::mcp::live::McpServers;
use crate::domains::oauth::OAuth;
use crate::domains::proc::SignalListeners;
use crate::domains::proc::active::Procs;
use crate::domains::shell::sessions::Sessions;
use crate::domains::snapshot::mirror::{ChunkStoreConfig, SnapshotMirror};
use crate::domains::timers::TimerWake;
use crate::domains::watch::Watches;
use crate::domains::workspace::Workspaces;
use crate::routing::router::Router;
use crate::session::ConnectionPool;

pub use gsv_protocol::PROTOCOL;

/// Kernel settings (`gsv serve` flags).
#[derive(Debug, Clone)]
pub struct KernelConfig {
    /// Everything lives under here (see kernel/DESIGN.md, "On disk").
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
    /// Start local workspaces' wsd with `--sandbox`, so an agent's commands
    /// see only their workspace, not the host (`gsv serve --no-sandbox`
    /// turns it off).
    pub wsd_sandbox: bool,
    /// How long `shell.exec` waits for a command before answering `running`.
    pub exec_wait: Duration,
    /// TTL of a routed call other than `shell.exec` (reference §3.5: 60 s).
    pub routed_call_ttl: Duration,
    /// TTL of a call forwarded to an adapter's service connection
    /// (`gsv serve --adapter-timeout`): 504 after it.
    pub adapter_timeout: Duration,
    /// A local wsd unused this long (and running nothing) is stopped.
    pub wsd_idle_stop: Duration,
    /// The deadline of every call to a workspace's wsd (`gsv serve
    /// --wsd-timeout`): a wsd that does not answer within it (frozen, or
    /// cut off with its connection open) fails the call, and a running
    /// command's session once its events stay quiet that long and a status
    /// call gets no answer either.
    pub wsd_timeout: Duration,
    /// Snapshots one workspace may hold; one more is `ELIMIT`.
    pub snapshot_limit: u64,
    /// How often the kernel collects garbage in every workspace store
    /// (`None`: only on `sys.gc`).
    pub gc_interval: Option<Duration>,
    /// Chunks stored more recently than this are never collected: a push
    /// or snapshot that stored (or found) a chunk and has not recorded
    /// its reference yet cannot lose it to a collection running meanwhile.
    pub gc_grace: Duration,
    /// An object store snapshots are mirrored to (`None`: the workspaces'
    /// own stores only, the embedded default).
    pub chunk_store: Option<ChunkStoreConfig>,
    /// How long one CodeMode block may run.
    pub codemode_deadline: Duration,
    /// How often tombstones are pruned (kernel/PROTOCOL.md §10).
    pub prune_every: Duration,
    /// The origin browsers reach this kernel at (`--public-url`), for
    /// the OAuth callback; the bound address when absent.
    pub public_url: Option<String>,
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
            wsd_sandbox: true,
            exec_wait: Duration::from_secs(5),
            routed_call_ttl: Duration::from_secs(60),
            adapter_timeout: Duration::from_secs(30),
            wsd_idle_stop: Duration::from_secs(10 * 60),
            wsd_timeout: wsd_client::DEFAULT_CALL_TIMEOUT,
            snapshot_limit: 64,
            gc_interval: Some(Duration::from_secs(6 * 60 * 60)),
            gc_grace: Duration::from_secs(60 * 60),
            chunk_store: None,
            codemode_deadline: Duration::from_secs(60),
            prune_every: Duration::from_secs(10 * 60),
            public_url: None,
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
    pub(crate) config: KernelConfig,
    pub(crate) db: Db,
    /// The `/home`, `/etc`, `/var`, `/root` tree.
    pub(crate) system: Arc<Mutex<Dofs>>,
    pub(crate) workspaces: Workspaces,
    pub(crate) pool: ConnectionPool,
    /// Device rows, their routes and shell sessions (the device domain).
    pub(crate) devices: Devices,
    /// Live device drivers and routed calls waiting for them.
    pub(crate) router: Arc<Router>,
    /// Live `shell.exec` sessions.
    pub(crate) sessions: Sessions,
    pub(crate) dispatch: Dispatch<Kernel>,
    /// Active agent runs (the rest of a process is rows).
    pub(crate) procs: Procs,
    /// What hears a process signal beyond its sockets.
    pub(crate) signal_listeners: SignalListeners<Kernel>,
    /// Live `fs.watch` feeds.
    pub(crate) watches: Watches,
    /// Terminals (`shell.pty.*`) and their attachments.
    pub(crate) ptys: crate::domains::pty::Ptys,
    /// Permits for sockets that have not authenticated yet.
    pub(crate) pending: Arc<Semaphore>,
    /// Permits for authenticated sockets.
    pub(crate) connected: Arc<Semaphore>,
    /// Failed logins per (username, address), for the growing delay.
    pub(crate) login_failures: Mutex<HashMap<(String, IpAddr), u32>>,
    /// Wakes the timer task when the timer table changes.
    pub(crate) timers: Arc<TimerWake>,
    /// Live MCP server connections (`sys.mcp.*`).
    pub(crate) mcp: McpServers,
    /// The object store snapshots are mirrored to, when configured.
    pub(crate) mirror: Option<SnapshotMirror>,
    /// The token seal, HTTP client and public origin of `sys.oauth.*`.
    pub(crate) oauth: OAuth,
}

/// Read access for tests and benchmarks outside the crate: the state
/// itself stays the domains' (no field is public).
impl Kernel {
    pub fn config(&self) -> &KernelConfig {
        &self.config
    }

    /// The kernel database (tests inspect rows through it).
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// The system store (`/home`, `/etc`, `/var`, `/root`).
    pub fn system(&self) -> &Arc<Mutex<Dofs>> {
        &self.system
    }

    pub fn workspaces(&self) -> &Workspaces {
        &self.workspaces
    }

    /// Live sockets.
    pub fn pool(&self) -> &ConnectionPool {
        &self.pool
    }

    /// Stops local `wsd` children (the kernel is going away), except those
    /// a terminal still runs in: they stay up for the next kernel to adopt,
    /// so the terminal goes on across a graceful restart too.
    pub async fn shutdown(&self) {
        self.timers.stop();
        self.sessions.sync.stop_all();
        self.ptys.stop_all();
        self.workspaces
            .shutdown(|id| self.ptys.running_in(id))
            .await;
    }
}
