//! Where chunk bytes live: the [`ChunkStore`] seam (put-if-absent, get,
//! has, by hash) and its embedded default, [`SqliteChunks`], the `chunks`
//! table of the dofs database itself.
//!
//! A [`crate::Dofs`] given an object store ([`crate::Dofs::keep_chunks_in`])
//! keeps new chunk bytes there instead, and its `chunks` table becomes the
//! index of what that store holds for it: a row with empty `data` (a
//! "stub") says the bytes are in the object store. The index is durable
//! (it survives restarts), holds exactly what the workspace references
//! plus what garbage collection has not yet freed, and answers the sync
//! probes, so a sync does not ask the object store per chunk. An object is
//! stored before the row indexing it commits, so a committed row never
//! names an object that was never written. A stub also records where the
//! store put the chunk when that is a byte range of a pack (many chunks in
//! one object, [`PackSlot`]; columns `pack`, `pack_offset`), so reads go
//! straight to the range. [`Chunks`] is that logic.
//!
//! Every byte read back through a store is hash-verified: a chunk whose
//! bytes do not hash to its name is [`DofsError::CorruptChunk`] naming the
//! hash, never content handed to a caller.

use std::collections::HashSet;
use std::ops::ControlFlow;

use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, params};
use wsd_sync::{Hash, SyncError};

use crate::DofsError;
pub use crate::pack::PackSlot;
use crate::sql::hash_from_sql;

/// Hashes per `IN (...)` probe: bounded statements whatever the request.
const PROBE_WINDOW: usize = 256;

/// A content-addressed store of chunks, named by the SHA-256 of their bytes.
pub trait ChunkStore {
    /// Stores `bytes` under `hash` unless it is already held; `true` when
    /// this call stored it. The caller has named the bytes correctly
    /// (chunking computed the hash, or the object was verified on receipt).
    fn put_if_absent(&self, hash: &Hash, bytes: &[u8]) -> Result<bool, DofsError>;

    /// The bytes of `hash`, verified against it: a missing chunk is
    /// `EUNKNOWN_HASH`, a damaged one [`DofsError::CorruptChunk`].
    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError>;

    /// Which of `hashes` are held, in input order (duplicates kept).
    fn has(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError>;

    /// [`ChunkStore::put_if_absent`] of each of `chunks`, answering where
    /// each one (in input order) is held now: `Some` for a byte range of a
    /// pack, `None` under its own name. A store that can send several at
    /// once (an object store, in packs) overrides it.
    fn put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<Vec<Option<PackSlot>>, DofsError> {
        for (hash, bytes) in chunks {
            self.put_if_absent(hash, bytes)?;
        }
        Ok(vec![None; chunks.len()])
    }

    /// [`ChunkStore::get`] of each of `hashes`, in order; the first error
    /// ends the call. An object store overrides it to fetch several at once.
    fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Vec<u8>>, DofsError> {
        hashes.iter().map(|h| self.get(h)).collect()
    }

    /// [`ChunkStore::put_many`] that may answer before the uploads end:
    /// the places are final, but a record naming one of them may commit
    /// only once [`BegunPut::pending`] (when set) has
    /// [`PendingPut::finish`]ed without error. A store that sends nothing
    /// in the background keeps the default (`put_many`, nothing pending).
    fn begin_put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<BegunPut, DofsError> {
        Ok(BegunPut {
            places: self.put_many(chunks)?,
            pending: None,
        })
    }

    /// [`ChunkStore::get_many`] of chunks whose place the caller recorded
    /// (from [`ChunkStore::put_many`] or [`ChunkStore::locate`]): a packed
    /// one is read as a range of its pack, verified as any read.
    fn get_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Vec<u8>>, DofsError> {
        let hashes: Vec<Hash> = chunks.iter().map(|(h, _)| *h).collect();
        self.get_many(&hashes)
    }

    /// [`ChunkStore::has`] with where each held chunk is: for a caller
    /// that indexes them (a recovery, with no record of its own).
    fn locate(&self, hashes: &[Hash]) -> Result<Vec<(Hash, Option<PackSlot>)>, DofsError> {
        Ok(self.has(hashes)?.into_iter().map(|h| (h, None)).collect())
    }

    /// Whether a new record may name `hash` at `slot` (a pack range, or
    /// `None`: its own object): not while a collection in progress may
    /// delete that object (a fork then copies the bytes instead).
    fn lasting_place(&self, _hash: &Hash, _slot: Option<PackSlot>) -> bool {
        true
    }

    /// Which of `chunks` are not where the caller's record says they are
    /// (a pack range, or `None`: an object of its own), in input order:
    /// the integrity check of an index. A store with no places answers by
    /// hash.
    fn missing_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Hash>, DofsError> {
        let hashes: Vec<Hash> = chunks.iter().map(|(h, _)| *h).collect();
        let held: HashSet<Hash> = self.has(&hashes)?.into_iter().collect();
        Ok(hashes.into_iter().filter(|h| !held.contains(h)).collect())
    }
}

/// What [`ChunkStore::begin_put_many`] answers: where each chunk is (in
/// input order, as [`ChunkStore::put_many`] answers), and the uploads
/// still running, if any.
#[derive(Debug)]
pub struct BegunPut {
    pub places: Vec<Option<PackSlot>>,
    pub pending: Option<PendingPut>,
}

/// Uploads a store has started and not yet seen end: waiting for them
/// ([`PendingPut::finish`]) answers whether they all succeeded, and only
/// then may a record name their places. Dropped unfinished, the uploads
/// run on unrecorded (what they stored is an orphan to the sweep).
pub struct PendingPut {
    wait: Box<dyn FnOnce() -> Result<(), DofsError> + Send>,
}

impl PendingPut {
    /// Uploads that `wait` waits for (and records in the store's own
    /// state once they succeeded).
    pub fn new(wait: impl FnOnce() -> Result<(), DofsError> + Send + 'static) -> PendingPut {
        PendingPut {
            wait: Box::new(wait),
        }
    }

