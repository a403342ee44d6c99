//! The POSIX-like surface: every mutation is one transaction stamping one rev.
//!
//! Symlinks are never followed: they are stored and synced as opaque nodes,
//! and a path whose ancestor is a symlink is `ENOTDIR`, as if every call
//! carried `RESOLVE_NO_SYMLINKS`. That keeps a path-keyed store honest (one
//! row per path, no aliasing) and matches what sync needs.

use std::io::{Read, Write};

use rusqlite::params;
use wsd_sync::limits::MAX_SYMLINK_TARGET_BYTES;
use wsd_sync::{ChunkRef, Hash, Kind, MODE_MASK, SyncError, SyncPath, chunk};

use crate::rows::{
    self, Mutation, Node, ROW_COLUMNS, Row, ensure_manifest, get_row, has_live_children,
    insert_chunk, live, now_ms, put_node, row_from_sql, subtree_bounds, tombstone_subtree,
};
use crate::{Dofs, DofsError};

/// Mode of a file created without an explicit one.
pub const DEFAULT_FILE_MODE: u32 = 0o644;
/// Mode of a directory created by `mkdir` or implied as a parent.
pub const DEFAULT_DIR_MODE: u32 = 0o755;
/// Mode of every new symlink (as on Linux, where it is never consulted).
pub const DEFAULT_SYMLINK_MODE: u32 = 0o777;

/// Rows moved per statement page by `rename`, bounding its memory.
const RENAME_PAGE: usize = 512;

/// What `stat` reports about a live node.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Stat {
    pub kind: Kind,
    /// Permission bits, within [`MODE_MASK`].
    pub mode: u32,
    /// Milliseconds since the Unix epoch.
    pub mtime: i64,
    /// Bytes of content for a file, of the target for a symlink, 0 for a dir.
    pub size: u64,
    /// The rev of the last change to this path.
    pub rev: u64,
    /// A symlink's target.
    pub target: Option<String>,
    /// A file's manifest hash (its content identity).
    pub manifest: Option<Hash>,
}

impl Stat {
    fn from_node(rev: u64, node: Node) -> Option<Stat> {
        let base = |kind, mode, mtime| Stat {
            kind,
            mode,
            mtime,
            size: 0,
            rev,
            target: None,
            manifest: None,
        };
        Some(match node {
            Node::File { mode, mtime, size, manifest } => {
                Stat { size, manifest: Some(manifest), ..base(Kind::File, mode, mtime) }
            }
            Node::Dir { mode, mtime } => base(Kind::Dir, mode, mtime),
            Node::Symlink { mode, mtime, target } => Stat {
                size: target.len() as u64,
                target: Some(target),
                ..base(Kind::Symlink, mode, mtime)
            },
            Node::Deleted => return None,
        })
    }
}

/// One child of a directory.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct DirEntry {
    pub name: String,
    pub path: SyncPath,
    pub stat: Stat,
}

/// Options of [`Dofs::write_file_with`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct WriteOptions {
    /// Mode for the file; `None` keeps an existing file's mode or uses
    /// [`DEFAULT_FILE_MODE`]. Masked to [`MODE_MASK`].
    pub mode: Option<u32>,
    /// mtime in ms; `None` is now.
    pub mtime: Option<i64>,
    /// Create missing parent directories (as `mkdir -p`).
    pub create_parents: bool,
}

/// One literal match found by [`Dofs::search`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SearchHit {
    pub path: SyncPath,
    /// 1-based line of the match's first byte.
    pub line: u64,
    /// Byte offset of the match in the file.
    pub offset: u64,
}

fn check_target(path: &SyncPath, target: &str) -> Result<(), DofsError> {
    if target.is_empty() || target.contains('\0') {
        return Err(DofsError::invalid(path, "symlink target is empty or contains NUL"));
    }
    SyncError::check_limit("symlink target length (bytes)", MAX_SYMLINK_TARGET_BYTES, target.len())?;
    Ok(())
}

