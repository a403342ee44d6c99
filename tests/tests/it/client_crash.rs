//! The CLI's index is not durable (`StoreOptions::durable_index` off: no
//! `fsync`, checkpoints included). What that may lose must only make the
//! next transfer resend, never leave the two sides different:
//!
//! - `kill -9` of a real `wsd push` at random points (seeded, printed; the
//!   delay is drawn from `[0, 1.2 × t]`, `t` a push of the same size timed
//!   uninterrupted first, so kills land during the settle, between batches
//!   and between an acknowledged push and its cursor's commit), then more
//!   local edits and a push that must leave both trees equal;
//! - a lost tail, as an OS crash would leave it: the state directory put
//!   back as it was one or more transfers ago (under another boot id),
//!   then local writes and a push or a sync that must converge, with no
//!   conflict copy made of what this side wrote. The writes after the
//!   crash add and rewrite files but remove none: a path first pushed in
//!   the lost tail and removed before the next push is unknown to the
//!   older index, so nothing tells the remote to delete it (the limit
//!   `wsd/src/store/DESIGN.md` states; it holds for a `synchronous=NORMAL`
//!   index too, whose unsynced WAL tail an OS crash also loses);
//! - a torn index (pages from two moments) found by the check after a
//!   reboot: set aside, rebuilt under a new peer name, and converged;
//! - `kill -9` during the first push of a never-indexed tree, which builds
//!   its index in pieces while it sends them: the next push converges.
//!
//! Iterations: 4 rounds of kills, 12 with `WSD_SLOW_TESTS=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tempfile::TempDir;
use wsd_tests::{Daemon, bytes, digest_diff, find_named, make_tree, tree_digest, write, wsd_bin};

fn rounds() -> usize {
    if std::env::var_os("WSD_SLOW_TESTS").is_some_and(|v| v == "1") {
        12
    } else {
        4
    }
}

/// A local tree with its CLI state beside it (not inside, so restoring an
/// old copy of the state never touches the tree) and a daemon.
struct Client {
    tmp: TempDir,
    local: PathBuf,
    state: PathBuf,
    served: PathBuf,
    daemon: Daemon,
    rng: StdRng,
}

