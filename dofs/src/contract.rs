//! `Dofs` runs the one Store contract suite (`wsd_sync::testkit`).

use wsd_sync::testkit::{LocalOp, StoreUnderTest};
use wsd_sync::{SyncError, SyncPath};

use crate::{Dofs, WriteOptions};

fn parents(d: &mut Dofs, path: &SyncPath) -> Result<(), SyncError> {
    if let Some(parent) = path.parent()
        && !d.exists(&parent)?
    {
        d.mkdir(&parent, true)?;
    }
    Ok(())
}

impl StoreUnderTest for Dofs {
    fn local(&mut self, op: &LocalOp) -> Result<(), SyncError> {
        match op {
            LocalOp::Write { path, bytes, mode } => {
                let opts = WriteOptions {
                    mode: Some(*mode),
                    create_parents: true,
                    ..WriteOptions::default()
                };
                self.write_file_with(&SyncPath::new(path.as_str())?, &bytes[..], opts)?;
            }
            LocalOp::Mkdir { path, mode } => {
                let path = SyncPath::new(path.as_str())?;
                self.mkdir(&path, true)?;
                self.chmod(&path, *mode)?;
            }
            LocalOp::Symlink { path, target } => {
                let path = SyncPath::new(path.as_str())?;
                parents(self, &path)?;
                self.symlink(target, &path)?;
            }
            LocalOp::Remove { path } => self.rm(&SyncPath::new(path.as_str())?, true)?,
            LocalOp::Rename { from, to } => {
                let to = SyncPath::new(to.as_str())?;
                parents(self, &to)?;
                self.rename(&SyncPath::new(from.as_str())?, &to)?;
            }
            LocalOp::Chmod { path, mode } => self.chmod(&SyncPath::new(path.as_str())?, *mode)?,
        }
        Ok(())
    }

    fn prune(&mut self) -> Result<bool, SyncError> {
        self.prune_tombstones()?;
        Ok(true)
    }
}

wsd_sync::store_conformance_tests!(|| Dofs::open_in_memory().unwrap(), 256);

/// The same suite with chunk bytes in an (in-memory) object store, shared
/// by every case as a bucket is by every workspace.
#[cfg(feature = "s3")]
mod with_chunks_in_an_object_store {
    use std::sync::{Arc, OnceLock};

    use crate::{Dofs, ObjectChunks, SharedChunkStore};

    fn bucket() -> SharedChunkStore {
        static BUCKET: OnceLock<SharedChunkStore> = OnceLock::new();
        BUCKET
            .get_or_init(|| {
                Arc::new(
                    ObjectChunks::over(
                        Arc::new(object_store::memory::InMemory::new()),
                        "contract",
                        "memory://contract".into(),
                        crate::DEFAULT_DEADLINE,
                    )
                    .unwrap(),
                )
            })
            .clone()
    }

    fn store() -> Dofs {
        let mut d = Dofs::open_in_memory().unwrap();
        d.keep_chunks_in(bucket());
        d
    }

    wsd_sync::store_conformance_tests!(store, 64);
}
