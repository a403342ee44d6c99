use std::path::Path;
use std::time::Duration;

use rusqlite::Connection;

use super::*;

/// Held by the tests that expect a stamp and by the one that bumps the
/// process-wide corruption counter (which would keep theirs from being
/// written).
static STAMP_COUNTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    STAMP_COUNTER.lock().unwrap_or_else(|p| p.into_inner())
}

const PRAGMAS: Pragmas = Pragmas {
    journal_mode: JournalMode::Wal,
    synchronous: Synchronous::Normal,
    busy_timeout: Duration::from_secs(5),
    foreign_keys: true,
    wal_autocheckpoint: None,
    cache_kib: None,
    stable_query_plans: false,
    statement_cache: None,
};

/// `notes` 2 needs `notes` 1's table; `tags` 1 references `notes`.
const NOTES: &[Migration] = &[
    Migration {
        version: 1,
        name: "notes",
        sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
              INSERT INTO notes (body) VALUES ('first');",
    },
    Migration {
        version: 2,
        name: "note titles",
        sql: "ALTER TABLE notes ADD COLUMN title TEXT NOT NULL DEFAULT '';",
    },
];
const TAGS: &[Migration] = &[Migration {
    version: 1,
    name: "tags",
    sql: "CREATE TABLE tags (note INTEGER NOT NULL REFERENCES notes (id), tag TEXT NOT NULL);",
}];

const SETS: &[MigrationSet<'static>] = &[
    MigrationSet {
        owner: "notes",
        migrations: NOTES,
        legacy: LegacyBookkeeping::None,
    },
    MigrationSet {
        owner: "tags",
        migrations: TAGS,
        legacy: LegacyBookkeeping::None,
    },
];

fn setup(migrations: &'static [MigrationSet<'static>], on_damage: OnDamage) -> Setup<'static> {
    Setup {
        what: "the test database",
        pragmas: PRAGMAS,
        application_id: None,
        migrations,
        on_damage,
    }
}

const REFUSE: Setup<'static> = Setup {
    what: "the test database",
    pragmas: PRAGMAS,
    application_id: None,
    migrations: SETS,
    on_damage: OnDamage::Refuse,
};

/// Opens and closes cleanly (stamping the file).
fn open_close(path: &Path, s: &Setup<'_>) {
    let o = open(path, s).unwrap();
    o.clean_close.close(o.conn);
}

