//! The POSIX-like surface: every mutation is one transaction stamping one rev.
//!
//! Symlinks are never followed: they are stored and synced as opaque nodes,
//! and a path whose ancestor is a symlink is `ENOTDIR`, as if every call
//! carried `RESOLVE_NO_SYMLINKS`. That keeps a path-keyed store honest (one
//! row per path, no aliasing) and matches what sync needs.

mod lines;

use std::io::{Read, Write};
use std::ops::ControlFlow;

use rusqlite::params;
use wsd_sync::limits::MAX_SYMLINK_TARGET_BYTES;
use wsd_sync::{ChunkRef, Hash, Kind, MODE_MASK, SyncError, SyncPath, chunk};

use crate::chunk_store::{ChunkSink, ChunkStore};
use crate::rows::{
    self, Mutation, Node, ROW_COLUMNS, Row, ensure_manifest, get_row, has_live_children, live,
    now_ms, put_node, row_from_sql, subtree_bounds, tombstone_subtree,
};
use crate::{Dofs, DofsError};

pub use lines::LineWindow;

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
            Node::File {
                mode,
                mtime,
                size,
                manifest,
                ..
            } => Stat {
                size,
                manifest: Some(manifest),
                ..base(Kind::File, mode, mtime)
            },
            Node::Dir { mode, mtime } => base(Kind::Dir, mode, mtime),
            Node::Symlink {
                mode,
                mtime,
                target,
            } => Stat {
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
        return Err(DofsError::invalid(
            path,
            "symlink target is empty or contains NUL",
        ));
    }
    SyncError::check_limit(
        "symlink target length (bytes)",
        MAX_SYMLINK_TARGET_BYTES,
        target.len(),
    )?;
    Ok(())
}

/// Requires every ancestor of `path` to be a live directory: the first
/// missing one is `ENOENT`, the first non-directory is `ENOTDIR`.
fn require_parent_dir(conn: &rusqlite::Connection, path: &SyncPath) -> Result<(), DofsError> {
    let Some(parent) = path.parent() else {
        return Ok(());
    };
    // The invariant "every live path's parent is a live dir" means checking
    // the parent suffices when it exists; the walk only names the culprit.
    if let Some(row) = live(conn, parent.as_str())? {
        return match row.node {
            Node::Dir { .. } => Ok(()),
            _ => Err(DofsError::NotADirectory {
                path: parent.into_string(),
            }),
        };
    }
    for anc in path.ancestors() {
        match live(conn, anc.as_str())? {
            Some(Row {
                node: Node::Dir { .. },
                ..
            }) => {}
            Some(_) => {
                return Err(DofsError::NotADirectory {
                    path: anc.into_string(),
                });
            }
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
            Some(Row {
                node: Node::Dir { .. },
                ..
            }) => {}
            Some(_) => {
                return Err(DofsError::NotADirectory {
                    path: anc.into_string(),
                });
            }
            None => {
                let rev = m.rev()?;
                put_node(
                    m,
                    &anc,
                    rev,
                    &Node::Dir {
                        mode: DEFAULT_DIR_MODE,
                        mtime,
                    },
                    None,
                )?;
            }
        }
    }
    Ok(())
}

