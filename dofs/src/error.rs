use wsd_sync::{ErrorCode, SyncError};

/// Everything a dofs operation can fail with. Each variant maps to one wire
/// [`ErrorCode`] ([`DofsError::code`]) and to one POSIX-style name
/// ([`DofsError::posix_name`]) for the kernel's `fs.*` surface; messages name
/// the offending path or hash.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DofsError {
    #[error("ENOENT: {path}: no such file or directory")]
    NotFound { path: String },
    #[error("EEXIST: {path}: already exists")]
    AlreadyExists { path: String },
    #[error("ENOTDIR: {path}: not a directory")]
    NotADirectory { path: String },
    #[error("EISDIR: {path}: is a directory")]
    IsADirectory { path: String },
    #[error("ENOTEMPTY: {path}: directory not empty")]
    NotEmpty { path: String },
    #[error("EINVAL: {path}: {reason}")]
    Invalid { path: String, reason: &'static str },
    /// The database could not be opened: refused (written by a newer
    /// build, a changed migration, another program's file, damaged) or
    /// SQLite failed; the message names the file.
    #[error("EIO: {0}")]
    Open(#[from] wsd_sqlite::OpenError),
    #[error("EIO: integrity check failed: {}", .problems.join("; "))]
    Corrupt { problems: Vec<String> },
    /// A chunk whose stored bytes do not hash to its name.
    #[error("EIO: chunk {hash}: stored bytes do not hash to its name")]
    CorruptChunk { hash: wsd_sync::Hash },
    /// A chunk the index says is in an object store, read from a store
    /// opened without one.
    #[error(
        "EIO: chunk {hash} is kept in an object store, and this store was opened without one (--chunk-store)"
    )]
    ChunkElsewhere { hash: wsd_sync::Hash },
    /// A pack object (many chunks in one object) that cannot be read as
    /// one: names the pack and what is wrong.
    #[error("EIO: pack {pack}: {reason}")]
    CorruptPack {
        pack: wsd_sync::Hash,
        reason: String,
    },
    #[error("EIO: sqlite: {0}")]
    Sqlite(rusqlite::Error),
    /// A chunk-store URL (`--chunk-store`) that cannot be used.
    #[error("EINVAL: chunk store {url}: {reason}")]
    ChunkStoreUrl { url: String, reason: String },
    /// A request to an object chunk store failed: names the store (bucket
    /// and endpoint) and what was asked of it.
    #[error("EIO: chunk store {store}: {op}: {source}")]
    ChunkStore {
        store: String,
        op: String,
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request to an object chunk store got no answer in time.
    #[error("EIO: chunk store {store}: {op}: no answer within {after:?}")]
    ChunkStoreDeadline {
        store: String,
        op: String,
        after: std::time::Duration,
    },
    /// Path validation, limits, chunking input errors, unknown or
    /// mismatching objects: the sync core's own typed errors.
    #[error(transparent)]
    Sync(#[from] SyncError),
}

impl DofsError {
    /// The stable wire code. The contract has no codes for EEXIST, ENOTDIR,
    /// EISDIR or ENOTEMPTY, so they travel as `EINVAL` (their message keeps
    /// the precise name).
    pub fn code(&self) -> ErrorCode {
        match self {
            DofsError::NotFound { .. } => ErrorCode::NotFound,
            DofsError::AlreadyExists { .. }
            | DofsError::NotADirectory { .. }
            | DofsError::IsADirectory { .. }
            | DofsError::NotEmpty { .. }
            | DofsError::Invalid { .. }
            | DofsError::ChunkStoreUrl { .. } => ErrorCode::Invalid,
            DofsError::Open(_)
            | DofsError::Corrupt { .. }
            | DofsError::CorruptChunk { .. }
            | DofsError::ChunkElsewhere { .. }
            | DofsError::CorruptPack { .. }
            | DofsError::Sqlite(_)
            | DofsError::ChunkStore { .. }
            | DofsError::ChunkStoreDeadline { .. } => ErrorCode::Io,
            DofsError::Sync(e) => e.code(),
        }
    }

    /// The POSIX-style name for `fs.*` callers (`EEXIST`, `ENOTDIR`, ...),
    /// falling back to the wire code where POSIX has nothing finer.
    pub fn posix_name(&self) -> &'static str {
        match self {
            DofsError::AlreadyExists { .. } => "EEXIST",
            DofsError::NotADirectory { .. } => "ENOTDIR",
            DofsError::IsADirectory { .. } => "EISDIR",
            DofsError::NotEmpty { .. } => "ENOTEMPTY",
            other => other.code().as_str(),
        }
    }

    pub(crate) fn not_found(path: impl ToString) -> DofsError {
        DofsError::NotFound {
            path: path.to_string(),
        }
    }

    pub(crate) fn invalid(path: impl ToString, reason: &'static str) -> DofsError {
        DofsError::Invalid {
            path: path.to_string(),
            reason,
        }
    }
}

