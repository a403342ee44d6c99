//! The container-side store: the workspace is a real directory that
//! commands read and write natively, plus a SQLite index beside it that
//! records what the directory held at the last *settle* (kind, mode, size,
//! mtime, identity and chunk list per path), the rev counter, the `(rev,
//! path)` change index with tombstones, and per-remote watermarks.
//!
//! Chunk bytes are not copied into SQLite: the index maps each chunk to the
//! file and offset holding it, and reads verify the hash. Local changes are
//! found by [`WorkspaceStore::settle`], narrowed by inotify events, with a
//! full stat walk after a restart, a watcher overflow or when watching is
//! off. It deliberately does not serve anything over the wire (that is
//! `rpc`) nor run commands (`exec`). Tables and invariants: `DESIGN.md`.

mod apply;
mod error;
mod first_index;
// Fault-injection seam for tests (feature `failpoints`); a no-op otherwise.
#[doc(hidden)]
pub mod failpoint;
mod fsutil;
mod index;
mod objects;
mod outgoing;
mod scan;
mod uring;
mod watch;
mod writer;

#[cfg(test)]
mod contract;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use rusqlite::Connection;
use wsd_sync::{
    ApplyBatch, ApplyOutcome, ChangeCursor, ChangeEntry, ChangesQuery, ChangesWindow, Hash, Object,
    ObjectReader, Store, SyncError, SyncPath, Watermarks,
};

pub use apply::ConflictCopy;
pub use error::StoreError;
pub use first_index::{FirstIndex, Piece};

use error::IndexContext;
use index::NodeKind;
use objects::Staging;
use outgoing::{OpenFile, Outgoing, PagedChunks};
use watch::{LocalWatcher, Pending};

/// Name of the index database inside the state directory.
pub const INDEX_FILE: &str = "index.sqlite3";

/// How a [`WorkspaceStore`] finds local changes.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Watch the tree with inotify so a settle only looks at what changed.
    /// Without it (or when the watcher fails) every settle walks the whole
    /// tree, comparing each entry's stat with the index.
    pub watch: bool,
    /// Settle before answering `watermarks`, `open_changes` and
    /// `read_entry` (the daemon). Off for a caller that settles explicitly
    /// once per round (the CLI): without a watcher every settle walks the
    /// whole tree, and one push asked for three.
    pub auto_settle: bool,
    /// Before an applied entry overwrites or deletes a local version that
    /// holds changes not yet pushed to the applying remote, keep that
    /// version as a conflict copy (see [`ConflictCopy`]; the CLI's pulls).
    /// Off: the applier wins, counted in `ApplyOutcome::overwrote_local`
    /// (the daemon, whose writers are the command it runs and its peers).
    pub conflict_copies: bool,
    /// Whether the index's commits wait for the disk at checkpoints
    /// (`synchronous=NORMAL`). Off (the CLI): the index never `fsync`s; a
    /// process crash loses nothing, an OS crash may lose the tail of its
    /// commits, which only makes the next transfer resend (apply is
    /// idempotent), and a file torn by one is found at the next boot,
    /// set aside and rebuilt (see [`WorkspaceStore::index_rebuilt`]). On
    /// (the daemon): its index holds peers' cursors that others rely on.
    pub durable_index: bool,
}

impl Default for StoreOptions {
    fn default() -> StoreOptions {
        StoreOptions {
            watch: true,
            auto_settle: true,
            conflict_copies: false,
            durable_index: true,
        }
    }
}

/// What one [`WorkspaceStore::settle`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// The rev stamped on this settle's changes; `None` when nothing changed.
    pub rev: Option<u64>,
    /// Live paths (re)recorded: new, rewritten, chmod-ed, kind-changed.
    pub changed: usize,
    /// Tombstones written for vanished paths (descendants included).
    pub deleted: usize,
    /// Files read and hashed (changed or racily clean).
    pub hashed: usize,
    /// Why the whole tree was walked, when it was.
    pub full_walk: Option<String>,
}

