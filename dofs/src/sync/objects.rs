//! The chunk store as the sync core sees it: probe, read, stage, collect.

use std::collections::HashSet;

use rusqlite::TransactionBehavior;
use wsd_sync::{Hash, Object, SyncError, chunk};

use crate::chunk_store::{ChunkStore, Chunks, PackSlot};
use crate::{Dofs, DofsError};

/// Batches of `stage_objects` whose uploads may run at once while the
/// caller goes on (each at most the driver's `BATCH_OBJECT_BYTES` of
/// chunks, 4 MiB, held in memory until sent).
const STAGED_BATCHES: usize = 2;

/// What [`Dofs::collect_garbage`] freed.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct GcOutcome {
    pub manifests: usize,
    pub chunks: usize,
}

impl Dofs {
    /// A sync probe: the chunks found are stamped fresh, since the
    /// prober will not send them and will name them in its next apply
    /// (the grace window of garbage collection must cover them till then).
    pub(crate) fn has_objects_inner(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        let chunks = self.chunks();
        let held = chunks.has(hashes)?;
        chunks.touch(&held)?;
        Ok(held)
    }

    /// The verified bytes of chunk `hash` (`EUNKNOWN_HASH` when not held).
    pub fn read_chunk(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        self.read_object_inner(hash)
    }

    pub(crate) fn read_object_inner(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        self.chunks().get(hash)
    }

    /// Several chunks at once (fetched together from an object store).
    pub(crate) fn read_objects_inner(&self, hashes: &[Hash]) -> Result<Vec<Object>, DofsError> {
        let bytes = self.chunks().get_many(hashes)?;
        Ok(hashes
            .iter()
            .zip(bytes)
            .map(|(hash, bytes)| Object { hash: *hash, bytes })
            .collect())
    }

    /// Which of `hashes` have their bytes in this database (not in an
    /// object store): what a copy to the object store must still send.
    pub fn chunks_held_here(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        self.chunks().here(hashes)
    }

    /// Every chunk the index holds, here or in an object store: what a
    /// sweep of that store must keep for this tree.
    pub fn indexed_chunks(&self, among: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        Chunks::new(&self.conn, None).indexed(among)
    }

    /// The index rows among `among`, each with the pack the object store
    /// is read from for it (`None`: the chunk's own object, or its bytes
    /// held here): what a sweep that frees copies no row reads must keep.
    pub fn chunk_places(&self, among: &[Hash]) -> Result<Vec<(Hash, Option<Hash>)>, DofsError> {
        Chunks::new(&self.conn, None).places(among)
    }

    /// Points every row reading a chunk of `moved` from its old pack at its
    /// new place (`(chunk, old pack, new slot)`), in one transaction: a
    /// repack's move of this store. Answers how many rows moved.
    pub fn repoint_chunks(&mut self, moved: &[(Hash, Hash, PackSlot)]) -> Result<usize, DofsError> {
        self.settle_staged()?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let n = Chunks::new(&tx, None).repoint(moved)?;
        tx.commit()?;
        Ok(n)
    }

