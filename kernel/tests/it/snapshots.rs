//! `workspace.snapshot.*`, forks and `sys.gc` over a real WebSocket, on
//! workspaces backed by real `wsd` children.

use serde_json::json;

use crate::harness::{TestKernel, err_of, new_workspace};
use crate::workspace_calls::{read, run, snapshot, write};

#[tokio::test]
async fn restore_brings_back_old_content_for_fs_read_and_the_next_exec() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "f.txt", "old").await;
    // The workspace's wsd has the file too before the snapshot.
    assert_eq!(run(&mut a, &ws, "cat f.txt").await, "old");
    let s = a
        .call(
            "workspace.snapshot.create",
            json!({"workspaceId": ws, "label": "before"}),
        )
        .await
        .unwrap();
    assert_eq!(s["label"], "before");
    assert_eq!(
        (s["files"].as_u64(), s["bytes"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(s["newBytes"], 3);
    let sid = s["snapshotId"].as_str().unwrap().to_owned();
    let again = snapshot(&mut a, &ws).await;
    assert_eq!(again["newBytes"], 0, "an unchanged tree shares every chunk");

    write(&mut a, &ws, "f.txt", "new").await;
    assert_eq!(run(&mut a, &ws, "echo later > made.txt").await, "");
    assert_eq!(read(&mut a, &ws, "made.txt").await["content"], "1\tlater");
    let diff = a
        .call("workspace.snapshot.diff", json!({"from": sid}))
        .await
        .unwrap();
    assert_eq!(
        diff["changes"],
        json!([{"path": "f.txt", "change": "modified"}, {"path": "made.txt", "change": "added"}])
    );

    let r = a
        .call("workspace.snapshot.restore", json!({"snapshotId": sid}))
        .await
        .unwrap();
    assert_eq!(
        (r["changed"].as_u64(), r["removed"].as_u64()),
        (Some(1), Some(1)),
        "{r}"
    );
    assert_eq!(read(&mut a, &ws, "f.txt").await["content"], "1\told");
    let gone = read(&mut a, &ws, "made.txt").await;
    assert_eq!(gone["ok"], false, "{gone}");
    assert_eq!(
        run(&mut a, &ws, "cat f.txt; ls").await,
        "oldf.txt\n",
        "the next command sees the restored tree"
    );

    let listed = a
        .call("workspace.snapshot.list", json!({"workspaceId": ws}))
        .await
        .unwrap();
    let ids: Vec<&str> = listed["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["snapshotId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [sid.as_str(), again["snapshotId"].as_str().unwrap()]);
    let got = a
        .call("workspace.snapshot.get", json!({"snapshotId": sid}))
        .await
        .unwrap();
    assert_eq!(got, s);
}

#[tokio::test]
async fn snapshots_survive_a_kernel_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (ws, sid) = {
        let k = TestKernel::start_in(data.clone(), |_| {}).await;
        k.setup().await;
        let mut a = k.alice().await;
        let ws = new_workspace(&mut a).await;
        write(&mut a, &ws, "f", "kept").await;
        let sid = snapshot(&mut a, &ws).await["snapshotId"]
            .as_str()
            .unwrap()
            .to_owned();
        write(&mut a, &ws, "f", "changed").await;
        a.close().await;
        k.kernel.shutdown().await;
        (ws, sid)
    };
    let k = TestKernel::start_in(data, |_| {}).await;
    let mut a = k.alice().await;
    a.call("workspace.snapshot.restore", json!({"snapshotId": sid}))
        .await
        .unwrap();
    assert_eq!(read(&mut a, &ws, "f").await["content"], "1\tkept");
    assert_eq!(run(&mut a, &ws, "cat f").await, "kept");
}

#[tokio::test]
async fn a_fork_and_its_source_are_independent_both_ways() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let src = new_workspace(&mut a).await;
    write(&mut a, &src, "shared.txt", "from the source").await;
    let sid = snapshot(&mut a, &src).await["snapshotId"]
        .as_str()
        .unwrap()
        .to_owned();
    let fork = a
        .call("sys.workspace.create", json!({"fromSnapshot": sid}))
        .await
        .unwrap()["workspace"]["workspaceId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(fork, src);
    assert_eq!(
        read(&mut a, &fork, "shared.txt").await["content"],
        "1\tfrom the source"
    );
    write(&mut a, &fork, "shared.txt", "fork edit").await;
    write(&mut a, &src, "only-source.txt", "s").await;
    assert_eq!(
        read(&mut a, &src, "shared.txt").await["content"],
        "1\tfrom the source"
    );
    assert_eq!(read(&mut a, &fork, "only-source.txt").await["ok"], false);
    assert_eq!(run(&mut a, &fork, "cat shared.txt").await, "fork edit");
    assert_eq!(run(&mut a, &src, "cat shared.txt").await, "from the source");

    let before = a.call("sys.workspace.list", json!({})).await.unwrap()["workspaces"]
        .as_array()
        .unwrap()
        .len();
    let f = a
        .request("sys.workspace.create", json!({"fromSnapshot": "snap_nope"}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403, "{f}");
    let after = a.call("sys.workspace.list", json!({})).await.unwrap()["workspaces"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(before, after, "a refused fork leaves no workspace behind");
}

#[tokio::test]
async fn another_users_and_unknown_snapshots_are_refused_and_the_limit_is_elimit() {
    let k = TestKernel::with_users_tuned(|c| c.snapshot_limit = 2).await;
    let mut a = k.alice().await;
    let mut b = k.bob().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "f", "alice's").await;
    let sid = snapshot(&mut a, &ws).await["snapshotId"]
        .as_str()
        .unwrap()
        .to_owned();
    for (call, args) in [
        ("workspace.snapshot.get", json!({"snapshotId": sid})),
        ("workspace.snapshot.restore", json!({"snapshotId": sid})),
        ("workspace.snapshot.delete", json!({"snapshotId": sid})),
        ("workspace.snapshot.diff", json!({"from": sid})),
        ("workspace.snapshot.list", json!({"workspaceId": ws})),
        ("workspace.snapshot.create", json!({"workspaceId": ws})),
        ("sys.workspace.create", json!({"fromSnapshot": sid})),
    ] {
        let f = b.request(call, args).await.unwrap();
        assert_eq!(err_of(&f).0, 403, "{call}: {f}");
    }
    let f = a
        .request(
            "workspace.snapshot.restore",
            json!({"snapshotId": "snap_unknown"}),
        )
        .await
        .unwrap();
    let (code, msg) = err_of(&f);
    assert_eq!(code, 403);
    assert!(msg.contains("snap_unknown"), "{msg}");
    let f = a
        .request(
            "workspace.snapshot.get",
            json!({"snapshotId": sid, "extra": 1}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 400, "{f}");

    snapshot(&mut a, &ws).await;
    let r = snapshot(&mut a, &ws).await;
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["code"], "ELIMIT", "{r}");
    assert!(r["error"].as_str().unwrap().contains(&ws), "{r}");
    assert_eq!(read(&mut a, &ws, "f").await["content"], "1\talice's");
}

#[tokio::test]
async fn a_restore_while_a_command_runs_is_refused() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "f", "v1").await;
    let sid = snapshot(&mut a, &ws).await["snapshotId"]
        .as_str()
        .unwrap()
        .to_owned();
    write(&mut a, &ws, "f", "v2").await;
    let d = a
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{ws}"), "input": "read line; echo $line", "yieldMs": 200, "openStdin": true}),
        )
        .await
        .unwrap();
    assert_eq!(d["status"], "running", "{d}");
    let r = a
        .call("workspace.snapshot.restore", json!({"snapshotId": sid}))
        .await
        .unwrap();
    assert_eq!(r["code"], "EBUSY", "{r}");
    assert_eq!(
        read(&mut a, &ws, "f").await["content"],
        "1\tv2",
        "nothing changed"
    );
    let sess = d["sessionId"].as_str().unwrap().to_owned();
    let mut d = a
        .call(
            "shell.exec",
            json!({"sessionId": sess, "input": "done\n", "yieldMs": 10000}),
        )
        .await
        .unwrap();
    for _ in 0..60 {
        if d["status"] != "running" {
            break;
        }
        d = a
            .call(
                "shell.exec",
                json!({"sessionId": sess, "input": "", "yieldMs": 1000}),
            )
            .await
            .unwrap();
    }
    assert_eq!(d["status"], "completed", "{d}");
    let r = a
        .call("workspace.snapshot.restore", json!({"snapshotId": sid}))
        .await
        .unwrap();
    assert_eq!(r["changed"], 1, "{r}");
}

