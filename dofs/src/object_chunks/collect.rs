//! Collecting the bucket: which of its stale objects the workspace stores
//! still read from, deleting the others, and rewriting packs that are
//! mostly dead so their dead chunks are freed too (`dofs/DESIGN.md`,
//! "Sweeping packs").
//!
//! Marks are by place: a chunk in pack P is live when an index row reads
//! it from P (`chunks.pack = P`), when a row names it with no pack (its
//! own object, or bytes held in the database that a recovery would look
//! for in the bucket: every copy stays), or when the caller keeps it (a
//! manifest only the bucket has). So a copy no row reads from (a
//! duplicate in another pack, a pack a crashed repack left behind) is
//! garbage like any other.
//!
//! A repack is crash-safe in its order: the new packs are written before
//! any row moves; each store's rows move in one transaction of that
//! store; the old pack is deleted only after every store's rows moved. A
//! crash in between leaves every row naming a pack that exists, and the
//! next collection redoes the rest: packs are content-addressed, so the
//! same live chunks make the same pack, and a new pack no row reached is
//! unmarked garbage once it is older than the grace window.

use std::collections::{HashMap, HashSet};

use futures::{StreamExt, stream};
use object_store::ObjectStoreExt;
use object_store::path::Path as ObjectPath;
use wsd_sync::Hash;

use super::{CONCURRENCY, CallError, ObjectChunks, StaleObject, SweepOutcome, bounded, slice};
use crate::chunk_store::{PackSlot, verified};
use crate::{Dofs, DofsError};

/// A pack some row reads from is rewritten without its dead chunks once
/// they are at least this share (numerator, denominator) of its chunk
/// bytes: 1/4. A rewrite reads the pack (≤ `PACK_BYTES`) and writes its
/// live bytes again, so at the threshold it writes at most 3 bytes per
/// byte it frees, and the dead bytes a collection leaves in place are
/// under a quarter of each pack's (a third of the live bytes) — the same
/// kind of bound restic's `prune --max-unused` and borg's `compact
/// --threshold` (10 %) set; a lower share would rewrite more live bytes
/// per byte freed.
pub const REPACK_DEAD_SHARE: (u64, u64) = (1, 4);

/// Packs rewritten per round: their live chunks are in memory together
/// (at most this many packs' bytes), and each round is finished (new
/// packs, every index moved, old packs deleted) before the next starts.
const REPACK_ROUND: usize = 16;

/// What the workspace stores' indexes (and the caller) need of the stale
/// objects' chunks.
struct Marks {
    /// Needed in every copy: named by a row with no pack, or kept by the
    /// caller.
    anywhere: HashSet<Hash>,
    /// `(chunk, pack)`: a row reads the chunk from that pack.
    placed: HashSet<(Hash, Hash)>,
}

impl Marks {
    fn live(&self, object: &StaleObject, chunk: &Hash) -> bool {
        self.anywhere.contains(chunk)
            || object
                .pack
                .is_some_and(|pack| self.placed.contains(&(*chunk, pack)))
    }
}

/// Calls its argument with each workspace store in turn (locking each
/// for that call alone, or all of them already locked): how a collection
/// reaches the stores, once for the marks and once per round of moves.
pub type EachStore<'a> =
    dyn FnMut(&mut dyn FnMut(&mut Dofs) -> Result<(), DofsError>) -> Result<(), DofsError> + 'a;

/// Undooms a collection's objects when it ends, however it ends.
struct DoomGuard<'a> {
    chunks: &'a ObjectChunks,
}

impl Drop for DoomGuard<'_> {
    fn drop(&mut self) {
        let mut doomed = super::lock(&self.chunks.shared.doomed);
        doomed.packs.clear();
        doomed.own.clear();
    }
}

