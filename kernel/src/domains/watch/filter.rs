//! Which store paths a watch reports: below its root, kept by the
//! protocol's [`PathFilter`] (depth, include and exclude globs: one
//! definition for stores and devices), and, in the system tree, readable
//! by the watcher.

use gsv_protocol::watch::{BadGlob, PathFilter};
use wsd_sync::SyncPath;

use crate::domains::accounts::ProcessIdentity;
use crate::domains::fs::vfs::{self, Access, Place, Resolved};

/// A watch's path filter.
#[derive(Debug)]
pub struct Filter {
    root: Option<SyncPath>,
    /// Depth and globs, as a device's watch applies them.
    paths: PathFilter,
    /// In the system tree, the watcher (entries they may not read are left
    /// out); `None` in a workspace, which is the owner's whole.
    system_reader: Option<ProcessIdentity>,
}

impl Filter {
    pub fn new(
        root: Option<SyncPath>,
        recursive: bool,
        include: &[String],
        exclude: &[String],
        system_reader: Option<ProcessIdentity>,
    ) -> Result<Filter, BadGlob> {
        Ok(Filter {
            root,
            paths: PathFilter::new(recursive, include, exclude)?,
            system_reader,
        })
    }

    /// Whether a change at `p` is reported.
    pub fn keeps(&self, p: &SyncPath) -> bool {
        let rel = match &self.root {
            None => p.as_str(),
            Some(root) if p == root => "",
            Some(root) => match p
                .as_str()
                .strip_prefix(root.as_str())
                .and_then(|r| r.strip_prefix('/'))
            {
                Some(rel) => rel,
                None => return false,
            },
        };
        if !self.paths.keeps(rel, p.file_name()) {
            return false;
        }
        match &self.system_reader {
            None => true,
            Some(who) => {
                let shown = Resolved {
                    display: format!("/{p}"),
                    place: Place::System(Some(p.clone())),
                };
                vfs::check_system(who, &shown, Access::Read).is_ok()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SyncPath {
        SyncPath::new(s).unwrap()
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn root_depth_and_globs_decide_what_is_kept() {
        let f = Filter::new(
            Some(p("src")),
            true,
            &strings(&["*.rs", "docs/*.md"]),
            &strings(&["gen_*"]),
            None,
        )
        .unwrap();
        assert!(f.keeps(&p("src/a.rs")));
        assert!(f.keeps(&p("src/x/b.rs")));
        assert!(f.keeps(&p("src/docs/r.md")));
        assert!(!f.keeps(&p("src/x/r.md")));
        assert!(!f.keeps(&p("src/gen_a.rs")));
        assert!(!f.keeps(&p("srcx/a.rs")));
        assert!(!f.keeps(&p("a.rs")));
        let shallow = Filter::new(Some(p("src")), false, &[], &[], None).unwrap();
        assert!(shallow.keeps(&p("src/a")));
        assert!(shallow.keeps(&p("src")));
        assert!(!shallow.keeps(&p("src/x/a")));
    }

    #[test]
    fn a_bad_glob_is_named() {
        let e = Filter::new(None, true, &strings(&["a[b"]), &[], None).unwrap_err();
        assert_eq!((e.which, e.glob.as_str()), ("include", "a[b"));
    }

    #[test]
    fn in_the_system_tree_other_homes_are_left_out() {
        let alice = ProcessIdentity {
            uid: 1000,
            gid: 1000,
            gids: vec![1000],
            username: "alice".into(),
            home: "/home/alice".into(),
            cwd: "/home/alice".into(),
        };
        let f = Filter::new(None, true, &[], &[], Some(alice)).unwrap();
        assert!(f.keeps(&p("home/alice/a")));
        assert!(f.keeps(&p("etc/motd")));
        assert!(!f.keeps(&p("home/bob/a")));
        assert!(!f.keeps(&p("root/x")));
    }
}
