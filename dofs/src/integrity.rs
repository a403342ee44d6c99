//! A full consistency check of the invariants listed in `DESIGN.md`. It
//! reads everything (and re-hashes every chunk), so it is for tests, `fsck`
//! style tooling and after a crash, not for the hot path.

use wsd_sync::{ChunkRef, Hash, SyncPath, manifest};

use crate::chunk_store::slot_from_columns;
use crate::rows::{self, hash_from_sql};
use crate::{Dofs, DofsError};

impl Dofs {
    /// Checks every invariant; `DofsError::Corrupt` lists each violation.
    pub fn check_integrity(&self) -> Result<(), DofsError> {
        let mut problems = Vec::new();
        let conn = &self.conn;

        let mut stmt = conn.prepare("PRAGMA integrity_check")?;
        let lines: Vec<String> = stmt
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        if lines != ["ok"] {
            problems.extend(
                lines
                    .into_iter()
                    .map(|l| format!("sqlite integrity_check: {l}")),
            );
        }
        let mut stmt = conn.prepare("PRAGMA foreign_key_check")?;
        let fk: Vec<(String, String)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        for (table, parent) in fk {
            problems.push(format!(
                "a row of {table} references a missing {parent} row"
            ));
        }

        // Chunks: the bytes are what the hash says; a stub's chunk is in
        // the object store where the row says (its pack range, or its own
        // object).
        let mut stmt = conn.prepare("SELECT hash, size, data, pack, pack_offset FROM chunks")?;
        let mut rows = stmt.query([])?;
        let mut stubs = Vec::new();
        while let Some(r) = rows.next()? {
            let hash = hash_from_sql(r.get(0)?, 0)?;
            let size: u64 = r.get(1)?;
            let data = r.get_ref(2)?.as_blob()?;
            if data.is_empty() && size > 0 {
                stubs.push((hash, slot_from_columns(r, 1, 3)?));
                continue;
            }
            if data.len() as u64 != size {
                problems.push(format!(
                    "chunk {hash}: {} bytes stored, size says {size}",
                    data.len()
                ));
            }
            if Hash::of(data) != hash {
                problems.push(format!("chunk {hash}: bytes do not hash to its name"));
            }
        }

        match &self.objects {
            Some(objects) => {
                let missing: std::collections::HashSet<Hash> =
                    objects.missing_placed(&stubs)?.into_iter().collect();
                for (hash, slot) in stubs.iter().filter(|(h, _)| missing.contains(h)) {
                    problems.push(match slot {
                        Some(slot) => format!(
                            "chunk {hash}: indexed in pack {} at {}, which the object store lacks",
                            slot.pack, slot.offset
                        ),
                        None => {
                            format!("chunk {hash}: indexed as in the object store, which lacks it")
                        }
                    });
                }
            }
            None => {
                if let Some((hash, _)) = stubs.first() {
                    problems.push(format!(
                        "chunk {hash} (and {} more) kept in an object store this store was opened without",
                        stubs.len() - 1
                    ));
                }
            }
        }

        // Manifests: their chunk list is contiguous, sized and named right.
        let mut stmt = conn.prepare("SELECT hash, size, chunk_count FROM manifests")?;
        let manifests: Vec<(Hash, u64, u64)> = stmt
            .query_map([], |r| {
                Ok((hash_from_sql(r.get(0)?, 0)?, r.get(1)?, r.get(2)?))
            })?
            .collect::<Result<_, _>>()?;
        let mut idx_stmt = conn.prepare(
            "SELECT mc.idx, mc.chunk, mc.size, c.size FROM manifest_chunks mc
             LEFT JOIN chunks c ON c.hash = mc.chunk WHERE mc.manifest = ?1 ORDER BY mc.idx",
        )?;
        for (hash, size, count) in manifests {
            let mut chunks = Vec::new();
            let mut rows = idx_stmt.query([hash.as_bytes()])?;
            while let Some(r) = rows.next()? {
                let idx: u64 = r.get(0)?;
                let c = ChunkRef {
                    hash: hash_from_sql(r.get(1)?, 1)?,
                    size: r.get(2)?,
                };
                let held: Option<u64> = r.get(3)?;
                if idx != chunks.len() as u64 {
                    problems.push(format!(
                        "manifest {hash}: chunk index {idx} out of sequence"
                    ));
                }
                match held {
                    None => problems.push(format!("manifest {hash}: chunk {} is not held", c.hash)),
                    Some(s) if s != u64::from(c.size) => problems.push(format!(
                        "manifest {hash}: chunk {} listed as {} bytes, holds {s}",
                        c.hash, c.size
                    )),
                    Some(_) => {}
                }
                chunks.push(c);
            }
            let total: u64 = chunks.iter().map(|c| u64::from(c.size)).sum();
            if total != size || chunks.len() as u64 != count {
                problems.push(format!(
                    "manifest {hash}: records {size} bytes in {count} chunks, lists {total} in {}",
                    chunks.len()
                ));
            }
            if manifest::hash(&chunks) != hash {
                problems.push(format!(
                    "manifest {hash}: its chunk list hashes differently"
                ));
            }
        }

        // Entries: canonical paths, consistent parents, sizes, revs.
        let counter = rows::current_rev(conn)?;
        let horizon = rows::meta(conn, "prune_horizon")?;
        if horizon > counter {
            problems.push(format!(
                "prune horizon {horizon} is beyond the rev counter {counter}"
            ));
        }
        let mut stmt = conn.prepare(
            "SELECT e.path, e.parent, e.rev, e.kind, e.size, m.size, e.manifest, e.chunk,
                    c.size, m.chunk_count
             FROM entries e
             LEFT JOIN manifests m ON m.hash = e.manifest AND e.chunk IS NULL
             LEFT JOIN chunks c ON c.hash = e.chunk",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let path: String = r.get(0)?;
            let parent: String = r.get(1)?;
            let rev: u64 = r.get(2)?;
            let kind: String = r.get(3)?;
            let size: Option<u64> = r.get(4)?;
            let manifest_size: Option<u64> = r.get(5)?;
            match SyncPath::new(path.clone()) {
                Ok(p) => {
                    let expect = p.parent().map(SyncPath::into_string).unwrap_or_default();
                    if parent != expect {
                        problems.push(format!("{path}: parent column says {parent:?}"));
                    }
                }
                Err(e) => problems.push(format!("{path:?}: not canonical: {e}")),
            }
            if rev > counter {
                problems.push(format!(
                    "{path}: rev {rev} is beyond the rev counter {counter}"
                ));
            }
            let chunk: Option<Vec<u8>> = r.get(7)?;
            match (kind.as_str(), chunk) {
                ("file", Some(chunk)) => {
                    let chunk = hash_from_sql(chunk, 7)?;
                    let manifest = hash_from_sql(r.get(6)?, 6)?;
                    let held: Option<u64> = r.get(8)?;
                    let size = size.unwrap_or(0);
                    match held {
                        None => problems.push(format!("{path}: chunk {chunk} is not held")),
                        Some(s) if s != size => problems.push(format!(
                            "{path}: size {size} differs from its chunk {chunk}, which holds {s}"
                        )),
                        Some(_) => {}
                    }
                    let list = [ChunkRef {
                        hash: chunk,
                        size: u32::try_from(size).unwrap_or(u32::MAX),
                    }];
                    if manifest::hash(&list) != manifest {
                        problems.push(format!(
                            "{path}: manifest hash differs from its one chunk's list"
                        ));
                    }
                }
                ("file", None) => {
                    if size != manifest_size {
                        problems.push(format!(
                            "{path}: size {size:?} differs from its manifest's {manifest_size:?}"
                        ));
                    }
                    let count: Option<u64> = r.get(9)?;
                    if count == Some(1) {
                        problems.push(format!(
                            "{path}: a one-chunk file goes through a manifest row"
                        ));
                    }
                }
                _ => {}
            }
            if kind == "delete" && rev <= horizon {
                problems.push(format!(
                    "{path}: tombstone at rev {rev} survived pruning to {horizon}"
                ));
            }
        }
        let mut stmt = conn.prepare(
            "SELECT c.path, p.kind FROM entries c LEFT JOIN entries p ON p.path = c.parent
             WHERE c.kind <> 'delete' AND c.parent <> '' AND (p.kind IS NULL OR p.kind <> 'dir')",
        )?;
        let orphans: Vec<(String, Option<String>)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        for (path, parent_kind) in orphans {
            problems.push(format!(
                "{path}: parent is {}",
                parent_kind.map_or("missing".to_owned(), |k| format!("a {k}, not a live dir"))
            ));
        }
        // Snapshots: every file they name has its chunk or its list held.
        let mut stmt = conn.prepare(
            "SELECT s.snapshot, s.path, s.chunk FROM snapshot_entries s
               LEFT JOIN chunks c ON c.hash = s.chunk
               LEFT JOIN manifests m ON m.hash = s.manifest
              WHERE s.kind = 'file'
                AND ((s.chunk IS NOT NULL AND c.hash IS NULL)
                  OR (s.chunk IS NULL AND m.hash IS NULL))",
        )?;
        let missing: Vec<(String, String, Option<Vec<u8>>)> = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?;
        for (snapshot, path, chunk) in missing {
            let what = match chunk {
                Some(c) => format!("chunk {}", hash_from_sql(c, 2)?),
                None => "manifest".to_owned(),
            };
            problems.push(format!(
                "snapshot {snapshot}: {path}: its {what} is not held"
            ));
        }
        let mut stmt = conn.prepare("SELECT name, push_rev FROM remotes WHERE push_rev > ?1")?;
        let ahead: Vec<(String, u64)> = stmt
            .query_map([counter], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        for (name, rev) in ahead {
            problems.push(format!(
                "remote {name}: push cursor rev {rev} is beyond the rev counter {counter}"
            ));
        }

        if problems.is_empty() {
            Ok(())
        } else {
            Err(DofsError::Corrupt { problems })
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::DofsError;
    use crate::test_util::{put, store};

    fn problems(d: &crate::Dofs) -> Vec<String> {
        match d.check_integrity() {
            Ok(()) => Vec::new(),
            Err(DofsError::Corrupt { problems }) => problems,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn a_healthy_store_passes() {
        let mut d = store();
        put(&mut d, "a/b", b"x");
        assert_eq!(problems(&d), Vec::<String>::new());
    }

    #[test]
    fn corrupted_chunk_bytes_are_reported() {
        let mut d = store();
        put(&mut d, "f", b"original");
        d.conn
            .execute(
                "UPDATE chunks SET data = X'6F726967696E616C21', size = 9",
                [],
            )
            .unwrap();
        let found = problems(&d);
        assert!(
            found.iter().any(|p| p.contains("do not hash to its name")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|p| p.contains("8") && p.contains("holds 9")),
            "{found:?}"
        );
    }

    #[test]
    fn a_wrong_file_size_an_orphan_and_a_rev_beyond_the_counter_are_reported() {
        let mut d = store();
        put(&mut d, "d/f", b"1234");
        d.conn
            .execute("UPDATE entries SET size = 3 WHERE path = 'd/f'", [])
            .unwrap();
        d.conn
            .execute("DELETE FROM entries WHERE path = 'd'", [])
            .unwrap();
        d.conn
            .execute("UPDATE entries SET rev = 99 WHERE path = 'd/f'", [])
            .unwrap();
        let found = problems(&d);
        assert!(
            found.iter().any(|p| p.starts_with("d/f: size")),
            "{found:?}"
        );
        assert!(
            found.iter().any(|p| p == "d/f: parent is missing"),
            "{found:?}"
        );
        assert!(
            found.iter().any(|p| p.contains("rev 99 is beyond")),
            "{found:?}"
        );
    }
}