/// Requires every ancestor of `path` to be a live directory: the first
/// missing one is `ENOENT`, the first non-directory is `ENOTDIR`.
fn require_parent_dir(conn: &rusqlite::Connection, path: &SyncPath) -> Result<(), DofsError> {
    let Some(parent) = path.parent() else { return Ok(()) };
    // The invariant "every live path's parent is a live dir" means checking
    // the parent suffices when it exists; the walk only names the culprit.
    if let Some(row) = live(conn, parent.as_str())? {
        return match row.node {
            Node::Dir { .. } => Ok(()),
            _ => Err(DofsError::NotADirectory { path: parent.into_string() }),
        };
    }
    for anc in path.ancestors() {
        match live(conn, anc.as_str())? {
            Some(Row { node: Node::Dir { .. }, .. }) => {}
            Some(_) => return Err(DofsError::NotADirectory { path: anc.into_string() }),
            None => return Err(DofsError::not_found(anc)),
        }
    }
    Ok(())
}

/// `mkdir -p` of `path`'s ancestors: creates the missing ones, refuses a
/// non-directory in the way.
fn create_parents(m: &mut Mutation<'_>, path: &SyncPath, mtime: i64) -> Result<(), DofsError> {
    for anc in path.ancestors() {
        match live(m, anc.as_str())? {
            Some(Row { node: Node::Dir { .. }, .. }) => {}
            Some(_) => return Err(DofsError::NotADirectory { path: anc.into_string() }),
            None => {
                let rev = m.rev()?;
                put_node(m, &anc, rev, &Node::Dir { mode: DEFAULT_DIR_MODE, mtime }, None)?;
            }
        }
    }
    Ok(())
}

fn chunk_into_store(
    conn: &rusqlite::Connection,
    reader: impl Read,
) -> Result<Vec<ChunkRef>, DofsError> {
    Ok(chunk::chunk_reader(reader, |c, bytes| {
        insert_chunk(conn, &c.hash, bytes).map_err(SyncError::from)
    })?)
}

fn chunk_bytes(conn: &rusqlite::Connection, hash: &Hash) -> Result<Vec<u8>, DofsError> {
    let mut stmt = conn.prepare_cached("SELECT data FROM chunks WHERE hash = ?1")?;
    match stmt.query_row([hash.as_bytes()], |r| r.get(0)) {
        Ok(bytes) => Ok(bytes),
        Err(rusqlite::Error::QueryReturnedNoRows) => {
            Err(SyncError::UnknownHash { hash: *hash, path: None }.into())
        }
        Err(e) => Err(e.into()),
    }
}

impl Dofs {
    /// Writes a file from `content`, streaming: bytes are cut into chunks as
    /// they arrive and memory stays at about one read window.
    pub fn write_file(&mut self, path: &SyncPath, content: impl Read) -> Result<Stat, DofsError> {
        self.write_file_with(path, content, WriteOptions::default())
    }

    pub fn write_file_with(
        &mut self,
        path: &SyncPath,
        content: impl Read,
        opts: WriteOptions,
    ) -> Result<Stat, DofsError> {
        let mtime = opts.mtime.unwrap_or_else(now_ms);
        let mut m = Mutation::begin(&mut self.conn)?;
        let mode = match live(&m, path.as_str())?.map(|r| r.node) {
            Some(Node::Dir { .. }) => return Err(DofsError::IsADirectory { path: path.to_string() }),
            Some(Node::Symlink { .. }) => {
                return Err(DofsError::invalid(path, "is a symlink (dofs never follows symlinks)"));
            }
            Some(Node::File { mode, .. }) => opts.mode.unwrap_or(mode),
            _ => opts.mode.unwrap_or(DEFAULT_FILE_MODE),
        } & MODE_MASK;
        if opts.create_parents {
            create_parents(&mut m, path, mtime)?;
        } else {
            require_parent_dir(&m, path)?;
        }
        let chunks = chunk_into_store(&m, content)?;
        let node = file_node(&m, &chunks, mode, mtime)?;
        let rev = m.rev()?;
        put_node(&m, path, rev, &node, None)?;
        m.commit()?;
        Ok(Stat::from_node(rev, node).expect("live"))
    }

