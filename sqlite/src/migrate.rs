//! Numbered migrations with checksums, per owner, in one bookkeeping table.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior, params};
use sha2::{Digest, Sha256};

use crate::OpenError;

/// The bookkeeping table: one row per applied migration.
pub const MIGRATIONS_TABLE: &str = "schema_migrations";

/// `PRAGMA user_version` of a database whose bookkeeping is in
/// [`MIGRATIONS_TABLE`] ("wsql"). Builds that kept a schema version there
/// read it as a version newer than theirs and refuse the file rather than
/// run their migrations again.
pub const BOOKKEEPING_MARK: i32 = 0x7773_716c;

/// One schema change. Never edit one once released: append a new one (a
/// changed text is refused at open by its checksum).
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// 1, 2, 3, ... within its owner.
    pub version: i64,
    /// A short name, kept in the bookkeeping row and in error messages.
    pub name: &'static str,
    pub sql: &'static str,
}

/// How a database written before this crate recorded an owner's applied
/// migrations; [`crate::open`] moves that record into [`MIGRATIONS_TABLE`]
/// the first time it opens such a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LegacyBookkeeping {
    /// Nothing older exists.
    None,
    /// `PRAGMA user_version` = how many of the owner's migrations ran (the
    /// wsd index, the exec log, dofs). They are recorded with this build's
    /// checksums: the old builds kept no text to compare.
    UserVersion,
    /// A table `(id, name, checksum, applied_at)` with this crate's
    /// checksums (the kernel's `kernel_migrations`); dropped once copied.
    Table(&'static str),
}

/// The numbered migrations one owner (a domain of the database) applies.
#[derive(Debug, Clone, Copy)]
pub struct MigrationSet<'a> {
    /// Unique within the database, e.g. `"index"`, `"accounts"`.
    pub owner: &'static str,
    /// In ascending version order.
    pub migrations: &'a [Migration],
    pub legacy: LegacyBookkeeping,
}

