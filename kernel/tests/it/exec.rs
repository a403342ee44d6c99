//! `shell.exec` on workspaces backed by real `wsd` children.

use std::time::Duration;

use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};

use crate::harness::{
    ALICE_PW, TestKernel, Watcher, bwrap_available, err_of, new_workspace, wsd_bin,
};

/// Starts `input` at the root of workspace `id`, waiting up to `yield_ms`.
async fn exec_in(c: &mut GsvClient, id: &str, input: &str, yield_ms: u64) -> Value {
    c.call(
        "shell.exec",
        json!({"cwd": format!("/workspaces/{id}"), "input": input, "yieldMs": yield_ms}),
    )
    .await
    .unwrap()
}

/// Polls a session until it is over (bounded: 120 polls of ≤ 1 s).
async fn until_done(c: &mut GsvClient, mut d: Value) -> Value {
    for _ in 0..120 {
        if d["status"] != "running" {
            return d;
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
    panic!("the command never finished: {d}");
}

#[tokio::test]
async fn the_exec_bracket_carries_files_both_ways() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    a.call(
        "fs.write",
        json!({"path": format!("/workspaces/{id}/in/hello.txt"), "content": "from dofs\n"}),
    )
    .await
    .unwrap();
    let d = a
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{id}/in"), "input": "cat hello.txt; echo made > ../made.txt", "yieldMs": 10000}),
        )
        .await
        .unwrap();
    let d = until_done(&mut a, d).await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(d["exitCode"], 0);
    assert_eq!(d["output"], "from dofs\n");
    let changed: Vec<&str> = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect();
    assert!(
        changed.contains(&format!("/workspaces/{id}/made.txt").as_str()),
        "{d}"
    );
    let r = a
        .call(
            "fs.read",
            json!({"path": format!("/workspaces/{id}/made.txt")}),
        )
        .await
        .unwrap();
    assert_eq!(r["content"], "1\tmade");
    let d = exec_in(&mut a, &id, "exit 3", 10000).await;
    let d = until_done(&mut a, d).await;
    assert_eq!(
        (d["status"].clone(), d["exitCode"].clone()),
        (json!("completed"), json!(3))
    );
}

#[tokio::test]
async fn a_long_command_answers_running_and_polls_to_completion_for_its_owner_only() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let d = exec_in(&mut a, &id, "echo start; sleep 1; echo done", 50).await;
    assert_eq!(d["status"], "running", "{d}");
    let sid = d["sessionId"].as_str().unwrap().to_owned();
    let mut b = k.bob().await;
    let f = b
        .request("shell.exec", json!({"sessionId": sid, "input": ""}))
        .await
        .unwrap();
    assert_eq!(err_of(&f), (404, format!("Unknown shell session: {sid}")));
    let d = until_done(&mut a, d).await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(d["output"], "start\ndone\n");
    let f = b
        .request(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{id}"), "input": "true"}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403, "bob cannot run in alice's workspace");
}

#[tokio::test]
async fn output_over_the_cap_keeps_the_tail_and_says_truncated() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let d = exec_in(&mut a, &id, "seq 1 60000; echo END", 10000).await;
    let d = until_done(&mut a, d).await;
    assert_eq!(d["truncated"], true, "{}", d["status"]);
    let out = d["output"].as_str().unwrap();
    assert_eq!(out.chars().count(), 200_000);
    assert!(out.ends_with("60000\nEND\n"));
}

#[tokio::test]
async fn a_wsd_killed_mid_command_gives_failed_never_success() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let d = exec_in(&mut a, &id, "sleep 30", 50).await;
    assert_eq!(d["status"], "running");
    let pid = k
        .kernel
        .workspaces()
        .local_pid(&id)
        .await
        .expect("a local wsd");
    std::process::Command::new("kill")
        .arg("-9")
        .arg(pid.to_string())
        .status()
        .unwrap();
    let d = until_done(&mut a, d).await;
    assert_eq!(d["status"], "failed", "{d}");
    // The next command restarts the child and works again.
    let d = exec_in(&mut a, &id, "echo back", 10000).await;
    let d = until_done(&mut a, d).await;
    assert_eq!(
        (d["status"].clone(), d["output"].clone()),
        (json!("completed"), json!("back\n"))
    );
}