    /// Waits for the uploads: an error names the object that failed and
    /// the store.
    pub fn finish(self) -> Result<(), DofsError> {
        (self.wait)()
    }
}

impl std::fmt::Debug for PendingPut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingPut").finish_non_exhaustive()
    }
}

/// A batch whose chunks are being sent to the object store: the index
/// rows that name them ([`Chunks::index_stored`]'s input), to commit
/// only with or after a successful [`PendingPut::finish`].
#[derive(Debug)]
pub(crate) struct StagedChunks {
    pub(crate) rows: Vec<(Hash, usize, Option<PackSlot>)>,
    pub(crate) pending: PendingPut,
}

/// The object store a [`crate::Dofs`] keeps chunk bytes in, when it has one.
pub type SharedChunkStore = std::sync::Arc<dyn ChunkStore + Send + Sync>;

impl std::fmt::Debug for dyn ChunkStore + Send + Sync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("dyn ChunkStore")
    }
}

/// Bytes of chunks a write gathers before sending them to an object store
/// together (they go out concurrently).
const UPLOAD_BATCH_BYTES: usize = 8 << 20;

/// Checks that `bytes` are what `hash` names.
pub(crate) fn verified(hash: &Hash, bytes: Vec<u8>) -> Result<Vec<u8>, DofsError> {
    if Hash::of(&bytes) == *hash {
        Ok(bytes)
    } else {
        Err(DofsError::CorruptChunk { hash: *hash })
    }
}

/// The `chunks` table of a dofs database, on the connection (and inside
/// whatever transaction) it is given: a write's chunks commit or roll back
/// with the write itself.
#[derive(Clone, Copy, Debug)]
pub struct SqliteChunks<'c> {
    conn: &'c Connection,
}

impl<'c> SqliteChunks<'c> {
    pub(crate) fn new(conn: &'c Connection) -> SqliteChunks<'c> {
        SqliteChunks { conn }
    }
}

impl SqliteChunks<'_> {
    /// Stamps the held chunks among `hashes` as stored at `now` (an
    /// in-place write of the row's last column).
    pub(crate) fn touch(&self, hashes: &[Hash], now: i64) -> Result<(), DofsError> {
        for window in hashes.chunks(PROBE_WINDOW) {
            let placeholders = vec!["?"; window.len()].join(",");
            let mut stmt = self.conn.prepare_cached(&format!(
                "UPDATE chunks SET stored_at = ?1 WHERE stored_at < ?1 AND hash IN ({placeholders})"
            ))?;
            let params: Vec<Value> = std::iter::once(Value::Integer(now))
                .chain(window.iter().map(|h| Value::Blob(h.0.to_vec())))
                .collect();
            stmt.execute(rusqlite::params_from_iter(params))?;
        }
        Ok(())
    }
}

