//! Faults while the daemon applies or serves: a full disk (the workspace on
//! a 2 MiB tmpfs), a read-only directory in the workspace (a read-only bind
//! mount: the tests run as root, which ignores permission bits), and the
//! connection cut after every N bytes of a push and of a pull (a proxy in
//! the test, N swept over the whole exchange). Each fault must yield a
//! typed wire error, leave nothing partial (no torn file at a final path,
//! no temp file, an index that agrees with the directory: a pull afterwards
//! finds no local change), and a retry once the fault is gone converges.
//!
//! The mount-based tests need `mount` (root, or a user namespace); where it
//! is not allowed they print why and skip. Sweep sizes: 12 cut points per
//! direction, 40 with `WSD_SLOW_TESTS=1`.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tempfile::TempDir;
use wsd_sync::{ErrorCode, SyncError};
use wsd_tests::hub::{Hub, block_on_local};
use wsd_tests::{Daemon, bytes, digest_diff, dofs_digest, find_named, tree_digest};

fn slow() -> bool {
    std::env::var_os("WSD_SLOW_TESTS").is_some_and(|v| v == "1")
}

/// A mount made by a test, undone on drop.
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn mount(args: &[&str], target: &Path) -> Result<Mount, String> {
    let out = Command::new("mount")
        .args(args)
        .arg(target)
        .output()
        .map_err(|e| format!("cannot run mount: {e}"))?;
    if out.status.success() {
        Ok(Mount(target.to_owned()))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn remount(opts: &str, target: &Path) {
    let st = Command::new("mount")
        .args(["-o", opts])
        .arg(target)
        .status()
        .unwrap();
    assert!(st.success(), "mount -o {opts} {}", target.display());
}

/// Every file at its final path in `root` is a version `hub` wrote (or in
/// `extra`); no apply temp file is left.
fn assert_nothing_torn(root: &Path, hub: &Hub, extra: &HashSet<[u8; 32]>, what: &str) {
    fn go(root: &Path, dir: &Path, out: &mut Vec<(String, [u8; 32])>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            if rel == ".wsd" {
                continue;
            }
            let t = e.file_type().unwrap();
            if t.is_dir() {
                go(root, &path, out);
            } else if t.is_file() {
                out.push((rel, Sha256::digest(std::fs::read(&path).unwrap()).into()));
            }
        }
    }
    let mut files = Vec::new();
    go(root, root, &mut files);
    let torn: Vec<&String> = files
        .iter()
        .filter(|(_, h)| !hub.written.contains(h) && !extra.contains(h))
        .map(|(p, _)| p)
        .collect();
    assert!(torn.is_empty(), "{what}: torn or unknown files: {torn:?}");
    let temps = find_named(root, ".wsd-apply-");
    assert!(temps.is_empty(), "{what}: temp files left: {temps:?}");
}

struct Env {
    _tmp: TempDir,
    served: PathBuf,
    hub: Hub,
    daemon: Daemon,
}

fn start(tmp: TempDir, served: PathBuf) -> Env {
    let daemon = Daemon::start(&served, &tmp.path().join("state"), None);
    let hub = Hub::open(&tmp.path().join("authority.dofs"), &daemon.addr);
    Env {
        _tmp: tmp,
        served,
        hub,
        daemon,
    }
}

impl Env {
    /// After a failed apply: the daemon is up, nothing is torn, and the
    /// index agrees with the directory (a pull finds no local change).
    async fn check_clean_failure(&mut self, err: &SyncError, want: ErrorCode, what: &str) {
        assert_eq!(err.code(), want, "{what}: {err}");
        assert!(self.daemon.is_running(), "{what}: the daemon died");
        assert_nothing_torn(&self.served, &self.hub, &HashSet::new(), what);
        let pulled = self.hub.pull().await.unwrap();
        assert_eq!(
            pulled.entries, 0,
            "{what}: the failed apply left changes the index did not record"
        );
    }

    async fn converge_and_compare(&mut self, what: &str) {
        self.hub.converge_and_compare(&self.served, what).await;
    }
}

#[test]
fn a_full_disk_fails_the_push_with_eio_leaves_nothing_torn_and_a_retry_converges() {
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    std::fs::create_dir_all(&served).unwrap();
    let _mount = match mount(&["-t", "tmpfs", "-o", "size=2m", "tmpfs"], &served) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("skipping the full-disk test: cannot mount a tmpfs here ({e})");
            return;
        }
    };
    // The daemon dies before the mount is undone (drop order: env first).
    let mut env = start(tmp, served.clone());
    block_on_local(async {
        env.hub.put("small/first.txt", b"fits", 0o644);
        env.hub.push().await.unwrap();
        for i in 0..12u64 {
            env.hub
                .put(&format!("big/f{i}"), &bytes(300 * 1024, i), 0o644);
        }
        env.hub.put("small/second.txt", b"also fits", 0o600);
        let err = env.hub.push().await.unwrap_err();
        env.check_clean_failure(&err, ErrorCode::Io, "full disk")
            .await;
        // The same push fails the same way while the disk stays full.
        let again = env.hub.push().await.unwrap_err();
        assert_eq!(again.code(), ErrorCode::Io, "{again}");
        remount("remount,size=64m", &served);
        env.converge_and_compare("full disk, after growing it")
            .await;
    });
    drop(env);
}

