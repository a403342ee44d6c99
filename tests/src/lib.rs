//! Helpers for the cross-crate scenarios in `tests/tests/`: start a real
//! `wsd serve` on `127.0.0.1:0`-like free ports in a temp directory, run the
//! `wsd` CLI, build deterministic trees and compare them byte for byte.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::TcpStream;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub mod hub;
pub mod parsers;

/// The `wsd` binary of this workspace's target directory. `cargo test`
/// builds it because the `wsd` package has integration tests of its own.
pub fn wsd_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("WSD_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/wsd
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("wsd");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p wsd` (or set WSD_BIN)",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

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

/// A `wsd serve` child process; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Daemon {
    pub root: PathBuf,
    pub state: PathBuf,
    pub addr: String,
    pub token_file: Option<PathBuf>,
    /// The program and its leading arguments (default: the `wsd` binary).
    pub program: Vec<OsString>,
    /// Where the daemon's stderr goes (default: discarded).
    pub log: Option<PathBuf>,
    child: Option<Child>,
}

impl Daemon {
    /// Starts `wsd serve --root root --state state` on a free loopback port
    /// and waits until it accepts connections.
    pub fn start(root: &Path, state: &Path, token_file: Option<&Path>) -> Daemon {
        Daemon::start_with(vec![wsd_bin().into()], root, state, token_file, None)
    }

    /// Like [`Daemon::start`] with another program (e.g. a binary that
    /// embeds the daemon, followed by its leading arguments) and a file for
    /// the daemon's stderr.
    pub fn start_with(
        program: Vec<OsString>,
        root: &Path,
        state: &Path,
        token_file: Option<&Path>,
        log: Option<&Path>,
    ) -> Daemon {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut d = Daemon {
            root: root.to_owned(),
            state: state.to_owned(),
            addr,
            token_file: token_file.map(Path::to_owned),
            program,
            log: log.map(Path::to_owned),
            child: None,
        };
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(&self.program[0]);
        cmd.args(&self.program[1..])
            .args(["serve", "--listen", &self.addr])
            .arg("--root")
            .arg(&self.root)
            .arg("--state")
            .arg(&self.state)
            .env_remove("WSD_TOKEN")
            .env_remove("WSD_TOKEN_FILE")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(log) = &self.log {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("open the daemon log");
            cmd.stderr(f);
        }
        if let Some(t) = &self.token_file {
            cmd.arg("--token-file").arg(t);
        }
        let mut child = cmd.spawn().expect("spawn wsd serve");
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(&self.addr).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("wsd serve exited early: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "wsd serve did not listen on {}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// True while the child process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().map(|s| s.is_none()).unwrap_or(false),
            None => false,
        }
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: a graceful stop.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let status = Command::new("kill")
            .arg(c.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        c.wait().unwrap()
    }

    /// Starts the daemon again on the same root, state and address.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Runs a `wsd` client subcommand against this daemon.
    pub fn cli(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(wsd_bin());
        cmd.args(args)
            .args(["--remote", &self.addr])
            .env_remove("WSD_TOKEN_FILE");
        if let Some(t) = &self.token_file {
            cmd.arg("--token-file").arg(t);
        }
        cmd.output().expect("run wsd")
    }

    /// `wsd push|pull LOCAL --json`, asserting success; returns the summary.
    pub fn transfer(&self, verb: &str, local: &Path) -> serde_json::Value {
        let out = self.cli(&[verb, local.to_str().unwrap(), "--json", "--create"]);
        assert!(
            out.status.success(),
            "wsd {verb} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str(stdout.lines().last().expect("a JSON summary")).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One path's state, as compared between trees (mtimes excluded).
pub fn tree_digest(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        if rel == ".wsd" {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() {
            out.insert(
                rel,
                format!("l {}", std::fs::read_link(&path).unwrap().display()),
            );
        } else if meta.is_dir() {
            out.insert(rel, format!("d {mode:o}"));
            walk(root, &path, out);
        } else {
            let bytes = std::fs::read(&path).unwrap();
            out.insert(
                rel,
                format!(
                    "f {mode:o} {} {}",
                    bytes.len(),
                    hex::encode(Sha256::digest(&bytes))
                ),
            );
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

/// Runs `cmd` to completion with its output captured, failing the test if
/// it is still running after `limit` (it is killed first), so a command
/// that would hang turns into a failure instead of a stuck test.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("collect output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("collect output");
            panic!(
                "{cmd:?} still running after {limit:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
