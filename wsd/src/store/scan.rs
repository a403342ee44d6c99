//! Settle: compare the directory with the index and stamp what changed.
//!
//! A path is clean when its `lstat` equals the indexed stat (mode, size,
//! mtime, ctime, dev, inode) and it is not *racily clean*: a file whose
//! mtime is within [`index::RACY_MARGIN_NS`] of the moment it was last hashed may
//! have been rewritten in the same timestamp tick after hashing, so it is
//! hashed again (git's racy-clean rule). Only changed content, mode, kind
//! or symlink target stamps a rev; a stat-only difference (touch, a rename
//! over the same bytes) refreshes the row silently. A directory differs
//! only by kind or mode: its mtime moves with every child and is not state.

use std::collections::HashSet;
use std::fs::Metadata;
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use wsd_sync::{ChunkRef, SyncError, SyncPath, chunk, manifest};

use super::SettleReport;
use super::error::IoContext;
use super::fsutil::{self, DiskKind};
use super::index::{self, ChildRow, Node, NodeKind, Stat};
use super::watch::{LocalWatcher, WatchFailure};

/// True when a row's stat matching the disk does not prove its content
/// ([`Stat::is_racy`]).
pub(crate) fn is_racy(node: &Node) -> bool {
    node.stat.is_racy(node.verified_ns)
}

/// True when `stat` (from disk) shows no change against the row's kind and
/// stat. Directories compare by mode only.
pub(crate) fn stat_matches(node: &Node, kind: DiskKind, stat: &Stat) -> bool {
    match (node.kind, kind) {
        (NodeKind::File, DiskKind::File) => node.stat == *stat,
        (NodeKind::Dir, DiskKind::Dir) => node.stat.mode == stat.mode,
        (NodeKind::Symlink, DiskKind::Symlink) => node.stat == *stat,
        _ => false,
    }
}

/// One settle pass inside one index transaction. The rev is allocated on
/// the first change, so a settle that finds nothing leaves the counter.
pub(crate) struct Scan<'a> {
    pub db: &'a Connection,
    pub root: &'a Path,
    pub state_dir: &'a Path,
    pub started_ns: i64,
    pub rev: Option<u64>,
    pub report: SettleReport,
    pub watch: &'a mut Option<LocalWatcher>,
    /// Set when the watcher failed for good during this pass.
    pub watch_lost: Option<String>,
    /// Paths to hash even if their stat matches (a read found them changed).
    pub force: &'a HashSet<SyncPath>,
    /// The startup walk also removes apply temp files a crash left behind.
    pub remove_stale_temps: bool,
    /// Files found changed whose hashing is deferred, so that many are
    /// hashed at once on several threads ([`Scan::flush_hashes`]).
    pub pending: Vec<PendingHash>,
}

/// A file `observe` found changed, waiting to be hashed.
#[derive(Debug)]
pub(crate) struct PendingHash {
    rel: SyncPath,
    abs: PathBuf,
    /// Its live row when observed.
    live: Option<Node>,
    size: u64,
}

/// Deferred files are hashed once this many are pending, or this many
/// bytes: enough to keep every hashing thread busy, few enough that the
/// pending rows stay small.
const FLUSH_FILES: usize = 1024;
const FLUSH_BYTES: u64 = 256 * 1024 * 1024;