impl ChunkStore for SqliteChunks<'_> {
    /// A chunk already held is stamped fresh instead (`stored_at`), so
    /// the grace window of garbage collection covers it again.
    fn put_if_absent(&self, hash: &Hash, bytes: &[u8]) -> Result<bool, DofsError> {
        let now = crate::sql::now_ms();
        let inserted = self
            .conn
            .prepare_cached(
                "INSERT INTO chunks (hash, size, data, stored_at) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (hash) DO NOTHING",
            )?
            .execute(params![hash.as_bytes(), bytes.len() as u64, bytes, now])?;
        if inserted == 0 {
            self.touch(std::slice::from_ref(hash), now)?;
        }
        Ok(inserted == 1)
    }

    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT data FROM chunks WHERE hash = ?1")?;
        match stmt
            .query_row([hash.as_bytes()], |r| r.get::<_, Vec<u8>>(0))
            .optional()?
        {
            Some(bytes) => verified(hash, bytes),
            None => Err(SyncError::UnknownHash {
                hash: *hash,
                path: None,
            }
            .into()),
        }
    }

    fn has(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        let mut out = Vec::with_capacity(hashes.len());
        for window in hashes.chunks(PROBE_WINDOW) {
            let placeholders = vec!["?"; window.len()].join(",");
            let mut stmt = self.conn.prepare_cached(&format!(
                "SELECT hash FROM chunks WHERE hash IN ({placeholders}) AND length(data) = size"
            ))?;
            let params: Vec<Value> = window.iter().map(|h| Value::Blob(h.0.to_vec())).collect();
            let held: HashSet<Hash> = stmt
                .query_map(rusqlite::params_from_iter(params), |r| {
                    hash_from_sql(r.get(0)?, 0)
                })?
                .collect::<Result<_, _>>()?;
            // Input order and duplicates are kept: the caller zips answers
            // with its own list.
            out.extend(window.iter().filter(|h| held.contains(h)));
        }
        Ok(out)
    }
}

/// Chunks fetched from an object store at once while a file is read.
const FETCH_WINDOW: usize = 16;

/// A chunk of a file being read: its bytes from the table, or a stub's
/// place in the object store.
enum Held {
    Here(Vec<u8>),
    Elsewhere(Option<PackSlot>),
}

/// A stub's pack range from the columns `size, pack, pack_offset` that
/// start at `first`.
fn slot_from_row(r: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<Option<PackSlot>> {
    slot_from_columns(r, first, first + 1)
}

/// A stub's pack range from its `size` column at `size` and its `pack,
/// pack_offset` columns starting at `pack` (`None` when not packed).
pub(crate) fn slot_from_columns(
    r: &rusqlite::Row<'_>,
    size: usize,
    pack: usize,
) -> rusqlite::Result<Option<PackSlot>> {
    let id: Option<Vec<u8>> = r.get(pack)?;
    let Some(id) = id else { return Ok(None) };
    Ok(Some(PackSlot {
        pack: hash_from_sql(id, pack)?,
        offset: r.get(pack + 1)?,
        len: r.get(size)?,
    }))
}

/// A dofs database's chunks as its reads and writes see them: the `chunks`
/// table, and the object store its stub rows point into (see the module
/// docs). Without an object store it is the table alone.
#[derive(Clone, Copy)]
pub(crate) struct Chunks<'c> {
    conn: &'c Connection,
    objects: Option<&'c (dyn ChunkStore + Send + Sync)>,
}

