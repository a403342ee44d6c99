//! Writing small files through `io_uring`: the create, write, close and
//! rename of many files go to the kernel in a few submissions and run on
//! an io-wq worker while apply prepares the next entries; each file's row
//! is recorded when its completions come back (as a writer thread's is).
//!
//! A file is two linked chains. The first creates the temp name into a
//! fixed-file slot, writes the staged chunks, closes the slot and stats
//! the temp name (the inode apply made). io_uring has no op that sets
//! times, so once that chain completed the apply thread sets the mtime by
//! path (`utimensat`, one syscall) and queues the second chain: rename onto
//! the target, then stat the target (the rename moved its ctime). A target
//! whose inode is not the one apply made was replaced by another process
//! in between; its row then records apply's inode, so the next settle
//! finds the other process's file as the local change it is.
//!
//! A chain that fails removes the temp name it created and reports the
//! first error of the file. Every operation in the kernel points into a
//! [`RingFile`]'s buffers, so a file is dropped only after its last
//! completion, and a writer whose ring failed leaks them rather than free
//! memory the kernel may still write.

// The ring's submission entries carry raw pointers into buffers this
// module keeps alive until their completion (the SAFETY notes below).
#![allow(unsafe_code)]

use std::cell::RefCell;
use std::collections::VecDeque;
use std::ffi::CString;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use io_uring::{IoUring, opcode, squeue, types};
use rustix::fs::{AtFlags, OFlags, Statx, StatxFlags, Timespec, Timestamps};
use wsd_sync::{SyncError, SyncPath};

use super::fsutil;
use super::index::Stat;

/// Submission queue entries: many files' chains between two submits.
const RING_ENTRIES: u32 = 256;
/// Completion queue entries: more than the operations ever in flight.
const CQ_ENTRIES: u32 = 4096;
/// Fixed-file slots: one per file between its create and its close.
const SLOTS: u32 = 128;
/// Files of more pieces are written the ordinary way: a chain must fit
/// the submission queue whole.
const MAX_PIECES: usize = 32;
/// io-wq workers for file work. One creates the files in order while the
/// apply thread goes on; more would create them in parallel, and creating
/// files in one directory contends in ext4 (see `HAND_OFF_BYTES`).
const WORKERS: u32 = 1;

/// Operation tags in a completion's user data (below [`OP_BITS`]; the file
/// id above).
const OP_OPEN: u64 = 0;
const OP_CLOSE: u64 = 1;
const OP_STAT_MADE: u64 = 2;
const OP_RENAME: u64 = 3;
const OP_STAT_PLACED: u64 = 4;
/// The write of piece `k` is `OP_WRITE + k`.
const OP_WRITE: u64 = 16;
const OP_BITS: u32 = 16;

/// Set once setting up a ring failed: not tried again in this process.
static UNAVAILABLE: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// A ring set up by an earlier apply on this thread, with every slot
    /// free and nothing in flight.
    static SPARE: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// Whether apply uses the ring at all: only with `WSD_IO_URING=on`. On an
/// idle machine it cost more than it saved (mixed cold push 1.05x the
/// ordinary path's wall time, daemon CPU +13 %: the io-wq worker competes
/// with the client for the two cores); only under load did it win
/// (bench/RESULTS.md, issue 32, branch `uring`).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("WSD_IO_URING").is_some_and(|v| v == "on"))
}

/// A new file for the ring: its bytes (staged in memory, in order), where
/// to create it and what to give it.
pub(crate) struct RingJob {
    pub path: SyncPath,
    pub tmp: PathBuf,
    pub abs: PathBuf,
    pub mode: u32,
    pub mtime_ms: i64,
    pub bytes: Vec<Arc<Vec<u8>>>,
}

/// Whether a file can go through the ring: every byte staged in memory
/// (`all_staged`), few enough pieces, no previous version to copy from,
/// created with its final mode (no `fchmod`).
pub(crate) fn takes(all_staged: bool, pieces: usize, has_old: bool, mode: u32) -> bool {
    !has_old && all_staged && pieces <= MAX_PIECES && fsutil::umask_keeps(mode)
}

