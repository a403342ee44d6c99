//! The kernel database (`DATA/kernel.sqlite3`): one connection, the single
//! writer, used from blocking threads. It is opened through `wsd-sqlite`:
//! numbered migrations checked at every start (an applied migration whose
//! text changed, or one this build does not know, refuses to start instead
//! of guessing), `quick_check` after a crash, and a damaged file refused
//! with a message naming it: it holds accounts and processes that nothing
//! rebuilds.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension};
use wsd_sqlite::{
    CleanClose, JournalMode, LegacyBookkeeping, MigrationSet, OnDamage, Pragmas, Setup, Synchronous,
};

/// One numbered schema change. Each domain owns its migrations;
/// `domains::migrations()` lists them all, under the one owner `kernel`
/// (the versions are unique across domains, as released databases
/// recorded them).
pub use wsd_sqlite::Migration;

use crate::error::KernelError;

/// WAL: readers never wait on the writer. NORMAL: a power loss may drop
/// the last commits (a login, a queued message), never consistency.
/// Foreign keys: process rows cascade to their messages and runs.
const SETUP: Setup<'static> = Setup {
    what: "the kernel database",
    pragmas: Pragmas {
        journal_mode: JournalMode::Wal,
        synchronous: Synchronous::Normal,
        busy_timeout: std::time::Duration::from_secs(5),
        foreign_keys: true,
        wal_autocheckpoint: None,
        cache_kib: None,
        stable_query_plans: false,
        statement_cache: None,
    },
    application_id: None,
    migrations: &[],
    on_damage: OnDamage::Refuse,
};

/// The kernel database behind its one connection.
#[derive(Debug, Clone)]
pub struct Db {
    inner: Arc<Open>,
}

/// The connection, then what stamps the file clean once it has closed
/// (fields drop in declaration order).
#[derive(Debug)]
struct Open {
    conn: Mutex<Connection>,
    _clean_close: Option<CleanClose>,
}

impl Db {
    /// Opens (creating if needed) and migrates the database at `path`. A
    /// damaged file is refused (the error names it and how to set it
    /// aside).
    pub fn open(path: &Path, migrations: &[Migration]) -> Result<Db, KernelError> {
        Db::open_with(path, migrations, OnDamage::Refuse)
    }

    /// [`Db::open`], with `on_damage` deciding what happens to a file that
    /// fails the crash check ([`OnDamage::SetAside`]: renamed to
    /// `NAME.corrupt-<UTC time>`, and an empty database, i.e. no accounts).
    pub fn open_with(
        path: &Path,
        migrations: &[Migration],
        on_damage: OnDamage,
    ) -> Result<Db, KernelError> {
        let sets = kernel_set(migrations);
        let setup = Setup {
            migrations: &sets,
            on_damage,
            ..SETUP
        };
        let opened = wsd_sqlite::open(path, &setup)
            .map_err(|e| KernelError::Internal(format!("opening the kernel database: {e}")))?;
        Ok(Db {
            inner: Arc::new(Open {
                conn: Mutex::new(opened.conn),
                _clean_close: Some(opened.clean_close),
            }),
        })
    }

    /// A private in-memory database (unit tests).
    pub fn open_in_memory(migrations: &[Migration]) -> Result<Db, KernelError> {
        let sets = kernel_set(migrations);
        let setup = Setup {
            migrations: &sets,
            ..SETUP
        };
        let conn = wsd_sqlite::open_in_memory(&setup)
            .map_err(|e| KernelError::Internal(format!("opening the kernel database: {e}")))?;
        Ok(Db {
            inner: Arc::new(Open {
                conn: Mutex::new(conn),
                _clean_close: None,
            }),
        })
    }

    /// Runs `f` on the connection on a blocking thread.
    pub async fn call<R, F>(&self, f: F) -> Result<R, KernelError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, KernelError> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = inner.conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c)
        })
        .await
        .map_err(|e| KernelError::internal("database task", e))?
    }
}

