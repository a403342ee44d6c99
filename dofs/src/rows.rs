//! The `entries` row model and the few statements every mutation is built
//! from, plus [`Mutation`], the transaction that stamps at most one rev.

use std::ops::Deref;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use wsd_sync::{ChangeCursor, ChangeEntry, ChunkRef, EntryState, Hash, Kind, SyncPath, manifest};

use crate::DofsError;
use crate::chunk_store::{ChunkStore, Chunks};

/// The state a row records for its path.
#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum Node {
    File {
        mode: u32,
        mtime: i64,
        size: u64,
        manifest: Hash,
        /// The one chunk of a single-chunk file, named in the row itself
        /// (no `manifests` row); `None` for empty and multi-chunk files.
        chunk: Option<Hash>,
    },
    Dir {
        mode: u32,
        mtime: i64,
    },
    Symlink {
        mode: u32,
        mtime: i64,
        target: String,
    },
    /// A tombstone.
    Deleted,
}

impl Node {
    pub(crate) fn kind(&self) -> Option<Kind> {
        match self {
            Node::File { .. } => Some(Kind::File),
            Node::Dir { .. } => Some(Kind::Dir),
            Node::Symlink { .. } => Some(Kind::Symlink),
            Node::Deleted => None,
        }
    }

    pub(crate) fn is_live(&self) -> bool {
        !matches!(self, Node::Deleted)
    }

    pub(crate) fn is_dir(&self) -> bool {
        matches!(self, Node::Dir { .. })
    }

    fn kind_str(&self) -> &'static str {
        match self {
            Node::File { .. } => "file",
            Node::Dir { .. } => "dir",
            Node::Symlink { .. } => "symlink",
            Node::Deleted => "delete",
        }
    }

    /// The row state for an incoming live entry whose chunks are `manifest`.
    pub(crate) fn from_state(state: &EntryState) -> Node {
        match state {
            EntryState::File {
                mode,
                mtime,
                size,
                chunks,
            } => Node::File {
                mode: *mode,
                mtime: *mtime,
                size: *size,
                manifest: manifest::hash(chunks),
                chunk: single_chunk(chunks),
            },
            EntryState::Dir { mode, mtime } => Node::Dir {
                mode: *mode,
                mtime: *mtime,
            },
            EntryState::Symlink {
                target,
                mode,
                mtime,
            } => Node::Symlink {
                mode: *mode,
                mtime: *mtime,
                target: target.clone(),
            },
            EntryState::Delete => Node::Deleted,
        }
    }

    /// Rule 4's comparison: kind, mode, content (manifest hash, which is
    /// canonical for a chunk list) and target; never mtime.
    pub(crate) fn same_content(&self, other: &Node) -> bool {
        match (self, other) {
            (
                Node::File {
                    mode: m1,
                    manifest: h1,
                    ..
                },
                Node::File {
                    mode: m2,
                    manifest: h2,
                    ..
                },
            ) => m1 == m2 && h1 == h2,
            (Node::Dir { mode: m1, .. }, Node::Dir { mode: m2, .. }) => m1 == m2,
            (
                Node::Symlink {
                    mode: m1,
                    target: t1,
                    ..
                },
                Node::Symlink {
                    mode: m2,
                    target: t2,
                    ..
                },
            ) => m1 == m2 && t1 == t2,
            (Node::Deleted, Node::Deleted) => true,
            _ => false,
        }
    }
}

/// One `entries` row.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub path: String,
    pub rev: u64,
    pub node: Node,
    pub applied_from: Option<String>,
}

pub(crate) const ROW_COLUMNS: &str =
    "path, rev, kind, mode, mtime, size, target, manifest, applied_from, chunk";

pub(crate) use crate::sql::{conversion_error, hash_from_sql, now_ms};

