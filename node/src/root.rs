//! `NodeRoot`: every path a node tool touches is opened beneath one
//! directory.
//!
//! Resolution goes through `openat2(2)` with `RESOLVE_BENEATH` relative to
//! a directory descriptor held for the node's lifetime, not through
//! `canonicalize` plus a prefix check: the kernel refuses any `..` or
//! symlink that would leave the root *while it opens the file*, so a link
//! swapped in between a check and the use cannot redirect the operation.
//! Operations that create or remove (write, delete) open the parent
//! beneath the root and then act on one plain name with the `*at` calls,
//! which follow no links. `RESOLVE_BENEATH` also refuses absolute symlinks,
//! even ones pointing back inside the root; for those the path is
//! canonicalized once and, if the result lies inside the root, opened again
//! beneath it (the second open is still checked by the kernel).

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// A path that the root refuses or cannot open. Each variant names the path
/// as the caller gave it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path '{path}' is outside the node root '{root}'")]
    Outside { path: String, root: PathBuf },
    #[error("path '{path}' escapes the node root '{root}' (through '..' or a symlink)")]
    Escapes { path: String, root: PathBuf },
    #[error("path '{path}' does not exist")]
    NotFound { path: String },
    #[error("path '{path}' is not a directory")]
    NotADirectory { path: String },
    #[error("path '{path}' names the node root itself")]
    IsRoot { path: String },
    #[error("cannot open '{path}': {source}")]
    Io { path: String, source: io::Error },
}

impl PathError {
    /// A stable, machine-readable name for the failure.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Empty => "invalid_argument",
            Self::Outside { .. } | Self::Escapes { .. } => "path_escape",
            Self::NotFound { .. } => "not_found",
            Self::NotADirectory { .. } => "not_a_directory",
            Self::IsRoot { .. } => "invalid_argument",
            Self::Io { .. } => "io",
        }
    }
}

/// The directory a node serves. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct NodeRoot {
    /// Canonical absolute path of the root, used for display and for
    /// recognising absolute request paths.
    path: PathBuf,
    /// The root as configured, when it differs from `path` (a symlinked
    /// spelling such as `/tmp` → `/private/tmp`): absolute request paths may
    /// use either.
    given: Option<PathBuf>,
    dir: OwnedFd,
}

/// How many times an open is retried when the kernel reports a concurrent
/// rename that made `RESOLVE_BENEATH` give up (`EAGAIN`).
const EAGAIN_RETRIES: usize = 8;

impl NodeRoot {
    /// Opens `dir` as the root. It must be an existing directory.
    pub fn new(dir: impl AsRef<Path>) -> io::Result<Self> {
        let given = dir.as_ref();
        let path = std::fs::canonicalize(given)?;
        let fd = rustix::fs::open(
            &path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let given = (given.is_absolute() && given != path).then(|| given.to_path_buf());
        Ok(Self {
            path,
            given,
            dir: fd,
        })
    }

    /// The canonical absolute path of the root.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The request path relative to the root, lexically (no `..` folding:
    /// the kernel resolves those beneath the root). Relative paths are taken
    /// as they are; an absolute path must begin with the root.
    pub fn relative(&self, request: &str) -> Result<PathBuf, PathError> {
        if request.is_empty() {
            return Err(PathError::Empty);
        }
        let p = Path::new(request);
        if !p.is_absolute() {
            return Ok(p.to_path_buf());
        }
        let rest = p
            .strip_prefix(&self.path)
            .ok()
            .or_else(|| self.given.as_deref().and_then(|g| p.strip_prefix(g).ok()))
            .ok_or_else(|| PathError::Outside {
                path: request.to_owned(),
                root: self.path.clone(),
            })?;
        Ok(if rest.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            rest.to_path_buf()
        })
    }

