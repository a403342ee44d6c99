//! Applying a batch of entries to the directory and the index (sync rules
//! 3–6, 10, 11 and 13 in sync/DESIGN.md).
//!
//! Order of work: everything that can reject the batch runs before the
//! directory is touched (entry validation, the state-directory guard,
//! contradictions inside the batch, chunk availability, and copying into
//! staging the chunks whose only local copies this batch will overwrite).
//! Then each entry is written (temp + rename beside its target) and its row
//! updated in the same index transaction, which also holds the rev and the
//! fetch cursor.
//!
//! If the disk fails mid-batch, the transaction still commits the rows of
//! the entries already written (without moving the fetch cursor), so the
//! index never claims a state the directory lacks and never misses one it
//! has; the sender retries the batch and the finished entries are skipped as
//! idempotent. If the index commit itself fails, the next settle finds the
//! written paths as local changes.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::Metadata;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};
use wsd_sync::plan::{self, Plan, ReplacedDir};
use wsd_sync::{
    ApplyOutcome, Baseline, ChangeCursor, ChangeEntry, ChunkRef, EntryState, Hash, IgnoreRules,
    Kind, SyncError, SyncPath, manifest,
};

use super::error::{IndexContext, IoContext};
use super::fsutil::{self, DiskKind};
use super::index::{self, Node, NodeKind, Stat};
use super::objects::Staging;
use super::scan;
use super::watch::{LocalWatcher, OwnEvents, WatchFailure};
use super::writer::{self, Job, OldVersion, Writers};

/// Where `read_chunk` looked and what it found wrong, for the error message.
#[derive(Debug, Default)]
pub(crate) struct ChunkMisses {
    /// Files whose bytes at the indexed offset no longer hash right.
    pub changed: Vec<SyncPath>,
}

/// Reads chunk `hash` from the files the index says hold it, verifying the
/// bytes. A file that changed behind the index is recorded in `misses` (and
/// should be re-hashed), never served.
pub(crate) fn read_indexed_chunk(
    db: &Connection,
    root: &Path,
    hash: &Hash,
    misses: &mut ChunkMisses,
) -> Result<Option<Vec<u8>>, SyncError> {
    for loc in index::chunk_locations(db, hash, 8)? {
        // Only a regular file reached through real directories: never read
        // through a symlink that appeared since indexing.
        let (file, meta) = match fsutil::open_file_in_root(root, &loc.path) {
            Ok(Some(f)) => f,
            Ok(None) => {
                misses.changed.push(loc.path);
                continue;
            }
            Err(e) => return Err(SyncError::io(format!("opening {}", loc.path), e)),
        };
        let Some(buf) = read_at(&file, loc.offset, loc.size as usize)
            .map_err(|e| SyncError::io(format!("reading {}", loc.path), e))?
        else {
            misses.changed.push(loc.path);
            continue;
        };
        // A file whose stat still matches its row holds the bytes settle
        // hashed (the same rule settle trusts); anything else is verified.
        if loc.unchanged(&meta) || hash.verify(&buf).is_ok() {
            return Ok(Some(buf));
        }
        tracing::warn!(path = %loc.path, %hash, offset = loc.offset,
            "file changed since it was indexed; its chunk is not served");
        misses.changed.push(loc.path);
    }
    Ok(None)
}

/// Reads exactly `len` bytes at `offset` (without zero-filling a buffer
/// first), or `None` when the file is shorter.
fn read_at(file: &std::fs::File, offset: u64, len: usize) -> std::io::Result<Option<Vec<u8>>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = file;
    if offset > 0 {
        f.seek(SeekFrom::Start(offset))?;
    }
    let mut buf = Vec::with_capacity(len);
    f.take(len as u64).read_to_end(&mut buf)?;
    Ok((buf.len() == len).then_some(buf))
}

/// The error for a chunk that could not be produced.
pub(crate) fn missing_chunk_error(
    hash: &Hash,
    needed_by: Option<&SyncPath>,
    misses: &ChunkMisses,
) -> SyncError {
    match misses.changed.first() {
        Some(changed) => SyncError::Storage(format!(
            "object {hash}: {changed} changed on disk since it was indexed (hash mismatch); \
             it is re-indexed by the next settle{}",
            needed_by
                .map(|p| format!(" (needed by {p})"))
                .unwrap_or_default()
        )),
        None => SyncError::UnknownHash {
            hash: *hash,
            path: needed_by.map(|p| p.to_string()),
        },
    }
}

pub(crate) struct Apply<'a> {
    pub db: &'a Connection,
    pub root: &'a Path,
    pub state_rel: Option<&'a SyncPath>,
    pub staging: &'a mut Staging,
    /// Files found changed behind the index: settle re-hashes them.
    pub force: &'a mut HashSet<SyncPath>,
    pub started_ns: i64,
    pub remote: &'a str,
    pub peer: bool,
    pub push_cursor: ChangeCursor,
    /// The remote's push cursor is below our prune horizon: our next push
    /// to it is a sweeping baseline that must list every live path, so
    /// nothing written now may be hidden from it as its own echo.
    baseline_due: bool,
    rev: Option<u64>,
    pub outcome: ApplyOutcome,
    /// True once the directory was modified: a failure after this point
    /// still commits the rows of what was written.
    pub touched_disk: bool,
    temp_seq: u64,
    /// Our pid, for temp names (one `getpid` per batch, not per file).
    pid: u32,
    /// Workspace paths this batch has seen to be real directories (not
    /// symlinks), so ancestors shared by many entries are checked once.
    /// Entries that remove or replace a path drop it and everything below.
    known_dirs: HashSet<String>,
    /// Whether the current entry's path has chunk rows to replace.
    clear_chunks: bool,
    /// When set, a local version an entry would overwrite or delete while
    /// it holds changes not yet pushed to this remote is first kept beside
    /// it as a conflict copy, listed here ([`ConflictCopy`]).
    pub conflicts: Option<&'a mut Vec<ConflictCopy>>,
    /// The UTC time conflict copies of this batch are named after.
    conflict_stamp: Option<String>,
    /// The sender's exclusions: no entry deletes what they match.
    pub ignore: &'a IgnoreRules,
    /// The directory the current entry replaces is to be moved aside as a
    /// conflict copy (by `remove_dir_for`) rather than removed.
    dir_aside: bool,
    /// Files being written on writer threads, each with its row.
    writers: Writers<WrittenRow>,
    /// The store's watcher: told which events apply's own syscalls raise
    /// (so they are not settled again), and given each directory apply
    /// creates to watch at once.
    pub watch: Option<&'a mut LocalWatcher>,
    /// Directories this batch created. A path directly inside one can only
    /// hold what this batch put there, so with no path twice in the batch
    /// (`unique_paths`) an entry there needs no `lstat`: nothing is there.
    created_dirs: HashSet<String>,
    /// No path occurs twice among the batch's entries (set by `check`).
    unique_paths: bool,
}

/// The row of a file handed to a writer thread, recorded once the write
/// reports the file's stat.
struct WrittenRow {
    node: Node,
    chunks: Vec<ChunkRef>,
    clear_chunks: bool,
}

/// A local version a pull kept rather than overwrite or delete it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConflictCopy {
    /// The path the remote's version now holds (or that it deleted).
    pub path: SyncPath,
    /// Where the local version is: `PATH.wsd-conflict-<UTC time>` in the
    /// same directory (a suffix `-N` when that name was taken).
    pub copy: SyncPath,
}

