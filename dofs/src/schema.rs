//! How a dofs database is opened (through `wsd-sqlite`): connection
//! settings, numbered migrations, damage handling.

use wsd_sqlite::{
    JournalMode, LegacyBookkeeping, Migration, MigrationSet, OnDamage, Pragmas, Setup, Synchronous,
};

/// dofs' migrations (owner `dofs`); databases written before `wsd-sqlite`
/// counted them in `PRAGMA user_version`. Never edit one once released:
/// append a new one.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial schema",
        sql: include_str!("schema/001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "direct chunk",
        sql: include_str!("schema/002_direct_chunk.sql"),
    },
    Migration {
        version: 3,
        name: "snapshots",
        sql: include_str!("schema/003_snapshots.sql"),
    },
    Migration {
        version: 4,
        name: "incarnation",
        sql: include_str!("schema/004_incarnation.sql"),
    },
    Migration {
        version: 5,
        name: "chunk stored_at",
        sql: include_str!("schema/005_chunk_stored_at.sql"),
    },
    Migration {
        version: 6,
        name: "chunk packs",
        sql: include_str!("schema/006_chunk_packs.sql"),
    },
];

/// The schema version this build writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// `PRAGMA application_id` of a dofs database ("dofs" in ASCII), so a
/// stray SQLite file is refused instead of migrated.
const APPLICATION_ID: i32 = 0x646f_6673;

/// The connection settings every dofs connection runs with.
const PRAGMAS: Pragmas = Pragmas {
    // WAL lets readers (e.g. an sqlite3 shell) run beside the one writer;
    // NORMAL in WAL mode loses at most the last commits on power loss,
    // never consistency.
    journal_mode: JournalMode::Wal,
    synchronous: Synchronous::Normal,
    busy_timeout: std::time::Duration::from_secs(5),
    foreign_keys: true,
    // Checkpoint every 64 MiB of WAL instead of every 4 MiB: a checkpoint
    // copies pages back and fsyncs, and at the default it was a third of
    // the cost of a small file write. A file-backed `Dofs` then replaces
    // this with a WAL hook that checkpoints on another thread
    // (`checkpoint.rs`).
    wal_autocheckpoint: Some(16384),
    // 8 MiB of page cache instead of SQLite's 2 MiB: with the default, the
    // entries/chunks index pages a small write walks were evicted between
    // writes and read back (`readDbPage` in the write profile,
    // bench/RESULTS.md).
    cache_kib: Some(8192),
    stable_query_plans: true,
    // Room for every statement dofs prepares, so none is re-parsed.
    statement_cache: Some(64),
};

/// How a dofs database is opened, `on_damage` aside. A dofs database is
/// authoritative (nothing rebuilds it), so [`crate::Dofs::open`] refuses a
/// damaged file; setting it aside is the caller's explicit choice.
pub(crate) const fn setup(on_damage: OnDamage) -> Setup<'static> {
    Setup {
        what: "the dofs database",
        pragmas: PRAGMAS,
        application_id: Some(APPLICATION_ID),
        migrations: &[MigrationSet {
            owner: "dofs",
            migrations: MIGRATIONS,
            legacy: LegacyBookkeeping::UserVersion,
        }],
        on_damage,
    }
}

#[cfg(test)]
mod tests {
    use rusqlite::Connection;
    use wsd_sqlite::OpenError;
    use wsd_sync::ErrorCode;

    use super::*;
    use crate::test_util::{p, put};
    use crate::{Dofs, DofsError};

    #[test]
    fn a_fresh_database_is_stamped_with_the_current_version_and_wal_mode() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.dofs");
        let d = Dofs::open(&path).unwrap();
        let version: i64 = d
            .conn
            .query_row(
                "SELECT max(version) FROM schema_migrations WHERE owner = 'dofs'",
                [],
                |r| r.get(0),
            )
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
    fn a_cleanly_closed_store_is_stamped_so_the_next_open_skips_the_check() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.dofs");
        {
            let mut d = Dofs::open(&path).unwrap();
            put(&mut d, "a", b"x");
        }
        let stamp = dir.path().join("ws.dofs.clean");
        assert!(stamp.exists(), "a clean close stamps the file");
        let d = Dofs::open(&path).unwrap();
        assert!(!stamp.exists(), "the open consumed it");
        assert_eq!(d.read_file(&p("a")).unwrap(), b"x");
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
        Connection::open(&path)
            .unwrap()
            .execute(
                "INSERT INTO schema_migrations VALUES ('dofs', ?1, 'future', 'x', 0)",
                [SCHEMA_VERSION + 1],
            )
            .unwrap();
        let err = Dofs::open(&path).unwrap_err();
        assert!(
            matches!(err, DofsError::Open(OpenError::NewerMigration { version, .. }) if version == SCHEMA_VERSION + 1),
            "{err}"
        );
        assert_eq!(err.code(), ErrorCode::Io);
        assert!(err.to_string().contains("ws.dofs"), "{err}");

