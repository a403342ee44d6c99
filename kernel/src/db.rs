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

/// `(id, name, sql)`, applied in id order, one transaction each. Never edit
/// an entry once released; add a new one.
const MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "accounts",
        "CREATE TABLE passwd(
            username TEXT PRIMARY KEY,
            uid INTEGER NOT NULL UNIQUE,
            gid INTEGER NOT NULL,
            gecos TEXT NOT NULL DEFAULT '',
            home TEXT NOT NULL,
            shell TEXT NOT NULL DEFAULT '/bin/init');
         CREATE TABLE shadow(
            username TEXT PRIMARY KEY,
            hash TEXT NOT NULL DEFAULT '!',
            lastchanged INTEGER);
         CREATE TABLE groups(
            name TEXT PRIMARY KEY,
            gid INTEGER NOT NULL UNIQUE,
            members TEXT NOT NULL DEFAULT '');
         CREATE TABLE group_capabilities(
            gid INTEGER NOT NULL,
            capability TEXT NOT NULL,
            PRIMARY KEY(gid, capability));
         CREATE TABLE auth_tokens(
            token_id TEXT PRIMARY KEY,
            uid INTEGER NOT NULL,
            kind TEXT NOT NULL,
            label TEXT,
            token_hash TEXT NOT NULL UNIQUE,
            token_prefix TEXT NOT NULL,
            allowed_role TEXT,
            allowed_device_id TEXT,
            created_at INTEGER NOT NULL,
            last_used_at INTEGER,
            expires_at INTEGER,
            revoked_at INTEGER,
            revoked_reason TEXT);
         CREATE INDEX auth_tokens_uid ON auth_tokens(uid);
         CREATE TABLE config_kv(key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    ),
    (
        2,
        "workspaces",
        "CREATE TABLE workspaces(
            workspace_id TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            label TEXT,
            kind TEXT NOT NULL DEFAULT 'thread',
            state TEXT NOT NULL DEFAULT 'active',
            backend TEXT NOT NULL DEFAULT 'local',
            remote_address TEXT,
            remote_token_file TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL);
         CREATE INDEX workspaces_owner ON workspaces(owner_uid);
         CREATE TABLE shell_sessions(
            session_id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL,
            owner_uid INTEGER NOT NULL,
            exec_id TEXT NOT NULL,
            status TEXT NOT NULL,
            exit_code INTEGER,
            error TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL);
         CREATE INDEX shell_sessions_expiry ON shell_sessions(expires_at);",
    ),
    (
        3,
        "devices",
        "CREATE TABLE devices(
            device_id TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            label TEXT NOT NULL DEFAULT '',
            description TEXT NOT NULL DEFAULT '',
            implements TEXT NOT NULL DEFAULT '[]',
            platform TEXT NOT NULL DEFAULT '',
            version TEXT NOT NULL DEFAULT '',
            online INTEGER NOT NULL DEFAULT 0,
            first_seen_at INTEGER NOT NULL,
            last_seen_at INTEGER NOT NULL,
            connected_at INTEGER,
            disconnected_at INTEGER);
         CREATE TABLE device_access(
            device_id TEXT NOT NULL,
            gid INTEGER NOT NULL,
            PRIMARY KEY(device_id, gid));
         CREATE TABLE routing_table(
            id TEXT PRIMARY KEY,
            call TEXT NOT NULL,
            origin_type TEXT NOT NULL,
            origin_id TEXT NOT NULL,
            device_id TEXT NOT NULL,
            driver_connection_id TEXT,
            created_at INTEGER NOT NULL,
            expires_at INTEGER);
         CREATE INDEX routing_table_driver ON routing_table(driver_connection_id);
         CREATE TABLE device_shell_sessions(
            session_id TEXT PRIMARY KEY,
            device_id TEXT NOT NULL,
            owner_uid INTEGER NOT NULL,
            status TEXT NOT NULL,
            exit_code INTEGER,
            error TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL);
         CREATE INDEX device_shell_sessions_device ON device_shell_sessions(device_id);
         CREATE INDEX device_shell_sessions_expiry ON device_shell_sessions(expires_at);",
    ),
    (
        4,
        "processes",
        "CREATE TABLE processes(
            pid TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            uid INTEGER NOT NULL,
            username TEXT NOT NULL,
            interactive INTEGER NOT NULL DEFAULT 1,
            parent_pid TEXT,
            label TEXT,
            cwd TEXT NOT NULL,
            workspace_id TEXT,
            state TEXT NOT NULL DEFAULT 'idle',
            active_run_id TEXT,
            queued_count INTEGER NOT NULL DEFAULT 0,
            last_active_at INTEGER,
            created_at INTEGER NOT NULL);
         CREATE INDEX processes_owner ON processes(owner_uid);
         CREATE TABLE proc_messages(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            run_id TEXT,
            body TEXT NOT NULL,
            created_at INTEGER NOT NULL);
         CREATE INDEX proc_messages_pid ON proc_messages(pid, id);
         CREATE TABLE proc_runs(
            run_id TEXT PRIMARY KEY,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            status TEXT NOT NULL,
            error TEXT,
            started_at INTEGER NOT NULL,
            finished_at INTEGER);
         CREATE INDEX proc_runs_status ON proc_runs(status);
         CREATE TABLE proc_queue(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            body TEXT NOT NULL,
            created_at INTEGER NOT NULL);
         CREATE TABLE proc_hil(
            request_id TEXT PRIMARY KEY,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            run_id TEXT NOT NULL,
            call TEXT NOT NULL,
            args TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending',
            created_at INTEGER NOT NULL);
         CREATE TABLE proc_allow(
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            call TEXT NOT NULL,
            PRIMARY KEY(pid, call));",
    ),
];