#[tokio::test]
async fn a_duplicate_in_flight_id_is_409_and_a_cancelled_request_never_answers() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let args = json!({"cwd": format!("/workspaces/{id}"), "input": "sleep 20", "yieldMs": 20000});
    a.send_request("dup", "shell.exec", args.clone())
        .await
        .unwrap();
    a.send_request("dup", "shell.exec", args).await.unwrap();
    let f = a.response_to("dup").await.unwrap();
    assert_eq!(err_of(&f), (409, "Duplicate request: dup".into()));
    a.send_text(
        json!({"type": "sig", "signal": "request.cancel", "payload": {"id": "dup"}}).to_string(),
    )
    .await
    .unwrap();
    a.send_request("after", "fs.read", json!({"path": "~"}))
        .await
        .unwrap();
    let f = a.recv().await.unwrap();
    assert_eq!(
        f["id"], "after",
        "the cancelled request must not answer: {f}"
    );
    // The id is free again once cancelled.
    a.send_request("dup", "fs.read", json!({"path": "~"}))
        .await
        .unwrap();
    assert_eq!(a.response_to("dup").await.unwrap()["ok"], true);
}

#[tokio::test]
async fn a_remote_backend_workspace_runs_on_an_existing_wsd() {
    let k = TestKernel::with_users().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "remote-secret-token").unwrap();
    let sock = dir.path().join("wsd.sock");
    let mut child = tokio::process::Command::new(wsd_bin())
        .arg("serve")
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--state")
        .arg(dir.path().join("state"))
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--token-file")
        .arg(&token)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    for _ in 0..500 {
        if tokio::net::UnixStream::connect(&sock).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut root = k.login("root", "root-password").await;
    let d = root
        .call(
            "sys.workspace.create",
            json!({"backend": {"kind": "remote", "address": format!("unix:{}", sock.display()), "tokenFile": token}}),
        )
        .await
        .unwrap();
    let id = d["workspace"]["workspaceId"].as_str().unwrap().to_owned();
    assert_eq!(d["workspace"]["backend"]["kind"], "remote");
    let d = exec_in(&mut root, &id, "echo remote > r.txt", 10000).await;
    let d = until_done(&mut root, d).await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("root/r.txt")).unwrap(),
        "remote\n"
    );
    let r = root
        .call(
            "fs.read",
            json!({"path": format!("/workspaces/{id}/r.txt")}),
        )
        .await
        .unwrap();
    assert_eq!(r["content"], "1\tremote");
    child.kill().await.unwrap();
}

#[tokio::test]
async fn an_idle_local_wsd_is_stopped_and_started_again_on_next_use() {
    let k = TestKernel::start_with(|c| c.wsd_idle_stop = Duration::from_millis(200)).await;
    k.setup().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let run =
        json!({"cwd": format!("/workspaces/{id}"), "input": "echo one > f", "yieldMs": 10000});
    let first = a.call("shell.exec", run).await.unwrap();
    let d = until_done(&mut a, first).await;
    assert_eq!(d["status"], "completed", "{d}");
    let mut stopped = false;
    for _ in 0..200 {
        if k.kernel.workspaces().local_pid(&id).await.is_none() {
            stopped = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(stopped, "the idle child was never stopped");
    let run = json!({"cwd": format!("/workspaces/{id}"), "input": "cat f", "yieldMs": 10000});
    let again = a.call("shell.exec", run).await.unwrap();
    let d = until_done(&mut a, again).await;
    assert_eq!(d["output"], "one\n", "{d}");
}

#[tokio::test]
async fn a_running_command_reads_what_later_calls_write_to_its_stdin() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let d = a
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{id}"), "input": "read line; echo got:$line",
                   "yieldMs": 250, "openStdin": true}),
        )
        .await
        .unwrap();
    assert_eq!(d["status"], "running", "{d}");
    let sid = d["sessionId"].as_str().unwrap().to_owned();
    let mut b = k.bob().await;
    let f = b
        .request(
            "shell.exec",
            json!({"sessionId": sid, "input": "mallory\n"}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 404, "nobody else writes to the session");
    let d = a
        .call(
            "shell.exec",
            json!({"sessionId": sid, "input": "hello\n", "yieldMs": 10000}),
        )
        .await
        .unwrap();
    let d = until_done(&mut a, d).await;
    assert_eq!(
        (d["status"].clone(), d["output"].clone()),
        (json!("completed"), json!("got:hello\n"))
    );
}