        // One from before `wsd-sqlite`, counting in `user_version`.
        let old = dir.path().join("old.dofs");
        {
            let conn = Connection::open(&old).unwrap();
            conn.pragma_update(None, "application_id", APPLICATION_ID)
                .unwrap();
            conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .unwrap();
        }
        let err = Dofs::open(&old).unwrap_err();
        assert!(
            matches!(err, DofsError::Open(OpenError::NewerMigration { .. })),
            "{err}"
        );
        let v: i64 = Connection::open(&old)
            .unwrap()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, SCHEMA_VERSION + 1, "untouched");
    }

    #[test]
    fn a_damaged_database_is_refused_naming_it_unless_setting_aside_is_asked_for() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.dofs");
        {
            let mut d = Dofs::open(&path).unwrap();
            // Few enough writes that no background checkpoint runs: the
            // close is the last connection, so it empties the WAL.
            for i in 0..20 {
                put(
                    &mut d,
                    &format!("d/f{i}"),
                    &crate::test_util::noise(3000, i),
                );
            }
        }
        let stamp = dir.path().join("ws.dofs.clean");
        assert!(stamp.exists(), "a clean close stamps the file");
        // Damage after a crash: no clean-close stamp.
        std::fs::remove_file(&stamp).unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.seek(SeekFrom::Start(4096)).unwrap();
        f.write_all(&[0xA5; 16384]).unwrap();
        drop(f);
        let bytes = std::fs::read(&path).unwrap();

        let err = Dofs::open(&path).unwrap_err();
        assert!(
            matches!(err, DofsError::Open(OpenError::Damaged { .. })),
            "{err}"
        );
        let msg = err.to_string();
        assert!(
            msg.starts_with("EIO: ") && msg.contains(&path.display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("mv "), "{msg}");
        assert!(std::fs::read(&path).unwrap() == bytes, "nothing changed");

        let d = Dofs::open_with(&path, crate::OnDamage::SetAside).unwrap();
        assert_eq!(d.current_rev().unwrap(), 0, "an empty store");
        let aside = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with("ws.dofs.corrupt-")
                    && !name.to_string_lossy().ends_with("-wal")
                    && !name.to_string_lossy().ends_with("-shm")
            })
            .map(|e| std::fs::read(e.unwrap().path()).unwrap())
            .collect::<Vec<_>>();
        assert_eq!(aside.len(), 1, "the damaged file is kept aside");
        assert!(aside[0] == bytes, "the damaged file is kept as it was");
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
            DofsError::Open(OpenError::Foreign { .. })
        ));
    }

    /// Writes a version-1 database by hand, as the version-1 code laid
    /// files out: every file through `manifests`/`manifest_chunks`.
    fn version_1_database(path: &std::path::Path, files: &[(&str, &[u8])]) {
        use wsd_sync::{chunk, manifest};
        let conn = Connection::open(path).unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.execute_batch(MIGRATIONS[0].sql).unwrap();
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
        let recorded: i64 = d
            .conn
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(recorded, SCHEMA_VERSION);
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
    fn opening_twice_migrates_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ws.dofs");
        drop(Dofs::open(&path).unwrap());
        Connection::open(&path)
            .unwrap()
            .execute("UPDATE meta SET value = 7 WHERE key = 'rev'", [])
            .unwrap();
        let d = Dofs::open(&path).unwrap();
        assert_eq!(d.current_rev().unwrap(), 7);
        let recorded: i64 = d
            .conn
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(recorded, SCHEMA_VERSION);
    }
}
