//! The kernel database (`DATA/kernel.sqlite3`): one connection, the single
//! writer, used from blocking threads. Schema changes are numbered
//! migrations checked at every start: an applied migration whose text
//! changed, or one this build does not know (a newer kernel wrote the
//! file), refuses to start instead of guessing.
//!
//! Why not `rusqlite_migration`: its newest release (2.6) pins rusqlite
//! 0.40, and the workspace is on 0.41 (one `libsqlite3-sys` per build).

use std::path::Path;
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::error::KernelError;

/// One numbered schema change, applied in id order in its own transaction.
/// Each domain owns its migrations; `domains::MIGRATIONS` lists them all.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    pub id: i64,
    pub name: &'static str,
    pub sql: &'static str,
}

impl Migration {
    /// What `kernel_migrations.checksum` holds for this migration.
    pub fn checksum(&self) -> String {
        let mut h = Sha256::new();
        h.update(format!("{}\n{}\n{}", self.id, self.name, self.sql.trim()));
        hex::encode(h.finalize())
    }
}

/// The kernel database behind its one connection.
#[derive(Debug, Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
}

impl Db {
    /// Opens (creating if needed) the database at `path` and applies
    /// `migrations` (every domain's, from `domains::MIGRATIONS`).
    pub fn open(path: &Path, migrations: &[Migration]) -> Result<Db, KernelError> {
        let conn = Connection::open(path)
            .map_err(|e| KernelError::internal(&format!("opening {}", path.display()), e))?;
        Db::init(conn, path, migrations)
    }

    /// A private in-memory database (unit tests).
    pub fn open_in_memory(migrations: &[Migration]) -> Result<Db, KernelError> {
        Db::init(
            Connection::open_in_memory()?,
            Path::new(":memory:"),
            migrations,
        )
    }

    fn init(
        mut conn: Connection,
        path: &Path,
        migrations: &[Migration],
    ) -> Result<Db, KernelError> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&mut conn, path, migrations)?;
        Ok(Db {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` on the connection on a blocking thread.
    pub async fn call<R, F>(&self, f: F) -> Result<R, KernelError>
    where
        R: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<R, KernelError> + Send + 'static,
    {
        let conn = self.conn.clone();
        tokio::task::spawn_blocking(move || {
            let mut c = conn.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut c)
        })
        .await
        .map_err(|e| KernelError::internal("database task", e))?
    }
}

fn migrate(
    conn: &mut Connection,
    path: &Path,
    migrations: &[Migration],
) -> Result<(), KernelError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS kernel_migrations(
            id INTEGER PRIMARY KEY, name TEXT NOT NULL, checksum TEXT NOT NULL,
            applied_at INTEGER NOT NULL)",
    )?;
    let applied: Vec<(i64, String, String)> = {
        let mut stmt =
            conn.prepare("SELECT id, name, checksum FROM kernel_migrations ORDER BY id")?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<Result<_, _>>()?
    };
    for (id, name, sum) in &applied {
        match migrations.iter().find(|m| m.id == *id) {
            None => {
                return Err(KernelError::Internal(format!(
                    "{}: migration {id} ({name}) is newer than this kernel",
                    path.display()
                )));
            }
            Some(m) if m.checksum() != *sum => {
                return Err(KernelError::Internal(format!(
                    "{}: applied migration {id} ({name}) differs from this build's",
                    path.display()
                )));
            }
            Some(_) => {}
        }
    }
    let mut pending: Vec<&Migration> = migrations
        .iter()
        .filter(|m| !applied.iter().any(|a| a.0 == m.id))
        .collect();
    pending.sort_by_key(|m| m.id);
    for m in pending {
        let (id, name) = (m.id, m.name);
        let tx = conn.transaction()?;
        tx.execute_batch(m.sql)?;
        tx.execute(
            "INSERT INTO kernel_migrations(id, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)",
            params![id, name, m.checksum(), now_ms()],
        )?;
        tx.commit()?;
        tracing::info!(id, name, "applied kernel migration");
    }
    Ok(())
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

    const MIGRATIONS: &[Migration] = &[
        Migration {
            id: 1,
            name: "one",
            sql: "CREATE TABLE one(a INTEGER);",
        },
        Migration {
            id: 2,
            name: "two",
            sql: "CREATE TABLE two(b INTEGER);",
        },
    ];

    #[test]
    fn reopening_a_database_applies_nothing_twice() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p, MIGRATIONS).unwrap());
        drop(Db::open(&p, MIGRATIONS).unwrap());
        let c = Connection::open(&p).unwrap();
        let n: i64 = c
            .query_row("SELECT count(*) FROM kernel_migrations", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_database_with_an_edited_migration_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p, MIGRATIONS).unwrap());
        Connection::open(&p)
            .unwrap()
            .execute(
                "UPDATE kernel_migrations SET checksum = 'x' WHERE id = 1",
                [],
            )
            .unwrap();
        let e = Db::open(&p, MIGRATIONS).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
    }

    #[test]
    fn a_database_from_a_newer_kernel_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p, MIGRATIONS).unwrap());
        Connection::open(&p)
            .unwrap()
            .execute(
                "INSERT INTO kernel_migrations VALUES (999, 'future', 'x', 0)",
                [],
            )
            .unwrap();
        let e = Db::open(&p, MIGRATIONS).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
    }
}