impl<'c> Chunks<'c> {
    pub(crate) fn new(
        conn: &'c Connection,
        objects: Option<&'c (dyn ChunkStore + Send + Sync)>,
    ) -> Chunks<'c> {
        Chunks { conn, objects }
    }

    fn table(&self) -> SqliteChunks<'c> {
        SqliteChunks::new(self.conn)
    }

    /// The bytes of stubs' chunks, from the object store.
    fn fetch(&self, stubs: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Vec<u8>>, DofsError> {
        match (self.objects, stubs.first()) {
            (_, None) => Ok(Vec::new()),
            (Some(objects), _) => objects.get_placed(stubs),
            (None, Some((hash, _))) => Err(DofsError::ChunkElsewhere { hash: *hash }),
        }
    }

    /// Where the index says the object store keeps each of `hashes` (a
    /// stub's pack range, or `None`: its own object, or not a stub), in
    /// input order; a hash not indexed is `EUNKNOWN_HASH` naming it.
    pub(crate) fn slots(&self, hashes: &[Hash]) -> Result<Vec<Option<PackSlot>>, DofsError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT size, pack, pack_offset FROM chunks WHERE hash = ?1")?;
        hashes
            .iter()
            .map(|hash| {
                stmt.query_row([hash.as_bytes()], |r| slot_from_row(r, 0))
                    .optional()?
                    .ok_or_else(|| {
                        SyncError::UnknownHash {
                            hash: *hash,
                            path: None,
                        }
                        .into()
                    })
            })
            .collect()
    }

    /// The subset of `hashes` the table indexes as held (here or in the
    /// object store), in input order.
    pub(crate) fn indexed(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        let mut out = Vec::with_capacity(hashes.len());
        for window in hashes.chunks(PROBE_WINDOW) {
            let placeholders = vec!["?"; window.len()].join(",");
            let mut stmt = self.conn.prepare_cached(&format!(
                "SELECT hash FROM chunks WHERE hash IN ({placeholders})
                   AND (length(data) = size OR length(data) = 0)"
            ))?;
            let params: Vec<Value> = window.iter().map(|h| Value::Blob(h.0.to_vec())).collect();
            let held: HashSet<Hash> = stmt
                .query_map(rusqlite::params_from_iter(params), |r| {
                    hash_from_sql(r.get(0)?, 0)
                })?
                .collect::<Result<_, _>>()?;
            out.extend(window.iter().filter(|h| held.contains(h)));
        }
        Ok(out)
    }

    /// The rows among `hashes`, each with the pack it is read from (`None`:
    /// its own object, or bytes held here), in no particular order.
    pub(crate) fn places(&self, hashes: &[Hash]) -> Result<Vec<(Hash, Option<Hash>)>, DofsError> {
        let mut out = Vec::with_capacity(hashes.len());
        for window in hashes.chunks(PROBE_WINDOW) {
            let placeholders = vec!["?"; window.len()].join(",");
            let mut stmt = self.conn.prepare_cached(&format!(
                "SELECT hash, pack FROM chunks WHERE hash IN ({placeholders})"
            ))?;
            let params: Vec<Value> = window.iter().map(|h| Value::Blob(h.0.to_vec())).collect();
            let rows = stmt.query_map(rusqlite::params_from_iter(params), |r| {
                let pack: Option<Vec<u8>> = r.get(1)?;
                Ok((
                    hash_from_sql(r.get(0)?, 0)?,
                    pack.map(|p| hash_from_sql(p, 1)).transpose()?,
                ))
            })?;
            for row in rows {
                out.push(row?);
            }
        }
        Ok(out)
    }

    /// Moves every row reading a chunk of `moved` from its old pack to its
    /// new place (`(chunk, old pack, new slot)`); answers how many moved.
    /// The caller runs it in a transaction.
    pub(crate) fn repoint(&self, moved: &[(Hash, Hash, PackSlot)]) -> Result<usize, DofsError> {
        let mut stmt = self.conn.prepare_cached(
            "UPDATE chunks SET pack = ?1, pack_offset = ?2 WHERE hash = ?3 AND pack = ?4",
        )?;
        let mut n = 0;
        for (hash, from, to) in moved {
            n += stmt.execute(params![
                to.pack.0.to_vec(),
                to.offset,
                hash.as_bytes(),
                from.as_bytes()
            ])?;
        }
        Ok(n)
    }

    /// Index rows for chunks the object store now holds (each with its
    /// size, and its pack range when packed).
    pub(crate) fn index_stored(
        &self,
        chunks: &[(Hash, usize, Option<PackSlot>)],
    ) -> Result<(), DofsError> {
        let now = crate::sql::now_ms();
        let mut stmt = self.conn.prepare_cached(
            "INSERT INTO chunks (hash, size, data, stored_at, pack, pack_offset)
             VALUES (?1, ?2, X'', ?3, ?4, ?5)
             ON CONFLICT (hash) DO NOTHING",
        )?;
        for (hash, size, slot) in chunks {
            stmt.execute(params![
                hash.as_bytes(),
                *size as u64,
                now,
                slot.map(|s| s.pack.0.to_vec()),
                slot.map(|s| s.offset),
            ])?;
        }
        if !chunks.is_empty() {
            // Read at open by whoever must refuse this store without one.
            self.conn
                .prepare_cached(
                    "INSERT INTO meta (key, value) VALUES ('chunks_elsewhere', 1)
                     ON CONFLICT (key) DO NOTHING",
                )?
                .execute([])?;
        }
        Ok(())
    }

    /// Stamps the indexed chunks among `hashes` as stored now.
    pub(crate) fn touch(&self, hashes: &[Hash]) -> Result<(), DofsError> {
        self.table().touch(hashes, crate::sql::now_ms())
    }

    /// Whether `hash` is held (a chunk an apply may link).
    pub(crate) fn holds(&self, hash: &Hash) -> Result<bool, DofsError> {
        Ok(!self.has(std::slice::from_ref(hash))?.is_empty())
    }

    /// [`ChunkStore::put_many`] that may leave the uploads running: the
    /// chunks already indexed are stamped fresh; the others go to the
    /// object store. Answers the batch when its uploads are still running
    /// ([`StagedChunks`]: its rows wait for them); else every row is
    /// written now. Without an object store, the chunks go into the table.
    pub(crate) fn begin_staging(
        &self,
        chunks: &[(Hash, &[u8])],
    ) -> Result<Option<StagedChunks>, DofsError> {
        let Some(objects) = self.objects else {
            self.table().put_many(chunks)?;
            return Ok(None);
        };
        let hashes: Vec<Hash> = chunks.iter().map(|(h, _)| *h).collect();
        let held: HashSet<Hash> = self.indexed(&hashes)?.into_iter().collect();
        let held_list: Vec<Hash> = held.iter().copied().collect();
        self.touch(&held_list)?;
        let mut seen = HashSet::new();
        let new: Vec<(Hash, &[u8])> = chunks
            .iter()
            .filter(|(h, _)| !held.contains(h) && seen.insert(*h))
            .map(|(h, b)| (*h, *b))
            .collect();
        let begun = objects.begin_put_many(&new)?;
        let rows: Vec<(Hash, usize, Option<PackSlot>)> = new
            .iter()
            .zip(begun.places)
            .map(|((h, b), slot)| (*h, b.len(), slot))
            .collect();
        match begun.pending {
            Some(pending) => Ok(Some(StagedChunks { rows, pending })),
            None => {
                self.index_stored(&rows)?;
                Ok(None)
            }
        }
    }

    /// Waits for a staged batch's uploads, then writes its rows.
    pub(crate) fn settle(&self, staged: StagedChunks) -> Result<(), DofsError> {
        staged.pending.finish()?;
        self.index_stored(&staged.rows)
    }

    /// Which of `hashes` have their bytes in the table itself (not in an
    /// object store), in input order.
    pub(crate) fn here(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        self.table().has(hashes)
    }

    /// Calls `each` with the verified bytes of a file's chunks in order: the
    /// one chunk `chunk` when set, else the list recorded for `manifest`. A
    /// listed chunk that is not held is `EUNKNOWN_HASH` naming it. `each`
    /// breaks to stop early. Chunks in an object store are fetched
    /// [`FETCH_WINDOW`] at a time.
    pub(crate) fn for_each_content_chunk(
        &self,
        manifest: &Hash,
        chunk: Option<&Hash>,
        mut each: impl FnMut(&[u8]) -> Result<ControlFlow<()>, DofsError>,
    ) -> Result<(), DofsError> {
        if let Some(hash) = chunk {
            // One chunk: whether `each` breaks changes nothing.
            let _ = each(&self.get(hash)?)?;
            return Ok(());
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT mc.chunk, c.size, c.data, c.pack, c.pack_offset FROM manifest_chunks mc
               LEFT JOIN chunks c ON c.hash = mc.chunk
             WHERE mc.manifest = ?1 ORDER BY mc.idx",
        )?;
        let mut rows = stmt.query([manifest.as_bytes()])?;
        // Chunks waiting for their turn: bytes held here, or a stub (with
        // its pack range, if packed) fetched with the rest of the window.
        let mut window: Vec<(Hash, Held)> = Vec::new();
        while let Some(r) = rows.next()? {
            let hash = hash_from_sql(r.get(0)?, 0)?;
            let size: Option<u64> = r.get(1)?;
            let Some(bytes) = r.get_ref(2)?.as_blob_or_null()? else {
                return Err(SyncError::UnknownHash { hash, path: None }.into());
            };
            if bytes.is_empty() && size.is_some_and(|s| s > 0) {
                window.push((hash, Held::Elsewhere(slot_from_columns(r, 1, 3)?)));
            } else if Hash::of(bytes) != hash {
                return Err(DofsError::CorruptChunk { hash });
            } else if window.is_empty() {
                // Held here with nothing before it waiting: no copy.
                if each(bytes)?.is_break() {
                    return Ok(());
                }
                continue;
            } else {
                window.push((hash, Held::Here(bytes.to_vec())));
            }
            if window.len() >= FETCH_WINDOW && self.drain(&mut window, &mut each)?.is_break() {
                return Ok(());
            }
        }
        self.drain(&mut window, &mut each).map(drop)
    }

    /// Fetches the stubs of `window` together and hands every chunk of it
    /// to `each` in order.
    fn drain(
        &self,
        window: &mut Vec<(Hash, Held)>,
        each: &mut impl FnMut(&[u8]) -> Result<ControlFlow<()>, DofsError>,
    ) -> Result<ControlFlow<()>, DofsError> {
        let stubs: Vec<(Hash, Option<PackSlot>)> = window
            .iter()
            .filter_map(|(h, held)| match held {
                Held::Elsewhere(slot) => Some((*h, *slot)),
                Held::Here(_) => None,
            })
            .collect();
        let mut fetched = self.fetch(&stubs)?.into_iter();
        for (_, held) in window.drain(..) {
            let bytes = match held {
                Held::Here(bytes) => bytes,
                Held::Elsewhere(_) => fetched.next().expect("one fetched chunk per stub"),
            };
            if each(&bytes)?.is_break() {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }
}

impl ChunkStore for Chunks<'_> {
    /// With an object store: a chunk the index holds is stamped fresh (as
    /// in the table alone); another is stored there first, then indexed
    /// where the store keeps it (a chunk it already knows in a pack is
    /// indexed at that range, never as an object it may not have).
    fn put_if_absent(&self, hash: &Hash, bytes: &[u8]) -> Result<bool, DofsError> {
        let Some(objects) = self.objects else {
            return self.table().put_if_absent(hash, bytes);
        };
        if self.holds(hash)? {
            self.touch(std::slice::from_ref(hash))?;
            return Ok(false);
        }
        let slot = objects.put_many(&[(*hash, bytes)])?.pop().flatten();
        self.index_stored(&[(*hash, bytes.len(), slot)])?;
        Ok(true)
    }

    /// A stub's chunk comes from the object store; a missing object there
    /// is `EUNKNOWN_HASH` naming it, a damaged one `CorruptChunk`.
    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        let row = self
            .conn
            .prepare_cached("SELECT size, data, pack, pack_offset FROM chunks WHERE hash = ?1")?
            .query_row([hash.as_bytes()], |r| {
                Ok((
                    r.get::<_, u64>(0)?,
                    r.get::<_, Vec<u8>>(1)?,
                    slot_from_columns(r, 0, 2)?,
                ))
            })
            .optional()?;
        match row {
            None => Err(SyncError::UnknownHash {
                hash: *hash,
                path: None,
            }
            .into()),
            Some((size, bytes, slot)) if bytes.is_empty() && size > 0 => self
                .fetch(&[(*hash, slot)])?
                .pop()
                .ok_or(DofsError::ChunkElsewhere { hash: *hash }),
            Some((_, bytes, _)) => verified(hash, bytes),
        }
    }

    fn has(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        match self.objects {
            None => self.table().has(hashes),
            Some(_) => self.indexed(hashes),
        }
    }

    /// With an object store: the chunks not yet indexed go to it together
    /// (in packs), then are indexed with where it put them; those already
    /// indexed are stamped fresh. Answers `None` for every chunk: the
    /// caller finds them through the index.
    fn put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<Vec<Option<PackSlot>>, DofsError> {
        if let Some(staged) = self.begin_staging(chunks)? {
            self.settle(staged)?;
        }
        Ok(vec![None; chunks.len()])
    }

    fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Vec<u8>>, DofsError> {
        if self.objects.is_none() {
            return hashes.iter().map(|h| self.get(h)).collect();
        }
        // Bytes held here are read here; stubs are fetched together.
        let here: HashSet<Hash> = self.here(hashes)?.into_iter().collect();
        let stubs: Vec<Hash> = hashes
            .iter()
            .filter(|h| !here.contains(h))
            .copied()
            .collect();
        // Not indexed: `EUNKNOWN_HASH` naming it.
        let slots = self.slots(&stubs)?;
        let placed: Vec<(Hash, Option<PackSlot>)> = stubs.into_iter().zip(slots).collect();
        let mut fetched = self.fetch(&placed)?.into_iter();
        hashes
            .iter()
            .map(|h| match here.contains(h) {
                true => self.table().get(h),
                false => Ok(fetched.next().expect("one fetched chunk per stub")),
            })
            .collect()
    }
}