/// Reads a row selected with [`ROW_COLUMNS`].
pub(crate) fn row_from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let kind: String = r.get(2)?;
    let node = match kind.as_str() {
        "file" => Node::File {
            mode: r.get(3)?,
            mtime: r.get(4)?,
            size: r.get(5)?,
            manifest: hash_from_sql(r.get(7)?, 7)?,
            chunk: r
                .get::<_, Option<Vec<u8>>>(9)?
                .map(|b| hash_from_sql(b, 9))
                .transpose()?,
        },
        "dir" => Node::Dir {
            mode: r.get(3)?,
            mtime: r.get(4)?,
        },
        "symlink" => Node::Symlink {
            mode: r.get(3)?,
            mtime: r.get(4)?,
            target: r.get(6)?,
        },
        "delete" => Node::Deleted,
        other => return Err(conversion_error(2, format!("unknown kind {other:?}"))),
    };
    Ok(Row {
        path: r.get(0)?,
        rev: r.get(1)?,
        node,
        applied_from: r.get(8)?,
    })
}

/// The row at `path`, live or tombstone.
pub(crate) fn get_row(conn: &Connection, path: &str) -> Result<Option<Row>, DofsError> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {ROW_COLUMNS} FROM entries WHERE path = ?1"
    ))?;
    Ok(stmt.query_row([path], row_from_sql).optional()?)
}

/// The live node at `path`, if any.
pub(crate) fn live(conn: &Connection, path: &str) -> Result<Option<Row>, DofsError> {
    Ok(get_row(conn, path)?.filter(|r| r.node.is_live()))
}

/// `mode, mtime, size, target, manifest, chunk` as bound for a node.
type NodeColumns<'a> = (
    Option<u32>,
    Option<i64>,
    Option<u64>,
    Option<&'a str>,
    Option<&'a [u8]>,
    Option<&'a [u8]>,
);

/// Writes `node` at `path` stamped `rev`, replacing whatever row was there.
pub(crate) fn put_node(
    conn: &Connection,
    path: &SyncPath,
    rev: u64,
    node: &Node,
    applied_from: Option<&str>,
) -> Result<(), DofsError> {
    let parent = path.parent().map(SyncPath::into_string).unwrap_or_default();
    let (mode, mtime, size, target, manifest, chunk): NodeColumns<'_> = match node {
        Node::File {
            mode,
            mtime,
            size,
            manifest,
            chunk,
        } => (
            Some(*mode),
            Some(*mtime),
            Some(*size),
            None,
            Some(manifest.as_bytes()),
            chunk.as_ref().map(|c| &c.as_bytes()[..]),
        ),
        Node::Dir { mode, mtime } => (Some(*mode), Some(*mtime), None, None, None, None),
        Node::Symlink {
            mode,
            mtime,
            target,
        } => (
            Some(*mode),
            Some(*mtime),
            None,
            Some(target.as_str()),
            None,
            None,
        ),
        Node::Deleted => (None, None, None, None, None, None),
    };
    let mut stmt = conn.prepare_cached(
        "INSERT INTO entries (path, parent, rev, kind, mode, mtime, size, target, manifest, applied_from, chunk)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
         ON CONFLICT (path) DO UPDATE SET
            rev = excluded.rev, kind = excluded.kind, mode = excluded.mode,
            mtime = excluded.mtime, size = excluded.size, target = excluded.target,
            manifest = excluded.manifest, applied_from = excluded.applied_from,
            chunk = excluded.chunk",
    )?;
    stmt.execute(params![
        path.as_str(),
        parent,
        rev,
        node.kind_str(),
        mode,
        mtime,
        size,
        target,
        manifest,
        applied_from,
        chunk
    ])?;
    Ok(())
}

/// The half-open key range `[path/, path0)` holding exactly the strict
/// descendants of `path` in byte order ('0' is the byte after '/').
pub(crate) fn subtree_bounds(path: &str) -> (String, String) {
    (format!("{path}/"), format!("{path}0"))
}