impl ObjectChunks {
    /// Marks `stale` as objects a collection may delete: from now until it
    /// ends, writes do not reuse them (a known-present place, an own
    /// object's "already there", a fork's copied pack range), so a store
    /// whose rows were marked cannot come to need one of them later.
    fn doom(&self, stale: &[StaleObject]) -> DoomGuard<'_> {
        let mut doomed = super::lock(&self.shared.doomed);
        for object in stale {
            match object.pack {
                Some(pack) => {
                    doomed.packs.insert(pack);
                }
                None => doomed.own.extend(object.chunks.iter().copied()),
            }
        }
        DoomGuard { chunks: self }
    }

    /// Keeps doomed only `deleted` and `rewritten`, the objects this
    /// collection will delete.
    fn narrow_doom<'o>(
        &self,
        deleted: &'o [StaleObject],
        rewritten: impl Iterator<Item = &'o StaleObject>,
    ) {
        let mut doomed = super::lock(&self.shared.doomed);
        doomed.packs.clear();
        doomed.own.clear();
        for object in deleted.iter().chain(rewritten) {
            match object.pack {
                Some(pack) => {
                    doomed.packs.insert(pack);
                }
                None => doomed.own.extend(object.chunks.iter().copied()),
            }
        }
    }

    /// [`ObjectChunks::collect_each`] with every store locked by the
    /// caller for the whole call.
    pub fn collect(
        &self,
        stale: Vec<StaleObject>,
        stores: &mut [&mut Dofs],
        keep: &HashSet<Hash>,
    ) -> Result<SweepOutcome, DofsError> {
        let mut each = |f: &mut dyn FnMut(&mut Dofs) -> Result<(), DofsError>| {
            stores.iter_mut().try_for_each(|d| f(d))
        };
        self.collect_each(stale, &mut each, keep)
    }

    /// Collects the bucket's `stale` objects ([`ObjectChunks::stale_objects`])
    /// against the indexes of the workspace stores `each` reaches (every
    /// store keeping its chunks here; each may be locked for its own turn
    /// only: the objects are doomed first, so no write reuses them, and a
    /// store's rows are read after every write that could have reused one
    /// before) and the chunks `keep` names (wherever they are):
    ///
    /// - an object no row reads from and holding nothing kept is deleted;
    /// - a pack whose dead chunks are at least [`REPACK_DEAD_SHARE`] of
    ///   its chunk bytes is rewritten: its live chunks go into new packs,
    ///   every row naming the old pack (in every store: forks share
    ///   packs) is moved to the new one, then the old pack is deleted;
    /// - anything else stays as it is.
    pub fn collect_each(
        &self,
        stale: Vec<StaleObject>,
        each: &mut EachStore<'_>,
        keep: &HashSet<Hash>,
    ) -> Result<SweepOutcome, DofsError> {
        if stale.is_empty() {
            return Ok(SweepOutcome::default());
        }
        let _doomed = self.doom(&stale);
        let marks = mark(&stale, each, keep)?;
        let mut doomed = Vec::new();
        let mut rewrite = Vec::new();
        for object in stale {
            let live: Vec<bool> = object
                .chunks
                .iter()
                .map(|h| marks.live(&object, h))
                .collect();
            if !live.contains(&true) {
                doomed.push(object);
                continue;
            }
            let total: u64 = object.slots.iter().map(|s| u64::from(s.len)).sum();
            let dead: u64 = object
                .slots
                .iter()
                .zip(&live)
                .filter(|(_, live)| !**live)
                .map(|(s, _)| u64::from(s.len))
                .sum();
            let (share, of) = REPACK_DEAD_SHARE;
            if dead > 0 && dead * of >= total * share {
                rewrite.push((object, live));
            }
        }
        // What stays whole needs no protection from writes any more.
        self.narrow_doom(&doomed, rewrite.iter().map(|(o, _)| o));
        let mut out = self.delete_objects(doomed)?;
        let mut rewrite = rewrite.into_iter().peekable();
        while rewrite.peek().is_some() {
            let round: Vec<_> = rewrite.by_ref().take(REPACK_ROUND).collect();
            out += self.repack(round, each)?;
        }
        Ok(out)
    }

    /// Rewrites the packs of `round` (each with which of its chunks are
    /// live) without their dead chunks, moving every row of `stores` that
    /// names one of them, then deletes them.
    fn repack(
        &self,
        round: Vec<(StaleObject, Vec<bool>)>,
        each: &mut EachStore<'_>,
    ) -> Result<SweepOutcome, DofsError> {
        let keys: Vec<ObjectPath> = round.iter().map(|(o, _)| o.key.clone()).collect();
        let read = self.read_whole(keys)?;
        // The live chunks (once each, however many old packs hold them),
        // and each (chunk, old pack) a row may name.
        let mut live: Vec<(Hash, Vec<u8>)> = Vec::new();
        let mut moves: Vec<(Hash, Hash)> = Vec::new();
        let mut taken = HashSet::new();
        let mut old: Vec<StaleObject> = Vec::new();
        let mut dead_chunks = 0u64;
        for ((object, alive), bytes) in round.into_iter().zip(read) {
            // Gone since it was listed: nothing to move, nothing to free.
            let (Some(bytes), Some(id)) = (bytes, object.pack) else {
                continue;
            };
            match live_chunks(&object, &alive, &bytes) {
                Ok(chunks) => {
                    for (hash, chunk) in chunks {
                        moves.push((hash, id));
                        if taken.insert(hash) {
                            live.push((hash, chunk));
                        }
                    }
                }
                // A damaged pack stays as it is (the integrity check and
                // reads name the chunk); the collection goes on.
                Err(e) => {
                    tracing::warn!(pack = %id, error = %e, "not repacking a damaged pack");
                    continue;
                }
            }
            dead_chunks += alive.iter().filter(|l| !**l).count() as u64;
            old.push(object);
        }
        if old.is_empty() {
            return Ok(SweepOutcome::default());
        }
        let batch: Vec<(Hash, &[u8])> = live.iter().map(|(h, b)| (*h, b.as_slice())).collect();
        let placed: HashMap<Hash, PackSlot> = self.put_packs(&batch)?.into_iter().collect();
        let moved: Vec<(Hash, Hash, PackSlot)> = moves
            .iter()
            .map(|(hash, from)| (*hash, *from, placed[hash]))
            .collect();
        each(&mut |d| d.repoint_chunks(&moved).map(drop))?;
        // A pack's chunks lie back to back after its index, so its last
        // chunk ends where the pack does.
        let mut written: HashMap<Hash, u64> = HashMap::new();
        for slot in placed.values() {
            let end = written.entry(slot.pack).or_default();
            *end = (*end).max(slot.offset + u64::from(slot.len));
        }
        let freed: u64 = old.iter().map(|o| o.size).sum();
        let repacked = old.len() as u64;
        let deleted = self.delete_keys(old)?;
        self.forget(&deleted);
        for (hash, slot) in &placed {
            self.remember(*hash, Some(*slot));
        }
        Ok(SweepOutcome {
            chunks: dead_chunks,
            bytes: freed.saturating_sub(written.values().sum()),
            repacked,
        })
    }

    /// The objects at `keys`, whole, read concurrently, in input order; an
    /// object gone meanwhile is `None`.
    fn read_whole(&self, keys: Vec<ObjectPath>) -> Result<Vec<Option<Vec<u8>>>, DofsError> {
        let (store, deadline) = (self.shared.store.clone(), self.shared.deadline);
        type Read = Result<Option<Vec<u8>>, (ObjectPath, CallError)>;
        let read: Vec<Read> = self.block_on(
            stream::iter(keys)
                .map(|key| {
                    let store = store.clone();
                    async move {
                        let got = bounded(deadline, async {
                            Ok(store.get(&key).await?.bytes().await?.to_vec())
                        })
                        .await;
                        match got {
                            Ok(bytes) => Ok(Some(bytes)),
                            Err(CallError::Store(object_store::Error::NotFound { .. })) => Ok(None),
                            Err(e) => Err((key, e)),
                        }
                    }
                })
                .buffered(CONCURRENCY)
                .collect(),
        );
        read.into_iter()
            .map(|r| r.map_err(|(key, e)| self.failed(format!("reading {key} to repack it"), e)))
            .collect()
    }
}

