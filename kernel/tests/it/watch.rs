//! `fs.watch`, `fs.changes`, `fs.unwatch` over the real WebSocket: live
//! `fs.changed` after `fs.write` and after a command's pull, resume from a
//! cursor (also across a kernel restart), expired cursors, permissions,
//! globs, and pruning held by durable watches.

use std::collections::{BTreeMap, VecDeque};

use gsv_kernel::client::GsvClient;
use gsv_kernel::domains::watch::calls::prune_now;
use serde_json::{Value, json};

use crate::harness::{ALICE_PW, BOB_PW, TestKernel, new_workspace};

/// A socket that keeps the signals it reads while waiting for answers.
struct Feed {
    c: GsvClient,
    signals: VecDeque<Value>,
}

impl Feed {
    fn new(c: GsvClient) -> Feed {
        Feed {
            c,
            signals: VecDeque::new(),
        }
    }

    /// The answer's `data` (signals read meanwhile are kept).
    async fn call(&mut self, call: &str, args: Value) -> Value {
        let id = self.c.fresh_id();
        self.c.send_request(&id, call, args).await.unwrap();
        loop {
            let f = self.c.recv().await.unwrap();
            if f["type"] == "sig" {
                self.signals.push_back(f);
            } else if f["type"] == "res" && f["id"] == id.as_str() {
                assert_eq!(f["ok"], true, "{call}: {f}");
                return f["data"].clone();
            }
        }
    }

    /// `fs.watch`; its answer must come before any of its signals.
    async fn watch(&mut self, args: Value) -> Value {
        let before = self.signals.len();
        let d = self.call("fs.watch", args).await;
        assert_eq!(d["ok"], true, "{d}");
        let early = self
            .signals
            .iter()
            .skip(before)
            .any(|s| s["payload"]["watchId"] == d["watchId"]);
        assert!(
            !early,
            "a signal of {} came before its answer",
            d["watchId"]
        );
        d
    }

    async fn next_signal(&mut self) -> Value {
        if let Some(s) = self.signals.pop_front() {
            return s;
        }
        loop {
            let f = self.c.recv().await.unwrap();
            if f["type"] == "sig" {
                return f;
            }
        }
    }

    /// The changes of the next `fs.changed`.
    async fn batch(&mut self) -> Vec<Value> {
        let s = self.next_signal().await;
        assert_eq!(s["signal"], "fs.changed", "{s}");
        s["payload"]["changes"].as_array().unwrap().clone()
    }

    /// `fs.changed` payloads until `n` changes have come; the changes as
    /// `(path, type, rev)` and the last batch's cursor.
    async fn changes(&mut self, n: usize) -> (Vec<Value>, String) {
        let mut out = Vec::new();
        let mut cursor = String::new();
        while out.len() < n {
            let s = self.next_signal().await;
            assert_eq!(s["signal"], "fs.changed", "{s}");
            cursor = s["payload"]["cursor"].as_str().unwrap().to_owned();
            let batch = s["payload"]["changes"].as_array().unwrap();
            let revs: Vec<_> = batch.iter().map(|c| c["rev"].clone()).collect();
            assert!(
                revs.windows(2).all(|w| w[0] == w[1]),
                "one rev per batch: {s}"
            );
            out.extend(batch.iter().cloned());
        }
        assert_eq!(out.len(), n, "{out:?}");
        (out, cursor)
    }
}

fn paths(changes: &[Value]) -> Vec<String> {
    changes
        .iter()
        .map(|c| c["path"].as_str().unwrap().to_owned())
        .collect()
}

async fn write(c: &mut GsvClient, path: &str, content: &str) {
    let d = c
        .call("fs.write", json!({"path": path, "content": content}))
        .await
        .unwrap();
    assert_eq!(d["ok"], true, "{d}");
}

#[tokio::test]
async fn an_fs_write_gives_one_fs_changed_with_the_path_and_size() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = w.watch(json!({"path": format!("/workspaces/{ws}")})).await;
    assert!(d["watchId"].as_str().unwrap().starts_with("w_"));
    assert_eq!(d["durable"], false);
    write(&mut a, &format!("/workspaces/{ws}/a.txt"), "hello").await;
    let (ch, cursor) = w.changes(1).await;
    assert_eq!(ch[0]["path"], format!("/workspaces/{ws}/a.txt"));
    assert_eq!(ch[0]["type"], "file");
    assert_eq!(ch[0]["size"], 5);
    assert!(ch[0]["hash"].as_str().unwrap().len() >= 32);
    // The polling form agrees, and has nothing after the signal's cursor.
    let p = w
        .call(
            "fs.changes",
            json!({"path": format!("/workspaces/{ws}"), "after": d["cursor"]}),
        )
        .await;
    assert_eq!(paths(p["changes"].as_array().unwrap()), paths(&ch));
    assert_eq!(p["more"], false);
    let p = w
        .call(
            "fs.changes",
            json!({"path": format!("/workspaces/{ws}"), "after": cursor}),
        )
        .await;
    assert_eq!(p["changes"], json!([]));
}

