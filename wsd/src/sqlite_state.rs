//! Damaged SQLite state files: how the store's index and the exec log find
//! out at open that their file is corrupt, and how they set it aside so the
//! daemon (or the CLI) starts afresh instead of stopping on "database disk
//! image is malformed". What to do after that is the owner's call: the
//! index is derived from the tree and is rebuilt by a rescan; the exec log
//! is not, so its owner starts an empty one and says so loudly.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rusqlite::{Connection, ErrorCode};

/// Whether `e` says the file is damaged or is not a database at all.
pub(crate) fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}

/// Why the database at `path` is damaged, or `None` if it is sound (or
/// missing, or fails for a reason that is not damage: the caller's own
/// open reports that). Runs `PRAGMA quick_check`, which reads every page:
/// O(size of the file), a few milliseconds for a typical index.
pub(crate) fn damage(path: &Path) -> Option<String> {
    if !path.exists() {
        return None;
    }
    let check = || -> Result<Vec<String>, rusqlite::Error> {
        let conn = Connection::open(path)?;
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

/// Renames `path` and its `-wal` and `-shm` files to `<name>.corrupt-<unix
/// seconds>` (kept for a post-mortem, never read again) and returns the new
/// name of the database file. The WAL must go with it: replayed into a
/// fresh database it would bring the damage back.
pub(crate) fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let with_suffix = |p: &Path, suffix: &str| {
        let mut s = p.as_os_str().to_owned();
        s.push(suffix);
        PathBuf::from(s)
    };
    let aside = with_suffix(path, &format!(".corrupt-{stamp}"));
    for sidecar in ["-wal", "-shm"] {
        let from = with_suffix(path, sidecar);
        match std::fs::rename(&from, with_suffix(&aside, sidecar)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::rename(path, &aside)?;
    Ok(aside)
}

/// SQLite errors saying "corrupt" or "not a database" that store code in
/// this process has met (see [`note_error`]). Process-wide rather than per
/// store because the error paths only hold the `rusqlite::Error`; a store
/// that sees it move during its session does not stamp at close, so at
/// worst a sound index sharing the process is checked once more.
static CORRUPTION_SEEN: AtomicU64 = AtomicU64::new(0);

/// Counts `e` when it says the index is damaged: a page that went bad
/// without moving the file's metadata would otherwise be stamped clean at
/// close and never checked again, failing every push and pull forever.
pub(crate) fn note_error(e: &rusqlite::Error) {
    if is_corruption(e) {
        CORRUPTION_SEEN.fetch_add(1, Ordering::SeqCst);
    }
}

/// How many corruption errors store code has met so far (see
/// [`note_error`]); a store compares it at close with its value at open.
pub(crate) fn corruption_seen() -> u64 {
    CORRUPTION_SEEN.load(Ordering::SeqCst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Overwrites the pages after the first with garbage: the header still
    /// says SQLite, the b-trees do not.
    fn damage_pages(path: &Path) {
        use std::io::{Seek, SeekFrom, Write};
        let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        f.seek(SeekFrom::Start(4096)).unwrap();
        f.write_all(&[0xA5; 8192]).unwrap();
    }

    #[test]
    fn a_sound_database_passes_and_a_damaged_one_is_set_aside_with_its_wal() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("x.sqlite3");
        assert_eq!(damage(&db), None, "a missing file is not damage");
        {
            let c = Connection::open(&db).unwrap();
            c.execute_batch(
                "CREATE TABLE a (k INTEGER PRIMARY KEY, v TEXT);
                 CREATE TABLE b (k INTEGER PRIMARY KEY, v TEXT);
                 CREATE INDEX bv ON b (v);",
            )
            .unwrap();
            for i in 0..500 {
                c.execute("INSERT INTO a VALUES (?1, 'aaaaaaaaaaaaaaaa')", [i])
                    .unwrap();
                c.execute("INSERT INTO b VALUES (?1, 'bbbbbbbbbbbbbbbb')", [i])
                    .unwrap();
            }
        }
        assert_eq!(damage(&db), None);
        damage_pages(&db);
        assert!(damage(&db).is_some());
        std::fs::write(dir.path().join("x.sqlite3-wal"), b"stale").unwrap();
        let aside = set_aside(&db).unwrap();
        assert!(!db.exists());
        assert!(!dir.path().join("x.sqlite3-wal").exists());
        assert!(aside.to_str().unwrap().contains("x.sqlite3.corrupt-"));
        assert!(aside.exists());

        std::fs::write(&db, b"not a database at all, just some text").unwrap();
        assert!(damage(&db).is_some(), "garbage is damage too");
    }
}
