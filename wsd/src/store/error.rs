//! Errors of the workspace store and their wire codes.

use wsd_sync::SyncError;

/// Why [`super::WorkspaceStore::open`] failed. Every variant maps to one wire
/// code through `From<StoreError> for SyncError`; the message names the path
/// at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The root or the state directory could not be created, resolved or read.
    #[error("EIO: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The SQLite index could not be opened, configured or migrated.
    #[error("EIO: index {context}: {source}")]
    Index {
        context: String,
        #[source]
        source: rusqlite::Error,
    },
    /// The index was refused at open: written by a newer build (opening it
    /// would risk misreading its tables), a changed migration, or damage it
    /// could not set aside.
    #[error("EIO: index: {0}")]
    Database(#[source] Box<wsd_sqlite::OpenError>),
    /// A bad argument, e.g. a root that is not a directory.
    #[error("EINVAL: {0}")]
    Invalid(String),
    #[error(transparent)]
    Sync(#[from] SyncError),
}

impl From<StoreError> for SyncError {
    fn from(e: StoreError) -> SyncError {
        match e {
            StoreError::Io { context, source } => SyncError::Io { context, source },
            StoreError::Invalid(m) => SyncError::Invalid(m),
            StoreError::Sync(e) => e,
            other @ (StoreError::Index { .. } | StoreError::Database(_)) => {
                SyncError::Storage(other.to_string().trim_start_matches("EIO: ").to_owned())
            }
        }
    }
}

/// Attaches what the store was doing to a SQLite error, as the `EIO` the
/// wire reports for a local storage failure.
pub(crate) trait IndexContext<T> {
    fn ctx(self, what: &str) -> Result<T, SyncError>;
}

impl<T> IndexContext<T> for Result<T, rusqlite::Error> {
    fn ctx(self, what: &str) -> Result<T, SyncError> {
        self.map_err(|e| {
            wsd_sqlite::note_error(&e);
            SyncError::Storage(format!("index: {what}: {e}"))
        })
    }
}

/// Attaches the path (or other context) to an I/O error.
pub(crate) trait IoContext<T> {
    fn io_ctx(self, what: impl FnOnce() -> String) -> Result<T, SyncError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_ctx(self, what: impl FnOnce() -> String) -> Result<T, SyncError> {
        self.map_err(|e| SyncError::io(what(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wsd_sync::ErrorCode;

    #[test]
    fn every_open_error_maps_to_one_wire_code() {
        let io = StoreError::Io {
            context: "root".into(),
            source: std::io::Error::other("x"),
        };
        assert_eq!(SyncError::from(io).code(), ErrorCode::Io);
        let idx = StoreError::Index {
            context: "open".into(),
            source: rusqlite::Error::InvalidQuery,
        };
        assert_eq!(SyncError::from(idx).code(), ErrorCode::Io);
        let newer = StoreError::Database(Box::new(wsd_sqlite::OpenError::NewerMigration {
            path: "state/index.sqlite3".into(),
            owner: "index".into(),
            version: 9,
            name: "future".into(),
            known: 2,
        }));
        let e = SyncError::from(newer);
        assert_eq!(e.code(), ErrorCode::Io);
        assert!(e.to_string().contains("index 9"), "{e}");
        assert_eq!(
            SyncError::from(StoreError::Invalid("x".into())).code(),
            ErrorCode::Invalid
        );
    }
}
