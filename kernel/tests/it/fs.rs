//! `fs.*` shapes, errors and permissions on the system store.

use serde_json::json;

use crate::harness::TestKernel;

#[tokio::test]
async fn write_then_read_returns_numbered_lines_with_offset_and_limit() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let w = a
        .call(
            "fs.write",
            json!({"path": "notes/todo.txt", "content": "one\ntwo\nthree\nfour\n"}),
        )
        .await
        .unwrap();
    assert_eq!(
        w,
        json!({"ok": true, "path": "/home/alice/notes/todo.txt", "size": 19})
    );
    let r = a
        .call("fs.read", json!({"path": "~/notes/todo.txt"}))
        .await
        .unwrap();
    assert_eq!(r["content"], "1\tone\n2\ttwo\n3\tthree\n4\tfour");
    assert_eq!(
        (r["lines"].clone(), r["size"].clone()),
        (json!(4), json!(19))
    );
    let r = a
        .call(
            "fs.read",
            json!({"path": "/home/alice/notes/todo.txt", "offset": 1, "limit": 2}),
        )
        .await
        .unwrap();
    assert_eq!(r["content"], "2\ttwo\n3\tthree");
    let dir = a.call("fs.read", json!({"path": "~"})).await.unwrap();
    assert_eq!(
        dir,
        json!({"ok": true, "path": "/home/alice", "files": [], "directories": ["notes"]})
    );
    let root = a.call("fs.read", json!({"path": "/"})).await.unwrap();
    assert!(
        root["directories"]
            .as_array()
            .unwrap()
            .contains(&json!("workspaces"))
    );
}

#[tokio::test]
async fn operation_errors_are_ok_true_with_data_ok_false() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    for (call, args, needle) in [
        ("fs.read", json!({"path": "missing.txt"}), "not found"),
        ("fs.delete", json!({"path": "missing.txt"}), "not found"),
        ("fs.read", json!({"path": "../bob/x"}), "`..`"),
        ("fs.read", json!({"path": "/home/bob"}), "Permission denied"),
        (
            "fs.write",
            json!({"path": "/home/bob/x", "content": "hi"}),
            "Permission denied",
        ),
        (
            "fs.write",
            json!({"path": "/etc/passwd", "content": "hi"}),
            "Permission denied",
        ),
        (
            "fs.search",
            json!({"query": ""}),
            "Search query is required.",
        ),
        (
            "fs.search",
            json!({"query": "x", "include": "a{b"}),
            "Invalid include pattern",
        ),
    ] {
        let d = a.call(call, args.clone()).await.unwrap();
        assert_eq!(d["ok"], false, "{call} {args}: {d}");
        let e = d["error"].as_str().unwrap();
        assert!(e.contains(needle), "{call} {args}: {e}");
    }
}

#[tokio::test]
async fn edit_replaces_exactly_once_refuses_ambiguity_and_honours_replace_all() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    a.call("fs.write", json!({"path": "f.txt", "content": "a b a"}))
        .await
        .unwrap();
    let d = a
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "a", "newString": "c"}),
        )
        .await
        .unwrap();
    assert_eq!(d["ok"], false);
    assert!(
        d["error"].as_str().unwrap().contains("found 2 times"),
        "{d}"
    );
    let d = a
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "b", "newString": "B"}),
        )
        .await
        .unwrap();
    assert_eq!(
        d,
        json!({"ok": true, "path": "/home/alice/f.txt", "replacements": 1})
    );
    let d = a
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "a", "newString": "c", "replaceAll": true}),
        )
        .await
        .unwrap();
    assert_eq!(d["replacements"], 2);
    let d = a
        .call(
            "fs.edit",
            json!({"path": "f.txt", "oldString": "zzz", "newString": "c"}),
        )
        .await
        .unwrap();
    assert!(d["error"].as_str().unwrap().contains("not found"), "{d}");
    let r = a.call("fs.read", json!({"path": "f.txt"})).await.unwrap();
    assert_eq!(r["content"], "1\tc B c");
}

#[tokio::test]
async fn delete_removes_trees_and_search_finds_literals_with_include_and_a_cap() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    a.call(
        "fs.write",
        json!({"path": "src/a.rs", "content": "fn main() {}\n// needle.*\n"}),
    )
    .await
    .unwrap();
    a.call(
        "fs.write",
        json!({"path": "src/b.ts", "content": "needle.*"}),
    )
    .await
    .unwrap();
    a.call(
        "fs.write",
        json!({"path": "src/c.md", "content": "needle.*"}),
    )
    .await
    .unwrap();
    let d = a
        .call(
            "fs.search",
            json!({"query": "needle.*", "path": "src", "include": "*.{rs,ts}"}),
        )
        .await
        .unwrap();
    assert_eq!(
        d,
        json!({"ok": true, "count": 2, "matches": [
            {"path": "/home/alice/src/a.rs", "line": 2, "content": "// needle.*"},
            {"path": "/home/alice/src/b.ts", "line": 1, "content": "needle.*"},
        ]})
    );
    let many: String = (0..150).map(|i| format!("hit {i}\n")).collect();
    a.call("fs.write", json!({"path": "many.txt", "content": many}))
        .await
        .unwrap();
    let d = a.call("fs.search", json!({"query": "hit"})).await.unwrap();
    assert_eq!(
        (d["count"].clone(), d["truncated"].clone()),
        (json!(100), json!(true))
    );
    let d = a.call("fs.delete", json!({"path": "src"})).await.unwrap();
    assert_eq!(d, json!({"ok": true, "path": "/home/alice/src"}));
    let d = a
        .call("fs.read", json!({"path": "src/a.rs"}))
        .await
        .unwrap();
    assert_eq!(d["ok"], false);
}

#[tokio::test]
async fn search_from_the_root_never_shows_another_users_files() {
    let k = TestKernel::with_users().await;
    let mut bob = k.bob().await;
    bob.call(
        "fs.write",
        json!({"path": "secret.txt", "content": "password=hunter2"}),
    )
    .await
    .unwrap();
    let mut a = k.alice().await;
    let d = a
        .call("fs.search", json!({"query": "hunter2", "path": "/"}))
        .await
        .unwrap();
    assert_eq!(d["count"], 0, "{d}");
}
