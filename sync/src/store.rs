use crate::{ChangeCursor, ChangeEntry, Hash, IgnoreRules, SyncError, SyncPath};

/// A store's watermarks with respect to one remote.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Watermarks {
    /// The latest local rev.
    pub current_rev: u64,
    /// How far our changes are acknowledged by that remote (our rev space).
    pub push_cursor: ChangeCursor,
    /// How far we have consumed that remote's changes (its rev space); a
    /// push from that remote advances it too.
    pub fetch_cursor: ChangeCursor,
}

impl Watermarks {
    /// `pushRev` as the contract reports it: the last rev fully pushed.
    pub fn push_rev(&self) -> u64 {
        self.push_cursor.complete_rev()
    }
}

/// What [`Store::open_changes`] decided for a stream after `after`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ChangesWindow {
    /// `{currentRev at open, None}`: nothing beyond it is streamed.
    pub through: ChangeCursor,
    /// True when `after` is older than the tombstone prune horizon: the
    /// reader must restart from [`ChangeCursor::ZERO`] and apply the stream
    /// as a baseline ([`Baseline::Mark`], then [`Baseline::Sweep`]).
    pub baseline: bool,
}

/// How an applied batch takes part in a full baseline (rule 10).
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Baseline {
    /// An ordinary incremental batch.
    #[default]
    Off,
    /// Part of a baseline: remember every listed path.
    Mark,
    /// The last batch of a baseline: remember its paths, then delete every
    /// live path the baseline did not list, and forget the marks.
    Sweep,
}

/// One batch handed to [`Store::apply`].
#[derive(Clone, Debug)]
pub struct ApplyBatch<'a> {
    /// The remote the entries come from (whose fetch cursor moves).
    pub remote: &'a str,
    /// The sender's cursor once this batch is applied, or `None` for an
    /// external writer (`senderRev == 0`, rule 5): entries are then ordinary
    /// local writes and no watermark moves.
    pub sender: Option<ChangeCursor>,
    pub entries: &'a [ChangeEntry],
    pub baseline: Baseline,
    /// The sender's exclusions, which no apply deletes (rule 11): a `Sweep`
    /// leaves alone every live path they match, and that path's ancestors,
    /// since the sender never lists what it excludes; a delete of a
    /// directory removes only what holds nothing they match
    /// ([`IgnoreRules::delete_sparing`]), and the directory stays if
    /// anything below it was spared. A file or symlink replacing a
    /// directory that holds anything they match is refused (`EINVAL`), or
    /// by a receiver keeping conflict copies, the directory is moved aside.
    pub ignore: &'a IgnoreRules,
}

/// What one [`Store::apply`] did.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct ApplyOutcome {
    /// The store's current rev after the batch.
    pub rev: u64,
    /// The stored fetch cursor for the batch's remote (`appliedPushCursor`).
    pub fetch_cursor: ChangeCursor,
    /// Entries that changed local state.
    pub applied: usize,
    /// Entries skipped because local state already matched (rule 4).
    pub skipped: usize,
    /// Entries that overwrote a local change not yet pushed to that remote
    /// (rule 6: last applier wins, but never silently).
    pub overwrote_local: usize,
}

/// A page request for [`Store::changes`].
#[derive(Clone, Copy, Debug)]
pub struct ChangesQuery<'a> {
    /// Entries strictly after this cursor.
    pub after: &'a ChangeCursor,
    /// ... and at or before this one (from [`Store::open_changes`]).
    pub through: &'a ChangeCursor,
    pub ignore: &'a IgnoreRules,
    /// Leave out paths whose current state was applied from this remote
    /// and not changed locally since, so a peer's own writes are not
    /// echoed back to it.
    pub exclude_applied_from: Option<&'a str>,
    /// At most this many entries. Fewer means the window is exhausted.
    pub limit: usize,
}

/// A sync peer's storage: everything the driver and the RPC server need.
/// The rules every implementation keeps are numbered once in sync/DESIGN.md
/// ("The sync rules") and checked by `testkit` (feature `testkit`).
///
/// Implementations: `wsd_dofs::Dofs` (all in SQLite) and `wsd`'s workspace
/// store (a real directory plus a SQLite index). Every method that mutates
/// is one transaction: it commits whole or changes nothing.
pub trait Store {
    /// The latest committed rev.
    fn current_rev(&mut self) -> Result<u64, SyncError>;

    fn watermarks(&mut self, remote: &str) -> Result<Watermarks, SyncError>;

    /// Fixes the upper bound of a change stream after `after`.
    fn open_changes(&mut self, after: &ChangeCursor) -> Result<ChangesWindow, SyncError>;