impl From<rusqlite::Error> for DofsError {
    fn from(e: rusqlite::Error) -> DofsError {
        // A damaged page met in a session keeps its close from stamping
        // the file clean, so the next open checks it.
        wsd_sqlite::note_error(&e);
        DofsError::Sqlite(e)
    }
}

impl From<rusqlite::types::FromSqlError> for DofsError {
    fn from(e: rusqlite::types::FromSqlError) -> DofsError {
        DofsError::Sqlite(e.into())
    }
}

impl From<DofsError> for SyncError {
    fn from(e: DofsError) -> SyncError {
        match e {
            DofsError::NotFound { path } => SyncError::NotFound { path },
            DofsError::Sync(e) => e,
            other if other.code() == ErrorCode::Io => SyncError::Storage(other.to_string()),
            other => SyncError::Invalid(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wsd_sync::Hash;

    #[test]
    fn every_variant_maps_to_one_wire_code_and_names_its_path() {
        let cases: Vec<(DofsError, ErrorCode, &str)> = vec![
            (DofsError::not_found("a/b"), ErrorCode::NotFound, "ENOENT"),
            (
                DofsError::AlreadyExists { path: "a/b".into() },
                ErrorCode::Invalid,
                "EEXIST",
            ),
            (
                DofsError::NotADirectory { path: "a/b".into() },
                ErrorCode::Invalid,
                "ENOTDIR",
            ),
            (
                DofsError::IsADirectory { path: "a/b".into() },
                ErrorCode::Invalid,
                "EISDIR",
            ),
            (
                DofsError::NotEmpty { path: "a/b".into() },
                ErrorCode::Invalid,
                "ENOTEMPTY",
            ),
            (
                DofsError::invalid("a/b", "nope"),
                ErrorCode::Invalid,
                "EINVAL",
            ),
            (
                DofsError::Open(wsd_sqlite::OpenError::NewerMigration {
                    path: "a/b".into(),
                    owner: "dofs".into(),
                    version: 9,
                    name: "future".into(),
                    known: 2,
                }),
                ErrorCode::Io,
                "EIO",
            ),
            (
                DofsError::Sync(SyncError::UnknownHash {
                    hash: Hash::of(b"x"),
                    path: Some("a/b".into()),
                }),
                ErrorCode::UnknownHash,
                "EUNKNOWN_HASH",
            ),
            (
                DofsError::ChunkStoreUrl {
                    url: "s3://a/b".into(),
                    reason: "no endpoint".into(),
                },
                ErrorCode::Invalid,
                "EINVAL",
            ),
            (
                DofsError::ChunkStoreDeadline {
                    store: "s3://a/b".into(),
                    op: "listing".into(),
                    after: std::time::Duration::from_secs(1),
                },
                ErrorCode::Io,
                "EIO",
            ),
        ];
        for (err, code, posix) in cases {
            assert_eq!(err.code(), code, "{err}");
            assert_eq!(err.posix_name(), posix, "{err}");
            assert!(
                err.to_string().contains("a/b"),
                "{err} does not name its path"
            );
            assert!(err.to_string().starts_with(posix), "{err}");
            assert_eq!(SyncError::from(err).code(), code);
        }
    }
}
