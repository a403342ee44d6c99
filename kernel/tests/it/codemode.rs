//! `codemode.*` over a real WebSocket: a user's blocks (`codemode.run`),
//! their bounds, and `CodeMode` as the model's tool against the scripted
//! model server.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{TestKernel, err_of};
use crate::proc::{Reply, answer, setup, tool};

async fn run(c: &mut gsv_kernel::client::GsvClient, args: Value) -> Value {
    c.call("codemode.run", args).await.unwrap()
}

#[tokio::test]
async fn a_block_returns_its_value_and_logs() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let r = run(
        &mut a,
        json!({"code": "console.log('adding', 1, {x: 1}); return 1 + 1;"}),
    )
    .await;
    assert_eq!(
        r,
        json!({"status": "completed", "result": 2, "logs": ["adding 1 {\"x\":1}"]})
    );
    let r = run(
        &mut a,
        json!({"code": "return {argv, args};", "argv": ["a", "b"], "args": {"n": 3}}),
    )
    .await;
    assert_eq!(r["result"], json!({"argv": ["a", "b"], "args": {"n": 3}}));
}

#[tokio::test]
async fn fs_globals_are_the_callers_fs_calls() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let r = run(
        &mut a,
        json!({"code": "await fs.write({path: 'cm.txt', content: 'hello\\nworld'}); \
                        await fs.edit({path: 'cm.txt', oldString: 'world', newString: 'there'}); \
                        const r = await fs.read('cm.txt'); \
                        const found = await fs.search({query: 'there'}); \
                        return {content: r.content, found: JSON.stringify(found).includes('cm.txt')};"}),
    )
    .await;
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["result"]["content"], "1\thello\n2\tthere");
    assert_eq!(r["result"]["found"], true);
    // The file is the user's, seen outside the block too.
    let read = a
        .call("fs.read", json!({"path": "~/cm.txt"}))
        .await
        .unwrap();
    assert_eq!(read["content"], "1\thello\n2\tthere");
    // A failing call throws inside the block; caught, the block goes on.
    let r = run(
        &mut a,
        json!({"code": "try { await fs.read('/home/bob/x'); } catch (e) { return 'caught: ' + e.message; }"}),
    )
    .await;
    assert_eq!(r["status"], "completed", "{r}");
    assert!(r["result"].as_str().unwrap().starts_with("caught: "), "{r}");
    // Bob cannot be reached through a block either.
    let r = run(
        &mut a,
        json!({"code": "return await syscall('codemode.run', {code: 'return 1'});"}),
    )
    .await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(
        r["error"],
        "Error: codemode.run cannot be called from inside CodeMode"
    );
}

#[tokio::test]
async fn a_throwing_block_fails_with_its_message_and_the_logs_so_far() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let r = run(
        &mut a,
        json!({"code": "console.log('step 1'); throw new Error('boom');"}),
    )
    .await;
    assert_eq!(
        r,
        json!({"status": "failed", "error": "Error: boom", "logs": ["step 1"]})
    );
}

#[tokio::test]
async fn a_runaway_loop_fails_at_the_deadline_and_the_kernel_keeps_serving() {
    let k =
        TestKernel::with_users_tuned(|c| c.codemode_deadline = Duration::from_millis(500)).await;
    let mut a = k.alice().await;
    let r = run(
        &mut a,
        json!({"code": "console.log('spinning'); while (true) {}"}),
    )
    .await;
    assert_eq!(r["status"], "failed", "{r}");
    assert_eq!(
        r["error"],
        "CodeMode stopped: the block ran past its time limit of 500 ms"
    );
    assert_eq!(r["logs"], json!(["spinning"]));
    // Still serving, blocks included.
    let r = run(&mut a, json!({"code": "return 'alive';"})).await;
    assert_eq!(r["result"], "alive");
    a.call("proc.list", json!({})).await.unwrap();
}

#[tokio::test]
async fn a_memory_bomb_and_a_stack_overflow_fail_clearly() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let r = run(
        &mut a,
        json!({"code": "const a = []; for (;;) a.push('x'.repeat(1 << 20) + a.length);"}),
    )
    .await;
    assert_eq!(r["status"], "failed", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(e.contains("ran out of memory (limit 64 MiB)"), "{e}");
    let r = run(
        &mut a,
        json!({"code": "const f = (n) => f(n + 1) + 1; return f(0);"}),
    )
    .await;
    assert_eq!(r["status"], "failed", "{r}");
    let e = r["error"].as_str().unwrap();
    assert!(e.contains("overflowed its stack"), "{e}");
    // Still serving, blocks included.
    let r = run(&mut a, json!({"code": "return 'alive';"})).await;
    assert_eq!(r["result"], "alive");
    a.call("proc.list", json!({})).await.unwrap();
}

#[tokio::test]
async fn codemode_exec_is_internal_and_another_users_process_is_refused() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let f = a
        .request("codemode.exec", json!({"code": "return 1"}))
        .await
        .unwrap();
    assert_eq!(
        err_of(&f),
        (403, "Permission denied: codemode.exec".to_owned())
    );
    let mut b = k.bob().await;
    let pid = b.call("proc.spawn", json!({})).await.unwrap()["pid"].clone();
    let f = a
        .request("codemode.run", json!({"pid": pid, "code": "return 1"}))
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403, "{f}");
    // Bob's own process runs it, in its cwd.
    let r = run(
        &mut b,
        json!({"pid": pid, "code": "return (await fs.read('.')).path;"}),
    )
    .await;
    assert_eq!(r["result"], "/home/bob", "{r}");
}

#[tokio::test]
async fn the_model_runs_codemode_and_nested_deletes_ask_for_approval() {
    let code = "await fs.write({path: 'made.txt', content: 'by code'}); \
                await fs.delete({path: 'made.txt'}); \
                console.log('deleted'); return 'done';";
    let (_k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool("c1", "CodeMode", json!({"code": code}))]),
            answer("finished"),
        ],
        &[],
    )
    .await;
    let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "use code"}))
        .await;
    let req = a.signal("proc.run.hil.requested", |_| true).await;
    assert_eq!(req["syscall"], "fs.delete");
    assert_eq!(req["toolName"], "CodeMode");
    a.call(
        "proc.hil",
        json!({"requestId": req["requestId"], "decision": "approve"}),
    )
    .await;
    let done = a
        .signal("proc.run.tool.finished", |p| p["toolCallId"] == "c1")
        .await;
    assert_eq!(done["isError"], false, "{done}");
    assert_eq!(
        done["output"],
        json!({"status": "completed", "result": "done", "logs": ["deleted"]})
    );
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["text"], "finished");
    // The model was offered CodeMode, and saw the block's result.
    let reqs = m.requests();
    let names: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["function"]["name"].as_str())
        .collect();
    assert!(names.contains(&"CodeMode"), "{names:?}");
    let last = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["role"], "tool");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("\"result\":\"done\""),
        "{last}"
    );
}

#[tokio::test]
async fn a_failed_block_is_a_tool_error_for_the_model() {
    let (_k, _m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool(
                "c1",
                "CodeMode",
                json!({"code": "throw new Error('bad');"}),
            )]),
            answer("ok"),
        ],
        &[],
    )
    .await;
    let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
    a.call("proc.send", json!({"pid": pid, "message": "go"}))
        .await;
    let done = a
        .signal("proc.run.tool.finished", |p| p["toolCallId"] == "c1")
        .await;
    assert_eq!(done["isError"], true, "{done}");
    assert_eq!(done["error"]["error"], "Error: bad");
}