impl Scan<'_> {
    fn rev(&mut self) -> Result<u64, SyncError> {
        if let Some(r) = self.rev {
            return Ok(r);
        }
        let r = index::next_rev(self.db)?;
        self.rev = Some(r);
        self.report.rev = Some(r);
        Ok(r)
    }

    fn tombstone(&mut self, rel: &SyncPath) -> Result<(), SyncError> {
        let rev = self.rev()?;
        self.report.deleted += index::tombstone_subtree(self.db, rel, rev, None)?;
        Ok(())
    }

    fn put(
        &mut self,
        node: Node,
        chunks: &[ChunkRef],
        was: Option<&Node>,
    ) -> Result<(), SyncError> {
        // A directory replaced by another kind takes its indexed subtree along.
        if was.is_some_and(|w| w.kind == NodeKind::Dir) && node.kind != NodeKind::Dir {
            let rev = node.rev;
            self.report.deleted += index::tombstone_descendants(self.db, &node.path, rev, None)?;
        }
        index::put_node(self.db, &node, chunks)?;
        self.report.changed += 1;
        Ok(())
    }

    /// Compares one path with its row and records the difference. `meta` is
    /// its `lstat`, `None` when it does not exist (inside the root).
    pub fn observe(&mut self, rel: &SyncPath, meta: Option<&Metadata>) -> Result<(), SyncError> {
        let row = index::get_node(self.db, rel)?;
        let live = row.filter(Node::is_live);
        let kind = meta.map_or(DiskKind::Unsupported, fsutil::kind_of);
        if kind == DiskKind::Unsupported {
            if live.is_some() {
                self.tombstone(rel)?;
            }
            return Ok(());
        }
        let meta = meta.expect("a supported kind has metadata");
        let stat = Stat::of(meta);
        let forced = self.force.contains(rel);
        if let Some(n) = &live
            && stat_matches(n, kind, &stat)
            && !(kind == DiskKind::File && (is_racy(n) || forced))
        {
            return Ok(());
        }
        let abs = fsutil::abs(self.root, rel);
        match kind {
            DiskKind::File => {
                self.pending.push(PendingHash {
                    rel: rel.clone(),
                    abs,
                    live,
                    size: stat.size,
                });
                let bytes: u64 = self.pending.iter().map(|p| p.size).sum();
                if self.pending.len() >= FLUSH_FILES || bytes >= FLUSH_BYTES {
                    self.flush_hashes()?;
                }
                Ok(())
            }
            DiskKind::Dir => {
                let node = Node {
                    path: rel.clone(),
                    kind: NodeKind::Dir,
                    stat,
                    target: None,
                    manifest: None,
                    verified_ns: self.started_ns,
                    rev: self.rev()?,
                    applied_from: None,
                };
                self.put(node, &[], live.as_ref())
            }
            DiskKind::Symlink => {
                let target = match fsutil::read_link_utf8(&abs) {
                    Ok(Some(t)) if !t.is_empty() => t,
                    Ok(_) => {
                        tracing::warn!(path = %rel, "symlink target is not UTF-8; not synced");
                        if live.is_some() {
                            self.tombstone(rel)?;
                        }
                        return Ok(());
                    }
                    Err(e) if fsutil::is_gone(&e) => return Ok(()),
                    Err(e) => return Err(SyncError::io(format!("reading link {rel}"), e)),
                };
                if let Some(n) = &live
                    && n.kind == NodeKind::Symlink
                    && n.target.as_deref() == Some(target.as_str())
                    && n.stat.mode == stat.mode
                {
                    index::refresh_stat(self.db, rel, &stat, self.started_ns)?;
                    return Ok(());
                }
                let node = Node {
                    path: rel.clone(),
                    kind: NodeKind::Symlink,
                    stat,
                    target: Some(target),
                    manifest: None,
                    verified_ns: self.started_ns,
                    rev: self.rev()?,
                    applied_from: None,
                };
                self.put(node, &[], live.as_ref())
            }
            DiskKind::Unsupported => unreachable!("handled above"),
        }
    }

    /// Hashes every deferred file (on several threads when there is enough
    /// work) and records the results, in the order they were observed.
    pub fn flush_hashes(&mut self) -> Result<(), SyncError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let pending = std::mem::take(&mut self.pending);
        let hashed = hash_files(&pending);
        for (p, result) in pending.into_iter().zip(hashed) {
            self.record_file(p.rel, p.live, result?)?;
        }
        Ok(())
    }

    fn record_file(
        &mut self,
        rel: SyncPath,
        live: Option<Node>,
        hashed: Option<(Vec<ChunkRef>, Stat)>,
    ) -> Result<(), SyncError> {
        let Some((chunks, stat)) = hashed else {
            // Vanished or replaced while we looked: its own event (or the
            // next walk) records what is there now.
            return Ok(());
        };
        self.report.hashed += 1;
        let mhash = manifest::hash(&chunks);
        if let Some(n) = &live
            && n.kind == NodeKind::File
            && n.manifest == Some(mhash)
            && n.stat.mode == stat.mode
        {
            index::refresh_stat(self.db, &rel, &stat, self.started_ns)?;
            return Ok(());
        }
        let node = Node {
            path: rel,
            kind: NodeKind::File,
            stat,
            target: None,
            manifest: Some(mhash),
            verified_ns: self.started_ns,
            rev: self.rev()?,
            applied_from: None,
        };
        self.put(node, &chunks, live.as_ref())
    }

    /// True when a directory entry is clean against its live row: the
    /// walk's fast path, which builds no path and runs no query.
    fn clean(
        &self,
        row: &ChildRow,
        meta: &Metadata,
        child: impl FnOnce() -> Option<SyncPath>,
    ) -> bool {
        let kind = fsutil::kind_of(meta);
        let stat = Stat::of(meta);
        let matches = match (row.kind, kind) {
            (NodeKind::File, DiskKind::File) | (NodeKind::Symlink, DiskKind::Symlink) => {
                row.stat == stat
            }
            (NodeKind::Dir, DiskKind::Dir) => row.stat.mode == stat.mode,
            _ => false,
        };
        if !matches || kind != DiskKind::File {
            return matches;
        }
        if row.stat.is_racy(row.verified_ns) {
            return false;
        }
        self.force.is_empty() || child().is_none_or(|c| !self.force.contains(&c))
    }

    /// Walks the directory `start` (`None` = the root): observes it, then
    /// every entry below it, and tombstones indexed children that are gone.
    /// Each directory is watched before it is listed.
    pub fn walk(&mut self, start: Option<&SyncPath>) -> Result<(), SyncError> {
        if let Some(s) = start {
            let meta = fsutil::lstat_in_root(self.root, s).io_ctx(|| format!("stat {s}"))?;
            self.observe(s, meta.as_ref())?;
            if !meta.is_some_and(|m| m.file_type().is_dir()) {
                return self.flush_hashes();
            }
        }
        if self.watch.is_none() && walk_threads() > 1 {
            self.walk_parallel(start)?;
            return self.flush_hashes();
        }
        let mut stack: Vec<Option<SyncPath>> = vec![start.cloned()];
        while let Some(dir) = stack.pop() {
            let dir_abs = match &dir {
                Some(d) => fsutil::abs(self.root, d),
                None => self.root.to_owned(),
            };
            if let Some(w) = self.watch.as_mut() {
                match w.watch_dir(&dir_abs) {
                    Ok(()) => {}
                    Err(WatchFailure::Gone) => continue,
                    Err(WatchFailure::Fatal(reason)) => {
                        *self.watch = None;
                        self.watch_lost = Some(reason);
                    }
                }
            }
            // Replaced or removed since it was observed: the event for that
            // (or the next walk) records it.
            let Some(listed) = list_dir(&dir_abs, self.state_dir)? else {
                continue;
            };
            let subdirs = self.process_dir(&dir, &dir_abs, listed)?;
            stack.extend(subdirs.into_iter().map(Some));
        }
        self.flush_hashes()
    }

    /// The walk without a watcher (the CLI, a daemon without inotify):
    /// directories are listed and `lstat`-ed on [`walk_threads`] threads
    /// (the kernel work that bounds a no-op walk) while this thread compares
    /// each listing with the index as it arrives. Rows are per path, so the
    /// order listings arrive in does not matter.
    ///
    /// Kept hand-rolled (issue 15 item 8 allows it when measurably faster):
    /// `ignore::WalkParallel` was tried in its place, its threads listing
    /// and `lstat`-ing each entry into per-directory listings that this
    /// thread then compared. On the no-op push of the mixed profile (10,426
    /// entries; whole `wsd push` process, 15 alternating A/B pairs, load
    /// average 8.9 on 2 cores) this walk used 0.81x the CPU of that one
    /// (50 vs 63 ms) and 0.59x its wall time (99 vs 171 ms): `ignore` stats
    /// every entry by its full path (a lookup per component) where
    /// [`list_dir`] stats relative to the open directory, and it yields
    /// entries one by one, so the comparison can only start once the walk
    /// is over instead of overlapping it.
    fn walk_parallel(&mut self, start: Option<&SyncPath>) -> Result<(), SyncError> {
        struct Queue {
            dirs: Vec<(Option<SyncPath>, PathBuf)>,
            /// Directories queued or being listed.
            outstanding: usize,
            abort: bool,
        }
        type Msg = Result<(Option<SyncPath>, PathBuf, Option<Vec<Listed>>), SyncError>;
        let start_abs = match start {
            Some(d) => fsutil::abs(self.root, d),
            None => self.root.to_owned(),
        };
        let queue = (
            std::sync::Mutex::new(Queue {
                dirs: vec![(start.cloned(), start_abs)],
                outstanding: 1,
                abort: false,
            }),
            std::sync::Condvar::new(),
        );
        let state_dir = self.state_dir.to_owned();
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(64);
            for _ in 0..walk_threads() {
                let (tx, queue, state_dir) = (tx.clone(), &queue, &state_dir);
                s.spawn(move || {
                    let (lock, cvar) = queue;
                    loop {
                        let (dir, dir_abs) = {
                            let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
                            loop {
                                if q.abort {
                                    return;
                                }
                                if let Some(job) = q.dirs.pop() {
                                    break job;
                                }
                                if q.outstanding == 0 {
                                    cvar.notify_all();
                                    return;
                                }
                                q = cvar.wait(q).unwrap_or_else(|p| p.into_inner());
                            }
                        };
                        let listed = list_dir(&dir_abs, state_dir);
                        if let Ok(Some(entries)) = &listed {
                            let subdirs: Vec<_> = entries
                                .iter()
                                .filter_map(|(name, meta)| {
                                    let meta = meta.as_ref()?;
                                    if !meta.file_type().is_dir() {
                                        return None;
                                    }
                                    let child = child_path(&dir, name)?;
                                    Some((Some(child), dir_abs.join(name)))
                                })
                                .collect();
                            let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
                            q.outstanding += subdirs.len();
                            q.dirs.extend(subdirs);
                            cvar.notify_all();
                        }
                        let failed = tx.send(listed.map(|l| (dir, dir_abs, l))).is_err();
                        let mut q = lock.lock().unwrap_or_else(|p| p.into_inner());
                        q.outstanding -= 1;
                        q.abort |= failed;
                        if q.outstanding == 0 || failed {
                            cvar.notify_all();
                        }
                    }
                });
            }
            drop(tx);
            let mut result = Ok(());
            for msg in rx.iter() {
                let step = msg.and_then(|(dir, dir_abs, listed)| match listed {
                    Some(listed) => self.process_dir(&dir, &dir_abs, listed).map(|_| ()),
                    None => Ok(()),
                });
                if let Err(e) = step {
                    result = Err(e);
                    break;
                }
            }
            if result.is_err() {
                let (lock, cvar) = &queue;
                lock.lock().unwrap_or_else(|p| p.into_inner()).abort = true;
                cvar.notify_all();
            }
            // Dropping the receiver unblocks a worker waiting to send.
            drop(rx);
            result
        })
    }

    /// Compares one listed directory with its rows: observes what changed,
    /// tombstones indexed children that are gone, and returns the
    /// subdirectories to walk.
    fn process_dir(
        &mut self,
        dir: &Option<SyncPath>,
        dir_abs: &Path,
        listed: Vec<Listed>,
    ) -> Result<Vec<SyncPath>, SyncError> {
        // One query for the directory's rows; each entry on disk takes its
        // row out, and what is left was removed.
        let parent_key = dir.as_ref().map(SyncPath::as_str).unwrap_or("");
        let mut rows = index::live_children(self.db, parent_key)?;
        let mut subdirs = Vec::new();
        for (name, meta) in listed {
            let Ok(name) = name.into_string() else {
                continue;
            };
            if fsutil::is_apply_temp(&name) {
                if self.remove_stale_temps {
                    let child_abs = dir_abs.join(&name);
                    tracing::info!(path = %child_abs.display(), "removing a stale apply temp file");
                    let _ = std::fs::remove_file(&child_abs);
                }
                continue;
            }
            let join = || match dir {
                Some(d) => d.join(&name),
                None => SyncPath::new(name.clone()),
            };
            let row = rows.remove(&name);
            let is_dir = meta.as_ref().is_some_and(|m| m.file_type().is_dir());
            if let (Some(row), Some(m)) = (&row, &meta)
                && !is_dir
                && self.clean(row, m, || join().ok())
            {
                continue;
            }
            let child = match join() {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(path = %dir_abs.join(&name).display(), error = %e, "not synced");
                    continue;
                }
            };
            if let (Some(row), Some(m)) = (&row, &meta)
                && is_dir
                && self.clean(row, m, || None)
            {
                subdirs.push(child);
                continue;
            }
            self.observe(&child, meta.as_ref())?;
            if is_dir {
                subdirs.push(child);
            }
        }
        let mut gone: Vec<String> = rows.into_keys().collect();
        gone.sort_unstable();
        for name in gone {
            let child = match dir {
                Some(d) => d.join(&name)?,
                None => SyncPath::new(name)?,
            };
            self.tombstone(&child)?;
        }
        Ok(subdirs)
    }
}

