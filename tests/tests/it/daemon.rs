//! The daemon end to end: a real `wsd serve` on loopback, the `wsd` CLI,
//! real directories compared byte for byte (content, modes, symlinks).

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wsd_tests::{Daemon, Env, bytes, make_tree, run_bounded, tree_digest, write, wsd_bin};

fn n(v: &serde_json::Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

#[test]
fn push_into_an_empty_workspace_leaves_an_identical_tree() {
    let e = Env::start();
    make_tree(&e.local, 300, 1);
    let summary = e.daemon.transfer("push", &e.local);
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
    assert!(n(&summary, "entries") > 300, "{summary}");
    assert!(n(&summary, "bytes_sent") > 900_000, "{summary}");
}

#[test]
fn an_incremental_push_sends_only_the_changed_chunks() {
    let e = Env::start();
    make_tree(&e.local, 50, 2);
    let mut big = bytes(8 * 1024 * 1024, 9);
    write(&e.local, "big/eight.bin", &big, 0o644);
    e.daemon.transfer("push", &e.local);
    big.splice(
        4_000_000..4_000_000,
        b"a hundred bytes inserted mid-file".iter().copied(),
    );
    write(&e.local, "big/eight.bin", &big, 0o644);
    write(&e.local, "d0/e0/f0.txt", b"rewritten", 0o644);
    let summary = e.daemon.transfer("push", &e.local);
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
    let sent = n(&summary, "bytes_sent");
    assert!(
        sent > 0 && sent <= 2 * 256 * 1024 + 9,
        "an insert cost {sent} bytes: {summary}"
    );
    assert!(
        n(&summary, "bytes_deduplicated") > 7 * 1024 * 1024,
        "{summary}"
    );
}

#[test]
fn changes_made_in_the_served_directory_are_pulled_back() {
    let e = Env::start();
    make_tree(&e.local, 40, 3);
    e.daemon.transfer("push", &e.local);
    write(
        &e.served,
        "made/by/command.txt",
        b"hello from the container",
        0o640,
    );
    std::fs::remove_file(e.served.join("d1/e1/f1.txt")).unwrap();
    std::fs::set_permissions(
        e.served.join("d2/e2/f2.txt"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    std::fs::remove_dir_all(e.served.join("d3")).unwrap();
    symlink("made", e.served.join("made-link")).unwrap();
    let summary = e.daemon.transfer("pull", &e.local);
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
    assert!(n(&summary, "entries") >= 5, "{summary}");
}

#[test]
fn a_no_op_push_or_pull_transfers_no_objects_and_nothing_echoes_back() {
    let e = Env::start();
    make_tree(&e.local, 60, 4);
    e.daemon.transfer("push", &e.local);
    let again = e.daemon.transfer("push", &e.local);
    assert_eq!(
        (n(&again, "entries"), n(&again, "objects")),
        (0, 0),
        "{again}"
    );
    // What we pushed is not streamed back to us.
    let pulled = e.daemon.transfer("pull", &e.local);
    assert_eq!(
        (n(&pulled, "entries"), n(&pulled, "objects")),
        (0, 0),
        "{pulled}"
    );
    let after = e.daemon.transfer("push", &e.local);
    assert_eq!(n(&after, "entries"), 0, "{after}");
}

#[test]
fn two_directories_converge_through_one_daemon() {
    let e = Env::start();
    let other = e.tmp.path().join("other");
    make_tree(&e.local, 80, 5);
    e.daemon.transfer("push", &e.local);
    e.daemon.transfer("pull", &other);
    assert_eq!(tree_digest(&e.local), tree_digest(&other));
    write(&other, "from-other.txt", b"second laptop", 0o644);
    std::fs::remove_file(other.join("d4/e1/f4.txt")).unwrap();
    e.daemon.transfer("push", &other);
    e.daemon.transfer("pull", &e.local);
    assert_eq!(tree_digest(&e.local), tree_digest(&other));
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
}

#[test]
fn a_wrong_or_missing_token_is_refused_with_eauth() {
    let tmp = tempfile::tempdir().unwrap();
    let token = tmp.path().join("token");
    std::fs::write(&token, "correct horse battery staple").unwrap();
    let daemon = Daemon::start(
        &tmp.path().join("served"),
        &tmp.path().join("state"),
        Some(&token),
    );
    let local = tmp.path().join("local");
    make_tree(&local, 5, 6);
    daemon.transfer("push", &local);

    let wrong = tmp.path().join("wrong");
    std::fs::write(&wrong, "incorrect").unwrap();
    let out = std::process::Command::new(wsd_tests::wsd_bin())
        .args([
            "push",
            local.to_str().unwrap(),
            "--remote",
            &daemon.addr,
            "--token-file",
        ])
        .arg(&wrong)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("EAUTH"),
        "{out:?}"
    );

    let out = std::process::Command::new(wsd_tests::wsd_bin())
        .env("WSD_AGENT", "off")
        .args(["push", local.to_str().unwrap(), "--remote", &daemon.addr])
        .env_remove("WSD_TOKEN_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("EAUTH"),
        "{out:?}"
    );
}

#[test]
fn a_symlink_in_the_workspace_pointing_outside_is_never_written_through() {
    let e = Env::start();
    let outside = e.tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    make_tree(&e.local, 5, 7);
    e.daemon.transfer("push", &e.local);
    // A command in the workspace plants a symlink to a directory outside it...
    symlink(&outside, e.served.join("escape")).unwrap();
    // ...while the local side creates a real directory of that name.
    write(&e.local, "escape/pwned", b"must not land outside", 0o644);
    let out = e.daemon.cli(&["push", e.local.to_str().unwrap()]);
    assert!(
        !outside.join("pwned").exists(),
        "wrote through a symlink: {out:?}"
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}

#[test]
fn a_push_cut_by_a_daemon_crash_resumes_and_converges() {
    let mut e = Env::start();
    make_tree(&e.local, 400, 8);
    for i in 0..6 {
        write(
            &e.local,
            &format!("blobs/b{i}.bin"),
            &bytes(3 * 1024 * 1024, 100 + i),
            0o644,
        );
    }
    let child = std::process::Command::new(wsd_tests::wsd_bin())
        .env("WSD_AGENT", "off")
        .args([
            "push",
            e.local.to_str().unwrap(),
            "--remote",
            &e.daemon.addr,
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wherever the crash lands (before, during or after the push), a retry
    // against the restarted daemon must converge.
    std::thread::sleep(std::time::Duration::from_millis(150));
    e.daemon.kill9();
    let _ = child.wait_with_output();
    e.daemon.restart();
    e.daemon.transfer("push", &e.local);
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
    let temp_files: Vec<_> = walk_names(&e.served)
        .into_iter()
        .filter(|n| n.starts_with(".wsd-apply-"))
        .collect();
    assert!(temp_files.is_empty(), "temp files left: {temp_files:?}");
}

fn walk_names(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        out.push(entry.file_name().to_string_lossy().into_owned());
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk_names(&entry.path()));
        }
    }
    out
}

#[test]
fn a_restarted_daemon_keeps_its_state() {
    let mut e = Env::start();
    make_tree(&e.local, 100, 9);
    e.daemon.transfer("push", &e.local);
    let status = e.daemon.stop();
    assert!(status.success(), "graceful stop exited with {status}");
    e.daemon.restart();
    let again = e.daemon.transfer("push", &e.local);
    assert_eq!(n(&again, "entries"), 0, "{again}");
    assert_eq!(again["rebaselined"], false, "{again}");

    e.daemon.kill9();
    write(
        &e.served,
        "written-while-down.txt",
        b"the stat walk finds me",
        0o644,
    );
    e.daemon.restart();
    let pulled = e.daemon.transfer("pull", &e.local);
    assert_eq!(n(&pulled, "entries"), 1, "{pulled}");
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
}

#[test]
fn two_hundred_idle_connections_do_not_stop_a_push() {
    let e = Env::start();
    let idle: Vec<_> = (0..200)
        .map(|_| std::net::TcpStream::connect(&e.daemon.addr).unwrap())
        .collect();
    make_tree(&e.local, 30, 11);
    // Bounded: before the handshake deadline and the separate cap on
    // unauthenticated peers, this push waited forever behind the idle ones.
    let out = run_bounded(
        Command::new(wsd_bin()).env("WSD_AGENT", "off").args([
            "push",
            e.local.to_str().unwrap(),
            "--remote",
            &e.daemon.addr,
        ]),
        None,
        LIMIT,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
    drop(idle);
}

/// Bounds each `wsd` run below: a daemon that should refuse to start but
/// serves instead fails the test rather than hanging it.
const LIMIT: Duration = Duration::from_secs(60);

fn serve_cmd(root: &Path, state: &Path, listen: &str) -> Command {
    let mut cmd = Command::new(wsd_bin());
    cmd.args(["serve", "--listen", listen])
        .arg("--root")
        .arg(root)
        .arg("--state")
        .arg(state)
        .env_remove("WSD_TOKEN")
        .env_remove("WSD_TOKEN_FILE");
    cmd
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_second_daemon_on_the_same_root_or_state_refuses_to_start_and_creates_no_database() {
    let e = Env::start();
    let other_state = e.tmp.path().join("other-state");
    let out = run_bounded(
        &mut serve_cmd(&e.served, &other_state, "127.0.0.1:0"),
        None,
        LIMIT,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already running"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(e.served.to_str().unwrap()),
        "{}",
        stderr(&out)
    );
    assert!(!other_state.join("exec.sqlite3").exists());
    assert!(!other_state.join("index.sqlite3").exists());

    let other_root = e.tmp.path().join("other-root");
    std::fs::create_dir(&other_root).unwrap();
    let out = run_bounded(
        &mut serve_cmd(&other_root, &e.daemon.state, "127.0.0.1:0"),
        None,
        LIMIT,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already running"), "{}", stderr(&out));
    // The first daemon is unharmed.
    make_tree(&e.local, 5, 4);
    e.daemon.transfer("push", &e.local);
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
}

#[test]
fn a_daemon_that_cannot_bind_creates_no_database() {
    let tmp = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let state = tmp.path().join("state");
    let out = run_bounded(
        &mut serve_cmd(&tmp.path().join("root"), &state, &addr),
        None,
        LIMIT,
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains(&addr), "{}", stderr(&out));
    assert!(!state.join("exec.sqlite3").exists());
    assert!(!state.join("index.sqlite3").exists());
}

/// A child process killed (SIGKILL) and reaped when dropped, so a failing
/// assertion does not leak a daemon.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `wsd serve` on a unix socket and waits until the socket answers.
fn serve_unix(root: &Path, state: &Path, sock: &Path) -> KillOnDrop {
    let mut child = serve_cmd(root, state, &format!("unix:{}", sock.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    while std::os::unix::net::UnixStream::connect(sock).is_err() {
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wsd serve did not listen on {sock:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    KillOnDrop(child)
}

fn exec_echo(sock: &Path) -> std::process::Output {
    run_bounded(
        Command::new(wsd_bin()).args([
            "exec",
            "--remote",
            &format!("unix:{}", sock.display()),
            "--",
            "echo",
            "alive",
        ]),
        None,
        LIMIT,
    )
}

#[test]
fn a_live_unix_socket_is_never_taken_over_and_a_stale_one_is_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("wsd.sock");
    let first = serve_unix(&tmp.path().join("r1"), &tmp.path().join("s1"), &sock);

    let out = run_bounded(
        &mut serve_cmd(
            &tmp.path().join("r2"),
            &tmp.path().join("s2"),
            &format!("unix:{}", sock.display()),
        ),
        None,
        LIMIT,
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("already listening"),
        "{}",
        stderr(&out)
    );
    let out = exec_echo(&sock);
    assert!(
        out.status.success(),
        "the first daemon lost its socket: {}",
        stderr(&out)
    );
    assert_eq!(out.stdout, b"alive\n");

    // A crash leaves the socket file behind with nobody listening.
    drop(first);
    assert!(sock.exists());
    let _second = serve_unix(&tmp.path().join("r2"), &tmp.path().join("s2"), &sock);
    assert!(exec_echo(&sock).status.success());
}

#[test]
fn a_clean_stop_leaves_no_wal_or_shm_files() {
    let mut e = Env::start();
    make_tree(&e.local, 10, 5);
    e.daemon.transfer("push", &e.local);
    let out = run_bounded(
        Command::new(wsd_bin()).args(["exec", "--remote", &e.daemon.addr, "--", "echo", "hi"]),
        None,
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(e.daemon.stop().success());
    let leftovers: Vec<_> = std::fs::read_dir(&e.daemon.state)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with("-wal") || n.ends_with("-shm"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Overwrites the pages after the first with garbage: the header still says
/// SQLite, the b-trees do not ("database disk image is malformed").
fn damage_pages(path: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(&[0xA5; 8192]).unwrap();
}

/// The set-aside databases named `name.corrupt-<time>` (their `-wal` and
/// `-shm`, moved with them, are not counted).
fn set_aside_files(dir: &Path, name: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("{name}.corrupt-")))
        .filter(|n| !n.ends_with("-wal") && !n.ends_with("-shm"))
        .collect()
}

#[test]
fn a_damaged_local_index_is_set_aside_named_and_rebuilt_and_the_push_converges() {
    let e = Env::start();
    make_tree(&e.local, 40, 21);
    e.daemon.transfer("push", &e.local);
    let index = e.local.join(".wsd/index.sqlite3");
    damage_pages(&index);
    write(&e.local, "after/damage.txt", b"new after the damage", 0o644);
    std::fs::remove_file(e.local.join("d0/e0/f0.txt")).unwrap();
    let out = run_bounded(
        Command::new(wsd_bin()).env("WSD_AGENT", "off").args([
            "push",
            e.local.to_str().unwrap(),
            "--remote",
            &e.daemon.addr,
        ]),
        None,
        LIMIT,
    );
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let aside = set_aside_files(&e.local.join(".wsd"), "index.sqlite3");
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(err.contains(&aside[0]) && err.contains("damaged"), "{err}");
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
    wsd_tests::sqlite_integrity(&index).unwrap();
}

#[test]
fn a_daemon_with_a_damaged_index_and_exec_log_sets_both_aside_and_serves() {
    let mut e = Env::start();
    make_tree(&e.local, 40, 22);
    e.daemon.transfer("push", &e.local);
    let out = run_bounded(
        Command::new(wsd_bin()).args(["exec", "--remote", &e.daemon.addr, "--", "echo", "before"]),
        None,
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(e.daemon.stop().success());
    let state = e.daemon.state.clone();
    damage_pages(&state.join("index.sqlite3"));
    std::fs::write(state.join("exec.sqlite3"), b"this is not a database").unwrap();

    e.daemon.restart();
    write(&e.local, "after/damage.txt", b"new after the damage", 0o644);
    e.daemon.transfer("push", &e.local);
    assert_eq!(tree_digest(&e.local), tree_digest(&e.served));
    let out = run_bounded(
        Command::new(wsd_bin()).args(["exec", "--remote", &e.daemon.addr, "--", "echo", "after"]),
        None,
        LIMIT,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(out.stdout, b"after\n");
    assert_eq!(set_aside_files(&state, "index.sqlite3").len(), 1);
    assert_eq!(set_aside_files(&state, "exec.sqlite3").len(), 1);
    // Pulling into a fresh directory gives the same tree back: the rebuilt
    // index knows every file.
    let fresh = e.tmp.path().join("fresh");
    std::fs::create_dir(&fresh).unwrap();
    e.daemon.transfer("pull", &fresh);
    assert_eq!(tree_digest(&fresh), tree_digest(&e.served));
}

#[test]
fn a_silent_peer_is_disconnected_after_the_configured_handshake_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let sock = tmp.path().join("wsd.sock");
    let mut cmd = serve_cmd(
        &tmp.path().join("root"),
        &tmp.path().join("state"),
        &format!("unix:{}", sock.display()),
    );
    cmd.args(["--handshake-timeout", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + LIMIT;
    let mut silent = loop {
        if let Ok(s) = std::os::unix::net::UnixStream::connect(&sock) {
            break s;
        }
        if child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("wsd serve did not listen on {sock:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let _daemon = KillOnDrop(child);
    // Bounded by LIMIT; the daemon closes its end well before.
    silent.set_read_timeout(Some(LIMIT)).unwrap();
    use std::io::Read;
    let n = silent
        .read(&mut [0u8; 16])
        .expect("the daemon closes a silent connection instead of leaving it open");
    assert_eq!(n, 0);
}
