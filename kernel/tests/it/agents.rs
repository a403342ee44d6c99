//! Issue 26 over a real WebSocket and a scripted OpenAI-compatible server:
//! the home process `init:{uid}`, profiles, conversations with their
//! overflow policy, compaction, segments and forks.

use std::io::Read as _;

use serde_json::{Value, json};

use crate::harness::{TestKernel, err_of};
use crate::proc::{Reply, Watcher, answer, configure, setup, text};

/// Decompresses an archive of the system store.
fn archive_lines(k: &TestKernel, path: &str) -> Vec<Value> {
    let p = wsd_sync::SyncPath::canonicalize(path.trim_start_matches('/')).unwrap();
    let gz = k.kernel.system().lock().unwrap().read_file(&p).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn ids(history: &Value) -> Vec<i64> {
    history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_i64().unwrap())
        .collect()
}

fn contents(history: &Value) -> Vec<String> {
    history["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap_or("").to_owned())
        .collect()
}

#[tokio::test]
async fn the_home_process_takes_calls_without_a_pid_and_outlives_kill_and_restart() {
    let (k, m, mut a) = setup(vec![answer("home says hi"), answer("again")], &[]).await;
    // sys.connect started it.
    let list = a.call("proc.list", json!({})).await;
    let home = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["profile"] == "init")
        .cloned()
        .expect("alice's home process");
    let pid = home["pid"].as_str().unwrap().to_owned();
    assert!(pid.starts_with("init:"), "{home}");
    assert_eq!(home["cwd"], "/home/alice");
    // proc.send without a pid goes to it.
    let s = a.call("proc.send", json!({"message": "hello home"})).await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(
        (fin["pid"].as_str(), &fin["text"]),
        (Some(pid.as_str()), &json!("home says hi"))
    );
    let h = a.call("proc.history", json!({})).await;
    assert_eq!(
        (h["pid"].as_str(), &h["conversationId"]),
        (Some(pid.as_str()), &json!("default"))
    );
    assert_eq!(contents(&h), ["hello home", "home says hi"]);
    let first_ids = ids(&h);
    assert!(first_ids[0] < first_ids[1], "{first_ids:?}");
    // proc.spawn {profile:"init"} is the singleton.
    let sp = a.call("proc.spawn", json!({"profile": "init"})).await;
    assert_eq!(
        (sp["pid"].as_str(), &sp["profile"]),
        (Some(pid.as_str()), &json!("init"))
    );
    // A second connection reconciles, it does not add a row.
    let mut again = Watcher::new(k.alice().await);
    let homes = |l: &Value| {
        l["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["profile"] == "init")
            .count()
    };
    assert_eq!(homes(&again.call("proc.list", json!({})).await), 1);
    again.c.close().await;

    // The history survives a restart.
    a.c.close().await;
    let k = k.stop().await.start().await;
    let mut a = Watcher::new(k.alice().await);
    let h = a.call("proc.history", json!({})).await;
    assert_eq!(contents(&h), ["hello home", "home says hi"]);
    assert_eq!(ids(&h), first_ids);
    let s = a
        .call("proc.send", json!({"message": "still there?"}))
        .await;
    assert_eq!(a.finished(&s["runId"]).await["text"], "again");
    assert_eq!(m.requests().len(), 2);

    // The home process is never removed.
    let (code, msg) = err_of(
        &a.request("proc.kill", json!({"pid": pid, "remove": true}))
            .await,
    );
    assert_eq!(code, 400, "{msg}");
    assert!(msg.contains("remove"), "{msg}");
    // Kill clears the state and keeps the row.
    let killed = a.call("proc.kill", json!({"pid": pid})).await;
    assert_eq!(killed["archivedMessages"], 4, "{killed}");
    assert_eq!(killed["archives"][0]["conversationId"], "default");
    let path = killed["archives"][0]["path"].as_str().unwrap().to_owned();
    assert!(
        path.starts_with(&format!("/var/sessions/alice/{}/", pid.replace(':', "-"))),
        "{path}"
    );
    assert_eq!(archive_lines(&k, &path).len(), 4);
    assert_eq!(
        a.call("proc.history", json!({})).await["messages"],
        json!([])
    );
    let conv = a.call("proc.conversation.get", json!({})).await;
    assert_eq!(conv["conversation"]["generation"], 1, "{conv}");
    assert_eq!(homes(&a.call("proc.list", json!({})).await), 1);
    // The archive's directory is listed through fs.read; bob may not look.
    let dir = path.rsplit_once('/').unwrap().0;
    let listing = a.call("fs.read", json!({"path": dir})).await;
    assert_eq!(listing["files"], json!(["default.jsonl.gz"]), "{listing}");
    let mut b = Watcher::new(k.bob().await);
    let f = b.call("fs.read", json!({"path": dir})).await;
    assert_eq!(f["ok"], false, "{f}");
    assert!(
        f["error"].as_str().unwrap().contains("Permission denied"),
        "{f}"
    );
    // Bob's calls without a pid go to bob's home, never alice's.
    let bh = b.call("proc.history", json!({})).await;
    assert_ne!(bh["pid"].as_str(), Some(pid.as_str()));
    assert!(bh["pid"].as_str().unwrap().starts_with("init:"));
    let (code, _) = err_of(&b.request("proc.history", json!({"pid": pid})).await);
    assert_eq!(code, 403);
}

#[tokio::test]
async fn workspace_list_reports_each_workspaces_process_count_and_active_process() {
    let (_k, _m, mut a) = setup(vec![], &[]).await;
    let p1 = a
        .call(
            "proc.spawn",
            json!({"workspace": {"mode": "new", "label": "w"}}),
        )
        .await;
    let ws = p1["workspaceId"].as_str().unwrap().to_owned();
    let p2 = a
        .call(
            "proc.spawn",
            json!({"workspace": {"mode": "attach", "workspaceId": ws}}),
        )
        .await;
    let list = a.call("sys.workspace.list", json!({})).await;
    let w = list["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["workspaceId"] == ws.as_str())
        .cloned()
        .unwrap();
    assert_eq!(w["processCount"], 2, "{w}");
    assert!(
        w["activeProcess"] == p1["pid"] || w["activeProcess"] == p2["pid"],
        "{w}"
    );
}

#[tokio::test]
async fn profiles_are_listed_with_their_flags_and_startable_is_enforced() {
    let write = || {
        Reply::Sse(vec![crate::proc::tool(
            "w1",
            "Write",
            json!({"path": "out.txt", "content": "x"}),
        )])
    };
    let (_k, m, mut a) = setup(
        vec![write(), answer("reviewed"), write(), answer("tasked")],
        &[
            (
                "config/ai/profile/review/context.d/00-review.md",
                "Be skeptical.",
            ),
            (
                "config/ai/profile/review/tools/approval",
                r#"{"rules": [{"match": "fs.write", "action": "deny"}]}"#,
            ),
        ],
    )
    .await;
    let l = a.call("proc.profile.list", json!({})).await;
    let flags: Vec<(String, bool, bool, bool, String)> = l["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["kind"], "system");
            (
                p["id"].as_str().unwrap().to_owned(),
                p["startable"].as_bool().unwrap(),
                p["interactive"].as_bool().unwrap(),
                p["background"].as_bool().unwrap(),
                p["spawnMode"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let f = |id: &str, s, i, b, m: &str| (id.to_owned(), s, i, b, m.to_owned());
    assert_eq!(
        flags,
        vec![
            f("init", true, true, false, "singleton"),
            f("task", true, true, false, "new"),
            f("review", true, true, false, "new"),
            f("mcp", true, true, false, "new"),
            f("app", false, true, false, "new"),
            f("cron", false, false, true, "new"),
        ]
    );
    for p in ["cron", "app"] {
        let (code, msg) = err_of(&a.request("proc.spawn", json!({"profile": p})).await);
        assert_eq!(code, 403, "{msg}");
        assert!(msg.contains("not startable"), "{msg}");
    }
    let (code, msg) = err_of(&a.request("proc.spawn", json!({"profile": "wizard"})).await);
    assert_eq!(code, 400);
    assert!(msg.contains("profile"), "{msg}");
    let before = a.call("proc.list", json!({})).await["processes"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(before, 1, "refused spawns registered nothing");
    // The profile selects its context files.
    let r = a
        .call("proc.spawn", json!({"profile": "review", "prompt": "look"}))
        .await;
    assert_eq!(r["profile"], "review");
    let denied = a
        .signal("proc.run.tool.finished", |p| p["pid"] == r["pid"])
        .await;
    assert_eq!(
        denied["isError"], true,
        "the review profile's policy: {denied}"
    );
    a.finished(&r["runId"]).await;
    let t = a.call("proc.spawn", json!({"prompt": "do"})).await;
    assert_eq!(t["profile"], "task");
    let allowed = a
        .signal("proc.run.tool.finished", |p| p["pid"] == t["pid"])
        .await;
    assert_eq!(allowed["isError"], false, "{allowed}");
    a.finished(&t["runId"]).await;
    let sys = |i: usize| {
        m.requests()[i]["messages"][0]["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        sys(0).contains("[profile.review.00-review.md]\nBe skeptical."),
        "{}",
        sys(0)
    );
    assert!(!sys(2).contains("Be skeptical."), "{}", sys(2));
}

#[tokio::test]
async fn conversations_open_close_reset_and_route_messages() {
    let (k, m, mut a) = setup(vec![answer("in side"), answer("in default")], &[]).await;
    let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
    let o = a
        .call(
            "proc.conversation.open",
            json!({"pid": pid, "conversationId": "side", "title": "  Side talk  "}),
        )
        .await;
    assert_eq!(o["created"], true);
    assert_eq!(o["conversation"]["title"], "Side talk");
    assert_eq!(o["conversation"]["status"], "open");
    let gen_id = a.call("proc.conversation.open", json!({"pid": pid})).await;
    assert!(
        gen_id["conversation"]["id"]
            .as_str()
            .unwrap()
            .starts_with("conv_")
    );
    let s = a
        .call(
            "proc.send",
            json!({"pid": pid, "conversationId": "side", "message": "side question"}),
        )
        .await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["conversationId"], "side");
    // The model saw only the side conversation.
    let req = &m.requests()[0]["messages"];
    assert_eq!(req.as_array().unwrap().len(), 2, "{req}");
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "main question"}))
        .await;
    a.finished(&s["runId"]).await;
    let side = a
        .call(
            "proc.history",
            json!({"pid": pid, "conversationId": "side"}),
        )
        .await;
    assert_eq!(contents(&side), ["side question", "in side"]);
    let main = a.call("proc.history", json!({"pid": pid})).await;
    assert_eq!(contents(&main), ["main question", "in default"]);
    // Paging reads one page; a limit is clamped to 500.
    let page = a
        .call("proc.history", json!({"pid": pid, "limit": 1, "offset": 1}))
        .await;
    assert_eq!(
        (contents(&page), &page["truncated"]),
        (vec!["in default".to_owned()], &json!(false))
    );
    assert_eq!(page["messageCount"], 2);
    let big = a
        .call("proc.history", json!({"pid": pid, "limit": 1000}))
        .await;
    assert_eq!(big["messages"].as_array().unwrap().len(), 2);

    let list = a.call("proc.conversation.list", json!({"pid": pid})).await;
    let counts: Vec<(String, i64)> = list["conversations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["messageCount"].as_i64().unwrap(),
            )
        })
        .collect();
    assert!(
        counts.contains(&("side".into(), 2)) && counts.contains(&("default".into(), 2)),
        "{counts:?}"
    );
    // Closed: sends fail until it is reopened; list hides it unless asked.
    let c = a
        .call(
            "proc.conversation.close",
            json!({"pid": pid, "conversationId": "side"}),
        )
        .await;
    assert_eq!(c["closed"], true);
    let f = a
        .request(
            "proc.send",
            json!({"pid": pid, "conversationId": "side", "message": "x"}),
        )
        .await;
    let (code, msg) = err_of(&f);
    assert_eq!(code, 409, "{msg}");
    assert!(msg.contains("closed"), "{msg}");
    let open_ids = |l: &Value| -> Vec<String> {
        l["conversations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(
        !open_ids(&a.call("proc.conversation.list", json!({"pid": pid})).await)
            .contains(&"side".into())
    );
    assert!(
        open_ids(
            &a.call(
                "proc.conversation.list",
                json!({"pid": pid, "includeClosed": true})
            )
            .await
        )
        .contains(&"side".into())
    );
    let g = a
        .call(
            "proc.conversation.get",
            json!({"pid": pid, "conversationId": "nope"}),
        )
        .await;
    assert_eq!(g["conversation"], Value::Null);
    // Reset archives one conversation, bumps its generation and reopens it.
    let r = a
        .call(
            "proc.conversation.reset",
            json!({"pid": pid, "conversationId": "side"}),
        )
        .await;
    assert_eq!(
        (&r["generation"], &r["archivedMessages"]),
        (&json!(1), &json!(2)),
        "{r}"
    );
    let path = r["archivedTo"].as_str().unwrap();
    assert!(path.contains("/conversations/side/"), "{path}");
    assert_eq!(archive_lines(&k, path).len(), 2);
    let g = a
        .call(
            "proc.conversation.get",
            json!({"pid": pid, "conversationId": "side"}),
        )
        .await;
    assert_eq!(
        (
            &g["conversation"]["status"],
            &g["conversation"]["messageCount"]
        ),
        (&json!("open"), &json!(0))
    );
    assert_eq!(
        contents(&a.call("proc.history", json!({"pid": pid})).await).len(),
        2,
        "default untouched"
    );
    // Bad conversation ids name the argument.
    let (code, msg) = err_of(
        &a.request("proc.history", json!({"pid": pid, "conversationId": "a/b"}))
            .await,
    );
    assert_eq!(code, 400);
    assert!(msg.contains("conversationId"), "{msg}");
}

/// Six messages in `default` of a new process: three exchanges.
async fn three_exchanges(a: &mut Watcher) -> Value {
    let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
    for q in ["q1", "q2", "q3"] {
        let s = a.call("proc.send", json!({"pid": pid, "message": q})).await;
        a.finished(&s["runId"]).await;
    }
    pid
}

#[tokio::test]
async fn compact_archives_a_prefix_behind_a_summary_and_fork_restores_it() {
    let (k, m, mut a) = setup(
        vec![
            answer("a1"),
            answer("a2"),
            answer("a3"),
            answer("The user asked q1 and q2."),
        ],
        &[],
    )
    .await;
    let pid = three_exchanges(&mut a).await;
    let h = a.call("proc.history", json!({"pid": pid})).await;
    let before = ids(&h);
    assert_eq!(before.len(), 6);
    // Bad input changes nothing.
    for (args, needle) in [
        (json!({"pid": pid, "keepLast": 2}), "summary"),
        (
            json!({"pid": pid, "summary": "s", "generateSummary": true, "keepLast": 2}),
            "summary",
        ),
        (json!({"pid": pid, "summary": "s"}), "keepLast"),
        (
            json!({"pid": pid, "summary": "s", "keepLast": 2, "throughMessageId": before[1]}),
            "keepLast",
        ),
        (
            json!({"pid": pid, "summary": "s", "keepLast": -1}),
            "keepLast",
        ),
        (
            json!({"pid": pid, "summary": "s", "throughMessageId": 999_999}),
            "throughMessageId",
        ),
    ] {
        let (code, msg) = err_of(&a.request("proc.conversation.compact", args.clone()).await);
        assert_eq!(code, 400, "{args}: {msg}");
        assert!(msg.contains(needle), "{args}: {msg}");
    }
    assert_eq!(
        ids(&a.call("proc.history", json!({"pid": pid})).await),
        before
    );

    // A caller-written summary, by message id.
    let c = a
        .call(
            "proc.conversation.compact",
            json!({"pid": pid, "summary": "q1 was answered", "throughMessageId": before[1]}),
        )
        .await;
    assert_eq!(c["archivedMessages"], 2, "{c}");
    assert_eq!(c["summaryMessageId"], before[1]);
    let seg1 = c["segment"].clone();
    assert_eq!(
        (&seg1["kind"], &seg1["fromMessageId"], &seg1["toMessageId"]),
        (&json!("compaction"), &json!(before[0]), &json!(before[1]))
    );
    let h = a.call("proc.history", json!({"pid": pid})).await;
    assert_eq!(
        ids(&h),
        [before[1], before[2], before[3], before[4], before[5]]
    );
    assert_eq!(h["messages"][0]["role"], "system");
    assert!(contents(&h)[0].contains("q1 was answered"), "{h}");
    assert_eq!(
        archive_lines(&k, c["archivedTo"].as_str().unwrap()).len(),
        2
    );

    // A model-written summary, keeping the last two.
    let c2 = a
        .call(
            "proc.conversation.compact",
            json!({"pid": pid, "generateSummary": true, "keepLast": 2}),
        )
        .await;
    assert_eq!(c2["archivedMessages"], 3, "{c2}");
    let summary_req = m.requests().last().unwrap().clone();
    assert!(summary_req.get("tools").is_none(), "{summary_req}");
    let prompt = summary_req["messages"][0]["content"].as_str().unwrap();
    assert!(
        prompt.contains("compact an agent's conversation"),
        "{prompt}"
    );
    assert!(
        summary_req["messages"][1]["content"]
            .as_str()
            .unwrap()
            .contains("q2")
    );
    let h = a.call("proc.history", json!({"pid": pid})).await;
    assert_eq!(contents(&h).len(), 3);
    assert!(contents(&h)[0].contains("The user asked q1 and q2."));
    assert_eq!(contents(&h)[1..], ["q3".to_owned(), "a3".to_owned()]);

    let segs = a
        .call("proc.conversation.segments", json!({"pid": pid}))
        .await;
    assert_eq!(segs["segments"].as_array().unwrap().len(), 2);
    assert_eq!(segs["segments"][0]["id"], seg1["id"]);
    // segment.read pages an archive without restoring it.
    let r = a
        .call(
            "proc.conversation.segment.read",
            json!({"pid": pid, "segmentId": seg1["id"], "limit": 1, "offset": 1}),
        )
        .await;
    assert_eq!(
        (&r["messageCount"], &r["truncated"]),
        (&json!(2), &json!(false))
    );
    assert_eq!(r["messages"][0]["content"], "a1");
    assert_eq!(r["messages"][0]["id"], before[1]);
    let (code, msg) = err_of(
        &a.request(
            "proc.conversation.segment.read",
            json!({"pid": pid, "segmentId": "seg_nope"}),
        )
        .await,
    );
    assert_eq!((code, msg.contains("segmentId")), (400, true), "{msg}");

    // Fork restores the first segment plus the live suffix it had.
    let f = a
        .call(
            "proc.conversation.fork",
            json!({"pid": pid, "segmentId": seg1["id"], "targetConversationId": "restored", "title": "Back"}),
        )
        .await;
    assert_eq!(f["includedLiveSuffix"], true);
    assert_eq!(f["restoredMessages"], 6, "{f}");
    let restored = a
        .call(
            "proc.history",
            json!({"pid": pid, "conversationId": "restored"}),
        )
        .await;
    assert_eq!(contents(&restored)[..2], ["q1".to_owned(), "a1".to_owned()]);
    let g = a
        .call(
            "proc.conversation.fork",
            json!({"pid": pid, "segmentId": seg1["id"], "includeLiveSuffix": false}),
        )
        .await;
    assert_eq!(g["restoredMessages"], 2);
    // Fork by message id branches the live conversation.
    let live = ids(&a.call("proc.history", json!({"pid": pid})).await);
    let b = a
        .call(
            "proc.conversation.fork",
            json!({"pid": pid, "throughMessageId": live[1], "targetConversationId": "branch"}),
        )
        .await;
    assert_eq!(
        (&b["restoredMessages"], &b["sourceConversationId"]),
        (&json!(2), &json!("default"))
    );
    let br = a
        .call(
            "proc.history",
            json!({"pid": pid, "conversationId": "branch"}),
        )
        .await;
    assert_eq!(contents(&br)[1], "q3");
    let (code, _) = err_of(
        &a.request(
            "proc.conversation.fork",
            json!({"pid": pid, "throughMessageId": live[1], "targetConversationId": "branch"}),
        )
        .await,
    );
    assert_eq!(
        code, 409,
        "a fork never overwrites a conversation with messages"
    );
}

#[tokio::test]
async fn the_run_preflight_applies_fail_auto_compact_and_manual() {
    let (_k, m, mut a) = setup(
        vec![
            answer("a1"),
            answer("a2"),
            answer("a3"),
            // auto-compact: the summary call, then the run's own call.
            answer("Summary of q1 to q3."),
            answer("after compaction"),
            answer("manual goes on"),
        ],
        &[
            ("config/ai/context_window_tokens", "60"),
            ("config/ai/max_tokens", "10"),
        ],
    )
    .await;
    let pid = three_exchanges(&mut a).await;
    assert_eq!(m.requests().len(), 3);
    let pol = a
        .call("proc.conversation.policy.get", json!({"pid": pid}))
        .await;
    assert_eq!(
        (
            &pol["policy"]["overflow"],
            &pol["policy"]["compactAtPressure"],
            &pol["policy"]["keepLast"]
        ),
        (&json!("manual"), &json!(0.9), &json!(80))
    );
    for (args, needle) in [
        (json!({"pid": pid, "overflow": "explode"}), "overflow"),
        (
            json!({"pid": pid, "compactAtPressure": 0}),
            "compactAtPressure",
        ),
        (
            json!({"pid": pid, "compactAtPressure": 1.5}),
            "compactAtPressure",
        ),
        (json!({"pid": pid, "keepLast": -3}), "keepLast"),
    ] {
        let (code, msg) = err_of(
            &a.request("proc.conversation.policy.set", args.clone())
                .await,
        );
        assert_eq!(code, 400, "{args}: {msg}");
        assert!(msg.contains(needle), "{msg}");
    }
    let h = a.call("proc.history", json!({"pid": pid})).await;
    assert!(h["context"]["pressure"].as_f64().is_some(), "{h}");

    // fail: the run ends with an error and no model is called.
    let p = a
        .call(
            "proc.conversation.policy.set",
            json!({"pid": pid, "overflow": "fail", "compactAtPressure": 0.5}),
        )
        .await;
    assert_eq!(p["policy"]["overflow"], "fail");
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "q4"}))
        .await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["status"], "error", "{fin}");
    assert!(
        fin["error"]
            .as_str()
            .unwrap()
            .contains("overflow policy fail"),
        "{fin}"
    );
    assert_eq!(m.requests().len(), 3);

    // auto-compact: a model-written summary, then the model call.
    a.call(
        "proc.conversation.policy.set",
        json!({"pid": pid, "overflow": "auto-compact", "keepLast": 1}),
    )
    .await;
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "q5"}))
        .await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["text"], "after compaction", "{fin}");
    let reqs = m.requests();
    assert_eq!(reqs.len(), 5);
    assert!(
        reqs[3]["messages"][0]["content"]
            .as_str()
            .unwrap()
            .contains("compact an agent's conversation")
    );
    let seen = reqs[4]["messages"].to_string();
    assert!(
        seen.contains("Summary of q1 to q3.") && !seen.contains("\"q1\""),
        "{seen}"
    );
    let segs = a
        .call("proc.conversation.segments", json!({"pid": pid}))
        .await;
    assert_eq!(segs["segments"].as_array().unwrap().len(), 1);

    // manual: neither fails nor compacts.
    a.call(
        "proc.conversation.policy.set",
        json!({"pid": pid, "overflow": "manual", "compactAtPressure": 0.01}),
    )
    .await;
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "q6"}))
        .await;
    assert_eq!(a.finished(&s["runId"]).await["text"], "manual goes on");
    assert_eq!(m.requests().len(), 6);
    assert_eq!(
        a.call("proc.conversation.segments", json!({"pid": pid}))
            .await["segments"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn compacting_a_conversation_with_an_active_run_is_refused() {
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let (_k, _m, mut a) = setup(
        vec![answer("a1"), Reply::Gated(vec![text("slow")], gate.clone())],
        &[],
    )
    .await;
    let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "q1"}))
        .await;
    a.finished(&s["runId"]).await;
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "q2"}))
        .await;
    a.signal("proc.run.stream", |p| p["event"]["type"] == "text_delta")
        .await;
    let f = a
        .request(
            "proc.conversation.compact",
            json!({"pid": pid, "summary": "s", "keepLast": 0}),
        )
        .await;
    let (code, msg) = err_of(&f);
    assert_eq!(code, 409, "{msg}");
    assert!(msg.contains("Conversation is active"), "{msg}");
    gate.notify_one();
    a.finished(&s["runId"]).await;
    assert_eq!(
        a.call("proc.history", json!({"pid": pid})).await["messageCount"],
        4
    );
}

