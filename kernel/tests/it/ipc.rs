//! `proc.ipc.*` and `signal.watch|unwatch` over a real WebSocket against
//! the scripted model server: a process's own calls are made with
//! `codemode.run {pid}` (the block's `syscall()` runs as that process).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::harness::{BOB_PW, TestKernel, err_of, eventually};
use crate::proc::{Reply, Watcher, answer, setup, text};

/// Runs `call(args)` inside process `pid`; the block's result.
async fn as_process(a: &mut Watcher, pid: &Value, call: &str, args: Value) -> Value {
    a.call(
        "codemode.run",
        json!({"pid": pid, "code": format!("return await syscall({call:?}, {args});")}),
    )
    .await
}

/// `call` made by process `pid`, which must fail; its error text.
async fn refused_in_process(a: &mut Watcher, pid: &Value, call: &str, args: Value) -> String {
    let r = as_process(a, pid, call, args).await;
    assert_eq!(r["status"], "failed", "{call}: {r}");
    r["error"].as_str().unwrap().to_owned()
}

async fn spawn(a: &mut Watcher, label: &str) -> Value {
    a.call("proc.spawn", json!({"label": label})).await["pid"].clone()
}

async fn count(k: &TestKernel, sql: &'static str) -> i64 {
    k.kernel
        .db()
        .call(move |c| Ok(c.query_row(sql, [], |r| r.get(0))?))
        .await
        .unwrap()
}

fn contents(request: &Value) -> String {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test]
async fn a_call_between_two_processes_is_answered_by_the_targets_run_and_runs_the_caller() {
    let (k, m, mut a) = setup(vec![answer("4"), answer("B says 4; noted.")], &[]).await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    let r = as_process(
        &mut a,
        &pa,
        "proc.ipc.call",
        json!({"pid": pb, "message": "what is 2+2?", "metadata": {"topic": "math"}}),
    )
    .await;
    assert_eq!(r["status"], "completed", "{r}");
    let call = r["result"].clone();
    assert_eq!(call["ok"], true);
    assert_eq!(call["status"], "started");
    assert_eq!(call["pid"], pb);
    assert_eq!(call["sourcePid"], pa);
    assert_eq!(call["conversationId"], "default");
    assert!(
        call["callId"].as_str().unwrap().starts_with("ipc_"),
        "{call}"
    );
    assert!(call["deadlineAt"].as_i64().unwrap() > 0);
    // B answers in the run the request started.
    let fin_b = a.finished(&call["runId"]).await;
    assert_eq!(fin_b["pid"], pb);
    assert_eq!(fin_b["text"], "4");
    let id = call["callId"].clone();
    let reply = a.signal("ipc.reply", |p| p["callId"] == id).await;
    assert_eq!(reply["status"], "completed", "{reply}");
    assert_eq!(reply["response"]["text"], "4");
    assert_eq!(reply["sourcePid"], pa);
    assert_eq!(reply["targetPid"], pb);
    assert_eq!(reply["runId"], call["runId"]);
    assert!(reply.get("error").is_none(), "{reply}");
    // The reply is a message to A, which starts a run there.
    let started = a.signal("proc.run.started", |p| p["pid"] == pa).await;
    let fin_a = a.finished(&started["runId"]).await;
    assert_eq!(fin_a["text"], "B says 4; noted.");
    let requests = m.requests();
    assert_eq!(requests.len(), 2);
    let to_b = contents(&requests[0]);
    assert!(to_b.contains("what is 2+2?"), "{to_b}");
    assert!(
        to_b.contains(&format!("from {}", pa.as_str().unwrap())),
        "{to_b}"
    );
    assert!(to_b.contains("\"topic\":\"math\""), "{to_b}");
    let to_a = contents(&requests[1]);
    assert!(
        to_a.contains(&format!("answered by {}:\n4", pb.as_str().unwrap())),
        "{to_a}"
    );
    // B's stored request carries its envelope.
    let h = a.call("proc.history", json!({"pid": pb})).await;
    let first = &h["messages"][0];
    assert_eq!(first["role"], "user");
    assert_eq!(first["ipc"]["sourcePid"], pa);
    assert_eq!(first["ipc"]["callId"], id);
    assert_eq!(first["ipc"]["metadata"], json!({"topic": "math"}));
    // Delivered: neither the call nor its deadline is left.
    assert_eq!(count(&k, "SELECT count(*) FROM ipc_calls").await, 0);
    assert_eq!(
        count(&k, "SELECT count(*) FROM timers WHERE kind = 'ipc'").await,
        0
    );
}