#[test]
fn a_read_only_directory_fails_the_apply_with_eio_and_a_retry_converges() {
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    std::fs::create_dir_all(served.join("ro")).unwrap();
    let mut env = start(tmp, served.clone());
    let ro = served.join("ro");
    block_on_local(async {
        env.hub.put("ro/existing.txt", b"before", 0o644);
        env.hub.put("rw/existing.txt", b"before", 0o644);
        env.hub.converge().await.unwrap();
        let _mount = match mount(&["--bind", ro.to_str().unwrap()], &ro).and_then(|m| {
            let st = Command::new("mount")
                .args(["-o", "remount,ro,bind"])
                .arg(&ro)
                .status()
                .map_err(|e| e.to_string())?;
            if st.success() {
                Ok(m)
            } else {
                Err("remount,ro failed".into())
            }
        }) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("skipping the read-only test: cannot bind-mount here ({e})");
                return;
            }
        };
        env.hub.put("rw/new.txt", b"lands or not", 0o644);
        env.hub.put("ro/existing.txt", b"after", 0o644);
        env.hub.put("ro/sub/new.txt", b"new", 0o644);
        let err = env.hub.push().await.unwrap_err();
        env.check_clean_failure(&err, ErrorCode::Io, "read-only directory")
            .await;
        assert_eq!(std::fs::read(ro.join("existing.txt")).unwrap(), b"before");
        remount("remount,rw,bind", &ro);
        env.converge_and_compare("read-only directory, made writable")
            .await;
    });
}

// --- connection cuts ---------------------------------------------------------

/// A TCP proxy to `upstream` that forwards bytes in both directions and
/// cuts every connection once `limit` bytes (both directions together)
/// went through it.
struct CutProxy {
    addr: String,
    limit: Arc<AtomicU64>,
    moved: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl CutProxy {
    fn start(upstream: &str) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let limit = Arc::new(AtomicU64::new(u64::MAX));
        let moved = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, m, s, up) = (
            limit.clone(),
            moved.clone(),
            stop.clone(),
            upstream.to_owned(),
        );
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        down.set_nonblocking(false).unwrap();
                        let Ok(upc) = TcpStream::connect(&up) else {
                            continue;
                        };
                        m.store(0, Ordering::SeqCst);
                        for (mut from, mut to) in [
                            (down.try_clone().unwrap(), upc.try_clone().unwrap()),
                            (upc, down),
                        ] {
                            let (l, m) = (l.clone(), m.clone());
                            std::thread::spawn(move || {
                                let mut buf = [0u8; 4096];
                                loop {
                                    let n = match from.read(&mut buf) {
                                        Ok(0) | Err(_) => break,
                                        Ok(n) => n,
                                    };
                                    let before = m.fetch_add(n as u64, Ordering::SeqCst);
                                    let lim = l.load(Ordering::SeqCst);
                                    let keep = lim.saturating_sub(before).min(n as u64) as usize;
                                    if keep > 0 && to.write_all(&buf[..keep]).is_err() {
                                        break;
                                    }
                                    if keep < n {
                                        break;
                                    }
                                }
                                let _ = from.shutdown(Shutdown::Both);
                                let _ = to.shutdown(Shutdown::Both);
                            });
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        CutProxy {
            addr,
            limit,
            moved,
            stop,
        }
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// The cut points: `n` points spread over `0..total`, denser at the start
/// (where the handshake and the small calls are).
fn cut_points(total: u64, n: usize) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let f = (i as f64 + 0.5) / n as f64;
            ((f * f) * total as f64) as u64
        })
        .collect()
}