/// The live chunks of pack `object` (whose bytes are `bytes`), verified.
fn live_chunks(
    object: &StaleObject,
    alive: &[bool],
    bytes: &[u8],
) -> Result<Vec<(Hash, Vec<u8>)>, DofsError> {
    object
        .chunks
        .iter()
        .zip(&object.slots)
        .zip(alive)
        .filter(|(_, live)| **live)
        .map(|((hash, slot), _)| Ok((*hash, verified(hash, slice(bytes, slot))?)))
        .collect()
}

/// Where the rows of `stores` read the chunks of `stale` from, with `keep`.
fn mark(
    stale: &[StaleObject],
    each: &mut EachStore<'_>,
    keep: &HashSet<Hash>,
) -> Result<Marks, DofsError> {
    let hashes: Vec<Hash> = stale
        .iter()
        .flat_map(|o| o.chunks.iter().copied())
        .collect::<HashSet<Hash>>()
        .into_iter()
        .collect();
    let mut marks = Marks {
        anywhere: keep.clone(),
        placed: HashSet::new(),
    };
    each(&mut |d| {
        // Rows a staged batch has not committed yet name places too.
        d.settle_staged()?;
        for (hash, pack) in d.chunk_places(&hashes)? {
            match pack {
                None => marks.anywhere.insert(hash),
                Some(pack) => marks.placed.insert((hash, pack)),
            };
        }
        Ok(())
    })?;
    Ok(marks)
}
