//! The operation errors of the `fs.*` family, the same on every target:
//! each names the path (or argument) at fault and has one stable
//! [`FsErrorCode`], sent beside the message as `code`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The machine-readable kind of an [`FsError`] (`data.code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FsErrorCode {
    InvalidArgument,
    NotFound,
    PermissionDenied,
    /// The path leads outside the target's root (a node's `--root`).
    PathEscape,
    IsADirectory,
    NotADirectory,
    /// Neither a regular file nor a directory (a FIFO, a socket, ...).
    NotAFile,
    AlreadyExists,
    BinaryFile,
    TooLarge,
    NoMatch,
    MultipleMatches,
    /// The target refuses this operation on this path (a store's root, an
    /// archived workspace).
    Refused,
    Io,
    Cancelled,
}

impl FsErrorCode {
    /// The code as sent (`not_found`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            FsErrorCode::InvalidArgument => "invalid_argument",
            FsErrorCode::NotFound => "not_found",
            FsErrorCode::PermissionDenied => "permission_denied",
            FsErrorCode::PathEscape => "path_escape",
            FsErrorCode::IsADirectory => "is_a_directory",
            FsErrorCode::NotADirectory => "not_a_directory",
            FsErrorCode::NotAFile => "not_a_file",
            FsErrorCode::AlreadyExists => "already_exists",
            FsErrorCode::BinaryFile => "binary_file",
            FsErrorCode::TooLarge => "too_large",
            FsErrorCode::NoMatch => "no_match",
            FsErrorCode::MultipleMatches => "multiple_matches",
            FsErrorCode::Refused => "refused",
            FsErrorCode::Io => "io",
            FsErrorCode::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for FsErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `fs.*` operation failure, reported as `ok:true, data:{ok:false,
/// error, code}`. Messages keep the seed's wording where it has one
/// (`oldString not found in '<path>'`, `Search query is required.`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    #[error("Invalid arguments: {0}")]
    InvalidArgs(String),
    #[error("Invalid path '{path}': {reason}")]
    InvalidPath { path: String, reason: String },
    #[error("Path not found: {path}")]
    NotFound { path: String },
    #[error("Permission denied: {path}")]
    PermissionDenied { path: String },
    #[error("Path '{path}' is outside the root '{root}'{how}")]
    PathEscape {
        path: String,
        root: String,
        /// How it leaves (empty, or e.g. " (through '..' or a symlink)").
        how: String,
    },
    #[error("Is a directory: {path}")]
    IsADirectory { path: String },
    #[error("Not a directory: {path}")]
    NotADirectory { path: String },
    #[error("Not a regular file or directory: {path}")]
    NotAFile { path: String },
    #[error("Already exists: {path}")]
    AlreadyExists { path: String },
    #[error("Binary file ({content_type}, {size} bytes) - not a text file: '{path}'")]
    Binary {
        path: String,
        content_type: String,
        size: u64,
    },
    #[error("'{path}' is {size} bytes, over the {limit}-byte limit")]
    TooLarge { path: String, size: u64, limit: u64 },
    #[error("oldString must not be empty")]
    EmptyOldString,
    #[error("oldString not found in '{path}'")]
    NoMatch { path: String },
    #[error(
        "oldString found {count} times in '{path}'. Use replaceAll: true or provide more context to make it unique."
    )]
    MultipleMatches { path: String, count: u64 },
    #[error("Search query is required.")]
    EmptyQuery,
    #[error("Invalid include pattern '{pattern}': {reason}")]
    InvalidInclude { pattern: String, reason: String },
    #[error("Refusing to {op} {path}: {reason}")]
    Refused {
        op: &'static str,
        path: String,
        reason: String,
    },
    #[error("Failed to {op} '{path}': {message}")]
    Io {
        op: &'static str,
        path: String,
        message: String,
    },
    #[error("{call} cancelled")]
    Cancelled { call: &'static str },
}

impl FsError {
    pub fn code(&self) -> FsErrorCode {
        use FsError::*;
        match self {
            InvalidArgs(_)
            | InvalidPath { .. }
            | EmptyOldString
            | EmptyQuery
            | InvalidInclude { .. } => FsErrorCode::InvalidArgument,
            NotFound { .. } => FsErrorCode::NotFound,
            PermissionDenied { .. } => FsErrorCode::PermissionDenied,
            PathEscape { .. } => FsErrorCode::PathEscape,
            IsADirectory { .. } => FsErrorCode::IsADirectory,
            NotADirectory { .. } => FsErrorCode::NotADirectory,
            NotAFile { .. } => FsErrorCode::NotAFile,
            AlreadyExists { .. } => FsErrorCode::AlreadyExists,
            Binary { .. } => FsErrorCode::BinaryFile,
            TooLarge { .. } => FsErrorCode::TooLarge,
            NoMatch { .. } => FsErrorCode::NoMatch,
            MultipleMatches { .. } => FsErrorCode::MultipleMatches,
            Refused { .. } => FsErrorCode::Refused,
            Io { .. } => FsErrorCode::Io,
            Cancelled { .. } => FsErrorCode::Cancelled,
        }
    }

    pub fn not_found(path: impl Into<String>) -> FsError {
        FsError::NotFound { path: path.into() }
    }

    pub fn io(op: &'static str, path: impl Into<String>, e: impl std::fmt::Display) -> FsError {
        FsError::Io {
            op,
            path: path.into(),
            message: e.to_string(),
        }
    }
}
