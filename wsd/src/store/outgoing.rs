//! Objects on their way out (a push from this directory, a pull served from
//! it): where the chunks of the entries [`Store::changes`] just paged are,
//! and a reader that writes each chunk straight from its file into the
//! buffer it is sent in.
//!
//! A sender's objects are the chunks of the entries it pages, read moments
//! later. The page already holds each file's row (its stat when hashed) and
//! chunk list, so [`PagedChunks`] keeps those locations and a read needs no
//! index lookup per chunk; a location that fails (the file changed, or
//! fell out of the bounded map) goes back to the index as before. Serving
//! from a location needs the same proof as ever: the open file's `fstat`
//! equals the row (and is not racily clean), or its bytes hash right. A
//! location noted from an older row is as good as when it was noted:
//! either proof is about the file as it is now.
//!
//! [`Store::changes`]: wsd_sync::Store::changes

use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata};
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::Path;

use rusqlite::Connection;
use wsd_sync::{ChunkRef, Hash, ObjectReader, SyncError, SyncPath};

use super::apply::{self, ChunkMisses};
use super::fsutil;
use super::index::{self, ChunkLocation, Node, NodeKind};
use super::objects::Staging;

/// Chunk locations per generation of [`PagedChunks`]: two generations are
/// kept, so at most twice this many (a few MiB), whatever the tree.
const GENERATION_CHUNKS: usize = 8192;

/// Where the chunks of recently paged file entries are, newest first.
#[derive(Debug, Default)]
pub(crate) struct PagedChunks {
    current: HashMap<Hash, ChunkLocation>,
    previous: HashMap<Hash, ChunkLocation>,
}

impl PagedChunks {
    /// Notes where `node`'s chunks are (a live file's; other kinds hold none).
    pub fn note(&mut self, node: &Node, chunks: &[ChunkRef]) {
        if node.kind != NodeKind::File {
            return;
        }
        let mut offset = 0u64;
        for c in chunks {
            if self.current.len() >= GENERATION_CHUNKS {
                self.previous = std::mem::take(&mut self.current);
            }
            self.current.insert(
                c.hash,
                ChunkLocation {
                    path: node.path.clone(),
                    offset,
                    size: c.size,
                    stat: node.stat,
                    verified_ns: node.verified_ns,
                },
            );
            offset += u64::from(c.size);
        }
    }

    /// The noted location of `hash`, forgotten here: an object is read once
    /// per transfer, and a second read looks in the index.
    pub fn take(&mut self, hash: &Hash) -> Option<ChunkLocation> {
        self.current
            .remove(hash)
            .or_else(|| self.previous.remove(hash))
    }
}

/// The file the previous chunk came from, kept open: the consecutive chunks
/// of one large file are read through one descriptor, its `fstat` taken
/// again before each. And the directory it is in, so that the next file
/// there (files come in path order) is opened by its name alone instead of
/// resolving the whole path from `/` again.
#[derive(Debug, Default)]
pub(crate) struct OpenFile {
    file: Option<(SyncPath, File)>,
    /// The directory's workspace path ("" for the root) and an `O_PATH`
    /// descriptor of it, opened without following any symlink.
    dir: Option<(String, OwnedFd)>,
}

impl OpenFile {
    /// `path` (as the index names it) opened for reading, and its `fstat`
    /// now; `None` when it is gone or no longer a regular file reached
    /// through real directories.
    fn get(
        &mut self,
        root: &Path,
        path: &SyncPath,
    ) -> Result<Option<(&File, Metadata)>, SyncError> {
        let reuse = matches!(&self.file, Some((p, _)) if p == path);
        if !reuse {
            self.file = None;
            match self.open(root, path) {
                Ok(Some((file, meta))) => {
                    let (_, file) = &*self.file.insert((path.clone(), file));
                    return Ok(Some((file, meta)));
                }
                Ok(None) => return Ok(None),
                Err(e) => return Err(SyncError::io(format!("opening {path}"), e)),
            }
        }
        let (_, file) = self.file.as_ref().expect("kept open above");
        let meta = file
            .metadata()
            .map_err(|e| SyncError::io(format!("reading the status of {path}"), e))?;
        Ok(meta.file_type().is_file().then_some((file, meta)))
    }