#[tokio::test]
async fn a_send_starts_a_run_of_the_target_and_expects_no_reply() {
    let (k, m, mut a) = setup(vec![answer("hello A")], &[]).await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    let r = as_process(
        &mut a,
        &pa,
        "proc.ipc.send",
        json!({"pid": pb, "message": "hi B", "conversationId": "inbox"}),
    )
    .await;
    let sent = r["result"].clone();
    assert_eq!(sent["ok"], true, "{r}");
    assert_eq!(sent["pid"], pb);
    assert_eq!(sent["sourcePid"], pa);
    assert_eq!(sent["conversationId"], "inbox");
    assert!(sent.get("callId").is_none(), "{sent}");
    let fin = a.finished(&sent["runId"]).await;
    assert_eq!(fin["conversationId"], "inbox");
    assert_eq!(fin["text"], "hello A");
    let to_b = contents(&m.requests()[0]);
    assert!(
        to_b.contains(&format!(
            "[IPC message from {}]\nhi B",
            pa.as_str().unwrap()
        )),
        "{to_b}"
    );
    assert_eq!(count(&k, "SELECT count(*) FROM ipc_calls").await, 0);
    let h = a.call("proc.history", json!({"pid": pa})).await;
    assert_eq!(h["messageCount"], 0, "A got nothing back: {h}");
}

#[tokio::test]
async fn a_call_past_its_deadline_times_out_and_the_caller_hears_it() {
    let (_k, m, mut a) = setup(vec![Reply::Hang, answer("gave up on B")], &[]).await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    let before = gsv_now();
    // 1 ms is clamped to the 1 s floor.
    let r = as_process(
        &mut a,
        &pa,
        "proc.ipc.call",
        json!({"pid": pb, "message": "take your time", "timeoutMs": 1}),
    )
    .await;
    let call = r["result"].clone();
    let deadline = call["deadlineAt"].as_i64().unwrap();
    assert!(deadline >= before + 1000, "{call}");
    assert!(deadline <= gsv_now() + 1000, "{call}");
    let id = call["callId"].clone();
    let timeout = a.signal("ipc.timeout", |p| p["callId"] == id).await;
    assert_eq!(timeout["status"], "timed_out");
    assert_eq!(timeout["error"], "IPC call timed out");
    assert!(timeout.get("response").is_none(), "{timeout}");
    let started = a.signal("proc.run.started", |p| p["pid"] == pa).await;
    assert_eq!(a.finished(&started["runId"]).await["text"], "gave up on B");
    let to_a = contents(&m.requests()[1]);
    assert!(to_a.contains("timed out"), "{to_a}");
    // B's run ends later; the settled call is not answered twice.
    a.call("proc.abort", json!({"pid": pb})).await;
    a.finished(&call["runId"]).await;
}

#[tokio::test]
async fn killing_the_target_fails_its_pending_calls() {
    let gate = Arc::new(Notify::new());
    let (k, _m, mut a) = setup(
        vec![
            Reply::Gated(vec![text("thinking")], gate.clone()),
            answer("B died"),
        ],
        &[],
    )
    .await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    let r = as_process(
        &mut a,
        &pa,
        "proc.ipc.call",
        json!({"pid": pb, "message": "long job", "timeoutMs": 600000}),
    )
    .await;
    let call = r["result"].clone();
    let run_b = call["runId"].clone();
    a.signal("proc.run.stream", |p| p["runId"] == run_b).await;
    a.call("proc.kill", json!({"pid": pb})).await;
    let id = call["callId"].clone();
    let reply = a.signal("ipc.reply", |p| p["callId"] == id).await;
    assert_eq!(reply["status"], "completed");
    let error = reply["error"].as_str().unwrap();
    assert!(error.contains("was reset or killed"), "{error}");
    let started = a.signal("proc.run.started", |p| p["pid"] == pa).await;
    assert_eq!(a.finished(&started["runId"]).await["text"], "B died");
    assert_eq!(count(&k, "SELECT count(*) FROM ipc_calls").await, 0);
    assert_eq!(
        count(&k, "SELECT count(*) FROM timers WHERE kind = 'ipc'").await,
        0
    );
    gate.notify_one();
}