/// Gathers the chunks writes cut and stores them through [`Chunks`]:
/// straight into the table, or in batches of about
/// [`UPLOAD_BATCH_BYTES`] into an object store (sent concurrently). One
/// sink may serve several files of one mutation ([`crate::Dofs::write_files`]),
/// so many small files go out in a few batches rather than one each.
#[derive(Default)]
pub(crate) struct ChunkSink {
    pending: Vec<(Hash, Vec<u8>)>,
    pending_bytes: usize,
}

impl ChunkSink {
    pub(crate) fn add(
        &mut self,
        chunks: Chunks<'_>,
        hash: &Hash,
        bytes: &[u8],
    ) -> Result<(), DofsError> {
        if chunks.objects.is_none() {
            chunks.table().put_if_absent(hash, bytes)?;
            return Ok(());
        }
        self.pending.push((*hash, bytes.to_vec()));
        self.pending_bytes += bytes.len();
        if self.pending_bytes >= UPLOAD_BATCH_BYTES {
            self.flush(chunks)?;
        }
        Ok(())
    }

    /// Stores what is gathered: every chunk added is held (and indexed)
    /// after it.
    pub(crate) fn flush(&mut self, chunks: Chunks<'_>) -> Result<(), DofsError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let batch: Vec<(Hash, &[u8])> = self
            .pending
            .iter()
            .map(|(h, b)| (*h, b.as_slice()))
            .collect();
        chunks.put_many(&batch)?;
        self.pending.clear();
        self.pending_bytes = 0;
        Ok(())
    }
}

