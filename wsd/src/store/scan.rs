//! Settle: compare the directory with the index and stamp what changed.
//!
//! A path is clean when its `lstat` equals the indexed stat (mode, size,
//! mtime, ctime, dev, inode) and it is not *racily clean*: a file whose
//! timestamps are within a tick of the moment it was last hashed may have
//! been rewritten in the same tick after hashing, so it is hashed again
//! (git's racy-clean rule, sharpened by ctime: [`Stat::is_racy`]). Only changed content, mode, kind
//! or symlink target stamps a rev; a stat-only difference (touch, a rename
//! over the same bytes) refreshes the row silently. A directory differs
//! only by kind or mode: its mtime moves with every child and is not state.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use wsd_sync::chunk::{self, KnownChunk};
use wsd_sync::{ChunkRef, SyncError, SyncPath, manifest};

use super::SettleReport;
use super::error::IoContext;
use super::fsutil::{self, DiskKind};
use super::index::{self, ChildRow, DirRows, Fingerprint, Node, NodeKind, Stat};
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
    /// The chunks of its indexed version with their fingerprints, when it
    /// is large enough to have them ([`FINGERPRINT_MIN_BYTES`]).
    previous: Option<Vec<KnownChunk<Fingerprint>>>,
}

impl PendingHash {
    /// A file with no row yet.
    pub fn new(rel: SyncPath, abs: PathBuf, size: u64) -> PendingHash {
        PendingHash {
            rel,
            abs,
            live: None,
            size,
            previous: None,
        }
    }