/// A directory entry as listed: its name and its `lstat` (`None` when it
/// vanished in between).
type Listed = (std::ffi::OsString, Option<Metadata>);

/// Lists `dir_abs` and `lstat`s its entries (relative to the directory's
/// descriptor), leaving out the state directory; names that cannot be
/// synced are listed without a stat. `None` when the directory is gone.
fn list_dir(dir_abs: &Path, state_dir: &Path) -> Result<Option<Vec<Listed>>, SyncError> {
    let rd = match std::fs::read_dir(dir_abs) {
        Ok(rd) => rd,
        Err(e) if fsutil::is_gone(&e) => return Ok(None),
        Err(e) => return Err(SyncError::io(format!("listing {}", dir_abs.display()), e)),
    };
    let state_here = state_dir.parent() == Some(dir_abs);
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.io_ctx(|| format!("listing {}", dir_abs.display()))?;
        let name = ent.file_name();
        if state_here && state_dir.file_name() == Some(name.as_os_str()) {
            continue;
        }
        let Some(utf8) = name.to_str() else {
            tracing::warn!(path = %ent.path().display(), "name is not UTF-8; not synced");
            continue;
        };
        if fsutil::is_apply_temp(utf8) {
            out.push((name, None));
            continue;
        }
        let meta = match ent.metadata() {
            Ok(m) => Some(m),
            Err(e) if fsutil::is_gone(&e) => None,
            Err(e) => return Err(SyncError::io(format!("stat {}", ent.path().display()), e)),
        };
        out.push((name, meta));
    }
    Ok(Some(out))
}