/// Turns every live row in `path`'s subtree (and `path` itself when
/// `include_self`) into a tombstone stamped `rev`. Returns how many.
pub(crate) fn tombstone_subtree(
    conn: &Connection,
    path: &str,
    include_self: bool,
    rev: u64,
    applied_from: Option<&str>,
) -> Result<usize, DofsError> {
    let (lo, hi) = subtree_bounds(path);
    let mut stmt = conn.prepare_cached(
        "UPDATE entries SET kind = 'delete', rev = ?4, mode = NULL, mtime = NULL, size = NULL,
                target = NULL, manifest = NULL, chunk = NULL, applied_from = ?5
         WHERE kind <> 'delete'
           AND ((?6 AND path = ?1) OR (path >= ?2 AND path < ?3))",
    )?;
    Ok(stmt.execute(params![path, lo, hi, rev, applied_from, include_self])?)
}

/// Whether `dir` has any live child.
pub(crate) fn has_live_children(conn: &Connection, dir: &str) -> Result<bool, DofsError> {
    let mut stmt = conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM entries WHERE parent = ?1 AND kind <> 'delete')",
    )?;
    Ok(stmt.query_row([dir], |r| r.get(0))?)
}

/// The latest committed rev.
pub(crate) fn current_rev(conn: &Connection) -> Result<u64, DofsError> {
    meta(conn, "rev")
}

pub(crate) fn meta(conn: &Connection, key: &str) -> Result<u64, DofsError> {
    let mut stmt = conn.prepare_cached("SELECT value FROM meta WHERE key = ?1")?;
    Ok(stmt.query_row([key], |r| r.get(0))?)
}

pub(crate) fn set_meta(conn: &Connection, key: &str, value: u64) -> Result<(), DofsError> {
    conn.prepare_cached("UPDATE meta SET value = ?2 WHERE key = ?1")?
        .execute(params![key, value])?;
    Ok(())
}

/// The ordered chunk list of a file row's content.
pub(crate) fn file_chunks(
    conn: &Connection,
    manifest: &Hash,
    chunk: Option<&Hash>,
    size: u64,
) -> Result<Vec<ChunkRef>, DofsError> {
    match chunk {
        // A single chunk is at most `MAX_CHUNK` bytes, well inside u32.
        Some(hash) => Ok(vec![ChunkRef {
            hash: *hash,
            size: size as u32,
        }]),
        None => manifest_chunks(conn, manifest),
    }
}

