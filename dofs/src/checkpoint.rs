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
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, mpsc};
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

/// How long closing a store waits for a background checkpoint of it that
/// is running (it copies at most [`FOREGROUND_FRAMES`] pages).
const CLOSE_WAIT: Duration = Duration::from_secs(60);

/// Where one database's background checkpoint is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Idle,
    Queued,
    Running,
    /// The store closed while its request was queued: the worker skips it.
    Cancelled,
}

/// One database's checkpoint phase, shared by its writer's WAL hook, the
/// worker, and the [`Closing`] guard of its [`crate::Dofs`].
#[derive(Debug)]
pub(crate) struct Shared {
    phase: Mutex<Phase>,
    changed: Condvar,
}

impl Shared {
    fn phase(&self) -> MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, phase: Phase) {
        *self.phase() = phase;
        self.changed.notify_all();
    }

    /// Waits (bounded) until no request is queued or running.
    fn wait_idle(&self) {
        let phase = self.phase();
        let _idle = self
            .changed
            .wait_timeout_while(phase, WAIT_FOR_WORKER, |p| {
                matches!(*p, Phase::Queued | Phase::Running)
            })
            .unwrap_or_else(|p| p.into_inner());
    }
}

/// A request: the database to checkpoint, and its phase.
type Request = (PathBuf, Arc<Shared>);