/// The workspace path of `name` in `dir`, when it is one a walk descends
/// into (a valid, non-temp name).
fn child_path(dir: &Option<SyncPath>, name: &std::ffi::OsStr) -> Option<SyncPath> {
    let name = name.to_str()?;
    if fsutil::is_apply_temp(name) {
        return None;
    }
    match dir {
        Some(d) => d.join(name).ok(),
        None => SyncPath::new(name.to_owned()).ok(),
    }
}

/// Threads a walk without a watcher lists directories on: one per core, at
/// most 4 (`lstat` and `getdents` are what a no-op walk spends its time in).
fn walk_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(4)
}

/// What [`hash_file`] returns for one file.
type Hashed = Result<Option<(Vec<ChunkRef>, Stat)>, SyncError>;

/// The pool [`hash_files`] runs on: one thread per core, at most 8, since
/// each keeps a [`HASH_BUF`] of several MiB for the life of the process
/// (rayon's global pool has no such cap). `None` if it could not start:
/// hashing then runs on the caller's thread.
static HASH_POOL: std::sync::LazyLock<Option<rayon::ThreadPool>> = std::sync::LazyLock::new(|| {
    let n = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(8);
    rayon::ThreadPoolBuilder::new()
        .num_threads(n)
        .thread_name(|i| format!("wsd-hash-{i}"))
        .build()
        .inspect_err(|e| tracing::warn!(error = %e, "no hashing pool; hashing on one thread"))
        .ok()
});

