//! Writing a file's new version: a temp file beside the target, filled,
//! given its mode and mtime, then renamed over the target (per-file replace
//! stays atomic). Apply runs this on its own thread, or hands it to
//! [`WRITE_POOL`] so that the next entries are prepared while files are
//! created, written and renamed on another core.
//!
//! Apply decides what a file's bytes are ([`plan`]: runs of the file's
//! previous version, chunks staged in memory, chunks to fetch). A write
//! whose bytes all come from the first two touches nothing but its own temp
//! name and target, so it can run beside the apply thread ([`Job`]); one
//! that must fetch a chunk from the index or from other files of the
//! directory runs on the apply thread, after every handed-off write has
//! finished. The index row of a handed-off write is recorded by apply once
//! the job reports the file's stat ([`Writers`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use rusqlite::Connection;
use wsd_sync::{ChunkRef, Hash, SyncError, SyncPath};

use super::error::IoContext;
use super::fsutil;
use super::index::{self, Node, Stat};
use super::objects::Staging;
use super::uring::{self, RingJob, RingWriter};

/// Threads that write files for apply: one per core, at most 4 (the apply
/// thread prepares entries beside them). `None` on one core, or if the
/// pool could not start: apply then writes every file itself.
static WRITE_POOL: std::sync::LazyLock<Option<rayon::ThreadPool>> =
    std::sync::LazyLock::new(|| {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(4);
        if n < 2 {
            return None;
        }
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .thread_name(|i| format!("wsd-write-{i}"))
            .build()
            .inspect_err(
                |e| tracing::warn!(error = %e, "no writer pool; apply writes on one thread"),
            )
            .ok()
    });

/// Writes handed off and not yet recorded, beyond which apply waits for
/// the oldest: bounds open files (each job holds its temp file and maybe
/// the previous version) and rows waiting in memory.
pub(crate) const MAX_IN_FLIGHT: usize = 64;

/// Whether writes can be handed off at all (a pool is running).
pub(crate) fn can_hand_off() -> bool {
    WRITE_POOL.is_some()
}

/// Files at least this large are handed to a writer thread. Below it the
/// hand-off (a task, a wake-up, a channel message: ~10 µs) costs about what
/// writing the file does: a cold push of 10k small files used 14 % more
/// CPU with every file handed off, and gained no time (bench/RESULTS.md).
pub(crate) const HAND_OFF_BYTES: u64 = 128 * 1024;

/// Where a run of a file's new bytes comes from.
pub(crate) enum Piece {
    /// `len` bytes at `start` of the file's previous version.
    Old { start: u64, len: u64 },
    /// A chunk staged in memory (verified on arrival).
    Staged(Arc<Vec<u8>>),
    /// A chunk to read when it is written (a spilled object, or a copy in
    /// an indexed file): only the apply thread can.
    Fetch(Hash),
}

/// The current version of a file apply rewrites, when its bytes are known
/// to be the indexed ones: its stat equals its row's and is not racily
/// clean (the rule settle trusts).
pub(crate) struct OldVersion {
    file: File,
    /// Where each of its chunks starts.
    offsets: HashMap<Hash, u64>,
}

impl OldVersion {
    pub fn open(db: &Connection, root: &Path, row: &Node) -> Result<Option<OldVersion>, SyncError> {
        let Some((file, meta)) = fsutil::open_file_in_root(root, &row.path)
            .map_err(|e| SyncError::io(format!("opening {}", row.path), e))?
        else {
            return Ok(None);
        };
        if !row.stat.proves_unchanged(&meta, row.verified_ns) {
            return Ok(None);
        }
        let mut offsets = HashMap::new();
        let mut offset = 0u64;
        for c in index::chunks_of(db, &row.path)? {
            offsets.entry(c.hash).or_insert(offset);
            offset += u64::from(c.size);
        }
        Ok(Some(OldVersion { file, offsets }))
    }

    /// Appends `len` bytes at `start` of the old version to `out`.
    fn copy(&self, start: u64, len: u64, out: &mut File, path: &SyncPath) -> Result<(), SyncError> {
        use std::io::{Read, Seek, SeekFrom};
        let mut src = &self.file;
        src.seek(SeekFrom::Start(start))
            .io_ctx(|| format!("reading {path}"))?;
        // std copies File to File with copy_file_range.
        let copied = std::io::copy(&mut src.take(len), out).io_ctx(|| format!("writing {path}"))?;
        if copied != len {
            return Err(SyncError::Storage(format!(
                "{path} changed on disk while being rewritten (copied {copied} of {len} bytes); \
                 it is re-indexed by the next settle"
            )));
        }
        Ok(())
    }
}

