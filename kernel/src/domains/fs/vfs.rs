//! The kernel's native filesystem namespace: `/workspaces/<id>/…` lives in
//! that workspace's dofs store, everything else (`/home`, `/etc`, `/var`,
//! `/root`) in the system store. This module turns a caller's path into a
//! place in one store and decides whether the caller may touch it; it never
//! touches a store itself.
//!
//! Paths are resolved lexically: relative paths and `~` against the
//! caller's home; `..` is refused outright (never clamped), so no spelling
//! of a path can leave the place it names.

use gsv_protocol::fs::FsError;
use wsd_dofs::DofsError;
use wsd_sync::SyncPath;

use crate::domains::accounts::ProcessIdentity;

/// Maps a store error to the `fs.*` error naming the caller's path, not
/// the store's.
pub fn from_dofs(shown: &str, e: DofsError) -> FsError {
    let path = shown.to_owned();
    match e {
        DofsError::NotFound { .. } => FsError::NotFound { path },
        DofsError::IsADirectory { .. } => FsError::IsADirectory { path },
        DofsError::NotADirectory { .. } => FsError::NotADirectory { path },
        DofsError::AlreadyExists { .. } => FsError::AlreadyExists { path },
        DofsError::Invalid { reason, .. } => FsError::InvalidPath {
            path,
            reason: reason.to_owned(),
        },
        other => {
            tracing::error!(path = shown, error = %other, "store failure");
            FsError::io("access", path, other)
        }
    }
}

/// Which store a path lives in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The system store; `None` is its root (`/`).
    System(Option<SyncPath>),
    /// `/workspaces` itself (a listing of the caller's workspaces).
    WorkspacesDir,
    /// Inside a workspace; `None` is its root.
    Workspace { id: String, sub: Option<SyncPath> },
}

/// A resolved caller path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The canonical absolute path, as shown back to the caller.
    pub display: String,
    pub place: Place,
}

/// Resolves `input` for a caller whose home (and cwd) is `home`.
pub fn resolve(input: &str, home: &str) -> Result<Resolved, FsError> {
    let bad = |reason: &str| FsError::InvalidPath {
        path: input.to_owned(),
        reason: reason.to_owned(),
    };
    if input.contains('\0') {
        return Err(bad("contains NUL"));
    }
    let absolute = if input == "~" {
        home.to_owned()
    } else if let Some(rest) = input.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if input.starts_with('/') {
        input.to_owned()
    } else {
        format!("{home}/{input}")
    };
    let mut segs = Vec::new();
    for seg in absolute.split('/') {
        match seg {
            "" | "." => {}
            ".." => return Err(bad("`..` is not allowed")),
            s => segs.push(s),
        }
    }
    let display = format!("/{}", segs.join("/"));
    let to_sync = |parts: &[&str]| -> Result<Option<SyncPath>, FsError> {
        if parts.is_empty() {
            return Ok(None);
        }
        SyncPath::canonicalize(&parts.join("/"))
            .map(Some)
            .map_err(|e| bad(&e.to_string()))
    };
    let place = match segs.as_slice() {
        ["workspaces"] => Place::WorkspacesDir,
        ["workspaces", id, rest @ ..] => Place::Workspace {
            id: (*id).to_owned(),
            sub: to_sync(rest)?,
        },
        all => Place::System(to_sync(all)?),
    };
    Ok(Resolved { display, place })
}

/// Read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Whether `who` may access a system-store path. Root may do anything;
/// others read everything except other users' homes, other users'
/// conversation archives (`/var/sessions/<user>`) and `/root`, and write
/// only inside their own home.
pub fn check_system(who: &ProcessIdentity, r: &Resolved, access: Access) -> Result<(), FsError> {
    if who.is_root() {
        return Ok(());
    }
    let Place::System(sub) = &r.place else {
        return Ok(());
    };
    let segs: Vec<&str> = sub
        .as_ref()
        .map_or(vec![], |p| p.as_str().split('/').collect());
    let own_home = who.home.trim_start_matches('/');
    let in_own_home = sub
        .as_ref()
        .is_some_and(|p| p.as_str() == own_home || p.as_str().starts_with(&format!("{own_home}/")));
    let allowed = match (segs.as_slice(), access) {
        (_, Access::Write) => in_own_home && sub.as_ref().is_some_and(|p| p.as_str() != own_home),
        (["home", _user, ..], Access::Read) => in_own_home,
        // Conversation archives are their owner's (issue 26).
        (["var", "sessions", user, ..], Access::Read) => *user == who.username,
        (["root", ..], Access::Read) => false,
        (_, Access::Read) => true,
    };
    if allowed {
        Ok(())
    } else {
        Err(FsError::PermissionDenied {
            path: r.display.clone(),
        })
    }
}

/// Whether `who` may access a workspace owned by `owner_uid`.
pub fn check_workspace(who: &ProcessIdentity, owner_uid: i64) -> bool {
    who.is_root() || who.uid == owner_uid
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> ProcessIdentity {
        ProcessIdentity {
            uid: 1000,
            gid: 1000,
            gids: vec![1000, 100],
            username: "alice".into(),
            home: "/home/alice".into(),
            cwd: "/home/alice".into(),
        }
    }

    #[test]
    fn relative_and_tilde_paths_resolve_under_home() {
        let r = resolve("notes/a.txt", "/home/alice").unwrap();
        assert_eq!(r.display, "/home/alice/notes/a.txt");
        assert_eq!(
            resolve("~/x", "/home/alice").unwrap().display,
            "/home/alice/x"
        );
        assert_eq!(resolve("~", "/home/alice").unwrap().display, "/home/alice");
        assert_eq!(
            resolve("/", "/home/alice").unwrap().place,
            Place::System(None)
        );
    }

    #[test]
    fn dot_dot_is_refused_in_every_spelling() {
        for p in [
            "../bob",
            "/home/alice/../bob",
            "/workspaces/ws_1/../../etc",
            "~/..",
        ] {
            assert!(
                matches!(resolve(p, "/home/alice"), Err(FsError::InvalidPath { .. })),
                "{p}"
            );
        }
    }

    #[test]
    fn workspace_paths_land_in_the_workspace_store() {
        let r = resolve("/workspaces/ws_1/src/main.rs", "/home/alice").unwrap();
        assert_eq!(
            r.place,
            Place::Workspace {
                id: "ws_1".into(),
                sub: Some(SyncPath::new("src/main.rs").unwrap())
            }
        );
        assert_eq!(
            resolve("/workspaces", "/").unwrap().place,
            Place::WorkspacesDir
        );
    }

    #[test]
    fn a_user_reads_and_writes_only_their_own_home() {
        let a = alice();
        let r = |p| resolve(p, "/home/alice").unwrap();
        assert!(check_system(&a, &r("~/x"), Access::Write).is_ok());
        assert!(check_system(&a, &r("/home/bob/x"), Access::Read).is_err());
        assert!(check_system(&a, &r("/home/bob/x"), Access::Write).is_err());
        assert!(check_system(&a, &r("/etc/motd"), Access::Read).is_ok());
        assert!(check_system(&a, &r("/etc/motd"), Access::Write).is_err());
        assert!(check_system(&a, &r("/home/alice"), Access::Write).is_err());
        assert!(check_system(&a, &r("/home/alicex/y"), Access::Read).is_err());
        assert!(check_system(&a, &r("/root/y"), Access::Read).is_err());
    }
}