fn setup() -> std::io::Result<IoUring> {
    let ring = IoUring::builder()
        .setup_cqsize(CQ_ENTRIES)
        // Completions are taken when the apply thread next enters the
        // kernel, not by interrupting it.
        .setup_coop_taskrun()
        .setup_submit_all()
        .build(RING_ENTRIES)?;
    ring.submitter().register_files_sparse(SLOTS)?;
    let mut max = [WORKERS, 0];
    ring.submitter().register_iowq_max_workers(&mut max)?;
    Ok(ring)
}

/// One file on its way through the ring.
struct RingFile<T> {
    row: T,
    path: SyncPath,
    tmp: CString,
    abs: CString,
    mode: u32,
    mtime_ms: i64,
    pieces: Vec<Arc<Vec<u8>>>,
    slot: u32,
    /// The second chain (rename, stat) is queued.
    placing: bool,
    /// Completions still to come for the current chain.
    outstanding: u32,
    opened: bool,
    closed: bool,
    renamed: bool,
    failure: Option<SyncError>,
    made: Box<MaybeUninit<Statx>>,
    placed: Box<MaybeUninit<Statx>>,
}

/// The buffers of a file whose completions can no longer be awaited.
type Abandoned = (
    CString,
    CString,
    Vec<Arc<Vec<u8>>>,
    Box<MaybeUninit<Statx>>,
    Box<MaybeUninit<Statx>>,
);

/// The files one apply writes through the ring (`T`: the row each waits
/// to record).
pub(crate) struct RingWriter<T> {
    ring: Option<IoUring>,
    files: Vec<Option<RingFile<T>>>,
    free_ids: Vec<usize>,
    free_slots: Vec<u32>,
    done: VecDeque<(T, Result<Stat, SyncError>)>,
    /// Files queued and not yet in `done`.
    in_flight: usize,
    /// Operations pushed whose completion has not been read.
    ops_out: usize,
    /// Cleared when a slot may still hold a file (its close failed): the
    /// ring is then not kept for the next apply.
    reusable: bool,
    /// Set when submitting or waiting failed: nothing more is queued, and
    /// what is in flight is given up ([`Self::abandon`]).
    failed: bool,
    abandoned: Vec<Abandoned>,
    completions: Vec<(u64, i32)>,
}

impl<T> std::fmt::Debug for RingWriter<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingWriter")
            .field("in_flight", &self.in_flight)
            .field("ops_out", &self.ops_out)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

fn cstring(p: &Path, path: &SyncPath) -> Result<CString, SyncError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| SyncError::InvalidPath {
        path: path.to_string(),
        reason: "the path holds a NUL byte",
    })
}

fn os_error(errno: i32) -> std::io::Error {
    std::io::Error::from_raw_os_error(errno)
}

impl<T> RingWriter<T> {
    /// This thread's ring (set up on first use); `Err` where io_uring is
    /// unavailable (an old kernel, a seccomp filter, `io_uring_disabled`).
    pub fn new() -> std::io::Result<RingWriter<T>> {
        if UNAVAILABLE.load(Ordering::Relaxed) {
            return Err(std::io::ErrorKind::Unsupported.into());
        }
        let ring = match SPARE.with(|s| s.borrow_mut().take()) {
            Some(r) => r,
            None => setup().inspect_err(|e| {
                UNAVAILABLE.store(true, Ordering::Relaxed);
                tracing::info!(error = %e, "no io_uring; apply writes each file with its own system calls");
            })?,
        };
        Ok(RingWriter {
            ring: Some(ring),
            files: Vec::new(),
            free_ids: Vec::new(),
            free_slots: (0..SLOTS).rev().collect(),
            done: VecDeque::new(),
            in_flight: 0,
            ops_out: 0,
            reusable: true,
            failed: false,
            abandoned: Vec::new(),
            completions: Vec::new(),
        })
    }

    /// Files queued whose result has not been taken with [`Self::next`].
    pub fn in_flight(&self) -> usize {
        self.in_flight + self.done.len()
    }