#[tokio::test]
async fn thinking_and_tool_call_deltas_stream_with_seq_and_output_follows() {
    let (_k, _m, mut a) = setup(
        vec![
            Reply::Sse(vec![
                json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}),
                crate::proc::tool("c1", "Read", json!({"path": "."})),
            ]),
            Reply::Sse(vec![text("done")]),
        ],
        &[],
    )
    .await;
    let (_, s) = a.spawn_and_send("think").await;
    let out = a.signal("proc.run.output", |_| true).await;
    assert_eq!(
        (&out["thinking"], &out["conversationId"]),
        (&json!("hmm"), &json!("default"))
    );
    a.finished(&s["runId"]).await;
    let mut kinds = Vec::new();
    let mut seqs = Vec::new();
    while let Some(i) = a.seen.iter().position(|f| f["signal"] == "proc.run.stream") {
        let e = a.seen.remove(i).unwrap()["payload"].clone();
        kinds.push(e["event"]["type"].as_str().unwrap().to_owned());
        seqs.push(e["seq"].as_u64().unwrap());
    }
    assert_eq!(
        kinds,
        [
            "thinking_start",
            "thinking_delta",
            "thinking_end",
            "toolcall_start",
            "toolcall_delta",
            "toolcall_end",
            "done",
            "text_start",
            "text_delta",
            "text_end",
            "done"
        ]
    );
    assert_eq!(seqs, (0..11).collect::<Vec<u64>>());
}

