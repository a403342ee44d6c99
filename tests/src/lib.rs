//! Helpers for the cross-crate scenarios in `tests/tests/`: start a real
//! `wsd serve` on `127.0.0.1:0`-like free ports in a temp directory, run the
//! `wsd` CLI, build deterministic trees and compare them byte for byte.

use std::collections::BTreeMap;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

pub mod hub;
pub mod parsers;

pub use wsd_test_support::{
    Daemon, DaemonBuilder, STEP, bin, free_addr, free_port, run_bounded, show, text, tree_digest,
    wait_until, wsd_bin, wsd_command,
};

/// A CLI-side directory and a real daemon serving another, all in one
/// temp dir (`local/`, `served/`, `state/`). Fields drop in order: the
/// daemon is killed before the directory is removed.
#[derive(Debug)]
pub struct Env {
    pub daemon: Daemon,
    pub local: PathBuf,
    pub served: PathBuf,
    pub state: PathBuf,
    pub tmp: tempfile::TempDir,
}

impl Env {
    /// Creates the directories and starts the daemon on `served/`.
    pub fn start() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let local = tmp.path().join("local");
        let served = tmp.path().join("served");
        let state = tmp.path().join("state");
        std::fs::create_dir_all(&local).unwrap();
        std::fs::create_dir_all(&served).unwrap();
        let daemon = Daemon::start(&served, &state, None);
        Env {
            daemon,
            local,
            served,
            state,
            tmp,
        }
    }
}

/// Deterministic pseudo-random bytes.
pub fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn write(root: &Path, rel: &str, data: &[u8], mode: u32) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(&p, data).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A small tree with nested dirs, executables, an empty file, a file of
/// several chunks and symlinks (relative, absolute, dangling).
pub fn make_tree(root: &Path, files: usize, seed: u64) {
    for i in 0..files {
        let dir = format!("d{}/e{}", i % 7, i % 3);
        let len = (i * 997 + 13) % 5000;
        let mode = if i % 11 == 0 { 0o755 } else { 0o644 };
        write(
            root,
            &format!("{dir}/f{i}.txt"),
            &bytes(len, seed + i as u64),
            mode,
        );
    }
    write(root, "empty", b"", 0o600);
    write(root, "big/blob.bin", &bytes(900_000, seed), 0o644);
    std::fs::create_dir_all(root.join("links")).unwrap();
    symlink("../d0", root.join("links/rel")).unwrap();
    symlink("/nonexistent/target", root.join("links/abs")).unwrap();
    symlink("dangling", root.join("links/dangling")).unwrap();
    std::fs::create_dir_all(root.join("empty-dir")).unwrap();
    std::fs::set_permissions(
        root.join("empty-dir"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
}

/// A `Dofs` tree in the format of [`tree_digest`] (modes of symlinks are
/// not compared, as on Linux where they mean nothing).
pub fn dofs_digest(d: &wsd_dofs::Dofs) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    dofs_walk(d, None, &mut out);
    out
}

fn dofs_walk(
    d: &wsd_dofs::Dofs,
    dir: Option<&wsd_sync::SyncPath>,
    out: &mut BTreeMap<String, String>,
) {
    for e in d.readdir(dir).expect("readdir") {
        let rel = e.path.as_str().to_owned();
        match e.stat.kind {
            wsd_sync::Kind::Dir => {
                out.insert(rel, format!("d {:o}", e.stat.mode));
                dofs_walk(d, Some(&e.path), out);
            }
            wsd_sync::Kind::Symlink => {
                out.insert(rel, format!("l {}", e.stat.target.unwrap_or_default()));
            }
            _ => {
                let bytes = d.read_file(&e.path).expect("read_file");
                out.insert(
                    rel,
                    format!(
                        "f {:o} {} {}",
                        e.stat.mode,
                        bytes.len(),
                        hex::encode(Sha256::digest(&bytes))
                    ),
                );
            }
        }
    }
}

/// The differences between two digests, at most `max` lines.
pub fn digest_diff(
    a: &BTreeMap<String, String>,
    b: &BTreeMap<String, String>,
    max: usize,
) -> Vec<String> {
    differing_paths(a, b)
        .take(max)
        .map(|k| format!("{k}: {:?} vs {:?}", a.get(k), b.get(k)))
        .collect()
}

/// The paths whose entries differ between two digests, in order.
pub fn differing_paths<'a>(
    a: &'a BTreeMap<String, String>,
    b: &'a BTreeMap<String, String>,
) -> impl Iterator<Item = &'a String> {
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter().filter(move |k| a.get(*k) != b.get(*k))
}

/// Resident memory of a process in KiB (`VmRSS`), if it is alive.
pub fn proc_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// Open file descriptors of a process, if it is alive.
pub fn proc_fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

/// `PRAGMA integrity_check` of a SQLite database opened read-only: `Ok`
/// when it answers `ok`, else the rows it answered (or the open error).
pub fn sqlite_integrity(path: &Path) -> Result<(), String> {
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("opening {}: {e}", path.display()))?;
    let rows: Vec<String> = conn
        .prepare("PRAGMA integrity_check")
        .and_then(|mut s| {
            s.query_map([], |r| r.get::<_, String>(0))?
                .collect::<Result<_, _>>()
        })
        .map_err(|e| format!("integrity_check of {}: {e}", path.display()))?;
    if rows == ["ok"] {
        Ok(())
    } else {
        Err(format!("{}: {}", path.display(), rows.join("; ")))
    }
}

/// Every path under `root` (relative, `.wsd` excluded) whose file name
/// starts with `prefix`.
pub fn find_named(root: &Path, prefix: &str) -> Vec<String> {
    fn go(root: &Path, dir: &Path, prefix: &str, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in rd.flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if rel == ".wsd" {
                continue;
            }
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                out.push(rel);
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                go(root, &path, prefix, out);
            }
        }
    }
    let mut out = Vec::new();
    go(root, root, prefix, &mut out);
    out
}
