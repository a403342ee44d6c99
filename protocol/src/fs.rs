//! `fs.read|write|edit|delete|search`: the arguments (the same on the
//! kernel's native store and on a device) and the results. An operation
//! failure (missing file, permission, bad pattern) is `ok:true, data:
//! {ok:false, error}` ([`crate::OpResult`]).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `fs.read`: a file's numbered lines, or a directory's entries.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ReadArgs {
    /// File or directory.
    pub path: String,
    /// First line to return (1-based).
    pub offset: Option<u64>,
    /// Lines to return at most.
    pub limit: Option<u64>,
}

/// `fs.write`: create or replace a file.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct WriteArgs {
    /// File.
    pub path: String,
    /// The whole new content.
    pub content: String,
}

/// `fs.edit`: replace an exact string in a file.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EditArgs {
    /// File.
    pub path: String,
    /// Text to find.
    pub old_string: String,
    /// Replacement.
    pub new_string: String,
    /// Replace every occurrence (default: the one, which must be unique).
    #[serde(default)]
    pub replace_all: bool,
}

/// `fs.delete`: a file or directory.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct DeleteArgs {
    /// File or directory.
    pub path: String,
}

/// `fs.search`: file contents matching a literal string.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct SearchArgs {
    /// Literal text.
    #[serde(alias = "pattern")]
    pub query: String,
    /// Directory to search (default: home).
    pub path: Option<String>,
    /// Glob filter on file names.
    pub include: Option<String>,
}

/// `fs.read`'s result: a directory listing or a file's lines.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ReadResult {
    Directory {
        path: String,
        files: Vec<String>,
        directories: Vec<String>,
    },
    File {
        path: String,
        /// Numbered lines (`{:>6}\t` then the line).
        content: String,
        lines: usize,
        size: u64,
        /// Present (true) when the file goes on past what was returned.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        truncated: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct WriteResult {
    pub path: String,
    pub size: usize,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct EditResult {
    pub path: String,
    pub replacements: usize,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct DeleteResult {
    pub path: String,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct SearchMatch {
    pub path: String,
    pub line: u64,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct SearchResult {
    pub count: usize,
    pub matches: Vec<SearchMatch>,
    /// Present (true) when more matched than were returned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}
