//! dofs: the authority-side filesystem in one SQLite database.
//!
//! A [`Dofs`] holds one workspace tree — files (content-defined chunks named
//! by SHA-256, and a manifest hash per file), directories and symlinks with
//! their modes and mtimes — together with everything sync needs: a
//! `(rev, path)` change index covering live paths and tombstones, per-remote
//! watermarks, echo markers ("applied from remote R") and baseline marks. It
//! offers a small POSIX-like API ([`Dofs::write_file`], [`Dofs::rename`],
//! [`Dofs::readdir`], [`Dofs::search`], ...) and implements
//! [`wsd_sync::Store`], so the sync driver can push to and pull from it.
//! Every mutation is one SQLite transaction stamping exactly one new rev.
//! The on-disk format is described in `dofs/DESIGN.md`.
//!
//! It deliberately does not: follow symlinks (they are opaque nodes, and a
//! path through one is `ENOTDIR`); keep hardlinks, owners, xattrs or atimes;
//! update parent directory mtimes; talk to the network or run commands
//! (that is `wsd` and the kernel); share its connection between threads
//! (one `Dofs` is one writer; callers serialise on it, e.g. behind
//! `spawn_blocking`); or collect garbage on its own ([`Dofs::collect_garbage`]
//! is explicit).

mod checkpoint;
mod chunk_store;
mod error;
mod fs;
mod integrity;
#[cfg(feature = "s3")]
mod object_chunks;
// Only `PackSlot` (a chunk's place in a pack, kept in the index) is used
// without the S3 store; the pack codec is the S3 store's.
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
mod pack;
mod rows;
mod schema;
#[cfg(all(feature = "s3", any(test, feature = "testkit")))]
pub mod seaweedfs;
mod snapshot;
mod sql;
mod sync;

use std::path::Path;

use rusqlite::{Connection, OptionalExtension};

pub use chunk_store::{BegunPut, ChunkStore, PackSlot, PendingPut, SharedChunkStore, SqliteChunks};
pub use error::DofsError;
pub use fs::{
    DEFAULT_DIR_MODE, DEFAULT_FILE_MODE, DEFAULT_SYMLINK_MODE, DirEntry, LineWindow, SearchHit,
    Stat, WriteOptions,
};
#[cfg(feature = "s3")]
pub use object_chunks::{
    Credentials, DEFAULT_DEADLINE, EachStore, ObjectChunks, PACK_BYTES, REPACK_DEAD_SHARE,
    StaleObject, SweepOutcome,
};
pub use schema::SCHEMA_VERSION;
pub use snapshot::{DiffKind, RestoreOutcome, SnapshotSummary};
pub use sync::{GcOutcome, PruneOutcome};
pub use wsd_sqlite::OnDamage;

/// One workspace's filesystem and sync state in one SQLite database, on one
/// connection (the single writer).
pub struct Dofs {
    /// Waits, on close, for a background checkpoint of the file to end
    /// (declared before `conn`: fields drop in order); `None` in memory.
    _checkpoints: Option<checkpoint::Closing>,
    conn: Connection,
    /// Where new chunk bytes go when not into `conn` (see
    /// [`Dofs::keep_chunks_in`]).
    objects: Option<SharedChunkStore>,
    /// Batches `stage_objects` left uploading to `objects`, oldest first:
    /// their index rows commit once the uploads succeeded (by the next
    /// sync call, see `sync/objects.rs`).
    staged: Vec<chunk_store::StagedChunks>,
    /// Stamps the file clean after `conn` closes (declared after it: fields
    /// drop in order); `None` in memory.
    _clean_close: Option<wsd_sqlite::CleanClose>,
}

impl std::fmt::Debug for Dofs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dofs")
            .field("conn", &self.conn)
            .field("objects", &self.objects.is_some())
            .finish_non_exhaustive()
    }
}

impl Dofs {
    /// Opens (creating if needed, migrating if older) the database at `path`.
    /// A database written by a newer build is refused
    /// ([`wsd_sqlite::OpenError::NewerMigration`]); so is a damaged one
    /// ([`wsd_sqlite::OpenError::Damaged`], naming the file and how to set
    /// it aside), since nothing could rebuild what it held.
    pub fn open(path: impl AsRef<Path>) -> Result<Dofs, DofsError> {
        Dofs::open_with(path, OnDamage::Refuse)
    }

