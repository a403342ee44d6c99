//! Snapshots: the live tree's rows at one rev, kept in `snapshot_entries`
//! over the same manifests and chunks (nothing is copied), restored as one
//! mutation at a new rev, and copied into another store to fork it.

use std::collections::HashSet;

use rusqlite::{OptionalExtension, TransactionBehavior, params};
use wsd_sync::{ChangeEntry, EntryState, Hash, SyncError, SyncPath};

use crate::chunk_store::ChunkStore;
use crate::rows::{self, Mutation, Node, ensure_manifest, file_chunks, hash_from_sql, put_node};
use crate::{Dofs, DofsError};

/// What [`Dofs::create_snapshot`] recorded.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SnapshotSummary {
    /// The rev the snapshot is consistent at.
    pub rev: u64,
    /// Regular files in it.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// Bytes of the chunks that no other snapshot in this store holds.
    pub new_bytes: u64,
}

/// What [`Dofs::restore_snapshot`] changed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct RestoreOutcome {
    /// The rev of the restore, `None` when the tree already matched.
    pub rev: Option<u64>,
    /// Paths written (created or changed in kind, mode, content or target).
    pub changed: u64,
    /// Live paths the snapshot does not have, now deleted.
    pub removed: u64,
}

/// How a path differs between two trees ([`Dofs::diff_snapshot`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DiffKind {
    Added,
    Removed,
    Modified,
}

impl DiffKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DiffKind::Added => "added",
            DiffKind::Removed => "removed",
            DiffKind::Modified => "modified",
        }
    }
}

/// The chunks each snapshot references, with their sizes (a view used by
/// `new_bytes`).
const SNAPSHOT_CHUNKS: &str = "
    snap_chunks (snapshot, chunk, size) AS (
        SELECT snapshot, chunk, size FROM snapshot_entries WHERE chunk IS NOT NULL
        UNION ALL
        SELECT se.snapshot, mc.chunk, mc.size FROM snapshot_entries se
          JOIN manifest_chunks mc ON mc.manifest = se.manifest
         WHERE se.kind = 'file' AND se.chunk IS NULL)";

/// Whether two rows' states differ the way sync sees it: kind, mode,
/// content or target (never mtime).
const DIFFERS: &str = "(a.kind <> b.kind OR a.mode IS NOT b.mode
    OR a.manifest IS NOT b.manifest OR a.target IS NOT b.target)";

impl Dofs {
    /// Records the live tree as snapshot `id` at the current rev.
    pub fn create_snapshot(&mut self, id: &str) -> Result<SnapshotSummary, DofsError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let rev = rows::current_rev(&tx)?;
        let inserted = tx.execute(
            "INSERT INTO snapshots (id, rev, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (id) DO NOTHING",
            params![id, rev, rows::now_ms()],
        )?;
        if inserted == 0 {
            return Err(DofsError::AlreadyExists {
                path: format!("snapshot {id}"),
            });
        }
        tx.execute(
            "INSERT INTO snapshot_entries
                (snapshot, path, parent, kind, mode, mtime, size, target, manifest, chunk)
             SELECT ?1, path, parent, kind, mode, mtime, size, target, manifest, chunk
               FROM entries WHERE kind <> 'delete'",
            [id],
        )?;
        let (files, bytes): (u64, u64) = tx.query_row(
            "SELECT count(*), coalesce(sum(size), 0) FROM snapshot_entries
              WHERE snapshot = ?1 AND kind = 'file'",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )?;
        let new_bytes: u64 = tx.query_row(
            &format!(
                "WITH {SNAPSHOT_CHUNKS}
                 SELECT coalesce(sum(size), 0) FROM
                   (SELECT DISTINCT chunk, size FROM snap_chunks WHERE snapshot = ?1)
                  WHERE chunk NOT IN (SELECT chunk FROM snap_chunks WHERE snapshot <> ?1)"
            ),
            [id],
            |r| r.get(0),
        )?;
        tx.commit()?;
        Ok(SnapshotSummary {
            rev,
            files,
            bytes,
            new_bytes,
        })
    }

    /// The ids of this store's snapshots, oldest first.
    pub fn snapshot_ids(&self) -> Result<Vec<String>, DofsError> {
        let mut stmt = self
            .conn
            .prepare("SELECT id FROM snapshots ORDER BY created_at, id")?;
        let ids = stmt.query_map([], |r| r.get(0))?;
        Ok(ids.collect::<Result<_, _>>()?)
    }

