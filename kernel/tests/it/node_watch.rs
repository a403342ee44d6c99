//! `fs.watch` routed to a device: `gsv node` (the real binary, or the
//! driver in this process where the test looks at the node's watches)
//! watches its directory with inotify and the kernel relays its
//! `fs.changed` to the watching socket. Globs, permissions, `fs.unwatch`,
//! the watcher's and the device's disconnects, and what a device cannot
//! do (resume, durable) over the real WebSocket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use gsv_kernel::client::GsvClient;
use gsv_node::driver::{self, DriverConfig};
use gsv_node::{NodeRoot, NodeTools};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::harness::{ALICE_PW, TestKernel, Watcher, err_of, eventually, node_token};
use crate::node::{wait_online, write_private};

/// The real `gsv node` binary serving a temp root as device `node1`.
struct NodeProcess {
    child: tokio::process::Child,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

async fn node_process(k: &TestKernel, alice: &mut GsvClient) -> NodeProcess {
    let token = node_token(alice, "node1").await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let token_file = dir.path().join("token");
    write_private(&token_file, &token);
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gsv"))
        .args(["node", "--kernel", &k.url, "--device-id", "node1"])
        .env_remove("GSV_USER")
        .arg("--token-file")
        .arg(&token_file)
        .arg("--root")
        .arg(&root)
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    wait_online(alice, "node1").await;
    NodeProcess {
        child,
        root: root.canonicalize().unwrap(),
        _dir: dir,
    }
}

/// The node driver in this process, so a test can count its watches.
struct InProcessNode {
    tools: NodeTools,
    root: PathBuf,
    stop: CancellationToken,
    _dir: tempfile::TempDir,
}

impl Drop for InProcessNode {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn node_in_process(k: &TestKernel, alice: &mut GsvClient) -> InProcessNode {
    let dir = tempfile::tempdir().unwrap();
    let token = node_token(alice, "node1").await;
    let tools = NodeTools::new(NodeRoot::new(dir.path()).unwrap());
    let mut config = DriverConfig::new(k.url.clone(), "node1".into(), "alice".into(), token);
    config.min_backoff = Duration::from_millis(20);
    config.max_backoff = Duration::from_millis(200);
    let stop = CancellationToken::new();
    tokio::spawn(driver::run(config, tools.clone(), stop.clone()));
    wait_online(alice, "node1").await;
    InProcessNode {
        tools,
        root: dir.path().canonicalize().unwrap(),
        stop,
        _dir: dir,
    }
}

/// `fs.watch` on node1 (answered `ok:true`, no signal of it before).
async fn watch_node(w: &mut Watcher, args: Value) -> Value {
    let mut args = args;
    args["target"] = json!("node1");
    let d = w.call("fs.watch", args).await;
    assert_eq!(d["ok"], true, "{d}");
    assert!(
        !w.seen
            .iter()
            .any(|s| s["payload"]["watchId"] == d["watchId"]),
        "a signal came before the answer"
    );
    d
}

/// The changes of `watch`'s `fs.changed` signals until one names a path
/// ending in `last`; every change on the way. Other watches' signals are
/// kept for later.
async fn changes_until(w: &mut Watcher, watch: &Value, last: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut others = Vec::new();
    loop {
        let s = w.signal("fs.changed").await;
        if s["watchId"] != *watch {
            others.push(json!({"type": "sig", "signal": "fs.changed", "payload": s}));
            continue;
        }
        assert!(s["cursor"].as_str().unwrap().starts_with("n1."), "{s}");
        let batch = s["changes"].as_array().unwrap().clone();
        let done = batch
            .iter()
            .any(|c| c["path"].as_str().unwrap().ends_with(last));
        out.extend(batch);
        if done {
            for o in others.into_iter().rev() {
                w.seen.push_front(o);
            }
            return out;
        }
    }
}

fn named(changes: &[Value], suffix: &str) -> usize {
    changes
        .iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with(suffix))
        .count()
}

fn write(root: &Path, name: &str, content: &str) {
    std::fs::write(root.join(name), content).unwrap();
}

#[tokio::test]
async fn a_file_written_on_the_node_gives_one_fs_changed_and_a_device_disconnect_ends_the_watch() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let mut node = node_process(&k, &mut alice).await;
    let mut w = Watcher::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = watch_node(&mut w, json!({"path": "."})).await;
    let id = d["watchId"].clone();
    assert!(id.as_str().unwrap().starts_with("w_"), "{d}");
    assert_eq!(d["durable"], false);
    // Written beside the root and moved in, so that the file appears in
    // one step: a write spread over two batching windows (a stalled
    // writer) would rightly be reported twice.
    let staged = node.root.parent().unwrap().join("a.txt");
    std::fs::write(&staged, "hello").unwrap();
    std::fs::rename(&staged, node.root.join("a.txt")).unwrap();
    let ch = changes_until(&mut w, &id, "a.txt").await;
    let a = ch
        .iter()
        .find(|c| c["path"].as_str().unwrap().ends_with("a.txt"))
        .unwrap();
    assert_eq!(a["path"], node.root.join("a.txt").display().to_string());
    assert_eq!((&a["type"], &a["size"]), (&json!("file"), &json!(5)), "{a}");
    // A later write is a later batch: a.txt was reported once.
    write(&node.root, "b.txt", "later");
    let more = changes_until(&mut w, &id, "b.txt").await;
    assert_eq!(
        named(&ch, "a.txt") + named(&more, "a.txt"),
        1,
        "{ch:?} {more:?}"
    );
    // A deletion is reported as one.
    std::fs::remove_file(node.root.join("a.txt")).unwrap();
    let gone = changes_until(&mut w, &id, "a.txt").await;
    assert_eq!(gone.last().unwrap()["type"], "deleted", "{gone:?}");