/// The workspace directory plus its SQLite index; implements
/// [`wsd_sync::Store`]. One owner at a time (it lives on the store thread);
/// it is `Send` so that thread can own it.
#[derive(Debug)]
pub struct WorkspaceStore {
    root: PathBuf,
    state_dir: PathBuf,
    /// The state directory as a workspace path, when it sits inside the root.
    state_rel: Option<SyncPath>,
    db: Connection,
    staging: Staging,
    watch: Option<LocalWatcher>,
    /// Why there is no watcher (disabled, failed to start, limit reached).
    no_watch: Option<String>,
    /// A full walk owed to the next settle, with its reason.
    owed_walk: Option<String>,
    /// Whether a full walk has completed since open (the first one also
    /// removes apply temp files a crash left behind).
    walked_since_open: bool,
    /// Files a read found changed behind the index: hashed next settle.
    force: HashSet<SyncPath>,
    /// Where the chunks of the file entries `changes` paged last are: the
    /// objects a sender reads next.
    paged: PagedChunks,
    /// See [`StoreOptions::auto_settle`].
    auto_settle: bool,
    /// See [`StoreOptions::conflict_copies`].
    keep_conflicts: bool,
    /// Conflict copies made since the last [`WorkspaceStore::take_conflict_copies`].
    conflict_copies: Vec<ConflictCopy>,
    /// Stamps the index clean once `db` has closed (taken by `Drop`).
    clean_close: Option<wsd_sqlite::CleanClose>,
    /// The open found the index damaged and started a new one.
    index_rebuilt: bool,
}

impl Drop for WorkspaceStore {
    fn drop(&mut self) {
        // Closed explicitly so the clean-close stamp describes the file
        // after SQLite's final checkpoint.
        let Ok(placeholder) = Connection::open_in_memory() else {
            return;
        };
        let db = std::mem::replace(&mut self.db, placeholder);
        if let Some(clean_close) = self.clean_close.take() {
            clean_close.close(db);
        }
    }
}

impl WorkspaceStore {
    /// Opens the workspace at `root` with its index in `state_dir` (created
    /// if missing). An existing index is resumed: revs, watermarks and
    /// cursors survive a restart, and the first settle walks the tree to
    /// pick up what changed while the daemon was down.
    pub fn open(root: &Path, state_dir: &Path, opts: StoreOptions) -> Result<Self, StoreError> {
        let io = |what: String| {
            move |source| StoreError::Io {
                context: what,
                source,
            }
        };
        let root = std::fs::canonicalize(root).map_err(io(format!("root {}", root.display())))?;
        if !root.is_dir() {
            return Err(StoreError::Invalid(format!(
                "root {} is not a directory",
                root.display()
            )));
        }
        std::fs::create_dir_all(state_dir).map_err(io(format!(
            "creating state directory {}",
            state_dir.display()
        )))?;
        let state_dir = std::fs::canonicalize(state_dir)
            .map_err(io(format!("state directory {}", state_dir.display())))?;
        if root.starts_with(&state_dir) {
            return Err(StoreError::Invalid(format!(
                "state directory {} contains the root {}",
                state_dir.display(),
                root.display()
            )));
        }
        let state_rel = match state_dir.strip_prefix(&root) {
            Err(_) => None,
            Ok(rel) => Some(
                rel.to_str()
                    .and_then(|s| SyncPath::new(s).ok())
                    .ok_or_else(|| {
                        StoreError::Invalid(format!(
                            "state directory {} is not a valid workspace path",
                            state_dir.display()
                        ))
                    })?,
            ),
        };
        index::note_clock_of(&root);
        let (db, clean_close, index_rebuilt) =
            index::open(&state_dir.join(INDEX_FILE), opts.durable_index)?;
        let staging = Staging::open(state_dir.join("objects"))?;
        let (watch, no_watch) = if opts.watch {
            // The barrier cookies of daemons before 2026-11-28 (the
            // barrier reads the event queue now).
            let _ = std::fs::remove_dir_all(state_dir.join("cookies"));
            match LocalWatcher::start(&root, &state_dir) {
                Ok(w) => (Some(w), None),
                Err(reason) => {
                    tracing::warn!(%reason, "no watcher; every settle walks the whole tree");
                    (None, Some(reason))
                }
            }
        } else {
            tracing::info!(root = %root.display(), "watcher disabled; every settle walks the whole tree");
            (None, Some("the watcher is disabled".to_owned()))
        };
        Ok(WorkspaceStore {
            root,
            state_dir,
            state_rel,
            db,
            staging,
            watch,
            no_watch,
            owed_walk: Some("startup: reconciling the directory with the index".to_owned()),
            walked_since_open: false,
            force: HashSet::new(),
            paged: PagedChunks::default(),
            auto_settle: opts.auto_settle,
            keep_conflicts: opts.conflict_copies,
            conflict_copies: Vec::new(),
            clean_close: Some(clean_close),
            index_rebuilt,
        })
    }

