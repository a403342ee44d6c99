//! The staging area: verified objects that arrived before the entries that
//! use them, one file per object named by its hash, in
//! `state_dir/objects/`. Objects that live in the directory are never
//! copied here; the index points at them instead (`chunks` table).

use std::collections::HashSet;
use std::io::Write;
use std::path::PathBuf;

use wsd_sync::{Hash, SyncError};

use super::error::IoContext;

#[derive(Debug)]
pub(crate) struct Staging {
    dir: PathBuf,
    held: HashSet<Hash>,
}

impl Staging {
    /// Opens the staging area, dropping whatever a previous run left: it
    /// was either linked into files already or belongs to a batch that never
    /// arrived, and a sender re-sends what `has_objects` says is missing.
    pub fn open(dir: PathBuf) -> Result<Staging, SyncError> {
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(SyncError::io(format!("clearing {}", dir.display()), e)),
        }
        std::fs::create_dir_all(&dir).io_ctx(|| format!("creating {}", dir.display()))?;
        Ok(Staging {
            dir,
            held: HashSet::new(),
        })
    }

    fn path_of(&self, hash: &Hash) -> PathBuf {
        self.dir.join(hash.to_string())
    }

    pub fn contains(&self, hash: &Hash) -> bool {
        self.held.contains(hash)
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Stores bytes already verified to hash to `hash`: written to a temp
    /// name, then renamed, so a crash never leaves a truncated object under
    /// its hash.
    pub fn put_verified(&mut self, hash: &Hash, bytes: &[u8]) -> Result<(), SyncError> {
        if self.held.contains(hash) {
            return Ok(());
        }
        // One writer (the store is `&mut`), so a fixed temp name per hash
        // cannot collide.
        let tmp = self.dir.join(format!(".incoming-{hash}"));
        let mut f = std::fs::File::create(&tmp).io_ctx(|| format!("staging object {hash}"))?;
        f.write_all(bytes)
            .io_ctx(|| format!("staging object {hash}"))?;
        drop(f);
        std::fs::rename(&tmp, self.path_of(hash)).io_ctx(|| format!("staging object {hash}"))?;
        self.held.insert(*hash);
        Ok(())
    }

    /// The bytes of a staged object, verified again (the disk under the
    /// staging area is not trusted more than the wire). A corrupt copy is
    /// dropped and reported as not held.
    pub fn read(&mut self, hash: &Hash) -> Result<Option<Vec<u8>>, SyncError> {
        if !self.held.contains(hash) {
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
        if self.held.remove(hash) {
            let _ = std::fs::remove_file(self.path_of(hash));
        }
    }
}
