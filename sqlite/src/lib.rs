//! wsd-sqlite: the one way this workspace opens a SQLite database.
//!
//! [`open`] takes a path and a [`Setup`] the owner writes once as a
//! constant, and does, in order:
//!
//! 1. **Crash check.** If the clean-close stamp (`NAME.clean`, written by
//!    [`CleanClose`] after the last connection closed) is missing or no
//!    longer matches the file (device, inode, size, mtime, ctime; a
//!    non-empty WAL never matches), `PRAGMA quick_check` reads every page.
//!    The stamp is consumed at open, so a crash leaves none.
//! 2. **Damage.** A file that fails the check (or is not a database) is
//!    handled as the owner's [`OnDamage`] says. [`OnDamage::SetAside`]
//!    renames it and its `-wal`/`-shm` to `NAME.corrupt-<UTC time>` and
//!    starts an empty database ([`Opened::set_aside`] says so): for data
//!    derived from elsewhere (the wsd index, rebuilt from the tree) or
//!    worth less than staying up (the exec log). [`OnDamage::Refuse`]
//!    changes nothing and returns [`OpenError::Damaged`], whose message
//!    names the file and the command that sets it aside: for authoritative
//!    data (dofs, the kernel's accounts and processes), where starting
//!    empty would silently lose what a backup could restore. Such an owner
//!    may offer its own explicit flag that passes [`OnDamage::SetAside`].
//! 3. **Pragmas**: journal mode, `synchronous`, busy timeout, foreign keys
//!    and the rest of [`Pragmas`], stated by each owner with its reason.
//! 4. **Migrations**, grouped by owner ([`MigrationSet`]), so several
//!    domains can each own a numbered list in one database. The table
//!    [`MIGRATIONS_TABLE`] is keyed by `(owner, version)` and keeps each
//!    migration's SHA-256 ([`checksum`]). An applied migration whose text
//!    changed ([`OpenError::MigrationChanged`]), or one this build does not
//!    know, of a known owner or an unknown one
//!    ([`OpenError::NewerMigration`]), refuses to open and changes nothing.
//!    Pending migrations run in one `IMMEDIATE` transaction; a database
//!    already up to date is only read. Files written before this crate
//!    (`PRAGMA user_version` counting migrations, or the kernel's
//!    `kernel_migrations` table: [`LegacyBookkeeping`]) are upgraded in
//!    place on first open. `user_version` then holds [`BOOKKEEPING_MARK`],
//!    which builds from before this crate read as "too new" and refuse.
//!
//! It deliberately does not: pool connections, pick a thread model (one
//! writer per database is the owner's rule), run down-migrations, or retry
//! on `SQLITE_BUSY` beyond the busy timeout.

mod damage;
mod error;
mod migrate;
mod pragmas;

use std::path::{Path, PathBuf};

use rusqlite::Connection;

pub use damage::{CleanClose, damage, is_corruption, note_error, set_aside};
pub use error::OpenError;
pub use migrate::{
    BOOKKEEPING_MARK, LegacyBookkeeping, MIGRATIONS_TABLE, Migration, MigrationSet, checksum,
};
pub use pragmas::{JournalMode, Pragmas, Synchronous};

/// What to do with a database file that fails the crash check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDamage {
    /// Leave it and fail with [`OpenError::Damaged`].
    Refuse,
    /// Rename it aside and start an empty database.
    SetAside,
}

/// How one owner opens its database.
#[derive(Debug, Clone, Copy)]
pub struct Setup<'a> {
    /// What the database is, for logs ("the index", "the exec log").
    pub what: &'static str,
    pub pragmas: Pragmas,
    /// `PRAGMA application_id` the file must carry (a fresh file gets it),
    /// so another program's SQLite file is refused ([`OpenError::Foreign`]).
    pub application_id: Option<i32>,
    pub migrations: &'a [MigrationSet<'a>],
    pub on_damage: OnDamage,
}

/// A database [`open`] made ready.
#[derive(Debug)]
pub struct Opened {
    pub conn: Connection,
    /// Stamps the file clean when it drops after `conn` has closed.
    pub clean_close: CleanClose,
    /// Set when a damaged file was renamed aside and this database is new.
    pub set_aside: Option<SetAside>,
}

/// A damaged file [`open`] renamed aside.
#[derive(Debug, Clone)]
pub struct SetAside {
    pub moved_to: PathBuf,
    /// What `quick_check` (or SQLite) said.
    pub reason: String,
}

/// Opens (creating if needed) the database at `path` as `setup` says: crash
/// check, damage handling, pragmas, migrations (see the crate docs).
pub fn open(path: &Path, setup: &Setup<'_>) -> Result<Opened, OpenError> {
    migrate::validate(setup.migrations)?;
    let damage = if damage::take_clean_stamp(path) {
        None
    } else {
        damage::damage(path)
    };
    let set_aside = match (damage, setup.on_damage) {
        (None, _) => None,
        (Some(reason), OnDamage::Refuse) => {
            return Err(OpenError::Damaged {
                path: path.to_owned(),
                reason,
                set_aside_command: damage::set_aside_command(path),
            });
        }
        (Some(reason), OnDamage::SetAside) => {
            let moved_to = damage::set_aside(path).map_err(|source| OpenError::SetAside {
                path: path.to_owned(),
                source,
            })?;
            tracing::warn!(
                db = %path.display(),
                moved_to = %moved_to.display(),
                %reason,
                "{} is damaged: moved aside, starting empty",
                setup.what
            );
            Some(SetAside { moved_to, reason })
        }
    };
    let clean_close = CleanClose::new(path);
    let conn = configured(Connection::open(path), path, &setup.pragmas)?;
    let mut opened = Opened {
        conn,
        clean_close,
        set_aside,
    };
    if let Err(e) = migrate::migrate(
        &mut opened.conn,
        path,
        setup.migrations,
        setup.application_id,
    ) {
        // A refused file was not changed; nothing vouches for it being clean.
        opened.clean_close.distrust();
        return Err(e);
    }
    Ok(opened)
}

/// A private in-memory database with `setup`'s pragmas and migrations
/// (tests, scratch); it has no file to check or set aside.
pub fn open_in_memory(setup: &Setup<'_>) -> Result<Connection, OpenError> {
    migrate::validate(setup.migrations)?;
    let path = Path::new(":memory:");
    let mut conn = configured(Connection::open_in_memory(), path, &setup.pragmas)?;
    migrate::migrate(&mut conn, path, setup.migrations, setup.application_id)?;
    Ok(conn)
}

/// Opens another connection to a database [`open`] already made ready
/// (a reader beside the writer): pragmas only.
pub fn open_connection(path: &Path, pragmas: &Pragmas) -> Result<Connection, OpenError> {
    configured(Connection::open(path), path, pragmas)
}

fn configured(
    conn: rusqlite::Result<Connection>,
    path: &Path,
    pragmas: &Pragmas,
) -> Result<Connection, OpenError> {
    let sql = |doing: &str| {
        let doing = doing.to_owned();
        move |source| OpenError::Sqlite {
            path: path.to_owned(),
            doing,
            source,
        }
    };
    let conn = conn.map_err(sql("opening"))?;
    pragmas.apply(&conn).map_err(sql("configuring"))?;
    Ok(conn)
}

#[cfg(test)]
mod tests;