    /// Queues `job` (for which [`takes`] held); `row` comes back from
    /// [`Self::next`] with the file's stat or its first error.
    pub fn queue(&mut self, job: RingJob, row: T) -> Result<(), SyncError> {
        if self.failed {
            return Err(SyncError::Storage(format!(
                "{}: the io_uring writer failed earlier in this batch",
                job.path
            )));
        }
        self.reap();
        let slot = loop {
            if let Some(s) = self.free_slots.pop() {
                break s;
            }
            self.wait()?;
        };
        let pieces: Vec<Arc<Vec<u8>>> = job.bytes.into_iter().filter(|b| !b.is_empty()).collect();
        let names =
            cstring(&job.tmp, &job.path).and_then(|t| Ok((t, cstring(&job.abs, &job.path)?)));
        let (tmp, abs) = match names {
            Ok(n) => n,
            Err(e) => {
                self.free_slots.push(slot);
                return Err(e);
            }
        };
        let mut file = RingFile {
            tmp,
            abs,
            row,
            path: job.path,
            mode: job.mode,
            mtime_ms: job.mtime_ms,
            pieces,
            slot,
            placing: false,
            outstanding: 0,
            opened: false,
            closed: false,
            renamed: false,
            failure: None,
            made: Box::new(MaybeUninit::uninit()),
            placed: Box::new(MaybeUninit::uninit()),
        };
        let id = self.free_ids.pop().unwrap_or_else(|| {
            self.files.push(None);
            self.files.len() - 1
        });
        let chain = create_chain(&mut file, id);
        self.files[id] = Some(file);
        self.in_flight += 1;
        if let Err(e) = self.push_chain(id, &chain) {
            // Nothing of it reached the queue.
            self.files[id] = None;
            self.free_ids.push(id);
            self.free_slots.push(slot);
            self.in_flight -= 1;
            return Err(e);
        }
        self.submit()
    }

    /// The next finished file, waiting for one if none is; `None` when
    /// nothing is queued.
    pub fn next(&mut self) -> Option<(T, Result<Stat, SyncError>)> {
        loop {
            if !self.failed {
                self.reap();
            }
            if let Some(d) = self.done.pop_front() {
                return Some(d);
            }
            if self.in_flight == 0 {
                return None;
            }
            let waited = if self.failed {
                Err(SyncError::Storage(
                    "the io_uring writer failed earlier in this batch".to_owned(),
                ))
            } else {
                self.wait()
            };
            if let Err(e) = waited {
                self.abandon(&e);
            }
        }
    }

    /// Pushes `chain` (whole: a chain split between two submissions would
    /// lose its links) and counts it against file `id`.
    fn push_chain(&mut self, id: usize, chain: &[squeue::Entry]) -> Result<(), SyncError> {
        let ring = self.ring.as_mut().expect("the ring is there until drop");
        let room = {
            let sq = ring.submission();
            sq.capacity() - sq.len()
        };
        if room < chain.len() {
            self.submit()?;
        }
        let ring = self.ring.as_mut().expect("the ring is there until drop");
        let mut sq = ring.submission();
        for e in chain {
            // SAFETY: every pointer in the entry (paths, data, statx
            // buffers) points into heap memory owned by file `id`, which
            // is neither dropped nor changed until its last completion is
            // read (`complete`), or is leaked (`abandon`, `drop`).
            if unsafe { sq.push(e) }.is_err() {
                unreachable!("room for the whole chain was made above");
            }
        }
        drop(sq);
        let f = self.files[id].as_mut().expect("a queued file");
        f.outstanding += chain.len() as u32;
        self.ops_out += chain.len();
        Ok(())
    }