#[tokio::test]
async fn a_command_creating_three_files_and_deleting_one_gives_four_changes_in_order() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &format!("/workspaces/{ws}/old.txt"), "old").await;
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    w.watch(json!({"path": format!("/workspaces/{ws}")})).await;
    let mut d = a
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{ws}"), "input": "echo 1 > c.txt; echo 22 > a.txt; echo 333 > b.txt; rm old.txt", "yieldMs": 10000}),
        )
        .await
        .unwrap();
    for _ in 0..120 {
        if d["status"] != "running" {
            break;
        }
        d = a
            .call(
                "shell.exec",
                json!({"sessionId": d["sessionId"], "input": "", "yieldMs": 1000}),
            )
            .await
            .unwrap();
    }
    assert_eq!(d["status"], "completed", "{d}");
    // Live pull shows what wsd settled while the command ran (level-based:
    // a path's state then), so under load a file may first show up
    // between its creation and its last write. Read until every path's
    // newest state is its final one.
    let want: BTreeMap<String, (String, Option<u64>)> = [
        ("a.txt", "file", Some(3)),
        ("b.txt", "file", Some(4)),
        ("c.txt", "file", Some(2)),
        ("old.txt", "deleted", None),
    ]
    .into_iter()
    .map(|(n, t, size)| (n.to_owned(), (t.to_owned(), size)))
    .collect();
    let mut ch: Vec<Value> = Vec::new();
    let mut newest = BTreeMap::new();
    while newest != want {
        let batch = w.batch().await;
        for c in &batch {
            let name = c["path"].as_str().unwrap().rsplit('/').next().unwrap();
            assert!(want.contains_key(name), "a change of {name}: {c}");
            let state = (c["type"].as_str().unwrap().to_owned(), c["size"].as_u64());
            newest.insert(name.to_owned(), state);
        }
        ch.extend(batch);
    }
    let mut sorted = ch.clone();
    sorted.sort_by(|x, y| {
        (x["rev"].as_u64(), x["path"].as_str()).cmp(&(y["rev"].as_u64(), y["path"].as_str()))
    });
    assert_eq!(ch, sorted, "(rev, path) order");
}

/// Writes five files by another connection, then resumes `watch` args
/// (with `after`) on a new socket of `url`'s kernel: exactly those five,
/// then live.
async fn five_then_live(k: &TestKernel, ws: &str, resume: Value) {
    let mut a = k.alice().await;
    for i in 0..5 {
        write(
            &mut a,
            &format!("/workspaces/{ws}/f{i}.txt"),
            &"x".repeat(i + 1),
        )
        .await;
    }
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    w.watch(resume).await;
    let (ch, _) = w.changes(5).await;
    let want: Vec<String> = (0..5)
        .map(|i| format!("/workspaces/{ws}/f{i}.txt"))
        .collect();
    assert_eq!(paths(&ch), want);
    write(&mut a, &format!("/workspaces/{ws}/live.txt"), "l").await;
    let (ch, _) = w.changes(1).await;
    assert_eq!(paths(&ch), [format!("/workspaces/{ws}/live.txt")]);
}

#[tokio::test]
async fn a_resumed_watch_gets_exactly_what_it_missed_then_live() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    w.watch(json!({"path": format!("/workspaces/{ws}")})).await;
    write(&mut a, &format!("/workspaces/{ws}/seen.txt"), "s").await;
    let (_, cursor) = w.changes(1).await;
    w.c.close().await;
    five_then_live(
        &k,
        &ws,
        json!({"path": format!("/workspaces/{ws}"), "after": cursor}),
    )
    .await;
}

