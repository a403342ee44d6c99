//! The first index of a never-indexed tree, built while a push sends it.
//!
//! A first push would otherwise hash the whole tree into the index and only
//! then start sending. Instead [`FirstIndex::run`] walks and hashes on its
//! own thread and hands the result over in [`Piece`]s through a bounded
//! channel; the owner of the store records each piece under a rev of its
//! own ([`WorkspaceStore::record_piece`]) as the push asks for more, so the
//! daemon applies the first files while later ones are hashed. The store
//! keeps its single writer: the walking thread never touches the index.
//!
//! A piece is whole or absent, so a crash leaves an index of complete revs;
//! the next push opens a non-empty index, settles with a full walk (which
//! records what no piece did) and resumes from the push cursor.

use std::path::PathBuf;

use wsd_sync::{ChunkRef, SyncError, SyncPath, manifest};

use super::error::IndexContext;
use super::fsutil::{self, DiskKind};
use super::index::{self, Fingerprint, Node, NodeKind};
use super::scan::{self, HashedFile, PendingHash, Seen};
use super::{SettleReport, WorkspaceStore};

/// The first piece is small, so the push starts early; later ones are
/// about a push batch of entries (`BATCH_ENTRIES`) or two of object bytes.
const FIRST_PIECE_FILES: usize = 64;
const FIRST_PIECE_BYTES: u64 = 1024 * 1024;
const PIECE_FILES: usize = 256;
const PIECE_BYTES: u64 = 8 * 1024 * 1024;

/// A row of a [`Piece`]: the node, a file's chunks and, for a large file,
/// their fingerprints.
type PieceRow = (Node, Vec<ChunkRef>, Option<Vec<Fingerprint>>);

/// Part of a first index: new rows, parents before their children, not yet
/// stamped with a rev.
#[derive(Debug, Default)]
pub struct Piece {
    rows: Vec<PieceRow>,
    hashed: usize,
}

impl Piece {
    /// Rows in the piece.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// The walk of a never-indexed tree (see the module documentation), to run
/// on a thread of its own.
#[derive(Debug)]
pub struct FirstIndex {
    root: PathBuf,
    state_dir: PathBuf,
    /// The racy-clean reference of every row (as a settle's start).
    started_ns: i64,
}

impl WorkspaceStore {
    /// A [`FirstIndex`] for this store when its index has never recorded
    /// anything (rev 0), it has no watcher (which must see each directory
    /// before it is listed) and it settles only when told to
    /// ([`super::StoreOptions::auto_settle`] off); `None`: settle as usual.
    /// The store counts as walked from now on: its owner records every
    /// piece and does not settle meanwhile (or stops, and the next open
    /// walks).
    pub fn first_index(&mut self) -> Result<Option<FirstIndex>, SyncError> {
        if self.watch.is_some() || self.auto_settle || index::meta_get(&self.db, "rev")? != 0 {
            return Ok(None);
        }
        self.owed_walk = None;
        self.walked_since_open = true;
        Ok(Some(FirstIndex {
            root: self.root.clone(),
            state_dir: self.state_dir.clone(),
            started_ns: fsutil::now_ns(),
        }))
    }