fn applied(path: &Path) -> Vec<(String, i64, String)> {
    let c = Connection::open(path).unwrap();
    let mut stmt = c
        .prepare(&format!(
            "SELECT owner, version, checksum FROM {MIGRATIONS_TABLE} ORDER BY owner, version"
        ))
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn user_version(path: &Path) -> i32 {
    Connection::open(path)
        .unwrap()
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

/// Overwrites the pages after the first with garbage: the header still
/// says SQLite, the b-trees do not.
fn damage_pages(path: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(&[0xA5; 8192]).unwrap();
}

/// A database with enough pages that [`damage_pages`] hits b-tree pages.
fn filled(path: &Path) {
    let o = open(path, &REFUSE).unwrap();
    for i in 0..500 {
        o.conn
            .execute(
                "INSERT INTO notes (body) VALUES (?1)",
                [format!("note number {i} with some text")],
            )
            .unwrap();
    }
    o.clean_close.close(o.conn);
}

#[test]
fn migrations_run_in_order_once_each_and_are_recorded_per_owner() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    open_close(&db, &REFUSE);
    open_close(&db, &REFUSE);
    let rows = applied(&db);
    let keys: Vec<_> = rows.iter().map(|(o, v, _)| (o.as_str(), *v)).collect();
    assert_eq!(keys, [("notes", 1), ("notes", 2), ("tags", 1)]);
    assert_eq!(rows[0].2, checksum(&NOTES[0]));
    let c = Connection::open(&db).unwrap();
    let notes: i64 = c
        .query_row("SELECT count(*) FROM notes WHERE title = ''", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(notes, 1, "migration 1 ran once, before migration 2");
    assert_eq!(user_version(&db), BOOKKEEPING_MARK);

    // A later build appends a migration: only that one runs.
    const MORE: &[Migration] = &[
        NOTES[0],
        NOTES[1],
        Migration {
            version: 3,
            name: "second note",
            sql: "INSERT INTO notes (body) VALUES ('second');",
        },
    ];
    const MORE_SETS: &[MigrationSet<'static>] = &[
        MigrationSet {
            owner: "notes",
            migrations: MORE,
            legacy: LegacyBookkeeping::None,
        },
        SETS[1],
    ];
    open_close(&db, &setup(MORE_SETS, OnDamage::Refuse));
    let n: i64 = c
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
    assert_eq!(applied(&db).len(), 4);
}

#[test]
fn an_applied_migration_whose_text_changed_refuses_to_open_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    open_close(&db, &REFUSE);
    const EDITED: &[Migration] = &[
        NOTES[0],
        Migration {
            version: 2,
            name: "note titles",
            sql: "ALTER TABLE notes ADD COLUMN title TEXT;",
        },
    ];
    const EDITED_SETS: &[MigrationSet<'static>] = &[
        MigrationSet {
            owner: "notes",
            migrations: EDITED,
            legacy: LegacyBookkeeping::None,
        },
        SETS[1],
    ];
    let before = applied(&db);
    let err = open(&db, &setup(EDITED_SETS, OnDamage::Refuse)).unwrap_err();
    assert!(
        matches!(&err, OpenError::MigrationChanged { owner, version: 2, .. } if owner == "notes"),
        "{err}"
    );
    assert!(err.to_string().contains("x.sqlite3"), "{err}");
    assert_eq!(applied(&db), before);
}

#[test]
fn an_unknown_newer_migration_or_owner_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    open_close(&db, &REFUSE);
    let insert = |owner: &str, version: i64| {
        Connection::open(&db)
            .unwrap()
            .execute(
                &format!("INSERT INTO {MIGRATIONS_TABLE} VALUES (?1, ?2, 'future', 'x', 0)"),
                rusqlite::params![owner, version],
            )
            .unwrap();
    };
    insert("notes", 3);
    let err = open(&db, &REFUSE).unwrap_err();
    assert!(
        matches!(&err, OpenError::NewerMigration { owner, version: 3, known: 2, .. } if owner == "notes"),
        "{err}"
    );
    Connection::open(&db)
        .unwrap()
        .execute(
            &format!("DELETE FROM {MIGRATIONS_TABLE} WHERE version = 3"),
            [],
        )
        .unwrap();
    insert("billing", 1);
    let err = open(&db, &REFUSE).unwrap_err();
    assert!(
        matches!(&err, OpenError::NewerMigration { owner, known: 0, .. } if owner == "billing"),
        "{err}"
    );
}

#[test]
fn quick_check_runs_when_the_clean_close_stamp_is_missing_or_stale() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    filled(&db);
    let stamp = damage::stamp_path(&db);
    assert!(stamp.exists(), "a clean close stamps the file");

    // A matching stamp vouches for the file: no check, so damage made
    // behind the stamp's back (its state re-recorded) goes unseen once.
    damage_pages(&db);
    std::fs::write(&stamp, damage::file_state(&db).unwrap()).unwrap();
    match open(&db, &REFUSE) {
        Ok(o) => {
            // The crash: the connection goes, no stamp is written.
            std::mem::forget(o.clean_close);
            drop(o.conn);
        }
        Err(e) => assert!(!matches!(e, OpenError::Damaged { .. }), "checked: {e}"),
    }
    assert!(!stamp.exists(), "the open consumed the stamp");

    // No stamp (a crash, or a stale one): the open checks and refuses.
    let err = open(&db, &REFUSE).unwrap_err();
    assert!(matches!(err, OpenError::Damaged { .. }), "{err}");
    assert!(err.is_damage());
}

#[test]
fn a_clean_close_skips_the_check_once_and_any_later_write_revokes_that() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    open_close(&db, &REFUSE);
    let stamp = damage::stamp_path(&db);
    assert!(stamp.exists(), "a clean close leaves a stamp");
    assert!(
        damage::take_clean_stamp(&db),
        "the untouched file matches it"
    );
    assert!(!stamp.exists(), "taking the stamp removes it");
    assert!(
        !damage::take_clean_stamp(&db),
        "without a stamp the file is checked"
    );

    open_close(&db, &REFUSE);
    let c = Connection::open(&db).unwrap();
    c.execute("INSERT INTO notes (body) VALUES ('later')", [])
        .unwrap();
    drop(c);
    assert!(
        !damage::take_clean_stamp(&db),
        "a write after the close revokes it"
    );
}