    fn require_snapshot(conn: &rusqlite::Connection, id: &str) -> Result<u64, DofsError> {
        conn.query_row("SELECT rev FROM snapshots WHERE id = ?1", [id], |r| {
            r.get(0)
        })
        .optional()?
        .ok_or_else(|| DofsError::not_found(format!("snapshot {id}")))
    }

    /// The distinct chunks snapshot `id` references.
    pub fn snapshot_chunks(&self, id: &str) -> Result<Vec<Hash>, DofsError> {
        Dofs::require_snapshot(&self.conn, id)?;
        let mut stmt = self.conn.prepare(&format!(
            "WITH {SNAPSHOT_CHUNKS} SELECT DISTINCT chunk FROM snap_chunks WHERE snapshot = ?1"
        ))?;
        let rows = stmt.query_map([id], |r| hash_from_sql(r.get(0)?, 0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Every chunk any snapshot of this store references (what a copy of
    /// the snapshots elsewhere must keep).
    pub fn all_snapshot_chunks(&self) -> Result<HashSet<Hash>, DofsError> {
        let mut stmt = self.conn.prepare(&format!(
            "WITH {SNAPSHOT_CHUNKS} SELECT DISTINCT chunk FROM snap_chunks"
        ))?;
        let rows = stmt.query_map([], |r| hash_from_sql(r.get(0)?, 0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Forgets snapshot `id`; its chunks become garbage unless something
    /// else references them.
    pub fn delete_snapshot(&mut self, id: &str) -> Result<(), DofsError> {
        Dofs::require_snapshot(&self.conn, id)?;
        self.conn
            .execute("DELETE FROM snapshots WHERE id = ?1", [id])?;
        Ok(())
    }

    /// Rewrites the tree to snapshot `id` in one mutation at one new rev:
    /// paths the snapshot lacks are deleted, paths that differ are written
    /// back (as local writes, so the next push sends them), the rest stay.
    pub fn restore_snapshot(&mut self, id: &str) -> Result<RestoreOutcome, DofsError> {
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        Dofs::require_snapshot(&m, id)?;
        let removed: u64 = m.query_row(
            "SELECT count(*) FROM entries WHERE kind <> 'delete'
               AND path NOT IN (SELECT path FROM snapshot_entries WHERE snapshot = ?1)",
            [id],
            |r| r.get(0),
        )?;
        let changed_filter = format!(
            "FROM snapshot_entries a LEFT JOIN entries b ON b.path = a.path
             WHERE a.snapshot = ?1 AND (b.path IS NULL OR {DIFFERS})"
        );
        let changed: u64 =
            m.query_row(&format!("SELECT count(*) {changed_filter}"), [id], |r| {
                r.get(0)
            })?;
        if removed == 0 && changed == 0 {
            m.commit()?;
            return Ok(RestoreOutcome {
                rev: None,
                changed,
                removed,
            });
        }
        let rev = m.rev()?;
        m.execute(
            "UPDATE entries SET kind = 'delete', rev = ?2, mode = NULL, mtime = NULL, size = NULL,
                    target = NULL, manifest = NULL, chunk = NULL, applied_from = NULL
              WHERE kind <> 'delete'
                AND path NOT IN (SELECT path FROM snapshot_entries WHERE snapshot = ?1)",
            params![id, rev],
        )?;
        m.execute(
            &format!(
                "INSERT INTO entries
                    (path, parent, rev, kind, mode, mtime, size, target, manifest, applied_from, chunk)
                 SELECT a.path, a.parent, ?2, a.kind, a.mode, a.mtime, a.size, a.target,
                        a.manifest, NULL, a.chunk
                 {changed_filter}
                 ON CONFLICT (path) DO UPDATE SET
                    rev = excluded.rev, kind = excluded.kind, mode = excluded.mode,
                    mtime = excluded.mtime, size = excluded.size, target = excluded.target,
                    manifest = excluded.manifest, applied_from = NULL, chunk = excluded.chunk"
            ),
            params![id, rev],
        )?;
        m.commit()?;
        Ok(RestoreOutcome {
            rev: Some(rev),
            changed,
            removed,
        })
    }

    /// The paths that differ from snapshot `from` to snapshot `to` (the
    /// live tree when `None`), in path order.
    pub fn diff_snapshot(
        &self,
        from: &str,
        to: Option<&str>,
    ) -> Result<Vec<(String, DiffKind)>, DofsError> {
        Dofs::require_snapshot(&self.conn, from)?;
        if let Some(to) = to {
            Dofs::require_snapshot(&self.conn, to)?;
        }
        let target = match to {
            Some(_) => {
                "SELECT path, kind, mode, manifest, target FROM snapshot_entries
                         WHERE snapshot = ?2"
            }
            None => {
                "SELECT path, kind, mode, manifest, target FROM entries
                      WHERE kind <> 'delete' AND ?2 IS NULL"
            }
        };
        let sql = format!(
            "WITH a AS (SELECT path, kind, mode, manifest, target FROM snapshot_entries
                         WHERE snapshot = ?1),
                  b AS ({target})
             SELECT path, 'removed' FROM a WHERE path NOT IN (SELECT path FROM b)
             UNION ALL
             SELECT path, 'added' FROM b WHERE path NOT IN (SELECT path FROM a)
             UNION ALL
             SELECT a.path, 'modified' FROM a JOIN b ON b.path = a.path WHERE {DIFFERS}
             ORDER BY 1"
        );
        let mut stmt = self.conn.prepare(&sql)?;
        let rows = stmt.query_map(params![from, to], |r| {
            let kind: String = r.get(1)?;
            Ok((
                r.get::<_, String>(0)?,
                match kind.as_str() {
                    "added" => DiffKind::Added,
                    "removed" => DiffKind::Removed,
                    _ => DiffKind::Modified,
                },
            ))
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Writes the tree of `source`'s snapshot `id` into this store (which
    /// must be empty) as one mutation, with every chunk it needs: a fork.
    pub fn fork_from(&mut self, source: &Dofs, id: &str) -> Result<Option<u64>, DofsError> {
        if rows::current_rev(&self.conn)? != 0 {
            return Err(DofsError::invalid(
                "",
                "a fork is written into an empty store only",
            ));
        }
        Dofs::require_snapshot(&source.conn, id)?;
        let mut stmt = source.conn.prepare(SNAPSHOT_ROWS)?;
        let mut rows = stmt.query([id])?;
        let from = source.chunks();
        // One object store for both: the fork indexes the source's objects
        // without moving a byte.
        let shared_objects = match (&source.objects, &self.objects) {
            (Some(a), Some(b)) => std::sync::Arc::ptr_eq(a, b),
            _ => false,
        };
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        while let Some(r) = rows.next()? {
            let (path, node) = snapshot_row(r)?;
            if let Node::File {
                size,
                manifest,
                chunk,
                ..
            } = &node
            {
                let list = file_chunks(&source.conn, manifest, chunk.as_ref(), *size)?;
                let into = m.chunks();
                for c in &list {
                    if into.holds(&c.hash)? {
                        continue;
                    }
                    let slot = match shared_objects
                        && from.here(std::slice::from_ref(&c.hash))?.is_empty()
                    {
                        true => Some(from.slots(std::slice::from_ref(&c.hash))?[0]),
                        false => None,
                    };
                    // A place a collection in progress may delete is not
                    // copied: the bytes are stored again.
                    match (slot, &self.objects) {
                        (Some(slot), Some(objects)) if objects.lasting_place(&c.hash, slot) => {
                            into.index_stored(&[(c.hash, c.size as usize, slot)])?;
                        }
                        _ => {
                            into.put_if_absent(&c.hash, &from.get(&c.hash)?)?;
                        }
                    }
                }
                ensure_manifest(&m, &list)?;
            }
            let rev = m.rev()?;
            put_node(&m, &path, rev, &node, None)?;
        }
        m.commit()
    }
}

impl Dofs {
    /// Snapshot `id`'s tree as entries (dirs, files with their chunk
    /// lists, symlinks) in path order, each stamped with the snapshot's
    /// rev: what a copy of the snapshot elsewhere records.
    pub fn snapshot_tree(&self, id: &str) -> Result<Vec<ChangeEntry>, DofsError> {
        let rev = Dofs::require_snapshot(&self.conn, id)?;
        let mut stmt = self.conn.prepare(SNAPSHOT_ROWS)?;
        let mut rows = stmt.query([id])?;
        let mut out = Vec::new();
        while let Some(r) = rows.next()? {
            let (path, node) = snapshot_row(r)?;
            let row = rows::Row {
                path: path.into_string(),
                rev,
                node,
                applied_from: None,
            };
            out.push(rows::to_entry(&self.conn, row)?);
        }
        Ok(out)
    }

    /// Records `tree` (as [`Dofs::snapshot_tree`] gave it, possibly from
    /// another machine) as snapshot `id` of this store, at its current
    /// rev: a recovery. Every chunk must be held, here or in this store's
    /// object store (asked once for those the index lacks, then indexed);
    /// the first missing one is `EUNKNOWN_HASH` naming it and its path,
    /// and nothing is recorded.
    pub fn import_snapshot(
        &mut self,
        id: &str,
        created_at: i64,
        tree: &[ChangeEntry],
    ) -> Result<(), DofsError> {
        let mut sizes: std::collections::HashMap<Hash, (u32, &SyncPath)> = Default::default();
        for e in tree {
            e.validate()?;
            if matches!(e.state, EntryState::Delete) {
                return Err(DofsError::invalid(
                    &e.path,
                    "a snapshot lists live paths only",
                ));
            }
            for c in e.chunks() {
                sizes.entry(c.hash).or_insert((c.size, &e.path));
            }
        }
        let wanted: Vec<Hash> = sizes.keys().copied().collect();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let chunks = crate::chunk_store::Chunks::new(&tx, self.objects.as_deref());
        let indexed: HashSet<Hash> = chunks.has(&wanted)?.into_iter().collect();
        let unknown: Vec<Hash> = wanted
            .iter()
            .filter(|h| !indexed.contains(h))
            .copied()
            .collect();
        // Packed ones come with their pack range (read from the packs'
        // own indexes when this process has not seen them).
        let found: std::collections::HashMap<Hash, Option<crate::pack::PackSlot>> =
            match (&self.objects, unknown.is_empty()) {
                (Some(objects), false) => objects.locate(&unknown)?.into_iter().collect(),
                _ => Default::default(),
            };
        if let Some(missing) = unknown.iter().find(|h| !found.contains_key(h)) {
            return Err(SyncError::UnknownHash {
                hash: *missing,
                path: Some(sizes[missing].1.to_string()),
            }
            .into());
        }
        let adopted: Vec<(Hash, usize, Option<crate::pack::PackSlot>)> = unknown
            .iter()
            .map(|h| (*h, sizes[h].0 as usize, found[h]))
            .collect();
        chunks.index_stored(&adopted)?;
        let rev = rows::current_rev(&tx)?;
        let inserted = tx.execute(
            "INSERT INTO snapshots (id, rev, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (id) DO NOTHING",
            params![id, rev, created_at],
        )?;
        if inserted == 0 {
            return Err(DofsError::AlreadyExists {
                path: format!("snapshot {id}"),
            });
        }
        let mut insert = tx.prepare(
            "INSERT INTO snapshot_entries
                (snapshot, path, parent, kind, mode, mtime, size, target, manifest, chunk)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        for e in tree {
            let parent = e
                .path
                .parent()
                .map(SyncPath::into_string)
                .unwrap_or_default();
            let node = Node::from_state(&e.state);
            let (kind, mode, mtime, size, target, manifest, chunk) = match &node {
                Node::File {
                    mode,
                    mtime,
                    size,
                    manifest,
                    chunk,
                } => {
                    ensure_manifest(&tx, e.chunks())?;
                    (
                        "file",
                        *mode,
                        *mtime,
                        Some(*size),
                        None,
                        Some(manifest.as_bytes().to_vec()),
                        chunk.map(|c| c.as_bytes().to_vec()),
                    )
                }
                Node::Dir { mode, mtime } => ("dir", *mode, *mtime, None, None, None, None),
                Node::Symlink {
                    mode,
                    mtime,
                    target,
                } => (
                    "symlink",
                    *mode,
                    *mtime,
                    None,
                    Some(target.clone()),
                    None,
                    None,
                ),
                Node::Deleted => unreachable!("refused above"),
            };
            insert.execute(params![
                id,
                e.path.as_str(),
                parent,
                kind,
                mode,
                mtime,
                size,
                target,
                manifest,
                chunk
            ])?;
        }
        drop(insert);
        tx.commit()?;
        Ok(())
    }
}

/// A snapshot's rows in path order, as [`snapshot_row`] reads them.
const SNAPSHOT_ROWS: &str = "SELECT path, kind, mode, mtime, size, target, manifest, chunk
     FROM snapshot_entries WHERE snapshot = ?1 ORDER BY path";

/// One row of [`SNAPSHOT_ROWS`]: its path and node.
fn snapshot_row(r: &rusqlite::Row<'_>) -> Result<(SyncPath, Node), DofsError> {
    let path = SyncPath::new(r.get::<_, String>(0)?)?;
    let kind: String = r.get(1)?;
    let (mode, mtime): (u32, i64) = (r.get(2)?, r.get(3)?);
    let node = match kind.as_str() {
        "file" => Node::File {
            mode,
            mtime,
            size: r.get(4)?,
            manifest: hash_from_sql(r.get(6)?, 6)?,
            chunk: r
                .get::<_, Option<Vec<u8>>>(7)?
                .map(|b| hash_from_sql(b, 7))
                .transpose()?,
        },
        "dir" => Node::Dir { mode, mtime },
        _ => Node::Symlink {
            mode,
            mtime,
            target: r.get(5)?,
        },
    };
    Ok((path, node))
}

#[cfg(test)]
mod tests {
    use wsd_sync::Store;

    use super::*;
    use crate::test_util::{noise, p, put, store};

    #[test]
    fn a_snapshot_records_the_tree_and_a_second_one_of_an_unchanged_tree_is_all_shared() {
        let mut d = store();
        put(&mut d, "a/one", b"first");
        let big = noise(700 * 1024, 1);
        put(&mut d, "a/big", &big);
        d.symlink("one", &p("a/link")).unwrap();
        let s1 = d.create_snapshot("s1").unwrap();
        assert_eq!(s1.rev, d.current_rev().unwrap());
        assert_eq!((s1.files, s1.bytes), (2, 5 + big.len() as u64));
        assert_eq!(s1.new_bytes, s1.bytes, "the first snapshot holds it all");
        let s2 = d.create_snapshot("s2").unwrap();
        assert_eq!((s2.files, s2.bytes, s2.new_bytes), (s1.files, s1.bytes, 0));
        put(&mut d, "a/one", b"second");
        let s3 = d.create_snapshot("s3").unwrap();
        assert_eq!(s3.new_bytes, 6, "only the changed file's chunk is new");
        assert_eq!(d.snapshot_ids().unwrap(), ["s1", "s2", "s3"]);
        let s1_chunks = d.snapshot_chunks("s1").unwrap();
        assert_eq!(
            s1_chunks.len(),
            1 + wsd_sync::chunk::chunk_slice(&big).len()
        );
        assert!(s1_chunks.contains(&Hash::of(b"first")));
        let all = d.all_snapshot_chunks().unwrap();
        assert_eq!(all.len(), s1_chunks.len() + 1, "s3 adds `second`");
        assert!(all.contains(&Hash::of(b"second")));
        assert_eq!(d.create_snapshot("s1").unwrap_err().posix_name(), "EEXIST");
        d.check_integrity().unwrap();
    }

    /// The file's size once the store is closed (the close copies the
    /// whole WAL in), and the store opened again.
    fn closed_size(d: Dofs, path: &std::path::Path) -> (u64, Dofs) {
        drop(d);
        let size = std::fs::metadata(path).unwrap().len();
        (size, Dofs::open(path).unwrap())
    }

    #[test]
    fn a_second_snapshot_of_an_unchanged_tree_grows_the_file_by_under_one_percent() {
        let tmp = tempfile::tempdir().unwrap();
        let db = tmp.path().join("d.dofs");
        let mut d = Dofs::open(&db).unwrap();
        // Many commits past this build's checkpoint thresholds (1 MiB),
        // so background checkpoints run while the tree is written.
        let tree: u64 = (0..24u64)
            .map(|i| {
                let bytes = noise(512 * 1024, 100 + i);
                put(&mut d, &format!("d{}/f{i}", i % 4), &bytes);
                bytes.len() as u64
            })
            .sum();
        let first = d.create_snapshot("first").unwrap();
        assert_eq!(first.new_bytes, tree);
        let (before, mut d) = closed_size(d, &db);
        assert!(before > tree, "the tree is in the file: {before} bytes");
        let second = d.create_snapshot("second").unwrap();
        assert_eq!((second.bytes, second.new_bytes), (tree, 0));
        let (after, d) = closed_size(d, &db);
        let growth = after.saturating_sub(before);
        assert!(
            growth * 100 < tree,
            "the second snapshot grew the file by {growth} bytes (tree {tree})"
        );
        d.check_integrity().unwrap();
    }

    #[test]
    fn restore_brings_back_old_content_removes_newer_paths_at_one_rev() {
        let mut d = store();
        put(&mut d, "f", b"old");
        put(&mut d, "keep/x", b"same");
        let big = noise(600 * 1024, 2);
        put(&mut d, "big", &big);
        d.create_snapshot("s").unwrap();
        put(&mut d, "f", b"new");
        put(&mut d, "later/made", b"after");
        d.rm(&p("big"), false).unwrap();
        d.chmod(&p("keep/x"), 0o600).unwrap();
        let before = d.current_rev().unwrap();
        let out = d.restore_snapshot("s").unwrap();
        assert_eq!(out.rev, Some(before + 1));
        assert_eq!(
            (out.changed, out.removed),
            (3, 2),
            "f, big, keep/x; later, later/made"
        );
        assert_eq!(d.read_file(&p("f")).unwrap(), b"old");
        assert_eq!(d.read_file(&p("big")).unwrap(), big);
        assert_eq!(d.stat(&p("keep/x")).unwrap().mode, 0o644);
        assert!(!d.exists(&p("later")).unwrap());
        for path in ["f", "big", "keep/x", "later", "later/made"] {
            let rev = d.read_entry(&p(path)).unwrap().unwrap().rev;
            assert_eq!(rev, before + 1, "{path}");
        }
        assert!(d.read_entry(&p("keep")).unwrap().unwrap().rev < before);
        let again = d.restore_snapshot("s").unwrap();
        assert_eq!((again.rev, again.changed, again.removed), (None, 0, 0));
        d.check_integrity().unwrap();
    }

    #[test]
    fn diff_lists_added_removed_and_modified_paths() {
        let mut d = store();
        put(&mut d, "a", b"1");
        put(&mut d, "b", b"2");
        d.create_snapshot("s1").unwrap();
        put(&mut d, "b", b"changed");
        put(&mut d, "c", b"3");
        d.rm(&p("a"), false).unwrap();
        let want = vec![
            ("a".to_owned(), DiffKind::Removed),
            ("b".to_owned(), DiffKind::Modified),
            ("c".to_owned(), DiffKind::Added),
        ];
        assert_eq!(d.diff_snapshot("s1", None).unwrap(), want);
        d.create_snapshot("s2").unwrap();
        assert_eq!(d.diff_snapshot("s1", Some("s2")).unwrap(), want);
        assert!(d.diff_snapshot("s2", None).unwrap().is_empty());
        let err = d.diff_snapshot("nope", None).unwrap_err();
        assert_eq!(err.posix_name(), "ENOENT");
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn a_deleted_snapshot_is_no_root_and_a_kept_one_is() {
        let mut d = store();
        put(&mut d, "f", b"only the snapshot holds this");
        let big = noise(600 * 1024, 3);
        put(&mut d, "big", &big);
        d.create_snapshot("s").unwrap();
        put(&mut d, "f", b"new");
        d.rm(&p("big"), false).unwrap();
        d.collect_garbage().unwrap();
        d.check_integrity().unwrap();
        d.restore_snapshot("s").unwrap();
        assert_eq!(d.read_file(&p("big")).unwrap(), big, "kept by the snapshot");
        put(&mut d, "f", b"newer");
        d.rm(&p("big"), false).unwrap();
        d.delete_snapshot("s").unwrap();
        assert_eq!(d.delete_snapshot("s").unwrap_err().posix_name(), "ENOENT");
        let freed = d.collect_garbage().unwrap();
        assert!(freed.chunks > 1, "{freed:?}");
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_fork_copies_the_snapshot_tree_and_its_chunks() {
        let mut d = store();
        put(&mut d, "dir/f", b"shared");
        let big = noise(600 * 1024, 4);
        put(&mut d, "big", &big);
        d.symlink("dir/f", &p("link")).unwrap();
        d.create_snapshot("s").unwrap();
        put(&mut d, "dir/f", b"after the snapshot");
        let mut fork = store();
        assert!(fork.fork_from(&d, "s").unwrap().is_some());
        assert_eq!(fork.read_file(&p("dir/f")).unwrap(), b"shared");
        assert_eq!(fork.read_file(&p("big")).unwrap(), big);
        assert_eq!(fork.readlink(&p("link")).unwrap(), "dir/f");
        fork.check_integrity().unwrap();
        assert_eq!(
            fork.fork_from(&d, "s").unwrap_err().posix_name(),
            "EINVAL",
            "not into a non-empty store"
        );
    }
}
