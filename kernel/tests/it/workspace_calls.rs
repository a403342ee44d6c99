//! Calls the workspace tests make over and over (`snapshots.rs`,
//! `chunk_store.rs`): write, read, run a command, take a snapshot.

use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};

/// `fs.write` of `content` at `path` in workspace `ws`, which must succeed.
pub async fn write(c: &mut GsvClient, ws: &str, path: &str, content: &str) {
    let r = c
        .call(
            "fs.write",
            json!({"path": format!("/workspaces/{ws}/{path}"), "content": content}),
        )
        .await
        .unwrap();
    assert_ne!(r["ok"], false, "{r}");
}

/// `fs.read` of `path` in workspace `ws`: the answer as it came.
pub async fn read(c: &mut GsvClient, ws: &str, path: &str) -> Value {
    c.call(
        "fs.read",
        json!({"path": format!("/workspaces/{ws}/{path}")}),
    )
    .await
    .unwrap()
}

/// Runs `input` at the root of `ws` to the end; its output.
pub async fn run(c: &mut GsvClient, ws: &str, input: &str) -> String {
    let mut d = c
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{ws}"), "input": input, "yieldMs": 10000}),
        )
        .await
        .unwrap();
    for _ in 0..120 {
        if d["status"] != "running" {
            break;
        }
        let sid = d["sessionId"].as_str().unwrap().to_owned();
        d = c
            .call(
                "shell.exec",
                json!({"sessionId": sid, "input": "", "yieldMs": 1000}),
            )
            .await
            .unwrap();
    }
    assert_eq!(d["status"], "completed", "{d}");
    d["output"].as_str().unwrap().to_owned()
}

/// `workspace.snapshot.create` of `ws`, unlabelled: the answer.
pub async fn snapshot(c: &mut GsvClient, ws: &str) -> Value {
    c.call("workspace.snapshot.create", json!({"workspaceId": ws}))
        .await
        .unwrap()
}