impl Client {
    fn start(seed: u64) -> Client {
        let tmp = tempfile::tempdir().unwrap();
        let local = tmp.path().join("local");
        let state = tmp.path().join("local-state");
        let served = tmp.path().join("served");
        std::fs::create_dir_all(&local).unwrap();
        std::fs::create_dir_all(&served).unwrap();
        let daemon = Daemon::start(&served, &tmp.path().join("served-state"), None);
        eprintln!("client crash: seed {seed}");
        Client {
            tmp,
            local,
            state,
            served,
            daemon,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    fn command(&self, verb: &str) -> Command {
        let mut cmd = Command::new(wsd_bin());
        cmd.arg(verb)
            .arg(&self.local)
            .arg("--state")
            .arg(&self.state)
            .args(["--remote", &self.daemon.addr, "--json"])
            .env_remove("WSD_TOKEN_FILE")
            .env("WSD_AGENT", "off")
            .stdin(Stdio::null());
        cmd
    }

    fn run(&self, verb: &str) -> Output {
        let out = self.command(verb).output().unwrap();
        assert!(
            out.status.success(),
            "wsd {verb} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Starts `wsd push` and SIGKILLs it after `delay` (if still running).
    /// Returns whether the kill landed before it finished.
    fn push_killed_after(&self, delay: Duration) -> bool {
        let mut child = self
            .command("push")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let killed = child.try_wait().unwrap().is_none();
        let _ = child.kill();
        let _ = child.wait();
        killed
    }

    /// One round of edits a developer's command makes: rewrites, appends,
    /// new files, deletes, a chmod, a directory renamed, a big file edited
    /// in the middle.
    fn edit(&mut self, round: usize) {
        let files = files_under(&self.local);
        for _ in 0..8 {
            let f = &files[self.rng.random_range(0..files.len())];
            let len = self.rng.random_range(0..6000);
            let seed = self.rng.random();
            if f.exists() {
                std::fs::write(f, bytes(len, seed)).unwrap();
            }
        }
        for i in 0..6 {
            let dir = format!("new{}/r{round}", self.rng.random_range(0..3));
            let data = bytes(self.rng.random_range(0..4000), self.rng.random());
            write(&self.local, &format!("{dir}/n{i}.txt"), &data, 0o644);
        }
        for _ in 0..3 {
            let f = &files[self.rng.random_range(0..files.len())];
            let _ = std::fs::remove_file(f);
        }
        let f = &files[self.rng.random_range(0..files.len())];
        if f.exists() {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let from = self.local.join(format!("d{}", round % 7));
        if from.is_dir() {
            std::fs::rename(&from, self.local.join(format!("moved-{round}"))).unwrap();
        }
        let blob = self.local.join("big/blob.bin");
        if let Ok(mut data) = std::fs::read(&blob) {
            let mid = data.len() / 2 + round;
            data.splice(mid..mid, bytes(100, round as u64));
            std::fs::write(&blob, data).unwrap();
        }
    }

    /// Edits that remove nothing: rewrites, appends and new files.
    fn grow(&mut self, round: usize) {
        let files = files_under(&self.local);
        for _ in 0..8 {
            let f = &files[self.rng.random_range(0..files.len())];
            let len = self.rng.random_range(0..6000);
            std::fs::write(f, bytes(len, self.rng.random())).unwrap();
        }
        for i in 0..6 {
            let data = bytes(self.rng.random_range(0..4000), self.rng.random());
            write(
                &self.local,
                &format!("after/r{round}/a{i}.txt"),
                &data,
                0o644,
            );
        }
    }

    /// Puts back an older copy of the state directory, as the disk holds
    /// it after an OS crash lost the index's later writes: the crash is a
    /// reboot, so the copy names another boot.
    fn lose_tail(&self, old: &Path) {
        copy_dir(old, &self.state);
        std::fs::write(
            self.state.join("index.sqlite3.boot"),
            "a boot before the crash",
        )
        .unwrap();
    }

    fn assert_converged(&self, what: &str) {
        let (l, s) = (tree_digest(&self.local), tree_digest(&self.served));
        assert!(
            l == s,
            "{what}: the trees differ:\n  {}",
            digest_diff(&l, &s, 20).join("\n  ")
        );
        let copies = find_named(&self.local, ".wsd-conflict-");
        assert!(copies.is_empty(), "{what}: conflict copies {copies:?}");
    }

    fn peer(&self) -> String {
        std::fs::read_to_string(self.state.join("peer")).unwrap()
    }
}

fn files_under(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_owned()];
    while let Some(d) = dirs.pop() {
        let mut entries: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                dirs.push(p);
            } else if m.is_file() {
                out.push(p);
            }
        }
    }
    out
}

/// Copies the state directory's files (the CLI is not running).
fn copy_dir(from: &Path, to: &Path) {
    let _ = std::fs::remove_dir_all(to);
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn kill_9_of_the_cli_at_random_points_of_a_push_then_the_next_push_converges() {
    let mut c = Client::start(0xC11E);
    make_tree(&c.local, 300, 5);
    c.run("push");
    c.assert_converged("first push");
    c.edit(0);
    let started = Instant::now();
    c.run("push");
    let calibrated = started.elapsed();
    c.assert_converged("calibration push");
    let mut interrupted = 0;
    for round in 1..=rounds() {
        c.edit(round);
        // Up to three kills in a row: each may leave a later part of the
        // same push undone.
        for kill in 0..3 {
            let delay = calibrated.mul_f64(c.rng.random_range(0.0..1.2));
            let what = format!("round {round}, kill {kill} after {delay:?}");
            if c.push_killed_after(delay) {
                interrupted += 1;
            }
            eprintln!("client crash: {what}");
        }
        if round % 2 == 0 {
            // More edits on top of what the killed pushes left.
            c.edit(round + 100);
        }
        c.run("push");
        c.assert_converged(&format!("round {round}"));
    }
    assert!(interrupted > 0, "no kill landed inside a push");
}

#[test]
fn kill_9_during_the_first_push_of_a_never_indexed_tree_then_the_next_push_converges() {
    // The first push records its index in pieces, each under a rev of its
    // own, while it sends them: a kill leaves some pieces recorded, some
    // of them acknowledged; the next push walks, records the rest, and
    // sends what the remote lacks.
    let calibrated = {
        let c = Client::start(0xF125);
        make_tree(&c.local, 600, 11);
        let started = Instant::now();
        c.run("push");
        c.assert_converged("calibration push");
        started.elapsed()
    };
    let mut interrupted = 0;
    for round in 0..rounds() {
        // A never-indexed tree into an empty workspace, every round.
        let mut c = Client::start(0xF125 + 1 + round as u64);
        make_tree(&c.local, 600, 11 + round as u64);
        let delay = calibrated.mul_f64(c.rng.random_range(0.0..1.2));
        if c.push_killed_after(delay) {
            interrupted += 1;
        }
        eprintln!("client crash: first push, round {round}, killed after {delay:?}");
        if round % 2 == 1 {
            c.grow(round);
        }
        c.run("push");
        c.assert_converged(&format!("round {round}"));
        let again = String::from_utf8(c.run("push").stdout).unwrap();
        assert!(
            again.contains("\"entries\":0,"),
            "round {round}: the index was left incomplete: {again}"
        );
    }
    assert!(interrupted > 0, "no kill landed inside a first push");
}

#[test]
fn a_lost_tail_of_the_client_index_only_makes_the_next_push_resend() {
    let mut c = Client::start(0x7A11);
    make_tree(&c.local, 120, 9);
    c.run("push");
    let old = c.tmp.path().join("state-then");
    for round in 0..rounds() {
        // The index as the disk may hold it after an OS crash: one or two
        // transfers behind the tree.
        copy_dir(&c.state, &old);
        c.edit(round);
        c.run("push");
        if round % 2 == 1 {
            c.edit(round + 100);
            c.run("push");
        }
        c.lose_tail(&old);
        c.grow(round + 200);
        c.run("push");
        c.assert_converged(&format!("round {round}, push after a lost tail"));
    }
}

#[test]
fn a_lost_tail_after_a_pull_resends_without_conflict_copies() {
    let c = Client::start(0x9011);
    make_tree(&c.local, 80, 3);
    c.run("push");
    let old = c.tmp.path().join("state-then");
    for round in 0..rounds() {
        copy_dir(&c.state, &old);
        // A command on the daemon's side writes; the client pulls it.
        write(
            &c.served,
            &format!("remote/r{round}.txt"),
            &bytes(500 + round, round as u64),
            0o644,
        );
        let victim = files_under(&c.served)
            .into_iter()
            .find(|p| p.extension().is_some_and(|e| e == "txt"))
            .unwrap();
        std::fs::write(&victim, bytes(700, 77 + round as u64)).unwrap();
        c.run("sync");
        c.lose_tail(&old);
        // Local writes after the crash, none to what the lost pull wrote.
        write(
            &c.local,
            &format!("mine/r{round}.txt"),
            &bytes(300, 900 + round as u64),
            0o600,
        );
        c.run("sync");
        c.assert_converged(&format!("round {round}, sync after a lost tail"));
    }
}

#[test]
fn a_torn_index_found_after_a_reboot_is_rebuilt_under_a_new_peer_name_and_converges() {
    let mut c = Client::start(0x7042);
    make_tree(&c.local, 60, 4);
    c.run("push");
    let peer = c.peer();
    // Pages from two moments: a cursor ahead of the rev counter, as no
    // consistent state of the file has it, and the session that wrote it
    // on another boot.
    let index = c.state.join("index.sqlite3");
    let db = rusqlite::Connection::open(&index).unwrap();
    db.execute("UPDATE remotes SET push_rev = push_rev + 1000", [])
        .unwrap();
    drop(db);
    std::fs::write(c.state.join("index.sqlite3.boot"), "another-boot").unwrap();
    c.edit(1);
    c.run("push");
    c.assert_converged("push after the rebuild");
    assert_ne!(c.peer(), peer, "the rebuilt index syncs under a new name");
    assert!(
        std::fs::read_dir(&c.state).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains(".corrupt-")),
        "the torn index is kept aside"
    );
    // The same state written under this boot is trusted as it is.
    c.edit(2);
    c.run("push");
    c.assert_converged("next push");
}
