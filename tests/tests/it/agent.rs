//! A running `wsd sync --watch` serves one-shot pushes of its directory
//! (`wsd/src/cli/agent.rs`): the push returns only once what was written
//! before it is on the daemon, and a push the agent would not make the
//! same way (other excludes), or with no agent left, walks by itself.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wsd_tests::{Env, bytes, digest_diff, make_tree, tree_digest, write, wsd_bin};

/// The `sync --watch` child; killed when dropped.
struct Watching(Child);

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn watch(e: &Env) -> Watching {
    let child = Command::new(wsd_bin())
        .arg("sync")
        .arg(&e.local)
        .args(["--watch", "-q", "--remote", &e.daemon.addr])
        .env_remove("WSD_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = e.local.join(".wsd/agent.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "no agent socket at {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Watching(child)
}

fn assert_same(a: &Path, b: &Path, what: &str) {
    let (da, db) = (tree_digest(a), tree_digest(b));
    assert!(
        da == db,
        "{what}: trees differ:\n  {}",
        digest_diff(&da, &db, 20).join("\n  ")
    );
}

#[test]
fn a_push_while_sync_watch_runs_is_made_by_it_and_falls_back_to_a_walk_without_it() {
    let e = Env::start();
    make_tree(&e.local, 30, 2);
    e.daemon.transfer("push", &e.local);
    let agent = watch(&e);

    for round in 0..5u64 {
        write(
            &e.local,
            &format!("new/r{round}.txt"),
            &bytes(2000, round),
            0o644,
        );
        std::fs::write(e.local.join("d1/e1/f1.txt"), bytes(300, 50 + round)).unwrap();
        let summary = e.daemon.transfer("push", &e.local);
        assert_eq!(summary["agent"], true, "round {round}: {summary}");
        // Returned: what was written before the push is on the daemon.
        assert_same(&e.local, &e.served, &format!("round {round}"));
    }
    let noop = e.daemon.transfer("push", &e.local);
    assert_eq!(
        (noop["agent"].clone(), noop["entries"].clone()),
        (true.into(), 0.into())
    );

    // Excludes the agent did not start with: the push walks by itself.
    write(&e.local, ".wsdignore", b"*.tmp\n", 0o644);
    let refused = e.daemon.transfer("push", &e.local);
    assert!(refused.get("agent").is_none(), "{refused}");

    // A killed agent leaves its socket; nobody answers, the push walks.
    drop(agent);
    assert!(e.local.join(".wsd/agent.sock").exists());
    write(&e.local, "after/x.txt", b"after the agent", 0o600);
    let walked = e.daemon.transfer("push", &e.local);
    assert!(walked.get("agent").is_none(), "{walked}");
    assert_eq!(
        std::fs::read(e.served.join("after/x.txt")).unwrap(),
        b"after the agent"
    );
}