/// A wsd call's typed error reaches the caller as its code (`ELIMIT`
/// here: a stdin write over the wsd's limit), not only as prose, and
/// leaves the command running.
#[tokio::test]
async fn a_wsd_error_reaches_the_caller_as_its_code() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let d = a
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{id}"), "input": "read line; echo got:$line",
                   "yieldMs": 250, "openStdin": true}),
        )
        .await
        .unwrap();
    assert_eq!(d["status"], "running", "{d}");
    let sid = d["sessionId"].as_str().unwrap().to_owned();
    let huge = "x".repeat(wsd_client::limits::MAX_STDIN_WRITE_BYTES + 1);
    let d = a
        .call("shell.exec", json!({"sessionId": sid, "input": huge}))
        .await
        .unwrap();
    assert_eq!(
        (&d["ok"], &d["code"]),
        (&json!(false), &json!("ELIMIT")),
        "{d}"
    );
    let d = a
        .call(
            "shell.exec",
            json!({"sessionId": sid, "input": "hello\n", "yieldMs": 10000}),
        )
        .await
        .unwrap();
    let d = until_done(&mut a, d).await;
    assert_eq!(d["output"], "got:hello\n", "{d}");
}

#[tokio::test]
async fn an_unreachable_wsd_fails_the_call_before_anything_runs() {
    let k = TestKernel::with_users().await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    std::fs::write(&token, "t").unwrap();
    let mut root = k.login("root", "root-password").await;
    let d = root
        .call(
            "sys.workspace.create",
            json!({"backend": {"kind": "remote", "address": format!("unix:{}", dir.path().join("none.sock").display()), "tokenFile": token}}),
        )
        .await
        .unwrap();
    let id = d["workspace"]["workspaceId"].as_str().unwrap().to_owned();
    root.call(
        "fs.write",
        json!({"path": format!("/workspaces/{id}/f"), "content": "x"}),
    )
    .await
    .unwrap();
    let d = exec_in(&mut root, &id, "touch ran", 10000).await;
    assert_eq!(d["status"], "failed", "{d}");
    assert!(
        d["error"].as_str().unwrap().contains("none.sock"),
        "names the address: {d}"
    );
    assert!(d.get("sessionId").is_none(), "nothing started: {d}");
}

/// The reference CLI's `gsv shell` sends `shell.exec {input}` with no cwd,
/// no workspace and no target, and prints only `stdout`, `stderr` and a
/// non-zero `exitCode` of the answer.
#[tokio::test]
async fn a_shell_exec_without_workspace_or_target_explains_itself_on_stderr() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let d = a
        .call("shell.exec", json!({"input": "echo hi"}))
        .await
        .unwrap();
    assert_eq!(d["ok"], false, "still an operation error: {d}");
    assert_eq!(d["status"], "failed", "{d}");
    assert_eq!(d["stdout"], "");
    let stderr = d["stderr"].as_str().unwrap();
    assert!(
        stderr.contains("/workspaces/<id>") && stderr.contains("/home/alice"),
        "says what to do and where it was asked to run: {stderr}"
    );
    assert!(stderr.ends_with('\n'), "prints as a whole line: {stderr:?}");
    assert_eq!(d["error"].as_str().unwrap(), stderr.trim_end());
    assert!(d.get("exitCode").is_none(), "nothing ran, so no exit code");
    assert!(d.get("sessionId").is_none(), "nothing to poll");
}

