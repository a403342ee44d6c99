//! The staging area: verified objects that arrived before the entries that
//! use them. Objects that live in the directory are never copied here; the
//! index points at them instead (`chunks` table).
//!
//! Staged objects are held in memory up to [`MEMORY_BUDGET`] bytes; beyond
//! it they spill to `state_dir/objects/`, one file per object named by its
//! hash. A push batch carries at most 4 MiB of missing chunk bytes (a single
//! larger file goes alone), so the budget holds every batch of an ordinary
//! tree and a cold push creates and deletes no staging files at all: that
//! churn (create, write, rename, read, unlink per chunk) cost more kernel
//! time than writing the workspace files, and ext4 slows down re-creating
//! names in a directory where many were just deleted.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use wsd_sync::{Hash, SyncError};

use super::error::IoContext;

/// Staged bytes kept in memory before objects spill to files. It bounds the
/// daemon's staging memory whatever a peer sends ahead of its entries.
pub(crate) const MEMORY_BUDGET: usize = 32 * 1024 * 1024;

#[derive(Debug)]
pub(crate) struct Staging {
    dir: PathBuf,
    /// Objects held in memory, verified on arrival; shared with the
    /// threads that write files (`writer::Piece::Staged`).
    mem: HashMap<Hash, Arc<Vec<u8>>>,
    /// Bytes in `mem`.
    mem_bytes: usize,
    /// Objects spilled to files in `dir`.
    spilled: HashSet<Hash>,
    budget: usize,
}

impl Staging {
    /// Opens the staging area, dropping whatever a previous run left: it
    /// was either linked into files already or belongs to a batch that never
    /// arrived, and a sender re-sends what `has_objects` says is missing.
    pub fn open(dir: PathBuf) -> Result<Staging, SyncError> {
        Staging::with_budget(dir, MEMORY_BUDGET)
    }

    pub fn with_budget(dir: PathBuf, budget: usize) -> Result<Staging, SyncError> {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SyncError::io(format!("clearing {}", dir.display()), e)),
        }
        std::fs::create_dir_all(&dir).io_ctx(|| format!("creating {}", dir.display()))?;
        Ok(Staging {
            dir,
            mem: HashMap::new(),
            mem_bytes: 0,
            spilled: HashSet::new(),
            budget,
        })
    }

    fn path_of(&self, hash: &Hash) -> PathBuf {
        self.dir.join(hash.to_string())
    }

    pub fn contains(&self, hash: &Hash) -> bool {
        self.mem.contains_key(hash) || self.spilled.contains(hash)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.mem.len() + self.spilled.len()
    }

    /// Objects spilled to files (tests check the budget is honoured).
    #[cfg(test)]
    pub fn spilled_len(&self) -> usize {
        self.spilled.len()
    }

    /// Stores bytes already verified to hash to `hash`: in memory while the
    /// budget allows, else written to a temp name and renamed, so a crash
    /// never leaves a truncated object under its hash.
    pub fn put_verified(&mut self, hash: &Hash, bytes: &[u8]) -> Result<(), SyncError> {
        if self.contains(hash) {
            return Ok(());
        }
        if self.mem_bytes + bytes.len() <= self.budget {
            self.mem_bytes += bytes.len();
            self.mem.insert(*hash, Arc::new(bytes.to_vec()));
            return Ok(());
        }
        self.spill(hash, bytes)
    }

    /// [`Staging::put_verified`] taking the bytes, kept without a copy.
    pub fn put_owned(&mut self, hash: Hash, bytes: Vec<u8>) -> Result<(), SyncError> {
        if self.contains(&hash) {
            return Ok(());
        }
        if self.mem_bytes + bytes.len() <= self.budget {
            self.mem_bytes += bytes.len();
            self.mem.insert(hash, Arc::new(bytes));
            return Ok(());
        }
        self.spill(&hash, &bytes)
    }

    fn spill(&mut self, hash: &Hash, bytes: &[u8]) -> Result<(), SyncError> {
        // One writer (the store is `&mut`), so a fixed temp name per hash
        // cannot collide.
        let tmp = self.dir.join(format!(".incoming-{hash}"));
        let mut f = std::fs::File::create(&tmp).io_ctx(|| format!("staging object {hash}"))?;
        f.write_all(bytes)
            .io_ctx(|| format!("staging object {hash}"))?;
        drop(f);
        std::fs::rename(&tmp, self.path_of(hash)).io_ctx(|| format!("staging object {hash}"))?;
        self.spilled.insert(*hash);
        Ok(())
    }

    /// The bytes of an object staged in memory (verified on arrival).
    pub fn in_memory(&self, hash: &Hash) -> Option<&[u8]> {
        self.mem.get(hash).map(|b| &b[..])
    }

    /// An object staged in memory, shared without a copy.
    pub fn shared(&self, hash: &Hash) -> Option<Arc<Vec<u8>>> {
        self.mem.get(hash).cloned()
    }

    /// The bytes of a staged object. A spilled object is verified again
    /// (the disk under the staging area is not trusted more than the wire);
    /// a corrupt copy is dropped and reported as not held.
    pub fn read(&mut self, hash: &Hash) -> Result<Option<Cow<'_, [u8]>>, SyncError> {
        if self.mem.contains_key(hash) {
            return Ok(self.in_memory(hash).map(Cow::Borrowed));
        }
        Ok(self.read_spilled(hash)?.map(Cow::Owned))
    }

    /// The bytes of a spilled object, verified; `None` when not spilled.
    pub fn read_spilled(&mut self, hash: &Hash) -> Result<Option<Vec<u8>>, SyncError> {
        if !self.spilled.contains(hash) {
            return Ok(None);
        }
        let path = self.path_of(hash);
        let bytes = std::fs::read(&path).io_ctx(|| format!("reading staged object {hash}"))?;
        if hash.verify(&bytes).is_err() {
            tracing::warn!(%hash, path = %path.display(), "staged object is corrupt; dropping it");
            self.remove(hash);
            return Ok(None);
        }
        Ok(Some(bytes))
    }

    pub fn remove(&mut self, hash: &Hash) {
        if let Some(b) = self.mem.remove(hash) {
            self.mem_bytes -= b.len();
        } else if self.spilled.remove(hash) {
            let _ = std::fs::remove_file(self.path_of(hash));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_beyond_the_budget_spill_to_files_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Staging::with_budget(dir.path().join("objects"), 10).unwrap();
        let objs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i; 4]).collect();
        for o in &objs {
            s.put_verified(&Hash::of(o), o).unwrap();
        }
        assert_eq!((s.len(), s.spilled_len()), (4, 2), "8 bytes fit in 10");
        let files = std::fs::read_dir(dir.path().join("objects"))
            .unwrap()
            .count();
        assert_eq!(files, 2);
        for o in &objs {
            assert_eq!(s.read(&Hash::of(o)).unwrap().unwrap().as_ref(), &o[..]);
        }
        for o in &objs {
            s.remove(&Hash::of(o));
        }
        assert_eq!(s.len(), 0);
        assert_eq!(s.mem_bytes, 0);
        let files = std::fs::read_dir(dir.path().join("objects"))
            .unwrap()
            .count();
        assert_eq!(files, 0, "spilled files are removed with their object");
    }

    #[test]
    fn a_corrupt_spilled_object_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Staging::with_budget(dir.path().join("objects"), 0).unwrap();
        let h = Hash::of(b"abc");
        s.put_verified(&h, b"abc").unwrap();
        std::fs::write(dir.path().join("objects").join(h.to_string()), b"abd").unwrap();
        assert!(s.read(&h).unwrap().is_none());
        assert!(!s.contains(&h));
    }
}
