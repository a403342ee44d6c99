//! `repo.*` (seed 000, "Repositories"): versioned trees on git.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListArgs {
    pub owner: Option<String>,
}

/// How a listed repository relates to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RepoKind {
    Home,
    Workspace,
    Package,
    User,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepoSummary {
    pub repo: String,
    pub owner: String,
    pub name: String,
    pub kind: RepoKind,
    pub writable: bool,
    pub public: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Newest commit time of its heads, ms since the epoch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ListResult {
    pub repos: Vec<RepoSummary>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateArgs {
    pub repo: String,
    pub r#ref: Option<String>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateResult {
    pub repo: String,
    pub r#ref: String,
    pub head: Option<String>,
    pub created: bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RefsArgs {
    pub repo: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RefsResult {
    pub repo: String,
    /// Branch name (without `refs/heads/`) → commit.
    pub heads: BTreeMap<String, String>,
    /// Tag name (without `refs/tags/`) → the object it points at.
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadArgs {
    pub repo: String,
    pub r#ref: Option<String>,
    pub path: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    Tree,
    Blob,
    Symlink,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct TreeEntry {
    pub name: String,
    pub path: String,
    /// Git's octal mode, as `git ls-tree` prints it (`100644`, `040000`, …).
    pub mode: String,
    pub hash: String,
    #[serde(rename = "type")]
    pub kind: EntryType,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ReadResult {
    Tree {
        repo: String,
        r#ref: String,
        path: String,
        entries: Vec<TreeEntry>,
    },
    #[serde(rename_all = "camelCase")]
    File {
        repo: String,
        r#ref: String,
        path: String,
        size: u64,
        is_binary: bool,
        /// `null` for binary files.
        content: Option<String>,
    },
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchArgs {
    pub repo: String,
    pub r#ref: Option<String>,
    pub query: String,
    pub prefix: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct SearchMatch {
    pub path: String,
    /// 1-based.
    pub line: u64,
    pub content: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchResult {
    pub repo: String,
    pub r#ref: String,
    pub query: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    pub matches: Vec<SearchMatch>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogArgs {
    pub repo: String,
    pub r#ref: Option<String>,
    pub limit: Option<f64>,
    pub offset: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogEntry {
    pub hash: String,
    pub tree_hash: String,
    pub author: String,
    pub author_email: String,
    /// Seconds since the epoch.
    pub author_time: i64,
    pub committer: String,
    pub committer_email: String,
    pub commit_time: i64,
    pub message: String,
    pub parents: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LogResult {
    pub repo: String,
    pub r#ref: String,
    pub limit: u32,
    pub offset: u64,
    pub entries: Vec<LogEntry>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiffArgs {
    pub repo: String,
    pub commit: String,
    pub context: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileStatus {
    Added,
    Deleted,
    Modified,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LineTag {
    Context,
    Add,
    Delete,
    Binary,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct DiffLine {
    pub tag: LineTag,
    pub content: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hunk {
    pub old_start: u32,
    pub old_count: u32,
    pub new_start: u32,
    pub new_count: u32,
    pub lines: Vec<DiffLine>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiffFile {
    pub path: String,
    pub status: FileStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_hash: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub new_hash: Option<String>,
    /// Absent when only stats were asked for (`compare` with `stat:true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hunks: Option<Vec<Hunk>>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiffStats {
    pub files_changed: u32,
    pub additions: u32,
    pub deletions: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiffResult {
    pub repo: String,
    pub commit_hash: String,
    /// `null` for a root commit (diffed against the empty tree).
    pub parent_hash: Option<String>,
    pub stats: DiffStats,
    pub files: Vec<DiffFile>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompareArgs {
    pub repo: String,
    pub base: String,
    pub head: String,
    pub context: Option<f64>,
    pub stat: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompareResult {
    pub repo: String,
    /// The resolved commit hashes.
    pub base: String,
    pub head: String,
    pub stats: DiffStats,
    pub files: Vec<DiffFile>,
}

/// One change of `repo.apply`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ApplyOp {
    #[serde(rename_all = "camelCase")]
    Put {
        path: String,
        content: Option<String>,
        content_base64: Option<String>,
    },
    Delete {
        path: String,
        recursive: Option<bool>,
    },
    Move {
        from: String,
        to: String,
    },
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplyArgs {
    pub repo: String,
    pub r#ref: Option<String>,
    pub message: String,
    pub expected_head: Option<String>,
    pub allow_empty: Option<bool>,
    pub ops: Vec<ApplyOp>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplyResult {
    /// Always `true` (failures are error frames).
    pub ok: bool,
    pub repo: String,
    pub r#ref: String,
    pub head: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportArgs {
    pub repo: String,
    pub r#ref: Option<String>,
    pub remote_url: String,
    pub remote_ref: Option<String>,
    pub message: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImportResult {
    pub repo: String,
    pub r#ref: String,
    pub head: Option<String>,
    pub changed: bool,
    pub remote_url: String,
    pub remote_ref: String,
}
