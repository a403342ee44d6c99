//! The container-side store: the workspace directory plus its SQLite index.