/// The contract every [`ChunkStore`] keeps, run against each store.
#[cfg(test)]
pub(crate) mod contract {
    use wsd_sync::{ErrorCode, Hash};

    use super::{ChunkStore, PackSlot};

    /// Stores, reads back and probes through `store`, which must start
    /// without the chunks this names (distinct per `seed`).
    pub(crate) fn holds_for(store: &dyn ChunkStore, seed: u8) {
        let a = vec![seed, 1, 2, 3];
        let b = vec![seed; 70_000];
        let (ha, hb) = (Hash::of(&a), Hash::of(&b));
        let absent = Hash::of(&[seed, 9, 9]);

        assert!(store.has(&[ha, hb, absent]).unwrap().is_empty());
        assert!(store.put_if_absent(&ha, &a).unwrap(), "newly stored");
        assert!(!store.put_if_absent(&ha, &a).unwrap(), "already held");
        assert!(store.put_if_absent(&hb, &b).unwrap());
        assert_eq!(store.get(&ha).unwrap(), a);
        assert_eq!(store.get(&hb).unwrap(), b);
        assert_eq!(
            store.has(&[absent, hb, ha, hb]).unwrap(),
            vec![hb, ha, hb],
            "input order, duplicates kept"
        );
        let err = store.get(&absent).unwrap_err();
        assert_eq!(err.code(), ErrorCode::UnknownHash);
        assert!(err.to_string().contains(&absent.to_string()), "{err}");
        assert!(store.has(&[]).unwrap().is_empty());
    }