static WORKER: LazyLock<Option<mpsc::Sender<Request>>> = LazyLock::new(|| {
    let (tx, rx) = mpsc::channel::<Request>();
    std::thread::Builder::new()
        .name("dofs-checkpoint".to_owned())
        .spawn(move || {
            for (path, shared) in rx {
                {
                    let mut phase = shared.phase();
                    if *phase == Phase::Cancelled {
                        *phase = Phase::Idle;
                        continue;
                    }
                    *phase = Phase::Running;
                }
                if let Err(e) = checkpoint(&path) {
                    tracing::debug!(path = %path.display(), error = %e, "background checkpoint failed");
                }
                shared.set(Phase::Idle);
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
    #[cfg(test)]
    tests::hold_while_gated(path);
    conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
}

/// Held by a [`crate::Dofs`] ahead of its connection, so it drops first:
/// closing waits for a background checkpoint of the store that is running
/// (and cancels one still queued). Then the writer's close is the last
/// connection's, which copies the whole WAL into the file and removes it.
/// Without the wait the worker's connection could be the last one open, so
/// the file was left half-checkpointed when the store had closed: its size
/// still grew afterwards (bench/RESULTS.md, issue 29) and the next open
/// had to check it page by page (no clean-close stamp).
#[derive(Debug)]
pub(crate) struct Closing(Arc<Shared>);

impl Drop for Closing {
    fn drop(&mut self) {
        let phase = self.0.phase();
        let (_phase, waited) = self
            .0
            .changed
            .wait_timeout_while(phase, CLOSE_WAIT, |p| {
                if *p == Phase::Queued {
                    *p = Phase::Cancelled;
                }
                #[cfg(test)]
                if *p == Phase::Running {
                    tests::note_waiting();
                }
                *p == Phase::Running
            })
            .unwrap_or_else(|p| p.into_inner());
        if waited.timed_out() {
            tracing::warn!(after = ?CLOSE_WAIT, "closing a store before its background checkpoint ended");
        }
    }
}

/// Installs the WAL hook on the writer's connection to the file `path`;
/// the returned guard must drop before the connection closes.
pub(crate) fn install(conn: &mut Connection, path: PathBuf) -> rusqlite::Result<Closing> {
    let shared = Arc::new(Shared {
        phase: Mutex::new(Phase::Idle),
        changed: Condvar::new(),
    });
    let hook_shared = shared.clone();
    // The hook runs after the commit is durable in the WAL: an error from it
    // would make SQLite report the committed transaction as failed, so a
    // checkpoint that cannot run now (another one holds the lock) is left
    // for later, never returned.
    conn.wal_hook(Some(move |wal: &mut rusqlite::hooks::Wal, frames: i32| {
        let sent = (BACKGROUND_FRAMES..FOREGROUND_FRAMES).contains(&frames)
            && request(&path, &hook_shared);
        if frames >= BACKGROUND_FRAMES && !sent {
            if frames >= FOREGROUND_FRAMES {
                hook_shared.wait_idle();
            }
            if let Err(e) = wal.checkpoint_v2(CheckpointMode::PASSIVE) {
                tracing::debug!(error = %e, frames, "checkpoint in the commit did not run");
            }
        }
        Ok(())
    }))?;
    Ok(Closing(shared))
}

/// Hands a checkpoint of `path` to the worker unless one is queued or
/// running already; false when there is no worker.
fn request(path: &std::path::Path, shared: &Arc<Shared>) -> bool {
    let mut phase = shared.phase();
    match *phase {
        Phase::Queued | Phase::Running => return true,
        // Queued, then cancelled, and not yet skipped: the store is open
        // again only in a new `Shared`, so this cannot be ours.
        Phase::Cancelled => return false,
        Phase::Idle => {}
    }
    let sent = WORKER
        .as_ref()
        .is_some_and(|tx| tx.send((path.to_path_buf(), shared.clone())).is_ok());
    if sent {
        *phase = Phase::Queued;
    }
    sent
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// While it names a database, the worker stops between opening its
    /// connection to it and checkpointing (and says so in `WORKER_HELD`):
    /// a test holds it mid-checkpoint to close the store under it.
    static GATE: Mutex<Option<PathBuf>> = Mutex::new(None);
    static GATE_CHANGED: Condvar = Condvar::new();
    static WORKER_HELD: AtomicUsize = AtomicUsize::new(0);
    /// Closes that found a checkpoint running and waited for it.
    static CLOSES_WAITING: AtomicUsize = AtomicUsize::new(0);

    pub(super) fn hold_while_gated(path: &std::path::Path) {
        let mut gated = GATE.lock().unwrap();
        if gated.as_deref() == Some(path) {
            WORKER_HELD.fetch_add(1, Ordering::SeqCst);
        }
        while gated.as_deref() == Some(path) {
            gated = GATE_CHANGED.wait(gated).unwrap();
        }
    }

    pub(super) fn note_waiting() {
        CLOSES_WAITING.fetch_add(1, Ordering::SeqCst);
    }

    fn set_gate(on: Option<PathBuf>) {
        *GATE.lock().unwrap() = on;
        GATE_CHANGED.notify_all();
    }

    /// Polls `done` (10 ms apart) for up to 20 s.
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        for _ in 0..2000 {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn closing_a_store_waits_for_its_running_checkpoint_and_leaves_the_file_complete() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("d.dofs");
        let wal = tmp.path().join("d.dofs-wal");
        let mut d = Dofs::open(&db).unwrap();
        set_gate(Some(std::path::absolute(&db).unwrap()));
        let held_before = WORKER_HELD.load(Ordering::SeqCst);
        // One commit of ~2 MiB: past the background threshold, short of
        // the foreground one, so the worker is asked and the writer is not.
        let bytes = noise(2 << 20, 7);
        d.write_file_with(&p("f"), &bytes[..], WriteOptions::default())
            .unwrap();
        assert!(
            eventually(|| WORKER_HELD.load(Ordering::SeqCst) > held_before),
            "the worker never started the checkpoint"
        );
        let waiting_before = CLOSES_WAITING.load(Ordering::SeqCst);
        let closer = std::thread::spawn(move || drop(d));
        // The close must wait for the held worker, not return beside it.
        let waited = eventually(|| {
            closer.is_finished() || CLOSES_WAITING.load(Ordering::SeqCst) > waiting_before
        });
        let closed_early = closer.is_finished();
        let wal_while_held = len(&wal);
        set_gate(None);
        closer.join().unwrap();
        assert!(
            waited && !closed_early,
            "closed with the checkpoint running (WAL {wal_while_held} bytes)"
        );
        assert_eq!(len(&wal), 0, "the last close copied and removed the WAL");
        let size = len(&db);
        assert!(size > bytes.len() as u64, "{size}");
        let d = Dofs::open(&db).unwrap();
        assert_eq!(d.read_file(&p("f")).unwrap(), bytes);
        drop(d);
        assert_eq!(len(&db), size, "nothing was left to copy in");
    }
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
