//! Settle: compare the directory with the index and stamp what changed.
//!
//! A path is clean when its `lstat` equals the indexed stat (mode, size,
//! mtime, ctime, dev, inode) and it is not *racily clean*: a file whose
//! mtime is within [`RACY_MARGIN_NS`] of the moment it was last hashed may
//! have been rewritten in the same timestamp tick after hashing, so it is
//! hashed again (git's racy-clean rule). Only changed content, mode, kind
//! or symlink target stamps a rev; a stat-only difference (touch, a rename
//! over the same bytes) refreshes the row silently. A directory differs
//! only by kind or mode: its mtime moves with every child and is not state.

use std::collections::HashSet;
use std::fs::Metadata;
use std::path::Path;

use rusqlite::Connection;
use wsd_sync::{ChunkRef, SyncError, SyncPath, chunk, manifest};

use super::SettleReport;
use super::error::IoContext;
use super::fsutil::{self, DiskKind};
use super::index::{self, Node, NodeKind, Stat};
use super::watch::{LocalWatcher, WatchFailure};

/// How close to its hashing time a file's mtime must be to count as racily
/// clean. Generous enough for coarse filesystem clocks (jiffies, 1-2 s
/// granularity on FAT/SMB); the cost is one more hash of recently written
/// files.
pub(crate) const RACY_MARGIN_NS: i64 = 2_000_000_000;

/// True when a row's stat matching the disk does not prove its content.
pub(crate) fn is_racy(node: &Node) -> bool {
    node.stat.mtime_ns.saturating_add(RACY_MARGIN_NS) >= node.verified_ns
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
}

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
                let Some((chunks, stat)) = hash_file(&abs)? else {
                    // Vanished or replaced while we looked: its own event (or
                    // the next walk) records what is there now.
                    return Ok(());
                };
                self.report.hashed += 1;
                let mhash = manifest::hash(&chunks);
                if let Some(n) = &live
                    && n.kind == NodeKind::File
                    && n.manifest == Some(mhash)
                    && n.stat.mode == stat.mode
                {
                    index::refresh_stat(self.db, rel, &stat, self.started_ns)?;
                    return Ok(());
                }
                let node = Node {
                    path: rel.clone(),
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

    /// Walks the directory `start` (`None` = the root): observes it, then
    /// every entry below it, and tombstones indexed children that are gone.
    /// Each directory is watched before it is listed.
    pub fn walk(&mut self, start: Option<&SyncPath>) -> Result<(), SyncError> {
        if let Some(s) = start {
            let meta = fsutil::lstat_in_root(self.root, s).io_ctx(|| format!("stat {s}"))?;
            self.observe(s, meta.as_ref())?;
            if !meta.is_some_and(|m| m.file_type().is_dir()) {
                return Ok(());
            }
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
            let rd = match std::fs::read_dir(&dir_abs) {
                Ok(rd) => rd,
                // Replaced or removed since it was observed: the event for
                // that (or the next walk) records it.
                Err(e) if fsutil::is_gone(&e) => continue,
                Err(e) => {
                    return Err(SyncError::io(format!("listing {}", dir_abs.display()), e));
                }
            };
            let mut on_disk: HashSet<String> = HashSet::new();
            for ent in rd {
                let ent = ent.io_ctx(|| format!("listing {}", dir_abs.display()))?;
                let child_abs = ent.path();
                if child_abs == self.state_dir {
                    continue;
                }
                let Ok(name) = ent.file_name().into_string() else {
                    tracing::warn!(path = %child_abs.display(), "name is not UTF-8; not synced");
                    continue;
                };
                if fsutil::is_apply_temp(&name) {
                    if self.remove_stale_temps {
                        tracing::info!(path = %child_abs.display(), "removing a stale apply temp file");
                        let _ = std::fs::remove_file(&child_abs);
                    }
                    continue;
                }
                let child = match &dir {
                    Some(d) => d.join(&name),
                    None => SyncPath::new(name.clone()),
                };
                let child = match child {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(path = %child_abs.display(), error = %e, "not synced");
                        continue;
                    }
                };
                let meta = match ent.metadata() {
                    Ok(m) => Some(m),
                    Err(e) if fsutil::is_gone(&e) => None,
                    Err(e) => return Err(SyncError::io(format!("stat {child}"), e)),
                };
                if meta.is_some() {
                    on_disk.insert(name);
                }
                self.observe(&child, meta.as_ref())?;
                if meta.is_some_and(|m| m.file_type().is_dir()) {
                    stack.push(Some(child));
                }
            }
            let parent_key = dir.as_ref().map(SyncPath::as_str).unwrap_or("");
            for name in index::live_child_names(self.db, parent_key)? {
                if !on_disk.contains(&name) {
                    let child = match &dir {
                        Some(d) => d.join(&name)?,
                        None => SyncPath::new(name)?,
                    };
                    self.tombstone(&child)?;
                }
            }
        }
        Ok(())
    }
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
    let file = match fsutil::open_nofollow(abs) {
        Ok(f) => f,
        Err(e) if fsutil::is_gone(&e) || e.raw_os_error() == Some(libc::ELOOP) => return Ok(None),
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