/// Hashes `files` with [`hash_file`], on [`HASH_POOL`] when there is
/// enough work to share. Results are in input order.
fn hash_files(files: &[PendingHash]) -> Vec<Hashed> {
    use rayon::prelude::*;
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    // Below a few MiB handing files to the pool costs more than it saves.
    let pool = HASH_POOL.as_ref();
    let Some(pool) = pool.filter(|_| files.len() > 1 && bytes >= 4 * 1024 * 1024) else {
        return files.iter().map(|f| hash_file(&f.abs)).collect();
    };
    // One file per task: sizes vary from bytes to many MiB, and work
    // stealing balances them across cores.
    pool.install(|| {
        files
            .par_iter()
            .with_max_len(1)
            .map(|f| hash_file(&f.abs))
            .collect()
    })
}

thread_local! {
    /// The read window of [`hash_file`], reused across files on a thread.
    static HASH_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads and chunks a regular file without following a symlink. Returns the
/// chunk list and the stat taken *before* reading (so a write racing the
/// read leaves a stat that differs next time), or `None` when the file is
/// gone or no longer a regular file.
pub(crate) fn hash_file(abs: &Path) -> Result<Option<(Vec<ChunkRef>, Stat)>, SyncError> {
    // No symlink anywhere on the way (the root is canonical): a directory
    // swapped for a symlink since it was checked is never read through.
    let file = match fsutil::open_no_symlinks(abs) {
        Ok(f) => f,
        Err(e) if fsutil::is_gone(&e) || e.raw_os_error() == Some(fsutil::ELOOP) => {
            return Ok(None);
        }
        Err(e) => return Err(SyncError::io(format!("opening {}", abs.display()), e)),
    };
    let meta = file
        .metadata()
        .io_ctx(|| format!("stat {}", abs.display()))?;
    if !meta.file_type().is_file() {
        return Ok(None);
    }
    let chunks = HASH_BUF
        .with_borrow_mut(|buf| {
            chunk::chunk_reader_with(&file, buf, Some(meta.len()), |_, _| Ok(()))
        })
        .map_err(|e| SyncError::Storage(format!("hashing {}: {e}", abs.display())))?;
    Ok(Some((chunks, Stat::of(&meta))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::index::RACY_MARGIN_NS;

    #[test]
    fn hashing_many_mebibytes_on_the_pool_gives_each_file_its_own_chunks_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let files: Vec<PendingHash> = (0..6u8)
            .map(|i| {
                let abs = tmp.path().join(format!("f{i}"));
                let bytes: Vec<u8> = (0..1_000_000u32)
                    .map(|j| (j.wrapping_mul(2_654_435_761) >> 13) as u8 ^ i)
                    .collect();
                std::fs::write(&abs, &bytes).unwrap();
                PendingHash {
                    rel: SyncPath::new(format!("f{i}")).unwrap(),
                    abs,
                    live: None,
                    size: bytes.len() as u64,
                }
            })
            .collect();
        let pooled = hash_files(&files);
        assert!(
            HASH_POOL
                .as_ref()
                .is_some_and(|p| p.current_num_threads() <= 8)
        );
        for (f, got) in files.iter().zip(pooled) {
            let want = hash_file(&f.abs).unwrap().unwrap().0;
            assert_eq!(got.unwrap().unwrap().0, want, "{}", f.rel);
        }
    }

    fn file_node(mtime_ns: i64, verified_ns: i64) -> Node {
        Node {
            path: SyncPath::new("f").unwrap(),
            kind: NodeKind::File,
            stat: Stat {
                mode: 0o644,
                size: 3,
                mtime_ns,
                dev: 1,
                ino: 2,
                ctime_ns: mtime_ns,
            },
            target: None,
            manifest: None,
            verified_ns,
            rev: 1,
            applied_from: None,
        }
    }

    #[test]
    fn a_file_hashed_in_its_mtime_tick_is_racily_clean() {
        let s = 1_000_000_000_000;
        assert!(is_racy(&file_node(s, s)), "hashed in the same instant");
        assert!(
            is_racy(&file_node(s, s + RACY_MARGIN_NS)),
            "within the margin"
        );
        assert!(
            !is_racy(&file_node(s, s + RACY_MARGIN_NS + 1)),
            "well after the write"
        );
        assert!(
            is_racy(&file_node(s + 10, s)),
            "mtime in the future of the hash"
        );
    }

    #[test]
    fn directories_differ_by_mode_only() {
        let mut n = file_node(5, 10);
        n.kind = NodeKind::Dir;
        let mut stat = n.stat;
        stat.mtime_ns += 99;
        stat.ctime_ns += 99;
        assert!(stat_matches(&n, DiskKind::Dir, &stat));
        stat.mode = 0o700;
        assert!(!stat_matches(&n, DiskKind::Dir, &stat));
        assert!(!stat_matches(&n, DiskKind::File, &n.stat));
    }
}
