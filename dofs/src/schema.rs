//! Opening a database: connection settings and numbered migrations.

use rusqlite::{Connection, TransactionBehavior};

use crate::DofsError;

/// Migration `i` (0-based) takes the schema from version `i` to `i + 1`.
/// The version lives in `PRAGMA user_version`; a new step is appended here,
/// never edited in place once released.
const MIGRATIONS: &[&str] = &[include_str!("schema/001_initial.sql")];

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
    let _mode: String =
        conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", true)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(())
}

/// Brings the schema to [`SCHEMA_VERSION`] in one transaction, refusing a
/// database written by a newer build or by something that is not dofs.
pub(crate) fn migrate(conn: &mut Connection, label: &str) -> Result<(), DofsError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let app: i64 = tx.pragma_query_value(None, "application_id", |r| r.get(0))?;
    let version: i64 = tx.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if app != 0 && app != APPLICATION_ID {
        return Err(DofsError::NotADofsDatabase { path: label.to_owned(), found: app });
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
            return Err(DofsError::NotADofsDatabase { path: label.to_owned(), found: app });
        }
        tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    }
    for (step, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        tx.execute_batch(sql)?;
        tracing::info!(db = label, from = step, to = step + 1, "migrated dofs schema");
    }
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)?;
    tx.commit()?;
    Ok(())
}
