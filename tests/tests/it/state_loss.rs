//! Recovery after one side loses its sync state (issue 10 item 2): a real
//! `wsd serve` child and the `wsd` CLI. Whatever was exchanged before the
//! loss, the next transfer must leave both trees equal, not exit 0 with the
//! two sides silently different.

use std::path::Path;

use wsd_tests::{Env, digest_diff, make_tree, tree_digest, write};

fn assert_same(a: &Path, b: &Path) {
    let (da, db) = (tree_digest(a), tree_digest(b));
    assert!(
        da == db,
        "trees differ:\n  {}",
        digest_diff(&da, &db, 20).join("\n  ")
    );
}

/// Push a tree, let a command on the daemon write `made/x`, pull it back:
/// afterwards the client holds files it pushed and a file it pulled.
fn exchange(e: &Env) {
    make_tree(&e.local, 40, 7);
    e.daemon.transfer("push", &e.local);
    // `--remote` through the environment, so it does not land after `--`.
    let out = std::process::Command::new(wsd_tests::wsd_bin())
        .args(["exec", "--", "mkdir -p made && echo made-remotely > made/x"])
        .env("WSD_REMOTE", &e.daemon.addr)
        .env_remove("WSD_TOKEN_FILE")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "exec failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    e.daemon.transfer("pull", &e.local);
    assert_same(&e.local, &e.served);
    assert!(e.local.join("made/x").is_file());
}

#[test]
fn a_push_after_the_daemon_lost_its_root_and_state_restores_every_file_including_pulled_ones() {
    let mut e = Env::start();
    exchange(&e);
    e.daemon.stop();
    std::fs::remove_dir_all(&e.served).unwrap();
    std::fs::remove_dir_all(&e.state).unwrap();
    std::fs::create_dir_all(&e.served).unwrap();
    e.daemon.restart();
    e.daemon.transfer("push", &e.local);
    assert_same(&e.local, &e.served);
    assert!(e.served.join("made/x").is_file(), "the pulled file is back");
}

#[test]
fn a_pull_after_the_client_lost_its_index_restores_what_the_daemon_holds() {
    let e = Env::start();
    exchange(&e);
    // The client's index is gone (its peer name survives) and so are files
    // it had pushed and pulled; the daemon still holds them all.
    std::fs::remove_file(e.local.join(".wsd/index.sqlite3")).unwrap();
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(e.local.join(format!(".wsd/index.sqlite3{suffix}")));
    }
    std::fs::remove_dir_all(e.local.join("made")).unwrap();
    let victim = e.local.join("big/blob.bin");
    std::fs::remove_file(&victim).unwrap();
    write(&e.local, "only-local", b"kept", 0o644);
    e.daemon.transfer("pull", &e.local);
    assert!(e.local.join("made/x").is_file(), "the pulled file is back");
    assert!(victim.is_file(), "big/blob.bin (pushed earlier) is back");
    // The new local file is the client's own change: the next push sends
    // it, and then both sides are equal.
    e.daemon.transfer("push", &e.local);
    assert_same(&e.local, &e.served);
}