/// The checksum of a migration: SHA-256 of `"{version}\n{name}\n{sql}"`
/// with the SQL trimmed, as hex (the kernel's formula, so its recorded
/// checksums carry over).
pub fn checksum(m: &Migration) -> String {
    let digest = Sha256::digest(format!("{}\n{}\n{}", m.version, m.name, m.sql.trim()));
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn validate(sets: &[MigrationSet<'_>]) -> Result<(), OpenError> {
    for (i, set) in sets.iter().enumerate() {
        let bad = |problem: &str| OpenError::InvalidMigrations {
            owner: set.owner.to_owned(),
            problem: problem.to_owned(),
        };
        if sets[..i].iter().any(|s| s.owner == set.owner) {
            return Err(bad("the owner is listed twice"));
        }
        let ascending = set
            .migrations
            .windows(2)
            .all(|w| w[0].version < w[1].version);
        if !ascending || set.migrations.first().is_some_and(|m| m.version < 1) {
            return Err(bad("versions must be 1 or more, in ascending order"));
        }
    }
    let legacy_user_version = sets
        .iter()
        .filter(|s| s.legacy == LegacyBookkeeping::UserVersion)
        .count();
    if legacy_user_version > 1 {
        return Err(OpenError::InvalidMigrations {
            owner: sets.iter().map(|s| s.owner).collect::<Vec<_>>().join(", "),
            problem: "only one owner can have kept its version in user_version".to_owned(),
        });
    }
    Ok(())
}

/// One row of [`MIGRATIONS_TABLE`].
struct Applied {
    owner: String,
    version: i64,
    name: String,
    checksum: String,
}

fn table_exists(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1",
        [name],
        |_| Ok(()),
    )
    .optional()
    .map(|r| r.is_some())
}

fn read_applied(conn: &Connection) -> rusqlite::Result<Vec<Applied>> {
    let mut stmt = conn.prepare(&format!(
        "SELECT owner, version, name, checksum FROM {MIGRATIONS_TABLE} ORDER BY owner, version"
    ))?;
    stmt.query_map([], |r| {
        Ok(Applied {
            owner: r.get(0)?,
            version: r.get(1)?,
            name: r.get(2)?,
            checksum: r.get(3)?,
        })
    })?
    .collect()
}

/// Whether the database needs no write: bookkeeping in place, every
/// migration applied with matching text, nothing unknown, the application
/// id set. Read-only, so a database opened often (the index, per CLI call)
/// takes no write lock.
fn up_to_date(
    conn: &Connection,
    sets: &[MigrationSet<'_>],
    application_id: Option<i32>,
) -> rusqlite::Result<bool> {
    if let Some(id) = application_id {
        let found: i32 = conn.pragma_query_value(None, "application_id", |r| r.get(0))?;
        if found != id {
            return Ok(false);
        }
    }
    let mark: i32 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    if mark != BOOKKEEPING_MARK || !table_exists(conn, MIGRATIONS_TABLE)? {
        return Ok(false);
    }
    let applied = read_applied(conn)?;
    let wanted: usize = sets.iter().map(|s| s.migrations.len()).sum();
    Ok(applied.len() == wanted
        && applied.iter().all(|a| {
            sets.iter()
                .filter(|s| s.owner == a.owner)
                .flat_map(|s| s.migrations)
                .any(|m| m.version == a.version && checksum(m) == a.checksum)
        }))
}

/// Brings the database to every set's last migration: one `IMMEDIATE`
/// transaction for the whole upgrade (bookkeeping import, checks, pending
/// migrations in list order), so a failure leaves the file as it was.
pub(crate) fn migrate(
    conn: &mut Connection,
    path: &Path,
    sets: &[MigrationSet<'_>],
    application_id: Option<i32>,
) -> Result<(), OpenError> {
    let sql = |doing: &str| {
        let doing = doing.to_owned();
        move |source| OpenError::Sqlite {
            path: path.to_owned(),
            doing,
            source,
        }
    };
    if up_to_date(conn, sets, application_id).map_err(sql("reading the migrations"))? {
        return Ok(());
    }
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(sql("starting the migration"))?;
    if let Some(expected) = application_id {
        claim_application_id(&tx, path, expected)?;
    }
    if !table_exists(&tx, MIGRATIONS_TABLE).map_err(sql("reading the migrations"))? {
        tx.execute_batch(&format!(
            "CREATE TABLE {MIGRATIONS_TABLE} (
                owner TEXT NOT NULL,
                version INTEGER NOT NULL,
                name TEXT NOT NULL,
                checksum TEXT NOT NULL,
                applied_at_ms INTEGER NOT NULL,
                PRIMARY KEY (owner, version)
            )"
        ))
        .map_err(sql("creating the migrations table"))?;
        for set in sets {
            import_legacy(&tx, path, set)?;
        }
    }
    let applied = read_applied(&tx).map_err(sql("reading the migrations"))?;
    for a in &applied {
        let set = sets.iter().find(|s| s.owner == a.owner);
        let known = set.and_then(|s| s.migrations.iter().find(|m| m.version == a.version));
        match known {
            None => {
                return Err(OpenError::NewerMigration {
                    path: path.to_owned(),
                    owner: a.owner.clone(),
                    version: a.version,
                    name: a.name.clone(),
                    known: set
                        .and_then(|s| s.migrations.last())
                        .map_or(0, |m| m.version),
                });
            }
            Some(m) if checksum(m) != a.checksum => {
                return Err(OpenError::MigrationChanged {
                    path: path.to_owned(),
                    owner: a.owner.clone(),
                    version: a.version,
                    name: a.name.clone(),
                });
            }
            Some(_) => {}
        }
    }
    for set in sets {
        for m in set.migrations {
            if applied
                .iter()
                .any(|a| a.owner == set.owner && a.version == m.version)
            {
                continue;
            }
            let doing = format!("migration {} {} ({})", set.owner, m.version, m.name);
            tx.execute_batch(m.sql).map_err(sql(&doing))?;
            record(&tx, set.owner, m, now_ms()).map_err(sql(&doing))?;
            tracing::info!(
                db = %path.display(),
                owner = set.owner,
                version = m.version,
                name = m.name,
                "applied migration"
            );
        }
    }
    tx.pragma_update(None, "user_version", BOOKKEEPING_MARK)
        .map_err(sql("marking the bookkeeping"))?;
    tx.commit().map_err(sql("committing the migration"))
}

fn record(tx: &Transaction<'_>, owner: &str, m: &Migration, at_ms: i64) -> rusqlite::Result<()> {
    tx.execute(
        &format!(
            "INSERT INTO {MIGRATIONS_TABLE} (owner, version, name, checksum, applied_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)"
        ),
        params![owner, m.version, m.name, checksum(m), at_ms],
    )?;
    Ok(())
}

/// A fresh file takes `expected`; a file with tables but no id, or another
/// id, is another program's.
fn claim_application_id(tx: &Transaction<'_>, path: &Path, expected: i32) -> Result<(), OpenError> {
    let sql = |source| OpenError::Sqlite {
        path: path.to_owned(),
        doing: "reading the application id".to_owned(),
        source,
    };
    let found: i32 = tx
        .pragma_query_value(None, "application_id", |r| r.get(0))
        .map_err(sql)?;
    if found == expected {
        return Ok(());
    }
    let tables: i64 = tx
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .map_err(sql)?;
    if found != 0 || tables > 0 {
        return Err(OpenError::Foreign {
            path: path.to_owned(),
            found,
            expected,
        });
    }
    tx.pragma_update(None, "application_id", expected)
        .map_err(sql)
}

/// Moves `set`'s pre-crate record into [`MIGRATIONS_TABLE`].
fn import_legacy(
    tx: &Transaction<'_>,
    path: &Path,
    set: &MigrationSet<'_>,
) -> Result<(), OpenError> {
    let sql = |source| OpenError::Sqlite {
        path: path.to_owned(),
        doing: format!("importing the migrations of {}", set.owner),
        source,
    };
    match set.legacy {
        LegacyBookkeeping::None => Ok(()),
        LegacyBookkeeping::UserVersion => {
            let ran: i64 = tx
                .pragma_query_value(None, "user_version", |r| r.get(0))
                .map_err(sql)?;
            if ran == i64::from(BOOKKEEPING_MARK) || ran <= 0 {
                return Ok(());
            }
            let known = set.migrations.len() as i64;
            if ran > known {
                return Err(OpenError::NewerMigration {
                    path: path.to_owned(),
                    owner: set.owner.to_owned(),
                    version: ran,
                    name: "recorded as PRAGMA user_version".to_owned(),
                    known,
                });
            }
            for m in &set.migrations[..ran as usize] {
                record(tx, set.owner, m, 0).map_err(sql)?;
            }
            tracing::info!(db = %path.display(), owner = set.owner, ran, "imported user_version bookkeeping");
            Ok(())
        }
        LegacyBookkeeping::Table(table) => {
            if !table_exists(tx, table).map_err(sql)? {
                return Ok(());
            }
            let copied = tx
                .execute(
                    &format!(
                        "INSERT INTO {MIGRATIONS_TABLE} (owner, version, name, checksum, applied_at_ms)
                         SELECT ?1, id, name, checksum, applied_at FROM \"{table}\""
                    ),
                    [set.owner],
                )
                .map_err(sql)?;
            tx.execute_batch(&format!("DROP TABLE \"{table}\""))
                .map_err(sql)?;
            tracing::info!(db = %path.display(), owner = set.owner, table, copied, "imported migrations table");
            Ok(())
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