    /// [`Dofs::open`], with `on_damage` deciding what happens to a file
    /// that fails the crash check: [`OnDamage::SetAside`] renames it to
    /// `NAME.corrupt-<UTC time>` and starts an empty store.
    pub fn open_with(path: impl AsRef<Path>, on_damage: OnDamage) -> Result<Dofs, DofsError> {
        let path = path.as_ref();
        let opened = wsd_sqlite::open(path, &schema::setup(on_damage))?;
        let mut dofs = Dofs {
            _checkpoints: None,
            conn: opened.conn,
            objects: None,
            staged: Vec::new(),
            _clean_close: Some(opened.clean_close),
        };
        // Checkpoints run beside the writer (`checkpoint.rs`), found again
        // by absolute path whatever the working directory becomes.
        let abs = std::path::absolute(path)
            .map_err(|e| wsd_sync::SyncError::io(format!("resolving {}", path.display()), e))?;
        dofs._checkpoints = Some(checkpoint::install(&mut dofs.conn, abs)?);
        Ok(dofs)
    }

    /// A private database that lives as long as the value (tests, scratch).
    pub fn open_in_memory() -> Result<Dofs, DofsError> {
        Ok(Dofs {
            _checkpoints: None,
            conn: wsd_sqlite::open_in_memory(&schema::setup(OnDamage::Refuse))?,
            objects: None,
            staged: Vec::new(),
            _clean_close: None,
        })
    }

    /// Keeps the bytes of chunks stored from now on in `objects` (an object
    /// store, e.g. [`ObjectChunks`]), with this database as the durable
    /// index of what it holds for this tree: a sync then asks the object
    /// store nothing about chunks the index knows. Chunks already held in
    /// the database stay readable there. Every object is stored before the
    /// row that indexes it commits; every byte read back is hash-verified.
    pub fn keep_chunks_in(&mut self, objects: SharedChunkStore) {
        self.objects = Some(objects);
    }

    /// Whether some chunk's bytes are in an object store (so opening this
    /// database without one cannot serve them).
    pub fn keeps_chunks_elsewhere(&self) -> Result<bool, DofsError> {
        Ok(self
            .conn
            .query_row(
                "SELECT 1 FROM meta WHERE key = 'chunks_elsewhere'",
                [],
                |_| Ok(()),
            )
            .optional()?
            .is_some())
    }

    /// The chunks as reads see them (the table, and the object store).
    pub(crate) fn chunks(&self) -> chunk_store::Chunks<'_> {
        chunk_store::Chunks::new(&self.conn, self.objects.as_deref())
    }

    /// The latest committed rev (0 before the first mutation).
    pub fn current_rev(&self) -> Result<u64, DofsError> {
        rows::current_rev(&self.conn)
    }

    /// This database's incarnation: a random number drawn when it was
    /// created, so readers can tell a re-created store (whose revs start
    /// over) from this one.
    pub fn incarnation(&self) -> Result<u64, DofsError> {
        rows::meta(&self.conn, "incarnation")
    }

    /// Calls `f` whenever a transaction on this store commits (a new rev,
    /// or bookkeeping such as watermarks), replacing any earlier listener.
    /// It runs inside the commit, under the caller's lock on this store:
    /// it must only wake someone (who then reads the store when the lock
    /// is free), never touch the store itself.
    pub fn on_commit(&mut self, mut f: impl FnMut() + Send + 'static) -> Result<(), DofsError> {
        self.conn.commit_hook(Some(move || {
            f();
            // `false` lets the commit go ahead.
            false
        }))?;
        Ok(())
    }
}

#[cfg(test)]
mod contract;

#[cfg(all(test, feature = "s3"))]
mod object_tests;

#[cfg(test)]
pub(crate) mod test_util {
    use wsd_sync::SyncPath;

    use crate::{Dofs, WriteOptions};

    pub fn p(s: &str) -> SyncPath {
        SyncPath::new(s).unwrap()
    }

    pub fn store() -> Dofs {
        Dofs::open_in_memory().unwrap()
    }

    /// Writes `bytes` at `path`, creating parents.
    pub fn put(d: &mut Dofs, path: &str, bytes: &[u8]) {
        let opts = WriteOptions {
            create_parents: true,
            ..WriteOptions::default()
        };
        d.write_file_with(&p(path), bytes, opts).unwrap();
    }

    /// Deterministic bytes that do not repeat (so they cut into many chunks).
    pub fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }
}