#[tokio::test]
async fn deleting_a_snapshot_and_collecting_frees_only_its_unshared_chunks() {
    // No grace window: what was stored a moment ago is collectable.
    let k = TestKernel::with_users_tuned(|c| c.gc_grace = std::time::Duration::ZERO).await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    write(&mut a, &ws, "shared", "in the tree and in the snapshot").await;
    write(&mut a, &ws, "only-snap", "only the snapshot keeps this").await;
    let sid = snapshot(&mut a, &ws).await["snapshotId"]
        .as_str()
        .unwrap()
        .to_owned();
    a.call(
        "fs.delete",
        json!({"path": format!("/workspaces/{ws}/only-snap")}),
    )
    .await
    .unwrap();
    let mut root = k.login("root", "root-password").await;
    let f = a.request("sys.gc", json!({})).await.unwrap();
    assert_eq!(err_of(&f).0, 403, "users do not collect: {f}");
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["chunks"], 0, "the snapshot holds the deleted file: {gc}");

    a.call("workspace.snapshot.delete", json!({"snapshotId": sid}))
        .await
        .unwrap();
    let gc = root.call("sys.gc", json!({})).await.unwrap();
    assert_eq!(gc["chunks"], 1, "{gc}");
    assert_eq!(
        read(&mut a, &ws, "shared").await["content"],
        "1\tin the tree and in the snapshot"
    );
    let row = gsv_kernel::domains::workspace::WorkspaceRow {
        id: ws.clone(),
        ..k.kernel
            .db()
            .call({
                let ws = ws.clone();
                move |c| gsv_kernel::domains::workspace::get_row(c, &ws)
            })
            .await
            .unwrap()
            .unwrap()
    };
    let w = k.kernel.workspaces().open(&row).await.unwrap();
    w.dofs.lock().unwrap().check_integrity().unwrap();
    let f = a
        .request("workspace.snapshot.get", json!({"snapshotId": sid}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403, "deleted: {f}");
}
