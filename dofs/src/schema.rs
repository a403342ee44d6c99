//! Opening a database: connection settings and numbered migrations.

use rusqlite::{Connection, TransactionBehavior};

use crate::DofsError;

/// Migration `i` (0-based) takes the schema from version `i` to `i + 1`.
/// The version lives in `PRAGMA user_version`; a new step is appended here,
/// never edited in place once released.
const MIGRATIONS: &[&str] = &[
    include_str!("schema/001_initial.sql"),
    include_str!("schema/002_direct_chunk.sql"),
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `PRAGMA application_id` of a dofs database ("dofs" in ASCII), so a
/// stray SQLite file is refused instead of migrated.
const APPLICATION_ID: i64 = 0x646f_6673;

/// Applies the connection settings every dofs connection runs with.
pub(crate) fn configure(conn: &Connection) -> Result<(), DofsError> {
    // WAL lets readers (e.g. an sqlite3 shell) run beside the one writer;
    // NORMAL in WAL mode loses at most the last commits on power loss, never
    // consistency. An in-memory database answers "memory" and that is fine.
    let _mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // Checkpoint every 64 MiB of WAL instead of every 4 MiB: a checkpoint
    // copies pages back and fsyncs, and at the default it was a third of
    // the cost of a small file write. A file-backed `Dofs` then replaces
    // this with a WAL hook that checkpoints on another thread
    // (`checkpoint.rs`).
    conn.pragma_update(None, "wal_autocheckpoint", 16384)?;
    conn.pragma_update(None, "foreign_keys", true)?;
    // 8 MiB of page cache instead of SQLite's 2 MiB: with the default, the
    // entries/chunks index pages a small write walks were evicted between
    // writes and read back (`readDbPage` in the write profile, bench/RESULTS.md).
    conn.pragma_update(None, "cache_size", -8192)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    // Plans never depend on bound values: the bundled SQLite (STAT4) would
    // otherwise re-prepare a cached statement whenever a plan-relevant
    // parameter (a LIMIT, an indexed key) is rebound.
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    // Room for every statement dofs prepares, so none is re-parsed.
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Brings the schema to [`SCHEMA_VERSION`] in one transaction, refusing a
/// database written by a newer build or by something that is not dofs.
pub(crate) fn migrate(conn: &mut Connection, label: &str) -> Result<(), DofsError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let app: i64 = tx.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if app != 0 && app != APPLICATION_ID {
        return Err(DofsError::NotADofsDatabase {
            path: label.to_owned(),
            found: app,
        });
    }
    if version > SCHEMA_VERSION {
        return Err(DofsError::SchemaTooNew {
            path: label.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if app == 0 {
        let tables: i64 = tx.query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
            [],
            |r| r.get(0),
        )?;
        if tables > 0 {
            return Err(DofsError::NotADofsDatabase {
                path: label.to_owned(),
                found: app,
            });
        }
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    }
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        tracing::info!(
            db = label,
            from = step,
            to = step + 1,
            "migrated dofs schema"
        );
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use wsd_sync::ErrorCode;

    use super::*;
    use crate::Dofs;
    use crate::test_util::{p, put};

    #[test]
    fn a_fresh_database_is_stamped_with_the_current_version_and_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.dofs");
        let d = Dofs::open(&path).unwrap();
        let version: i64 = d
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        let mode: String = d
            .conn
            .pragma_query_value(None, "journal_mode", |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
        let fk: bool = d
            .conn
            .pragma_query_value(None, "foreign_keys", |r| r.get(0))
            .unwrap();
        assert!(fk);
        let sync: i64 = d
            .conn
            .pragma_query_value(None, "synchronous", |r| r.get(0))
            .unwrap();
        assert_eq!(sync, 1, "NORMAL");
    }

    #[test]
    fn reopening_keeps_the_tree_and_the_rev_counter() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.dofs");
        {
            let mut d = Dofs::open(&path).unwrap();
            put(&mut d, "a/b", b"persisted");
        }
        let d = Dofs::open(&path).unwrap();
        assert_eq!(d.read_file(&p("a/b")).unwrap(), b"persisted");
        assert_eq!(d.current_rev().unwrap(), 1);
        d.check_integrity().unwrap();
    }

    #[test]
    fn a_database_from_a_newer_build_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.dofs");
        drop(Dofs::open(&path).unwrap());
        {
            let conn = Connection::open(&path).unwrap();
            conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .unwrap();
        }
        let err = Dofs::open(&path).unwrap_err();
        assert!(
            matches!(err, DofsError::SchemaTooNew { found, .. } if found == SCHEMA_VERSION + 1)
        );
        assert_eq!(err.code(), ErrorCode::Io);
        assert!(err.to_string().contains("ws.dofs"), "{err}");
        let conn = Connection::open(&path).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION + 1);
    }

    #[test]
    fn a_foreign_sqlite_database_is_refused_not_migrated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("other.db");
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE t (x)")
            .unwrap();
        assert!(matches!(
            Dofs::open(&path).unwrap_err(),
            DofsError::NotADofsDatabase { .. }
        ));
    }

    /// Writes a version-1 database by hand, as the version-1 code laid
    /// files out: every file through `manifests`/`manifest_chunks`.
    fn version_1_database(path: &std::path::Path, files: &[(&str, &[u8])]) {
        use wsd_sync::{chunk, manifest};
        let conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO entries (path, parent, rev, kind, mode, mtime) VALUES ('a', '', 1, 'dir', 493, 0)",
            [],
        )
        .unwrap();
        conn.execute(
            "INSERT INTO entries (path, parent, rev, kind) VALUES ('gone', '', 2, 'delete')",
            [],
        )
        .unwrap();
        for (i, (name, bytes)) in files.iter().enumerate() {
            let cut = chunk::chunk_slice(bytes);
            for (start, c) in &cut {
                conn.execute(
                    "INSERT INTO chunks (hash, size, data) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                    rusqlite::params![
                        c.hash.as_bytes(),
                        c.size,
                        &bytes[*start..*start + c.size as usize]
                    ],
                )
                .unwrap();
            }
            let list: Vec<_> = cut.iter().map(|(_, c)| *c).collect();
            let hash = manifest::hash(&list);
            let inserted = conn
                .execute(
                    "INSERT INTO manifests (hash, size, chunk_count) VALUES (?1, ?2, ?3)
                     ON CONFLICT DO NOTHING",
                    rusqlite::params![hash.as_bytes(), bytes.len() as u64, list.len() as u64],
                )
                .unwrap();
            for (idx, c) in list.iter().enumerate().filter(|_| inserted == 1) {
                conn.execute(
                    "INSERT INTO manifest_chunks (manifest, idx, chunk, size) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![hash.as_bytes(), idx as u64, c.hash.as_bytes(), c.size],
                )
                .unwrap();
            }
            conn.execute(
                "INSERT INTO entries (path, parent, rev, kind, mode, mtime, size, manifest)
                 VALUES (?1, 'a', ?2, 'file', 420, 0, ?3, ?4)",
                rusqlite::params![
                    format!("a/{name}"),
                    3 + i as u64,
                    bytes.len() as u64,
                    hash.as_bytes()
                ],
            )
            .unwrap();
        }
        conn.execute(
            "UPDATE meta SET value = ?1 WHERE key = 'rev'",
            [2 + files.len() as u64],
        )
        .unwrap();
    }

    #[test]
    fn a_version_1_database_is_upgraded_keeping_every_file_and_its_hashes() {
        use wsd_sync::{ChunkRef, Store, chunk, manifest};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v1.dofs");
        let big = crate::test_util::noise(700 * 1024, 9);
        let files: [(&str, &[u8]); 5] = [
            ("one", b"a small file"),
            ("twin", b"a small file"),
            ("empty", b""),
            ("big", &big),
            ("other", b"another small file"),
        ];
        version_1_database(&path, &files);

        let mut d = Dofs::open(&path).unwrap();
        let version: i64 = d
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        d.check_integrity().unwrap();
        assert_eq!(d.current_rev().unwrap(), 7);
        for (name, bytes) in files {
            let at = p(&format!("a/{name}"));
            assert_eq!(d.read_file(&at).unwrap(), bytes, "{name}");
            let list: Vec<ChunkRef> = chunk::chunk_slice(bytes)
                .into_iter()
                .map(|(_, c)| c)
                .collect();
            let stat = d.stat(&at).unwrap();
            assert_eq!(stat.manifest, Some(manifest::hash(&list)), "{name}");
            assert_eq!(
                d.read_entry(&at).unwrap().unwrap().chunks(),
                &list[..],
                "{name}"
            );
        }
        let direct: i64 = d
            .conn
            .query_row(
                "SELECT count(*) FROM entries WHERE chunk IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(direct, 3, "the one-chunk files name their chunk");
        let manifests: i64 = d
            .conn
            .query_row("SELECT count(*) FROM manifests", [], |r| r.get(0))
            .unwrap();
        assert_eq!(manifests, 2, "only the empty and the multi-chunk lists");
        let gc = d.collect_garbage().unwrap();
        assert_eq!((gc.manifests, gc.chunks), (0, 0), "nothing was orphaned");
        put(&mut d, "a/one", b"rewritten after the upgrade");
        assert_eq!(d.current_rev().unwrap(), 8);
        d.check_integrity().unwrap();
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        configure(&conn).unwrap();
        migrate(&mut conn, "mem").unwrap();
        conn.execute("UPDATE meta SET value = 7 WHERE key = 'rev'", [])
            .unwrap();
        migrate(&mut conn, "mem").unwrap();
        let rev: i64 = conn
            .query_row("SELECT value FROM meta WHERE key = 'rev'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rev, 7);
    }
}