    /// Records a piece of a [`FirstIndex`] under a new rev, in one
    /// transaction; returns the rev (`None` for an empty piece).
    pub fn record_piece(&mut self, piece: Piece) -> Result<Option<u64>, SyncError> {
        if piece.rows.is_empty() {
            return Ok(None);
        }
        let tx = self
            .db
            .transaction()
            .ctx("starting to record an index piece")?;
        let rev = index::next_rev(&tx)?;
        for (mut node, chunks, fingerprints) in piece.rows {
            node.rev = rev;
            // A first index has no rows to replace.
            index::put_file_node(&tx, &node, &chunks, fingerprints.as_deref(), false)?;
        }
        tx.commit().ctx("recording an index piece")?;
        Ok(Some(rev))
    }
}

impl FirstIndex {
    /// Walks the tree, hashing its files on the hashing pool, and hands
    /// each piece to `send`; stops early (with `Ok`) when `send` returns
    /// false (the push ended). Only what fits the sync is recorded, as a
    /// settle does: no state directory, no apply temp files (a crash's
    /// leftovers are removed), no names or symlink targets that are not
    /// UTF-8, no sockets, fifos or devices.
    pub fn run(self, mut send: impl FnMut(Piece) -> bool) -> Result<SettleReport, SyncError> {
        let mut report = SettleReport::default();
        let mut piece = Piece::default();
        let mut files: Vec<PendingHash> = Vec::new();
        let mut bytes = 0u64;
        let mut first = true;
        let mut stack: Vec<(Option<SyncPath>, PathBuf)> = vec![(None, self.root.clone())];
        while let Some((dir, dir_abs)) = stack.pop() {
            let Some(listed) = scan::list_dir(&dir_abs, &self.state_dir)? else {
                continue;
            };
            for (name, seen) in listed {
                if fsutil::is_apply_temp(&name) {
                    let temp = dir_abs.join(&name);
                    tracing::info!(path = %temp.display(), "removing a stale apply temp file");
                    let _ = std::fs::remove_file(&temp);
                    continue;
                }
                let Some(Seen { kind, stat }) = seen else {
                    continue;
                };
                let joined = match &dir {
                    Some(d) => d.join(&name),
                    None => SyncPath::new(name.clone()),
                };
                let rel = match joined {
                    Ok(rel) => rel,
                    Err(e) => {
                        tracing::warn!(path = %dir_abs.join(&name).display(), error = %e, "not synced");
                        continue;
                    }
                };
                let abs = dir_abs.join(&name);
                let node = |kind, target| Node {
                    path: rel.clone(),
                    kind,
                    stat,
                    target,
                    manifest: None,
                    verified_ns: self.started_ns,
                    rev: 0,
                    applied_from: None,
                };
                match kind {
                    DiskKind::Dir => {
                        piece
                            .rows
                            .push((node(NodeKind::Dir, None), Vec::new(), None));
                        stack.push((Some(rel), abs));
                    }
                    DiskKind::Symlink => match fsutil::read_link_utf8(&abs) {
                        Ok(Some(t)) if !t.is_empty() => {
                            piece
                                .rows
                                .push((node(NodeKind::Symlink, Some(t)), Vec::new(), None));
                        }
                        Ok(_) => {
                            tracing::warn!(path = %rel, "symlink target is not UTF-8; not synced")
                        }
                        Err(e) if fsutil::is_gone(&e) => {}
                        Err(e) => return Err(SyncError::io(format!("reading link {rel}"), e)),
                    },
                    DiskKind::File => {
                        bytes += stat.size;
                        files.push(PendingHash::new(rel, abs, stat.size));
                    }
                    DiskKind::Unsupported => {}
                }
                let (max_files, max_bytes) = if first {
                    (FIRST_PIECE_FILES, FIRST_PIECE_BYTES)
                } else {
                    (PIECE_FILES, PIECE_BYTES)
                };
                if files.len() + piece.rows.len() >= max_files || bytes >= max_bytes {
                    self.hash_into(&mut piece, std::mem::take(&mut files))?;
                    bytes = 0;
                    first = false;
                    if !self.hand_over(&mut piece, &mut report, &mut send) {
                        return Ok(report);
                    }
                }
            }
        }
        self.hash_into(&mut piece, files)?;
        self.hand_over(&mut piece, &mut report, &mut send);
        Ok(report)
    }

    /// Hashes `files` and adds the rows of those still regular files.
    fn hash_into(&self, piece: &mut Piece, files: Vec<PendingHash>) -> Result<(), SyncError> {
        let hashed = scan::hash_files(&files);
        for (f, result) in files.into_iter().zip(hashed) {
            // Vanished or replaced while we looked: the next settle's walk
            // records what is there then.
            let Some(HashedFile {
                chunks,
                fingerprints,
                stat,
            }) = result?
            else {
                continue;
            };
            piece.hashed += 1;
            let node = Node {
                path: f.into_rel(),
                kind: NodeKind::File,
                stat,
                target: None,
                manifest: Some(manifest::hash(&chunks)),
                verified_ns: self.started_ns,
                rev: 0,
                applied_from: None,
            };
            piece.rows.push((node, chunks, fingerprints));
        }
        Ok(())
    }

    /// Sends a non-empty piece; false when the receiver is gone.
    fn hand_over(
        &self,
        piece: &mut Piece,
        report: &mut SettleReport,
        send: &mut impl FnMut(Piece) -> bool,
    ) -> bool {
        if piece.rows.is_empty() {
            return true;
        }
        report.changed += piece.rows.len();
        report.hashed += piece.hashed;
        send(std::mem::take(piece))
    }
}