    /// True when this open found the index damaged (at open, or torn by an
    /// OS crash, see [`StoreOptions::durable_index`]) and set it aside: the
    /// new index knows nothing of what was synced before, so its owner
    /// should sync under a new peer name (sync rule 9).
    pub fn index_rebuilt(&self) -> bool {
        self.index_rebuilt
    }

    /// Calls `hook` (from the watcher's thread; it must not block) with
    /// each path under the root the watcher reports changed, or `None` when
    /// events were lost, so that an owner waiting for changes can settle
    /// instead of polling. Without a watcher (see [`Self::is_watching`]) it is
    /// never called: changes then show only at the next settle.
    pub fn set_change_hook(&self, hook: impl Fn(Option<&Path>) + Send + Sync + 'static) {
        if let Some(w) = &self.watch {
            w.set_change_hook(std::sync::Arc::new(hook));
        }
    }

    /// The workspace directory (canonical).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The state directory (canonical).
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// True while inotify narrows settles (false: every settle walks).
    pub fn is_watching(&self) -> bool {
        self.watch.is_some()
    }

    /// Why the next settle will walk the whole tree instead of looking at
    /// what the watcher reported (no watcher, lost events, a walk owed
    /// since open or a failed settle); `None` when it will not. A local
    /// agent answers only while this is `None` (`wsd/src/cli/agent.rs`).
    pub fn full_walk_due(&self) -> Option<String> {
        if let Some(reason) = &self.owed_walk {
            return Some(reason.clone());
        }
        match &self.watch {
            Some(w) => w.rescan_due(),
            None => Some(self.no_watch.clone().unwrap_or_default()),
        }
    }

    /// Settles when [`StoreOptions::auto_settle`] is on.
    fn auto_settle(&mut self) -> Result<(), SyncError> {
        if self.auto_settle {
            self.settle()?;
        }
        Ok(())
    }

    /// The conflict copies applies made since the last call, oldest first
    /// (only with [`StoreOptions::conflict_copies`]).
    pub fn take_conflict_copies(&mut self) -> Vec<ConflictCopy> {
        std::mem::take(&mut self.conflict_copies)
    }

    /// Stamps everything written to the directory before this call with a
    /// rev: one new rev for the whole settle when anything changed.
    pub fn settle(&mut self) -> Result<SettleReport, SyncError> {
        let result = self.settle_once();
        if let Err(e) = &result {
            // The dirty paths it consumed are lost with the rolled-back
            // transaction: only a walk can find them again.
            tracing::warn!(error = %e, "settle failed; the next settle walks the whole tree");
            self.owed_walk = Some(format!("the previous settle failed: {e}"));
        }
        result
    }

    fn settle_once(&mut self) -> Result<SettleReport, SyncError> {
        let started_ns = fsutil::now_ns();
        let pending = match self.watch.as_mut() {
            Some(w) => w.take_pending(),
            None => Pending::Rescan(self.no_watch.clone().unwrap_or_default()),
        };
        let reason = match (self.owed_walk.take(), pending) {
            (Some(reason), _) => {
                tracing::info!(%reason, "settle walks the whole tree");
                reason
            }
            (None, Pending::Rescan(reason)) if self.watch.is_some() => {
                tracing::warn!(%reason, "events may be lost; settle walks the whole tree");
                reason
            }
            // Without a watcher every settle walks; that was logged once.
            (None, Pending::Rescan(reason)) => reason,
            (None, Pending::Paths(paths)) => {
                let mut dirty = BTreeSet::new();
                for p in paths {
                    if let Some(rel) = self.workspace_path(&p) {
                        dirty.insert(rel);
                    }
                }
                dirty.extend(self.force.iter().cloned());
                return self.settle_paths(started_ns, dirty);
            }
        };
        let tx = self.db.transaction().ctx("starting a settle")?;
        let mut scan = scan::Scan {
            db: &tx,
            root: &self.root,
            state_dir: &self.state_dir,
            started_ns,
            rev: None,
            report: SettleReport::default(),
            watch: &mut self.watch,
            watch_lost: None,
            force: &self.force,
            remove_stale_temps: !self.walked_since_open,
            pending: Vec::new(),
        };
        scan.walk(None)?;
        let mut report = scan.report;
        let lost = scan.watch_lost;
        tx.commit().ctx("committing a settle")?;
        report.full_walk = Some(reason);
        self.walked_since_open = true;
        self.after_settle(lost);
        Ok(report)
    }