    fn submit(&mut self) -> Result<(), SyncError> {
        loop {
            let submitted = self
                .ring
                .as_mut()
                .expect("the ring is there until drop")
                .submit();
            match submitted {
                Ok(_) => return Ok(()),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc_errno::EINTR | libc_errno::EAGAIN | libc_errno::EBUSY)
                    ) =>
                {
                    // The completion queue is full: take what is there.
                    self.reap();
                }
                Err(e) => {
                    self.failed = true;
                    return Err(SyncError::io(
                        "submitting file writes to io_uring".to_owned(),
                        e,
                    ));
                }
            }
        }
    }

    /// Blocks until at least one completion is there (or the wait was
    /// interrupted, or the completion queue is full), then takes them.
    fn wait(&mut self) -> Result<(), SyncError> {
        let waited = self
            .ring
            .as_mut()
            .expect("the ring is there until drop")
            .submit_and_wait(1);
        if let Err(e) = waited
            && !matches!(
                e.raw_os_error(),
                Some(libc_errno::EINTR | libc_errno::EAGAIN | libc_errno::EBUSY)
            )
        {
            self.failed = true;
            return Err(SyncError::io(
                "waiting for io_uring file writes".to_owned(),
                e,
            ));
        }
        self.reap();
        Ok(())
    }

    /// Takes every completion there is and moves its file on.
    fn reap(&mut self) {
        let ring = self.ring.as_mut().expect("the ring is there until drop");
        self.completions
            .extend(ring.completion().map(|c| (c.user_data(), c.result())));
        let ready = std::mem::take(&mut self.completions);
        for &(data, res) in &ready {
            self.complete(data, res);
        }
        self.completions = ready;
        self.completions.clear();
    }

    fn complete(&mut self, data: u64, res: i32) {
        let id = (data >> OP_BITS) as usize;
        let op = data & ((1 << OP_BITS) - 1);
        self.ops_out -= 1;
        let f = self.files[id]
            .as_mut()
            .expect("a completion of a queued file");
        f.outstanding -= 1;
        let failed = |what: String| SyncError::io(what, os_error(-res));
        let failure = match op {
            OP_OPEN if res >= 0 => {
                f.opened = true;
                None
            }
            OP_OPEN => Some(failed(format!("creating a temp file for {}", f.path))),
            OP_CLOSE if res >= 0 => {
                f.closed = true;
                None
            }
            // Cancelled with a failed create: the slot holds nothing.
            OP_CLOSE if !f.opened => None,
            OP_CLOSE => Some(failed(format!("closing {}", f.path))),
            OP_STAT_MADE | OP_STAT_PLACED if res < 0 => Some(failed(format!("stat {}", f.path))),
            OP_RENAME if res >= 0 => {
                f.renamed = true;
                None
            }
            OP_RENAME => Some(failed(format!("renaming into {}", f.path))),
            OP_STAT_MADE | OP_STAT_PLACED => None,
            write => {
                let k = (write - OP_WRITE) as usize;
                if res < 0 {
                    Some(failed(format!("writing {}", f.path)))
                } else if res as usize != f.pieces[k].len() {
                    Some(SyncError::Storage(format!(
                        "writing {}: {res} of {} bytes written",
                        f.path,
                        f.pieces[k].len()
                    )))
                } else {
                    None
                }
            }
        };
        // The first error is the one worth reporting (those after it are
        // cancellations).
        if f.failure.is_none() {
            f.failure = failure;
        }
        if f.outstanding == 0 {
            if f.placing {
                self.placed(id);
            } else {
                self.made(id);
            }
        }
    }

    /// The first chain of file `id` is over: set the mtime and queue the
    /// rename, or give the file up.
    fn made(&mut self, id: usize) {
        let f = self.files[id].as_mut().expect("a queued file");
        if f.opened && !f.closed {
            // The slot may still hold the file: never hand it out again.
            self.reusable = false;
        } else {
            self.free_slots.push(f.slot);
        }
        let prepared = match f.failure.take() {
            Some(err) => Err(err),
            None => super::failpoint::hit("apply-before-rename")
                .map_err(|e| SyncError::io(format!("renaming into {}", f.path), e))
                .and_then(|()| set_mtime(path_of(&f.tmp), f.mtime_ms, &f.path)),
        };
        let placing = match prepared {
            Ok(()) => {
                f.placing = true;
                let chain = place_chain(f, id);
                self.push_chain(id, &chain)
            }
            Err(e) => Err(e),
        };
        if let Err(err) = placing {
            let f = self.files[id].as_mut().expect("a queued file");
            if f.opened {
                let _ = std::fs::remove_file(path_of(&f.tmp));
            }
            self.finish(id, Err(err));
        }
    }

    /// The second chain of file `id` is over: its stat, or its error.
    fn placed(&mut self, id: usize) {
        let f = self.files[id].as_mut().expect("a queued file");
        let result = match f.failure.take() {
            Some(err) => {
                if !f.renamed {
                    let _ = std::fs::remove_file(path_of(&f.tmp));
                }
                Err(err)
            }
            None => {
                // SAFETY: both statx completed successfully, so the kernel
                // filled both buffers.
                let (made, placed) =
                    unsafe { (f.made.assume_init_ref(), f.placed.assume_init_ref()) };
                let made = Stat::of_statx(made);
                let mut stat = Stat::of_statx(placed);
                if (stat.dev, stat.ino) != (made.dev, made.ino) {
                    // Another process's file took the name after the
                    // rename: the row records the file apply made, which
                    // differs from it.
                    (stat.dev, stat.ino) = (made.dev, made.ino);
                    Ok(stat)
                } else if u32::from(placed.stx_mode) & 0o7777 != f.mode & 0o7777 {
                    exact_mode(path_of(&f.abs), f.mode, &made, &f.path)
                } else {
                    Ok(stat)
                }
            }
        };
        // Rows record the mode asked for (`Stat::applied`).
        let mode = f.mode & wsd_sync::MODE_MASK;
        self.finish(id, result.map(|s| Stat { mode, ..s }));
    }

    fn finish(&mut self, id: usize, result: Result<Stat, SyncError>) {
        let f = self.files[id].take().expect("a queued file");
        debug_assert_eq!(f.outstanding, 0);
        self.free_ids.push(id);
        self.in_flight -= 1;
        self.done.push_back((f.row, result));
    }

    /// The ring failed while files were in it: each reports `err`, and
    /// their buffers are kept (and leaked at drop), as the kernel may
    /// still be using them.
    fn abandon(&mut self, err: &SyncError) {
        self.failed = true;
        for slot in &mut self.files {
            if let Some(f) = slot.take() {
                self.abandoned
                    .push((f.tmp, f.abs, f.pieces, f.made, f.placed));
                self.done.push_back((
                    f.row,
                    Err(SyncError::Storage(format!("writing {}: {err}", f.path))),
                ));
            }
        }
        self.in_flight = 0;
    }
}

