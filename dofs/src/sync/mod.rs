//! `impl wsd_sync::Store for Dofs`: the authority side of the sync protocol.

mod apply;
mod changes;
mod objects;
mod watermarks;

pub use objects::GcOutcome;
pub use watermarks::PruneOutcome;

use wsd_sync::{
    ApplyBatch, ApplyOutcome, ChangeCursor, ChangeEntry, ChangesQuery, ChangesWindow, Hash, Object,
    Store, SyncError, SyncPath, Watermarks,
};

use crate::Dofs;

/// Every call but `stage_objects` first settles the uploads staging left
/// running (`Dofs::settle_staged`; `apply` does it in its own
/// transaction), so each sees every staged chunk indexed.
impl Store for Dofs {
    fn current_rev(&mut self) -> Result<u64, SyncError> {
        self.settle_staged()?;
        Ok(Dofs::current_rev(self)?)
    }

    fn watermarks(&mut self, remote: &str) -> Result<Watermarks, SyncError> {
        self.settle_staged()?;
        Ok(self.remote_watermarks(remote)?)
    }

    fn open_changes(&mut self, after: &ChangeCursor) -> Result<ChangesWindow, SyncError> {
        self.settle_staged()?;
        Ok(self.open_changes_inner(after)?)
    }

    fn changes(&mut self, query: ChangesQuery<'_>) -> Result<Vec<ChangeEntry>, SyncError> {
        self.settle_staged()?;
        Ok(self.changes_inner(query)?)
    }

    fn read_entry(&mut self, path: &SyncPath) -> Result<Option<ChangeEntry>, SyncError> {
        self.settle_staged()?;
        Ok(self.read_entry_inner(path)?)
    }

    fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        self.settle_staged()?;
        Ok(self.has_objects_inner(hashes)?)
    }

    fn read_object(&mut self, hash: &Hash) -> Result<Vec<u8>, SyncError> {
        self.settle_staged()?;
        Ok(self.read_object_inner(hash)?)
    }

    fn read_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Object>, SyncError> {
        self.settle_staged()?;
        Ok(self.read_objects_inner(hashes)?)
    }

    fn stage_objects(&mut self, objects: &[Object]) -> Result<(), SyncError> {
        Ok(self.stage_objects_inner(objects)?)
    }

    fn apply(&mut self, batch: ApplyBatch<'_>) -> Result<ApplyOutcome, SyncError> {
        Ok(self.apply_inner(batch)?)
    }

    fn set_push_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        self.settle_staged()?;
        Ok(self.set_push_cursor_inner(remote, cursor)?)
    }

    fn set_fetch_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        self.settle_staged()?;
        Ok(self.set_fetch_cursor_inner(remote, cursor)?)
    }
}