thread_local! {
    /// The chunker's read window, reused across writes on a thread: a
    /// fresh one per write zero-filled 4 MiB even for a 1 KiB file, which
    /// was most of a small write's cost.
    static READ_WINDOW: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Cuts `reader` into chunks and hands them to `sink`. A chunk may still
/// be gathered there when this returns, unless `held` asks for every one
/// to be stored (a chunk list in `manifest_chunks` must name stored chunks;
/// a single-chunk file names its chunk in its own row, and the sink is
/// flushed before the mutation commits).
fn chunk_into_store(
    m: &Mutation<'_>,
    sink: &mut ChunkSink,
    reader: impl Read,
) -> Result<Vec<ChunkRef>, DofsError> {
    let chunks = READ_WINDOW.with_borrow_mut(|buf| {
        chunk::chunk_reader_with(reader, buf, None, |c, bytes| {
            sink.add(m.chunks(), &c.hash, bytes)
                .map_err(SyncError::from)
        })
    })?;
    if rows::single_chunk(&chunks).is_none() {
        sink.flush(m.chunks())?;
    }
    Ok(chunks)
}

/// One file write inside mutation `m` (see [`Dofs::write_file_with`]).
fn write_in(
    m: &mut Mutation<'_>,
    sink: &mut ChunkSink,
    path: &SyncPath,
    content: impl Read,
    opts: WriteOptions,
) -> Result<Stat, DofsError> {
    let mtime = opts.mtime.unwrap_or_else(now_ms);
    let mode = match live(m, path.as_str())?.map(|r| r.node) {
        Some(Node::Dir { .. }) => {
            return Err(DofsError::IsADirectory {
                path: path.to_string(),
            });
        }
        Some(Node::Symlink { .. }) => {
            return Err(DofsError::invalid(
                path,
                "is a symlink (dofs never follows symlinks)",
            ));
        }
        Some(Node::File { mode, .. }) => opts.mode.unwrap_or(mode),
        _ => opts.mode.unwrap_or(DEFAULT_FILE_MODE),
    } & MODE_MASK;
    if opts.create_parents {
        create_parents(m, path, mtime)?;
    } else {
        require_parent_dir(m, path)?;
    }
    let chunks = chunk_into_store(m, sink, content)?;
    let node = file_node(m, &chunks, mode, mtime)?;
    let rev = m.rev()?;
    put_node(m, path, rev, &node, None)?;
    Ok(Stat::from_node(rev, node).expect("live"))
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
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        let mut sink = ChunkSink::default();
        let stat = write_in(&mut m, &mut sink, path, content, opts)?;
        sink.flush(m.chunks())?;
        m.commit()?;
        Ok(stat)
    }

    /// Writes several files in ONE transaction stamping one rev: all of them
    /// or, on the first error (which names its path), none. A commit writes
    /// every B-tree page it touched to the WAL (about ten 4 KiB pages for a
    /// small file), so many small files written one transaction each cost
    /// ~200 µs apiece; sharing the commit is what makes bulk writes cheap
    /// (bench `dofs_small_files`).
    pub fn write_files<'a, R: Read>(
        &mut self,
        files: impl IntoIterator<Item = (&'a SyncPath, R, WriteOptions)>,
    ) -> Result<Vec<Stat>, DofsError> {
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        let mut sink = ChunkSink::default();
        let mut stats = Vec::new();
        for (path, content, opts) in files {
            stats.push(write_in(&mut m, &mut sink, path, content, opts)?);
        }
        // Small files' chunks wait here to go out together.
        sink.flush(m.chunks())?;
        m.commit()?;
        Ok(stats)
    }

    /// Appends `content` to a file (creating it when missing). Only the last
    /// chunk is re-cut: content-defined cut points before it do not depend on
    /// what follows, so the result equals chunking the whole new content.
    pub fn append_file(&mut self, path: &SyncPath, content: impl Read) -> Result<Stat, DofsError> {
        let mtime = now_ms();
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        let (mode, mut chunks) = match live(&m, path.as_str())?.map(|r| r.node) {
            Some(Node::Dir { .. }) => {
                return Err(DofsError::IsADirectory {
                    path: path.to_string(),
                });
            }
            Some(Node::Symlink { .. }) => {
                return Err(DofsError::invalid(
                    path,
                    "is a symlink (dofs never follows symlinks)",
                ));
            }
            Some(Node::File {
                mode,
                manifest,
                chunk,
                size,
                ..
            }) => (
                mode,
                rows::file_chunks(&m, &manifest, chunk.as_ref(), size)?,
            ),
            _ => {
                require_parent_dir(&m, path)?;
                (DEFAULT_FILE_MODE, Vec::new())
            }
        };
        let tail = match chunks.pop() {
            Some(last) => m.chunks().get(&last.hash)?,
            None => Vec::new(),
        };
        let mut sink = ChunkSink::default();
        chunks.extend(chunk_into_store(
            &m,
            &mut sink,
            std::io::Cursor::new(tail).chain(content),
        )?);
        sink.flush(m.chunks())?;
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
        let (manifest, chunk) = self.file_content(path)?;
        let mut total = 0u64;
        self.chunks()
            .for_each_content_chunk(&manifest, chunk.as_ref(), |bytes| {
                out.write_all(bytes)
                    .map_err(|e| SyncError::io(format!("writing the content of {path}"), e))?;
                total += bytes.len() as u64;
                Ok(ControlFlow::Continue(()))
            })?;
        Ok(total)
    }

    /// A file's manifest hash and, for a single-chunk file, its chunk.
    fn file_content(&self, path: &SyncPath) -> Result<(Hash, Option<Hash>), DofsError> {
        match live(&self.conn, path.as_str())?.map(|r| r.node) {
            Some(Node::File {
                manifest, chunk, ..
            }) => Ok((manifest, chunk)),
            Some(Node::Dir { .. }) => Err(DofsError::IsADirectory {
                path: path.to_string(),
            }),
            Some(_) => Err(DofsError::invalid(
                path,
                "is a symlink (dofs never follows symlinks)",
            )),
            None => Err(DofsError::not_found(path)),
        }
    }

    /// Creates a directory; with `parents`, also its missing ancestors, and
    /// an existing directory is then not an error (and stamps no rev).
    pub fn mkdir(&mut self, path: &SyncPath, parents: bool) -> Result<(), DofsError> {
        let mtime = now_ms();
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        match live(&m, path.as_str())? {
            Some(Row {
                node: Node::Dir { .. },
                ..
            }) if parents => return Ok(()),
            Some(_) => {
                return Err(DofsError::AlreadyExists {
                    path: path.to_string(),
                });
            }
            None => {}
        }
        if parents {
            create_parents(&mut m, path, mtime)?;
        } else {
            require_parent_dir(&m, path)?;
        }
        let rev = m.rev()?;
        put_node(
            &m,
            path,
            rev,
            &Node::Dir {
                mode: DEFAULT_DIR_MODE,
                mtime,
            },
            None,
        )?;
        m.commit()?;
        Ok(())
    }

    /// Removes a path; a non-empty directory needs `recursive`. Every removed
    /// path gets its own tombstone, all at one rev.
    pub fn rm(&mut self, path: &SyncPath, recursive: bool) -> Result<(), DofsError> {
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        let row = live(&m, path.as_str())?.ok_or_else(|| DofsError::not_found(path))?;
        if row.node.is_dir() && !recursive && has_live_children(&m, path.as_str())? {
            return Err(DofsError::NotEmpty {
                path: path.to_string(),
            });
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
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        let src = live(&m, from.as_str())?.ok_or_else(|| DofsError::not_found(from))?;
        if from == to {
            return Ok(());
        }
        if to.starts_with(from) {
            return Err(DofsError::invalid(
                to,
                "cannot move a directory into itself",
            ));
        }
        require_parent_dir(&m, to)?;
        match live(&m, to.as_str())?.map(|r| r.node) {
            Some(Node::Dir { .. }) if !src.node.is_dir() => {
                return Err(DofsError::IsADirectory {
                    path: to.to_string(),
                });
            }
            Some(Node::Dir { .. }) if has_live_children(&m, to.as_str())? => {
                return Err(DofsError::NotEmpty {
                    path: to.to_string(),
                });
            }
            Some(n) if n.is_live() && !n.is_dir() && src.node.is_dir() => {
                return Err(DofsError::NotADirectory {
                    path: to.to_string(),
                });
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
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
        if live(&m, path.as_str())?.is_some() {
            return Err(DofsError::AlreadyExists {
                path: path.to_string(),
            });
        }
        require_parent_dir(&m, path)?;
        let rev = m.rev()?;
        let node = Node::Symlink {
            mode: DEFAULT_SYMLINK_MODE,
            mtime: now_ms(),
            target: target.to_owned(),
        };
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
            Node::File { mode: m, .. }
            | Node::Dir { mode: m, .. }
            | Node::Symlink { mode: m, .. } => std::mem::replace(m, mode) != mode,
            Node::Deleted => false,
        })
    }

    /// Sets the mtime (ms since the epoch). An unchanged mtime stamps no rev.
    pub fn set_mtime(&mut self, path: &SyncPath, mtime: i64) -> Result<(), DofsError> {
        self.update_node(path, |node| match node {
            Node::File { mtime: t, .. }
            | Node::Dir { mtime: t, .. }
            | Node::Symlink { mtime: t, .. } => std::mem::replace(t, mtime) != mtime,
            Node::Deleted => false,
        })
    }

    fn update_node(
        &mut self,
        path: &SyncPath,
        change: impl FnOnce(&mut Node) -> bool,
    ) -> Result<(), DofsError> {
        let mut m = Mutation::begin(&mut self.conn, self.objects.as_deref())?;
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
                Some(_) => {
                    return Err(DofsError::NotADirectory {
                        path: dir.to_string(),
                    });
                }
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
            out.push(DirEntry {
                name: path.file_name().to_owned(),
                path,
                stat,
            });
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
        self.search_where(pattern, under, limit, |_| true)
    }

    /// [`Dofs::search`] over only the files for which `keep` is true (a
    /// name filter, a permission check), so `limit` counts kept hits only.
    pub fn search_where(
        &self,
        pattern: &[u8],
        under: Option<&SyncPath>,
        limit: usize,
        mut keep: impl FnMut(&SyncPath) -> bool,
    ) -> Result<Vec<SearchHit>, DofsError> {
        if pattern.is_empty() {
            return Err(DofsError::invalid(
                under.map_or("", |p| p.as_str()),
                "empty search pattern",
            ));
        }
        let finder = memchr::memmem::Finder::new(pattern);
        let mut hits = Vec::new();
        let root = under.map(|p| p.as_str().to_owned());
        let (lo, hi) = subtree_bounds(root.as_deref().unwrap_or(""));
        // Snapshot the file list first: each file is then scanned with its
        // own chunk query, and the list itself is only paths and hashes.
        type FileRow = (String, Hash, Option<Hash>);
        let files: Vec<FileRow> = {
            let mut stmt = self.conn.prepare_cached(
                "SELECT path, manifest, chunk FROM entries
                 WHERE kind = 'file'
                   AND (?3 IS NULL OR path = ?3 OR (path >= ?1 AND path < ?2)) ORDER BY path",
            )?;
            stmt.query_map(params![lo, hi, root], |r| {
                let chunk: Option<Vec<u8>> = r.get(2)?;
                Ok((
                    r.get(0)?,
                    rows::hash_from_sql(r.get(1)?, 1)?,
                    chunk.map(|c| rows::hash_from_sql(c, 2)).transpose()?,
                ))
            })?
            .collect::<Result<_, _>>()?
        };
        for (path, manifest, chunk) in files {
            if hits.len() >= limit {
                break;
            }
            let path = SyncPath::new(path)?;
            if !keep(&path) {
                continue;
            }
            self.search_file(
                &finder,
                &path,
                (&manifest, chunk.as_ref()),
                limit,
                &mut hits,
            )?;
        }
        Ok(hits)
    }

    fn search_file(
        &self,
        finder: &memchr::memmem::Finder<'_>,
        path: &SyncPath,
        (manifest, chunk): (&Hash, Option<&Hash>),
        limit: usize,
        hits: &mut Vec<SearchHit>,
    ) -> Result<(), DofsError> {
        let keep = finder.needle().len() - 1;
        // `window` = the last `keep` bytes already scanned (so a match across
        // a chunk boundary is seen) followed by the new chunk. `lines` counts
        // newlines before `window_start`.
        let mut window: Vec<u8> = Vec::new();
        let mut window_start = 0u64;
        let mut lines = 0u64;
        self.chunks()
            .for_each_content_chunk(manifest, chunk, |bytes| {
                window.extend_from_slice(bytes);
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
                        return Ok(ControlFlow::Break(()));
                    }
                }
                let cut = window.len().saturating_sub(keep);
                lines += memchr::memchr_iter(b'\n', &window[..cut]).count() as u64;
                window.drain(..cut);
                window_start += cut as u64;
                Ok(ControlFlow::Continue(()))
            })
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
    Ok(Node::File {
        mode,
        mtime,
        size,
        manifest,
        chunk: rows::single_chunk(chunks),
    })
}

