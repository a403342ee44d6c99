//! Small filesystem helpers shared by settle and apply. Everything here
//! uses `lstat` semantics: a symlink is never followed.

use std::fs::Metadata;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wsd_sync::{SyncError, SyncPath};

use super::error::IoContext;

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

/// [`lstat_in_root`], skipping ancestors in `known_dirs` (workspace paths
/// seen to be real directories earlier in the same pass) and adding the
/// ones it checks.
pub(crate) fn lstat_in_root_cached(
    root: &Path,
    rel: &SyncPath,
    known_dirs: &mut std::collections::HashSet<String>,
) -> io::Result<Option<Metadata>> {
    let path = rel.as_str();
    for (i, _) in path.match_indices('/') {
        let a = &path[..i];
        if known_dirs.contains(a) {
            continue;
        }
        match std::fs::symlink_metadata(root.join(a)) {
            Ok(m) if m.file_type().is_dir() => {
                known_dirs.insert(a.to_owned());
            }
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

/// This process's umask, read once (`/proc/self/status`; the `umask` call
/// itself would set it, racing with other threads). `None` where it cannot
/// be read: then every file is `fchmod`-ed.
static UMASK: std::sync::LazyLock<Option<u32>> = std::sync::LazyLock::new(|| {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
});

/// Whether a file created with `mode` gets exactly `mode`: only permission
/// bits the umask does not clear (no setuid, setgid or sticky bit, which
/// `open` may drop).
pub(crate) fn umask_keeps(mode: u32) -> bool {
    UMASK.is_some_and(|umask| mode & 0o7777 == mode & 0o777 & !umask)
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
        .custom_flags(O_NOFOLLOW)
        .open(path)
}

/// Opens `rel` inside the root for reading, only as a regular file reached
/// through real directories (never a symlink, at any depth). Returns the
/// file and its `fstat`, or `None` when nothing such is there.
///
/// One `openat2(RESOLVE_NO_SYMLINKS)` on the canonical absolute path (the
/// root itself has no symlinks, being canonical) replaces an `lstat` per
/// ancestor plus an `open`, and leaves no window between check and open.
/// Where `openat2` is unavailable (kernel < 5.6, seccomp) or the root's
/// own path gained a symlink, it falls back to [`lstat_in_root`] + open.
pub(crate) fn open_file_in_root(
    root: &Path,
    rel: &SyncPath,
) -> io::Result<Option<(std::fs::File, Metadata)>> {
    let abs = abs(root, rel);
    let file = match openat2_no_symlinks(&abs) {
        Ok(f) => f,
        Err(e) if is_gone(&e) => return Ok(None),
        Err(e)
            if !matches!(
                e.raw_os_error(),
                Some(ENOSYS | EPERM | EINVAL | E2BIG | ELOOP | EXDEV)
            ) =>
        {
            return Err(e);
        }
        Err(_) => {
            // The portable way: every ancestor a real directory, then open
            // without following a final symlink.
            match lstat_in_root(root, rel)? {
                Some(m) if m.file_type().is_file() => {}
                _ => return Ok(None),
            }
            match open_nofollow(&abs) {
                Ok(f) => f,
                Err(e) if is_gone(&e) || e.raw_os_error() == Some(ELOOP) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
    };
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Ok(None);
    }
    Ok(Some((file, meta)))
}

/// Opens an absolute path for reading without following a symlink at any
/// depth (`openat2(RESOLVE_NO_SYMLINKS)`; `ELOOP` when there is one). Where
/// `openat2` is unavailable it only refuses a final symlink, as
/// [`open_nofollow`] does.
pub(crate) fn open_no_symlinks(path: &Path) -> io::Result<std::fs::File> {
    match openat2_no_symlinks(path) {
        Err(e) if matches!(e.raw_os_error(), Some(ENOSYS | EPERM | EINVAL | E2BIG)) => {
            open_nofollow(path)
        }
        other => other,
    }
}

/// `openat2(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW,
/// RESOLVE_NO_SYMLINKS)`.
fn openat2_no_symlinks(path: &Path) -> io::Result<std::fs::File> {
    use rustix::fs::{CWD, Mode, OFlags, ResolveFlags};
    let fd = rustix::fs::openat2(
        CWD,
        path,
        OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS,
    )?;
    Ok(std::fs::File::from(fd))
}

/// The errno values the fallbacks here look for, as `raw_os_error` gives them.
const ENOSYS: i32 = rustix::io::Errno::NOSYS.raw_os_error();
const EPERM: i32 = rustix::io::Errno::PERM.raw_os_error();
const EINVAL: i32 = rustix::io::Errno::INVAL.raw_os_error();
const E2BIG: i32 = rustix::io::Errno::TOOBIG.raw_os_error();
const EXDEV: i32 = rustix::io::Errno::XDEV.raw_os_error();
/// `ELOOP`: a symlink where none may be followed.
pub(crate) const ELOOP: i32 = rustix::io::Errno::LOOP.raw_os_error();
/// `O_NOFOLLOW`, for `OpenOptionsExt::custom_flags`.
pub(crate) const O_NOFOLLOW: i32 = rustix::fs::OFlags::NOFOLLOW.bits() as i32;

/// The stat of a file just renamed into place, the mode made exact first
/// if its creation did not give it (a default ACL narrows the create mode
/// where a umask would not). Files are created with their final mode when
/// the umask keeps it, so this is one `fstat` as a rule.
pub(crate) fn stat_written(
    file: &std::fs::File,
    mode: u32,
    path: &SyncPath,
) -> Result<std::fs::Metadata, SyncError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = file.metadata().io_ctx(|| format!("stat {path}"))?;
    if meta.mode() & 0o7777 == mode & 0o7777 {
        return Ok(meta);
    }
    file.set_permissions(std::fs::Permissions::from_mode(mode))
        .io_ctx(|| format!("chmod {path}"))?;
    file.metadata().io_ctx(|| format!("stat {path}"))
}
