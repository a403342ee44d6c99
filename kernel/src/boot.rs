//! Starting the kernel: opens the data directory, wires the state (the
//! database, the system store, the syscall table, empty live maps) into
//! one [`Kernel`], then lets the operations that depend on it run for the
//! first time (process recovery, the idle-wsd reaper). The one module
//! that knows every layer, so no lower one has to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use wsd_dofs::Dofs;

use crate::db::Db;
use crate::domains;
use crate::domains::accounts;
use crate::domains::proc::Procs;
use crate::domains::workspace::Workspaces;
use crate::error::KernelError;
use crate::kernel::{Kernel, KernelConfig};
use crate::routing::{self, Router};
use crate::session::ConnectionPool;

impl Kernel {
    /// Opens (creating) the data directory: database, system store, root's
    /// accounts.
    pub async fn open(config: KernelConfig) -> Result<Arc<Kernel>, KernelError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(dir.join("workspaces"))
            .map_err(|e| KernelError::internal(&format!("creating {}", dir.display()), e))?;
        let db = Db::open(&dir.join("kernel.sqlite3"), &domains::migrations())?;
        db.call(accounts::bootstrap).await?;
        db.call(routing::reset_at_start).await?;
        let sys_path = dir.join("system.dofs");
        let system = tokio::task::spawn_blocking(move || Dofs::open(&sys_path))
            .await
            .map_err(|e| KernelError::internal("opening system.dofs", e))?
            .map_err(|e| KernelError::internal("opening system.dofs", e))?;
        let system = Arc::new(Mutex::new(system));
        domains::fs::calls::ensure_dir(&system, "root").await?;
        let router = Arc::new(Router::new(db.clone(), config.routed_call_ttl));
        let kernel = Arc::new(Kernel {
            workspaces: Workspaces::new(dir.join("workspaces"), config.wsd_bin.clone())
                .with_wsd_sandbox(config.wsd_sandbox),
            pending: Arc::new(Semaphore::new(config.max_pending)),
            connected: Arc::new(Semaphore::new(config.max_connections)),
            config,
            db,
            system,
            pool: ConnectionPool::default(),
            router,
            sessions: Default::default(),
            dispatch: domains::table(),
            procs: Procs::default(),
            watches: Default::default(),
            login_failures: Mutex::new(HashMap::new()),
        });
        tokio::spawn(reap_idle_children(Arc::downgrade(&kernel)));
        tokio::spawn(domains::watch::calls::prune_periodically(Arc::downgrade(
            &kernel,
        )));
        domains::proc::calls::run::recover(&kernel).await?;
        Ok(kernel)
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