impl<'a> Apply<'a> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: &'a Connection,
        root: &'a Path,
        state_rel: Option<&'a SyncPath>,
        staging: &'a mut Staging,
        force: &'a mut HashSet<SyncPath>,
        started_ns: i64,
        remote: &'a str,
        peer: bool,
    ) -> Result<Apply<'a>, SyncError> {
        let push_cursor = index::remote_cursors(db, remote)?.push;
        let horizon = index::meta_get(db, "prune_horizon")?;
        let baseline_due = horizon > 0 && push_cursor.complete_rev() < horizon;
        Ok(Apply {
            db,
            root,
            state_rel,
            staging,
            force,
            started_ns,
            remote,
            peer,
            push_cursor,
            baseline_due,
            rev: None,
            outcome: ApplyOutcome::default(),
            touched_disk: false,
            temp_seq: 0,
            pid: std::process::id(),
            known_dirs: HashSet::new(),
            clear_chunks: true,
            conflicts: None,
            conflict_stamp: None,
            ignore: IgnoreRules::none_static(),
            dir_aside: false,
            writers: Writers::new(),
            watch: None,
            created_dirs: HashSet::new(),
            unique_paths: false,
        })
    }

    /// What written rows record as their origin (for echo exclusion).
    fn applied_from(&self) -> Option<&'a str> {
        (self.peer && !self.baseline_due).then_some(self.remote)
    }

    fn rev(&mut self) -> Result<u64, SyncError> {
        if let Some(r) = self.rev {
            return Ok(r);
        }
        let r = index::next_rev(self.db)?;
        self.rev = Some(r);
        Ok(r)
    }

    /// Everything that can reject the batch, before the directory is touched.
    pub fn check(&mut self, entries: &[ChangeEntry]) -> Result<(), SyncError> {
        let mut non_dirs: HashMap<&SyncPath, &'static str> = HashMap::new();
        let mut seen: HashSet<&SyncPath> = HashSet::with_capacity(entries.len());
        self.unique_paths = true;
        for e in entries {
            e.validate()?;
            if !seen.insert(&e.path) {
                self.unique_paths = false;
            }
            if let Some(sr) = self.state_rel {
                if e.path.starts_with(sr) {
                    return Err(SyncError::InvalidPath {
                        path: e.path.to_string(),
                        reason: "the path is inside wsd's state directory",
                    });
                }
                if sr.starts_with(&e.path) && !matches!(e.state, EntryState::Dir { .. }) {
                    return Err(SyncError::InvalidPath {
                        path: e.path.to_string(),
                        reason: "applying it would remove wsd's state directory",
                    });
                }
            }
            match e.state {
                EntryState::File { .. } => non_dirs.insert(&e.path, "file"),
                EntryState::Symlink { .. } => non_dirs.insert(&e.path, "symlink"),
                _ => None,
            };
        }
        // A batch is one state of the sender's tree: a live path cannot be
        // below a file or symlink of the same batch. Applying it would mean
        // writing through that symlink, or undoing the batch's own entry.
        // (Tombstones below are normal: a directory turned into a file.)
        for e in entries
            .iter()
            .filter(|e| !matches!(e.state, EntryState::Delete))
        {
            for a in e.path.ancestors() {
                if let Some(kind) = non_dirs.get(&a) {
                    return Err(SyncError::Invalid(format!(
                        "{}: its ancestor {a} is a {kind} in the same batch",
                        e.path
                    )));
                }
            }
        }
        self.check_chunks(entries)
    }

    /// Rule: every referenced chunk must be staged or in an indexed file
    /// (`EUNKNOWN_HASH` naming hash and path otherwise). A chunk whose every
    /// local copy sits in a file this batch overwrites or removes (a rename
    /// ships the new path and the old path's tombstone together) is copied
    /// into staging first, so the order of entries cannot lose it.
    fn check_chunks(&mut self, entries: &[ChangeEntry]) -> Result<(), SyncError> {
        let mut consumers: HashMap<Hash, Vec<&SyncPath>> = HashMap::new();
        let mut first_user: Vec<(Hash, &SyncPath)> = Vec::new();
        for e in entries {
            for c in e.chunks() {
                let users = consumers.entry(c.hash).or_default();
                if users.is_empty() {
                    first_user.push((c.hash, &e.path));
                }
                if users.last() != Some(&&e.path) {
                    users.push(&e.path);
                }
            }
        }
        let touched: HashSet<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        let touched_sorted: BTreeSet<&str> = touched.iter().copied().collect();
        // A multi-chunk file rewritten in place (the common edit of a large
        // file) holds most of its new chunks already: one query for its
        // chunk list answers for all of them, instead of one lookup each.
        let mut own: HashMap<&SyncPath, HashSet<Hash>> = HashMap::new();
        for e in entries {
            if e.chunks().len() > 1 {
                let below_removed = e.path.ancestors().any(|a| touched.contains(a.as_str()));
                let prefix = format!("{}/", e.path);
                let becomes_dir = touched_sorted
                    .range(prefix.as_str()..)
                    .next()
                    .is_some_and(|t| t.starts_with(&prefix));
                if !(below_removed || becomes_dir) {
                    let held = index::chunks_of(self.db, &e.path)?;
                    own.insert(&e.path, held.into_iter().map(|c| c.hash).collect());
                }
            }
        }
        for (hash, user) in first_user {
            if self.staging.contains(&hash) {
                continue;
            }
            // Safe in the user's own current version, as the general check
            // below would find: the only consumer is the file itself, which
            // stays in place while its new content is assembled.
            if own.get(user).is_some_and(|held| held.contains(&hash))
                && consumers[&hash].iter().all(|u| *u == user)
            {
                continue;
            }
            let locs = index::chunk_locations(self.db, &hash, 16)?;
            if locs.is_empty() {
                return Err(SyncError::UnknownHash {
                    hash,
                    path: Some(user.to_string()),
                });
            }
            let users = &consumers[&hash];
            let safe = locs.iter().any(|l| {
                let own = l.path.as_str();
                // The file itself being rewritten stays in place while its
                // new content is assembled; any other entry at or above it
                // removes it first, and an entry below it turns it into a
                // directory.
                let rewritten = touched.contains(own) && !users.iter().all(|u| **u == l.path);
                let below_removed = l.path.ancestors().any(|a| touched.contains(a.as_str()));
                let prefix = format!("{own}/");
                let becomes_dir = touched_sorted
                    .range(prefix.as_str()..)
                    .next()
                    .is_some_and(|t| t.starts_with(&prefix));
                !(rewritten || below_removed || becomes_dir)
            });
            if safe {
                continue;
            }
            let mut misses = ChunkMisses::default();
            match read_indexed_chunk(self.db, self.root, &hash, &mut misses)? {
                Some(bytes) => self.staging.put_verified(&hash, &bytes)?,
                None => {
                    self.force.extend(misses.changed.iter().cloned());
                    return Err(missing_chunk_error(&hash, Some(user), &misses));
                }
            }
        }
        Ok(())
    }

    /// What the plan is told of a row: `entry`, when given, is what it is
    /// compared with (rule 4).
    fn index_row(&self, row: &Node, entry: Option<&EntryState>) -> plan::IndexRow {
        plan::IndexRow {
            kind: match row.kind {
                NodeKind::File => Some(Kind::File),
                NodeKind::Dir => Some(Kind::Dir),
                NodeKind::Symlink => Some(Kind::Symlink),
                NodeKind::Tombstone => None,
            },
            mode: row.stat.mode,
            rev: row.rev,
            from_sender: row.applied_from.as_deref() == Some(self.remote),
            matches_entry: entry.is_some_and(|e| row_matches(row, e)),
        }
    }

    fn plan_options(&self) -> plan::Options<'_> {
        plan::Options {
            peer: self.peer,
            push_cursor: Some(&self.push_cursor),
            conflict_copies: self.conflicts.is_some(),
            ignore: self.ignore,
            implied_dirs: plan::ImpliedDirs::Inferred,
            refuse_replacing_excluded: true,
        }
    }

    /// Whether any row strictly below `path` is an unacknowledged local change.
    fn unpushed_local_below(&self, path: &SyncPath) -> Result<bool, SyncError> {
        let (lo, hi) = index::descendant_range(path);
        let p = &self.push_cursor;
        self.db
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM nodes WHERE path >= ?1 AND path < ?2
                   AND (applied_from IS NULL OR applied_from != ?3)
                   AND (rev > ?4 OR (rev = ?4 AND ?5 IS NOT NULL AND path > ?5)))",
            )
            .and_then(|mut s| {
                s.query_row(
                    params![
                        lo,
                        hi,
                        self.remote,
                        p.rev as i64,
                        p.path.as_ref().map(SyncPath::as_str)
                    ],
                    |r| r.get::<_, bool>(0),
                )
            })
            .ctx("checking for local changes")
    }

    /// Whether the directory `path` holds on disk, below it, anything the
    /// index does not hold as it is now: a local write settle has not
    /// stamped yet (a new file, an edit), which a delete or replacement of
    /// the directory would take with it unseen. Stops at the first one.
    /// The state directory and apply's temp files do not count.
    fn unsettled_below(&self, path: &SyncPath) -> Result<bool, SyncError> {
        let mut dirs = vec![path.clone()];
        while let Some(dir) = dirs.pop() {
            let abs = fsutil::abs(self.root, &dir);
            let listing = match std::fs::read_dir(&abs) {
                Ok(l) => l,
                Err(e) if fsutil::is_gone(&e) => continue,
                Err(e) => return Err(SyncError::io(format!("listing {dir}"), e)),
            };
            for ent in listing {
                let ent = ent.io_ctx(|| format!("listing {dir}"))?;
                let name = ent.file_name();
                let Some(child) = name.to_str().and_then(|n| dir.join(n).ok()) else {
                    // A name sync cannot carry is never indexed: local.
                    return Ok(true);
                };
                if fsutil::is_apply_temp(child.file_name())
                    || self.state_rel.is_some_and(|sr| child.starts_with(sr))
                {
                    continue;
                }
                // `DirEntry::metadata` does not follow a symlink.
                let meta = match ent.metadata() {
                    Ok(m) => m,
                    Err(e) if fsutil::is_gone(&e) => continue,
                    Err(e) => return Err(SyncError::io(format!("stat {child}"), e)),
                };
                let kind = fsutil::kind_of(&meta);
                match index::get_node(self.db, &child)?.filter(Node::is_live) {
                    Some(r) if scan::stat_matches(&r, kind, &Stat::of(&meta)) => {}
                    _ => return Ok(true),
                }
                if kind == DiskKind::Dir {
                    dirs.push(child);
                }
            }
        }
        Ok(false)
    }

    /// The live rows strictly below `path`, in path order, with whether
    /// each is a directory.
    fn live_below(&self, path: &SyncPath) -> Result<Vec<(SyncPath, bool)>, SyncError> {
        let (lo, hi) = index::descendant_range(path);
        let rows: Vec<(String, i64)> = self
            .db
            .prepare_cached(
                "SELECT path, kind FROM nodes WHERE path >= ?1 AND path < ?2 AND kind != 3
                 ORDER BY path",
            )
            .and_then(|mut s| {
                s.query_map(params![lo, hi], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()
            })
            .ctx("listing a directory's subtree")?;
        rows.into_iter()
            .map(|(p, kind)| {
                let p = SyncPath::new(p)
                    .map_err(|e| SyncError::Storage(format!("index holds a bad path: {e}")))?;
                Ok((p, kind == NodeKind::Dir as i64))
            })
            .collect()
    }

    fn note_overwrite(&mut self, path: &SyncPath, what: &str) {
        self.outcome.overwrote_local += 1;
        // With conflict copies on (the CLI), the caller reports each one in
        // its summary: a warning here would say it twice.
        if self.conflicts.is_some() {
            tracing::debug!(%path, remote = self.remote, what,
                "apply replaces a local change not yet pushed to that remote");
        } else {
            tracing::warn!(%path, remote = self.remote, what,
                "apply overwrote a local change not yet pushed to that remote (last applier wins)");
        }
    }

    fn temp_name(&mut self, dir: &Path) -> PathBuf {
        self.temp_seq += 1;
        dir.join(format!(
            "{}{}-{}",
            fsutil::APPLY_TEMP_PREFIX,
            self.pid,
            self.temp_seq
        ))
    }

    /// Makes every ancestor of `path` a real directory: creates missing ones
    /// (rule 3) and replaces files and symlinks (a kind change, rule 6) so
    /// that nothing is ever written through a symlink.
    fn prepare_ancestors(&mut self, path: &SyncPath) -> Result<(), SyncError> {
        for a in path.ancestors() {
            if self.known_dirs.contains(a.as_str()) {
                continue;
            }
            let abs = fsutil::abs(self.root, &a);
            let existing = match std::fs::symlink_metadata(&abs) {
                Ok(m) if m.file_type().is_dir() => {
                    self.known_dirs.insert(a.as_str().to_owned());
                    continue;
                }
                Ok(m) => Some(m),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(SyncError::io(format!("stat {a} (ancestor of {path})"), e)),
            };
            // Which mode, and whose state the directory is (rule 3).
            let row = index::get_node(self.db, &a)?;
            let live = row.as_ref().filter(|r| r.is_live());
            let implied = plan::implied_dir(
                &a,
                row.as_ref().map(|r| self.index_row(r, None)).as_ref(),
                disk_facts(live, existing.as_ref()),
                &self.plan_options(),
            );
            if implied.overwrites_local {
                self.note_overwrite(&a, "ancestor recreated as a directory");
            }
            if implied.copy_aside {
                self.keep_conflict_copy(&a, false)?;
            }
            if let Some(m) = &existing {
                self.drain()?;
                let kind = if m.file_type().is_symlink() {
                    "symlink"
                } else {
                    "file"
                };
                tracing::warn!(ancestor = %a, %path, kind,
                    "replacing a non-directory ancestor with a directory to apply an entry below it");
                self.touched_disk = true;
                std::fs::remove_file(&abs)
                    .io_ctx(|| format!("removing {a} (ancestor of {path})"))?;
            }
            self.touched_disk = true;
            self.expect(&abs, OwnEvents::MKDIR);
            let made = std::fs::create_dir(&abs)
                .io_ctx(|| format!("creating directory {a}"))
                .and_then(|()| chmod_dir(&abs, &a, implied.mode, self.watch.as_deref()));
            let stat = match made {
                Ok((_, stat)) => stat,
                Err(err) => {
                    self.unexpect(&abs);
                    return Err(err);
                }
            };
            self.watch_created_dir(&abs);
            let mut node = self.node(&a, NodeKind::Dir, stat, None, None)?;
            if implied.origin == plan::Origin::Local {
                node.applied_from = None;
            }
            index::put_node(self.db, &node, &[])?;
            self.known_dirs.insert(a.as_str().to_owned());
            self.created_dirs.insert(a.as_str().to_owned());
        }
        Ok(())
    }

    /// Tells the watcher which events apply's next syscalls on `abs` raise.
    fn expect(&self, abs: &Path, events: OwnEvents) {
        if let Some(w) = self.watch.as_deref() {
            w.expect(abs, events);
        }
    }

    /// The syscalls announced with [`Self::expect`] failed part way: `abs`
    /// is settled as any other change.
    fn unexpect(&self, abs: &Path) {
        if let Some(w) = self.watch.as_deref() {
            w.unexpect(abs);
        }
    }

    /// Watches a directory apply just created and made final (its
    /// attribute changes are done, so its own watch reports none of them),
    /// then lists it: anything another process put there before the watch
    /// existed would otherwise go unseen, so the directory is then left to
    /// settle. The settle after the batch need not walk it.
    fn watch_created_dir(&mut self, abs: &Path) {
        let Some(w) = self.watch.as_deref_mut() else {
            return;
        };
        match w.watch_dir(abs) {
            Ok(()) => {
                let empty = std::fs::read_dir(abs).is_ok_and(|mut l| l.next().is_none());
                if !empty {
                    w.mark_dirty(abs);
                }
            }
            // Gone again: its parent's watch reported that.
            Err(WatchFailure::Gone) => {}
            // Settle meets the same failure and gives the watcher up.
            Err(WatchFailure::Fatal(_)) => w.mark_dirty(abs),
        }
    }

    /// True when `path` sits directly in a directory this batch created
    /// and is not itself one: nothing but this batch's entries can be
    /// there, and each path occurs once, so it does not exist yet.
    fn surely_absent(&self, path: &SyncPath) -> bool {
        self.unique_paths
            && !self.created_dirs.contains(path.as_str())
            && path
                .as_str()
                .rsplit_once('/')
                .is_some_and(|(parent, _)| self.created_dirs.contains(parent))
    }

    /// `lstat` of `rel` inside the root (see [`fsutil::lstat_in_root`]),
    /// stat-ing only ancestors this batch has not yet seen as directories.
    fn lstat_in_root(&mut self, rel: &SyncPath) -> std::io::Result<Option<Metadata>> {
        let path = rel.as_str();
        for (i, _) in path.match_indices('/') {
            let a = &path[..i];
            if self.known_dirs.contains(a) {
                continue;
            }
            match std::fs::symlink_metadata(self.root.join(a)) {
                Ok(m) if m.file_type().is_dir() => {
                    self.known_dirs.insert(a.to_owned());
                }
                Ok(_) => return Ok(None),
                Err(e) if fsutil::is_gone(&e) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        match std::fs::symlink_metadata(fsutil::abs(self.root, rel)) {
            Ok(m) => Ok(Some(m)),
            Err(e) if fsutil::is_gone(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Forgets `path` and everything below it as known directories (the
    /// entry removes or replaces it).
    fn forget_dirs(&mut self, path: &SyncPath) {
        let p = path.as_str();
        let below =
            |d: &String| d == p || (d.starts_with(p) && d.as_bytes().get(p.len()) == Some(&b'/'));
        self.known_dirs.retain(|d| !below(d));
        self.created_dirs.retain(|d| !below(d));
    }

    fn node(
        &mut self,
        path: &SyncPath,
        kind: NodeKind,
        stat: Stat,
        target: Option<String>,
        manifest: Option<Hash>,
    ) -> Result<Node, SyncError> {
        Ok(Node {
            path: path.clone(),
            kind,
            stat,
            target,
            manifest,
            verified_ns: self.started_ns,
            rev: self.rev()?,
            applied_from: self.applied_from().map(str::to_owned),
        })
    }

    /// Applies one entry as [`plan::entry`] decides.
    pub fn entry(&mut self, e: &ChangeEntry) -> Result<(), SyncError> {
        // Only file writes overlap (each touches its own path alone); a
        // directory, symlink or delete sees the disk and index complete.
        if !matches!(e.state, EntryState::File { .. }) {
            self.drain()?;
        }
        let any_row = index::get_node(self.db, &e.path)?;
        let row = any_row.clone().filter(Node::is_live);
        let disk = if self.surely_absent(&e.path) {
            None
        } else {
            self.lstat_in_root(&e.path)
                .io_ctx(|| format!("stat {}", e.path))?
        };
        let disk_kind = disk.as_ref().map(fsutil::kind_of);
        let planned = plan::entry(
            e,
            any_row
                .as_ref()
                .map(|r| self.index_row(r, Some(&e.state)))
                .as_ref(),
            disk_facts(row.as_ref(), disk.as_ref()),
            &self.plan_options(),
            &mut Subtree {
                apply: self,
                path: &e.path,
            },
        )?;
        let write = match planned {
            Plan::Skip => {
                self.outcome.skipped += 1;
                return Ok(());
            }
            Plan::DeleteSparing(tops) => {
                for top in tops {
                    self.entry(&ChangeEntry {
                        rev: e.rev,
                        path: top,
                        state: EntryState::Delete,
                    })?;
                }
                return Ok(());
            }
            Plan::Write(w) => w,
        };
        let is_delete = matches!(e.state, EntryState::Delete);
        let replaces_dir = write.replaced_dir.is_some();
        if replaces_dir || is_delete {
            self.forget_dirs(&e.path);
        }
        // Chunk rows exist only for a live file row: a fresh path skips
        // clearing them.
        self.clear_chunks = row.as_ref().is_some_and(|r| r.kind == NodeKind::File);
        if write.overwrites_local {
            self.note_overwrite(&e.path, "entry");
        }
        if write.copy_aside {
            self.keep_conflict_copy(&e.path, false)?;
        }
        // A replaced directory is moved aside only once the replacement is
        // ready (`remove_dir_for`).
        let dir_aside = write.replaced_dir == Some(ReplacedDir::MoveAside);
        self.dir_aside = dir_aside && !is_delete;
        if dir_aside && is_delete {
            self.keep_conflict_copy(&e.path, true)?;
        }
        // A delete never creates parents; its path resolved inside the root
        // already (or does not exist there).
        if !is_delete {
            self.prepare_ancestors(&e.path)?;
        }
        if write.tombstone_rows_below {
            self.drain()?;
            let rev = self.rev()?;
            index::tombstone_descendants(self.db, &e.path, rev, self.applied_from())?;
        }
        let abs = fsutil::abs(self.root, &e.path);
        match &e.state {
            EntryState::File {
                mode,
                mtime,
                chunks,
                ..
            } => {
                let old = row.as_ref().filter(|r| r.kind == NodeKind::File);
                self.write_file(e, &abs, *mode, *mtime, chunks, replaces_dir, old)?
            }
            EntryState::Dir { mode, mtime } => {
                self.write_dir(e, &abs, *mode, *mtime, disk.as_ref())?
            }
            EntryState::Symlink { target, .. } => {
                self.write_symlink(e, &abs, target, replaces_dir)?
            }
            EntryState::Delete => {
                self.touched_disk = true;
                match disk_kind {
                    Some(DiskKind::Dir) => std::fs::remove_dir_all(&abs),
                    Some(_) => std::fs::remove_file(&abs),
                    None => Ok(()),
                }
                .or_else(|e| if fsutil::is_gone(&e) { Ok(()) } else { Err(e) })
                .io_ctx(|| format!("removing {}", e.path))?;
                let rev = self.rev()?;
                index::tombstone_subtree(self.db, &e.path, rev, self.applied_from())?;
            }
        }
        self.outcome.applied += 1;
        Ok(())
    }

    /// Keeps the local version at `path` as `PATH.wsd-conflict-<UTC time>`
    /// in the same directory, never replacing an existing name. A file or
    /// symlink gets a second hard link (the apply then renames the remote's
    /// version over the original name, or unlinks it), so nothing is
    /// copied; a directory holding local changes is moved aside whole. The
    /// copy matches [`wsd_sync::CONFLICT_COPY_PATTERN`], which the CLI
    /// excludes, so it is not pushed; the next settle indexes it.
    fn keep_conflict_copy(&mut self, path: &SyncPath, is_dir: bool) -> Result<(), SyncError> {
        let stamp = self
            .conflict_stamp
            .get_or_insert_with(|| {
                humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                    .to_string()
                    .replace(['-', ':'], "")
            })
            .clone();
        let abs = fsutil::abs(self.root, path);
        self.touched_disk = true;
        for n in 0u32.. {
            let suffix = if n == 0 {
                String::new()
            } else {
                format!("-{n}")
            };
            let copy = conflict_copy_path(path, &format!("{stamp}{suffix}"))?;
            let copy_abs = fsutil::abs(self.root, &copy);
            let kept = if is_dir {
                rename_noreplace(&abs, &copy_abs)
            } else {
                link_or_copy(&abs, &copy_abs)
            };
            match kept {
                Ok(()) => {
                    tracing::debug!(%path, %copy, remote = self.remote,
                        "a pull replaces a local change not yet pushed; the local version is kept");
                    if let Some(list) = self.conflicts.as_deref_mut() {
                        list.push(ConflictCopy {
                            path: path.clone(),
                            copy,
                        });
                    }
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(SyncError::io(
                        format!("keeping the local version of {path} as {copy}"),
                        e,
                    ));
                }
            }
        }
        unreachable!("some numbered name is free")
    }

    /// Removes a directory that an entry of another kind replaces, with
    /// tombstones for its indexed subtree; or, when the entry decided so
    /// (`dir_aside`), moves it aside as a conflict copy instead.
    fn remove_dir_for(&mut self, path: &SyncPath, abs: &Path) -> Result<(), SyncError> {
        if std::mem::take(&mut self.dir_aside) {
            self.keep_conflict_copy(path, true)?;
        } else {
            std::fs::remove_dir_all(abs)
                .or_else(|e| if fsutil::is_gone(&e) { Ok(()) } else { Err(e) })
                .io_ctx(|| format!("removing directory {path}"))?;
        }
        let rev = self.rev()?;
        index::tombstone_descendants(self.db, path, rev, self.applied_from())?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn write_file(
        &mut self,
        e: &ChangeEntry,
        abs: &Path,
        mode: u32,
        mtime: i64,
        chunks: &[ChunkRef],
        replaces_dir: bool,
        old: Option<&Node>,
    ) -> Result<(), SyncError> {
        let dir = abs
            .parent()
            .expect("an entry path has a parent inside the root");
        let tmp = self.temp_name(dir);
        self.touched_disk = true;
        // An edit of a large file keeps most of its chunks: copy the runs
        // of them that the current version holds straight from it, in the
        // kernel (copy_file_range), instead of reading and writing each.
        let source = match old {
            Some(old) if chunks.len() > 1 => OldVersion::open(self.db, self.root, old)?,
            _ => None,
        };
        let pieces = writer::plan(chunks, self.staging, source.as_ref());
        let mut node = self.node(
            &e.path,
            NodeKind::File,
            Stat::default(),
            None,
            Some(manifest::hash(chunks)),
        )?;
        let size: u64 = chunks.iter().map(|c| u64::from(c.size)).sum();
        let ready = Job::ready(&pieces) && !replaces_dir;
        let to_thread = ready && size >= writer::HAND_OFF_BYTES && writer::can_hand_off();
        // Smaller files go through io_uring (`uring.rs`) when they can.
        let to_ring = ready
            && !to_thread
            && !race_window_hooked()
            && self.writers.ring_takes(&pieces, source.is_some(), mode);
        if to_thread || to_ring {
            let job = Job {
                path: e.path.clone(),
                tmp,
                abs: abs.to_path_buf(),
                mode,
                mtime_ms: mtime,
                pieces,
                old: source,
            };
            let row = WrittenRow {
                node,
                chunks: chunks.to_vec(),
                clear_chunks: self.clear_chunks,
            };
            if to_ring {
                self.expect(abs, OwnEvents::RENAME_ONTO);
                if let Err(err) = self.writers.queue_ring(job, row) {
                    self.unexpect(abs);
                    return Err(err);
                }
            } else {
                self.expect(abs, OwnEvents::REPLACE);
                self.writers.spawn(job, row);
            }
            while self.writers.in_flight() > writer::MAX_IN_FLIGHT {
                self.record_one()?;
            }
            return Ok(());
        }
        // Fetching a chunk may read a file a writer thread is replacing,
        // and a replaced directory goes with what is below it. Otherwise
        // this write touches its own path alone, beside the writers.
        if !ready {
            self.drain()?;
        }
        let path = &e.path;
        let file = writer::fill(
            &tmp,
            path,
            (mode, mtime),
            &pieces,
            source.as_ref(),
            &mut |hash, out| {
                let bytes = self.chunk_bytes(hash, path)?;
                out.write_all(&bytes).io_ctx(|| format!("writing {path}"))
            },
        )?;
        if replaces_dir && let Err(err) = self.remove_dir_for(&e.path, abs) {
            let _ = std::fs::remove_file(&tmp);
            return Err(err);
        }
        self.expect(abs, OwnEvents::REPLACE);
        if let Err(err) = writer::rename_into(&tmp, abs, &e.path) {
            self.unexpect(abs);
            return Err(err);
        }
        race_window(abs);
        // The stat after the rename (which moves ctime on most filesystems)
        // is what the next settle compares against.
        let meta = fsutil::stat_written(&file, mode, &e.path)?;
        node.stat = Stat::applied(&meta, mode);
        index::put_node_with(self.db, &node, chunks, self.clear_chunks)
    }

    /// Takes back one write from a writer thread and records its row; a
    /// failed write is no longer counted as applied.
    fn record_one(&mut self) -> Result<bool, SyncError> {
        let Some((row, result)) = self.writers.next_done() else {
            return Ok(false);
        };
        let WrittenRow {
            mut node,
            chunks,
            clear_chunks,
        } = row;
        match result {
            Ok(stat) => {
                node.stat = stat;
                index::put_node_with(self.db, &node, &chunks, clear_chunks)?;
                Ok(true)
            }
            Err(err) => {
                self.unexpect(&fsutil::abs(self.root, &node.path));
                self.outcome.applied -= 1;
                Err(err)
            }
        }
    }

    /// Waits for every file handed to a writer thread and records the rows
    /// of those written, so the index holds exactly what reached the disk.
    /// Returns the first failure once all are recorded. Called before any
    /// entry that is not a plain file write, and after the last entry.
    pub fn drain(&mut self) -> Result<(), SyncError> {
        let mut first = None;
        loop {
            match self.record_one() {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    if first.is_none() {
                        first = Some(e);
                    } else {
                        tracing::warn!(error = %e, "a further file write of the batch failed");
                    }
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn chunk_bytes(&mut self, hash: &Hash, path: &SyncPath) -> Result<Cow<'_, [u8]>, SyncError> {
        if self.staging.in_memory(hash).is_some() {
            return Ok(Cow::Borrowed(
                self.staging.in_memory(hash).expect("checked"),
            ));
        }
        if let Some(b) = self.staging.read_spilled(hash)? {
            return Ok(Cow::Owned(b));
        }
        let mut misses = ChunkMisses::default();
        if let Some(b) = read_indexed_chunk(self.db, self.root, hash, &mut misses)? {
            return Ok(Cow::Owned(b));
        }
        self.force.extend(misses.changed.iter().cloned());
        Err(missing_chunk_error(hash, Some(path), &misses))
    }

    fn write_dir(
        &mut self,
        e: &ChangeEntry,
        abs: &Path,
        mode: u32,
        mtime: i64,
        disk: Option<&Metadata>,
    ) -> Result<(), SyncError> {
        self.touched_disk = true;
        let created = match disk.map(fsutil::kind_of) {
            Some(DiskKind::Dir) => false,
            Some(_) => {
                std::fs::remove_file(abs).io_ctx(|| format!("removing {}", e.path))?;
                true
            }
            None => true,
        };
        if created {
            self.expect(abs, OwnEvents::MKDIR);
            if let Err(err) = std::fs::create_dir(abs) {
                self.unexpect(abs);
                return Err(SyncError::io(format!("creating directory {}", e.path), err));
            }
        }
        // An existing directory's own watch reports its attribute changes
        // too: only a new one's are announced.
        let own = if created { self.watch.as_deref() } else { None };
        let (dir, mut stat) = match chmod_dir(abs, &e.path, mode, own) {
            Ok(done) => done,
            Err(err) => {
                if created {
                    self.unexpect(abs);
                }
                return Err(err);
            }
        };
        if created {
            // A directory's mtime is informative only (it moves with every
            // child); set it on creation so a fresh tree looks like the
            // sender's, best effort.
            self.expect(abs, OwnEvents::SET_MTIME);
            let times = std::fs::FileTimes::new().set_modified(fsutil::time_of_ms(mtime));
            if dir.set_times(times).is_ok()
                && let Ok(meta) = dir.metadata()
            {
                stat = Stat::applied(&meta, mode);
            }
            self.watch_created_dir(abs);
            self.created_dirs.insert(e.path.as_str().to_owned());
            self.known_dirs.insert(e.path.as_str().to_owned());
        }
        let node = self.node(&e.path, NodeKind::Dir, stat, None, None)?;
        index::put_node(self.db, &node, &[])
    }

    fn write_symlink(
        &mut self,
        e: &ChangeEntry,
        abs: &Path,
        target: &str,
        replaces_dir: bool,
    ) -> Result<(), SyncError> {
        let dir = abs
            .parent()
            .expect("an entry path has a parent inside the root");
        let tmp = self.temp_name(dir);
        self.touched_disk = true;
        std::os::unix::fs::symlink(target, &tmp)
            .io_ctx(|| format!("creating symlink {}", e.path))?;
        // The link's identity, to tell it from one another process puts in
        // its place between our rename and our stat.
        let made = std::fs::symlink_metadata(&tmp).map(|m| Stat::of(&m));
        if replaces_dir && let Err(err) = self.remove_dir_for(&e.path, abs) {
            let _ = std::fs::remove_file(&tmp);
            return Err(err);
        }
        if let Err(err) = std::fs::rename(&tmp, abs) {
            let _ = std::fs::remove_file(&tmp);
            return Err(SyncError::io(format!("renaming into {}", e.path), err));
        }
        race_window(abs);
        // Symlink mode and mtime are what the filesystem gives (Linux has no
        // lchmod; the wire mtime of a symlink is informative only). The
        // identity recorded is the link we made: a link put in its place
        // meanwhile then differs from the row, and the next settle reads it
        // as the local change it is rather than taking it for the sender's.
        let meta = std::fs::symlink_metadata(abs).io_ctx(|| format!("stat {}", e.path))?;
        let mut stat = Stat::of(&meta);
        if let Ok(made) = made {
            (stat.dev, stat.ino) = (made.dev, made.ino);
        }
        let node = self.node(
            &e.path,
            NodeKind::Symlink,
            stat,
            Some(target.to_owned()),
            None,
        )?;
        index::put_node(self.db, &node, &[])
    }

    /// Baseline bookkeeping (rule 10): remember listed paths; on `Sweep`,
    /// delete every live path the baseline did not list.
    /// Live paths `ignore` (the sender's exclusions) matches are spared,
    /// with their ancestors: the sender never lists them.
    pub fn baseline(
        &mut self,
        phase: Baseline,
        entries: &[ChangeEntry],
        ignore: &IgnoreRules,
    ) -> Result<(), SyncError> {
        if phase == Baseline::Off {
            return Ok(());
        }
        self.restart_baseline_if_rewound(entries)?;
        {
            // A live entry's ancestors exist on the sender even when their
            // own entries were deferred out of the stream: sweeping them
            // would take the listed entry with them.
            let mut ins = self
                .db
                .prepare_cached(
                    "INSERT OR IGNORE INTO baseline_marks (remote, path) VALUES (?1, ?2)",
                )
                .ctx("marking a baseline")?;
            for e in entries {
                ins.execute(params![self.remote, e.path.as_str()])
                    .ctx("marking a baseline")?;
                if !matches!(e.state, EntryState::Delete) {
                    for a in e.path.ancestors() {
                        ins.execute(params![self.remote, a.as_str()])
                            .ctx("marking a baseline")?;
                    }
                }
            }
        }
        if let Some(last) = entries.last() {
            self.db
                .prepare_cached(
                    "INSERT INTO baseline_progress (remote, rev, path) VALUES (?1, ?2, ?3)
                     ON CONFLICT (remote) DO UPDATE SET rev = ?2, path = ?3",
                )
                .and_then(|mut s| {
                    s.execute(params![self.remote, last.rev as i64, last.path.as_str()])
                })
                .ctx("recording baseline progress")?;
        }
        if phase != Baseline::Sweep {
            return Ok(());
        }
        if !ignore.is_empty() {
            self.mark_ignored(ignore)?;
        }
        let mut after = String::new();
        loop {
            let page: Vec<String> = {
                let mut stmt = self
                    .db
                    .prepare_cached(
                        "SELECT path FROM nodes WHERE kind != 3 AND path > ?2
                           AND path NOT IN (SELECT path FROM baseline_marks WHERE remote = ?1)
                         ORDER BY path LIMIT 256",
                    )
                    .ctx("sweeping a baseline")?;
                stmt.query_map(params![self.remote, after], |r| r.get(0))
                    .ctx("sweeping a baseline")?
                    .collect::<Result<_, _>>()
                    .ctx("sweeping a baseline")?
            };
            let Some(last) = page.last() else { break };
            after = last.clone();
            for p in page {
                let path = SyncPath::new(p)
                    .map_err(|e| SyncError::Storage(format!("index holds a bad path: {e}")))?;
                // The state directory's ancestors stay; their unlisted
                // children are swept one by one.
                if self.state_rel.is_some_and(|sr| sr.starts_with(&path)) {
                    continue;
                }
                // Already removed with an unlisted ancestor earlier in the page.
                if !index::get_node(self.db, &path)?.is_some_and(|n| n.is_live()) {
                    continue;
                }
                let del = ChangeEntry {
                    rev: 0,
                    path,
                    state: EntryState::Delete,
                };
                self.entry(&del)?;
            }
        }
        self.clear_baseline()
    }

    /// Marks every live path `ignore` matches, and its ancestors, so the
    /// sweep leaves them. One pass over the live rows: a sweep reads them
    /// all anyway.
    fn mark_ignored(&self, ignore: &IgnoreRules) -> Result<(), SyncError> {
        let live: Vec<(String, i64)> = self
            .db
            .prepare_cached("SELECT path, kind FROM nodes WHERE kind != 3")
            .and_then(|mut s| {
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()
            })
            .ctx("listing paths a sweep spares")?;
        let mut ins = self
            .db
            .prepare_cached("INSERT OR IGNORE INTO baseline_marks (remote, path) VALUES (?1, ?2)")
            .ctx("marking excluded paths")?;
        let mut marked: HashSet<&str> = HashSet::new();
        for (p, kind) in &live {
            let path = SyncPath::new(p.as_str())
                .map_err(|e| SyncError::Storage(format!("index holds a bad path: {e}")))?;
            if !ignore.is_ignored(&path, *kind == NodeKind::Dir as i64) {
                continue;
            }
            ins.execute(params![self.remote, path.as_str()])
                .ctx("marking excluded paths")?;
            // Innermost ancestor first: once one is marked, so are all
            // above it (one INSERT per directory, not per excluded path).
            let s = p.as_str();
            for (i, _) in s.rmatch_indices('/') {
                if !marked.insert(&s[..i]) {
                    break;
                }
                ins.execute(params![self.remote, &s[..i]])
                    .ctx("marking excluded paths")?;
            }
        }
        Ok(())
    }

    fn clear_baseline(&self) -> Result<(), SyncError> {
        for sql in [
            "DELETE FROM baseline_marks WHERE remote = ?1",
            "DELETE FROM baseline_progress WHERE remote = ?1",
        ] {
            self.db
                .prepare_cached(sql)
                .and_then(|mut s| s.execute([self.remote]))
                .ctx("clearing baseline marks")?;
        }
        Ok(())
    }

    /// A baseline that starts again (its first entry is not after the last
    /// one marked) is a new attempt: the marks of the abandoned one would
    /// spare paths the sender no longer has.
    fn restart_baseline_if_rewound(&self, entries: &[ChangeEntry]) -> Result<(), SyncError> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        let progress: Option<(i64, String)> = self
            .db
            .prepare_cached("SELECT rev, path FROM baseline_progress WHERE remote = ?1")
            .and_then(|mut s| {
                s.query_row([self.remote], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .ctx("reading baseline progress")?;
        if let Some((rev, path)) = progress {
            let path = SyncPath::new(path)
                .map_err(|e| SyncError::Storage(format!("index holds a bad path: {e}")))?;
            if !ChangeCursor::within(rev as u64, path).is_before(first.rev, &first.path) {
                tracing::info!(
                    remote = self.remote,
                    "baseline restarted; dropping the marks of the previous attempt"
                );
                self.clear_baseline()?;
            }
        }
        Ok(())
    }

    /// Moves the fetch cursor forward to `sender` (never back) and fills in
    /// the outcome.
    pub fn finish(&mut self, sender: Option<&ChangeCursor>) -> Result<ApplyOutcome, SyncError> {
        let stored = index::remote_cursors(self.db, self.remote)?.fetch;
        let fetch = match sender {
            Some(c) if *c > stored => {
                index::write_fetch_cursor(self.db, self.remote, c)?;
                c.clone()
            }
            Some(_) => {
                // Registers the remote even when nothing moves.
                index::write_fetch_cursor(self.db, self.remote, &stored)?;
                stored
            }
            None => stored,
        };
        let mut out = std::mem::take(&mut self.outcome);
        out.rev = index::meta_get(self.db, "rev")?;
        out.fetch_cursor = fetch;
        Ok(out)
    }
}

/// Rule 4: same kind, mode, content and target. mtime never counts.
fn row_matches(row: &Node, state: &EntryState) -> bool {
    match (row.kind, state) {
        (NodeKind::File, EntryState::File { mode, chunks, .. }) => {
            row.stat.mode == *mode && row.manifest == Some(manifest::hash(chunks))
        }
        (NodeKind::Dir, EntryState::Dir { mode, .. }) => row.stat.mode == *mode,
        (NodeKind::Symlink, EntryState::Symlink { target, mode, .. }) => {
            row.target.as_deref() == Some(target.as_str()) && row.stat.mode == *mode
        }
        _ => false,
    }
}

/// `PATH.wsd-conflict-<tail>`; when that last segment would exceed
/// [`wsd_sync::limits::MAX_SEGMENT_BYTES`] (every pull would fail on it),
/// the original name is cut at a character boundary and a short hash of it
/// added (`NAME~hash.wsd-conflict-<tail>`), so distinct long names stay
/// distinct.
fn conflict_copy_path(path: &SyncPath, tail: &str) -> Result<SyncPath, SyncError> {
    use wsd_sync::limits::MAX_SEGMENT_BYTES;
    let marker = wsd_sync::CONFLICT_COPY_MARKER;
    let s = path.as_str();
    let (dir, name) = match s.rsplit_once('/') {
        Some((d, n)) => (Some(d), n),
        None => (None, s),
    };
    let name = if name.len() + marker.len() + tail.len() <= MAX_SEGMENT_BYTES {
        name.to_owned()
    } else {
        let hash = wsd_sync::Hash::of(name.as_bytes()).to_string();
        let hash = &hash[..8];
        let mut keep = MAX_SEGMENT_BYTES - marker.len() - tail.len() - hash.len() - 1;
        while !name.is_char_boundary(keep) {
            keep -= 1;
        }
        format!("{}~{hash}", &name[..keep])
    };
    let copy = match dir {
        Some(d) => format!("{d}/{name}{marker}{tail}"),
        None => format!("{name}{marker}{tail}"),
    };
    SyncPath::new(copy)
}

/// Moves the directory `from` to `to` unless `to` exists (`AlreadyExists`);
/// a plain rename(2) would replace an empty directory there. Filesystems
/// without `RENAME_NOREPLACE` get a check first (one writer per workspace
/// apply, so the check holds).
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    match renameat_with(CWD, from, CWD, to, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(e) if e == rustix::io::Errno::INVAL || e == rustix::io::Errno::NOSYS => {
            match std::fs::symlink_metadata(to) {
                Ok(_) => Err(std::io::ErrorKind::AlreadyExists.into()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::rename(from, to),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Gives the file or symlink `from` a second name `to` (never replacing
/// one): a hard link, or, where the filesystem refuses one (EPERM, ENOTSUP,
/// EMLINK, ...), a copy, so a pull does not stay stuck on it.
fn link_or_copy(from: &Path, to: &Path) -> std::io::Result<()> {
    let linked =
        super::failpoint::hit("conflict-hard-link").and_then(|()| std::fs::hard_link(from, to));
    let err = match linked {
        Ok(()) => return Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(e),
        Err(e) => e,
    };
    tracing::debug!(from = %from.display(), error = %err, "no hard link for a conflict copy; copying");
    let meta = std::fs::symlink_metadata(from)?;
    if meta.file_type().is_symlink() {
        return std::os::unix::fs::symlink(std::fs::read_link(from)?, to);
    }
    let mut src = std::fs::File::open(from)?;
    let mut dst = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(meta.permissions().mode() & 0o7777)
        .custom_flags(fsutil::O_NOFOLLOW)
        .open(to)?;
    // fchmod, not the open mode: the umask must not narrow the copy's.
    let copied = std::io::copy(&mut src, &mut dst).and_then(|_| {
        dst.set_permissions(meta.permissions())?;
        dst.set_times(std::fs::FileTimes::new().set_modified(meta.modified()?))
    });
    if copied.is_err() {
        let _ = std::fs::remove_file(to);
    }
    copied
}

/// Whether the disk at a path (`None`: nothing there) differs from its live
/// row (`None`: none): a local write settle has not stamped yet, local
/// state all the same.
fn disk_differs(row: Option<&Node>, disk: Option<&Metadata>) -> bool {
    match (row, disk) {
        (None, None) => false,
        (Some(r), Some(m)) => !scan::stat_matches(r, fsutil::kind_of(m), &Stat::of(m)),
        _ => true,
    }
}

/// What the plan is told of the disk at a path, next to its live row.
fn disk_facts(row: Option<&Node>, disk: Option<&Metadata>) -> plan::Disk {
    plan::Disk {
        on_disk: match disk.map(fsutil::kind_of) {
            None => plan::OnDisk::Absent,
            Some(DiskKind::File) => plan::OnDisk::File,
            Some(DiskKind::Dir) => plan::OnDisk::Dir,
            Some(DiskKind::Symlink) => plan::OnDisk::Symlink,
            Some(DiskKind::Unsupported) => plan::OnDisk::Other,
        },
        differs_from_row: disk_differs(row, disk),
    }
}

/// The index and the disk below an entry's path, as the plan asks.
struct Subtree<'s, 'a> {
    apply: &'s Apply<'a>,
    path: &'s SyncPath,
}

impl plan::Below for Subtree<'_, '_> {
    type Error = SyncError;
    fn live(&mut self) -> Result<Vec<(SyncPath, bool)>, SyncError> {
        self.apply.live_below(self.path)
    }
    fn unpushed(&mut self) -> Result<bool, SyncError> {
        self.apply.unpushed_local_below(self.path)
    }
    fn unsettled(&mut self) -> Result<bool, SyncError> {
        self.apply.unsettled_below(self.path)
    }
}

/// Sets the mode of the directory at `abs` through a descriptor opened
/// without following a symlink at any depth, and returns the descriptor
/// with the stat apply records: a directory swapped for a symlink meanwhile
/// is refused, never chmod-ed through. The recorded mode is the one asked
/// for, not the one read back: a `chmod` by someone else between the two
/// then shows at the next settle as the local change it is, instead of
/// being recorded as the sender's state.
pub(crate) fn chmod_dir(
    abs: &Path,
    rel: &SyncPath,
    mode: u32,
    own: Option<&LocalWatcher>,
) -> Result<(std::fs::File, Stat), SyncError> {
    use std::os::unix::fs::MetadataExt;
    let dir = fsutil::open_no_symlinks(abs).io_ctx(|| format!("opening directory {rel}"))?;
    let meta = dir.metadata().io_ctx(|| format!("stat {rel}"))?;
    if !meta.is_dir() {
        return Err(SyncError::io(
            format!("chmod {rel}"),
            std::io::Error::from_raw_os_error(rustix::io::Errno::NOTDIR.raw_os_error()),
        ));
    }
    // A new directory usually has its mode already (mkdir's 0777 less the
    // umask): no chmod, so no attribute event, and the stat stands.
    if meta.mode() & 0o7777 == mode & 0o7777 {
        race_window(abs);
        return Ok((dir, Stat::applied(&meta, mode)));
    }
    if let Some(w) = own {
        w.expect(abs, OwnEvents::ATTRIB);
    }
    dir.set_permissions(std::fs::Permissions::from_mode(mode))
        .io_ctx(|| format!("chmod {rel}"))?;
    race_window(abs);
    let meta = dir.metadata().io_ctx(|| format!("stat {rel}"))?;
    Ok((dir, Stat::applied(&meta, mode)))
}

/// A test's stand-in for another process acting on a path.
#[cfg(test)]
pub(crate) type PathHook = Box<dyn FnMut(&Path)>;

#[cfg(test)]
thread_local! {
    /// Runs where another process can race with apply: between
    /// `chmod_dir`'s chmod and its stat, and between a file's or a
    /// symlink's rename into place and its stat.
    pub(crate) static RACE_WINDOW: std::cell::RefCell<Option<PathHook>> =
        std::cell::RefCell::new(None);
}

/// Whether a test set a [`RACE_WINDOW`] hook: files are then written on
/// the apply thread, where it runs between the rename and the stat.
#[inline]
fn race_window_hooked() -> bool {
    #[cfg(test)]
    return RACE_WINDOW.with(|h| h.borrow().is_some());
    #[cfg(not(test))]
    false
}

/// Runs the test's [`RACE_WINDOW`] hook on `abs`; nothing outside tests.
#[inline]
fn race_window(abs: &Path) {
    #[cfg(test)]
    RACE_WINDOW.with(|h| {
        if let Some(f) = h.borrow_mut().as_mut() {
            f(abs)
        }
    });
    let _ = abs;
}

#[cfg(test)]
mod conflict_name_tests {
    use super::*;

    #[test]
    fn a_directory_is_never_renamed_over_an_existing_empty_one() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let e = rename_noreplace(&a, &b).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(a.is_dir() && b.is_dir());
        rename_noreplace(&a, &tmp.path().join("c")).unwrap();
        assert!(!a.exists() && tmp.path().join("c").is_dir());
    }

    #[test]
    fn distinct_long_names_get_distinct_conflict_copies_within_the_segment_limit() {
        let stem = "x".repeat(250);
        let a = conflict_copy_path(&SyncPath::new(format!("d/{stem}a")).unwrap(), "T-1");
        let b = conflict_copy_path(&SyncPath::new(format!("d/{stem}b")).unwrap(), "T-1");
        let (a, b) = (a.unwrap(), b.unwrap());
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("d/xxx") && a.as_str().ends_with(".wsd-conflict-T-1"));
        let short = conflict_copy_path(&SyncPath::new("d/f.txt").unwrap(), "T").unwrap();
        assert_eq!(short.as_str(), "d/f.txt.wsd-conflict-T");
    }
}