    // The device goes away: the watcher is told, with resync.
    node.child.kill().await.unwrap();
    let ended = w.signal("fs.watch.ended").await;
    assert_eq!(ended["watchId"], id);
    assert_eq!(ended["resync"], true);
    assert!(
        ended["reason"].as_str().unwrap().contains("node1"),
        "{ended}"
    );
    // Its id is gone with it.
    let r = w.call("fs.unwatch", json!({"watchId": id})).await;
    assert_eq!(r["code"], "not_found", "{r}");
}

#[tokio::test]
async fn excludes_includes_and_depth_are_applied_on_the_node() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = node_process(&k, &mut alice).await;
    std::fs::create_dir(node.root.join("sub")).unwrap();
    let mut w = Watcher::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = watch_node(
        &mut w,
        json!({"path": node.root.display().to_string(), "exclude": ["*.log"]}),
    )
    .await;
    let shallow = watch_node(
        &mut w,
        json!({"path": ".", "recursive": false, "include": ["*.txt"]}),
    )
    .await;
    write(&node.root, "skip.log", "no");
    write(&node.root.join("sub"), "deep.txt", "deep");
    write(&node.root, "keep.txt", "yes");
    let mut ch = changes_until(&mut w, &d["watchId"], "keep.txt").await;
    if named(&ch, "deep.txt") == 0 {
        ch.extend(changes_until(&mut w, &d["watchId"], "deep.txt").await);
    }
    assert_eq!(named(&ch, ".log"), 0, "{ch:?}");
    // The shallow watch sees keep.txt, never sub/deep.txt nor the log.
    let top = changes_until(&mut w, &shallow["watchId"], "keep.txt").await;
    assert_eq!(named(&top, "deep.txt") + named(&top, ".log"), 0, "{top:?}");
}

#[tokio::test]
async fn another_user_can_neither_watch_the_device_nor_stop_a_watch_on_it() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = node_process(&k, &mut alice).await;
    let mut w = Watcher::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = watch_node(&mut w, json!({"path": "."})).await;
    let mut bob = Watcher::new(k.bob().await);
    let f = bob
        .request("fs.watch", json!({"path": ".", "target": "node1"}))
        .await;
    assert_eq!(err_of(&f), (403, "Access denied to device: node1".into()));
    let r = bob
        .call(
            "fs.unwatch",
            json!({"watchId": d["watchId"], "target": "node1"}),
        )
        .await;
    assert_eq!((&r["ok"], &r["code"]), (&json!(false), &json!("not_found")));
    // Alice's watch still runs.
    write(&node.root, "still.txt", "x");
    changes_until(&mut w, &d["watchId"], "still.txt").await;
}