    fn settle_paths(
        &mut self,
        started_ns: i64,
        dirty: BTreeSet<SyncPath>,
    ) -> Result<SettleReport, SyncError> {
        let tx = self.db.transaction().ctx("starting a settle")?;
        let mut scan = scan::Scan {
            db: &tx,
            root: &self.root,
            state_dir: &self.state_dir,
            started_ns,
            rev: None,
            report: SettleReport::default(),
            watch: &mut self.watch,
            watch_lost: None,
            force: &self.force,
            remove_stale_temps: false,
            pending: Vec::new(),
        };
        // Sorted, so a directory comes before the paths below it; a walked
        // directory covers its whole subtree.
        let mut walked: HashSet<SyncPath> = HashSet::new();
        // Ancestors already seen to be real directories in this settle: the
        // paths of one busy directory share them (an apply of thousands of
        // files reports every one of them).
        let mut known_dirs: HashSet<String> = HashSet::new();
        for rel in dirty {
            if rel.ancestors().any(|a| walked.contains(&a)) {
                continue;
            }
            let meta = fsutil::lstat_in_root_cached(&self.root, &rel, &mut known_dirs)
                .map_err(|e| SyncError::io(format!("stat {rel}"), e))?;
            if meta.as_ref().is_some_and(|m| m.file_type().is_dir()) {
                // Walking (not just observing) a dirty directory covers a
                // directory created or moved in with content, and re-adds
                // the watch of a directory renamed in.
                scan.walk(Some(&rel))?;
                walked.insert(rel);
            } else {
                if meta.is_none()
                    && let Some(w) = scan.watch.as_mut()
                {
                    w.unwatch_below(&fsutil::abs(&self.root, &rel));
                }
                scan.observe(&rel, meta.as_ref().map(scan::Seen::of))?;
            }
        }
        scan.flush_hashes()?;
        let report = scan.report;
        let lost = scan.watch_lost;
        tx.commit().ctx("committing a settle")?;
        self.after_settle(lost);
        Ok(report)
    }

    fn after_settle(&mut self, watch_lost: Option<String>) {
        self.force.clear();
        if let Some(reason) = watch_lost {
            tracing::warn!(%reason, "watcher stopped; every settle now walks the whole tree");
            self.watch = None;
            self.no_watch = Some(reason);
        }
    }

    /// The workspace path of an absolute path from an event, or `None` for
    /// the root itself, the state directory, apply temp files and names
    /// that cannot be synced.
    fn workspace_path(&self, p: &Path) -> Option<SyncPath> {
        let rel = p.strip_prefix(&self.root).ok()?;
        let rel = SyncPath::new(rel.to_str()?).ok()?;
        if self.state_rel.as_ref().is_some_and(|s| rel.starts_with(s)) {
            return None;
        }
        if fsutil::is_apply_temp(rel.file_name()) {
            return None;
        }
        Some(rel)
    }

    /// Drops tombstones every registered remote has acknowledged (rule 10):
    /// those at or below the smallest push rev over the remotes. A reader
    /// whose cursor is older than the newest pruned tombstone gets a
    /// baseline from [`Store::open_changes`]. Returns how many were dropped.
    pub fn prune_tombstones(&mut self) -> Result<usize, SyncError> {
        let tx = self.db.transaction().ctx("starting a prune")?;
        let Some(min) = index::min_push_rev(&tx)? else {
            return Ok(0);
        };
        let newest: Option<i64> = tx
            .query_row(
                "SELECT MAX(rev) FROM nodes WHERE kind = 3 AND rev <= ?1",
                [min as i64],
                |r| r.get(0),
            )
            .ctx("pruning tombstones")?;
        let Some(newest) = newest else { return Ok(0) };
        let n = tx
            .execute(
                "DELETE FROM nodes WHERE kind = 3 AND rev <= ?1",
                [min as i64],
            )
            .ctx("pruning tombstones")?;
        let horizon = index::meta_get(&tx, "prune_horizon")?.max(newest as u64);
        index::meta_set(&tx, "prune_horizon", horizon)?;
        tx.commit().ctx("committing a prune")?;
        tracing::debug!(pruned = n, horizon, "pruned tombstones");
        Ok(n)
    }
}

