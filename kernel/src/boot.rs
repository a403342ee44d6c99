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
use crate::domains::device::Devices;
use crate::domains::oauth::OAuth;
use crate::domains::proc::Procs;
use crate::domains::snapshot::mirror::SnapshotMirror;
use crate::domains::workspace::Workspaces;
use crate::error::KernelError;
use crate::kernel::{Kernel, KernelConfig};
use crate::routing::Router;
use crate::session::ConnectionPool;

impl Kernel {
    /// Opens (creating) the data directory: database, system store, root's
    /// accounts.
    pub async fn open(config: KernelConfig) -> Result<Arc<Kernel>, KernelError> {
        let dir = config.data_dir.clone();
        std::fs::create_dir_all(dir.join("workspaces"))
            .map_err(|e| KernelError::internal(&format!("creating {}", dir.display()), e))?;
        let db = Db::open(&dir.join("kernel.sqlite3"), &domains::migrations())?;
        let sys_path = dir.join("system.dofs");
        let system = tokio::task::spawn_blocking(move || Dofs::open(&sys_path))
            .await
            .map_err(|e| KernelError::internal("opening system.dofs", e))?
            .map_err(|e| KernelError::internal("opening system.dofs", e))?;
        let system = Arc::new(Mutex::new(system));
        domains::prepare(&db, &system).await?;
        let devices = Devices::new(db.clone());
        let router = Arc::new(Router::new(
            devices.clone(),
            config.routed_call_ttl,
            config.adapter_timeout,
        ));
        let mirror = match &config.chunk_store {
            Some(store) => Some(SnapshotMirror::connect(store).await?),
            None => None,
        };
        let oauth = OAuth::open(&dir, config.public_url.as_deref())?;
        let kernel = Arc::new(Kernel {
            workspaces: Workspaces::new(dir.join("workspaces"), config.wsd_bin.clone())
                .with_wsd_sandbox(config.wsd_sandbox)
                .with_wsd_timeout(config.wsd_timeout)
                .with_chunk_store(mirror.as_ref().map(SnapshotMirror::chunks)),
            pending: Arc::new(Semaphore::new(config.max_pending)),
            connected: Arc::new(Semaphore::new(config.max_connections)),
            config,
            db,
            system,
            pool: ConnectionPool::default(),
            devices,
            router,
            sessions: Default::default(),
            dispatch: domains::table(),
            procs: Procs::default(),
            signal_listeners: domains::signal_listeners(),
            watches: Default::default(),
            ptys: Default::default(),
            login_failures: Mutex::new(HashMap::new()),
            timers: Default::default(),
            mcp: Default::default(),
            mirror,
            oauth,
        });
        tokio::spawn(reap_idle_children(Arc::downgrade(&kernel)));
        domains::start(&kernel).await?;
        if let Some(every) = kernel.config.gc_interval {
            tokio::spawn(collect_garbage_now_and_then(Arc::downgrade(&kernel), every));
        }
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
            .stop_idle(idle, |id| {
                k.sessions.running_in(id) || k.ptys.running_in(id)
            })
            .await;
    }
}

/// Collects garbage in every workspace store every `every`; ends with the
/// kernel. A failed round is logged and retried at the next one.
async fn collect_garbage_now_and_then(kernel: std::sync::Weak<Kernel>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(k) = kernel.upgrade() else { return };
        if let Err(e) = domains::snapshot::calls::collect_all(&k).await {
            tracing::warn!(error = %e, "scheduled garbage collection failed");
        }
    }
}

/// One kernel per data directory: an advisory lock (`flock`) on the
/// directory itself, held as long as this value lives, so a second
/// `gsv serve --data DIR` fails at start instead of sharing the database
/// and the workspaces' wsd children with the first. The operating system
/// drops it when the process dies, however it dies, so nothing stale is
/// left to clean up. `gsv serve` takes it before [`Kernel::open`]; a
/// library caller opening a kernel takes it the same way if it wants it.
#[derive(Debug)]
pub struct DataDirLock {
    _dir: std::fs::File,
}

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum DataDirLockError {
    #[error(
        "another kernel already serves {}: stop it, or give this one a data directory of its own with --data",
        path.display()
    )]
    AlreadyServed { path: std::path::PathBuf },
    #[error("locking the data directory {}: {source}", path.display())]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
}

impl DataDirLock {
    /// Creates `dir` if needed and locks it, or says who holds it.
    pub fn acquire(dir: &std::path::Path) -> Result<DataDirLock, DataDirLockError> {
        let io = |source| DataDirLockError::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let f = std::fs::File::open(dir).map_err(io)?;
        match f.try_lock() {
            Ok(()) => Ok(DataDirLock { _dir: f }),
            Err(std::fs::TryLockError::WouldBlock) => Err(DataDirLockError::AlreadyServed {
                path: dir.to_path_buf(),
            }),
            Err(std::fs::TryLockError::Error(e)) => Err(io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_data_directory_is_locked_once_until_its_lock_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let first = DataDirLock::acquire(&dir).unwrap();
        let second = DataDirLock::acquire(&dir).unwrap_err();
        assert!(
            matches!(&second, DataDirLockError::AlreadyServed { path } if *path == dir),
            "{second}"
        );
        drop(first);
        DataDirLock::acquire(&dir).expect("free again once the first is gone");
    }
}