/// The local backend's default: commands see their workspace, not the
/// host (the kernel's data directory beside it, its token, `/etc/hostname`).
/// `gsv serve --no-sandbox` (`wsd_sandbox = false`) runs them on the host.
#[tokio::test]
async fn local_workspace_commands_are_sandboxed_unless_turned_off() {
    if !bwrap_available() {
        eprintln!("bwrap is not installed: sandbox test skipped");
        return;
    }
    let probe = "hostname; cd .. && ls -A; cat wsd.token ../kernel.sqlite3 2>/dev/null | wc -c";
    for sandbox in [true, false] {
        let k = TestKernel::start_with(|c| c.wsd_sandbox = sandbox).await;
        k.setup().await;
        let mut a = k.alice().await;
        let id = new_workspace(&mut a).await;
        let started = exec_in(&mut a, &id, probe, 10000).await;
        let d = until_done(&mut a, started).await;
        assert_eq!(d["status"], "completed", "{d}");
        let out = d["output"].as_str().unwrap().to_owned();
        let lines: Vec<&str> = out.lines().collect();
        if sandbox {
            // Beside the workspace root only the root itself: no state,
            // token, socket or log; nothing of them can be read.
            assert_eq!(lines, ["wsd-sandbox", "root", "0"], "{d}");
        } else {
            assert_ne!(lines[0], "wsd-sandbox", "{d}");
            assert!(lines.contains(&"wsd.token"), "{d}");
            assert!(lines.contains(&"state"), "{d}");
            assert_ne!(lines.last(), Some(&"0"), "{d}");
        }
    }
}

#[tokio::test]
async fn a_command_reads_end_of_file_unless_its_stdin_was_asked_open() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    // `cat` with an open stdin would wait for input for ever.
    let d = exec_in(&mut a, &id, "cat; echo eof", 10000).await;
    let d = until_done(&mut a, d).await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(d["output"], "eof\n");
}

/// The calls `gsv exec -i` makes: the command started with its stdin
/// open, bytes written and the pipe closed by control calls that take no
/// output, streamed polls that answer as soon as output is there.
#[tokio::test]
async fn control_calls_write_and_close_stdin_and_streamed_polls_return_each_output() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let d = a
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{id}"), "input": "echo ready; cat; echo \"$GREETING\"",
                   "yieldMs": 250, "openStdin": true, "stream": true,
                   "env": {"GREETING": "bye"}}),
        )
        .await
        .unwrap();
    let sid = d["sessionId"].as_str().unwrap().to_owned();
    // Long polls: only the first line can end them, the command waits on
    // its stdin.
    let mut seen = d["stdout"].as_str().unwrap_or("").to_owned();
    while !seen.contains("ready") {
        let d = a
            .call(
                "shell.exec",
                json!({"sessionId": sid, "input": "", "yieldMs": 30000, "stream": true}),
            )
            .await
            .unwrap();
        assert_eq!(d["status"], "running", "{d}");
        seen.push_str(d["stdout"].as_str().unwrap());
    }
    let c = a
        .call(
            "shell.exec",
            json!({"sessionId": sid, "control": {"stdin": "piped\n", "closeStdin": true}}),
        )
        .await
        .unwrap();
    // Running, or (if the command was quick) already over; either way it
    // carries no output, which the polls return.
    assert_eq!(c["sessionId"], sid.as_str(), "{c}");
    assert!(
        c.get("stdout").is_none() && c.get("output").is_none(),
        "{c}"
    );
    let d = until_done(&mut a, json!({"status": "running", "sessionId": sid})).await;
    assert_eq!(d["status"], "completed", "{d}");
    seen.push_str(d["stdout"].as_str().unwrap());
    assert_eq!(seen, "ready\npiped\nbye\n");
    let mut b = k.bob().await;
    let f = b
        .request(
            "shell.exec",
            json!({"sessionId": sid, "control": {"signal": "KILL"}}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 404, "nobody else controls the session");
}

#[tokio::test]
async fn a_control_signal_stops_the_command() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let d = exec_in(&mut a, &id, "echo started; exec sleep 600", 250).await;
    let sid = d["sessionId"].as_str().unwrap().to_owned();
    let c = a
        .call(
            "shell.exec",
            json!({"sessionId": sid, "control": {"signal": "TERM"}}),
        )
        .await
        .unwrap();
    assert_eq!(c["sessionId"], sid.as_str());
    let d = until_done(&mut a, json!({"status": "running", "sessionId": sid})).await;
    assert_eq!(d["exitCode"], 143, "{d}");
    let bad = a
        .call(
            "shell.exec",
            json!({"sessionId": sid, "control": {"signal": "STOP"}}),
        )
        .await
        .unwrap();
    assert_eq!(bad["ok"], false, "{bad}");
}