    /// Appends `content` to a file (creating it when missing). Only the last
    /// chunk is re-cut: content-defined cut points before it do not depend on
    /// what follows, so the result equals chunking the whole new content.
    pub fn append_file(&mut self, path: &SyncPath, content: impl Read) -> Result<Stat, DofsError> {
        let mtime = now_ms();
        let mut m = Mutation::begin(&mut self.conn)?;
        let (mode, mut chunks) = match live(&m, path.as_str())?.map(|r| r.node) {
            Some(Node::Dir { .. }) => return Err(DofsError::IsADirectory { path: path.to_string() }),
            Some(Node::Symlink { .. }) => {
                return Err(DofsError::invalid(path, "is a symlink (dofs never follows symlinks)"));
            }
            Some(Node::File { mode, manifest, .. }) => (mode, rows::manifest_chunks(&m, &manifest)?),
            _ => {
                require_parent_dir(&m, path)?;
                (DEFAULT_FILE_MODE, Vec::new())
            }
        };
        let tail = match chunks.pop() {
            Some(last) => chunk_bytes(&m, &last.hash)?,
            None => Vec::new(),
        };
        chunks.extend(chunk_into_store(&m, std::io::Cursor::new(tail).chain(content))?);
        let node = file_node(&m, &chunks, mode, mtime)?;
        let rev = m.rev()?;
        put_node(&m, path, rev, &node, None)?;
        m.commit()?;
        Ok(Stat::from_node(rev, node).expect("live"))
    }

    /// A file's whole content. See [`Dofs::read_file_to`] to stream it.
    pub fn read_file(&self, path: &SyncPath) -> Result<Vec<u8>, DofsError> {
        let mut out = Vec::new();
        self.read_file_to(path, &mut out)?;
        Ok(out)
    }

    /// Streams a file's content into `out` one chunk at a time; returns its size.
    pub fn read_file_to(&self, path: &SyncPath, out: &mut impl Write) -> Result<u64, DofsError> {
        let manifest = self.file_manifest(path)?;
        let mut stmt = self.conn.prepare_cached(
            "SELECT c.data FROM manifest_chunks mc JOIN chunks c ON c.hash = mc.chunk
             WHERE mc.manifest = ?1 ORDER BY mc.idx",
        )?;
        let mut rows = stmt.query([manifest.as_bytes()])?;
        let mut total = 0u64;
        while let Some(r) = rows.next()? {
            let bytes = r.get_ref(0)?.as_blob()?;
            out.write_all(bytes)
                .map_err(|e| SyncError::io(format!("writing the content of {path}"), e))?;
            total += bytes.len() as u64;
        }
        Ok(total)
    }

    fn file_manifest(&self, path: &SyncPath) -> Result<Hash, DofsError> {
        match live(&self.conn, path.as_str())?.map(|r| r.node) {
            Some(Node::File { manifest, .. }) => Ok(manifest),
            Some(Node::Dir { .. }) => Err(DofsError::IsADirectory { path: path.to_string() }),
            Some(_) => Err(DofsError::invalid(path, "is a symlink (dofs never follows symlinks)")),
            None => Err(DofsError::not_found(path)),
        }
    }

