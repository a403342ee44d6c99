//! Why a database could not be opened. Every variant names the file.

use std::path::PathBuf;

/// Why [`crate::open`] (or [`crate::open_in_memory`]) refused or failed.
/// Nothing in the file was changed when a variant other than
/// [`OpenError::Sqlite`] or [`OpenError::SetAside`] is returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// SQLite failed while opening, configuring or migrating.
    #[error("{path}: {doing}: {source}", path = .path.display())]
    Sqlite {
        path: PathBuf,
        doing: String,
        #[source]
        source: rusqlite::Error,
    },
    /// The file failed `PRAGMA quick_check` (or is not a database at all)
    /// and its owner keeps data that cannot be rebuilt, so it was left as
    /// it is.
    #[error(
        "{path} is damaged ({reason}); nothing was changed. Restore it from a backup, or move it \
         aside with its -wal and -shm files to start empty: {set_aside_command}",
        path = .path.display()
    )]
    Damaged {
        path: PathBuf,
        reason: String,
        /// The shell command that sets the file aside by hand (or the
        /// owner's flag that does it), for the message.
        set_aside_command: String,
    },
    /// Renaming a damaged file aside failed.
    #[error("setting the damaged database {path} aside: {source}", path = .path.display())]
    SetAside {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A migration that this build knows was applied with different text:
    /// the file's tables may not be what this build's migration made.
    #[error(
        "{path}: applied migration {owner} {version} ({name}) differs from this build's",
        path = .path.display()
    )]
    MigrationChanged {
        path: PathBuf,
        owner: String,
        version: i64,
        name: String,
    },
    /// A newer build applied a migration this one does not know (or the
    /// database is from an owner this build does not have).
    #[error(
        "{path}: migration {owner} {version} ({name}) is newer than this build, which knows \
         {owner} up to {known}",
        path = .path.display()
    )]
    NewerMigration {
        path: PathBuf,
        owner: String,
        version: i64,
        name: String,
        /// The highest version of `owner` this build has (0: none).
        known: i64,
    },
    /// The file is some other program's SQLite database.
    #[error(
        "{path}: not this program's database (application_id {found:#x}, expected {expected:#x})",
        path = .path.display()
    )]
    Foreign {
        path: PathBuf,
        found: i32,
        expected: i32,
    },
    /// The caller's migration list is malformed (a programming error,
    /// caught before the file is touched).
    #[error("migrations of {owner}: {problem}")]
    InvalidMigrations { owner: String, problem: String },
}

impl OpenError {
    /// Whether this says the file is damaged (so a caller may decide to set
    /// it aside).
    pub fn is_damage(&self) -> bool {
        match self {
            OpenError::Damaged { .. } => true,
            OpenError::Sqlite { source, .. } => crate::damage::is_corruption(source),
            _ => false,
        }
    }
}