#[tokio::test]
async fn a_running_commands_writes_reach_fs_read_and_fs_watch_before_it_ends() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let mut w = Watcher::new(k.login_from("watcher", "alice", ALICE_PW).await);
    let d = w
        .call("fs.watch", json!({"path": format!("/workspaces/{id}")}))
        .await;
    assert_eq!(d["ok"], true, "{d}");
    // The command waits on its stdin, so it is still running whatever the
    // machine's speed, until the test lets it go.
    let d = a
        .call(
            "shell.exec",
            json!({"cwd": format!("/workspaces/{id}"), "input": "echo a > a; read x; echo done-$x",
                   "yieldMs": 100, "openStdin": true}),
        )
        .await
        .unwrap();
    assert_eq!(d["status"], "running", "{d}");
    let sid = d["sessionId"].as_str().unwrap().to_owned();
    let want = format!("/workspaces/{id}/a");
    loop {
        let p = w.signal("fs.changed").await;
        let batch = p["changes"].as_array().unwrap();
        // Level-based: a settle between the create and the write may show
        // the empty file first.
        if batch
            .iter()
            .any(|c| c["path"] == want.as_str() && c["type"] == "file" && c["size"] == 2)
        {
            break;
        }
    }
    let r = a.call("fs.read", json!({"path": want})).await.unwrap();
    assert_eq!(r["content"], "1\ta", "{r}");
    let d = a
        .call("shell.exec", json!({"sessionId": sid, "control": {}}))
        .await
        .unwrap();
    assert_eq!(d["status"], "running", "the command has not ended: {d}");
    let d = a
        .call(
            "shell.exec",
            json!({"sessionId": sid, "input": "x\n", "yieldMs": 10000}),
        )
        .await
        .unwrap();
    let d = until_done(&mut a, d).await;
    assert_eq!(d["status"], "completed", "{d}");
    assert_eq!(d["output"], "done-x\n", "{d}");
    // The result still lists what the live pull brought in while it ran.
    let changed: Vec<&str> = d["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect();
    assert!(changed.contains(&want.as_str()), "{d}");
}

/// Runs `input` at the root of workspace `id` to its end.
async fn run_to_end(c: &mut GsvClient, id: &str, input: &str) -> Value {
    let d = exec_in(c, id, input, 10000).await;
    until_done(c, d).await
}

/// A command after no change skips the push before it, but never after a
/// commit to the workspace: a write from another connection between two
/// commands, or one the first command made, reaches the next one.
#[tokio::test]
async fn a_write_between_two_commands_reaches_the_second_whoever_made_it() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    let cat = "cat note.txt 2>/dev/null || echo none";
    for _ in 0..2 {
        let d = run_to_end(&mut a, &id, cat).await;
        assert_eq!(d["output"], "none\n", "{d}");
    }
    let mut other = k.login_from("second-client", "alice", ALICE_PW).await;
    for round in 0..3 {
        other
            .call(
                "fs.write",
                json!({"path": format!("/workspaces/{id}/note.txt"), "content": format!("round {round}\n")}),
            )
            .await
            .unwrap();
        let d = run_to_end(&mut a, &id, cat).await;
        assert_eq!(d["output"], format!("round {round}\n"), "{d}");
    }
    // What a command wrote (pulled into dofs) then changed there reaches
    // the next command too.
    let d = run_to_end(&mut a, &id, "echo cmd > note.txt").await;
    assert_eq!(d["status"], "completed", "{d}");
    a.call(
        "fs.write",
        json!({"path": format!("/workspaces/{id}/note.txt"), "content": "edited\n"}),
    )
    .await
    .unwrap();
    let d = run_to_end(&mut a, &id, cat).await;
    assert_eq!(d["output"], "edited\n", "{d}");
}

/// The final answer goes out before the session's row is written; a poll
/// right after it still learns that the session was answered.
#[tokio::test]
async fn a_poll_right_after_the_final_answer_says_it_was_answered() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let id = new_workspace(&mut a).await;
    for code in [0, 4] {
        let d = run_to_end(&mut a, &id, &format!("exit {code}")).await;
        assert_eq!(d["exitCode"], code, "{d}");
        let sid = d["sessionId"].as_str().unwrap().to_owned();
        let again = a
            .call("shell.exec", json!({"sessionId": sid, "input": ""}))
            .await
            .unwrap();
        assert_eq!(again["status"], "failed", "{again}");
        assert_eq!(
            again["error"],
            format!("session {sid} already completed and answered"),
            "{again}"
        );
    }
}
