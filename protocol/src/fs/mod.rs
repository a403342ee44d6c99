//! `fs.read|write|edit|delete|search`: one contract on every target. The
//! arguments, the results, the operation errors ([`FsError`]) and the
//! output format ([`text`]: line numbering, caps, `truncated`) are defined
//! here once; the kernel's native store (dofs), the node tools (disk) and
//! the kernel's relay of a reference device's `fs.read` body all build
//! their answers from them. An operation failure (missing file,
//! permission, bad pattern) is `ok:true, data:{ok:false, error, code}`
//! ([`crate::OpResult`]).
//!
//! The format follows the seed: lines are numbered `{n}\t{line}` from
//! `offset + 1` (seed 003's Read; the reference numbers a device's body the
//! same way), and a read returns at most [`MAX_READ_CONTENT_BYTES`] of
//! numbered text, then stops with `truncated: true` and `nextOffset`.

mod error;
pub mod text;

#[cfg(feature = "testkit")]
pub mod testkit;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use error::{FsError, FsErrorCode};
pub use text::{ContentType, TextWindow, content_type};

/// Most bytes of numbered text one `fs.read` returns; a longer window stops
/// early with `truncated: true` and `nextOffset` (what a model can take in
/// one read; the reference's own read has no cap).
pub const MAX_READ_CONTENT_BYTES: usize = 256 * 1024;
/// Images are returned inline (base64), so they are capped (the reference
/// CLI's image cap).
pub const MAX_IMAGE_BYTES: u64 = 10 * 1024 * 1024;
/// `fs.edit` loads the whole file; larger files are refused.
pub const MAX_EDIT_BYTES: u64 = 16 * 1024 * 1024;
/// `fs.search` stops after this many matches and says `truncated: true`
/// (the seed's 100).
pub const MAX_SEARCH_MATCHES: usize = 100;
/// Matching lines are cut to this many characters (the seed's 200).
pub const MAX_SEARCH_LINE_CHARS: usize = 200;
/// How much of a file is sniffed for its type.
pub const SNIFF_BYTES: usize = 8192;

/// `fs.read`: a file's numbered lines, or a directory's entries.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ReadArgs {
    /// File or directory.
    pub path: String,
    /// Lines to skip (0-based; numbering starts at offset + 1).
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
    /// Directory to search (default: the caller's cwd).
    pub path: Option<String>,
    /// Glob on file names (on the path below `path` when it has a `/`).
    pub include: Option<String>,
}

/// `fs.read`'s result: a directory listing, a text file's lines or an
/// image.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ReadResult {
    Directory(DirectoryListing),
    Image(ImageFile),
    Text(TextFile),
}

/// A directory's entries, each list sorted by name. Symlinks and special
/// files count as files.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct DirectoryListing {
    pub path: String,
    pub files: Vec<String>,
    pub directories: Vec<String>,
}

/// What a file read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    Text,
    Image,
}

/// A text file's selected lines.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TextFile {
    pub path: String,
    /// The file's size in bytes.
    pub size: u64,
    /// Always [`FileKind::Text`].
    pub kind: FileKind,
    pub content_type: String,
    /// Numbered lines: `{n}\t{line}`, joined with `\n`.
    pub content: String,
    /// Lines returned.
    pub lines: u64,
    /// Present (true) when the read stopped at [`MAX_READ_CONTENT_BYTES`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// With `truncated`: the `offset` that reads on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_offset: Option<u64>,
}

/// An image, inline.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageFile {
    pub path: String,
    pub size: u64,
    /// Always [`FileKind::Image`].
    pub kind: FileKind,
    pub content_type: String,
    /// One image block.
    pub content: Vec<ImageBlock>,
}

/// A content block holding an image (the model's image input).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ImageBlock {
    /// Always `image`.
    #[serde(rename = "type")]
    pub block_type: String,
    /// Base64 of the file.
    pub data: String,
    pub mime_type: String,
}

impl ImageFile {
    /// An image result holding `base64` (the file's bytes, encoded).
    pub fn new(path: String, size: u64, content_type: String, base64: String) -> ImageFile {
        ImageFile {
            path,
            size,
            kind: FileKind::Image,
            content: vec![ImageBlock {
                block_type: "image".into(),
                data: base64,
                mime_type: content_type.clone(),
            }],
            content_type,
        }
    }
}

impl DirectoryListing {
    /// A listing with both lists sorted by name.
    pub fn sorted(path: String, mut files: Vec<String>, mut directories: Vec<String>) -> Self {
        files.sort();
        directories.sort();
        DirectoryListing {
            path,
            files,
            directories,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct WriteResult {
    pub path: String,
    /// Bytes written.
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct EditResult {
    pub path: String,
    pub replacements: u64,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct DeleteResult {
    pub path: String,
}

/// One matching line.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct SearchMatch {
    pub path: String,
    /// 1-based.
    pub line: u64,
    /// The line, cut to [`MAX_SEARCH_LINE_CHARS`] characters.
    pub content: String,
}

impl SearchMatch {
    /// A match with its line cut to [`MAX_SEARCH_LINE_CHARS`].
    pub fn new(path: String, line: u64, text: &str) -> SearchMatch {
        SearchMatch {
            path,
            line,
            content: text.chars().take(MAX_SEARCH_LINE_CHARS).collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct SearchResult {
    pub count: usize,
    pub matches: Vec<SearchMatch>,
    /// Present (true) when more matched than were returned.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl SearchResult {
    /// The first [`MAX_SEARCH_MATCHES`] of `matches`; `truncated` when
    /// there were more.
    pub fn capped(mut matches: Vec<SearchMatch>) -> SearchResult {
        let truncated = matches.len() > MAX_SEARCH_MATCHES;
        matches.truncate(MAX_SEARCH_MATCHES);
        SearchResult {
            count: matches.len(),
            matches,
            truncated,
        }
    }
}

/// An `fs.*` answer: the result, or an operation error.
pub type FsResult<T> = crate::OpResult<T>;

impl<T> From<Result<T, FsError>> for crate::OpResult<T> {
    fn from(r: Result<T, FsError>) -> Self {
        match r {
            Ok(v) => crate::OpResult::done(v),
            Err(e) => crate::OpResult::Failed(e.into()),
        }
    }
}

impl From<FsError> for crate::OpFailure {
    fn from(e: FsError) -> Self {
        crate::OpFailure {
            ok: false,
            error: e.to_string(),
            code: Some(e.code().as_str().to_owned()),
        }
    }
}