/// The ordered chunk list of a recorded manifest.
pub(crate) fn manifest_chunks(conn: &Connection, hash: &Hash) -> Result<Vec<ChunkRef>, DofsError> {
    let mut stmt = conn.prepare_cached(
        "SELECT chunk, size FROM manifest_chunks WHERE manifest = ?1 ORDER BY idx",
    )?;
    let rows = stmt.query_map([hash.as_bytes()], |r| {
        Ok(ChunkRef {
            hash: hash_from_sql(r.get(0)?, 0)?,
            size: r.get(1)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// The chunk a file row names directly: its only one, if it has exactly one.
pub(crate) fn single_chunk(chunks: &[ChunkRef]) -> Option<Hash> {
    match chunks {
        [only] => Some(only.hash),
        _ => None,
    }
}

/// Records the chunk list under its manifest hash (once per distinct list)
/// and returns that hash. A one-chunk list is not recorded: the file row
/// names its chunk itself ([`single_chunk`]), which spares a small write
/// the three hash-keyed B-trees of the manifest tables. Every chunk must
/// already be held; the foreign key enforces it for recorded lists.
pub(crate) fn ensure_manifest(conn: &Connection, chunks: &[ChunkRef]) -> Result<Hash, DofsError> {
    let hash = manifest::hash(chunks);
    if single_chunk(chunks).is_some() {
        return Ok(hash);
    }
    let size: u64 = chunks.iter().map(|c| u64::from(c.size)).sum();
    let inserted = conn
        .prepare_cached(
            "INSERT INTO manifests (hash, size, chunk_count) VALUES (?1, ?2, ?3)
             ON CONFLICT (hash) DO NOTHING",
        )?
        .execute(params![hash.as_bytes(), size, chunks.len() as u64])?;
    if inserted == 1 {
        let mut stmt = conn.prepare_cached(
            "INSERT INTO manifest_chunks (manifest, idx, chunk, size) VALUES (?1, ?2, ?3, ?4)",
        )?;
        for (idx, c) in chunks.iter().enumerate() {
            stmt.execute(params![
                hash.as_bytes(),
                idx as u64,
                c.hash.as_bytes(),
                c.size
            ])?;
        }
    }
    Ok(hash)
}

/// Builds the wire entry for a row from its current state.
pub(crate) fn to_entry(conn: &Connection, row: Row) -> Result<ChangeEntry, DofsError> {
    let path = SyncPath::new(row.path)?;
    let state = match row.node {
        Node::File {
            mode,
            mtime,
            size,
            manifest,
            chunk,
        } => EntryState::File {
            mode,
            mtime,
            size,
            chunks: file_chunks(conn, &manifest, chunk.as_ref(), size)?,
        },
        Node::Dir { mode, mtime } => EntryState::Dir { mode, mtime },
        Node::Symlink {
            mode,
            mtime,
            target,
        } => EntryState::Symlink {
            target,
            mode,
            mtime,
        },
        Node::Deleted => EntryState::Delete,
    };
    Ok(ChangeEntry {
        rev: row.rev,
        path,
        state,
    })
}

/// Reads a stored cursor from its rev and optional path columns.
pub(crate) fn cursor_from(rev: u64, path: Option<String>) -> Result<ChangeCursor, DofsError> {
    Ok(ChangeCursor {
        rev,
        path: path.map(SyncPath::new).transpose()?,
    })
}

/// One mutating transaction. The rev is allocated on first use, so a
/// mutation that turns out to change nothing (e.g. `mkdir -p` of an existing
/// directory) commits without burning one, and a rollback (drop without
/// [`Mutation::commit`]) leaves the counter where it was.
pub(crate) struct Mutation<'c> {
    tx: Transaction<'c>,
    rev: Option<u64>,
    objects: Option<&'c (dyn ChunkStore + Send + Sync)>,
}

impl<'c> Mutation<'c> {
    /// A transaction on `conn`, whose chunks go to `objects` when set.
    pub(crate) fn begin(
        conn: &'c mut Connection,
        objects: Option<&'c (dyn ChunkStore + Send + Sync)>,
    ) -> Result<Mutation<'c>, DofsError> {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        Ok(Mutation {
            tx,
            rev: None,
            objects,
        })
    }

    /// The chunks this mutation stores and reads.
    pub(crate) fn chunks(&self) -> Chunks<'_> {
        Chunks::new(&self.tx, self.objects)
    }

    /// The rev every change of this mutation is stamped with.
    pub(crate) fn rev(&mut self) -> Result<u64, DofsError> {
        if let Some(rev) = self.rev {
            return Ok(rev);
        }
        // Cached: every mutation runs it, and re-preparing it each time was
        // a visible slice of a small write.
        let rev: u64 = self
            .tx
            .prepare_cached("UPDATE meta SET value = value + 1 WHERE key = 'rev' RETURNING value")?
            .query_row([], |r| r.get(0))?;
        self.rev = Some(rev);
        Ok(rev)
    }

    /// Whether a rev has been stamped (something changed).
    pub(crate) fn stamped(&self) -> Option<u64> {
        self.rev
    }

    pub(crate) fn commit(self) -> Result<Option<u64>, DofsError> {
        self.tx.commit()?;
        Ok(self.rev)
    }
}

impl Deref for Mutation<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.tx
    }
}
