//! `WorkspaceStore` runs the one Store contract suite
//! (`wsd_sync::testkit`): local operations are real file-system calls in
//! the root, found by the store's settle like any user's.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use wsd_sync::SyncError;
use wsd_sync::testkit::{LocalOp, StoreUnderTest};

use super::{StoreOptions, WorkspaceStore};

fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> SyncError {
    let context = format!("{what} {}", path.display());
    move |e| SyncError::io(context, e)
}

fn chmod(abs: &Path, mode: u32) -> Result<(), SyncError> {
    std::fs::set_permissions(abs, std::fs::Permissions::from_mode(mode)).map_err(io("chmod", abs))
}

/// `mkdir -p` of `rel`'s parent, new directories 0755 whatever the umask.
fn parents(root: &Path, rel: &str) -> Result<(), SyncError> {
    let mut dir = root.to_path_buf();
    let names: Vec<&str> = rel.split('/').collect();
    for name in &names[..names.len() - 1] {
        dir.push(name);
        if std::fs::symlink_metadata(&dir).is_err() {
            std::fs::create_dir(&dir).map_err(io("mkdir", &dir))?;
            chmod(&dir, 0o755)?;
        }
    }
    Ok(())
}

impl StoreUnderTest for WorkspaceStore {
    fn local(&mut self, op: &LocalOp) -> Result<(), SyncError> {
        let root = self.root().to_path_buf();
        match op {
            LocalOp::Write { path, bytes, mode } => {
                parents(&root, path)?;
                let abs = root.join(path);
                std::fs::write(&abs, bytes).map_err(io("write", &abs))?;
                chmod(&abs, *mode)?;
            }
            LocalOp::Mkdir { path, mode } => {
                parents(&root, path)?;
                let abs = root.join(path);
                std::fs::create_dir(&abs).map_err(io("mkdir", &abs))?;
                chmod(&abs, *mode)?;
            }
            LocalOp::Symlink { path, target } => {
                parents(&root, path)?;
                let abs = root.join(path);
                std::os::unix::fs::symlink(target, &abs).map_err(io("symlink", &abs))?;
            }
            LocalOp::Remove { path } => {
                let abs = root.join(path);
                let meta = std::fs::symlink_metadata(&abs).map_err(io("stat", &abs))?;
                if meta.is_dir() {
                    std::fs::remove_dir_all(&abs)
                } else {
                    std::fs::remove_file(&abs)
                }
                .map_err(io("remove", &abs))?;
            }
            LocalOp::Rename { from, to } => {
                parents(&root, to)?;
                let (a, b) = (root.join(from), root.join(to));
                std::fs::rename(&a, &b).map_err(io("rename", &a))?;
            }
            LocalOp::Chmod { path, mode } => chmod(&root.join(path), *mode)?,
        }
        Ok(())
    }

    fn prune(&mut self) -> Result<bool, SyncError> {
        self.prune_tombstones()?;
        Ok(true)
    }
}

/// Fresh workspaces in one temp dir that lives as long as the factory.
fn workspaces() -> impl FnMut() -> WorkspaceStore {
    let tmp = tempfile::tempdir().unwrap();
    let mut n = 0u32;
    move || {
        n += 1;
        let base = tmp.path().join(n.to_string());
        std::fs::create_dir_all(base.join("root")).unwrap();
        let opts = StoreOptions {
            watch: false,
            ..StoreOptions::default()
        };
        WorkspaceStore::open(&base.join("root"), &base.join("state"), opts).unwrap()
    }
}

wsd_sync::store_conformance_tests!(workspaces(), 32);

/// The in-memory test store passes the same suite.
mod mem_store {
    use wsd_sync::testkit::MemStore;

    wsd_sync::store_conformance_tests!(MemStore::new, 256);
}