#[test]
fn a_session_that_met_corruption_leaves_no_stamp() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    let o = open(&db, &REFUSE).unwrap();
    note_error(&rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CORRUPT),
        None,
    ));
    o.clean_close.close(o.conn);
    assert!(!damage::stamp_path(&db).exists());
}

#[test]
fn a_damaged_file_is_refused_untouched_or_set_aside_with_its_wal() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    filled(&db);
    damage_pages(&db);
    std::fs::remove_file(damage::stamp_path(&db)).unwrap();
    let bytes = std::fs::read(&db).unwrap();

    let err = open(&db, &REFUSE).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains(&db.display().to_string()), "{msg}");
    assert!(
        msg.contains("mv "),
        "the message says how to set it aside: {msg}"
    );
    assert_eq!(
        std::fs::read(&db).unwrap(),
        bytes,
        "refused means untouched"
    );

    std::fs::write(dir.path().join("x.sqlite3-wal"), b"stale").unwrap();
    let o = open(&db, &setup(SETS, OnDamage::SetAside)).unwrap();
    let aside = o.set_aside.clone().expect("reported as set aside");
    let name = aside.moved_to.file_name().unwrap().to_str().unwrap();
    let stamp = name.strip_prefix("x.sqlite3.corrupt-").unwrap();
    assert_eq!(stamp.len(), "20250101T000000Z".len(), "{name}");
    assert!(stamp.ends_with('Z'), "{name}");
    assert_eq!(std::fs::read(&aside.moved_to).unwrap(), bytes);
    assert_ne!(
        std::fs::read(dir.path().join("x.sqlite3-wal"))
            .ok()
            .as_deref(),
        Some(&b"stale"[..]),
        "the old WAL does not stay beside the new database"
    );
    let n: i64 = o
        .conn
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1, "a fresh, migrated database");
    o.clean_close.close(o.conn);

    std::fs::write(&db, b"not a database at all, just some text").unwrap();
    std::fs::remove_file(damage::stamp_path(&db)).unwrap();
    let err = open(&db, &REFUSE).unwrap_err();
    assert!(
        matches!(err, OpenError::Damaged { .. }),
        "garbage is damage too: {err}"
    );
}