#[tokio::test]
async fn ipc_is_refused_to_sockets_other_users_processes_and_bad_arguments() {
    let (k, _m, mut a) = setup(vec![], &[]).await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    for call in ["proc.ipc.send", "proc.ipc.call"] {
        let f = a
            .request(call, json!({"pid": pb, "message": "from a socket"}))
            .await;
        let (code, msg) = err_of(&f);
        assert_eq!(code, 403, "{f}");
        assert!(msg.contains("requires a process caller"), "{msg}");
    }
    let envelope = json!({"sourcePid": pa, "source": {}, "message": "forged", "sentAt": 1});
    let f = a.request("proc.ipc.deliver", envelope.clone()).await;
    assert_eq!(
        err_of(&f),
        (403, "Permission denied: proc.ipc.deliver".to_owned())
    );
    // Kernel-only: a process cannot forge an envelope either.
    let e = refused_in_process(&mut a, &pa, "proc.ipc.deliver", envelope).await;
    assert!(e.contains("Permission denied: proc.ipc.deliver"), "{e}");
    let mut b = Watcher::new(k.login("bob", BOB_PW).await);
    let bobs = spawn(&mut b, "bob's").await;
    for pid in [bobs.clone(), json!("proc:no-such-process")] {
        let e = refused_in_process(
            &mut a,
            &pa,
            "proc.ipc.send",
            json!({"pid": pid, "message": "hi"}),
        )
        .await;
        assert!(e.contains("Access denied to process"), "{e}");
    }
    let e = refused_in_process(
        &mut a,
        &pa,
        "proc.ipc.call",
        json!({"pid": pa, "message": "me?"}),
    )
    .await;
    assert!(e.contains("cannot message itself"), "{e}");
    let e = refused_in_process(
        &mut a,
        &pa,
        "proc.ipc.send",
        json!({"pid": pb, "message": "  "}),
    )
    .await;
    assert!(e.contains("message: must not be empty"), "{e}");
    // Nothing reached anyone, nothing is pending.
    for pid in [&pa, &pb] {
        let h = a.call("proc.history", json!({"pid": pid})).await;
        assert_eq!(h["messageCount"], 0, "{h}");
    }
    assert_eq!(
        b.call("proc.history", json!({"pid": bobs})).await["messageCount"],
        0
    );
    assert_eq!(count(&k, "SELECT count(*) FROM ipc_calls").await, 0);
}

#[tokio::test]
async fn a_watch_on_another_process_fires_a_run_in_the_watcher_once() {
    let (k, m, mut a) = setup(
        vec![
            answer("B done"),
            answer("A saw B finish"),
            answer("B again"),
        ],
        &[],
    )
    .await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    let w = as_process(
        &mut a,
        &pa,
        "signal.watch",
        json!({"signal": "proc.run.finished", "processId": pb, "key": "b-done",
               "state": {"step": 1}}),
    )
    .await["result"]
        .clone();
    assert_eq!(w["created"], true, "{w}");
    let day = 24 * 60 * 60 * 1000;
    assert_eq!(
        w["expiresAt"].as_i64().unwrap() - w["createdAt"].as_i64().unwrap(),
        day
    );
    // The same key replaces the watch: same id, new state.
    let again = as_process(
        &mut a,
        &pa,
        "signal.watch",
        json!({"signal": "proc.run.finished", "processId": pb, "key": "b-done",
               "state": {"step": 2}}),
    )
    .await["result"]
        .clone();
    assert_eq!(again["created"], false, "{again}");
    assert_eq!(again["watchId"], w["watchId"]);
    assert_eq!(again["createdAt"], w["createdAt"]);
    assert_eq!(count(&k, "SELECT count(*) FROM signal_watches").await, 1);
    let sent = a
        .call("proc.send", json!({"pid": pb, "message": "work"}))
        .await;
    assert_eq!(a.finished(&sent["runId"]).await["text"], "B done");
    let started = a.signal("proc.run.started", |p| p["pid"] == pa).await;
    assert_eq!(
        a.finished(&started["runId"]).await["text"],
        "A saw B finish"
    );
    let to_a = contents(&m.requests()[1]);
    assert!(
        to_a.contains(&format!(
            "[signal.watch] proc.run.finished from {} (watch b-done)",
            pb.as_str().unwrap()
        )),
        "{to_a}"
    );
    assert!(to_a.contains("B done"), "{to_a}");
    let h = a.call("proc.history", json!({"pid": pa})).await;
    let event = &h["messages"][0]["signalWatch"];
    assert_eq!(event["watched"], true);
    assert_eq!(event["sourcePid"], pb);
    assert_eq!(event["watch"]["key"], "b-done");
    assert_eq!(event["watch"]["state"], json!({"step": 2}));
    // `once`: fired and gone, so B's next run wakes nobody.
    assert_eq!(count(&k, "SELECT count(*) FROM signal_watches").await, 0);
    let sent = a
        .call("proc.send", json!({"pid": pb, "message": "more"}))
        .await;
    assert_eq!(a.finished(&sent["runId"]).await["text"], "B again");
    assert_eq!(m.requests().len(), 3);
}