    pub fn into_rel(self) -> SyncPath {
        self.rel
    }
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
        fingerprints: Option<&[Fingerprint]>,
        was: Option<&Node>,
    ) -> Result<(), SyncError> {
        // A directory replaced by another kind takes its indexed subtree along.
        if was.is_some_and(|w| w.kind == NodeKind::Dir) && node.kind != NodeKind::Dir {
            let rev = node.rev;
            self.report.deleted += index::tombstone_descendants(self.db, &node.path, rev, None)?;
        }
        index::put_file_node(self.db, &node, chunks, fingerprints, true)?;
        self.report.changed += 1;
        Ok(())
    }

    /// Compares one path with its row and records the difference. `seen` is
    /// its `lstat`, `None` when it does not exist (inside the root).
    pub fn observe(&mut self, rel: &SyncPath, seen: Option<Seen>) -> Result<(), SyncError> {
        let row = index::get_node(self.db, rel)?;
        let live = row.filter(Node::is_live);
        let Some(Seen { kind, stat }) = seen.filter(|s| s.kind != DiskKind::Unsupported) else {
            if live.is_some() {
                self.tombstone(rel)?;
            }
            return Ok(());
        };
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
                    previous: None,
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
                self.put(node, &[], None, live.as_ref())
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
                self.put(node, &[], None, live.as_ref())
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
        let mut pending = std::mem::take(&mut self.pending);
        for p in &mut pending {
            // An edited large file: what did not change is checked by
            // fingerprint, not hashed again.
            if p.size >= FINGERPRINT_MIN_BYTES
                && p.live.as_ref().is_some_and(|n| n.kind == NodeKind::File)
            {
                p.previous = index::known_chunks(self.db, &p.rel)?;
            }
        }
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
        hashed: Option<HashedFile>,
    ) -> Result<(), SyncError> {
        let Some(HashedFile {
            chunks,
            fingerprints,
            stat,
        }) = hashed
        else {
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
        self.put(node, &chunks, fingerprints.as_deref(), live.as_ref())
    }

    /// True when a directory entry is clean against its live row: the
    /// walk's fast path, which builds no path and runs no query.
    fn clean(&self, row: &ChildRow, seen: &Seen, child: impl FnOnce() -> Option<SyncPath>) -> bool {
        let Seen { kind, stat } = *seen;
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
            let seen = meta.as_ref().map(Seen::of);
            self.observe(s, seen)?;
            if !seen.is_some_and(|m| m.kind == DiskKind::Dir) {
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
            let rows = self.rows_of(&dir, None)?;
            let subdirs = self.process_dir(&dir, &dir_abs, listed, rows)?;
            stack.extend(subdirs.into_iter().map(Some));
        }
        self.flush_hashes()
    }

    /// The walk without a watcher (the CLI, a daemon without inotify):
    /// directories are listed and `lstat`-ed on [`walk_threads`] threads
    /// (the kernel work that bounds a no-op walk) while this thread reads
    /// the whole index once ([`index::live_rows_by_parent`]) and then
    /// compares each listing with it as it arrives. Rows are per path, so
    /// the order listings arrive in does not matter.
    ///
    /// Issue 16, no-op push of the mixed profile (whole `wsd push`, 40-60
    /// alternating pairs, load 1.3-1.8): reading the index once instead of
    /// one query per directory, 0.97x the wall time at equal CPU (it first
    /// lost, 1.11x, while a 64-listing channel stalled the workers behind
    /// the read); Fx instead of SipHash for the row maps, 0.93x wall and
    /// CPU; each directory's rows in one sorted [`index::DirRows`] instead
    /// of a map per directory, 0.92x wall, 0.93x CPU; [`list_dir`]'s raw
    /// `getdents64` + `statx` instead of `std::fs::read_dir`, 0.95x CPU,
    /// 0.96x wall.
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
            // Room for whole listings while this thread reads the index:
            // with a few dozen the workers stalled behind that read.
            let (tx, rx) = std::sync::mpsc::sync_channel::<Msg>(4096);
            let mut spawned = Ok(());
            for _ in 0..walk_threads() {
                let (tx, queue, state_dir) = (tx.clone(), &queue, &state_dir);
                let worker = move || {
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
                                .filter_map(|(name, seen)| {
                                    if seen.as_ref()?.kind != DiskKind::Dir {
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
                };
                // Named so that profiles tell the listing from the comparing.
                let thread = std::thread::Builder::new().name("wsd-walk".into());
                if let Err(e) = thread.spawn_scoped(s, worker) {
                    spawned = Err(SyncError::io("starting a walk thread", e));
                    break;
                }
            }
            drop(tx);
            // Read while the workers list the first directories; a walk
            // from a subdirectory reads per directory.
            let t0 = std::time::Instant::now();
            let preloaded = spawned.and_then(|()| match start {
                None => index::live_rows_by_parent(self.db, PRELOAD_MAX_ROWS),
                Some(_) => Ok(None),
            });
            tracing::debug!(
                target: "wsd::timing",
                read_ms = t0.elapsed().as_secs_f64() * 1e3,
                dirs = preloaded.as_ref().map_or(0, |p| p.as_ref().map_or(0, |p| p.len())),
                "index read for the walk"
            );
            let mut result = Ok(());
            let mut waited = std::time::Duration::ZERO;
            match preloaded {
                Err(e) => result = Err(e),
                Ok(mut preloaded) => loop {
                    let t = std::time::Instant::now();
                    let Ok(msg) = rx.recv() else { break };
                    waited += t.elapsed();
                    let step = msg.and_then(|(dir, dir_abs, listed)| match listed {
                        Some(listed) => {
                            let rows = self.rows_of(&dir, preloaded.as_mut())?;
                            self.process_dir(&dir, &dir_abs, listed, rows).map(|_| ())
                        }
                        None => Ok(()),
                    });
                    if let Err(e) = step {
                        result = Err(e);
                        break;
                    }
                },
            }
            tracing::debug!(
                target: "wsd::timing",
                walk_ms = t0.elapsed().as_secs_f64() * 1e3,
                waited_ms = waited.as_secs_f64() * 1e3,
                "walk compared"
            );
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

    /// The live rows of `dir`'s children by name: taken out of `preloaded`
    /// (the whole index, read once) when given, else one query.
    ///
    /// Taking them out of a copy read before the walk is exact: what the
    /// walk itself writes while it runs only ever touches rows of entries
    /// already compared, or of subtrees it does not descend into (a
    /// directory gone or replaced by another kind).
    fn rows_of(
        &self,
        dir: &Option<SyncPath>,
        preloaded: Option<&mut RowsByParent>,
    ) -> Result<DirRows, SyncError> {
        let parent_key = dir.as_ref().map(SyncPath::as_str).unwrap_or("");
        match preloaded {
            Some(p) => Ok(p.remove(parent_key).unwrap_or_default()),
            None => index::live_children(self.db, parent_key),
        }
    }

    /// Compares one listed directory with its live `rows` (by name):
    /// observes what changed, tombstones indexed children that are gone,
    /// and returns the subdirectories to walk.
    fn process_dir(
        &mut self,
        dir: &Option<SyncPath>,
        dir_abs: &Path,
        listed: Vec<Listed>,
        mut rows: DirRows,
    ) -> Result<Vec<SyncPath>, SyncError> {
        // Each entry on disk takes its row out, and what is left was removed.
        let mut subdirs = Vec::new();
        for (name, meta) in listed {
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
            let row = rows.take(&name);
            let is_dir = meta.as_ref().is_some_and(|m| m.kind == DiskKind::Dir);
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
            self.observe(&child, meta)?;
            if is_dir {
                subdirs.push(child);
            }
        }
        for name in rows.untaken() {
            let child = match dir {
                Some(d) => d.join(name)?,
                None => SyncPath::new(name.to_owned())?,
            };
            self.tombstone(&child)?;
        }
        Ok(subdirs)
    }
}

/// Every live row of the index by parent key, then by name.
type RowsByParent = rustc_hash::FxHashMap<String, DirRows>;

/// Above this many live rows a whole-tree walk reads each directory's rows
/// with its own query instead of the whole index up front (about 100 bytes
/// a row in memory, so at most ~25 MiB).
const PRELOAD_MAX_ROWS: usize = 250_000;

/// What an `lstat` says about a path that a settle compares: its kind and
/// [`Stat`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Seen {
    pub kind: DiskKind,
    pub stat: Stat,
}

impl Seen {
    pub fn of(m: &std::fs::Metadata) -> Seen {
        Seen {
            kind: fsutil::kind_of(m),
            stat: Stat::of(m),
        }
    }

    /// The same fields as [`Seen::of`] gives for the `Metadata` std builds
    /// from this `statx`.
    fn of_statx(x: &rustix::fs::Statx) -> Seen {
        use rustix::fs::FileType;
        let kind = match FileType::from_raw_mode(x.stx_mode.into()) {
            FileType::RegularFile => DiskKind::File,
            FileType::Directory => DiskKind::Dir,
            FileType::Symlink => DiskKind::Symlink,
            _ => DiskKind::Unsupported,
        };
        Seen {
            kind,
            stat: Stat::of_statx(x),
        }
    }
}

/// A directory entry as listed: its name and its `lstat` (`None` when it
/// vanished in between, or for an apply temp file, which is not stat-ed).
type Listed = (String, Option<Seen>);

thread_local! {
    /// The `getdents64` buffer of [`list_dir`], reused across directories.
    static DIRENT_BUF: std::cell::RefCell<Vec<std::mem::MaybeUninit<u8>>> =
        std::cell::RefCell::new(vec![std::mem::MaybeUninit::uninit(); 32 * 1024]);
}

/// Lists `dir_abs` and `lstat`s its entries (`statx` relative to the open
/// directory, so each costs one name lookup, not one per path component),
/// leaving out the state directory and names that are not UTF-8 (with a
/// warning). `None` when the directory is gone, or is no longer a
/// directory (never followed if it became a symlink).
pub(crate) fn list_dir(dir_abs: &Path, state_dir: &Path) -> Result<Option<Vec<Listed>>, SyncError> {
    use rustix::fs::{AtFlags, Mode, OFlags, StatxFlags};
    let listing = || format!("listing {}", dir_abs.display());
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match rustix::fs::open(dir_abs, flags, Mode::empty()) {
        Ok(fd) => fd,
        Err(e) => {
            let e = std::io::Error::from(e);
            if fsutil::is_gone(&e) || e.raw_os_error() == Some(fsutil::ELOOP) {
                return Ok(None);
            }
            return Err(SyncError::io(listing(), e));
        }
    };
    let state_here = state_dir.parent() == Some(dir_abs);
    let state_name = state_dir.file_name().and_then(|n| n.to_str());
    let mut out = Vec::new();
    DIRENT_BUF.with_borrow_mut(|buf| {
        let mut dir = rustix::fs::RawDir::new(&fd, buf);
        while let Some(ent) = dir.next() {
            let ent = ent.map_err(|e| SyncError::io(listing(), e.into()))?;
            let cname = ent.file_name();
            let bytes = cname.to_bytes();
            if bytes == b"." || bytes == b".." {
                continue;
            }
            let Ok(name) = std::str::from_utf8(bytes) else {
                let lossy = String::from_utf8_lossy(bytes);
                let path = dir_abs.join(&*lossy);
                tracing::warn!(path = %path.display(), "name is not UTF-8; not synced");
                continue;
            };
            if state_here && state_name == Some(name) {
                continue;
            }
            if fsutil::is_apply_temp(name) {
                out.push((name.to_owned(), None));
                continue;
            }
            let seen = match rustix::fs::statx(
                &fd,
                cname,
                AtFlags::SYMLINK_NOFOLLOW,
                StatxFlags::BASIC_STATS,
            ) {
                Ok(x) => Some(Seen::of_statx(&x)),
                Err(rustix::io::Errno::NOENT) => None,
                Err(e) => {
                    let path = dir_abs.join(name);
                    return Err(SyncError::io(format!("stat {}", path.display()), e.into()));
                }
            };
            out.push((name.to_owned(), seen));
        }
        Ok(())
    })?;
    Ok(Some(out))
}

/// The workspace path of `name` in `dir`, when it is one a walk descends
/// into (a valid, non-temp name).
fn child_path(dir: &Option<SyncPath>, name: &str) -> Option<SyncPath> {
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
    // Cached: each call reads three cgroup files.
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *N.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(4)
    })
}