impl<T> Drop for RingWriter<T> {
    fn drop(&mut self) {
        // Every operation still in the kernel points into our buffers.
        while self.ops_out > 0 && !self.failed {
            if self.wait().is_err() {
                break;
            }
        }
        if self.ops_out > 0 || !self.abandoned.is_empty() {
            std::mem::forget(std::mem::take(&mut self.files));
            std::mem::forget(std::mem::take(&mut self.abandoned));
            return;
        }
        if self.reusable
            && !self.failed
            && self.free_slots.len() == SLOTS as usize
            && let Some(ring) = self.ring.take()
        {
            SPARE.with(|s| *s.borrow_mut() = Some(ring));
        }
    }
}

/// A path kept as a C string for the ring, as a `Path` again.
fn path_of(c: &CString) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(c.as_bytes()))
}

/// Create, write, close and stat the temp name of `f` (file `id`).
fn create_chain<T>(f: &mut RingFile<T>, id: usize) -> Vec<squeue::Entry> {
    let tag = |op: u64| ((id as u64) << OP_BITS) | op;
    let cwd = types::Fd(rustix::fs::CWD.as_raw_fd());
    let slot = types::DestinationSlot::try_from_slot_target(f.slot)
        .expect("slots are below the registered table size");
    // No O_CLOEXEC: a fixed slot is no descriptor, and io_uring refuses it.
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
    let mut chain = Vec::with_capacity(f.pieces.len() + 3);
    chain.push(
        opcode::OpenAt::new(cwd, f.tmp.as_ptr())
            .file_index(Some(slot))
            .flags(flags.bits() as i32)
            .mode(f.mode & 0o777)
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(tag(OP_OPEN)),
    );
    let mut offset = 0u64;
    for (k, bytes) in f.pieces.iter().enumerate() {
        // Hard links: a failed write still leads to the close, so the
        // slot is always emptied once the create succeeded.
        chain.push(
            opcode::Write::new(types::Fixed(f.slot), bytes.as_ptr(), bytes.len() as u32)
                .offset(offset)
                .build()
                .flags(squeue::Flags::IO_HARDLINK)
                .user_data(tag(OP_WRITE + k as u64)),
        );
        offset += bytes.len() as u64;
    }
    chain.push(
        opcode::Close::new(types::Fixed(f.slot))
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(tag(OP_CLOSE)),
    );
    chain.push(
        opcode::Statx::new(cwd, f.tmp.as_ptr(), f.made.as_mut_ptr().cast())
            .flags(AtFlags::SYMLINK_NOFOLLOW.bits() as i32)
            .mask(StatxFlags::BASIC_STATS.bits())
            .build()
            .user_data(tag(OP_STAT_MADE)),
    );
    chain
}