/// The kernel database behind its one connection.
#[derive(Debug, Clone)]
pub struct Db {
    conn: Arc<Mutex<Connection>>,
}

impl Db {
    /// Opens (creating if needed) and migrates the database at `path`.
    pub fn open(path: &Path) -> Result<Db, KernelError> {
        let conn = Connection::open(path)
            .map_err(|e| KernelError::internal(&format!("opening {}", path.display()), e))?;
        Db::init(conn, path)
    }

    /// A private in-memory database (unit tests).
    pub fn open_in_memory() -> Result<Db, KernelError> {
        Db::init(Connection::open_in_memory()?, Path::new(":memory:"))
    }

    fn init(mut conn: Connection, path: &Path) -> Result<Db, KernelError> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        migrate(&mut conn, path)?;
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

fn checksum(id: i64, name: &str, sql: &str) -> String {
    let mut h = Sha256::new();
    h.update(format!("{id}\n{name}\n{}", sql.trim()));
    hex::encode(h.finalize())
}

fn migrate(conn: &mut Connection, path: &Path) -> Result<(), KernelError> {
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
        match MIGRATIONS.iter().find(|m| m.0 == *id) {
            None => {
                return Err(KernelError::Internal(format!(
                    "{}: migration {id} ({name}) is newer than this kernel",
                    path.display()
                )));
            }
            Some(m) if checksum(m.0, m.1, m.2) != *sum => {
                return Err(KernelError::Internal(format!(
                    "{}: applied migration {id} ({name}) differs from this build's",
                    path.display()
                )));
            }
            Some(_) => {}
        }
    }
    for &(id, name, sql) in MIGRATIONS {
        if applied.iter().any(|a| a.0 == id) {
            continue;
        }
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.execute(
            "INSERT INTO kernel_migrations(id, name, checksum, applied_at) VALUES (?1, ?2, ?3, ?4)",
            params![id, name, checksum(id, name, sql), now_ms()],
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

    #[test]
    fn reopening_a_database_applies_nothing_twice() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p).unwrap());
        drop(Db::open(&p).unwrap());
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
        drop(Db::open(&p).unwrap());
        Connection::open(&p)
            .unwrap()
            .execute(
                "UPDATE kernel_migrations SET checksum = 'x' WHERE id = 1",
                [],
            )
            .unwrap();
        let e = Db::open(&p).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
    }

    #[test]
    fn a_database_from_a_newer_kernel_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        drop(Db::open(&p).unwrap());
        Connection::open(&p)
            .unwrap()
            .execute(
                "INSERT INTO kernel_migrations VALUES (999, 'future', 'x', 0)",
                [],
            )
            .unwrap();
        let e = Db::open(&p).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
    }
}
