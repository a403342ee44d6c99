//! `gsv node` end to end: a user's routed `fs.*` and `shell.exec` answered
//! by the node driver (in-process, and once as the real `gsv` binary)
//! over a temp `--root`, including path escapes and reconnects.

use std::path::Path;
use std::time::Duration;

use gsv_kernel::client::GsvClient;
use gsv_node::driver::{self, DriverConfig};
use gsv_node::{NodeRoot, NodeTools, ShellConfig};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::harness::{ScriptedDriver, TestKernel, node_token};

/// A `gsv node` running in this process; stopped when dropped.
pub(crate) struct Node {
    stop: CancellationToken,
    task: Option<JoinHandle<Result<(), driver::DriverError>>>,
    pub(crate) root: TempDir,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

pub(crate) async fn start_node(k: &TestKernel, alice: &mut GsvClient, device: &str) -> Node {
    let root = tempfile::tempdir().unwrap();
    let token = node_token(alice, device).await;
    let tools = NodeTools::with_config(
        NodeRoot::new(root.path()).unwrap(),
        ShellConfig {
            shell: Some("/bin/sh".into()),
            login: false,
            ..ShellConfig::default()
        },
    );
    let mut config = DriverConfig::new(k.url.clone(), device.into(), "alice".into(), token);
    config.min_backoff = Duration::from_millis(20);
    config.max_backoff = Duration::from_millis(200);
    let stop = CancellationToken::new();
    let task = tokio::spawn(driver::run(config, tools, stop.clone()));
    let node = Node {
        stop,
        task: Some(task),
        root,
    };
    wait_online(alice, device).await;
    node
}

/// Waits (bounded) until `device` is online.
pub(crate) async fn wait_online(c: &mut GsvClient, device: &str) {
    for _ in 0..500 {
        let d = c
            .call("sys.device.get", json!({"deviceId": device}))
            .await
            .unwrap();
        if d["device"]["online"] == true {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("device {device} never came online");
}

async fn routed(c: &mut GsvClient, call: &str, mut args: Value) -> Value {
    args["target"] = json!("node1");
    c.call(call, args).await.unwrap()
}

#[tokio::test]
async fn a_user_reads_writes_edits_searches_and_deletes_files_on_a_node() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = start_node(&k, &mut alice, "node1").await;
    let w = routed(
        &mut alice,
        "fs.write",
        json!({"path": "dir/a.txt", "content": "one\ntwo\n"}),
    )
    .await;
    assert_eq!(w["ok"], true, "{w}");
    assert_eq!(
        std::fs::read_to_string(node.root.path().join("dir/a.txt")).unwrap(),
        "one\ntwo\n"
    );
    let r = routed(&mut alice, "fs.read", json!({"path": "dir/a.txt"})).await;
    assert_eq!(r["ok"], true, "{r}");
    assert!(r["content"].as_str().unwrap().contains("two"), "{r}");
    let e = routed(
        &mut alice,
        "fs.edit",
        json!({"path": "dir/a.txt", "oldString": "two", "newString": "2"}),
    )
    .await;
    assert_eq!(e["replacements"], 1, "{e}");
    let s = routed(&mut alice, "fs.search", json!({"query": "one"})).await;
    assert_eq!(s["count"], 1, "{s}");
    let d = routed(&mut alice, "fs.delete", json!({"path": "dir/a.txt"})).await;
    assert_eq!(d["ok"], true, "{d}");
    assert!(!node.root.path().join("dir/a.txt").exists());
    let missing = routed(&mut alice, "fs.read", json!({"path": "dir/a.txt"})).await;
    assert_eq!(
        missing["ok"], false,
        "an operation failure is data: {missing}"
    );
}

#[tokio::test]
async fn paths_that_escape_the_node_root_are_refused_through_a_routed_call() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = start_node(&k, &mut alice, "node1").await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "keep out").unwrap();
    std::os::unix::fs::symlink(outside.path(), node.root.path().join("link")).unwrap();
    for (call, args) in [
        ("fs.read", json!({"path": "../secret"})),
        ("fs.read", json!({"path": "link/secret"})),
        (
            "fs.read",
            json!({"path": outside.path().join("secret").to_str().unwrap()}),
        ),
        (
            "fs.write",
            json!({"path": "link/secret", "content": "pwned"}),
        ),
        ("fs.delete", json!({"path": "link/secret"})),
    ] {
        let d = routed(&mut alice, call, args.clone()).await;
        assert_eq!(d["ok"], false, "{call} {args} escaped: {d}");
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "keep out"
    );
}