/// Rename the temp name of `f` (file `id`) onto its target, then stat it.
fn place_chain<T>(f: &mut RingFile<T>, id: usize) -> Vec<squeue::Entry> {
    let tag = |op: u64| ((id as u64) << OP_BITS) | op;
    let cwd = types::Fd(rustix::fs::CWD.as_raw_fd());
    vec![
        opcode::RenameAt::new(cwd, f.tmp.as_ptr(), cwd, f.abs.as_ptr())
            .build()
            .flags(squeue::Flags::IO_LINK)
            .user_data(tag(OP_RENAME)),
        opcode::Statx::new(cwd, f.abs.as_ptr(), f.placed.as_mut_ptr().cast())
            .flags(AtFlags::SYMLINK_NOFOLLOW.bits() as i32)
            .mask(StatxFlags::BASIC_STATS.bits())
            .build()
            .user_data(tag(OP_STAT_PLACED)),
    ]
}

/// Sets the mtime of the temp file at `tmp` (the access time left as it
/// is, which raises `MODIFY` on a name the watcher ignores).
fn set_mtime(tmp: &Path, mtime_ms: i64, path: &SyncPath) -> Result<(), SyncError> {
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: 0,
            tv_nsec: rustix::fs::UTIME_OMIT,
        },
        last_modification: Timespec {
            tv_sec: mtime_ms.div_euclid(1000),
            tv_nsec: mtime_ms.rem_euclid(1000) * 1_000_000,
        },
    };
    rustix::fs::utimensat(rustix::fs::CWD, tmp, &times, AtFlags::SYMLINK_NOFOLLOW)
        .map_err(|e| SyncError::io(format!("setting the mtime of {path}"), e.into()))
}

/// The mode the create did not give exactly (a default ACL narrows it
/// where a umask would not) set on the file at `abs`, if it is still the
/// one apply made; its stat after that.
fn exact_mode(abs: &Path, mode: u32, made: &Stat, path: &SyncPath) -> Result<Stat, SyncError> {
    let file =
        fsutil::open_nofollow(abs).map_err(|e| SyncError::io(format!("opening {path}"), e))?;
    let meta = file
        .metadata()
        .map_err(|e| SyncError::io(format!("stat {path}"), e))?;
    let now = Stat::of(&meta);
    if (now.dev, now.ino) != (made.dev, made.ino) {
        return Ok(Stat {
            dev: made.dev,
            ino: made.ino,
            ..now
        });
    }
    let meta = fsutil::stat_written(&file, mode, path)?;
    Ok(Stat::of(&meta))
}

/// The errno values the ring's calls are retried on.
mod libc_errno {
    pub const EINTR: i32 = rustix::io::Errno::INTR.raw_os_error();
    pub const EAGAIN: i32 = rustix::io::Errno::AGAIN.raw_os_error();
    pub const EBUSY: i32 = rustix::io::Errno::BUSY.raw_os_error();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn job(
        dir: &Path,
        name: &str,
        seq: u32,
        chunks: &[&[u8]],
        mode: u32,
        mtime_ms: i64,
    ) -> RingJob {
        RingJob {
            path: SyncPath::new(name).unwrap(),
            tmp: dir.join(format!("{}test-{seq}", fsutil::APPLY_TEMP_PREFIX)),
            abs: dir.join(name),
            mode,
            mtime_ms,
            bytes: chunks.iter().map(|c| Arc::new(c.to_vec())).collect(),
        }
    }