/// A file [`hash_file`] read: its chunks, their fingerprints (files of at
/// least [`FINGERPRINT_MIN_BYTES`]), and its stat taken before reading.
#[derive(Debug)]
pub(crate) struct HashedFile {
    pub chunks: Vec<ChunkRef>,
    pub fingerprints: Option<Vec<Fingerprint>>,
    pub stat: Stat,
}

/// What [`hash_file`] returns for one file.
pub(crate) type Hashed = Result<Option<HashedFile>, SyncError>;

/// Files at least this large get their chunks' fingerprints recorded (BLAKE3:
/// on this machine's cores about a quarter of what cutting and SHA-256 cost
/// (bench/RESULTS.md, issue 32), paid once when such a file is hashed), so
/// an edit to them re-hashes only what changed. Smaller files are cheap to
/// hash whole.
pub(crate) const FINGERPRINT_MIN_BYTES: u64 = 1024 * 1024;

/// The fingerprint of a chunk's bytes.
fn fingerprint(bytes: &[u8]) -> Fingerprint {
    *blake3::hash(bytes).as_bytes()
}

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
pub(crate) fn hash_files(files: &[PendingHash]) -> Vec<Hashed> {
    use rayon::prelude::*;
    let bytes: u64 = files.iter().map(|f| f.size).sum();
    // Below a few MiB handing files to the pool costs more than it saves.
    let pool = HASH_POOL.as_ref();
    let Some(pool) = pool.filter(|_| files.len() > 1 && bytes >= 4 * 1024 * 1024) else {
        return files
            .iter()
            .map(|f| hash_file(&f.abs, f.previous.as_deref()))
            .collect();
    };
    // One file per task: sizes vary from bytes to many MiB, and work
    // stealing balances them across cores.
    pool.install(|| {
        files
            .par_iter()
            .with_max_len(1)
            .map(|f| hash_file(&f.abs, f.previous.as_deref()))
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
/// gone or no longer a regular file. A file of at least
/// [`FINGERPRINT_MIN_BYTES`] gets its chunks' fingerprints too, and with
/// `previous` (its indexed version's chunks and fingerprints) the stretches
/// that still hold them are checked by fingerprint instead of cut and
/// hashed again (`chunk::rechunk_reader_with`: the same chunks either way).
pub(crate) fn hash_file(abs: &Path, previous: Option<&[KnownChunk<Fingerprint>]>) -> Hashed {
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
    let stat = Stat::of(&meta);
    let failed = |e: SyncError| SyncError::Storage(format!("hashing {}: {e}", abs.display()));
    if meta.len() < FINGERPRINT_MIN_BYTES {
        let chunks = HASH_BUF
            .with_borrow_mut(|buf| {
                chunk::chunk_reader_with(&file, buf, Some(meta.len()), |_, _| Ok(()))
            })
            .map_err(failed)?;
        return Ok(Some(HashedFile {
            chunks,
            fingerprints: None,
            stat,
        }));
    }
    let (chunks, fingerprints): (Vec<ChunkRef>, Vec<Fingerprint>) = match previous {
        Some(previous) => HASH_BUF
            .with_borrow_mut(|buf| chunk::rechunk_reader_with(&file, buf, previous, fingerprint))
            .map_err(failed)?
            .into_iter()
            .unzip(),
        None => {
            let mut prints = Vec::new();
            let chunks = HASH_BUF
                .with_borrow_mut(|buf| {
                    chunk::chunk_reader_with(&file, buf, Some(meta.len()), |_, bytes| {
                        prints.push(fingerprint(bytes));
                        Ok(())
                    })
                })
                .map_err(failed)?;
            (chunks, prints)
        }
    };
    Ok(Some(HashedFile {
        chunks,
        fingerprints: Some(fingerprints),
        stat,
    }))
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
                    previous: None,
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
            let want = hash_file(&f.abs, None).unwrap().unwrap().chunks;
            assert_eq!(got.unwrap().unwrap().chunks, want, "{}", f.rel);
        }
    }

    #[test]
    fn an_entry_stat_ed_relative_to_its_directory_equals_its_std_lstat() {
        // Index rows hold `Stat::of(Metadata)`: the walk's own `statx` must
        // give the same fields (dev encoding included) or every file would
        // look changed.
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::write(d.join("f"), b"abc").unwrap();
        std::fs::create_dir(d.join("sub")).unwrap();
        std::os::unix::fs::symlink("f", d.join("ln")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let listed = list_dir(d, &d.join(".wsd")).unwrap().unwrap();
        assert_eq!(listed.len(), 4);
        for (name, seen) in listed {
            let want = Seen::of(&std::fs::symlink_metadata(d.join(&name)).unwrap());
            assert_eq!(seen, Some(want), "{name}");
        }
    }

    #[test]
    fn a_listing_leaves_out_the_state_directory_and_does_not_stat_apply_temps() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        std::fs::create_dir(d.join(".wsd")).unwrap();
        let temp = format!("{}x", fsutil::APPLY_TEMP_PREFIX);
        std::fs::write(d.join(&temp), b"partial").unwrap();
        std::fs::write(d.join("kept"), b"k").unwrap();
        let mut listed = list_dir(d, &d.join(".wsd")).unwrap().unwrap();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<_> = listed
            .iter()
            .map(|(n, s)| (n.as_str(), s.is_some()))
            .collect();
        let mut want = vec![(temp.as_str(), false), ("kept", true)];
        want.sort();
        assert_eq!(names, want);
    }

    #[test]
    fn a_directory_gone_or_swapped_for_a_symlink_lists_as_gone_and_is_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let state = d.join(".wsd");
        assert!(list_dir(&d.join("missing"), &state).unwrap().is_none());
        std::fs::create_dir(d.join("real")).unwrap();
        std::fs::write(d.join("real/secret"), b"s").unwrap();
        std::os::unix::fs::symlink("real", d.join("swapped")).unwrap();
        assert!(list_dir(&d.join("swapped"), &state).unwrap().is_none());
        std::fs::write(d.join("file"), b"f").unwrap();
        assert!(list_dir(&d.join("file"), &state).unwrap().is_none());
    }

    #[test]
    fn a_directory_that_cannot_be_opened_is_an_error_naming_it() {
        // Root ignores permissions, so an over-long name stands in for an
        // unreadable directory: any failure other than "gone" is an error
        // that names the directory, as with `std::fs::read_dir` before.
        let tmp = tempfile::tempdir().unwrap();
        let bad = tmp.path().join("x".repeat(300));
        let err = list_dir(&bad, &tmp.path().join(".wsd")).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("listing"), "{text}");
        assert!(text.contains(&"x".repeat(300)), "{text}");
    }

    /// A store without a watcher (every settle walks the whole tree).
    fn walking_store() -> (tempfile::TempDir, PathBuf, crate::store::WorkspaceStore) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let store = crate::store::WorkspaceStore::open(
            &root,
            &tmp.path().join("state"),
            crate::store::StoreOptions {
                watch: false,
                ..Default::default()
            },
        )
        .unwrap();
        (tmp, root, store)
    }

    #[test]
    fn a_walk_of_a_deep_and_wide_tree_finds_one_change_at_the_bottom_and_nothing_else() {
        let (_tmp, root, mut store) = walking_store();
        let mut deep = root.clone();
        for i in 0..40 {
            deep.push(format!("d{i}"));
            std::fs::create_dir(&deep).unwrap();
            for j in 0..5 {
                let side = deep.join(format!("side{j}"));
                std::fs::create_dir(&side).unwrap();
                std::fs::write(side.join("f"), format!("{i}/{j}")).unwrap();
            }
        }
        std::fs::write(deep.join("bottom"), b"1").unwrap();
        let first = store.settle().unwrap();
        // 40 levels, each with 5 side dirs holding a file, plus the bottom file.
        assert_eq!(first.changed, 40 * (1 + 5 * 2) + 1);
        std::fs::write(deep.join("bottom"), b"22").unwrap();
        let r = store.settle().unwrap();
        assert_eq!((r.changed, r.deleted), (1, 0));
        assert!(r.full_walk.is_some());
    }

    #[test]
    fn a_walk_records_directories_and_files_that_swapped_kinds() {
        let (_tmp, root, mut store) = walking_store();
        std::fs::create_dir_all(root.join("was_dir/inner")).unwrap();
        std::fs::write(root.join("was_dir/inner/f"), b"x").unwrap();
        std::fs::write(root.join("was_file"), b"y").unwrap();
        store.settle().unwrap();
        std::fs::remove_dir_all(root.join("was_dir")).unwrap();
        std::fs::write(root.join("was_dir"), b"now a file").unwrap();
        std::fs::remove_file(root.join("was_file")).unwrap();
        std::fs::create_dir_all(root.join("was_file/new")).unwrap();
        std::fs::write(root.join("was_file/new/g"), b"z").unwrap();
        let r = store.settle().unwrap();
        // was_dir (file now) + was_file (dir now) + was_file/new + its g.
        assert_eq!(r.changed, 4, "{r:?}");
        // The old subtree of was_dir: inner and inner/f.
        assert_eq!(r.deleted, 2, "{r:?}");
        let again = store.settle().unwrap();
        assert_eq!((again.changed, again.deleted, again.rev), (0, 0, None));
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
    fn an_mtime_set_earlier_than_the_ctime_is_not_racy_on_a_fine_clock() {
        use crate::store::index::FINE_RACY_MARGIN_NS;
        // 1.000000123 s after some epoch: not a multiple of 10 ms, so the
        // filesystem keeps sub-tick precision.
        let s = 1_000_000_000_123;
        let written = |mtime_ns, ctime_ns, verified_ns| {
            let mut n = file_node(mtime_ns, verified_ns);
            n.stat.ctime_ns = ctime_ns;
            is_racy(&n)
        };
        assert!(written(s, s, s), "hashed in the same instant");
        // Hashed a second after its write: ctime is compared with our clock
        // with the generous margin (a server's clock may be off).
        assert!(written(s, s, s + 1_000_000_000), "within the clock margin");
        assert!(
            !written(s, s, s + RACY_MARGIN_NS + 1),
            "long after the write"
        );
        // Apply's case: the sender's mtime (a second ago), the ctime of the
        // rename now. A later write would set mtime to a later "now".
        let applied = s + 1_000_000_000;
        assert!(!written(s, applied, applied));
        assert!(
            written(applied - FINE_RACY_MARGIN_NS, applied, applied),
            "an mtime within a tick of the ctime is racy"
        );
        assert!(
            written(applied + 5, applied, applied),
            "an mtime in the future"
        );
        // Coarse stamps (a multiple of 10 ms) keep the 2 s margin.
        let c = 1_000_000_000_000;
        assert!(
            written(c - 1_000_000_000, c, c),
            "1 s apart on a coarse clock"
        );
        assert!(!written(c - RACY_MARGIN_NS - 1, c, c));
    }

    #[test]
    fn on_a_local_filesystem_a_file_hashed_a_tick_after_its_write_is_trusted() {
        use crate::store::index::{FINE_RACY_MARGIN_NS, LOCAL_FS_TYPES, note_clock_of};
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        note_clock_of(tmp.path());
        let local = rustix::fs::statfs(tmp.path())
            .is_ok_and(|s| LOCAL_FS_TYPES.contains(&(s.f_type as u64)));
        let s = 1_000_000_000_123;
        let on_tmp = |mtime_ns, ctime_ns, verified_ns| {
            let mut n = file_node(mtime_ns, verified_ns);
            n.stat.ctime_ns = ctime_ns;
            n.stat.dev = std::fs::metadata(tmp.path()).unwrap().dev();
            is_racy(&n)
        };
        assert!(on_tmp(s, s, s + FINE_RACY_MARGIN_NS), "within a tick");
        // A second later: trusted on a local clock, not on one that may be
        // a server's.
        assert_eq!(on_tmp(s, s, s + 1_000_000_000), !local, "local={local}");
        assert!(!on_tmp(s, s, s + RACY_MARGIN_NS + 1));
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
