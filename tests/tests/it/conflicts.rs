//! What a transfer must never lose: paths either side excludes survive the
//! other side's baseline sweep, and a pull that would replace or delete a
//! local edit keeps the local version as a conflict copy. Real `wsd serve`
//! and `wsd` CLI processes on loopback, real directories.

use std::path::Path;
use std::process::Output;

use wsd_tests::{Env, write};

/// `wsd VERB LOCAL ARGS… --json`, asserting success: the JSON summary
/// (the last stdout line) and stderr.
fn transfer(e: &Env, verb: &str, args: &[&str]) -> (serde_json::Value, String) {
    let mut all = vec![verb, e.local.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let out: Output = e.daemon.cli(&all);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "wsd {verb} failed: {err}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let json = serde_json::from_str(stdout.lines().last().expect("a JSON summary")).unwrap();
    (json, err)
}

/// Overwrites the pages after the first with garbage, so the next open
/// sets the index aside and rebuilds it (and its peers take a baseline).
fn damage_index(path: &Path) {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(&[0xA5; 8192]).unwrap();
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Names in `dir` that start with `prefix`, sorted.
fn named(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|d| d.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

const EXCLUDES: [&str; 4] = ["--exclude", "build/", "--exclude", "*.log"];

#[test]
fn a_baseline_push_leaves_the_daemons_excluded_paths_alone() {
    let e = Env::start();
    write(&e.local, "main.rs", b"fn main() {}", 0o644);
    transfer(&e, "push", &EXCLUDES);
    write(&e.served, "build/out.o", b"object", 0o644);
    write(&e.served, "logs/run.log", b"log line", 0o644);
    write(&e.served, "stale.txt", b"only on the daemon", 0o644);

    // A rebuilt local index pushes a baseline, whose sweep deletes what
    // the CLI did not list.
    damage_index(&e.local.join(".wsd/index.sqlite3"));
    let (summary, _) = transfer(&e, "push", &EXCLUDES);
    assert_eq!(summary["rebaselined"], true, "{summary}");
    assert!(!e.served.join("stale.txt").exists(), "the sweep ran");
    assert_eq!(read(&e.served.join("main.rs")), "fn main() {}");
    assert_eq!(read(&e.served.join("build/out.o")), "object");
    assert_eq!(read(&e.served.join("logs/run.log")), "log line");

    // Nor does a pull bring them, or take them away.
    transfer(&e, "pull", &EXCLUDES);
    assert!(!e.local.join("build").exists());
    assert!(!e.local.join("logs/run.log").exists());
    assert_eq!(read(&e.served.join("build/out.o")), "object");
}

#[test]
fn deleting_a_directory_leaves_the_excluded_paths_the_other_side_holds_below_it() {
    let e = Env::start();
    write(&e.local, "sub/a.txt", b"a", 0o644);
    write(&e.local, "sub/deep/b.txt", b"b", 0o644);
    transfer(&e, "push", &EXCLUDES);
    write(&e.served, "sub/run.log", b"daemon log", 0o644);
    write(&e.served, "sub/deep/build/out.o", b"object", 0o644);

    std::fs::remove_dir_all(e.local.join("sub")).unwrap();
    transfer(&e, "push", &EXCLUDES);
    assert!(!e.served.join("sub/a.txt").exists());
    assert!(!e.served.join("sub/deep/b.txt").exists());
    assert_eq!(read(&e.served.join("sub/run.log")), "daemon log");
    assert_eq!(read(&e.served.join("sub/deep/build/out.o")), "object");
}

#[test]
fn a_baseline_pull_leaves_local_excluded_paths_alone() {
    let mut e = Env::start();
    write(&e.served, "a.txt", b"a", 0o644);
    transfer(&e, "pull", &EXCLUDES);
    write(&e.served, "b.txt", b"b", 0o644);
    transfer(&e, "pull", &EXCLUDES);
    assert_eq!(read(&e.local.join("b.txt")), "b");
    write(&e.local, "debug.log", b"local only", 0o644);
    write(&e.local, "build/cache.bin", b"local build", 0o644);

    // The daemon loses its index (and b.txt while it is down): its rebuilt
    // log is shorter than our fetch cursor, so the pull is a baseline.
    assert!(e.daemon.stop().success());
    damage_index(&e.daemon.state.join("index.sqlite3"));
    std::fs::remove_file(e.served.join("b.txt")).unwrap();
    e.daemon.restart();
    let (summary, _) = transfer(&e, "pull", &EXCLUDES);
    assert_eq!(summary["rebaselined"], true, "{summary}");
    assert!(!e.local.join("b.txt").exists(), "the sweep ran");
    assert_eq!(read(&e.local.join("a.txt")), "a");
    assert_eq!(read(&e.local.join("debug.log")), "local only");
    assert_eq!(read(&e.local.join("build/cache.bin")), "local build");
}

#[test]
fn a_pull_keeps_a_local_edit_it_replaces_or_deletes_as_a_conflict_copy() {
    let e = Env::start();
    write(&e.local, "edited.txt", b"base", 0o644);
    write(&e.local, "untouched.txt", b"base", 0o644);
    write(&e.local, "dir/removed.txt", b"base", 0o644);
    transfer(&e, "push", &[]);

    write(&e.local, "edited.txt", b"local edit", 0o644);
    write(
        &e.local,
        "dir/removed.txt",
        b"local edit of a removed file",
        0o644,
    );
    write(&e.served, "edited.txt", b"remote edit, longer", 0o644);
    write(&e.served, "untouched.txt", b"remote only edit", 0o644);
    std::fs::remove_file(e.served.join("dir/removed.txt")).unwrap();

    let (summary, err) = transfer(&e, "pull", &[]);
    assert_eq!(read(&e.local.join("edited.txt")), "remote edit, longer");
    assert_eq!(read(&e.local.join("untouched.txt")), "remote only edit");
    assert!(!e.local.join("dir/removed.txt").exists());
    let edited = named(&e.local, "edited.txt.wsd-conflict-");
    assert_eq!(edited.len(), 1, "{edited:?}");
    assert_eq!(read(&e.local.join(&edited[0])), "local edit");
    let removed = named(&e.local.join("dir"), "removed.txt.wsd-conflict-");
    assert_eq!(removed.len(), 1, "{removed:?}");
    assert_eq!(
        read(&e.local.join("dir").join(&removed[0])),
        "local edit of a removed file"
    );
    assert!(
        named(&e.local, "untouched.txt.").is_empty(),
        "an unmodified file is simply replaced"
    );

    let mut listed: Vec<(String, String)> = summary["conflicts"]
        .as_array()
        .unwrap_or_else(|| panic!("no conflicts in {summary}"))
        .iter()
        .map(|c| {
            (
                c["path"].as_str().unwrap().to_owned(),
                c["copy"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            ("dir/removed.txt".to_owned(), format!("dir/{}", removed[0])),
            ("edited.txt".to_owned(), edited[0].clone()),
        ]
    );
    assert!(err.contains("conflict: edited.txt"), "{err}");

    // The copies stay on this side.
    transfer(&e, "push", &[]);
    assert!(named(&e.served, "edited.txt.wsd-conflict-").is_empty());
    assert_eq!(read(&e.served.join("edited.txt")), "remote edit, longer");
}

#[test]
fn sync_reports_a_conflict_and_a_second_one_gets_its_own_copy() {
    let e = Env::start();
    write(&e.local, "f.txt", b"base", 0o644);
    transfer(&e, "sync", &[]);
    for round in 1..=2 {
        write(
            &e.local,
            "f.txt",
            format!("local {round}").as_bytes(),
            0o644,
        );
        write(
            &e.served,
            "f.txt",
            format!("remote edit {round}").as_bytes(),
            0o644,
        );
        let out = e.daemon.cli(&["sync", e.local.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("pull: conflict: f.txt"), "{err}");
        assert_eq!(read(&e.local.join("f.txt")), format!("remote edit {round}"));
        assert_eq!(
            read(&e.served.join("f.txt")),
            format!("remote edit {round}")
        );
        let copies = named(&e.local, "f.txt.wsd-conflict-");
        assert_eq!(copies.len(), round, "{copies:?}");
        let kept: Vec<String> = copies.iter().map(|c| read(&e.local.join(c))).collect();
        assert!(kept.contains(&format!("local {round}")), "{kept:?}");
    }
}