    /// Stores a batch through `put_many` (a duplicate and a chunk already
    /// held among it) and reads it back by the places it answered, by hash
    /// alone, and probes it. Answers each chunk of the batch with where the
    /// store said it is, for a second client to find.
    pub(crate) fn batches_hold_for(
        store: &dyn ChunkStore,
        seed: u8,
    ) -> Vec<(Hash, Option<PackSlot>)> {
        let held = vec![seed, 7, 7];
        let held_hash = Hash::of(&held);
        assert!(store.put_if_absent(&held_hash, &held).unwrap());
        let chunks: Vec<Vec<u8>> = (0..20u8)
            .map(|i| vec![seed.wrapping_add(i); 1000 + usize::from(i)])
            .collect();
        let mut batch: Vec<(Hash, &[u8])> = chunks.iter().map(|c| (Hash::of(c), &c[..])).collect();
        batch.push(batch[3]);
        batch.push((held_hash, &held));
        let slots = store.put_many(&batch).unwrap();
        assert_eq!(slots.len(), batch.len(), "one answer per chunk");
        assert_eq!(slots[3], slots[20], "a duplicate is one chunk");
        let placed: Vec<(Hash, Option<PackSlot>)> =
            batch.iter().map(|(h, _)| *h).zip(slots).collect();
        let read = store.get_placed(&placed).unwrap();
        for ((_, bytes), got) in batch.iter().zip(&read) {
            assert_eq!(*bytes, &got[..]);
        }
        let hashes: Vec<Hash> = placed.iter().map(|(h, _)| *h).collect();
        assert_eq!(store.get_many(&hashes).unwrap(), read);
        assert_eq!(store.get(&hashes[5]).unwrap(), chunks[5]);
        assert_eq!(store.has(&hashes).unwrap(), hashes);
        assert_eq!(store.locate(&hashes).unwrap(), placed);
        let absent = Hash::of(&[seed, 8, 8]);
        assert!(store.locate(&[absent]).unwrap().is_empty());
        placed
    }