#[tokio::test]
async fn a_durable_watch_resumes_by_id_across_a_kernel_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ws, watch_id) = {
        let k = TestKernel::start_in(data.clone(), |_| {}).await;
        k.setup().await;
        let mut a = k.alice().await;
        let ws = new_workspace(&mut a).await;
        let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
        let d = w
            .watch(
                json!({"path": format!("/workspaces/{ws}"), "durable": true, "ttlSeconds": 3600}),
            )
            .await;
        assert_eq!(d["durable"], true);
        assert!(d["expiresAt"].as_i64().unwrap() > 0);
        write(&mut a, &format!("/workspaces/{ws}/seen.txt"), "s").await;
        w.changes(1).await;
        (ws, d["watchId"].as_str().unwrap().to_owned())
    };
    let k = TestKernel::start_in(data, |_| {}).await;
    // No `after`: the watch resumes from the cursor it last handed over.
    five_then_live(&k, &ws, json!({"path": "ignored", "watchId": watch_id})).await;
}

#[tokio::test]
async fn malformed_foreign_and_pruned_cursors_are_expired_with_resync() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let other = new_workspace(&mut a).await;
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let foreign = w
        .call(
            "fs.changes",
            json!({"path": format!("/workspaces/{other}"), "after": "now"}),
        )
        .await["cursor"]
        .clone();
    let start = w
        .call(
            "fs.changes",
            json!({"path": format!("/workspaces/{ws}"), "after": "now"}),
        )
        .await["cursor"]
        .clone();
    write(&mut a, &format!("/workspaces/{ws}/gone.txt"), "g").await;
    a.call(
        "fs.delete",
        json!({"path": format!("/workspaces/{ws}/gone.txt")}),
    )
    .await
    .unwrap();
    // Two ticks: the first records the rev, the second prunes up to it.
    prune_now(&k.kernel).await.unwrap();
    let pruned = prune_now(&k.kernel).await.unwrap();
    assert!(pruned.iter().any(|p| p.pruned >= 1), "{pruned:?}");
    for bad in [json!("garbage"), json!("c1.1.1"), foreign, start] {
        for call in ["fs.watch", "fs.changes"] {
            let id = w.c.fresh_id();
            w.c.send_request(
                &id,
                call,
                json!({"path": format!("/workspaces/{ws}"), "after": bad}),
            )
            .await
            .unwrap();
            let f = w.c.response_to(&id).await.unwrap();
            let d = &f["data"];
            assert_eq!(d["ok"], false, "{call} {bad}: {f}");
            assert_eq!(d["error"]["code"], "ECURSOR_EXPIRED", "{f}");
            assert_eq!(d["resync"], true, "{f}");
        }
    }
    // The kernel keeps serving, and "now" works.
    w.watch(json!({"path": format!("/workspaces/{ws}"), "after": "now"}))
        .await;
}

#[tokio::test]
async fn nobody_watches_what_they_may_not_read() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut b = Feed::new(k.bob().await);
    for path in [
        format!("/workspaces/{ws}"),
        "/home/alice".into(),
        "/root".into(),
    ] {
        let d = b.call("fs.watch", json!({"path": path})).await;
        assert_eq!(d["ok"], false, "{path}: {d}");
        assert!(
            d["error"].as_str().unwrap().contains("Permission denied"),
            "{d}"
        );
    }
    let d = b
        .call(
            "fs.changes",
            json!({"path": format!("/workspaces/{ws}"), "after": "now"}),
        )
        .await;
    assert_eq!(d["ok"], false, "{d}");
    // Alice's watch is not bob's to stop.
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = w
        .watch(json!({"path": format!("/workspaces/{ws}"), "durable": true}))
        .await;
    let u = b.call("fs.unwatch", json!({"watchId": d["watchId"]})).await;
    assert_eq!(u["ok"], false, "{u}");
    let r = b
        .call("fs.watch", json!({"path": "/", "watchId": d["watchId"]}))
        .await;
    assert_eq!(r["ok"], false, "{r}");
    // Watching the whole tree, bob sees his home and not alice's.
    b.watch(json!({"path": "/"})).await;
    let mut alice_home = k.login_from("alice2", "alice", ALICE_PW).await;
    write(&mut alice_home, "/home/alice/private.txt", "p").await;
    let mut bob2 = k.login_from("bob2", "bob", BOB_PW).await;
    write(&mut bob2, "/home/bob/mine.txt", "m").await;
    let (ch, _) = b.changes(1).await;
    assert_eq!(paths(&ch), ["/home/bob/mine.txt"]);
}