    /// Coalesced entries (one per path, its state now) with
    /// `query.after < (rev, path) <= query.through`, ordered by
    /// `(rev, path)` byte-wise. A path whose current rev is beyond `through`
    /// is deferred (left out). Memory is bounded by `limit`, not the tree.
    fn changes(&mut self, query: ChangesQuery<'_>) -> Result<Vec<ChangeEntry>, SyncError>;

    /// One path's current state: live entry, else newest tombstone, else none.
    fn read_entry(&mut self, path: &SyncPath) -> Result<Option<ChangeEntry>, SyncError>;

    /// The subset of `hashes` held as complete objects, in input order.
    fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError>;

    /// The verified bytes of one object; `EUNKNOWN_HASH` when not held.
    fn read_object(&mut self, hash: &Hash) -> Result<Vec<u8>, SyncError>;

    /// The objects for `hashes`, in order, each as [`Store::read_object`]
    /// gives it; the first error ends the call. A store may override it to
    /// read a batch in one transaction.
    fn read_objects(&mut self, hashes: &[Hash]) -> Result<Vec<crate::Object>, SyncError> {
        hashes
            .iter()
            .map(|h| {
                Ok(crate::Object {
                    hash: *h,
                    bytes: self.read_object(h)?,
                })
            })
            .collect()
    }

    /// A reader of the objects `wanted` names (hash and size), which a
    /// sender asks for one after another in that order, each into the
    /// buffer it goes out in ([`Remote::push_objects_from`]). By default it
    /// reads them all at once with [`Store::read_objects`] and copies each
    /// out; a store that can read an object straight into a buffer (the
    /// workspace store, from the file holding it) overrides it, so the bytes
    /// are copied once, not twice, on their way to the wire.
    ///
    /// [`Remote::push_objects_from`]: crate::Remote::push_objects_from
    fn object_reader<'a>(
        &'a mut self,
        wanted: &[(Hash, u32)],
    ) -> Result<Box<dyn ObjectReader + 'a>, SyncError> {
        let hashes: Vec<Hash> = wanted.iter().map(|(h, _)| *h).collect();
        Ok(Box::new(ReadObjects {
            objects: self.read_objects(&hashes)?.into_iter(),
        }))
    }

    /// Stores objects after checking `sha256(bytes) == hash` for each; a
    /// mismatch stores nothing from the bad object and fails with
    /// `EPROTOCOL`.
    fn stage_objects(&mut self, objects: &[crate::Object]) -> Result<(), SyncError>;

    /// [`Store::stage_objects`] for objects the caller already checked with
    /// [`crate::Object::check`] (a server verifies them on its network
    /// thread, off the store's single writer thread). A store may skip its
    /// own check and keep the bytes without copying; by default it checks
    /// again.
    fn stage_checked_objects(&mut self, objects: Vec<crate::Object>) -> Result<(), SyncError> {
        self.stage_objects(&objects)
    }

    /// Applies a batch atomically (rules 3–6, 10, 11, 13): all entries or none; a
    /// chunk that is not held fails with `EUNKNOWN_HASH` and changes
    /// nothing. With a sender cursor, the remote's fetch cursor advances to
    /// it (never backwards) in the same transaction.
    fn apply(&mut self, batch: ApplyBatch<'_>) -> Result<ApplyOutcome, SyncError>;

    /// Housekeeping a server runs once its peers have gone quiet for a
    /// moment (after a push), so that the next request does not pay for
    /// it: the workspace store settles the paths its watcher reported,
    /// including those its own applies wrote. By default nothing.
    fn idle(&mut self) -> Result<(), SyncError> {
        Ok(())
    }

    /// Sets the push cursor for `remote` (forward after a push, or back to
    /// zero for a re-baseline). Beyond the current rev it is `EINVAL`;
    /// moving it back clears `remote`'s echo markers in the same
    /// transaction (it lost state, so nothing we hold is its echo).
    fn set_push_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError>;

    /// Sets the fetch cursor for `remote` exactly (used to reset it to zero
    /// when the remote's log turned out shorter than our cursor); moving it
    /// back clears `remote`'s echo markers as for the push cursor.
    fn set_fetch_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError>;
}

/// Objects a sender reads one at a time into the buffers they are sent in
/// ([`Store::object_reader`]).
pub trait ObjectReader {
    /// Writes the bytes of `hash` into `buf`, which is exactly as long as
    /// the object (the size its chunk reference gives), in the order the
    /// reader was made for. The errors are [`Store::read_object`]'s, and an
    /// object of another size is `EIO`.
    fn read_into(&mut self, hash: &Hash, buf: &mut [u8]) -> Result<(), SyncError>;
}

/// The default [`ObjectReader`]: objects read ahead, copied out in order.
struct ReadObjects {
    objects: std::vec::IntoIter<crate::Object>,
}

impl ObjectReader for ReadObjects {
    fn read_into(&mut self, hash: &Hash, buf: &mut [u8]) -> Result<(), SyncError> {
        let object = self
            .objects
            .next()
            .filter(|o| o.hash == *hash)
            .ok_or_else(|| SyncError::Storage(format!("object {hash} was read out of order")))?;
        if object.bytes.len() != buf.len() {
            return Err(SyncError::Storage(format!(
                "object {hash} holds {} bytes, its chunk reference says {}",
                object.bytes.len(),
                buf.len()
            )));
        }
        buf.copy_from_slice(&object.bytes);
        Ok(())
    }
}