    #[test]
    fn files_written_through_the_ring_have_their_bytes_mode_mtime_and_stat() {
        if !fsutil::umask_keeps(0o644) {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("replaced"), b"old").unwrap();
        let Ok(mut ring) = RingWriter::<&str>::new() else {
            eprintln!("io_uring unavailable here; nothing to test");
            return;
        };
        let big = vec![7u8; 70_000];
        let specs: [(&str, Vec<&[u8]>, i64); 4] = [
            ("a", vec![&b"hello "[..], &b"world"[..]], 1_600_000_000_123),
            ("empty", vec![], 1_000),
            ("replaced", vec![&big[..], &b"tail"[..]], -1_500),
            ("b", vec![&b"x"[..]], 0),
        ];
        for (i, (name, chunks, mtime)) in specs.iter().enumerate() {
            let j = job(tmp.path(), name, i as u32, chunks, 0o644, *mtime);
            assert!(takes(true, j.bytes.len(), false, 0o644));
            ring.queue(j, *name).unwrap();
        }
        let mut seen = 0;
        while let Some((name, result)) = ring.next() {
            seen += 1;
            let stat = result.unwrap();
            let (_, chunks, mtime) = specs.iter().find(|s| s.0 == name).unwrap();
            let abs = tmp.path().join(name);
            assert_eq!(std::fs::read(&abs).unwrap(), chunks.concat(), "{name}");
            let meta = std::fs::symlink_metadata(&abs).unwrap();
            assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
            assert_eq!(meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000, *mtime);
            assert_eq!(stat, Stat::applied(&meta, 0o644), "{name}");
        }
        assert_eq!(seen, specs.len());
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| fsutil::is_apply_temp(n))
            .collect();
        assert!(names.is_empty(), "temp names left: {names:?}");
    }

    #[test]
    fn a_file_that_cannot_be_created_reports_its_error_and_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let Ok(mut ring) = RingWriter::<u32>::new() else {
            return;
        };
        // No such directory: the create fails, the rest of its chain is
        // cancelled.
        let missing = tmp.path().join("missing");
        ring.queue(job(&missing, "f", 1, &[&b"bytes"[..]], 0o644, 0), 1)
            .unwrap();
        // A temp name that exists (not apply's to replace or remove).
        let taken = job(tmp.path(), "g", 2, &[&b"bytes"[..]], 0o644, 0);
        std::fs::write(&taken.tmp, b"someone's").unwrap();
        let taken_tmp = taken.tmp.clone();
        ring.queue(taken, 2).unwrap();
        // A target that is a directory: the rename fails.
        std::fs::create_dir(tmp.path().join("h")).unwrap();
        std::fs::write(tmp.path().join("h/inside"), b"").unwrap();
        ring.queue(job(tmp.path(), "h", 3, &[&b"bytes"[..]], 0o644, 0), 3)
            .unwrap();
        let mut errors = Vec::new();
        while let Some((row, result)) = ring.next() {
            errors.push((row, result.unwrap_err().to_string()));
        }
        errors.sort();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(
            errors[0].1.contains("creating a temp file for f"),
            "{errors:?}"
        );
        assert!(
            errors[1].1.contains("creating a temp file for g"),
            "{errors:?}"
        );
        assert!(errors[2].1.contains("renaming into h"), "{errors:?}");
        assert_eq!(std::fs::read(&taken_tmp).unwrap(), b"someone's");
        assert!(tmp.path().join("h").is_dir());
        let temps: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                *p != taken_tmp && fsutil::is_apply_temp(p.file_name().unwrap().to_str().unwrap())
            })
            .collect();
        assert!(temps.is_empty(), "{temps:?}");
        drop(ring);
        // The ring is whole again for the next apply on this thread.
        let mut again = RingWriter::<u32>::new().unwrap();
        again
            .queue(job(tmp.path(), "i", 4, &[&b"ok"[..]], 0o644, 0), 4)
            .unwrap();
        assert!(again.next().unwrap().1.is_ok());
        assert_eq!(std::fs::read(tmp.path().join("i")).unwrap(), b"ok");
    }
}
