//! Finding a damaged file at open and setting it aside; the clean-close
//! stamp that lets a cleanly closed file skip the check.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::config::DbConfig;
use rusqlite::{Connection, ErrorCode, OpenFlags};

/// Whether `e` says the file is damaged or is not a database at all.
pub fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}

/// Why the database at `path` is damaged, or `None` if it is sound (or
/// missing, or fails for a reason that is not damage: the caller's own
/// open reports that). Runs `PRAGMA quick_check`, which reads every page:
/// O(size of the file), a few milliseconds for a typical index.
pub fn damage(path: &Path) -> Option<String> {
    if !path.exists() {
        return None;
    }
    let check = || -> Result<Vec<String>, rusqlite::Error> {
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        // Closing the last connection would checkpoint a leftover WAL into
        // the file, changing a file the owner may refuse to touch.
        conn.set_db_config(DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)?;
        let mut stmt = conn.prepare("PRAGMA quick_check")?;
        let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
        rows.collect()
    };
    match check() {
        Ok(rows) if rows.len() == 1 && rows[0] == "ok" => None,
        Ok(rows) => Some(rows.join("; ")),
        Err(e) if is_corruption(&e) => Some(e.to_string()),
        Err(_) => None,
    }
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Renames `path` and its `-wal` and `-shm` files to
/// `NAME.corrupt-<UTC time>` (kept for a post-mortem, never read again) and
/// returns the new name of the database file. The WAL must go with it:
/// replayed into a fresh database it would bring the damage back. A name
/// already taken (two in one second) gets `-2`, `-3`, ... appended.
pub fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let stamp = utc_stamp(std::time::SystemTime::now());
    let mut aside = with_suffix(path, &format!(".corrupt-{stamp}"));
    let mut n = 1;
    while aside.exists() {
        n += 1;
        aside = with_suffix(path, &format!(".corrupt-{stamp}-{n}"));
    }
    for sidecar in ["-wal", "-shm"] {
        match std::fs::rename(with_suffix(path, sidecar), with_suffix(&aside, sidecar)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// `t` as `YYYYMMDDTHHMMSSZ` (UTC): sortable and free of `:`.
pub(crate) fn utc_stamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's
    // `civil_from_days`), so the crate needs no calendar dependency.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The shell command that sets `path` aside by hand (for error messages).
pub(crate) fn set_aside_command(path: &Path) -> String {
    let p = path.display();
    format!(
        "for f in '{p}' '{p}-wal' '{p}-shm'; do [ ! -e \"$f\" ] || mv \"$f\" \"$f.corrupt\"; done"
    )
}

/// SQLite errors saying "corrupt" or "not a database" that code in this
/// process has met (see [`note_error`]). Process-wide rather than per
/// database because error paths only hold the `rusqlite::Error`; a
/// [`CleanClose`] that sees it move during its session does not stamp, so
/// at worst a sound database sharing the process is checked once more.
static CORRUPTION_SEEN: AtomicU64 = AtomicU64::new(0);

/// Counts `e` when it says a database is damaged. Call it where an owner's
/// SQLite errors pass (its `From<rusqlite::Error>`): a page that went bad
/// without moving the file's metadata would otherwise be stamped clean at
/// close and never checked again.
pub fn note_error(e: &rusqlite::Error) {
    if is_corruption(e) {
        CORRUPTION_SEEN.fetch_add(1, Ordering::SeqCst);
    }
}

fn corruption_seen() -> u64 {
    CORRUPTION_SEEN.load(Ordering::SeqCst)
}

/// The clean-close stamp of the database at `path`.
pub(crate) fn stamp_path(path: &Path) -> PathBuf {
    with_suffix(path, ".clean")
}

/// What identifies this state of the database file: device, inode, size,
/// mtime and ctime (any write or replacement moves one of them). `None`
/// while a write-ahead log holds pages not yet in the file.
pub(crate) fn file_state(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(with_suffix(path, "-wal")) {
        Ok(m) if m.len() > 0 => return None,
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(_) => return None,
    }
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(format!(
        "{} {} {} {}.{} {}.{}\n",
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

/// Consumes the clean-close stamp: true when there was one and the file is
/// still in the state it recorded. The stamp is removed first, so an open
/// that ends in a crash leaves none and the next open checks the file.
pub(crate) fn take_clean_stamp(path: &Path) -> bool {
    let stamp = stamp_path(path);
    let Ok(recorded) = std::fs::read_to_string(&stamp) else {
        return false;
    };
    if std::fs::remove_file(&stamp).is_err() {
        return false;
    }
    file_state(path).is_some_and(|now| now == recorded)
}

/// Stamps the file clean when the database closes, so the next open skips
/// `PRAGMA quick_check`. It must outlive the connection: close that with
/// [`CleanClose::close`], or declare this field after the connection's in
/// the struct that holds both (fields drop in declaration order). If the
/// connection is still open, or its last close left a non-empty WAL, the
/// file's state is not final and no stamp is written (the next open checks).
#[derive(Debug)]
pub struct CleanClose {
    path: PathBuf,
    /// [`CORRUPTION_SEEN`] at open: moved by close means this session may
    /// have met a damaged file, which must not be stamped clean.
    corruption_mark: u64,
    /// Cleared by [`CleanClose::distrust`].
    trusted: bool,
}

impl CleanClose {
    pub(crate) fn new(path: &Path) -> CleanClose {
        CleanClose {
            path: path.to_owned(),
            corruption_mark: corruption_seen(),
            trusted: true,
        }
    }

    /// Makes the close leave no stamp (the session did not end as a sound
    /// database should, e.g. its migration was refused).
    pub fn distrust(&mut self) {
        self.trusted = false;
    }

    /// Closes `conn` (SQLite checkpoints the log into the file) and then
    /// stamps the file if the session met no corruption error.
    pub fn close(self, conn: Connection) {
        if let Err((_, e)) = conn.close() {
            tracing::warn!(db = %self.path.display(), error = %e, "closing the database");
        }
    }
}

impl Drop for CleanClose {
    fn drop(&mut self) {
        if !self.trusted {
            let _ = std::fs::remove_file(stamp_path(&self.path));
            return;
        }
        if corruption_seen() != self.corruption_mark {
            let _ = std::fs::remove_file(stamp_path(&self.path));
            tracing::warn!(
                db = %self.path.display(),
                "the database reported corruption this session: the next open checks it"
            );
            return;
        }
        if let Some(state) = file_state(&self.path)
            && let Err(e) = std::fs::write(stamp_path(&self.path), state)
        {
            tracing::debug!(db = %self.path.display(), error = %e, "no clean-close stamp");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps_are_civil_dates() {
        let at = |s: u64| utc_stamp(std::time::UNIX_EPOCH + std::time::Duration::from_secs(s));
        assert_eq!(at(0), "19700101T000000Z");
        assert_eq!(at(951_782_400), "20000229T000000Z");
        assert_eq!(at(1_709_251_199), "20240229T235959Z");
        assert_eq!(at(4_102_444_800), "21000101T000000Z");
    }
}