/// [`Store::read_object`] with the store's parts borrowed separately, so a
/// batch can run inside one read transaction.
fn read_one_object(
    db: &Connection,
    root: &Path,
    staging: &mut Staging,
    paged: &mut PagedChunks,
    force: &mut HashSet<SyncPath>,
    hash: &Hash,
) -> Result<Vec<u8>, SyncError> {
    if let Some(b) = staging.read(hash)? {
        return Ok(b.into_owned());
    }
    if let Some(loc) = paged.take(hash) {
        let mut buf = vec![0; loc.size as usize];
        if outgoing::read_located(root, &mut OpenFile::default(), &loc, hash, &mut buf)? {
            return Ok(buf);
        }
    }
    let mut misses = apply::ChunkMisses::default();
    if let Some(b) = apply::read_indexed_chunk(db, root, hash, &mut misses)? {
        return Ok(b);
    }
    force.extend(misses.changed.iter().cloned());
    Err(apply::missing_chunk_error(hash, None, &misses))
}

impl Store for WorkspaceStore {
    fn current_rev(&mut self) -> Result<u64, SyncError> {
        index::meta_get(&self.db, "rev")
    }

    fn watermarks(&mut self, remote: &str) -> Result<Watermarks, SyncError> {
        self.auto_settle()?;
        let c = index::remote_cursors(&self.db, remote)?;
        Ok(Watermarks {
            current_rev: index::meta_get(&self.db, "rev")?,
            push_cursor: c.push,
            fetch_cursor: c.fetch,
        })
    }

    fn open_changes(&mut self, after: &ChangeCursor) -> Result<ChangesWindow, SyncError> {
        self.auto_settle()?;
        let rev = index::meta_get(&self.db, "rev")?;
        let horizon = index::meta_get(&self.db, "prune_horizon")?;
        Ok(ChangesWindow {
            through: ChangeCursor::at(rev),
            baseline: horizon > 0 && *after < ChangeCursor::at(horizon),
        })
    }

    fn changes(&mut self, q: ChangesQuery<'_>) -> Result<Vec<ChangeEntry>, SyncError> {
        // One read transaction for the page and its chunk lists.
        let tx = self.db.unchecked_transaction().ctx("paging changes")?;
        let mut out = Vec::new();
        let mut after = q.after.clone();
        while out.len() < q.limit {
            let want = q.limit - out.len();
            let rows = index::rows_after(&tx, &after, q.through.rev, q.exclude_applied_from, want)?;
            let got = rows.len();
            for (node, chunks) in rows {
                if q.through.is_before(node.rev, &node.path) {
                    return Ok(out);
                }
                after = ChangeCursor::within(node.rev, node.path.clone());
                let ignored = match node.kind {
                    NodeKind::Dir => q.ignore.is_ignored(&node.path, true),
                    NodeKind::File | NodeKind::Symlink => q.ignore.is_ignored(&node.path, false),
                    NodeKind::Tombstone => q.ignore.is_ignored_any_kind(&node.path),
                };
                if !ignored {
                    self.paged.note(&node, &chunks);
                    out.push(index::entry_with(&node, chunks));
                }
            }
            if got < want {
                break;
            }
        }
        Ok(out)
    }

    fn read_entry(&mut self, path: &SyncPath) -> Result<Option<ChangeEntry>, SyncError> {
        self.auto_settle()?;
        match index::get_node(&self.db, path)? {
            Some(n) => Ok(Some(index::entry_of(&self.db, &n)?)),
            None => Ok(None),
        }
    }

    fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        // One read transaction for the batch: otherwise SQLite takes and
        // drops its WAL locks (three fcntl calls) for every lookup.
        let tx = self.db.unchecked_transaction().ctx("probing objects")?;
        let mut held = Vec::new();
        for h in hashes {
            if self.staging.contains(h) || index::chunk_indexed(&tx, h)? {
                held.push(*h);
            }
        }
        Ok(held)
    }

    fn read_object(&mut self, hash: &Hash) -> Result<Vec<u8>, SyncError> {
        read_one_object(
            &self.db,
            &self.root,
            &mut self.staging,
            &mut self.paged,
            &mut self.force,
            hash,
        )
    }

    fn read_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError> {
        let tx = self.db.unchecked_transaction().ctx("reading objects")?;
        hashes
            .iter()
            .map(|h| {
                Ok(Object {
                    hash: *h,
                    bytes: read_one_object(
                        &tx,
                        &self.root,
                        &mut self.staging,
                        &mut self.paged,
                        &mut self.force,
                        h,
                    )?,
                })
            })
            .collect()
    }

    fn object_reader<'a>(
        &'a mut self,
        _wanted: &[(Hash, u32)],
    ) -> Result<Box<dyn ObjectReader + 'a>, SyncError> {
        // Each object straight from its file into the sender's buffer; the
        // page just read says where most of them are.
        Ok(Box::new(Outgoing {
            db: &self.db,
            root: &self.root,
            staging: &mut self.staging,
            paged: &mut self.paged,
            force: &mut self.force,
            open: OpenFile::default(),
        }))
    }

    fn stage_objects(&mut self, objects: &[Object]) -> Result<(), SyncError> {
        for o in objects {
            o.check()?;
            self.staging.put_verified(&o.hash, &o.bytes)?;
        }
        Ok(())
    }

    fn stage_checked_objects(&mut self, objects: Vec<Object>) -> Result<(), SyncError> {
        for o in objects {
            debug_assert!(o.check().is_ok(), "object {} was not checked", o.hash);
            self.staging.put_owned(o.hash, o.bytes)?;
        }
        Ok(())
    }

    fn apply(&mut self, batch: ApplyBatch<'_>) -> Result<ApplyOutcome, SyncError> {
        let started_ns = fsutil::now_ns();
        let tx = self.db.transaction().ctx("starting an apply")?;
        let mut a = apply::Apply::new(
            &tx,
            &self.root,
            self.state_rel.as_ref(),
            &mut self.staging,
            &mut self.force,
            started_ns,
            batch.remote,
            batch.sender.is_some(),
        )?;
        if self.keep_conflicts {
            a.conflicts = Some(&mut self.conflict_copies);
        }
        a.watch = self.watch.as_mut();
        a.ignore = batch.ignore;
        // Nothing below `check` has touched the directory when it fails:
        // dropping the transaction rolls the index back too.
        a.check(batch.entries)?;
        let mut result = Ok(());
        for e in batch.entries {
            result = a.entry(e);
            if result.is_err() {
                break;
            }
        }
        // Files still being written on writer threads reach the disk and
        // the index before the batch is judged.
        match (a.drain(), &result) {
            (Err(e), Ok(())) => result = Err(e),
            (Err(e), Err(_)) => {
                tracing::warn!(error = %e, "a further file write of the batch failed")
            }
            (Ok(()), _) => {}
        }
        if result.is_ok() {
            result = a.baseline(batch.baseline, batch.entries, batch.ignore);
        }
        let outcome = match result {
            Ok(()) => a.finish(batch.sender.as_ref())?,
            Err(err) => {
                let touched = a.touched_disk;
                drop(a);
                if touched {
                    // Keep the rows of what reached the disk; the cursor
                    // stays, so the sender retries and skips what is done.
                    if let Err(commit) = tx.commit() {
                        tracing::error!(error = %commit, "could not record a partial apply; the next settle reconciles");
                    }
                }
                tracing::warn!(remote = batch.remote, error = %err, "apply failed");
                return Err(err);
            }
        };
        failpoint::hit("apply-before-commit")
            .map_err(|e| SyncError::io("committing an apply".to_owned(), e))?;
        tx.commit().ctx("committing an apply")?;
        // Staged objects of this batch now live in files (or were not
        // needed): drop them so staging holds only what is still pending.
        for e in batch.entries {
            for c in e.chunks() {
                self.staging.remove(&c.hash);
            }
        }
        Ok(outcome)
    }

    fn idle(&mut self) -> Result<(), SyncError> {
        // Only a watched store: without a watcher a settle walks the tree.
        if self.auto_settle && self.watch.as_ref().is_some_and(|w| w.has_pending()) {
            let report = self.settle()?;
            tracing::debug!(?report, "settled while idle");
        }
        Ok(())
    }

    fn set_push_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        let tx = self.db.transaction().ctx("starting a cursor update")?;
        index::set_push_cursor(&tx, remote, cursor)?;
        tx.commit().ctx("committing a cursor update")
    }

    fn set_fetch_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        let tx = self.db.transaction().ctx("starting a cursor update")?;
        index::set_fetch_cursor(&tx, remote, cursor)?;
        tx.commit().ctx("committing a cursor update")
    }
}
