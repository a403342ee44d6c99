//! `sched.*` over the WebSocket: every expression kind and both targets,
//! the bad-input refusals, ownership, schedules firing from the timer
//! table (with a scripted OpenAI-compatible model answering the runs they
//! start), and a restart that fires what fell due while the kernel was down.

use std::time::Duration;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::post;
use chrono::{TimeZone, Timelike, Utc};
use gsv_kernel::client::GsvClient;
use gsv_kernel::db::now_ms;
use serde_json::{Value, json};

use crate::harness::{TestKernel, err_of};

/// A model server that answers every completion with "done".
async fn model_server() -> String {
    async fn answer() -> impl IntoResponse {
        let chunk = json!({"choices": [{"index": 0, "delta": {"content": "done"}}]});
        (
            [("content-type", "text/event-stream")],
            format!("data: {chunk}\n\ndata: [DONE]\n\n"),
        )
    }
    let app = Router::new().route("/v1/chat/completions", post(answer));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

async fn configure_model(k: &TestKernel, base_url: &str) {
    let mut root = k.login("root", "root-password").await;
    for (key, value) in [
        ("config/ai/provider", "openai"),
        ("config/ai/model", "scripted"),
        ("config/ai/base_url", base_url),
        ("config/ai/api_key", "sk-test"),
    ] {
        root.call("sys.config.set", json!({"key": key, "value": value}))
            .await
            .unwrap();
    }
    root.close().await;
}

async fn add(c: &mut GsvClient, args: Value) -> Value {
    c.call("sched.add", args).await.unwrap()["schedule"].clone()
}

async fn get(c: &mut GsvClient, id: &Value) -> Value {
    let l = c
        .call("sched.list", json!({"includeDisabled": true, "limit": 500}))
        .await
        .unwrap();
    l["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == *id)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Schedule `id` once `pred` holds for it; panics after 30 s.
async fn schedule_when(
    c: &mut GsvClient,
    id: &Value,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let s = get(c, id).await;
        if pred(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {s}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn spawn_target(prompt: &str) -> Value {
    json!({"kind": "process.spawn", "prompt": prompt})
}

#[tokio::test]
async fn every_expression_kind_is_added_listed_updated_and_removed() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let t0 = now_ms();

    let at = add(
        &mut a,
        json!({"name": "at", "expression": {"kind": "at", "atMs": t0 + 3_600_000},
               "target": spawn_target("hello")}),
    )
    .await;
    assert_eq!(at["overlapPolicy"], "skip");
    assert_eq!(at["enabled"], true);
    assert_eq!(at["ownerUid"], 1000);
    assert_eq!(at["state"]["nextRunAtMs"], t0 + 3_600_000);
    assert_eq!(at["state"]["runCount"], 0);
    assert_eq!(at["state"]["lastStatus"], Value::Null);
    assert_eq!(
        at["target"],
        json!({"kind": "process.spawn", "prompt": "hello"})
    );

    let after = add(
        &mut a,
        json!({"name": "after", "description": "  soon ", "expression": {"kind": "after", "afterMs": 60_000},
               "target": spawn_target("later")}),
    )
    .await;
    assert_eq!(after["description"], "soon");
    assert_eq!(
        after["state"]["nextRunAtMs"].as_i64().unwrap(),
        after["createdAtMs"].as_i64().unwrap() + 60_000
    );

    let anchor = t0 - 10_500;
    let every = add(
        &mut a,
        json!({"name": "every", "expression": {"kind": "every", "everyMs": 60_000, "anchorMs": anchor},
               "target": spawn_target("tick")}),
    )
    .await;
    assert_eq!(every["state"]["nextRunAtMs"], anchor + 60_000);

    let cron = add(
        &mut a,
        json!({"name": "cron", "expression": {"kind": "cron", "expr": "0 9 * * *", "timezone": "America/New_York"},
               "target": spawn_target("morning")}),
    )
    .await;
    let next = cron["state"]["nextRunAtMs"].as_i64().unwrap();
    let local = Utc
        .timestamp_millis_opt(next)
        .unwrap()
        .with_timezone(&chrono_tz::America::New_York);
    assert_eq!((local.hour(), local.minute(), local.second()), (9, 0, 0));
    assert!(next > t0 && next <= t0 + 25 * 3_600_000, "{next}");

    // No zone: config/server/timezone, else UTC.
    let utc = add(
        &mut a,
        json!({"name": "utc", "expression": {"kind": "cron", "expr": "*/5 * * * *"},
               "target": spawn_target("x")}),
    )
    .await;
    assert_eq!(utc["expression"]["timezone"], "UTC");
    let mut root = k.login("root", "root-password").await;
    root.call(
        "sys.config.set",
        json!({"key": "config/server/timezone", "value": "Asia/Tokyo"}),
    )
    .await
    .unwrap();
    let tokyo = add(
        &mut a,
        json!({"name": "tokyo", "enabled": false, "expression": {"kind": "cron", "expr": "30 8 * * 1-5"},
               "target": spawn_target("x")}),
    )
    .await;
    assert_eq!(tokyo["expression"]["timezone"], "Asia/Tokyo");
    assert_eq!(tokyo["state"]["nextRunAtMs"], Value::Null);

    // The list: enabled ones by next run; disabled on request; clamps.
    let l = a.call("sched.list", json!({})).await.unwrap();
    assert_eq!(l["count"], 5);
    let names: Vec<&str> = l["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"tokyo"), "{names:?}");
    let nexts: Vec<i64> = l["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"]["nextRunAtMs"].as_i64().unwrap())
        .collect();
    assert!(nexts.windows(2).all(|w| w[0] <= w[1]), "{nexts:?}");
    let all = a
        .call(
            "sched.list",
            json!({"includeDisabled": true, "limit": 1000}),
        )
        .await
        .unwrap();
    assert_eq!(all["count"], 6);
    assert_eq!(all["schedules"].as_array().unwrap().len(), 6);
    let one = a
        .call(
            "sched.list",
            json!({"includeDisabled": true, "limit": 0, "offset": 5}),
        )
        .await
        .unwrap();
    assert_eq!(one["schedules"].as_array().unwrap().len(), 1);
    assert_eq!(one["count"], 6);

    // Update: metadata alone keeps the next run; enabling or a new
    // expression recomputes it; disabling clears it.
    let u = a
        .call(
            "sched.update",
            json!({"id": after["id"], "patch": {"name": "renamed", "description": null}}),
        )
        .await
        .unwrap()["schedule"]
        .clone();
    assert_eq!(u["name"], "renamed");
    assert!(u.get("description").is_none(), "{u}");
    assert_eq!(u["state"]["nextRunAtMs"], after["state"]["nextRunAtMs"]);
    let u = a
        .call(
            "sched.update",
            json!({"id": every["id"], "patch": {"enabled": false}}),
        )
        .await
        .unwrap()["schedule"]
        .clone();
    assert_eq!(u["enabled"], false);
    assert_eq!(u["state"]["nextRunAtMs"], Value::Null);
    let u = a
        .call(
            "sched.update",
            json!({"id": tokyo["id"], "patch": {"enabled": true,
                   "expression": {"kind": "every", "everyMs": 120_000, "anchorMs": anchor},
                   "target": {"kind": "process.spawn", "prompt": " p ", "label": "lbl"}}}),
        )
        .await
        .unwrap()["schedule"]
        .clone();
    assert_eq!(u["state"]["nextRunAtMs"], anchor + 120_000);
    assert_eq!(
        u["target"],
        json!({"kind": "process.spawn", "prompt": "p", "label": "lbl"})
    );

    // Root sees everyone's, or one owner's.
    let r = root
        .call(
            "sched.list",
            json!({"ownerUid": 1000, "includeDisabled": true}),
        )
        .await
        .unwrap();
    assert_eq!(r["count"], 6);

    // Remove, once.
    let rm = a
        .call("sched.remove", json!({"id": cron["id"]}))
        .await
        .unwrap();
    assert_eq!(rm["removed"], true);
    let rm = a
        .call("sched.remove", json!({"id": cron["id"]}))
        .await
        .unwrap();
    assert_eq!(rm["removed"], false);
    assert_eq!(get(&mut a, &cron["id"]).await, Value::Null);
    let _ = (at, utc);
    root.close().await;
    a.close().await;
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_argument_and_changes_nothing() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let cases = [
        (
            json!({"name": "x", "expression": {"kind": "cron", "expr": "0 0 12 * * *", "timezone": "UTC"},
                   "target": spawn_target("p")}),
            "five fields",
        ),
        (
            json!({"name": "x", "expression": {"kind": "cron", "expr": "0 12 * * *", "timezone": "Mars/Base"},
                   "target": spawn_target("p")}),
            "expression.timezone",
        ),
        (
            json!({"name": "x", "expression": {"kind": "every", "everyMs": 500},
                   "target": spawn_target("p")}),
            "expression.everyMs",
        ),
        (
            json!({"name": " ", "expression": {"kind": "after", "afterMs": 1000},
                   "target": spawn_target("p")}),
            "name",
        ),
        (
            json!({"name": "x", "expression": {"kind": "after", "afterMs": 1000},
                   "target": spawn_target("")}),
            "target.prompt",
        ),
        (
            json!({"name": "x", "expression": {"kind": "weekly"}, "target": spawn_target("p")}),
            "expression",
        ),
        (
            json!({"name": "x", "expression": {"kind": "at", "atMs": "soon"}, "target": spawn_target("p")}),
            "expression",
        ),
    ];
    for (args, names) in cases {
        let f = a.request("sched.add", args.clone()).await.unwrap();
        let (code, msg) = err_of(&f);
        assert_eq!(code, 400, "{args}: {msg}");
        assert!(msg.contains(names), "{args}: {msg} should name {names}");
    }
    let f = a
        .request("sched.run", json!({"mode": "force"}))
        .await
        .unwrap();
    let (code, msg) = err_of(&f);
    assert_eq!(code, 400);
    assert!(msg.contains("id"), "{msg}");

    // A bad patch leaves the schedule as it was.
    let s = add(
        &mut a,
        json!({"name": "keep", "expression": {"kind": "every", "everyMs": 60_000},
               "target": spawn_target("p")}),
    )
    .await;
    let f = a
        .request(
            "sched.update",
            json!({"id": s["id"], "patch": {"name": "changed",
                   "expression": {"kind": "every", "everyMs": 999}}}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 400);
    let l = a
        .call("sched.list", json!({"includeDisabled": true}))
        .await
        .unwrap();
    assert_eq!(l["count"], 1);
    assert_eq!(l["schedules"][0], s);
    a.close().await;
}

#[tokio::test]
async fn another_users_schedule_is_refused_and_never_revealed() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let mut b = k.bob().await;
    let s = add(
        &mut a,
        json!({"name": "mine", "expression": {"kind": "at", "atMs": now_ms() + 3_600_000},
               "target": spawn_target("p")}),
    )
    .await;
    let missing = json!("00000000-0000-0000-0000-000000000000");
    for id in [&s["id"], &missing] {
        let f = b
            .request(
                "sched.update",
                json!({"id": id, "patch": {"name": "mine now"}}),
            )
            .await
            .unwrap();
        let (code, msg) = err_of(&f);
        assert_eq!(code, 403);
        assert_eq!(
            msg,
            format!("Access denied to schedule: {}", id.as_str().unwrap())
        );
        let f = b
            .request("sched.run", json!({"id": id, "mode": "force"}))
            .await
            .unwrap();
        assert_eq!(err_of(&f).0, 403);
        let rm = b.call("sched.remove", json!({"id": id})).await.unwrap();
        assert_eq!(rm["removed"], false);
    }
    // Bob's list and due run do not see or touch it, whatever he asks for.
    let l = b
        .call(
            "sched.list",
            json!({"ownerUid": 1000, "includeDisabled": true}),
        )
        .await
        .unwrap();
    assert_eq!(l["count"], 0);
    let r = b.call("sched.run", json!({})).await.unwrap();
    assert_eq!(r, json!({"ran": 0, "results": []}));
    assert_eq!(get(&mut a, &s["id"]).await, s);

    // A target naming another user's process is refused.
    let pid = a.call("proc.spawn", json!({})).await.unwrap()["pid"].clone();
    let f = b
        .request(
            "sched.add",
            json!({"name": "poke", "expression": {"kind": "after", "afterMs": 1000},
                   "target": {"kind": "process.event", "pid": pid, "message": "hi"}}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&f).0, 403);
    assert_eq!(b.call("sched.list", json!({})).await.unwrap()["count"], 0);
    a.close().await;
    b.close().await;
}

/// The process a schedule spawned (labelled with the schedule's name).
async fn spawned(c: &mut GsvClient, label: &str) -> Option<Value> {
    let l = c.call("proc.list", json!({})).await.unwrap();
    l["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["label"] == label)
        .cloned()
}

async fn assistant_said(c: &mut GsvClient, pid: &Value, text: &str) -> bool {
    let h = c.call("proc.history", json!({"pid": pid})).await.unwrap();
    h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["role"] == "assistant" && m["content"] == text)
}

#[tokio::test]
async fn due_schedules_fire_both_targets_from_the_timer_table() {
    let k = TestKernel::with_users().await;
    configure_model(&k, &model_server().await).await;
    let mut a = k.alice().await;

    // process.spawn, once, shortly.
    let once = add(
        &mut a,
        json!({"name": "nightly-report", "expression": {"kind": "after", "afterMs": 200},
               "target": spawn_target("write the report")}),
    )
    .await;
    let fired = schedule_when(&mut a, &once["id"], "the after schedule to run", |s| {
        s["state"]["runCount"] == 1
    })
    .await;
    assert_eq!(fired["state"]["lastStatus"], "ok");
    assert_eq!(fired["state"]["lastError"], Value::Null);
    assert_eq!(fired["enabled"], false, "a one-shot disables itself");
    assert_eq!(fired["state"]["nextRunAtMs"], Value::Null);
    assert_eq!(fired["state"]["runningAtMs"], Value::Null);
    let proc = spawned(&mut a, "nightly-report").await.expect("spawned");
    // `cron` is not startable by users; a schedule starts it internally.
    assert_eq!(
        (&proc["profile"], &proc["interactive"]),
        (&json!("cron"), &json!(false))
    );
    let h = a
        .call("proc.history", json!({"pid": proc["pid"]}))
        .await
        .unwrap();
    assert_eq!(h["messages"][0]["content"], "write the report");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !assistant_said(&mut a, &proc["pid"], "done").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the spawned run never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // process.event, every second, to an existing process.
    let pid = a
        .call("proc.spawn", json!({"label": "inbox"}))
        .await
        .unwrap()["pid"]
        .clone();
    let every = add(
        &mut a,
        json!({"name": "tick", "expression": {"kind": "every", "everyMs": 1000},
               "target": {"kind": "process.event", "pid": pid, "message": "tick",
                          "data": {"n": 1}}}),
    )
    .await;
    let ticked = schedule_when(&mut a, &every["id"], "two ticks", |s| {
        s["state"]["runCount"].as_i64().unwrap() >= 2
    })
    .await;
    assert_eq!(ticked["state"]["lastStatus"], "ok");
    assert_eq!(ticked["enabled"], true);
    assert!(
        ticked["state"]["nextRunAtMs"].as_i64().unwrap()
            > ticked["state"]["lastRunAtMs"].as_i64().unwrap() - 1000
    );
    let h = a.call("proc.history", json!({"pid": pid})).await.unwrap();
    let ticks = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user" && m["content"] == "tick\n\n{\"n\":1}")
        .count();
    assert!(ticks >= 1, "{h}");
    assert_eq!(
        a.call("sched.remove", json!({"id": every["id"]}))
            .await
            .unwrap()["removed"],
        true
    );
    a.close().await;
}

#[tokio::test]
async fn sched_run_due_skips_what_is_not_due_and_force_keeps_the_next_run() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let at_ms = now_ms() + 3_600_000;
    let s = add(
        &mut a,
        json!({"name": "later", "expression": {"kind": "at", "atMs": at_ms},
               "target": spawn_target("p")}),
    )
    .await;
    let r = a.call("sched.run", json!({"id": s["id"]})).await.unwrap();
    assert_eq!(r["ran"], 0);
    assert_eq!(r["results"][0]["status"], "skipped");
    assert_eq!(r["results"][0]["error"], "schedule is not due");
    let r = a.call("sched.run", json!({})).await.unwrap();
    assert_eq!(r, json!({"ran": 0, "results": []}));

    let r = a
        .call("sched.run", json!({"id": s["id"], "mode": "force"}))
        .await
        .unwrap();
    assert_eq!(r["ran"], 1);
    let res = &r["results"][0];
    assert_eq!(res["scheduleId"], s["id"]);
    assert_eq!(res["status"], "ok");
    assert_eq!(res["nextRunAtMs"], at_ms);
    assert!(
        res["summary"]
            .as_str()
            .unwrap()
            .starts_with("spawned process proc:"),
        "{res}"
    );
    assert!(
        res["summary"].as_str().unwrap().contains("profile cron"),
        "{res}"
    );
    let after = get(&mut a, &s["id"]).await;
    assert_eq!(after["enabled"], true);
    assert_eq!(after["state"]["nextRunAtMs"], at_ms);
    assert_eq!(after["state"]["runCount"], 1);
    assert!(spawned(&mut a, "later").await.is_some());

    // A process.event target whose process is gone fails the run, not the call.
    let pid = a.call("proc.spawn", json!({})).await.unwrap()["pid"].clone();
    let ev = add(
        &mut a,
        json!({"name": "ev", "expression": {"kind": "at", "atMs": at_ms},
               "target": {"kind": "process.event", "pid": pid, "message": "m"}}),
    )
    .await;
    // `proc.kill` keeps the registry row (seed 000) unless told to remove it.
    a.call(
        "proc.kill",
        json!({"pid": pid, "archive": false, "remove": true}),
    )
    .await
    .unwrap();
    let r = a
        .call("sched.run", json!({"id": ev["id"], "mode": "force"}))
        .await
        .unwrap();
    assert_eq!(r["results"][0]["status"], "error");
    assert_eq!(
        r["results"][0]["error"],
        format!("Process not found: {}", pid.as_str().unwrap())
    );
    assert_eq!(get(&mut a, &ev["id"]).await["state"]["lastStatus"], "error");
    a.close().await;
}

#[tokio::test]
async fn a_schedule_due_while_the_kernel_was_down_fires_after_the_start() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let t0 = now_ms();
    let at = add(
        &mut a,
        json!({"name": "while-down", "expression": {"kind": "at", "atMs": t0 + 5_000},
               "target": spawn_target("p")}),
    )
    .await;
    // Due 4.5 s from now, then every minute: it fires once after the
    // start, not once per missed interval. (The margins leave the old
    // kernel seconds to stop before anything falls due.)
    let every = add(
        &mut a,
        json!({"name": "minutely", "expression": {"kind": "every", "everyMs": 60_000,
               "anchorMs": t0 + 4_500 - 60_000},
               "target": spawn_target("p")}),
    )
    .await;
    assert_eq!(get(&mut a, &at["id"]).await["state"]["runCount"], 0);
    a.close().await;
    let stopped = k.stop().await;
    let wait = (t0 + 5_200 - now_ms()).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let restarted_at = now_ms();
    let k = stopped.start().await;
    let mut a = k.alice().await;
    for id in [&at["id"], &every["id"]] {
        let s = schedule_when(&mut a, id, "the missed schedule to run", |s| {
            s["state"]["runCount"] == 1
        })
        .await;
        assert_eq!(s["state"]["lastStatus"], "ok");
        assert!(s["state"]["lastRunAtMs"].as_i64().unwrap() >= restarted_at);
    }
    let every_now = get(&mut a, &every["id"]).await;
    assert_eq!(
        every_now["state"]["nextRunAtMs"],
        t0 + 4_500 + 60_000,
        "the next run is the next minute after the missed one"
    );
    assert!(spawned(&mut a, "while-down").await.is_some());
    a.close().await;
}