    /// Verifies every object first and stores them in one transaction, so a
    /// bad object in a call stores nothing at all. With an object store
    /// the new ones are sent there together, and the call answers while
    /// they are still being sent (so the driver receives the next batch
    /// meanwhile): their index rows wait in `Dofs::staged` for the next
    /// sync call, which commits them only once the uploads succeeded (an
    /// apply in its own transaction, before it commits). At most
    /// [`STAGED_BATCHES`] batches are left running; beyond, this call
    /// waits for the oldest.
    pub(crate) fn stage_objects_inner(&mut self, objects: &[Object]) -> Result<(), DofsError> {
        for o in objects {
            SyncError::check_limit("object size (bytes)", chunk::MAX_CHUNK, o.bytes.len())?;
            o.hash.verify(&o.bytes)?;
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let staged = &mut self.staged;
        // Chunks still being sent for an earlier batch are not sent again.
        let sending: HashSet<Hash> = staged
            .iter()
            .flat_map(|s| s.rows.iter().map(|(h, ..)| *h))
            .collect();
        let batch: Vec<(Hash, &[u8])> = objects
            .iter()
            .filter(|o| !sending.contains(&o.hash))
            .map(|o| (o.hash, o.bytes.as_slice()))
            .collect();
        let chunks = Chunks::new(&tx, self.objects.as_deref());
        let begun = chunks.begin_staging(&batch)?;
        let over = (staged.len() + usize::from(begun.is_some())).saturating_sub(STAGED_BATCHES);
        for oldest in staged.drain(..over) {
            chunks.settle(oldest)?;
        }
        tx.commit()?;
        staged.extend(begun);
        Ok(())
    }

    /// Waits for every staged batch's uploads and commits their index
    /// rows: what every sync call but `stage_objects` does first, and a
    /// collection before it reads this store's rows (so it sees every
    /// place a staged batch names).
    pub(crate) fn settle_staged(&mut self) -> Result<(), DofsError> {
        if self.staged.is_empty() {
            return Ok(());
        }
        let staged = std::mem::take(&mut self.staged);
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        let chunks = Chunks::new(&tx, self.objects.as_deref());
        for batch in staged {
            chunks.settle(batch)?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Deletes manifests no path or snapshot references, then chunks no
    /// manifest, path or snapshot references, whatever their age. Staged
    /// objects not yet linked by an apply count as garbage, so run this
    /// only when no push into this store is between its `pushObjects` and
    /// its `push`; [`Dofs::collect_garbage_stored_before`] need not.
    pub fn collect_garbage(&mut self) -> Result<GcOutcome, DofsError> {
        self.collect_garbage_before_ms(i64::MAX)
    }

    /// [`Dofs::collect_garbage`] sparing every chunk stored (or found by a
    /// sync probe, or stored again) at or after `cutoff`: with `cutoff` =
    /// now − a grace window longer than any push takes from its probe to
    /// its apply, a collection can run while pushes are in flight.
    pub fn collect_garbage_stored_before(
        &mut self,
        cutoff: std::time::SystemTime,
    ) -> Result<GcOutcome, DofsError> {
        let cutoff_ms = cutoff
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        self.collect_garbage_before_ms(cutoff_ms)
    }

    fn collect_garbage_before_ms(&mut self, cutoff_ms: i64) -> Result<GcOutcome, DofsError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        // Set-based (`NOT IN` builds one temporary index of the referenced
        // hashes): `entries` has no index on `manifest` or `chunk`, which
        // would be two more hash-keyed B-trees for every write to update.
        let manifests = tx.execute(
            "DELETE FROM manifests WHERE hash NOT IN
               (SELECT manifest FROM entries WHERE manifest IS NOT NULL)
               AND hash NOT IN (SELECT manifest FROM snapshot_entries WHERE manifest IS NOT NULL)",
            [],
        )?;
        let chunks = tx.execute(
            "DELETE FROM chunks WHERE stored_at < ?1
               AND hash NOT IN (SELECT chunk FROM manifest_chunks)
               AND hash NOT IN (SELECT chunk FROM entries WHERE chunk IS NOT NULL)
               AND hash NOT IN (SELECT chunk FROM snapshot_entries WHERE chunk IS NOT NULL)",
            [cutoff_ms],
        )?;
        tx.commit()?;
        Ok(GcOutcome { manifests, chunks })
    }
}

#[cfg(test)]
mod tests {
    use wsd_sync::{ErrorCode, Hash, Object, Store, chunk};

    use crate::test_util::{noise, put, store};

    #[test]
    fn has_objects_answers_more_than_a_window_in_input_order_with_duplicates() {
        let mut d = store();
        let objects: Vec<Object> = (0..300u32)
            .map(|i| {
                let bytes = i.to_le_bytes().to_vec();
                Object {
                    hash: Hash::of(&bytes),
                    bytes,
                }
            })
            .collect();
        let held: Vec<Object> = objects.iter().step_by(2).cloned().collect();
        d.stage_objects(&held).unwrap();
        let mut probe: Vec<Hash> = objects.iter().rev().map(|o| o.hash).collect();
        probe.push(objects[0].hash);
        probe.push(objects[1].hash);
        let answer = d.has_objects(&probe).unwrap();
        let expected: Vec<Hash> = probe
            .iter()
            .copied()
            .filter(|h| held.iter().any(|o| o.hash == *h))
            .collect();
        assert_eq!(expected.len(), 151);
        assert_eq!(answer, expected);
        assert!(d.has_objects(&[]).unwrap().is_empty());
    }

    #[test]
    fn stage_objects_rejects_a_corrupted_object_and_stores_nothing_from_the_call() {
        let mut d = store();
        let good = Object {
            hash: Hash::of(b"good"),
            bytes: b"good".to_vec(),
        };
        let bad = Object {
            hash: Hash::of(b"meant"),
            bytes: b"tampered".to_vec(),
        };
        let err = d.stage_objects(&[good.clone(), bad.clone()]).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Protocol);
        assert!(err.to_string().contains(&bad.hash.to_string()), "{err}");
        assert!(d.has_objects(&[good.hash, bad.hash]).unwrap().is_empty());
        d.stage_objects(std::slice::from_ref(&good)).unwrap();
        assert_eq!(d.read_object(&good.hash).unwrap(), b"good");
    }

    #[test]
    fn an_object_over_the_chunk_limit_is_elimit() {
        let mut d = store();
        let bytes = vec![0u8; wsd_sync::chunk::MAX_CHUNK + 1];
        let err = d
            .stage_objects(&[Object {
                hash: Hash::of(&bytes),
                bytes,
            }])
            .unwrap_err();
        assert_eq!(err.code(), ErrorCode::Limit);
    }

    #[test]
    fn read_object_of_an_unknown_hash_is_eunknown_hash_naming_it() {
        let mut d = store();
        let h = Hash::of(b"nope");
        let err = d.read_object(&h).unwrap_err();
        assert_eq!(err.code(), ErrorCode::UnknownHash);
        assert!(err.to_string().contains(&h.to_string()));
    }

    #[test]
    fn garbage_collection_frees_only_unreferenced_manifests_and_chunks() {
        let mut d = store();
        put(&mut d, "keep", b"kept bytes");
        put(&mut d, "twin", b"kept bytes");
        put(&mut d, "gone", b"old bytes");
        put(&mut d, "gone", b"new bytes");
        // A multi-chunk file keeps its list in the manifest tables.
        let big = noise(600 * 1024, 5);
        let big_chunks = chunk::chunk_slice(&big);
        assert!(big_chunks.len() > 1);
        put(&mut d, "big", &big);
        put(&mut d, "big", b"small now");
        let kept = Hash::of(b"kept bytes");
        let old = Hash::of(b"old bytes");
        let old_big = big_chunks[0].1.hash;
        let out = d.collect_garbage().unwrap();
        assert_eq!((out.manifests, out.chunks), (1, 1 + big_chunks.len()));
        assert_eq!(d.has_objects(&[kept, old, old_big]).unwrap(), vec![kept]);
        d.check_integrity().unwrap();
    }
}