    /// Opens `path` by its name in its directory's descriptor (`openat2`
    /// beneath it, no symlink followed). Anything but a regular file opened
    /// that way (gone, a symlink, `openat2` refused) is left to
    /// [`fsutil::open_file_in_root`], which decides as it always has.
    fn open(&mut self, root: &Path, path: &SyncPath) -> std::io::Result<Option<(File, Metadata)>> {
        use rustix::fs::{CWD, Mode, OFlags, ResolveFlags};
        let (parent, name) = path
            .as_str()
            .rsplit_once('/')
            .unwrap_or(("", path.as_str()));
        if self.dir.as_ref().is_none_or(|(p, _)| p != parent) {
            self.dir = None;
            let abs = match parent {
                "" => root.to_path_buf(),
                parent => root.join(parent),
            };
            match rustix::fs::openat2(
                CWD,
                &abs,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
                Mode::empty(),
                ResolveFlags::NO_SYMLINKS,
            ) {
                Ok(fd) => self.dir = Some((parent.to_owned(), fd)),
                Err(_) => return fsutil::open_file_in_root(root, path),
            }
        }
        let (_, dir) = self.dir.as_ref().expect("opened above");
        let opened = rustix::fs::openat2(
            dir,
            name,
            OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
            ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH,
        );
        let Ok(fd) = opened else {
            return fsutil::open_file_in_root(root, path);
        };
        let file = File::from(fd);
        let meta = file.metadata()?;
        Ok(meta.file_type().is_file().then_some((file, meta)))
    }
}

/// Reads chunk `hash` from `loc` into `buf` (exactly its size). True when
/// the bytes are proven to be the chunk: the file's stat still equals its
/// row, or they hash right. False when the file is gone, shorter, or holds
/// other bytes there now.
pub(crate) fn read_located(
    root: &Path,
    open: &mut OpenFile,
    loc: &ChunkLocation,
    hash: &Hash,
    buf: &mut [u8],
) -> Result<bool, SyncError> {
    if loc.size as usize != buf.len() {
        return Ok(false);
    }
    let Some((file, meta)) = open.get(root, &loc.path)? else {
        return Ok(false);
    };
    match file.read_exact_at(buf, loc.offset) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(SyncError::io(format!("reading {}", loc.path), e)),
    }
    // A file whose stat still matches its row holds the bytes settle
    // hashed (the same rule settle trusts); anything else is verified.
    if loc.unchanged(&meta) || hash.verify(buf).is_ok() {
        return Ok(true);
    }
    tracing::warn!(path = %loc.path, %hash, offset = loc.offset,
        "file changed since it was indexed; its chunk is not served");
    Ok(false)
}

/// The workspace store's [`ObjectReader`]: each object from staging, else
/// from where the page noted it, else from the files the index names.
pub(crate) struct Outgoing<'a> {
    pub db: &'a Connection,
    pub root: &'a Path,
    pub staging: &'a mut Staging,
    pub paged: &'a mut PagedChunks,
    /// Files a read found changed behind the index: hashed next settle.
    pub force: &'a mut HashSet<SyncPath>,
    pub open: OpenFile,
}

impl ObjectReader for Outgoing<'_> {
    fn read_into(&mut self, hash: &Hash, buf: &mut [u8]) -> Result<(), SyncError> {
        if let Some(bytes) = self.staging.read(hash)? {
            if bytes.len() != buf.len() {
                return Err(SyncError::Storage(format!(
                    "object {hash} holds {} bytes, its chunk reference says {}",
                    bytes.len(),
                    buf.len()
                )));
            }
            buf.copy_from_slice(&bytes);
            return Ok(());
        }
        if let Some(loc) = self.paged.take(hash)
            && read_located(self.root, &mut self.open, &loc, hash, buf)?
        {
            return Ok(());
        }
        let mut misses = ChunkMisses::default();
        for loc in index::chunk_locations(self.db, hash, 8)? {
            if read_located(self.root, &mut self.open, &loc, hash, buf)? {
                return Ok(());
            }
            misses.changed.push(loc.path);
        }
        self.force.extend(misses.changed.iter().cloned());
        Err(apply::missing_chunk_error(hash, None, &misses))
    }
}
