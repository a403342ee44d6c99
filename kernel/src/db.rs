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
    CleanClose, JournalMode, LegacyBookkeeping, Migration, MigrationSet, OnDamage, Pragmas, Setup,
    Synchronous,
};

use crate::error::KernelError;

/// Applied in version order. Never edit an entry once released; add a new
/// one. Kernels before `wsd-sqlite` kept them in `kernel_migrations`.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "accounts",
        sql: "CREATE TABLE passwd(
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
    },
    Migration {
        version: 2,
        name: "workspaces",
        sql: "CREATE TABLE workspaces(
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
    },
    Migration {
        version: 3,
        name: "devices",
        sql: "CREATE TABLE devices(
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
    },
    Migration {
        version: 4,
        name: "processes",
        sql: "CREATE TABLE processes(
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
    },
];

/// WAL: readers never wait on the writer. NORMAL: a power loss may drop
/// the last commits (a login, a queued message), never consistency.
/// Foreign keys: process rows cascade to their messages and runs.
const SETUP: Setup = Setup {
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
    migrations: &[MigrationSet {
        owner: "kernel",
        migrations: MIGRATIONS,
        legacy: LegacyBookkeeping::Table("kernel_migrations"),
    }],
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
    pub fn open(path: &Path) -> Result<Db, KernelError> {
        Db::open_with(path, OnDamage::Refuse)
    }

    /// [`Db::open`], with `on_damage` deciding what happens to a file that
    /// fails the crash check ([`OnDamage::SetAside`]: renamed to
    /// `NAME.corrupt-<UTC time>`, and an empty database, i.e. no accounts).
    pub fn open_with(path: &Path, on_damage: OnDamage) -> Result<Db, KernelError> {
        let opened = wsd_sqlite::open(path, &Setup { on_damage, ..SETUP })
            .map_err(|e| KernelError::Internal(format!("opening the kernel database: {e}")))?;
        Ok(Db {
            inner: Arc::new(Open {
                conn: Mutex::new(opened.conn),
                _clean_close: Some(opened.clean_close),
            }),
        })
    }

    /// A private in-memory database (unit tests).
    pub fn open_in_memory() -> Result<Db, KernelError> {
        let conn = wsd_sqlite::open_in_memory(&SETUP)
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
            .query_row(
                "SELECT count(*) FROM schema_migrations WHERE owner = 'kernel'",
                [],
                |r| r.get(0),
            )
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
                "UPDATE schema_migrations SET checksum = 'x' WHERE version = 1",
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
                "INSERT INTO schema_migrations VALUES ('kernel', 999, 'future', 'x', 0)",
                [],
            )
            .unwrap();
        let e = Db::open(&p).unwrap_err();
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
            for m in MIGRATIONS {
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
        drop(Db::open(&p).unwrap());
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
        assert_eq!(n, MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_damaged_database_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k.sqlite3");
        std::fs::write(&p, b"not a database at all, just some text").unwrap();
        let e = Db::open(&p).unwrap_err();
        assert!(
            e.to_string().contains(&p.display().to_string()) && e.to_string().contains("mv "),
            "{e}"
        );
        assert_eq!(
            std::fs::read(&p).unwrap(),
            b"not a database at all, just some text"
        );
        drop(Db::open_with(&p, OnDamage::SetAside).unwrap());
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