/// `user_version` counting migrations: the wsd index, exec log and dofs
/// before this crate.
#[test]
fn a_user_version_file_is_upgraded_in_place_and_a_newer_one_refused() {
    const LEGACY: &[MigrationSet<'static>] = &[MigrationSet {
        owner: "notes",
        migrations: NOTES,
        legacy: LegacyBookkeeping::UserVersion,
    }];
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("old.sqlite3");
    {
        let c = Connection::open(&db).unwrap();
        c.execute_batch(NOTES[0].sql).unwrap();
        c.pragma_update(None, "user_version", 1).unwrap();
        c.execute("INSERT INTO notes (body) VALUES ('kept')", [])
            .unwrap();
    }
    open_close(&db, &setup(LEGACY, OnDamage::Refuse));
    let keys: Vec<_> = applied(&db).into_iter().map(|(o, v, _)| (o, v)).collect();
    assert_eq!(keys, [("notes".into(), 1), ("notes".into(), 2)]);
    assert_eq!(user_version(&db), BOOKKEEPING_MARK);
    let c = Connection::open(&db).unwrap();
    let bodies: Vec<String> = c
        .prepare("SELECT body FROM notes WHERE title = '' ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(bodies, ["first", "kept"], "migration 1 was not run again");
    open_close(&db, &setup(LEGACY, OnDamage::Refuse));

    let newer = dir.path().join("newer.sqlite3");
    {
        let c = Connection::open(&newer).unwrap();
        c.execute_batch(NOTES[0].sql).unwrap();
        c.pragma_update(None, "user_version", 3).unwrap();
    }
    let err = open(&newer, &setup(LEGACY, OnDamage::Refuse)).unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::NewerMigration {
                version: 3,
                known: 2,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(user_version(&newer), 3, "untouched");
}

/// A `(id, name, checksum, applied_at)` table: the kernel before this
/// crate.
#[test]
fn a_legacy_migrations_table_is_moved_into_the_shared_one() {
    const LEGACY: &[MigrationSet<'static>] = &[MigrationSet {
        owner: "kernel",
        migrations: NOTES,
        legacy: LegacyBookkeeping::Table("kernel_migrations"),
    }];
    let old = |path: &Path, sum_of_1: &str| {
        let c = Connection::open(path).unwrap();
        c.execute_batch(
            "CREATE TABLE kernel_migrations(id INTEGER PRIMARY KEY, name TEXT NOT NULL,
                checksum TEXT NOT NULL, applied_at INTEGER NOT NULL)",
        )
        .unwrap();
        c.execute_batch(NOTES[0].sql).unwrap();
        c.execute(
            "INSERT INTO kernel_migrations VALUES (1, 'notes', ?1, 1234)",
            [sum_of_1],
        )
        .unwrap();
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("k.sqlite3");
    old(&db, &checksum(&NOTES[0]));
    open_close(&db, &setup(LEGACY, OnDamage::Refuse));
    let keys: Vec<_> = applied(&db).into_iter().map(|(o, v, _)| (o, v)).collect();
    assert_eq!(keys, [("kernel".into(), 1), ("kernel".into(), 2)]);
    let c = Connection::open(&db).unwrap();
    let left: i64 = c
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE name = 'kernel_migrations'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0, "the old table is gone");
    let at: i64 = c
        .query_row(
            &format!("SELECT applied_at_ms FROM {MIGRATIONS_TABLE} WHERE version = 1"),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(at, 1234, "the record is carried over");

    let edited = dir.path().join("edited.sqlite3");
    old(&edited, "not the checksum");
    let err = open(&edited, &setup(LEGACY, OnDamage::Refuse)).unwrap_err();
    assert!(
        matches!(err, OpenError::MigrationChanged { version: 1, .. }),
        "{err}"
    );
    let still: i64 = Connection::open(&edited)
        .unwrap()
        .query_row("SELECT count(*) FROM kernel_migrations", [], |r| r.get(0))
        .unwrap();
    assert_eq!(still, 1, "a refused upgrade changes nothing");
}

#[test]
fn another_programs_database_is_refused() {
    let with_id = |id| Setup {
        application_id: Some(id),
        ..REFUSE
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    open_close(&db, &with_id(0x1234));
    open_close(&db, &with_id(0x1234));
    let err = open(&db, &with_id(0x5678)).unwrap_err();
    assert!(
        matches!(err, OpenError::Foreign { found: 0x1234, .. }),
        "{err}"
    );

    let other = dir.path().join("other.sqlite3");
    Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x)")
        .unwrap();
    let err = open(&other, &with_id(0x1234)).unwrap_err();
    assert!(matches!(err, OpenError::Foreign { found: 0, .. }), "{err}");
}

#[test]
fn pragmas_are_applied_and_in_memory_databases_migrate() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    let o = open(&db, &REFUSE).unwrap();
    let mode: String = o
        .conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    let sync: i64 = o
        .conn
        .pragma_query_value(None, "synchronous", |r| r.get(0))
        .unwrap();
    let fk: bool = o
        .conn
        .pragma_query_value(None, "foreign_keys", |r| r.get(0))
        .unwrap();
    assert_eq!((mode.as_str(), sync, fk), ("wal", 1, true));

    let mem = open_in_memory(&REFUSE).unwrap();
    let n: i64 = mem
        .query_row("SELECT count(*) FROM notes", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn malformed_migration_lists_are_refused_before_the_file_is_touched() {
    const BACKWARDS: &[Migration] = &[NOTES[1], NOTES[0]];
    const SETS_BACKWARDS: &[MigrationSet<'static>] = &[MigrationSet {
        owner: "notes",
        migrations: BACKWARDS,
        legacy: LegacyBookkeeping::None,
    }];
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("x.sqlite3");
    let err = open(&db, &setup(SETS_BACKWARDS, OnDamage::Refuse)).unwrap_err();
    assert!(matches!(err, OpenError::InvalidMigrations { .. }), "{err}");
    assert!(!db.exists());
    const TWICE: &[MigrationSet<'static>] = &[SETS[0], SETS[0]];
    assert!(matches!(
        open(&db, &setup(TWICE, OnDamage::Refuse)).unwrap_err(),
        OpenError::InvalidMigrations { .. }
    ));
}