    /// What a second client of the same store (no state of its own) finds
    /// of a batch another stored ([`batches_hold_for`]).
    pub(crate) fn a_second_client_finds(
        store: &dyn ChunkStore,
        placed: &[(Hash, Option<PackSlot>)],
    ) {
        let hashes: Vec<Hash> = placed.iter().map(|(h, _)| *h).collect();
        let bytes = store.get_placed(placed).unwrap();
        for (hash, b) in hashes.iter().zip(&bytes) {
            assert_eq!(Hash::of(b), *hash);
        }
        assert_eq!(store.locate(&hashes).unwrap(), placed);
        assert_eq!(store.get_many(&hashes).unwrap(), bytes);
    }
}

#[cfg(test)]
mod tests {
    use wsd_sync::{ErrorCode, Hash};

    use super::*;
    use crate::test_util::{p, put, store};

    #[test]
    fn the_sqlite_store_keeps_the_contract() {
        let d = store();
        contract::holds_for(&SqliteChunks::new(&d.conn), 1);
        let placed = contract::batches_hold_for(&SqliteChunks::new(&d.conn), 2);
        assert!(
            placed.iter().all(|(_, slot)| slot.is_none()),
            "rows, not packs"
        );
    }

    #[test]
    fn a_corrupted_chunk_is_an_error_naming_its_hash_on_every_read_path() {
        let mut d = store();
        put(&mut d, "small", b"original bytes");
        let big = crate::test_util::noise(600 * 1024, 3);
        put(&mut d, "big", &big);
        let small = Hash::of(b"original bytes");
        let first_big = wsd_sync::chunk::chunk_slice(&big)[0].1.hash;
        // Same length, different bytes: only the hash can tell.
        for hash in [small, first_big] {
            d.conn
                .execute(
                    "UPDATE chunks SET data = zeroblob(size) WHERE hash = ?1",
                    [hash.as_bytes()],
                )
                .unwrap();
        }
        let check = |err: DofsError, hash: Hash| {
            assert!(matches!(err, DofsError::CorruptChunk { .. }), "{err}");
            assert_eq!(err.code(), ErrorCode::Io);
            assert!(err.to_string().contains(&hash.to_string()), "{err}");
        };
        check(SqliteChunks::new(&d.conn).get(&small).unwrap_err(), small);
        check(d.read_file(&p("small")).unwrap_err(), small);
        check(d.read_file(&p("big")).unwrap_err(), first_big);
        check(
            d.read_lines(&p("big"), 0, None, 1 << 20).unwrap_err(),
            first_big,
        );
        check(d.search(b"x", Some(&p("small")), 10).unwrap_err(), small);
        let err = wsd_sync::Store::read_object(&mut d, &small).unwrap_err();
        assert!(err.to_string().contains(&small.to_string()), "{err}");
    }

    #[test]
    fn a_chunk_missing_from_a_file_list_is_unknown_hash_not_a_short_read() {
        let mut d = store();
        let big = crate::test_util::noise(600 * 1024, 4);
        put(&mut d, "big", &big);
        let second = wsd_sync::chunk::chunk_slice(&big)[1].1.hash;
        d.conn.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        d.conn
            .execute("DELETE FROM chunks WHERE hash = ?1", [second.as_bytes()])
            .unwrap();
        let err = d.read_file(&p("big")).unwrap_err();
        assert_eq!(err.code(), ErrorCode::UnknownHash);
        assert!(err.to_string().contains(&second.to_string()), "{err}");
    }
}
