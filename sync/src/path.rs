use crate::SyncError;
use crate::limits::{MAX_PATH_BYTES, MAX_PATH_DEPTH, MAX_SEGMENT_BYTES};

/// A canonical workspace-relative path: UTF-8, `/`-separated, no leading or
/// trailing `/`, no empty, `.` or `..` segments, no NUL, not empty (the root
/// itself is never the subject of an entry), within the documented limits.
///
/// Ordering is byte-wise on the UTF-8 encoding (the derived `Ord` on the
/// inner `String` compares bytes), which is also SQLite's default `BINARY`
/// collation. A parent sorts before its descendants because a proper prefix
/// sorts before its extensions and `/` (0x2F) is the only separator.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SyncPath(String);

impl SyncPath {
    /// Accepts `s` only if it is already canonical. Use this for paths
    /// arriving from a peer: a non-canonical wire path is a protocol error,
    /// not something to repair.
    pub fn new(s: impl Into<String>) -> Result<SyncPath, SyncError> {
        let s = s.into();
        let canonical = Self::canonicalize(&s)?;
        if canonical.0 != s {
            return Err(SyncError::InvalidPath {
                path: s,
                reason: "path is not canonical",
            });
        }
        Ok(canonical)
    }

    /// Canonicalises user input: drops `.` and empty segments and a trailing
    /// `/`. Rejects absolute paths, `..`, NUL, an empty result and paths over
    /// the limits.
    pub fn canonicalize(s: &str) -> Result<SyncPath, SyncError> {
        let bad = |reason| SyncError::InvalidPath {
            path: s.to_owned(),
            reason,
        };
        if s.starts_with('/') {
            return Err(bad("absolute paths are not allowed"));
        }
        if s.contains('\0') {
            return Err(bad("path contains NUL"));
        }
        if s.len() > MAX_PATH_BYTES {
            return Err(SyncError::Limit {
                limit: "path length (bytes)",
                max: MAX_PATH_BYTES as u64,
                got: s.len() as u64,
            });
        }
        let mut out = String::with_capacity(s.len());
        let mut depth = 0usize;
        for seg in s.split('/') {
            match seg {
                "" | "." => continue,
                ".." => return Err(bad("`..` segments are not allowed")),
                _ => {}
            }
            if seg.len() > MAX_SEGMENT_BYTES {
                return Err(SyncError::Limit {
                    limit: "path segment length (bytes)",
                    max: MAX_SEGMENT_BYTES as u64,
                    got: seg.len() as u64,
                });
            }
            depth += 1;
            if !out.is_empty() {
                out.push('/');
            }
            out.push_str(seg);
        }
        if out.is_empty() {
            return Err(bad("path is empty"));
        }
        SyncError::check_limit("path depth (segments)", MAX_PATH_DEPTH, depth)?;
        Ok(SyncPath(out))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }

    /// The parent path, or `None` for a top-level entry.
    pub fn parent(&self) -> Option<SyncPath> {
        self.0.rfind('/').map(|i| SyncPath(self.0[..i].to_owned()))
    }

    /// The last segment.
    pub fn file_name(&self) -> &str {
        self.0.rsplit('/').next().unwrap_or(&self.0)
    }

    /// `self/name`; `name` must be one valid segment.
    pub fn join(&self, name: &str) -> Result<SyncPath, SyncError> {
        if name.contains('/') {
            return Err(SyncError::InvalidPath {
                path: name.to_owned(),
                reason: "a segment cannot contain `/`",
            });
        }
        SyncPath::new(format!("{}/{}", self.0, name))
    }

    /// Every proper ancestor, outermost first (`a`, `a/b` for `a/b/c`).
    pub fn ancestors(&self) -> impl Iterator<Item = SyncPath> + '_ {
        self.0
            .match_indices('/')
            .map(|(i, _)| SyncPath(self.0[..i].to_owned()))
    }

    /// True when `self` is `other` or lies below it.
    pub fn starts_with(&self, other: &SyncPath) -> bool {
        self.0 == other.0
            || (self.0.len() > other.0.len()
                && self.0.as_bytes()[other.0.len()] == b'/'
                && self.0.starts_with(&other.0))
    }

    pub fn depth(&self) -> usize {
        self.0.split('/').count()
    }
}

impl std::fmt::Display for SyncPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for SyncPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl AsRef<str> for SyncPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SyncPath {
    type Err = SyncError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SyncPath::canonicalize(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn canonicalize_drops_dots_and_empty_segments() {
        assert_eq!(SyncPath::canonicalize("a//./b/").unwrap().as_str(), "a/b");
        assert_eq!(SyncPath::canonicalize("./x").unwrap().as_str(), "x");
    }

    #[test]
    fn hostile_paths_are_rejected_with_einval() {
        for bad in [
            "",
            "/",
            "/etc/passwd",
            "..",
            "a/../b",
            "a/..",
            "a\0b",
            ".",
            "./",
        ] {
            let err = SyncPath::canonicalize(bad).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Invalid, "{bad:?} gave {err}");
        }
    }

    #[test]
    fn wire_paths_must_already_be_canonical() {
        assert!(SyncPath::new("a/b").is_ok());
        for bad in ["a//b", "a/./b", "a/", "./a"] {
            assert_eq!(
                SyncPath::new(bad).unwrap_err().code(),
                ErrorCode::Invalid,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn over_long_paths_are_elimit() {
        let long = "a/".repeat(MAX_PATH_DEPTH) + "z";
        assert_eq!(
            SyncPath::canonicalize(&long).unwrap_err().code(),
            ErrorCode::Limit
        );
        let seg = "x".repeat(MAX_SEGMENT_BYTES + 1);
        assert_eq!(
            SyncPath::canonicalize(&seg).unwrap_err().code(),
            ErrorCode::Limit
        );
    }

    #[test]
    fn ordering_is_bytewise_utf8_and_parents_come_first() {
        // U+E000 (3 bytes, 0xEE..) sorts before U+1F600 (4 bytes, 0xF0..) in
        // UTF-8 byte order, but after it in UTF-16 code-unit order.
        let a = SyncPath::new("\u{E000}").unwrap();
        let b = SyncPath::new("\u{1F600}").unwrap();
        assert!(a < b);
        let parent = SyncPath::new("a").unwrap();
        let child = SyncPath::new("a/b").unwrap();
        let sibling = SyncPath::new("a-b").unwrap();
        assert!(parent < child);
        assert!(parent < sibling);
        // `a/b` sorts after `a-b` ('/' 0x2F > '-' 0x2D): parents still precede children.
        assert!(sibling < child);
    }

    #[test]
    fn parent_ancestors_and_prefix() {
        let p = SyncPath::new("a/b/c").unwrap();
        assert_eq!(p.parent().unwrap().as_str(), "a/b");
        assert_eq!(p.file_name(), "c");
        let anc: Vec<_> = p.ancestors().map(|a| a.into_string()).collect();
        assert_eq!(anc, ["a", "a/b"]);
        assert!(p.starts_with(&SyncPath::new("a/b").unwrap()));
        assert!(
            !SyncPath::new("a/bc")
                .unwrap()
                .starts_with(&SyncPath::new("a/b").unwrap())
        );
        assert!(SyncPath::new("x").unwrap().parent().is_none());
    }
}