#[tokio::test]
async fn shell_exec_on_a_node_completes_and_a_background_session_is_polled_to_its_end() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = start_node(&k, &mut alice, "node1").await;
    let d = routed(&mut alice, "shell.exec", json!({"input": "echo hi; pwd"})).await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(d["exitCode"], 0);
    let out = d["output"].as_str().unwrap();
    assert!(out.starts_with("hi\n"), "{d}");
    let root = node.root.path().canonicalize().unwrap();
    assert!(out.contains(root.to_str().unwrap()), "runs in --root: {d}");

    // A background command is continued by sessionId alone, on its node.
    let d = routed(
        &mut alice,
        "shell.exec",
        json!({"input": "read x; echo got $x", "background": true}),
    )
    .await;
    assert_eq!(d["status"], "running", "{d}");
    let sid = d["sessionId"].as_str().unwrap().to_owned();
    // The write waits (its yield) for the command, which ends once fed.
    let mut last = alice
        .call(
            "shell.exec",
            json!({"sessionId": sid, "action": "write", "input": "42\n"}),
        )
        .await
        .unwrap();
    for _ in 0..500 {
        if last["status"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        last = alice
            .call("shell.exec", json!({"sessionId": sid, "action": "poll"}))
            .await
            .unwrap();
    }
    assert_eq!(last["status"], "completed", "{last}");
    assert!(
        last["output"].as_str().unwrap_or("").contains("got 42"),
        "{last}"
    );
    // The node's exec.status reached the kernel's session row.
    let sid2 = sid.clone();
    let mut status = String::new();
    for _ in 0..500 {
        let s = sid2.clone();
        status = k
            .kernel
            .db()
            .call(move |c| {
                Ok(c.query_row(
                    "SELECT status FROM device_shell_sessions WHERE session_id = ?1",
                    [&s],
                    |r| r.get::<_, String>(0),
                )?)
            })
            .await
            .unwrap();
        if status == "completed" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, "completed");
}

#[tokio::test]
async fn a_node_whose_connection_is_taken_over_reconnects_and_serves_again() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = start_node(&k, &mut alice, "node1").await;
    std::fs::write(node.root.path().join("f"), "from the node\n").unwrap();
    // A second driver for the same device supersedes the node...
    let token = node_token(&mut alice, "node1").await;
    let mut other = ScriptedDriver::connect(&k, "alice", &token, "node1", &["fs.*"]).await;
    // ...which reconnects with backoff and supersedes it back.
    let closed = loop {
        match other.ws.recv().await {
            Ok(_) => continue,
            Err(e) => break e.to_string(),
        }
    };
    assert!(closed.contains("Replaced by newer connection"), "{closed}");
    wait_online(&mut alice, "node1").await;
    let r = routed(&mut alice, "fs.read", json!({"path": "f"})).await;
    assert!(
        r["content"].as_str().unwrap().contains("from the node"),
        "{r}"
    );
}

#[tokio::test]
async fn the_gsv_node_binary_serves_routed_calls_as_the_tokens_account_by_default() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let token = node_token(&mut alice, "node1").await;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(root.join("hello.txt"), "hello from the binary\n").unwrap();
    let token_file = dir.path().join("token");
    write_private(&token_file, &token);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_gsv"))
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
    wait_online(&mut alice, "node1").await;
    let d = alice
        .call("sys.device.get", json!({"deviceId": "node1"}))
        .await
        .unwrap();
    assert_eq!(d["device"]["ownerUid"], 1000, "{d}");
    let r = routed(&mut alice, "fs.read", json!({"path": "hello.txt"})).await;
    assert!(
        r["content"]
            .as_str()
            .unwrap()
            .contains("hello from the binary"),
        "{r}"
    );
    child.kill().await.unwrap();
}

pub(crate) fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
}

#[tokio::test]
async fn a_caller_cancelling_a_routed_command_kills_it_on_the_node() {
    let k = TestKernel::with_users().await;
    let mut alice = k.alice().await;
    let node = start_node(&k, &mut alice, "node1").await;
    let pidfile = node.root.path().join("pid");
    alice
        .send_request(
            "long",
            "shell.exec",
            json!({"target": "node1", "input": "echo $$ > pid; exec sleep 60", "yieldMs": 30000}),
        )
        .await
        .unwrap();
    let mut pid = String::new();
    for _ in 0..500 {
        pid = std::fs::read_to_string(&pidfile)
            .unwrap_or_default()
            .trim()
            .to_owned();
        if !pid.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!pid.is_empty(), "the command never started");
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    assert!(proc_dir.exists());
    alice
        .send_text(
            json!({"type": "sig", "signal": "request.cancel", "payload": {"id": "long"}})
                .to_string(),
        )
        .await
        .unwrap();
    // The kill is asynchronous; wait (bounded) for the process to go.
    let mut alive = true;
    for _ in 0..500 {
        let state = std::fs::read_to_string(proc_dir.join("stat")).unwrap_or_default();
        // Gone, or a zombie waiting to be reaped.
        if state.is_empty() || state.contains(") Z ") {
            alive = false;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!alive, "the cancelled command is still running");
    // And the caller never gets an answer for it.
    alice
        .send_request("after", "sys.device.list", json!({}))
        .await
        .unwrap();
    let next = alice.recv().await.unwrap();
    assert_eq!(next["id"], "after", "a cancelled call was answered: {next}");
}