#[tokio::test]
async fn watch_ttls_are_clamped_and_an_expired_watch_is_removed() {
    let (k, _m, mut a) = setup(vec![], &[]).await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    let watch = |ttl: i64| json!({"signal": "proc.changed", "processId": pb, "ttlMs": ttl});
    let short = as_process(&mut a, &pa, "signal.watch", watch(10)).await["result"].clone();
    let ttl = |w: &Value| w["expiresAt"].as_i64().unwrap() - w["createdAt"].as_i64().unwrap();
    assert_eq!(ttl(&short), 1000, "{short}");
    let long = as_process(&mut a, &pa, "signal.watch", watch(i64::MAX / 2)).await["result"].clone();
    assert_eq!(ttl(&long), 30 * 24 * 60 * 60 * 1000, "{long}");
    assert_ne!(short["watchId"], long["watchId"]);
    // The expiry timer removes the short one; the long one stays.
    eventually("the 1 s watch to expire", || async {
        (count(&k, "SELECT count(*) FROM signal_watches").await == 1).then_some(())
    })
    .await;
    let r = as_process(
        &mut a,
        &pa,
        "signal.unwatch",
        json!({"watchId": long["watchId"]}),
    )
    .await;
    assert_eq!(r["result"], json!({"removed": 1}));
    assert_eq!(count(&k, "SELECT count(*) FROM signal_watches").await, 0);
    assert_eq!(
        count(
            &k,
            "SELECT count(*) FROM timers WHERE kind = 'signal-watch'"
        )
        .await,
        0
    );
}

#[tokio::test]
async fn watches_are_refused_to_sockets_self_watchers_and_other_users() {
    let (k, _m, mut a) = setup(vec![], &[]).await;
    let pa = spawn(&mut a, "A").await;
    let pb = spawn(&mut a, "B").await;
    let f = a
        .request(
            "signal.watch",
            json!({"signal": "proc.run.finished", "processId": pb}),
        )
        .await;
    let (code, msg) = err_of(&f);
    assert_eq!(code, 403);
    assert!(msg.contains("requires a process caller"), "{msg}");
    let f = a.request("signal.unwatch", json!({"key": "x"})).await;
    assert_eq!(err_of(&f).0, 403);
    let e = refused_in_process(
        &mut a,
        &pa,
        "signal.watch",
        json!({"signal": "proc.run.finished", "processId": pa}),
    )
    .await;
    assert!(e.contains("cannot watch itself"), "{e}");
    let e = refused_in_process(
        &mut a,
        &pa,
        "signal.watch",
        json!({"signal": "proc.run.finished"}),
    )
    .await;
    assert!(e.contains("processId"), "{e}");
    let e = refused_in_process(
        &mut a,
        &pa,
        "signal.watch",
        json!({"signal": " ", "processId": pb}),
    )
    .await;
    assert!(e.contains("signal: must not be empty"), "{e}");
    let e = refused_in_process(
        &mut a,
        &pa,
        "signal.unwatch",
        json!({"watchId": "w", "key": "k"}),
    )
    .await;
    assert!(e.contains("exactly one of watchId and key"), "{e}");
    // Bob's process and Bob's watch are out of Alice's reach.
    let mut b = Watcher::new(k.login("bob", BOB_PW).await);
    let b1 = spawn(&mut b, "b1").await;
    let b2 = spawn(&mut b, "b2").await;
    let e = refused_in_process(
        &mut a,
        &pa,
        "signal.watch",
        json!({"signal": "proc.run.finished", "processId": b1}),
    )
    .await;
    assert!(e.contains("Access denied to process"), "{e}");
    let bobs = as_process(
        &mut b,
        &b1,
        "signal.watch",
        json!({"signal": "proc.run.finished", "processId": b2, "key": "mine"}),
    )
    .await["result"]
        .clone();
    for args in [json!({"watchId": bobs["watchId"]}), json!({"key": "mine"})] {
        let r = as_process(&mut a, &pa, "signal.unwatch", args).await;
        assert_eq!(r["result"], json!({"removed": 0}), "{r}");
    }
    assert_eq!(count(&k, "SELECT count(*) FROM signal_watches").await, 1);
}

fn gsv_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}
