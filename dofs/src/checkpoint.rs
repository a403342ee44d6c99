//! WAL checkpoints off the writer's path.
//!
//! A checkpoint copies the WAL's pages back into the database file and
//! fsyncs it; run by SQLite's automatic checkpoint it happened inside the
//! commit that crossed the threshold, a fifth of the cost of writing small
//! files one per call (bench/RESULTS.md). Here the writer's WAL hook only
//! asks: one process-wide thread (`dofs-checkpoint`) runs a `PASSIVE`
//! checkpoint on its own connection, beside the writer (it never blocks
//! it). Should the writer outpace it, the hook checkpoints in the commit as
//! before once the WAL reaches [`FOREGROUND_FRAMES`], which also lets the
//! WAL restart from its beginning, so it stays bounded. If the worker's
//! checkpoint is still running then (SQLite refuses a second one at once,
//! busy handler or not), the commit waits for it to end first: otherwise a
//! slow disk let the WAL grow by whatever the writer added meanwhile.
//!
//! Durability is unchanged: a commit is in the WAL when the call returns,
//! whoever copies it back later.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, LazyLock, Mutex, mpsc};
use std::time::Duration;

use rusqlite::wal::CheckpointMode;
use rusqlite::{Connection, OpenFlags};

/// WAL frames (4 KiB pages) after which a background checkpoint is asked
/// for: 64 MiB, the automatic threshold dofs used before (1 MiB in this
/// crate's tests, so they cross both thresholds cheaply).
pub(crate) const BACKGROUND_FRAMES: i32 = if cfg!(test) { 256 } else { 16_384 };
/// WAL frames at which the writer checkpoints in its commit (256 MiB).
pub(crate) const FOREGROUND_FRAMES: i32 = 4 * BACKGROUND_FRAMES;

/// How long a commit at the foreground threshold waits for the worker's
/// checkpoint to end before trying its own anyway.
const WAIT_FOR_WORKER: Duration = Duration::from_secs(30);

/// Whether a checkpoint of one database is in flight on the worker.
#[derive(Default)]
struct Pending {
    busy: Mutex<bool>,
    done: Condvar,
}

impl Pending {
    /// Marks a request in flight; false when one already was.
    fn start(&self) -> bool {
        !std::mem::replace(&mut *self.busy.lock().unwrap(), true)
    }

    fn finish(&self) {
        *self.busy.lock().unwrap() = false;
        self.done.notify_all();
    }

    /// Waits (bounded) until no request is in flight.
    fn wait_idle(&self) {
        let busy = self.busy.lock().unwrap();
        let _idle = self
            .done
            .wait_timeout_while(busy, WAIT_FOR_WORKER, |b| *b)
            .unwrap();
    }
}

/// A request: the database to checkpoint, and its flag of a request in
/// flight (cleared when done).
type Request = (PathBuf, Arc<Pending>);

static WORKER: LazyLock<Option<mpsc::Sender<Request>>> = LazyLock::new(|| {
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("dofs-checkpoint".to_owned())
        .spawn(move || {
            for (path, pending) in rx {
                if let Err(e) = checkpoint(&path) {
                    tracing::debug!(path = %path.display(), error = %e, "background checkpoint failed");
                }
                pending.finish();
            }
        })
        .inspect_err(|e| tracing::warn!(error = %e, "no checkpoint thread; commits checkpoint"))
        .ok()
        .map(|_| tx)
});

/// Runs a passive checkpoint of `path` on a connection of its own. Never
/// creates the file (the database may have been closed and removed since).
fn checkpoint(path: &std::path::Path) -> rusqlite::Result<()> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // A connection that closes last would checkpoint and remove the WAL
    // itself; either way nothing is lost.
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

/// Installs the WAL hook on the writer's connection to the file `path`.
pub(crate) fn install(conn: &mut Connection, path: PathBuf) -> rusqlite::Result<()> {
    let pending = Arc::new(Pending::default());
    // The hook runs after the commit is durable in the WAL: an error from it
    // would make SQLite report the committed transaction as failed, so a
    // checkpoint that cannot run now (another one holds the lock) is left
    // for later, never returned.
    conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, frames: i32| {
        let sent = (BACKGROUND_FRAMES..FOREGROUND_FRAMES).contains(&frames)
            && (!pending.start() || request(&path, &pending));
        if frames >= BACKGROUND_FRAMES && !sent {
            if frames >= FOREGROUND_FRAMES {
                pending.wait_idle();
            }
            if let Err(e) = wal.checkpoint_v2(CheckpointMode::PASSIVE) {
                tracing::debug!(error = %e, frames, "checkpoint in the commit did not run");
            }
        }
        Ok(())
    }))
}

/// Hands a checkpoint of `path` to the worker; false (and `pending`
/// cleared) when there is no worker.
fn request(path: &std::path::Path, pending: &Arc<Pending>) -> bool {
    let sent = WORKER
        .as_ref()
        .is_some_and(|tx| tx.send((path.to_path_buf(), pending.clone())).is_ok());
    if !sent {
        pending.finish();
    }
    sent
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{noise, p};
    use crate::{Dofs, WriteOptions};

    fn len(path: &std::path::Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    #[test]
    fn checkpoints_run_beside_the_writer_and_the_wal_stays_bounded() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("d.dofs");
        let wal = tmp.path().join("d.dofs-wal");
        let mut d = Dofs::open(&db).unwrap();
        let opts = || WriteOptions {
            create_parents: true,
            ..WriteOptions::default()
        };
        // Past the background threshold (not the foreground one): only the
        // worker can copy pages into the database file now (the hook
        // replaces SQLite's own checkpoint). It may run at once or after
        // the last write, so growth is what counts, not how much.
        let before = len(&db);
        for i in 0..40u64 {
            d.write_file_with(&p(&format!("a/f{i}")), &noise(32 * 1024, i)[..], opts())
                .unwrap();
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while len(&db) <= before && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(
            len(&db) > before,
            "no checkpoint reached the database file ({before} -> {} bytes)",
            len(&db)
        );
        // A writer that never pauses: commits checkpoint once the WAL
        // reaches the foreground threshold, so it is reused, not grown.
        for i in 0..1500u64 {
            d.write_file_with(&p(&format!("b/f{i}")), &noise(4096, 1000 + i)[..], opts())
                .unwrap();
        }
        let frame = 4096 + 24;
        let bound = 2 * FOREGROUND_FRAMES as u64 * frame;
        assert!(
            len(&wal) <= bound,
            "WAL grew to {} bytes (bound {bound})",
            len(&wal)
        );
        for i in [0u64, 777, 1499] {
            assert_eq!(
                d.read_file(&p(&format!("b/f{i}"))).unwrap(),
                noise(4096, 1000 + i)
            );
        }
        drop(d);
        let d = Dofs::open(&db).unwrap();
        d.check_integrity().unwrap();
        assert_eq!(d.read_file(&p("a/f39")).unwrap(), noise(32 * 1024, 39));
    }
}