    /// Creates a directory; with `parents`, also its missing ancestors, and
    /// an existing directory is then not an error (and stamps no rev).
    pub fn mkdir(&mut self, path: &SyncPath, parents: bool) -> Result<(), DofsError> {
        let mtime = now_ms();
        let mut m = Mutation::begin(&mut self.conn)?;
        match live(&m, path.as_str())? {
            Some(Row { node: Node::Dir { .. }, .. }) if parents => return Ok(()),
            Some(_) => return Err(DofsError::AlreadyExists { path: path.to_string() }),
            None => {}
        }
        if parents {
            create_parents(&mut m, path, mtime)?;
        } else {
            require_parent_dir(&m, path)?;
        }
        let rev = m.rev()?;
        put_node(&m, path, rev, &Node::Dir { mode: DEFAULT_DIR_MODE, mtime }, None)?;
        m.commit()?;
        Ok(())
    }

    /// Removes a path; a non-empty directory needs `recursive`. Every removed
    /// path gets its own tombstone, all at one rev.
    pub fn rm(&mut self, path: &SyncPath, recursive: bool) -> Result<(), DofsError> {
        let mut m = Mutation::begin(&mut self.conn)?;
        let row = live(&m, path.as_str())?.ok_or_else(|| DofsError::not_found(path))?;
        if row.node.is_dir() && !recursive && has_live_children(&m, path.as_str())? {
            return Err(DofsError::NotEmpty { path: path.to_string() });
        }
        let rev = m.rev()?;
        tombstone_subtree(&m, path.as_str(), true, rev, None)?;
        m.commit()?;
        Ok(())
    }

    /// Moves `from` (and its subtree) to `to`. On the wire this is state, not
    /// an opcode: every moved path is restamped live at the new place and
    /// every old path gets a tombstone, all at one rev. A directory may
    /// replace an empty directory, a non-directory a non-directory.
    pub fn rename(&mut self, from: &SyncPath, to: &SyncPath) -> Result<(), DofsError> {
        let mut m = Mutation::begin(&mut self.conn)?;
        let src = live(&m, from.as_str())?.ok_or_else(|| DofsError::not_found(from))?;
        if from == to {
            return Ok(());
        }
        if to.starts_with(from) {
            return Err(DofsError::invalid(to, "cannot move a directory into itself"));
        }
        require_parent_dir(&m, to)?;
        match live(&m, to.as_str())?.map(|r| r.node) {
            Some(Node::Dir { .. }) if !src.node.is_dir() => {
                return Err(DofsError::IsADirectory { path: to.to_string() });
            }
            Some(Node::Dir { .. }) if has_live_children(&m, to.as_str())? => {
                return Err(DofsError::NotEmpty { path: to.to_string() });
            }
            Some(n) if n.is_live() && !n.is_dir() && src.node.is_dir() => {
                return Err(DofsError::NotADirectory { path: to.to_string() });
            }
            _ => {}
        }
        let rev = m.rev()?;
        put_node(&m, to, rev, &src.node, None)?;
        // `to` is not inside `from`, so the rows written below never fall in
        // the range being paged through.
        let (lo, hi) = subtree_bounds(from.as_str());
        let mut after = lo;
        loop {
            let page: Vec<Row> = {
                let mut stmt = m.prepare_cached(&format!(
                    "SELECT {ROW_COLUMNS} FROM entries
                     WHERE kind <> 'delete' AND path > ?1 AND path < ?2
                     ORDER BY path LIMIT ?3"
                ))?;
                stmt.query_map(params![after, hi, RENAME_PAGE as u64], row_from_sql)?
                    .collect::<Result<_, _>>()?
            };
            for row in &page {
                let suffix = &row.path[from.as_str().len()..];
                let new = SyncPath::new(format!("{to}{suffix}"))?;
                put_node(&m, &new, rev, &row.node, None)?;
            }
            match page.last() {
                Some(last) if page.len() == RENAME_PAGE => after = last.path.clone(),
                _ => break,
            }
        }
        tombstone_subtree(&m, from.as_str(), true, rev, None)?;
        m.commit()?;
        Ok(())
    }

