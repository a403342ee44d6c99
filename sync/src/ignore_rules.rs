use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::limits::MAX_IGNORE_PATTERNS;
use crate::{SyncError, SyncPath};

/// What a conflict copy's name carries after the original name:
/// `NAME.wsd-conflict-<UTC time>` keeps a local version a pull replaced.
pub const CONFLICT_COPY_MARKER: &str = ".wsd-conflict-";

/// The exclusion that keeps conflict copies out of every transfer: they
/// are one machine's leftovers for a person to resolve, not workspace state.
pub const CONFLICT_COPY_PATTERN: &str = "*.wsd-conflict-*";

/// Gitignore-syntax patterns (via the `ignore` crate, as git reads them)
/// matched against workspace-relative paths. A path is ignored when it or
/// any of its ancestors matches, so ignoring a directory hides its subtree.
#[derive(Clone, Debug)]
pub struct IgnoreRules {
    patterns: Vec<String>,
    matcher: Gitignore,
}

impl IgnoreRules {
    /// Rules that ignore nothing.
    pub fn none() -> IgnoreRules {
        IgnoreRules {
            patterns: Vec::new(),
            matcher: Gitignore::empty(),
        }
    }

    /// A shared [`IgnoreRules::none`], for a batch built where no
    /// temporary could outlive it.
    pub fn none_static() -> &'static IgnoreRules {
        static NONE: std::sync::LazyLock<IgnoreRules> = std::sync::LazyLock::new(IgnoreRules::none);
        &NONE
    }

    /// Compiles `patterns`; a malformed glob is `EINVAL` naming it.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<IgnoreRules, SyncError> {
        SyncError::check_limit("ignore patterns", MAX_IGNORE_PATTERNS, patterns.len())?;
        let mut builder = GitignoreBuilder::new("");
        for p in patterns {
            let p = p.as_ref();
            builder
                .add_line(None, p)
                .map_err(|e| SyncError::Invalid(format!("ignore pattern {p:?}: {e}")))?;
        }
        let matcher = builder
            .build()
            .map_err(|e| SyncError::Invalid(format!("ignore patterns: {e}")))?;
        Ok(IgnoreRules {
            patterns: patterns.iter().map(|p| p.as_ref().to_owned()).collect(),
            matcher,
        })
    }

    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `path` (a directory when `is_dir`) is hidden from sync.
    pub fn is_ignored(&self, path: &SyncPath, is_dir: bool) -> bool {
        if self.patterns.is_empty() {
            return false;
        }
        matches!(
            self.matcher
                .matched_path_or_any_parents(path.as_str(), is_dir),
            Match::Ignore(_)
        )
    }

    /// How a receiver deletes the directory `dir` without deleting what
    /// these rules (the sender's exclusions) match below it: `None` when
    /// nothing in `live_below` (its live descendants in path order, with
    /// whether each is a directory) is excluded, so the whole subtree goes
    /// as usual; otherwise the descendants to delete instead, each the top
    /// of a subtree holding nothing excluded. `dir` and the ancestors of
    /// excluded paths stay.
    pub fn delete_sparing(
        &self,
        dir: &SyncPath,
        live_below: &[(SyncPath, bool)],
    ) -> Option<Vec<SyncPath>> {
        if self.patterns.is_empty() {
            return None;
        }
        let mut spared: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for (p, is_dir) in live_below {
            if self.is_ignored(p, *is_dir) {
                spared.insert(p.as_str());
                for (i, _) in p.as_str().match_indices('/').skip(dir.depth()) {
                    spared.insert(&p.as_str()[..i]);
                }
            }
        }
        if spared.is_empty() {
            return None;
        }
        let tops = live_below
            .iter()
            .filter(|(p, _)| !spared.contains(p.as_str()))
            .filter(|(p, _)| {
                let parent = p.as_str().rsplit_once('/').map_or("", |(head, _)| head);
                parent == dir.as_str() || spared.contains(parent)
            })
            .map(|(p, _)| p.clone())
            .collect();
        Some(tops)
    }

    /// For a tombstone the kind is unknown: ignored if it would be ignored
    /// as either a file or a directory.
    pub fn is_ignored_any_kind(&self, path: &SyncPath) -> bool {
        self.is_ignored(path, false) || self.is_ignored(path, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SyncPath {
        SyncPath::new(s).unwrap()
    }

    #[test]
    fn nothing_is_ignored_by_default() {
        assert!(!IgnoreRules::none().is_ignored(&p("node_modules/x"), false));
    }

    #[test]
    fn a_directory_pattern_hides_its_subtree_at_any_depth() {
        let r = IgnoreRules::new(&["node_modules/"]).unwrap();
        assert!(r.is_ignored(&p("node_modules"), true));
        assert!(r.is_ignored(&p("a/node_modules/b/c.js"), false));
        assert!(!r.is_ignored(&p("node_modules_old/x"), false));
        // A file named like the directory pattern is not a directory.
        assert!(!r.is_ignored(&p("node_modules"), false));
    }

    #[test]
    fn globs_anchors_and_negation_follow_gitignore() {
        let r = IgnoreRules::new(&["*.log", "!keep.log", "/build"]).unwrap();
        assert!(r.is_ignored(&p("a/b.log"), false));
        assert!(!r.is_ignored(&p("keep.log"), false));
        assert!(r.is_ignored(&p("build/out.o"), false));
        assert!(!r.is_ignored(&p("src/build/out.o"), false));
    }

    #[test]
    fn the_conflict_copy_pattern_matches_conflict_copies_only() {
        let r = IgnoreRules::new(&[CONFLICT_COPY_PATTERN]).unwrap();
        let copy = format!("src/main.rs{CONFLICT_COPY_MARKER}20261125T033500Z");
        assert!(r.is_ignored(&p(&copy), false));
        assert!(!r.is_ignored(&p("src/main.rs"), false));
        assert!(!r.is_ignored(&p("wsd-conflict.txt"), false));
    }

    #[test]
    fn deleting_a_directory_spares_excluded_descendants_and_their_ancestors() {
        let r = IgnoreRules::new(&["*.log"]).unwrap();
        let below: Vec<(SyncPath, bool)> = [
            ("d/a/b", true),
            ("d/a/b/x.log", false),
            ("d/a/b/y.txt", false),
            ("d/a/c", true),
            ("d/a/c/z.txt", false),
            ("d/a", true),
            ("d/top.txt", false),
        ]
        .into_iter()
        .map(|(s, d)| (p(s), d))
        .collect::<std::collections::BTreeMap<_, _>>()
        .into_iter()
        .collect();
        let tops = r.delete_sparing(&p("d"), &below).unwrap();
        assert_eq!(tops, [p("d/a/b/y.txt"), p("d/a/c"), p("d/top.txt")]);
        assert_eq!(
            IgnoreRules::new(&["*.bin"])
                .unwrap()
                .delete_sparing(&p("d"), &below),
            None
        );
        assert_eq!(IgnoreRules::none().delete_sparing(&p("d"), &below), None);
    }

    #[test]
    fn a_malformed_pattern_is_einval() {
        let err = IgnoreRules::new(&["a{b"]).unwrap_err();
        assert_eq!(err.code(), crate::ErrorCode::Invalid);
    }
}