/// Every domain's migrations as the one owner released databases know
/// (`kernel`, formerly the `kernel_migrations` table).
fn kernel_set(migrations: &[Migration]) -> [MigrationSet<'_>; 1] {
    [MigrationSet {
        owner: "kernel",
        migrations,
        legacy: LegacyBookkeeping::Table("kernel_migrations"),
    }]
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Reads one optional row.
pub fn opt<T>(r: rusqlite::Result<T>) -> Result<Option<T>, KernelError> {
    Ok(r.optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two migrations in the shape of the domains' (the second holds the
    /// `config_kv` table the legacy test writes to).
    fn migrations() -> Vec<Migration> {
        vec![
            Migration {
                version: 1,
                name: "one",
                sql: "CREATE TABLE one(a INTEGER);",
            },
            Migration {
                version: 2,
                name: "config",
                sql: "CREATE TABLE config_kv(key TEXT PRIMARY KEY, value TEXT NOT NULL);",
            },
        ]
    }

    #[test]
    fn reopening_a_database_applies_nothing_twice() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p, &migrations()).unwrap());
        drop(Db::open(&p, &migrations()).unwrap());
        let c = Connection::open(&p).unwrap();
        let n: i64 = c
            .query_row(
                "SELECT count(*) FROM schema_migrations WHERE owner = 'kernel'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(n, migrations().len() as i64);
    }

    #[test]
    fn a_database_with_an_edited_migration_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p, &migrations()).unwrap());
        Connection::open(&p)
            .unwrap()
            .execute(
                "UPDATE schema_migrations SET checksum = 'x' WHERE version = 1",
                [],
            )
            .unwrap();
        let e = Db::open(&p, &migrations()).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
    }

    #[test]
    fn a_database_from_a_newer_kernel_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p, &migrations()).unwrap());
        Connection::open(&p)
            .unwrap()
            .execute(
                "INSERT INTO schema_migrations VALUES ('kernel', 999, 'future', 'x', 0)",
                [],
            )
            .unwrap();
        let e = Db::open(&p, &migrations()).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
    }

    /// As kernels before `wsd-sqlite` left it: `kernel_migrations` with
    /// the same checksums.
    #[test]
    fn a_database_with_the_old_migrations_table_opens_with_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        {
            let c = Connection::open(&p).unwrap();
            c.execute_batch(
                "CREATE TABLE kernel_migrations(
                    id INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,
                    applied_at INTEGER NOT NULL)",
            )
            .unwrap();
            for m in &migrations() {
                c.execute_batch(m.sql).unwrap();
                c.execute(
                    "INSERT INTO kernel_migrations VALUES (?1, ?2, ?3, 5)",
                    rusqlite::params![m.version, m.name, wsd_sqlite::checksum(m)],
                )
                .unwrap();
            }
            c.execute(
                "INSERT INTO config_kv(key, value) VALUES ('kept', 'yes')",
                [],
            )
            .unwrap();
        }
        drop(Db::open(&p, &migrations()).unwrap());
        let c = Connection::open(&p).unwrap();
        let kept: String = c
            .query_row("SELECT value FROM config_kv WHERE key = 'kept'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(kept, "yes");
        let n: i64 = c
            .query_row("SELECT count(*) FROM schema_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, migrations().len() as i64);
    }

    #[test]
    fn a_damaged_database_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        std::fs::write(&p, b"not a database at all, just some text").unwrap();
        let e = Db::open(&p, &migrations()).unwrap_err();
        assert!(
            e.to_string().contains(&p.display().to_string()) && e.to_string().contains("mv "),
            "{e}"
        );
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"not a database at all, just some text"
        );
        drop(Db::open_with(&p, &migrations(), OnDamage::SetAside).unwrap());
        let aside = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                let name = e.as_ref().unwrap().file_name();
                name.to_string_lossy().starts_with("k.sqlite3.corrupt-")
            })
            .count();
        assert_eq!(aside, 1);
    }
}