    /// Creates a symlink at `path` pointing at `target` (stored verbatim).
    pub fn symlink(&mut self, target: &str, path: &SyncPath) -> Result<(), DofsError> {
        check_target(path, target)?;
        let mut m = Mutation::begin(&mut self.conn)?;
        if live(&m, path.as_str())?.is_some() {
            return Err(DofsError::AlreadyExists { path: path.to_string() });
        }
        require_parent_dir(&m, path)?;
        let rev = m.rev()?;
        let node =
            Node::Symlink { mode: DEFAULT_SYMLINK_MODE, mtime: now_ms(), target: target.to_owned() };
        put_node(&m, path, rev, &node, None)?;
        m.commit()?;
        Ok(())
    }

    pub fn readlink(&self, path: &SyncPath) -> Result<String, DofsError> {
        match live(&self.conn, path.as_str())?.map(|r| r.node) {
            Some(Node::Symlink { target, .. }) => Ok(target),
            Some(_) => Err(DofsError::invalid(path, "not a symlink")),
            None => Err(DofsError::not_found(path)),
        }
    }

    /// Sets the permission bits (masked to [`MODE_MASK`]) of the node itself;
    /// a symlink's own mode, not its target's. An unchanged mode stamps no rev.
    pub fn chmod(&mut self, path: &SyncPath, mode: u32) -> Result<(), DofsError> {
        let mode = mode & MODE_MASK;
        self.update_node(path, |node| match node {
            Node::File { mode: m, .. } | Node::Dir { mode: m, .. } | Node::Symlink { mode: m, .. } => {
                std::mem::replace(m, mode) != mode
            }
            Node::Deleted => false,
        })
    }

    /// Sets the mtime (ms since the epoch). An unchanged mtime stamps no rev.
    pub fn set_mtime(&mut self, path: &SyncPath, mtime: i64) -> Result<(), DofsError> {
        self.update_node(path, |node| match node {
            Node::File { mtime: t, .. } | Node::Dir { mtime: t, .. } | Node::Symlink { mtime: t, .. } => {
                std::mem::replace(t, mtime) != mtime
            }
            Node::Deleted => false,
        })
    }

    fn update_node(
        &mut self,
        path: &SyncPath,
        change: impl FnOnce(&mut Node) -> bool,
    ) -> Result<(), DofsError> {
        let mut m = Mutation::begin(&mut self.conn)?;
        let mut row = live(&m, path.as_str())?.ok_or_else(|| DofsError::not_found(path))?;
        if change(&mut row.node) {
            let rev = m.rev()?;
            put_node(&m, path, rev, &row.node, None)?;
            m.commit()?;
        }
        Ok(())
    }

    /// The live node at `path` (never following a symlink).
    pub fn stat(&self, path: &SyncPath) -> Result<Stat, DofsError> {
        let row = live(&self.conn, path.as_str())?.ok_or_else(|| DofsError::not_found(path))?;
        Ok(Stat::from_node(row.rev, row.node).expect("live"))
    }

    /// Whether a live node exists at `path`.
    pub fn exists(&self, path: &SyncPath) -> Result<bool, DofsError> {
        Ok(live(&self.conn, path.as_str())?.is_some())
    }