    /// Opens `request` beneath the root with `flags` (`O_CLOEXEC` is added).
    /// Symlinks are followed as long as they stay inside.
    pub fn open_beneath(
        &self,
        request: &str,
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, PathError> {
        let rel = self.relative(request)?;
        self.open_rel(request, &rel, flags, mode)
    }

    fn open_rel(
        &self,
        request: &str,
        rel: &Path,
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, PathError> {
        match self.openat2_beneath(rel, flags, mode) {
            // An absolute symlink, or a real escape: decide by where the
            // path actually leads right now, then open again beneath. A `..`
            // that climbs above the root is refused even if the path comes
            // back in.
            Err(Errno::XDEV) if !rel.components().any(|c| c == Component::ParentDir) => {
                let inside = self
                    .canonical_inside(rel)
                    .ok_or_else(|| PathError::Escapes {
                        path: request.to_owned(),
                        root: self.path.clone(),
                    })?;
                self.openat2_beneath(&inside, flags, mode)
                    .map_err(|e| self.map_errno(request, e))
            }
            other => other.map_err(|e| self.map_errno(request, e)),
        }
    }

    fn openat2_beneath(&self, rel: &Path, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        let mut tries = 0;
        loop {
            match rustix::fs::openat2(
                self.dir.as_fd(),
                rel,
                flags | OFlags::CLOEXEC,
                mode,
                ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
            ) {
                Err(Errno::AGAIN) if tries < EAGAIN_RETRIES => tries += 1,
                other => return other,
            }
        }
    }

    /// `rel` canonicalized (its parent, when `rel` itself does not exist),
    /// as a path relative to the root, if it lies inside.
    fn canonical_inside(&self, rel: &Path) -> Option<PathBuf> {
        let full = self.path.join(rel);
        let real = match std::fs::canonicalize(&full) {
            Ok(real) => real,
            Err(_) => {
                let name = full.file_name()?;
                std::fs::canonicalize(full.parent()?).ok()?.join(name)
            }
        };
        let inside = real.strip_prefix(&self.path).ok()?;
        Some(if inside.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            inside.to_path_buf()
        })
    }

    fn map_errno(&self, request: &str, e: Errno) -> PathError {
        let path = request.to_owned();
        match e {
            Errno::XDEV => PathError::Escapes {
                path,
                root: self.path.clone(),
            },
            Errno::NOENT => PathError::NotFound { path },
            Errno::NOTDIR => PathError::NotADirectory { path },
            other => PathError::Io {
                path,
                source: other.into(),
            },
        }
    }

    /// The real absolute path of an open descriptor (for results: where
    /// the operation actually happened).
    pub(crate) fn real_path(&self, fd: impl AsFd) -> PathBuf {
        let link = format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&fd.as_fd())
        );
        std::fs::read_link(link).unwrap_or_else(|_| self.path.clone())
    }

    /// An existing directory inside the root, as its real absolute path
    /// (for a command's working directory).
    pub fn resolve_dir(&self, request: &str) -> Result<PathBuf, PathError> {
        let fd = self.open_beneath(request, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok(self.real_path(&fd))
    }

    /// The parent directory of `request`, opened beneath the root, and the
    /// final name. With `create`, missing parent directories are made one
    /// by one, each beneath the root. The root itself has no parent here.
    pub(crate) fn open_parent(
        &self,
        request: &str,
        create: bool,
    ) -> Result<(OwnedFd, OsString), PathError> {
        let rel = self.relative(request)?;
        let name = match rel.components().next_back() {
            Some(Component::Normal(name)) => name.to_os_string(),
            _ => {
                return Err(PathError::IsRoot {
                    path: request.to_owned(),
                });
            }
        };
        let parent = rel.parent().unwrap_or(Path::new("."));
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        match self.open_rel(request, parent, dir_flags, Mode::empty()) {
            Err(PathError::NotFound { .. }) if create => {}
            other => return other.map(|fd| (fd, name)),
        }
        let mut prefix = PathBuf::new();
        for comp in parent.components() {
            let above = if prefix.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                prefix.clone()
            };
            prefix.push(comp);
            match self.open_rel(request, &prefix, dir_flags, Mode::empty()) {
                Ok(_) => continue,
                Err(PathError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
            let Component::Normal(part) = comp else {
                return Err(PathError::NotFound {
                    path: request.to_owned(),
                });
            };
            let above_fd = self.open_rel(request, &above, dir_flags, Mode::empty())?;
            match rustix::fs::mkdirat(&above_fd, part, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(self.map_errno(request, e)),
            }
        }
        let fd = self.open_rel(request, parent, dir_flags, Mode::empty())?;
        Ok((fd, name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (tempfile::TempDir, NodeRoot) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/b/f.txt"), "x").unwrap();
        std::fs::write(tmp.path().join("secret"), "s").unwrap();
        std::os::unix::fs::symlink("../..", root.join("a/up")).unwrap();
        std::os::unix::fs::symlink("b", root.join("a/inside")).unwrap();
        std::os::unix::fs::symlink(root.join("a/b"), root.join("abs_inside")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("out")).unwrap();
        let r = NodeRoot::new(&root).unwrap();
        (tmp, r)
    }

    fn opens(r: &NodeRoot, p: &str) -> Result<OwnedFd, PathError> {
        r.open_beneath(p, OFlags::RDONLY, Mode::empty())
    }

    #[test]
    fn paths_inside_the_root_open_through_dotdot_and_symlinks_that_stay_inside() {
        let (_tmp, r) = setup();
        for p in [
            "a/b/f.txt",
            "a/../a/b/f.txt",
            "a/inside/f.txt",
            "abs_inside/f.txt",
            "./a/b/f.txt",
        ] {
            assert!(opens(&r, p).is_ok(), "{p}");
        }
        let abs = r.path().join("a/b/f.txt");
        assert!(opens(&r, abs.to_str().unwrap()).is_ok());
        let real = r.real_path(opens(&r, "abs_inside/f.txt").unwrap());
        assert_eq!(real, r.path().join("a/b/f.txt"));
    }

    #[test]
    fn dotdot_absolute_outside_and_symlinks_out_are_refused_not_clamped() {
        let (tmp, r) = setup();
        let secret = tmp.path().join("secret");
        let back_in = format!(
            "../{}/a/b/f.txt",
            r.path().file_name().unwrap().to_str().unwrap()
        );
        for p in [
            "../secret",
            "a/../../secret",
            "out/secret",
            "a/up/secret",
            &back_in,
        ] {
            let e = opens(&r, p).unwrap_err();
            assert!(matches!(e, PathError::Escapes { .. }), "{p}: {e}");
            assert!(e.to_string().contains(p), "{e}");
        }
        let e = opens(&r, secret.to_str().unwrap()).unwrap_err();
        assert!(matches!(e, PathError::Outside { .. }), "{e}");
        let e = opens(&r, "/etc/passwd").unwrap_err();
        assert_eq!(e.code(), "path_escape");
    }

    #[test]
    fn creating_parents_never_follows_a_symlink_out_of_the_root() {
        let (tmp, r) = setup();
        let (_fd, name) = r.open_parent("new/deeper/file.txt", true).unwrap();
        assert_eq!(name, "file.txt");
        assert!(r.path().join("new/deeper").is_dir());
        let e = r.open_parent("out/planted/file.txt", true).unwrap_err();
        assert_eq!(e.code(), "path_escape", "{e}");
        assert!(!tmp.path().join("planted").exists());
        let e = r.open_parent(".", true).unwrap_err();
        assert!(matches!(e, PathError::IsRoot { .. }), "{e}");
    }
}
