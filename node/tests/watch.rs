//! The node's `fs.watch` / `fs.unwatch` through `NodeTools::handle`, on a
//! real temp directory with the real inotify watcher: batches, globs,
//! atomic saves, the watched directory's deletion, bad input, and the
//! connection's end.

use std::path::PathBuf;
use std::time::Duration;

use gsv_node::{NodeRoot, NodeTools, WatchSignal};
use serde_json::{Value, json};
use tokio::sync::mpsc;

struct Node {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    tools: NodeTools,
}

fn node() -> Node {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap().join("root");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    let tools = NodeTools::new(NodeRoot::new(&root).unwrap());
    Node {
        _tmp: tmp,
        root,
        tools,
    }
}

impl Node {
    async fn call(&self, call: &str, args: Value) -> Value {
        self.tools.handle(call, args).await.unwrap()
    }
}

/// The next signal, within a bound.
async fn next(rx: &mut mpsc::Receiver<WatchSignal>) -> WatchSignal {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("a signal within 20 s")
        .expect("the queue is open")
}

/// The changes of `fs.changed` batches until one names a path ending in
/// `last`.
async fn changes_until(rx: &mut mpsc::Receiver<WatchSignal>, last: &str) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let WatchSignal::Changed(batch) = next(rx).await else {
            panic!("the watch ended");
        };
        let revs: Vec<u64> = batch.changes.iter().map(|c| c.rev).collect();
        assert!(revs.windows(2).all(|w| w[0] == w[1]), "one rev a batch");
        assert_eq!(batch.cursor, format!("n1.{}.{}", batch.watch_id, revs[0]));
        let done = batch.changes.iter().any(|c| c.path.ends_with(last));
        out.extend(
            batch
                .changes
                .iter()
                .map(|c| serde_json::to_value(c).unwrap()),
        );
        if done {
            return out;
        }
    }
}

fn count(changes: &[Value], suffix: &str) -> usize {
    changes
        .iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with(suffix))
        .count()
}

#[tokio::test]
async fn writes_are_batched_by_path_with_each_paths_state_when_sent() {
    let n = node();
    let mut rx = n.tools.watch_signals();
    let d = n
        .call("fs.watch", json!({"path": ".", "watchId": "w1"}))
        .await;
    assert_eq!(
        d,
        json!({"ok": true, "watchId": "w1", "cursor": "n1.w1.0", "durable": false})
    );
    // Many writes to one file, a save through a temporary name, and a
    // file below.
    for i in 0..20 {
        std::fs::write(n.root.join("a.txt"), format!("{i:03}")).unwrap();
    }
    std::fs::write(n.root.join(".b.tmp"), "saved").unwrap();
    std::fs::rename(n.root.join(".b.tmp"), n.root.join("b.txt")).unwrap();
    std::fs::write(n.root.join("sub/c.txt"), "deep").unwrap();
    let mut seen = changes_until(&mut rx, "a.txt").await;
    while count(&seen, "b.txt") == 0 || count(&seen, "c.txt") == 0 {
        seen.extend(changes_until(&mut rx, ".txt").await);
    }
    let a: Vec<&Value> = seen
        .iter()
        .filter(|c| c["path"].as_str().unwrap().ends_with("a.txt"))
        .collect();
    assert_eq!(a.last().unwrap()["size"], 3, "{seen:?}");
    assert_eq!(a.last().unwrap()["type"], "file");
    let c = seen
        .iter()
        .find(|c| c["path"].as_str().unwrap().ends_with("c.txt"))
        .unwrap();
    assert_eq!(c["path"], n.root.join("sub/c.txt").display().to_string());
    assert!(c.get("hash").is_none(), "{c}");
}

#[tokio::test]
async fn globs_and_depth_decide_and_the_watched_directorys_deletion_ends_the_watch() {
    let n = node();
    let mut rx = n.tools.watch_signals();
    let d = n
        .call(
            "fs.watch",
            json!({"path": "sub", "watchId": "w1", "recursive": false, "exclude": ["*.log"]}),
        )
        .await;
    assert_eq!(d["ok"], true, "{d}");
    std::fs::create_dir(n.root.join("sub/deeper")).unwrap();
    std::fs::write(n.root.join("sub/deeper/x.txt"), "x").unwrap();
    std::fs::write(n.root.join("sub/skip.log"), "x").unwrap();
    std::fs::write(n.root.join("sub/keep.txt"), "x").unwrap();
    let seen = changes_until(&mut rx, "keep.txt").await;
    assert_eq!(count(&seen, "x.txt") + count(&seen, ".log"), 0, "{seen:?}");
    std::fs::remove_dir_all(n.root.join("sub")).unwrap();
    loop {
        match next(&mut rx).await {
            WatchSignal::Changed(_) => {}
            WatchSignal::Ended(e) => {
                assert_eq!(e.watch_id, "w1");
                assert!(e.resync && e.reason.contains("deleted"), "{e:?}");
                break;
            }
        }
    }
    for _ in 0..200 {
        if n.tools.watch_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the ended watch is still running");
}

#[tokio::test]
async fn bad_input_is_refused_and_unwatch_and_disconnect_stop_watches() {
    let n = node();
    let _rx = n.tools.watch_signals();
    let refused = [
        (
            json!({"path": ".", "watchId": "w", "after": "n1.w.4"}),
            "ECURSOR_EXPIRED",
        ),
        (json!({"path": "."}), "invalid_argument"),
        (
            json!({"path": ".", "watchId": "w", "durable": true}),
            "invalid_argument",
        ),
        (
            json!({"path": ".", "watchId": "w", "include": ["a[b"]}),
            "invalid_argument",
        ),
        (json!({"path": "../", "watchId": "w"}), "path_escape"),
        (json!({"path": "nope", "watchId": "w"}), "not_found"),
        (json!({"path": 7}), "invalid_argument"),
    ];
    for (args, code) in refused {
        let d = n.call("fs.watch", args.clone()).await;
        assert_eq!(
            (&d["ok"], &d["code"]),
            (&json!(false), &json!(code)),
            "{args}: {d}"
        );
    }
    assert_eq!(n.tools.watch_count(), 0);
    let ok = n
        .call("fs.watch", json!({"path": ".", "watchId": "w"}))
        .await;
    assert_eq!(ok["ok"], true);
    let dup = n
        .call("fs.watch", json!({"path": ".", "watchId": "w"}))
        .await;
    assert_eq!(dup["code"], "invalid_argument", "{dup}");
    let u = n.call("fs.unwatch", json!({"watchId": "w"})).await;
    assert_eq!(u, json!({"ok": true, "watchId": "w"}));
    let again = n.call("fs.unwatch", json!({"watchId": "w"})).await;
    assert_eq!(again["code"], "not_found");
    assert_eq!(n.tools.watch_count(), 0);
    n.call("fs.watch", json!({"path": ".", "watchId": "w2"}))
        .await;
    assert_eq!(n.tools.watch_count(), 1);
    n.tools.stop_watches();
    assert_eq!(n.tools.watch_count(), 0);
    // Without a connection there is nobody to send to.
    let d = n
        .call("fs.watch", json!({"path": ".", "watchId": "w3"}))
        .await;
    assert_eq!(d["code"], "invalid_argument", "{d}");
}