#[tokio::test]
async fn include_and_exclude_globs_filter_and_unwatch_stops_the_signals() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = w
        .watch(json!({
            "path": format!("/workspaces/{ws}/src"),
            "include": ["*.rs", "docs/*.md"],
            "exclude": ["gen_*"],
        }))
        .await;
    for p in [
        "src/a.rs",
        "src/a.txt",
        "src/x/gen_b.rs",
        "src/docs/r.md",
        "src/x/r.md",
        "top.rs",
        "src/x/c.rs",
    ] {
        write(&mut a, &format!("/workspaces/{ws}/{p}"), "x").await;
    }
    let (ch, _) = w.changes(3).await;
    assert_eq!(
        paths(&ch),
        ["a.rs", "docs/r.md", "x/c.rs"].map(|p| format!("/workspaces/{ws}/src/{p}"))
    );
    let u = w.call("fs.unwatch", json!({"watchId": d["watchId"]})).await;
    assert_eq!(u["ok"], true, "{u}");
    write(&mut a, &format!("/workspaces/{ws}/src/after.rs"), "x").await;
    // A second watch's signal is the next one: the first sent nothing more.
    w.watch(json!({"path": format!("/workspaces/{ws}/other")}))
        .await;
    write(&mut a, &format!("/workspaces/{ws}/other/o.txt"), "o").await;
    // The watched directory itself is reported too (created with o.txt).
    let (ch, _) = w.changes(2).await;
    assert_eq!(
        paths(&ch),
        [
            format!("/workspaces/{ws}/other"),
            format!("/workspaces/{ws}/other/o.txt")
        ]
    );
    let d = w
        .call(
            "fs.watch",
            json!({"path": format!("/workspaces/{ws}"), "include": ["a[b"]}),
        )
        .await;
    assert_eq!(d["ok"], false);
    assert!(d["error"].as_str().unwrap().contains("a[b"), "{d}");
    let d = w.call("fs.unwatch", json!({"watchId": "w_nope"})).await;
    assert_eq!(d["ok"], false);
}

#[tokio::test]
async fn pruning_never_passes_a_durable_watchs_cursor() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = w
        .watch(json!({"path": "/home/alice", "durable": true}))
        .await;
    let id = d["watchId"].clone();
    w.c.close().await;
    write(&mut a, "/home/alice/doomed.txt", "d").await;
    a.call("fs.delete", json!({"path": "/home/alice/doomed.txt"}))
        .await
        .unwrap();
    write(&mut a, "/home/alice/after.txt", "a").await;
    for _ in 0..3 {
        prune_now(&k.kernel).await.unwrap();
    }
    // The durable watch still gets the deletion.
    let mut w = Feed::new(k.login_from("watcher", "alice", ALICE_PW).await);
    w.watch(json!({"path": "", "watchId": id})).await;
    let (ch, _) = w.changes(2).await;
    assert_eq!(
        ch.iter()
            .map(|c| (c["path"].as_str().unwrap(), c["type"].as_str().unwrap()))
            .collect::<Vec<_>>(),
        [
            ("/home/alice/doomed.txt", "deleted"),
            ("/home/alice/after.txt", "file")
        ]
    );
    // Once unwatched, the next ticks prune it.
    w.call("fs.unwatch", json!({"watchId": id})).await;
    let mut pruned = prune_now(&k.kernel).await.unwrap();
    pruned.extend(prune_now(&k.kernel).await.unwrap());
    assert!(pruned.iter().any(|p| p.pruned >= 1), "{pruned:?}");
}

#[tokio::test]
async fn the_kernel_prunes_on_its_schedule_so_an_unheld_cursor_expires() {
    let k = TestKernel::with_users_tuned(|c| {
        c.prune_every = std::time::Duration::from_millis(20);
    })
    .await;
    let mut a = Feed::new(k.alice().await);
    let old = a
        .call("fs.changes", json!({"path": "/home/alice", "after": "now"}))
        .await["cursor"]
        .clone();
    write(&mut a.c, "/home/alice/doomed.txt", "d").await;
    a.c.call("fs.delete", json!({"path": "/home/alice/doomed.txt"}))
        .await
        .unwrap();
    // No watch holds it: within a few ticks the tombstone is pruned.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let d =
            a.c.call("fs.changes", json!({"path": "/home/alice", "after": old}))
                .await
                .unwrap();
        if d["ok"] == false {
            assert_eq!(d["code"], "ECURSOR_EXPIRED", "{d}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never pruned: {d}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