#[tokio::test]
async fn unwatch_stops_the_signals_and_the_nodes_watcher() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = node_in_process(&k, &mut alice).await;
    let mut w = Watcher::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let first = watch_node(&mut w, json!({"path": "."})).await;
    assert_eq!(node.tools.watch_count(), 1);
    let r = w
        .call("fs.unwatch", json!({"watchId": first["watchId"]}))
        .await;
    assert_eq!(r, json!({"ok": true, "watchId": first["watchId"]}));
    eventually("the node to stop its watcher", || async {
        (node.tools.watch_count() == 0).then_some(())
    })
    .await;
    write(&node.root, "after.txt", "x");
    // A second watch sees the next write; the first one sends nothing.
    let second = watch_node(&mut w, json!({"path": "."})).await;
    write(&node.root, "later.txt", "y");
    changes_until(&mut w, &second["watchId"], "later.txt").await;
    assert!(
        !w.seen
            .iter()
            .any(|s| s["payload"]["watchId"] == first["watchId"]),
        "{:?}",
        w.seen
    );
    // Unknown now, and a second unwatch says so.
    let again = w
        .call("fs.unwatch", json!({"watchId": first["watchId"]}))
        .await;
    assert_eq!(again["code"], "not_found", "{again}");

    // The watcher's socket closing stops the node's watcher too.
    assert_eq!(node.tools.watch_count(), 1);
    w.c.close().await;
    eventually("the node to stop the closed socket's watcher", || async {
        (node.tools.watch_count() == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn what_a_device_cannot_do_is_refused_and_it_keeps_serving() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = node_in_process(&k, &mut alice).await;
    let mut w = Watcher::new(k.login_from("watcher", "alice", ALICE_PW).await);
    // No change index on a device: a cursor or a resume is expired.
    for args in [
        json!({"path": ".", "after": "n1.w_x.3"}),
        json!({"path": ".", "watchId": "w_old"}),
    ] {
        let mut a = args.clone();
        a["target"] = json!("node1");
        let d = w.call("fs.watch", a).await;
        assert_eq!(d["error"]["code"], "ECURSOR_EXPIRED", "{args}: {d}");
        assert_eq!(
            (&d["code"], &d["resync"]),
            (&json!("ECURSOR_EXPIRED"), &json!(true))
        );
    }
    let bad = [
        (json!({"path": ".", "durable": true}), "invalid_argument"),
        (json!({"path": ".", "include": ["a[b"]}), "invalid_argument"),
        (json!({"path": "../.."}), "path_escape"),
        (json!({"path": "missing"}), "not_found"),
    ];
    for (args, code) in bad {
        let mut a = args.clone();
        a["target"] = json!("node1");
        let d = w.call("fs.watch", a).await;
        assert_eq!(
            (&d["ok"], &d["code"]),
            (&json!(false), &json!(code)),
            "{args}: {d}"
        );
    }
    assert_eq!(node.tools.watch_count(), 0, "nothing was left watching");
    // A device with no node at all, and the polling form, which a device
    // does not offer.
    let f = w
        .request("fs.watch", json!({"path": ".", "target": "nosuch"}))
        .await;
    assert_eq!(err_of(&f).0, 403);
    let f = w
        .request(
            "fs.changes",
            json!({"path": ".", "after": "now", "target": "node1"}),
        )
        .await;
    assert_eq!(
        err_of(&f),
        (400, "Device node1 does not implement fs.changes".into())
    );
    let d = watch_node(&mut w, json!({"path": "."})).await;
    write(&node.root, "fine.txt", "ok");
    changes_until(&mut w, &d["watchId"], "fine.txt").await;
}