/// Where each chunk of the new version comes from, in order: a chunk staged
/// in memory as it is; otherwise a run of the previous version holding it
/// (adjacent runs merged, so the kernel copies them in one call); else
/// fetched when written.
pub(crate) fn plan(chunks: &[ChunkRef], staging: &Staging, old: Option<&OldVersion>) -> Vec<Piece> {
    let mut pieces = Vec::with_capacity(chunks.len());
    for c in chunks {
        if let Some(bytes) = staging.shared(&c.hash) {
            pieces.push(Piece::Staged(bytes));
            continue;
        }
        let at = old.and_then(|o| o.offsets.get(&c.hash));
        match (at, pieces.last_mut()) {
            (Some(&offset), Some(Piece::Old { start, len })) if *start + *len == offset => {
                *len += u64::from(c.size);
            }
            (Some(&offset), _) => pieces.push(Piece::Old {
                start: offset,
                len: u64::from(c.size),
            }),
            (None, _) => pieces.push(Piece::Fetch(c.hash)),
        }
    }
    pieces
}

/// Creates `tmp` (never following or replacing anything there), writes
/// `pieces` (`fetch` writes a [`Piece::Fetch`] chunk), sets mode and mtime.
/// On error the temp file it created is removed (one it could not create
/// is not its to remove).
pub(crate) fn fill(
    tmp: &Path,
    path: &SyncPath,
    mode_mtime: (u32, i64),
    pieces: &[Piece],
    old: Option<&OldVersion>,
    fetch: &mut dyn FnMut(&Hash, &mut File) -> Result<(), SyncError>,
) -> Result<File, SyncError> {
    // Created with its final mode when the umask leaves that mode whole
    // (no `fchmod` then); else private until `write_pieces` sets it.
    let create_mode = if fsutil::umask_keeps(mode_mtime.0) {
        mode_mtime.0 & 0o777
    } else {
        0o600
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(create_mode)
        .custom_flags(fsutil::O_NOFOLLOW)
        .open(tmp)
        .io_ctx(|| format!("creating a temp file for {path}"))?;
    match write_pieces(&mut file, path, mode_mtime, pieces, old, fetch) {
        Ok(()) => Ok(file),
        Err(e) => {
            let _ = std::fs::remove_file(tmp);
            Err(e)
        }
    }
}

fn write_pieces(
    file: &mut File,
    path: &SyncPath,
    (mode, mtime_ms): (u32, i64),
    pieces: &[Piece],
    old: Option<&OldVersion>,
    fetch: &mut dyn FnMut(&Hash, &mut File) -> Result<(), SyncError>,
) -> Result<(), SyncError> {
    for p in pieces {
        match p {
            Piece::Old { start, len } => {
                let old = old.ok_or_else(|| {
                    SyncError::Storage(format!(
                        "{path}: a run of a previous version that is not open"
                    ))
                })?;
                old.copy(*start, *len, file, path)?;
            }
            Piece::Staged(bytes) => file.write_all(bytes).io_ctx(|| format!("writing {path}"))?,
            Piece::Fetch(hash) => fetch(hash, file)?,
        }
    }
    // fchmod is not subject to the umask, so the mode arrives exactly.
    if !fsutil::umask_keeps(mode) {
        file.set_permissions(std::fs::Permissions::from_mode(mode))
            .io_ctx(|| format!("chmod {path}"))?;
    }
    file.set_times(std::fs::FileTimes::new().set_modified(fsutil::time_of_ms(mtime_ms)))
        .io_ctx(|| format!("setting the mtime of {path}"))?;
    Ok(())
}

/// Renames the filled `tmp` over `abs`; on failure the temp file is removed
/// and the target is untouched.
pub(crate) fn rename_into(tmp: &Path, abs: &Path, path: &SyncPath) -> Result<(), SyncError> {
    if let Err(err) =
        super::failpoint::hit("apply-before-rename").and_then(|()| std::fs::rename(tmp, abs))
    {
        let _ = std::fs::remove_file(tmp);
        return Err(SyncError::io(format!("renaming into {path}"), err));
    }
    Ok(())
}

/// A file write whose bytes need nothing but staging and its own previous
/// version, runnable on a writer thread.
pub(crate) struct Job {
    pub path: SyncPath,
    pub tmp: PathBuf,
    pub abs: PathBuf,
    pub mode: u32,
    pub mtime_ms: i64,
    pub pieces: Vec<Piece>,
    pub old: Option<OldVersion>,
}

impl Job {
    /// True when every piece can be written without the apply thread.
    pub fn ready(pieces: &[Piece]) -> bool {
        !pieces.iter().any(|p| matches!(p, Piece::Fetch(_)))
    }

    /// Writes the file into place; its stat after the rename (which moves
    /// ctime on most filesystems) is what the next settle compares against.
    fn run(self) -> Result<Stat, SyncError> {
        let mut no_fetch = |h: &Hash, _: &mut File| {
            Err(SyncError::Storage(format!(
                "{}: chunk {h} was not planned for a writer thread",
                self.path
            )))
        };
        let file = fill(
            &self.tmp,
            &self.path,
            (self.mode, self.mtime_ms),
            &self.pieces,
            self.old.as_ref(),
            &mut no_fetch,
        )?;
        rename_into(&self.tmp, &self.abs, &self.path)?;
        let meta = fsutil::stat_written(&file, self.mode, &self.path)?;
        Ok(Stat::applied(&meta, self.mode))
    }
}

/// The writes one apply handed off, to writer threads or to the ring,
/// each with what apply records once it is done (`T`: the row waiting
/// for its stat).
pub(crate) struct Writers<T> {
    tx: mpsc::Sender<(u64, Result<Stat, SyncError>)>,
    rx: mpsc::Receiver<(u64, Result<Stat, SyncError>)>,
    waiting: HashMap<u64, T>,
    next_id: u64,
    /// Small files written through io_uring, set up at the first.
    ring: Option<RingWriter<T>>,
}

impl<T> Writers<T> {
    pub fn new() -> Writers<T> {
        let (tx, rx) = mpsc::channel();
        Writers {
            tx,
            rx,
            waiting: HashMap::new(),
            next_id: 0,
            ring: None,
        }
    }

    /// Writes handed off and not yet taken back with [`Writers::next_done`].
    pub fn in_flight(&self) -> usize {
        self.waiting.len() + self.ring.as_ref().map_or(0, RingWriter::in_flight)
    }

    /// Whether a file of `pieces` (`has_old`: some come from its previous
    /// version) and `mode` can be written through the ring: all its bytes
    /// staged in memory, created with its final mode, and io_uring there.
    pub fn ring_takes(&mut self, pieces: &[Piece], has_old: bool, mode: u32) -> bool {
        if !uring::enabled() {
            return false;
        }
        let all_staged = pieces.iter().all(|p| matches!(p, Piece::Staged(_)));
        if !uring::takes(all_staged, pieces.len(), has_old, mode) {
            return false;
        }
        if self.ring.is_none() {
            self.ring = RingWriter::new().ok();
        }
        self.ring.is_some()
    }

    /// Queues `job` on the ring (after [`Writers::ring_takes`] held for
    /// it); `row` comes back with its result.
    pub fn queue_ring(&mut self, job: Job, row: T) -> Result<(), SyncError> {
        let Some(ring) = self.ring.as_mut() else {
            unreachable!("queue_ring is only called once ring_takes held")
        };
        let bytes = job
            .pieces
            .into_iter()
            .filter_map(|p| match p {
                Piece::Staged(bytes) => Some(bytes),
                Piece::Old { .. } | Piece::Fetch(_) => None,
            })
            .collect();
        let job = RingJob {
            path: job.path,
            tmp: job.tmp,
            abs: job.abs,
            mode: job.mode,
            mtime_ms: job.mtime_ms,
            bytes,
        };
        ring.queue(job, row)
    }

    /// Hands `job` to the pool; `row` comes back with its result.
    pub fn spawn(&mut self, job: Job, row: T) {
        let Some(pool) = WRITE_POOL.as_ref() else {
            unreachable!("spawn is only called when the pool is available")
        };
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.insert(id, row);
        let tx = self.tx.clone();
        pool.spawn(move || {
            // A panicking write must still report, or apply would wait forever.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run()))
                .unwrap_or_else(|_| Err(SyncError::Storage("a file write panicked".to_owned())));
            let _ = tx.send((id, result));
        });
    }

    /// Waits for one handed-off write to finish; `None` when none is left.
    pub fn next_done(&mut self) -> Option<(T, Result<Stat, SyncError>)> {
        let take = |waiting: &mut HashMap<u64, T>, (id, result): (u64, Result<Stat, SyncError>)| {
            let row = waiting.remove(&id).expect("each job reports once");
            Some((row, result))
        };
        if !self.waiting.is_empty()
            && let Ok(done) = self.rx.try_recv()
        {
            return take(&mut self.waiting, done);
        }
        if let Some(ring) = self.ring.as_mut()
            && ring.in_flight() > 0
        {
            return ring.next();
        }
        if self.waiting.is_empty() {
            return None;
        }
        // We hold a sender, so the channel cannot close while jobs are out.
        let done = self.rx.recv().expect("a writer job reports once");
        take(&mut self.waiting, done)
    }
}
