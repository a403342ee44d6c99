//! What a repository name, a branch and a path inside a tree may be. Each
//! check names the argument it refuses, so a bad call says what to fix.

use super::error::RepoError;

/// `<owner>/<name>` as the reference spells it: each part
/// `[A-Za-z0-9._-]{1,128}`, never `.` or `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slug {
    pub owner: String,
    pub name: String,
}

impl std::fmt::Display for Slug {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

impl Slug {
    pub fn parse(raw: &str) -> Result<Slug, RepoError> {
        let trimmed = raw.trim().trim_matches('/');
        let mut parts = trimmed.split('/');
        let (Some(owner), Some(name), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(RepoError::BadArgument(format!(
                "repo must be '<owner>/<name>', got {raw:?}"
            )));
        };
        Ok(Slug {
            owner: segment(owner, "owner")?,
            name: segment(name, "name")?,
        })
    }
}

/// One part of a slug (also what an `owner` filter must look like).
pub fn segment(value: &str, label: &str) -> Result<String, RepoError> {
    let v = value.trim();
    let ok = !v.is_empty()
        && v.len() <= 128
        && v != "."
        && v != ".."
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(v.to_owned())
    } else {
        Err(RepoError::BadArgument(format!(
            "invalid repo {label} {value:?}: use letters, digits, '.', '_' or '-'"
        )))
    }
}

/// A branch to write (`ref` of create/apply/import): `main` or
/// `refs/heads/main`, returned short. Git's own ref-name rules apply too.
pub fn branch(raw: Option<&str>) -> Result<String, RepoError> {
    let v = raw
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("main");
    let short = v.strip_prefix("refs/heads/").unwrap_or(v);
    let charset_ok = short
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'/' | b'-'));
    let full = format!("refs/heads/{short}");
    if short.is_empty()
        || !charset_ok
        || short.contains("..")
        || gix::validate::reference::name(full.as_str().into()).is_err()
    {
        return Err(RepoError::BadArgument(format!("invalid branch ref {v:?}")));
    }
    Ok(short.to_owned())
}

/// A revision to read (`ref`, `commit`, `base`, `head`): a branch, a tag or
/// a commit hash; default `main`.
pub fn revision(raw: Option<&str>) -> Result<String, RepoError> {
    let v = raw
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .unwrap_or("main");
    if v.contains("..") || v.bytes().any(|b| b.is_ascii_control()) || v.starts_with('-') {
        return Err(RepoError::BadArgument(format!("invalid ref {v:?}")));
    }
    Ok(v.to_owned())
}

/// A path to read or search under: `/`, `` and `.` segments fold away (as
/// in the reference), `..` is refused.
pub fn read_path(raw: Option<&str>, label: &str) -> Result<String, RepoError> {
    let raw = raw.unwrap_or("");
    let mut parts = Vec::new();
    for seg in raw.trim().split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err(escape(label, raw)),
            s if s.bytes().any(|b| b == 0) => return Err(escape(label, raw)),
            s => parts.push(s),
        }
    }
    Ok(parts.join("/"))
}

/// A path `repo.apply` writes: relative, no `..`/`.` segments, no control
/// characters, no `.git` component (git itself refuses to check those out).
pub fn write_path(raw: &str, label: &str) -> Result<String, RepoError> {
    if raw.starts_with('/') {
        return Err(RepoError::BadArgument(format!(
            "{label} {raw:?} is absolute: paths are relative to the repository root"
        )));
    }
    let mut parts = Vec::new();
    for seg in raw.split('/') {
        if seg.is_empty() {
            continue;
        }
        if seg == "." || seg == ".." || seg.eq_ignore_ascii_case(".git") {
            return Err(escape(label, raw));
        }
        if seg.chars().any(char::is_control) {
            return Err(RepoError::BadArgument(format!(
                "{label} {raw:?} has a control character"
            )));
        }
        parts.push(seg);
    }
    if parts.is_empty() {
        return Err(RepoError::BadArgument(format!("{label} is empty")));
    }
    Ok(parts.join("/"))
}

fn escape(label: &str, raw: &str) -> RepoError {
    RepoError::BadArgument(format!("{label} {raw:?} leaves the repository tree"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_two_safe_segments() {
        let s = Slug::parse(" alice/notes ").unwrap();
        assert_eq!(s.to_string(), "alice/notes");
        for bad in [
            "alice",
            "a/b/c",
            "alice/..",
            "alice/no\nnewline",
            "alice/sp ace",
            "/x",
        ] {
            assert!(Slug::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn branches_follow_git_rules() {
        assert_eq!(branch(None).unwrap(), "main");
        assert_eq!(branch(Some("refs/heads/dev/x")).unwrap(), "dev/x");
        for bad in ["a..b", "a b", "x.lock", "/x", "x/", "a@{1}"] {
            assert!(branch(Some(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn write_paths_stay_inside_the_tree() {
        assert_eq!(write_path("a//b/c", "path").unwrap(), "a/b/c");
        for bad in [
            "../x",
            "a/../../x",
            "/etc/passwd",
            "",
            "a/.git/config",
            "a/\u{1}",
        ] {
            assert!(write_path(bad, "path").is_err(), "{bad:?}");
        }
        assert_eq!(read_path(Some("/a/./b/"), "path").unwrap(), "a/b");
        assert!(read_path(Some("a/../../b"), "path").is_err());
    }
}