#[cfg(test)]
mod tests {
    use wsd_sync::{ErrorCode, Store, chunk};

    use super::*;
    use crate::test_util::{noise, p, put, store};

    fn tombstones(d: &mut Dofs) -> Vec<(String, u64)> {
        let mut stmt = d
            .conn
            .prepare("SELECT path, rev FROM entries WHERE kind = 'delete' ORDER BY path")
            .unwrap();
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn a_write_stamps_exactly_one_new_rev_and_reads_back() {
        let mut d = store();
        assert_eq!(d.current_rev().unwrap(), 0);
        d.write_file(&p("a.txt"), &b"hello"[..]).unwrap();
        assert_eq!(d.current_rev().unwrap(), 1);
        let st = d.stat(&p("a.txt")).unwrap();
        assert_eq!(
            (st.kind, st.mode, st.size, st.rev),
            (Kind::File, DEFAULT_FILE_MODE, 5, 1)
        );
        assert_eq!(d.read_file(&p("a.txt")).unwrap(), b"hello");
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_batch_of_writes_stamps_one_rev_and_every_file_reads_back() {
        let mut d = store();
        let paths: Vec<SyncPath> = (0..50).map(|i| p(&format!("d/f{i}"))).collect();
        let bodies: Vec<Vec<u8>> = (0..50).map(|i| format!("body {i}").into_bytes()).collect();
        let opts = WriteOptions {
            create_parents: true,
            ..WriteOptions::default()
        };
        let stats = d
            .write_files(paths.iter().zip(&bodies).map(|(p, b)| (p, &b[..], opts)))
            .unwrap();
        assert_eq!(d.current_rev().unwrap(), 1);
        assert!(stats.iter().all(|s| s.rev == 1 && s.kind == Kind::File));
        for (path, body) in paths.iter().zip(&bodies) {
            assert_eq!(&d.read_file(path).unwrap(), body);
        }
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_batch_with_one_bad_path_fails_naming_it_and_changes_nothing() {
        let mut d = store();
        d.mkdir(&p("taken"), false).unwrap();
        let before = d.current_rev().unwrap();
        let (good, bad) = (p("good.txt"), p("taken"));
        let opts = WriteOptions::default();
        let err = d
            .write_files([(&good, &b"x"[..], opts), (&bad, &b"y"[..], opts)])
            .unwrap_err();
        assert!(
            matches!(&err, DofsError::IsADirectory { path } if path == "taken"),
            "{err:?}"
        );
        assert_eq!(d.current_rev().unwrap(), before);
        assert!(d.stat(&good).is_err(), "the good file was rolled back");
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_large_streamed_write_reads_back_identically_and_cuts_like_chunk_slice() {
        let mut d = store();
        let data = noise(9 * 1024 * 1024 + 17, 1);
        d.write_file(&p("big"), &data[..]).unwrap();
        assert_eq!(d.read_file(&p("big")).unwrap(), data);
        let expected: Vec<ChunkRef> = chunk::chunk_slice(&data)
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        let entry = d.read_entry(&p("big")).unwrap().unwrap();
        assert_eq!(entry.chunks(), &expected[..]);
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_single_chunk_file_names_its_chunk_and_writes_no_manifest_rows() {
        let mut d = store();
        let count =
            |d: &Dofs, sql: &str| -> i64 { d.conn.query_row(sql, [], |r| r.get(0)).unwrap() };
        put(&mut d, "small", b"one chunk");
        assert_eq!(count(&d, "SELECT count(*) FROM manifests"), 0);
        assert_eq!(count(&d, "SELECT count(*) FROM manifest_chunks"), 0);
        assert_eq!(
            count(
                &d,
                "SELECT count(*) FROM entries WHERE path = 'small' AND chunk IS NOT NULL"
            ),
            1
        );
        let big = noise(600 * 1024, 6);
        let n = chunk::chunk_slice(&big).len() as i64;
        put(&mut d, "big", &big);
        assert_eq!(count(&d, "SELECT count(*) FROM manifest_chunks"), n);
        assert_eq!(
            count(
                &d,
                "SELECT count(*) FROM entries WHERE path = 'big' AND chunk IS NULL"
            ),
            1
        );
        assert_eq!(d.read_file(&p("small")).unwrap(), b"one chunk");
        assert_eq!(d.read_file(&p("big")).unwrap(), big);
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_failing_reader_rolls_back_the_write_and_the_rev_counter() {
        struct Broken(usize);
        impl Read for Broken {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if self.0 == 0 {
                    return Err(std::io::Error::other("disk on fire"));
                }
                let n = buf.len().min(self.0);
                buf[..n].fill(7);
                self.0 -= n;
                Ok(n)
            }
        }
        let mut d = store();
        d.mkdir(&p("d"), false).unwrap();
        let err = d.write_file(&p("d/f"), Broken(100_000)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Io);
        assert_eq!(d.current_rev().unwrap(), 1);
        assert!(!d.exists(&p("d/f")).unwrap());
        let chunks: u64 = d
            .conn
            .query_row("SELECT count(*) FROM chunks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            chunks, 0,
            "chunks staged by the failed write were rolled back too"
        );
        d.check_integrity().unwrap();
    }

    #[test]
    fn append_recuts_only_the_tail_and_matches_chunking_the_whole() {
        let mut d = store();
        let first = noise(700 * 1024, 2);
        let more = noise(300 * 1024, 3);
        d.write_file(&p("log"), &first[..]).unwrap();
        d.append_file(&p("log"), &more[..]).unwrap();
        let whole = [first, more].concat();
        assert_eq!(d.read_file(&p("log")).unwrap(), whole);
        let expected: Vec<ChunkRef> = chunk::chunk_slice(&whole)
            .into_iter()
            .map(|(_, c)| c)
            .collect();
        assert_eq!(
            d.read_entry(&p("log")).unwrap().unwrap().chunks(),
            &expected[..]
        );
        d.append_file(&p("new"), &b"x"[..]).unwrap();
        assert_eq!(d.read_file(&p("new")).unwrap(), b"x");
        d.check_integrity().unwrap();
    }

    #[test]
    fn mkdir_p_of_an_existing_directory_burns_no_rev() {
        let mut d = store();
        d.mkdir(&p("a/b/c"), true).unwrap();
        let rev = d.current_rev().unwrap();
        assert_eq!(rev, 1, "one mkdir -p is one rev whatever it creates");
        d.mkdir(&p("a/b/c"), true).unwrap();
        d.mkdir(&p("a"), true).unwrap();
        assert_eq!(d.current_rev().unwrap(), rev);
        assert_eq!(d.mkdir(&p("a"), false).unwrap_err().posix_name(), "EEXIST");
    }

    #[test]
    fn creating_under_a_missing_or_non_directory_parent_fails_precisely() {
        let mut d = store();
        assert_eq!(
            d.write_file(&p("x/y"), &b""[..]).unwrap_err().posix_name(),
            "ENOENT"
        );
        put(&mut d, "f", b"file");
        let err = d.write_file(&p("f/y/z"), &b""[..]).unwrap_err();
        assert_eq!(err.posix_name(), "ENOTDIR");
        assert!(
            err.to_string().contains(": f:") || err.to_string().contains(" f:"),
            "{err}"
        );
        assert_eq!(
            d.mkdir(&p("f/q"), true).unwrap_err().posix_name(),
            "ENOTDIR"
        );
        assert_eq!(
            d.symlink("t", &p("f/s")).unwrap_err().posix_name(),
            "ENOTDIR"
        );
        assert_eq!(d.current_rev().unwrap(), 1);
    }

    #[test]
    fn rm_writes_one_tombstone_per_removed_path_all_at_one_rev() {
        let mut d = store();
        put(&mut d, "d/a", b"1");
        put(&mut d, "d/sub/b", b"2");
        d.symlink("../a", &p("d/sub/link")).unwrap();
        assert_eq!(d.rm(&p("d"), false).unwrap_err().posix_name(), "ENOTEMPTY");
        let before = d.current_rev().unwrap();
        d.rm(&p("d"), true).unwrap();
        let rev = before + 1;
        assert_eq!(d.current_rev().unwrap(), rev);
        assert_eq!(
            tombstones(&mut d),
            vec![
                ("d".into(), rev),
                ("d/a".into(), rev),
                ("d/sub".into(), rev),
                ("d/sub/b".into(), rev),
                ("d/sub/link".into(), rev)
            ]
        );
        assert_eq!(d.rm(&p("d"), true).unwrap_err().code(), ErrorCode::NotFound);
        assert!(d.readdir(None).unwrap().is_empty());
        d.check_integrity().unwrap();
    }

    #[test]
    fn rename_restamps_the_subtree_and_tombstones_old_paths_at_one_rev() {
        let mut d = store();
        put(&mut d, "src/a", b"1");
        put(&mut d, "src/x/b", b"2");
        put(&mut d, "src-sibling", b"not moved");
        d.chmod(&p("src/a"), 0o600).unwrap();
        d.rename(&p("src"), &p("dst")).unwrap();
        let rev = d.current_rev().unwrap();
        for path in ["dst", "dst/a", "dst/x", "dst/x/b"] {
            assert_eq!(d.stat(&p(path)).unwrap().rev, rev, "{path}");
        }
        assert_eq!(d.stat(&p("dst/a")).unwrap().mode, 0o600);
        assert_eq!(d.read_file(&p("dst/x/b")).unwrap(), b"2");
        assert_eq!(
            tombstones(&mut d),
            vec![
                ("src".into(), rev),
                ("src/a".into(), rev),
                ("src/x".into(), rev),
                ("src/x/b".into(), rev)
            ]
        );
        assert!(d.stat(&p("src-sibling")).unwrap().rev < rev);
        d.check_integrity().unwrap();
    }

    #[test]
    fn rename_of_a_subtree_larger_than_one_page_moves_everything() {
        let mut d = store();
        d.mkdir(&p("big"), false).unwrap();
        for i in 0..(RENAME_PAGE + 10) {
            put(&mut d, &format!("big/f{i:04}"), b"x");
        }
        d.rename(&p("big"), &p("moved")).unwrap();
        assert_eq!(
            d.readdir(Some(&p("moved"))).unwrap().len(),
            RENAME_PAGE + 10
        );
        assert!(!d.exists(&p("big/f0000")).unwrap());
        d.check_integrity().unwrap();
    }

    #[test]
    fn rename_refuses_moving_a_directory_into_itself_and_incompatible_targets() {
        let mut d = store();
        put(&mut d, "a/b/f", b"1");
        put(&mut d, "g", b"2");
        put(&mut d, "full/x", b"3");
        d.mkdir(&p("empty"), false).unwrap();
        let rev = d.current_rev().unwrap();
        assert_eq!(
            d.rename(&p("a"), &p("a/b/c")).unwrap_err().posix_name(),
            "EINVAL"
        );
        assert_eq!(
            d.rename(&p("a"), &p("g")).unwrap_err().posix_name(),
            "ENOTDIR"
        );
        assert_eq!(
            d.rename(&p("g"), &p("empty")).unwrap_err().posix_name(),
            "EISDIR"
        );
        assert_eq!(
            d.rename(&p("a"), &p("full")).unwrap_err().posix_name(),
            "ENOTEMPTY"
        );
        assert_eq!(
            d.rename(&p("nope"), &p("z")).unwrap_err().posix_name(),
            "ENOENT"
        );
        assert_eq!(
            d.rename(&p("g"), &p("none/z")).unwrap_err().posix_name(),
            "ENOENT"
        );
        d.rename(&p("a"), &p("a")).unwrap();
        assert_eq!(
            d.current_rev().unwrap(),
            rev,
            "refused renames stamp nothing"
        );
        d.rename(&p("a"), &p("empty")).unwrap();
        assert_eq!(d.read_file(&p("empty/b/f")).unwrap(), b"1");
        d.rename(&p("g"), &p("full/x")).unwrap();
        assert_eq!(d.read_file(&p("full/x")).unwrap(), b"2");
        d.check_integrity().unwrap();
    }

    #[test]
    fn symlinks_are_stored_verbatim_and_never_followed() {
        let mut d = store();
        put(&mut d, "dir/file", b"1");
        d.symlink("dir", &p("link")).unwrap();
        d.symlink("/does/not/exist", &p("dangling")).unwrap();
        assert_eq!(d.readlink(&p("link")).unwrap(), "dir");
        let st = d.stat(&p("link")).unwrap();
        assert_eq!(
            (st.kind, st.mode, st.size),
            (Kind::Symlink, DEFAULT_SYMLINK_MODE, 3)
        );
        assert_eq!(
            d.symlink("x", &p("link")).unwrap_err().posix_name(),
            "EEXIST"
        );
        assert_eq!(d.readlink(&p("dir")).unwrap_err().posix_name(), "EINVAL");
        assert_eq!(d.readlink(&p("nope")).unwrap_err().posix_name(), "ENOENT");
        assert_eq!(
            d.read_file(&p("link/file")).unwrap_err().posix_name(),
            "ENOENT"
        );
        assert_eq!(
            d.write_file(&p("link/new"), &b""[..])
                .unwrap_err()
                .posix_name(),
            "ENOTDIR"
        );
        assert_eq!(
            d.symlink("", &p("empty")).unwrap_err().posix_name(),
            "EINVAL"
        );
        d.rm(&p("link"), false).unwrap();
        assert_eq!(
            d.read_file(&p("dir/file")).unwrap(),
            b"1",
            "removing a link keeps its target"
        );
    }

    #[test]
    fn chmod_masks_to_twelve_bits_and_an_unchanged_mode_stamps_nothing() {
        let mut d = store();
        put(&mut d, "f", b"x");
        d.chmod(&p("f"), 0o104_755).unwrap();
        assert_eq!(d.stat(&p("f")).unwrap().mode, 0o4755);
        let rev = d.current_rev().unwrap();
        assert_eq!(
            d.stat(&p("f")).unwrap().rev,
            rev,
            "a mode change is a change"
        );
        d.chmod(&p("f"), 0o4755).unwrap();
        assert_eq!(d.current_rev().unwrap(), rev);
        assert_eq!(
            d.chmod(&p("nope"), 0o600).unwrap_err().code(),
            ErrorCode::NotFound
        );
        put(&mut d, "f", b"rewritten");
        assert_eq!(
            d.stat(&p("f")).unwrap().mode,
            0o4755,
            "a rewrite keeps the mode"
        );
    }

    #[test]
    fn set_mtime_is_recorded_and_stamped() {
        let mut d = store();
        d.mkdir(&p("d"), false).unwrap();
        d.set_mtime(&p("d"), 1_000).unwrap();
        assert_eq!(d.stat(&p("d")).unwrap().mtime, 1_000);
        assert_eq!(d.current_rev().unwrap(), 2);
        d.set_mtime(&p("d"), 1_000).unwrap();
        assert_eq!(d.current_rev().unwrap(), 2);
    }

    #[test]
    fn readdir_lists_children_in_utf8_byte_order() {
        let mut d = store();
        for name in ["\u{1F600}", "\u{E000}", "b", "a-b", "a", "B"] {
            put(&mut d, &format!("d/{name}"), b"");
        }
        put(&mut d, "d/sub/deeper", b"");
        let names: Vec<String> = d
            .readdir(Some(&p("d")))
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            names,
            ["B", "a", "a-b", "b", "sub", "\u{E000}", "\u{1F600}"].map(String::from)
        );
        let root: Vec<String> = d
            .readdir(None)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(root, ["d"]);
        assert_eq!(
            d.readdir(Some(&p("d/b"))).unwrap_err().posix_name(),
            "ENOTDIR"
        );
        assert_eq!(
            d.readdir(Some(&p("zz"))).unwrap_err().posix_name(),
            "ENOENT"
        );
    }

    #[test]
    fn reading_a_directory_or_a_missing_file_fails_with_its_path() {
        let mut d = store();
        d.mkdir(&p("d"), false).unwrap();
        assert_eq!(d.read_file(&p("d")).unwrap_err().posix_name(), "EISDIR");
        let err = d.read_file(&p("d/missing")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::NotFound);
        assert!(err.to_string().contains("d/missing"));
        assert_eq!(
            d.write_file(&p("d"), &b""[..]).unwrap_err().posix_name(),
            "EISDIR"
        );
    }

    #[test]
    fn search_finds_literal_matches_with_lines_and_offsets_across_chunk_boundaries() {
        let mut d = store();
        put(
            &mut d,
            "src/a.rs",
            b"fn main() {}\nlet needle = 1;\n\nneedle needle\n",
        );
        put(&mut d, "src/b.rs", b"nothing here\n");
        put(&mut d, "srcx/c.rs", b"needle\n");
        // A match straddling the first cut of a multi-chunk file.
        let mut big = noise(600 * 1024, 4);
        big.retain(|&b| b != b'\n' && b != b'n');
        let cut = chunk::chunk_slice(&big)[1].0;
        big.splice(cut - 3..cut - 3, b"\nneedle".iter().copied());
        put(&mut d, "src/big.bin", &big);
        assert!(
            d.read_entry(&p("src/big.bin"))
                .unwrap()
                .unwrap()
                .chunks()
                .len()
                > 1
        );

        let hits = d.search(b"needle", Some(&p("src")), 100).unwrap();
        let found: Vec<(&str, u64, u64)> = hits
            .iter()
            .map(|h| (h.path.as_str(), h.line, h.offset))
            .collect();
        assert_eq!(
            found,
            vec![
                ("src/a.rs", 2, 17),
                ("src/a.rs", 4, 30),
                ("src/a.rs", 4, 37),
                ("src/big.bin", 2, (cut - 2) as u64)
            ]
        );
        assert_eq!(d.search(b"needle", None, 100).unwrap().len(), 5);
        assert_eq!(d.search(b"needle", None, 2).unwrap().len(), 2);
        assert_eq!(
            d.search(b"needle", Some(&p("src/a.rs")), 100)
                .unwrap()
                .len(),
            3
        );
        assert_eq!(d.search(b"", None, 1).unwrap_err().posix_name(), "EINVAL");
    }
}
