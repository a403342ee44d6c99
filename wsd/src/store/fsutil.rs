//! Small filesystem helpers shared by settle and apply. Everything here
//! uses `lstat` semantics: a symlink is never followed.

use std::fs::Metadata;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wsd_sync::SyncPath;

/// Prefix of the temp names apply writes next to their target before the
/// rename. Such names are never indexed, and stale ones (a crash mid-apply)
/// are removed by the startup walk.
pub(crate) const APPLY_TEMP_PREFIX: &str = ".wsd-apply-";

pub(crate) fn is_apply_temp(name: &str) -> bool {
    name.starts_with(APPLY_TEMP_PREFIX)
}

/// The kinds a workspace can sync; sockets, fifos and devices are not.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DiskKind {
    File,
    Dir,
    Symlink,
    Unsupported,
}

pub(crate) fn kind_of(m: &Metadata) -> DiskKind {
    let t = m.file_type();
    if t.is_file() {
        DiskKind::File
    } else if t.is_dir() {
        DiskKind::Dir
    } else if t.is_symlink() {
        DiskKind::Symlink
    } else {
        DiskKind::Unsupported
    }
}

pub(crate) fn abs(root: &Path, rel: &SyncPath) -> PathBuf {
    root.join(rel.as_str())
}

/// `lstat` of `rel` as a path *inside* the root: `None` when it does not
/// exist or when one of its ancestors is not a real directory (a symlink or
/// a file), because then the name does not denote anything in the tree and
/// resolving it could leave the root.
pub(crate) fn lstat_in_root(root: &Path, rel: &SyncPath) -> io::Result<Option<Metadata>> {
    for a in rel.ancestors() {
        match std::fs::symlink_metadata(abs(root, &a)) {
            Ok(m) if m.file_type().is_dir() => {}
            Ok(_) => return Ok(None),
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    match std::fs::symlink_metadata(abs(root, rel)) {
        Ok(m) => Ok(Some(m)),
        Err(e) if is_gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Errors meaning "nothing is there (any more)".
pub(crate) fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Wall-clock nanoseconds since the epoch.
pub(crate) fn now_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_nanos()).unwrap_or(i64::MAX),
    }
}

/// A wire mtime (ms since the epoch, possibly negative) as a `SystemTime`.
pub(crate) fn time_of_ms(ms: i64) -> SystemTime {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH.checked_add(d).unwrap_or(UNIX_EPOCH)
    } else {
        UNIX_EPOCH.checked_sub(d).unwrap_or(UNIX_EPOCH)
    }
}

/// Reads a symlink's target as UTF-8; `None` for a target the wire cannot
/// carry.
pub(crate) fn read_link_utf8(path: &Path) -> io::Result<Option<String>> {
    let t = std::fs::read_link(path)?;
    Ok(t.into_os_string().into_string().ok())
}

/// Opens a regular file for reading without following a final symlink.
pub(crate) fn open_nofollow(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}