    /// The children of `dir` (`None` is the workspace root) in byte order of
    /// their names.
    pub fn readdir(&self, dir: Option<&SyncPath>) -> Result<Vec<DirEntry>, DofsError> {
        if let Some(dir) = dir {
            match get_row(&self.conn, dir.as_str())?.map(|r| r.node) {
                Some(Node::Dir { .. }) => {}
                Some(Node::Deleted) | None => return Err(DofsError::not_found(dir)),
                Some(_) => return Err(DofsError::NotADirectory { path: dir.to_string() }),
            }
        }
        let parent = dir.map(SyncPath::as_str).unwrap_or("");
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {ROW_COLUMNS} FROM entries WHERE parent = ?1 AND kind <> 'delete' ORDER BY path"
        ))?;
        let rows = stmt.query_map([parent], row_from_sql)?;
        let mut out = Vec::new();
        for row in rows {
            let row = row?;
            let path = SyncPath::new(row.path)?;
            let stat = Stat::from_node(row.rev, row.node).expect("live");
            out.push(DirEntry { name: path.file_name().to_owned(), path, stat });
        }
        Ok(out)
    }

    /// Literal search for `pattern` in every file under `under` (`None`: the
    /// whole tree), in path order, reading one chunk at a time. Stops after
    /// `limit` hits.
    pub fn search(
        &self,
        pattern: &[u8],
        under: Option<&SyncPath>,
        limit: usize,
    ) -> Result<Vec<SearchHit>, DofsError> {
        if pattern.is_empty() {
            return Err(DofsError::invalid(under.map_or("", |p| p.as_str()), "empty search pattern"));
        }
        let finder = memchr::memmem::Finder::new(pattern);
        let mut hits = Vec::new();
        let root = under.map(|p| p.as_str().to_owned());
        let (lo, hi) = subtree_bounds(root.as_deref().unwrap_or(""));
        // Snapshot the file list first: each file is then scanned with its
        // own chunk query, and the list itself is only paths and hashes.
        let files: Vec<(String, Hash)> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT path, manifest FROM entries
                 WHERE kind = 'file'
                   AND (?3 IS NULL OR path = ?3 OR (path >= ?1 AND path < ?2)) ORDER BY path",
            )?;
            stmt.query_map(params![lo, hi, root], |r| {
                Ok((r.get(0)?, rows::hash_from_sql(r.get(1)?, 1)?))
            })?
            .collect::<Result<_, _>>()?
        };
        for (path, manifest) in files {
            if hits.len() >= limit {
                break;
            }
            let path = SyncPath::new(path)?;
            self.search_file(&finder, &path, &manifest, limit, &mut hits)?;
        }
        Ok(hits)
    }

    fn search_file(
        &self,
        finder: &memchr::memmem::Finder<'_>,
        path: &SyncPath,
        manifest: &Hash,
        limit: usize,
        hits: &mut Vec<SearchHit>,
    ) -> Result<(), DofsError> {
        let keep = finder.needle().len() - 1;
        let mut stmt = self.conn.prepare_cached(
            "SELECT c.data FROM manifest_chunks mc JOIN chunks c ON c.hash = mc.chunk
             WHERE mc.manifest = ?1 ORDER BY mc.idx",
        )?;
        let mut rows = stmt.query([manifest.as_bytes()])?;
        // `window` = the last `keep` bytes already scanned (so a match across
        // a chunk boundary is seen) followed by the new chunk. `lines` counts
        // newlines before `window_start`.
        let mut window: Vec<u8> = Vec::new();
        let mut window_start = 0u64;
        let mut lines = 0u64;
        while let Some(r) = rows.next()? {
            window.extend_from_slice(r.get_ref(0)?.as_blob()?);
            let mut counted_to = 0usize;
            let mut line = lines;
            for pos in finder.find_iter(&window) {
                line += memchr::memchr_iter(b'\n', &window[counted_to..pos]).count() as u64;
                counted_to = pos;
                hits.push(SearchHit {
                    path: path.clone(),
                    line: line + 1,
                    offset: window_start + pos as u64,
                });
                if hits.len() >= limit {
                    return Ok(());
                }
            }
            let cut = window.len().saturating_sub(keep);
            lines += memchr::memchr_iter(b'\n', &window[..cut]).count() as u64;
            window.drain(..cut);
            window_start += cut as u64;
        }
        Ok(())
    }
}

/// The file node for `chunks`, recording its manifest.
fn file_node(
    conn: &rusqlite::Connection,
    chunks: &[ChunkRef],
    mode: u32,
    mtime: i64,
) -> Result<Node, DofsError> {
    let manifest = ensure_manifest(conn, chunks)?;
    let size = chunks.iter().map(|c| u64::from(c.size)).sum();
    Ok(Node::File { mode, mtime, size, manifest })
}