#[tokio::test]
async fn a_kernel_configured_model_reaches_a_new_users_home_process() {
    // configure() is called after the users exist: a process-less user's
    // first connection still gets a home that can answer.
    let k = TestKernel::with_users().await;
    let m = crate::proc::ModelServer::start(vec![answer("hello bob")]).await;
    configure(&k, &m.base_url, &[]).await;
    let mut b = Watcher::new(k.bob().await);
    let s = b.call("proc.send", json!({"message": "hi"})).await;
    assert_eq!(b.finished(&s["runId"]).await["text"], "hello bob");
}

#[tokio::test]
async fn ai_calls_are_internal_and_the_loop_uses_them_with_the_accounts_approval_policy() {
    let (k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![crate::proc::tool(
                "c1",
                "Write",
                json!({"path": "x.txt", "content": "x"}),
            )]),
            Reply::Sse(vec![crate::proc::tool(
                "c2",
                "Read",
                json!({"path": "notes.txt"}),
            )]),
            answer("done"),
        ],
        &[],
    )
    .await;
    // Sockets, root's included, are refused.
    for call in ["ai.tools", "ai.config"] {
        let (code, msg) = err_of(&a.request(call, json!({})).await);
        assert_eq!(
            (code, msg.as_str()),
            (403, format!("Permission denied: {call}").as_str())
        );
    }
    let mut root = Watcher::new(k.login("root", "root-password").await);
    let (code, _) = err_of(&root.request("ai.config", json!({})).await);
    assert_eq!(code, 403);

    a.call(
        "fs.write",
        json!({"path": "~/notes.txt", "content": "secret plan"}),
    )
    .await;
    let uid = a.call("proc.list", json!({})).await["processes"][0]["uid"].clone();
    let policy = json!({"default": "auto", "rules": [
        {"match": "fs.*", "action": "auto"},
        {"match": "fs.write", "action": "deny"},
        {"match": "fs.read", "action": "ask"}
    ]});
    a.call(
        "sys.config.set",
        json!({"key": format!("users/{uid}/ai/tools/approval"), "value": policy}),
    )
    .await;
    let (_, s) = a.spawn_and_send("go").await;
    let denied = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Write")
        .await;
    assert_eq!(denied["isError"], true);
    assert!(
        denied["error"]
            .as_str()
            .unwrap()
            .contains("denied by the approval policy"),
        "{denied}"
    );
    let ask = a.signal("proc.run.hil.requested", |_| true).await;
    assert_eq!(
        (&ask["syscall"], &ask["tags"]),
        (&json!("fs.read"), &json!(["policy"]))
    );
    assert_eq!(ask["conversationId"], "default");
    let h = a.call("proc.history", json!({"pid": ask["pid"]})).await;
    let pending = &h["pendingHil"];
    assert_eq!(
        (
            &pending["requestId"],
            &pending["callId"],
            &pending["toolName"],
            &pending["syscall"]
        ),
        (
            &ask["requestId"],
            &json!("c2"),
            &json!("Read"),
            &json!("fs.read")
        ),
        "{h}"
    );
    a.call(
        "proc.hil",
        json!({"requestId": ask["requestId"], "decision": "approve"}),
    )
    .await;
    let read = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Read")
        .await;
    assert_eq!(read["isError"], false, "{read}");
    assert_eq!(a.finished(&s["runId"]).await["text"], "done");
    let h = a.call("proc.history", json!({"pid": ask["pid"]})).await;
    assert_eq!(h["pendingHil"], Value::Null);
    // The tools came from ai.tools: routable ones require a target.
    let tools = m.requests()[0]["tools"].clone();
    let read_def = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "Read")
        .unwrap()
        .clone();
    let required = read_def["function"]["parameters"]["required"].clone();
    assert!(
        required.as_array().unwrap().contains(&json!("target")),
        "{required}"
    );
    assert!(!m.requests()[0].to_string().contains("secret plan"));

    // A policy that does not parse ends the run naming the key.
    a.call(
        "sys.config.set",
        json!({"key": format!("users/{uid}/ai/tools/approval"), "value": "{\"rules\": 3}"}),
    )
    .await;
    let (_, s) = a.spawn_and_send("again").await;
    let fin = a.finished(&s["runId"]).await;
    assert!(
        fin["error"].as_str().unwrap().contains("ai/tools/approval"),
        "{fin}"
    );
    assert_eq!(m.requests().len(), 3);
}
