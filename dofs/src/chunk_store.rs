//! Where chunk bytes live: the [`ChunkStore`] seam (put-if-absent, get,
//! has, by hash) and its embedded default, [`SqliteChunks`], the `chunks`
//! table of the dofs database itself.
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
}

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

    /// Calls `each` with the verified bytes of a file's chunks in order: the
    /// one chunk `chunk` when set, else the list recorded for `manifest`. A
    /// listed chunk that is not held is `EUNKNOWN_HASH` naming it. `each`
    /// breaks to stop early.
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
            "SELECT mc.chunk, c.data FROM manifest_chunks mc LEFT JOIN chunks c ON c.hash = mc.chunk
             WHERE mc.manifest = ?1 ORDER BY mc.idx",
        )?;
        let mut rows = stmt.query([manifest.as_bytes()])?;
        while let Some(r) = rows.next()? {
            let hash = hash_from_sql(r.get(0)?, 0)?;
            let Some(bytes) = r.get_ref(1)?.as_blob_or_null()? else {
                return Err(SyncError::UnknownHash { hash, path: None }.into());
            };
            if Hash::of(bytes) != hash {
                return Err(DofsError::CorruptChunk { hash });
            }
            if each(bytes)?.is_break() {
                break;
            }
        }
        Ok(())
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

/// The contract every [`ChunkStore`] keeps, run against each store.
#[cfg(test)]
pub(crate) mod contract {
    use wsd_sync::{ErrorCode, Hash};

    use super::ChunkStore;

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