#[test]
fn a_connection_cut_at_every_point_of_a_push_or_pull_fails_typed_and_a_retry_converges() {
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    let daemon = Daemon::start(&served, &tmp.path().join("state"), None);
    let proxy = CutProxy::start(&daemon.addr);
    let mut hub = Hub::open(&tmp.path().join("authority.dofs"), &proxy.addr);
    let points = if slow() { 40 } else { 12 };
    let mut local_versions = HashSet::new();
    let mut outcomes = Vec::new();
    block_on_local(async {
        let changes = |hub: &mut Hub, round: u64| {
            for i in 0..30u64 {
                hub.put(
                    &format!("c/d{}/f{i}", i % 4),
                    &bytes(200 + (i as usize * 97) % 3000, round * 100 + i),
                    0o644,
                );
            }
            hub.put(
                &format!("c/big{}", round % 3),
                &bytes(600_000, round),
                0o644,
            );
        };
        let made = |served: &Path, round: u64, versions: &mut HashSet<[u8; 32]>| {
            for i in 0..30u64 {
                let data = bytes(100 + (i as usize * 131) % 4000, 1_000_000 + round * 100 + i);
                versions.insert(Sha256::digest(&data).into());
                wsd_tests::write(served, &format!("m/d{}/f{i}", i % 4), &data, 0o644);
            }
            let big = bytes(500_000, 2_000_000 + round);
            versions.insert(Sha256::digest(&big).into());
            wsd_tests::write(served, "m/big", &big, 0o644);
        };
        // Measure a whole exchange of each kind (a fresh connection each).
        changes(&mut hub, 0);
        hub.push().await.unwrap();
        let push_total = proxy.moved.load(Ordering::SeqCst);
        hub.disconnect();
        made(&served, 0, &mut local_versions);
        hub.pull().await.unwrap();
        let pull_total = proxy.moved.load(Ordering::SeqCst);
        hub.disconnect();

        let mut round = 0;
        for (push, total) in [(true, push_total), (false, pull_total)] {
            for cut in cut_points(total, points) {
                round += 1;
                if push {
                    changes(&mut hub, round);
                } else {
                    made(&served, round, &mut local_versions);
                }
                proxy.limit.store(cut, Ordering::SeqCst);
                hub.disconnect();
                let r = if push {
                    hub.push().await
                } else {
                    hub.pull().await
                };
                let what = format!(
                    "{} cut after {cut} of {total} bytes",
                    if push { "push" } else { "pull" }
                );
                match &r {
                    Ok(_) => outcomes.push(format!("{what}: completed")),
                    Err(e) => {
                        assert_eq!(e.code(), ErrorCode::Shutdown, "{what}: {e}");
                        outcomes.push(format!("{what}: {}", e.code()));
                    }
                }
                hub.disconnect();
                assert_nothing_torn(&served, &hub, &local_versions, &what);
                hub.dofs.check_integrity().unwrap();
                proxy.limit.store(u64::MAX, Ordering::SeqCst);
                hub.converge()
                    .await
                    .unwrap_or_else(|e| panic!("{what}: retry did not converge: {e}"));
                let (a, b) = (dofs_digest(&hub.dofs), tree_digest(&served));
                assert!(a == b, "{what}: {}", digest_diff(&a, &b, 20).join("\n"));
            }
        }
    });
    let cut = outcomes.iter().filter(|o| o.ends_with("ESHUTDOWN")).count();
    eprintln!(
        "faults: {} cuts, {cut} interrupted:\n  {}",
        outcomes.len(),
        outcomes.join("\n  ")
    );
    assert!(
        cut >= outcomes.len() / 2,
        "most cut points must interrupt the exchange"
    );
    drop(daemon);
    drop(tmp);
}

// --- the store's IO seam (runs where nothing can be mounted) -----------------

/// Both points in one test: they are process-wide.
#[test]
fn failpoints_in_apply_give_eio_leave_nothing_torn_and_a_retry_converges() {
    use wsd::store::failpoint;
    let tmp = tempfile::tempdir().unwrap();
    let served = tmp.path().join("served");
    let daemon = wsd_tests::hub::InProcessDaemon::start(&served, &tmp.path().join("state"));
    let served = served.canonicalize().unwrap();
    let mut hub = Hub::open(&tmp.path().join("authority.dofs"), &daemon.addr);
    block_on_local(async {
        hub.put("a/first.txt", b"first", 0o644);
        hub.converge().await.unwrap();

        // The rename into place fails as on a full disk.
        hub.put("a/first.txt", b"first, rewritten", 0o644);
        hub.put("b/new.bin", &bytes(300_000, 1), 0o600);
        failpoint::set("apply-before-rename", Some(libc::ENOSPC));
        let err = hub.push().await.unwrap_err();
        failpoint::set("apply-before-rename", None);
        assert_eq!(err.code(), ErrorCode::Io, "{err}");
        assert!(err.to_string().contains("No space left"), "{err}");
        assert_nothing_torn(&served, &hub, &HashSet::new(), "rename fails");
        assert_eq!(std::fs::read(served.join("a/first.txt")).unwrap(), b"first");
        let pulled = hub.pull().await.unwrap();
        assert_eq!(
            pulled.entries, 0,
            "the failed apply left unrecorded changes"
        );
        hub.converge().await.unwrap();
        assert_eq!(dofs_digest(&hub.dofs), tree_digest(&served));

        // Every entry is on disk, the index commit fails: the next settle
        // finds them as local changes, whose echoes are idempotent.
        hub.put("c/late.txt", b"late", 0o644);
        hub.put("a/first.txt", b"first, third", 0o644);
        failpoint::set("apply-before-commit", Some(libc::EIO));
        let err = hub.push().await.unwrap_err();
        failpoint::set("apply-before-commit", None);
        assert_eq!(err.code(), ErrorCode::Io, "{err}");
        assert_nothing_torn(&served, &hub, &HashSet::new(), "commit fails");
        hub.converge().await.unwrap();
        let (a, b) = (dofs_digest(&hub.dofs), tree_digest(&served));
        assert!(a == b, "{}", digest_diff(&a, &b, 20).join("\n"));
        hub.dofs.check_integrity().unwrap();
    });
    drop(daemon);
}
