//! The adapter plane and identity links against a scripted adapter (a
//! real WebSocket client connected as `role:"service"`, answering the
//! `adapter.*` requests the kernel forwards) and the scripted model
//! server of the proc tests.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use gsv_kernel::client::{GsvClient, connect_args};
use serde_json::{Value, json};

use tokio::sync::Notify;

use crate::harness::{TestKernel, err_of, eventually};
use crate::proc::{ModelServer, Reply, Watcher, answer, configure, text, tool};

const ACCOUNT: &str = "@bot:example.org";
const ALICE_MX: &str = "@alice:example.org";
const DM_ROOM: &str = "!dm-alice:example.org";

/// An adapter written with nothing but JSON frames: it calls the kernel
/// and answers the requests the kernel forwards to it, keeping whatever
/// arrives while it waits for something else.
struct ScriptedAdapter {
    ws: GsvClient,
    stash: VecDeque<Value>,
}

impl ScriptedAdapter {
    /// Connects as the service `channel` with `token`; the `sys.connect`
    /// response frame.
    async fn try_connect(k: &TestKernel, token: &str, channel: &str) -> (ScriptedAdapter, Value) {
        let mut ws = GsvClient::connect(&k.url).await.unwrap();
        ws.timeout = Duration::from_secs(30);
        let mut args = connect_args(
            &format!("{channel}-adapter"),
            "service",
            json!({"token": token}),
        );
        args["client"]["channel"] = json!(channel);
        let res = ws.request("sys.connect", args).await.unwrap();
        (
            ScriptedAdapter {
                ws,
                stash: VecDeque::new(),
            },
            res,
        )
    }

    async fn connect(k: &TestKernel, token: &str) -> ScriptedAdapter {
        let (a, res) = ScriptedAdapter::try_connect(k, token, "matrix").await;
        assert_eq!(res["ok"], true, "{res}");
        assert_eq!(res["data"]["identity"]["channel"], "matrix");
        a
    }

    /// A call of the adapter's own; the whole response frame.
    async fn request(&mut self, call: &str, args: Value) -> Value {
        let id = self.ws.fresh_id();
        self.ws.send_request(&id, call, args).await.unwrap();
        loop {
            let f = self.ws.recv().await.unwrap();
            if f["type"] == "res" && f["id"] == id {
                return f;
            }
            self.stash.push_back(f);
        }
    }

    /// `data` of a successful call of the adapter's own.
    async fn call(&mut self, call: &str, args: Value) -> Value {
        let f = self.request(call, args).await;
        assert_eq!(f["ok"], true, "{call}: {f}");
        f["data"].clone()
    }

    /// A message from `actor` on `surface` through `adapter.inbound`.
    async fn inbound(&mut self, surface: Value, actor: &str, text: &str) -> Value {
        let n = self.ws.fresh_id();
        self.inbound_id(&format!("$m{n}"), surface, actor, text)
            .await
    }

    /// [`ScriptedAdapter::inbound`] with the platform's message id.
    async fn inbound_id(&mut self, id: &str, surface: Value, actor: &str, text: &str) -> Value {
        self.call(
            "adapter.inbound",
            json!({"adapter": "matrix", "accountId": ACCOUNT, "deliveryId": format!("d-{id}"),
                   "message": {"messageId": id, "surface": surface,
                               "actor": {"id": actor, "name": "Alice"}, "text": text}}),
        )
        .await
    }

    /// Reports the account connected (`adapter.state.update`).
    async fn report_connected(&mut self) {
        let update = json!({"adapter": "matrix", "accountId": ACCOUNT,
                            "status": {"accountId": ACCOUNT, "connected": true,
                                       "authenticated": true}});
        assert_eq!(
            self.call("adapter.state.update", update).await,
            json!({"ok": true})
        );
    }

    /// The next frame matching `pred` (stashed ones first).
    async fn next(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.stash.iter().position(&pred) {
            return self.stash.remove(i).unwrap();
        }
        loop {
            let f = self.ws.recv().await.unwrap();
            if pred(&f) {
                return f;
            }
            self.stash.push_back(f);
        }
    }

    /// The next request the kernel forwards for `call`.
    async fn next_req(&mut self, call: &str) -> Value {
        self.next(|f| f["type"] == "req" && f["call"] == call).await
    }

    /// Answers a forwarded request with `data`.
    async fn reply(&mut self, req: &Value, data: Value) {
        let res = json!({"type": "res", "id": req["id"], "ok": true, "data": data});
        self.ws.send_text(res.to_string()).await.unwrap();
    }

    /// Takes the next `adapter.send`, answers it as posted; its args.
    async fn take_send(&mut self) -> Value {
        let req = self.next_req("adapter.send").await;
        let a = &req["args"];
        let sent = json!({"ok": true, "adapter": a["adapter"], "accountId": a["accountId"],
                          "surfaceId": a["surface"]["id"], "messageId": "$posted"});
        self.reply(&req, sent).await;
        req["args"].clone()
    }
}

fn dm() -> Value {
    json!({"kind": "dm", "id": DM_ROOM})
}

/// A service token of root's (an adapter run by the operator).
async fn service_token(k: &TestKernel) -> String {
    let mut root = k.login("root", "root-password").await;
    let d = root
        .call(
            "sys.token.create",
            json!({"kind": "service", "label": "matrix"}),
        )
        .await
        .unwrap();
    root.close().await;
    d["token"]["token"].as_str().unwrap().to_owned()
}

/// A kernel with alice and bob, the scripted model, and a connected
/// scripted adapter.
async fn setup(replies: Vec<Reply>) -> (TestKernel, ModelServer, ScriptedAdapter) {
    setup_tuned(replies, |_| {}).await
}

async fn setup_tuned(
    replies: Vec<Reply>,
    tune: impl FnOnce(&mut gsv_kernel::KernelConfig),
) -> (TestKernel, ModelServer, ScriptedAdapter) {
    let k = TestKernel::with_users_tuned(tune).await;
    let m = ModelServer::start(replies).await;
    configure(&k, &m.base_url, &[]).await;
    let token = service_token(&k).await;
    let a = ScriptedAdapter::connect(&k, &token).await;
    (k, m, a)
}

/// Alice's DM gets a code; alice consumes it; the link.
async fn link_alice(k: &TestKernel, adapter: &mut ScriptedAdapter) -> Value {
    let r = adapter.inbound(dm(), ALICE_MX, "hello?").await;
    let code = r["challenge"]["code"].as_str().unwrap().to_owned();
    let mut alice = k.alice().await;
    let linked = alice
        .call("sys.link.consume", json!({"code": code}))
        .await
        .unwrap();
    alice.close().await;
    linked
}

fn is_code(c: &str) -> bool {
    let b = c.as_bytes();
    b.len() == 9
        && b[4] == b'-'
        && b.iter()
            .enumerate()
            .all(|(i, ch)| i == 4 || ch.is_ascii_uppercase() || ch.is_ascii_digit())
}

#[tokio::test]
async fn an_unlinked_dm_gets_a_code_and_once_linked_the_agents_answer_comes_back_to_the_dm() {
    let (k, m, mut adapter) = setup(vec![answer("hello from your agent")]).await;
    let first = adapter.inbound(dm(), ALICE_MX, "hi").await;
    let code = first["challenge"]["code"].as_str().unwrap().to_owned();
    assert!(is_code(&code), "{first}");
    assert!(
        first["challenge"]["prompt"]
            .as_str()
            .unwrap()
            .contains(&format!("gsv auth link {code}")),
        "{first}"
    );
    assert!(first["challenge"]["expiresAt"].as_i64().unwrap() > 0);
    assert!(first.get("delivered").is_none(), "{first}");
    // One open code per actor: a second DM gets the same one.
    let again = adapter.inbound(dm(), ALICE_MX, "hi?").await;
    assert_eq!(again["challenge"]["code"], json!(code));
    assert!(m.requests().is_empty(), "nothing reached a model");

    // Typed in lowercase without the dash, as a person might.
    let mut alice = k.alice().await;
    let linked = alice
        .call(
            "sys.link.consume",
            json!({"code": code.replace('-', "").to_lowercase()}),
        )
        .await
        .unwrap();
    assert_eq!(linked["linked"], true);
    assert_eq!(linked["link"]["actorId"], ALICE_MX);
    assert_eq!(linked["link"]["adapter"], "matrix");
    let uid = linked["link"]["uid"].as_i64().unwrap();
    // Bob cannot take the used code over.
    let mut bob = k.bob().await;
    let stolen = bob
        .request("sys.link.consume", json!({"code": code}))
        .await
        .unwrap();
    assert_eq!(err_of(&stolen).0, 409, "{stolen}");
    let listed = alice.call("sys.link.list", json!({})).await.unwrap();
    assert_eq!(listed["links"].as_array().unwrap().len(), 1);
    assert_eq!(listed["links"][0]["linkedByUid"], uid);
    let bobs = bob.call("sys.link.list", json!({})).await.unwrap();
    assert_eq!(bobs["links"], json!([]));

    let thread = json!({"kind": "dm", "id": DM_ROOM, "threadId": "$root"});
    let r = adapter.inbound(thread.clone(), ALICE_MX, "what's up").await;
    let delivered = &r["delivered"];
    assert_eq!(delivered["uid"], uid, "{r}");
    assert_eq!(delivered["pid"], format!("init:{uid}"));
    assert!(delivered["runId"].as_str().unwrap().starts_with("run_"));
    let sent = adapter.take_send().await;
    assert_eq!(sent["text"], "hello from your agent");
    assert_eq!(sent["surface"], thread, "the same surface, thread kept");
    assert_eq!(sent["actorId"], ALICE_MX);
    assert!(sent["replyToId"].as_str().unwrap().starts_with("$m"));
    assert!(sent["deliveryId"].as_str().unwrap().contains("run_"));
    let asked = m.requests()[0]["messages"].to_string();
    assert!(asked.contains("what's up"), "{asked}");
    // The message sits in alice's home process history.
    let h = alice.call("proc.history", json!({})).await.unwrap();
    assert!(h["messages"].to_string().contains("what's up"), "{h}");
}

#[tokio::test]
async fn approve_and_deny_in_a_dm_answer_the_agents_delete() {
    let (k, _m, mut adapter) = setup(vec![
        Reply::Sse(vec![tool("c1", "Delete", json!({"path": "doomed.txt"}))]),
        answer("deleted it"),
        Reply::Sse(vec![tool("c2", "Delete", json!({"path": "keep.txt"}))]),
        answer("left it alone"),
    ])
    .await;
    link_alice(&k, &mut adapter).await;
    let mut alice = k.alice().await;
    for f in ["doomed.txt", "keep.txt"] {
        alice
            .call(
                "fs.write",
                json!({"path": format!("~/{f}"), "content": "x"}),
            )
            .await
            .unwrap();
    }

    adapter.inbound(dm(), ALICE_MX, "delete doomed.txt").await;
    let prompt = adapter.take_send().await;
    let text = prompt["text"].as_str().unwrap();
    assert!(
        text.contains("Approval needed") && text.contains("doomed.txt"),
        "{text}"
    );
    assert!(text.contains("approve") && text.contains("deny"), "{text}");
    let r = adapter.inbound(dm(), ALICE_MX, "Approve").await;
    assert!(
        r["reply"]["text"].as_str().unwrap().starts_with("Approved"),
        "{r}"
    );
    assert!(
        r.get("delivered").is_none(),
        "an answer is not a new turn: {r}"
    );
    assert_eq!(adapter.take_send().await["text"], "deleted it");
    let gone = alice
        .call("fs.read", json!({"path": "~/doomed.txt"}))
        .await
        .unwrap();
    assert_eq!(gone["ok"], false, "{gone}");

    adapter.inbound(dm(), ALICE_MX, "delete keep.txt").await;
    let prompt = adapter.take_send().await;
    assert!(prompt["text"].as_str().unwrap().contains("keep.txt"));
    let r = adapter.inbound(dm(), ALICE_MX, "deny").await;
    assert!(
        r["reply"]["text"].as_str().unwrap().starts_with("Denied"),
        "{r}"
    );
    assert_eq!(adapter.take_send().await["text"], "left it alone");
    let kept = alice
        .call("fs.read", json!({"path": "~/keep.txt"}))
        .await
        .unwrap();
    assert_eq!(kept["ok"], true, "{kept}");
}

#[tokio::test]
async fn an_unlinked_group_message_is_dropped_with_its_reason_and_a_linked_one_is_delivered() {
    let (k, m, mut adapter) = setup(vec![answer("hi room")]).await;
    let room = json!({"kind": "group", "id": "!room:example.org"});
    let r = adapter.inbound(room.clone(), ALICE_MX, "hello all").await;
    assert_eq!(r["droppedReason"], "unlinked_actor", "{r}");
    assert!(
        r.get("challenge").is_none() && r.get("delivered").is_none(),
        "{r}"
    );
    assert!(m.requests().is_empty());
    let mut root = k.login("root", "root-password").await;
    let links = root.call("sys.link.list", json!({})).await.unwrap();
    assert_eq!(links["links"], json!([]), "nothing linked");

    link_alice(&k, &mut adapter).await;
    let r = adapter.inbound(room.clone(), ALICE_MX, "hello all").await;
    assert!(
        r["delivered"]["pid"].as_str().unwrap().starts_with("init:"),
        "{r}"
    );
    let sent = adapter.take_send().await;
    assert_eq!(
        (&sent["text"], &sent["surface"]),
        (&json!("hi room"), &room)
    );
    // In a room the agent is told who spoke.
    let asked = m.requests()[0]["messages"].to_string();
    assert!(asked.contains("[Alice] hello all"), "{asked}");
}

#[tokio::test]
async fn a_surface_route_sends_its_messages_to_that_process_until_the_process_is_gone() {
    let (k, m, mut adapter) = setup(vec![answer("one"), answer("two"), answer("three")]).await;
    let linked = link_alice(&k, &mut adapter).await;
    let uid = linked["link"]["uid"].as_i64().unwrap();
    let mut alice = Watcher::new(k.alice().await);
    let pid = alice
        .call("proc.spawn", json!({"label": "matrix room"}))
        .await["pid"]
        .as_str()
        .unwrap()
        .to_owned();
    let route = |pid: &str| {
        json!({"adapter": "Matrix", "accountId": ACCOUNT, "actorId": ALICE_MX,
               "surface": dm(), "pid": pid})
    };

    // Bad routes: nothing is stored.
    let mut bob = k.bob().await;
    let r = bob
        .request("sys.link.route.set", route(&pid))
        .await
        .unwrap();
    assert_eq!(err_of(&r).0, 403, "not bob's actor: {r}");
    let r = alice
        .request("sys.link.route.set", route("p_no_such_process"))
        .await;
    assert_eq!(err_of(&r).0, 404, "{r}");
    let bobs = bob.call("proc.spawn", json!({})).await.unwrap()["pid"]
        .as_str()
        .unwrap()
        .to_owned();
    let r = alice.request("sys.link.route.set", route(&bobs)).await;
    assert_eq!(err_of(&r).0, 404, "another account's process: {r}");
    let mut unlinked = route(&pid);
    unlinked["actorId"] = json!("@stranger:example.org");
    let r = alice.request("sys.link.route.set", unlinked).await;
    assert_eq!(err_of(&r).0, 404, "{r}");
    let mut bad_kind = route(&pid);
    bad_kind["surface"]["kind"] = json!("forum");
    let r = alice.request("sys.link.route.set", bad_kind).await;
    assert_eq!(err_of(&r).0, 400, "{r}");
    let r = adapter.request("sys.link.route.set", route(&pid)).await;
    assert_eq!(err_of(&r).0, 403, "a service routes nothing: {r}");
    assert_eq!(
        alice.call("sys.link.route.list", json!({})).await,
        json!({"routes": []})
    );

    let set = alice.call("sys.link.route.set", route(&pid)).await;
    assert_eq!(set["route"]["pid"], json!(pid), "{set}");
    assert_eq!(set["route"]["adapter"], "matrix", "lowercased");
    assert_eq!(set["route"]["uid"], uid);
    assert_eq!(set["route"]["surface"], dm());
    let listed = alice.call("sys.link.route.list", json!({})).await;
    assert_eq!(listed["routes"], json!([set["route"]]));
    assert_eq!(
        bob.call("sys.link.route.list", json!({})).await.unwrap(),
        json!({"routes": []})
    );
    let r = bob
        .request("sys.link.route.list", json!({"uid": uid}))
        .await
        .unwrap();
    assert_eq!(err_of(&r).0, 403, "{r}");

    // The DM goes to the routed process; a thread of it is another surface.
    let r = adapter.inbound(dm(), ALICE_MX, "to the room process").await;
    assert_eq!(r["delivered"]["pid"], json!(pid), "{r}");
    assert_eq!(adapter.take_send().await["text"], "one");
    let thread = json!({"kind": "dm", "id": DM_ROOM, "threadId": "$t"});
    let r = adapter.inbound(thread, ALICE_MX, "in a thread").await;
    assert_eq!(r["delivered"]["pid"], format!("init:{uid}"), "{r}");
    assert_eq!(adapter.take_send().await["text"], "two");

    // The process goes: the stale route is cleared, home takes over.
    alice
        .call("proc.kill", json!({"pid": pid, "remove": true}))
        .await;
    let r = adapter.inbound(dm(), ALICE_MX, "and now?").await;
    assert_eq!(r["delivered"]["pid"], format!("init:{uid}"), "{r}");
    assert_eq!(adapter.take_send().await["text"], "three");
    assert_eq!(m.requests().len(), 3);
    assert_eq!(
        alice.call("sys.link.route.list", json!({})).await,
        json!({"routes": []})
    );

    // Delete: yours only.
    let pid2 = alice.call("proc.spawn", json!({})).await["pid"]
        .as_str()
        .unwrap()
        .to_owned();
    alice.call("sys.link.route.set", route(&pid2)).await;
    let del = json!({"adapter": "matrix", "accountId": ACCOUNT, "actorId": ALICE_MX,
                     "surface": dm()});
    let not_his = bob
        .call("sys.link.route.delete", del.clone())
        .await
        .unwrap();
    assert_eq!(not_his["removed"], false);
    assert_eq!(
        alice.call("sys.link.route.delete", del.clone()).await["removed"],
        true
    );
    assert_eq!(
        alice.call("sys.link.route.delete", del).await["removed"],
        false
    );
}

#[tokio::test]
async fn a_redelivered_message_is_not_a_second_turn() {
    let (k, m, mut adapter) = setup(vec![answer("once"), answer("twice")]).await;
    link_alice(&k, &mut adapter).await;
    let first = adapter
        .inbound_id("$evt1", dm(), ALICE_MX, "count this once")
        .await;
    let run = first["delivered"]["runId"].clone();
    assert!(run.is_string(), "{first}");
    assert!(first.get("replayed").is_none(), "{first}");
    assert_eq!(adapter.take_send().await["text"], "once");

    // The platform (or the adapter after a reconnect) delivers it again:
    // the first result, marked, and no new turn.
    let again = adapter
        .inbound_id("$evt1", dm(), ALICE_MX, "count this once")
        .await;
    assert_eq!(again["replayed"], "completed", "{again}");
    assert_eq!(again["delivered"]["runId"], run);
    // The same id on another surface is another message.
    let elsewhere = json!({"kind": "group", "id": "!other:example.org"});
    let other = adapter
        .inbound_id("$evt1", elsewhere, ALICE_MX, "same id, other room")
        .await;
    assert_ne!(other["delivered"]["runId"], run, "{other}");
    assert!(other.get("replayed").is_none(), "{other}");
    assert_eq!(adapter.take_send().await["text"], "twice");
    assert_eq!(m.requests().len(), 2, "two turns, not three");
    let mut alice = k.alice().await;
    let h = alice.call("proc.history", json!({})).await.unwrap();
    assert_eq!(
        h["messages"].to_string().matches("count this once").count(),
        1,
        "{h}"
    );

    // A challenge is replayed too (the same code), and so is a drop.
    let bob_dm = json!({"kind": "dm", "id": "!dm-bob:example.org"});
    let c1 = adapter
        .inbound_id("$evt2", bob_dm.clone(), "@bob:example.org", "hi")
        .await;
    let c2 = adapter
        .inbound_id("$evt2", bob_dm, "@bob:example.org", "hi")
        .await;
    assert_eq!(c2["challenge"], c1["challenge"], "{c2}");
    assert_eq!(c2["replayed"], "completed");
}

#[tokio::test]
async fn an_answer_made_while_the_adapter_is_away_reaches_it_after_a_kernel_restart() {
    let gate = Arc::new(Notify::new());
    let (k, m, mut adapter) = setup(vec![Reply::Gated(
        vec![text("worth the wait")],
        gate.clone(),
    )])
    .await;
    link_alice(&k, &mut adapter).await;
    let r = adapter.inbound(dm(), ALICE_MX, "take your time").await;
    let run = r["delivered"]["runId"].as_str().unwrap().to_owned();
    // The adapter goes away while the model is still answering.
    adapter.ws.close().await;
    gate.notify_one();
    let outbox = |k: &TestKernel| {
        let db = k.kernel.db().clone();
        async move {
            db.call(|c| {
                let mut st = c.prepare("SELECT delivery_id, attempts FROM adapter_outbox")?;
                let rows =
                    st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
                Ok(rows.collect::<Result<Vec<_>, _>>()?)
            })
            .await
            .unwrap()
        }
    };
    let kept = eventually("the answer kept in the outbox", || async {
        let rows = outbox(&k).await;
        rows.first().is_some_and(|r| r.1 > 0).then_some(rows)
    })
    .await;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].0, format!("{run}:final"));

    // The kernel restarts; the adapter comes back and reports itself
    // connected: the answer is posted where the question was asked.
    let stopped = k.stop().await;
    let k = stopped.start().await;
    let token = service_token(&k).await;
    let mut adapter = ScriptedAdapter::connect(&k, &token).await;
    adapter.report_connected().await;
    let sent = adapter.take_send().await;
    assert_eq!(sent["text"], "worth the wait");
    assert_eq!(sent["deliveryId"], format!("{run}:final"));
    assert_eq!(sent["surface"], dm());
    assert_eq!(sent["actorId"], ALICE_MX);
    eventually("the outbox emptied", || async {
        outbox(&k).await.is_empty().then_some(())
    })
    .await;
    // Reported again: nothing is posted twice (the next post is alice's).
    adapter.report_connected().await;
    let mut alice = k.alice().await;
    let id = alice.fresh_id();
    let barrier = json!({"adapter": "matrix", "accountId": ACCOUNT, "surface": dm(),
                         "text": "after"});
    alice
        .send_request(&id, "adapter.send", barrier)
        .await
        .unwrap();
    assert_eq!(adapter.take_send().await["text"], "after");
    assert_eq!(m.requests().len(), 1);
}

#[tokio::test]
async fn link_codes_are_checked_one_use_and_expire() {
    let (k, _m, mut adapter) = setup(vec![]).await;
    let mut alice = k.alice().await;
    let bad = alice
        .request("sys.link.consume", json!({"code": "not a code"}))
        .await
        .unwrap();
    let (code, msg) = err_of(&bad);
    assert_eq!(code, 400);
    assert!(msg.contains("code"), "{msg}");
    let unknown = alice
        .request("sys.link.consume", json!({"code": "ABCD-EFGH"}))
        .await
        .unwrap();
    assert_eq!(err_of(&unknown).0, 404, "{unknown}");

    let r = adapter.inbound(dm(), ALICE_MX, "hi").await;
    let c = r["challenge"]["code"].as_str().unwrap().to_owned();
    let cc = c.clone();
    k.kernel
        .db()
        .call(move |db| {
            db.execute(
                "UPDATE link_challenges SET expires_at = 1 WHERE code = ?1",
                [&cc],
            )?;
            Ok(())
        })
        .await
        .unwrap();
    let expired = alice
        .request("sys.link.consume", json!({"code": c}))
        .await
        .unwrap();
    let (code, msg) = err_of(&expired);
    assert_eq!(code, 400);
    assert!(msg.contains("expired"), "{msg}");
    // The expired code is not offered again: the next DM gets a new one.
    let r = adapter.inbound(dm(), ALICE_MX, "hi again").await;
    let fresh = r["challenge"]["code"].as_str().unwrap().to_owned();
    assert_ne!(fresh, c);
    alice
        .call("sys.link.consume", json!({"code": fresh}))
        .await
        .unwrap();
    let reused = alice
        .request("sys.link.consume", json!({"code": fresh}))
        .await
        .unwrap();
    assert_eq!(err_of(&reused).0, 409, "{reused}");

    // Manual links: your own only; someone else's link is not taken over.
    let mut bob = k.bob().await;
    let over = bob
        .request(
            "sys.link",
            json!({"adapter": "Matrix", "accountId": ACCOUNT, "actorId": ALICE_MX}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&over).0, 409, "{over}");
    let foreign = bob
        .request(
            "sys.link",
            json!({"adapter": "matrix", "accountId": ACCOUNT, "actorId": "@b:x", "uid": 0}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&foreign).0, 403, "{foreign}");
    let mine = bob
        .call(
            "sys.link",
            json!({"adapter": "Matrix", "accountId": ACCOUNT, "actorId": "@bob:example.org"}),
        )
        .await
        .unwrap();
    assert_eq!(mine["link"]["adapter"], "matrix", "lowercased");
    let not_his = bob
        .call(
            "sys.unlink",
            json!({"adapter": "matrix", "accountId": ACCOUNT, "actorId": ALICE_MX}),
        )
        .await
        .unwrap();
    assert_eq!(not_his["removed"], false);
    let gone = alice
        .call(
            "sys.unlink",
            json!({"adapter": "matrix", "accountId": ACCOUNT, "actorId": ALICE_MX}),
        )
        .await
        .unwrap();
    assert_eq!(gone["removed"], true);
    let r = adapter.inbound(dm(), ALICE_MX, "still me").await;
    assert!(r["challenge"]["code"].is_string(), "unlinked again: {r}");
}

#[tokio::test]
async fn adapter_calls_answer_503_without_an_adapter_and_504_when_it_hangs() {
    let k = TestKernel::with_users_tuned(|c| c.adapter_timeout = Duration::from_millis(400)).await;
    let mut alice = k.alice().await;
    let send = json!({"adapter": "matrix", "accountId": ACCOUNT,
                      "surface": {"kind": "dm", "id": DM_ROOM}, "text": "ping"});
    let none = alice.request("adapter.send", send.clone()).await.unwrap();
    let (code, msg) = err_of(&none);
    assert_eq!(code, 503, "{none}");
    assert!(msg.contains("matrix"), "{msg}");
    // Status stays useful without the adapter (the last known state).
    let st = alice
        .call("adapter.status", json!({"adapter": "matrix"}))
        .await
        .unwrap();
    assert_eq!(st, json!({"adapter": "matrix", "accounts": []}));

    let token = service_token(&k).await;
    let mut adapter = ScriptedAdapter::connect(&k, &token).await;
    let id = alice.fresh_id();
    alice
        .send_request(&id, "adapter.send", send.clone())
        .await
        .unwrap();
    let req = adapter.next_req("adapter.send").await;
    assert_eq!(req["args"]["text"], "ping");
    assert!(req["args"]["deliveryId"].is_string(), "{req}");
    // The adapter never answers: 504 at the TTL, and it is told to stop.
    let res = alice.response_to(&id).await.unwrap();
    assert_eq!(err_of(&res).0, 504, "{res}");
    let cancel = adapter
        .next(|f| f["type"] == "sig" && f["signal"] == "request.cancel")
        .await;
    assert_eq!(cancel["payload"]["id"], req["id"]);
    // A late answer goes nowhere; the kernel keeps serving.
    adapter.reply(&req, json!({"ok": true})).await;
    alice.call("proc.list", json!({})).await.unwrap();

    // Answered in time: the adapter's result, with the kernel's deliveryId.
    let id = alice.fresh_id();
    alice
        .send_request(&id, "adapter.send", send.clone())
        .await
        .unwrap();
    adapter.take_send().await;
    let ok = alice.response_to(&id).await.unwrap();
    assert_eq!(ok["data"]["ok"], true, "{ok}");
    assert!(
        ok["data"]["deliveryId"]
            .as_str()
            .unwrap()
            .starts_with("dlv_")
    );

    let id = alice.fresh_id();
    alice
        .send_request(
            &id,
            "adapter.connect",
            json!({"adapter": "matrix", "accountId": ACCOUNT, "config": {"x": 1}}),
        )
        .await
        .unwrap();
    let req = adapter.next_req("adapter.connect").await;
    assert_eq!(req["args"]["config"], json!({"x": 1}));
    adapter
        .reply(
            &req,
            json!({"ok": true, "adapter": "matrix", "accountId": ACCOUNT,
                   "connected": true, "authenticated": true}),
        )
        .await;
    let res = alice.response_to(&id).await.unwrap();
    assert_eq!(res["data"]["connected"], true, "{res}");

    // The adapter goes away while a call waits: 503 at once, and after.
    let id = alice.fresh_id();
    alice
        .send_request(&id, "adapter.send", send.clone())
        .await
        .unwrap();
    adapter.next_req("adapter.send").await;
    adapter.ws.close().await;
    let res = alice.response_to(&id).await.unwrap();
    assert_eq!(err_of(&res).0, 503, "{res}");
    let after = alice.request("adapter.send", send).await.unwrap();
    assert_eq!(err_of(&after).0, 503, "{after}");
    let st = alice
        .call("adapter.status", json!({"adapter": "matrix"}))
        .await
        .unwrap();
    assert_eq!(
        st["accounts"][0]["accountId"], ACCOUNT,
        "the last known state"
    );
}

#[tokio::test]
async fn state_updates_are_recorded_and_told_to_every_service_socket() {
    let (k, _m, mut adapter) = setup(vec![]).await;
    let token = service_token(&k).await;
    let (mut other, res) = ScriptedAdapter::try_connect(&k, &token, "telegram").await;
    assert_eq!(res["ok"], true, "{res}");
    let update = json!({"adapter": "matrix", "accountId": ACCOUNT,
                        "status": {"accountId": ACCOUNT, "connected": true,
                                   "authenticated": true, "mode": "sync"}});
    assert_eq!(
        adapter.call("adapter.state.update", update).await,
        json!({"ok": true})
    );
    let sig = other
        .next(|f| f["type"] == "sig" && f["signal"] == "adapter.status")
        .await;
    assert_eq!(sig["payload"]["status"]["mode"], "sync", "{sig}");
    // A user asks; the live adapter answers status, which is recorded.
    let mut alice = k.alice().await;
    let id = alice.fresh_id();
    alice
        .send_request(&id, "adapter.status", json!({"adapter": "matrix"}))
        .await
        .unwrap();
    let req = adapter.next_req("adapter.status").await;
    adapter
        .reply(
            &req,
            json!({"adapter": "matrix", "accounts": [{"accountId": ACCOUNT,
                   "connected": true, "authenticated": false, "error": "token expired"}]}),
        )
        .await;
    let st = alice.response_to(&id).await.unwrap();
    assert_eq!(st["data"]["accounts"][0]["error"], "token expired", "{st}");
    assert_eq!(st["data"]["accounts"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn bad_input_is_refused_and_nothing_is_linked_or_delivered() {
    let (k, m, mut adapter) = setup(vec![]).await;
    let inbound = |text: Value, kind: &str| {
        json!({"adapter": "matrix", "accountId": ACCOUNT,
               "message": {"messageId": "$x", "surface": {"kind": kind, "id": DM_ROOM},
                           "actor": {"id": ALICE_MX}, "text": text}})
    };
    // A user socket: no capability; root's socket: not a service.
    let mut alice = k.alice().await;
    let r = alice
        .request("adapter.inbound", inbound(json!("hi"), "dm"))
        .await
        .unwrap();
    assert_eq!(
        err_of(&r),
        (403, "Permission denied: adapter.inbound".into())
    );
    // A socket of its own: `service_token` logs root in as the CLI would.
    let mut root = k.login_from("root-console", "root", "root-password").await;
    let r = root
        .request("adapter.inbound", inbound(json!("hi"), "dm"))
        .await
        .unwrap();
    let (code, msg) = err_of(&r);
    assert_eq!(code, 403);
    assert!(msg.contains("service role only"), "{msg}");
    let r = root
        .request(
            "adapter.state.update",
            json!({"adapter": "matrix", "accountId": ACCOUNT,
                   "status": {"accountId": ACCOUNT, "connected": true, "authenticated": true}}),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&r).0, 403);

    // A service token is not a user's.
    let token = service_token(&k).await;
    let mut c = k.raw().await;
    let r = c
        .request(
            "sys.connect",
            connect_args("cli", "user", json!({"token": token})),
        )
        .await
        .unwrap();
    assert_eq!(err_of(&r).0, 401, "{r}");
    // A service without a channel, or with a malformed one.
    let (_s, r) = ScriptedAdapter::try_connect(&k, &token, "").await;
    assert_eq!(err_of(&r).0, 103, "{r}");
    let (_s, r) = ScriptedAdapter::try_connect(&k, &token, "no such/thing").await;
    assert_eq!(err_of(&r).0, 103, "{r}");

    // The adapter speaks for itself only, and only in the contract's shapes.
    let mut other = inbound(json!("hi"), "dm");
    other["adapter"] = json!("telegram");
    let r = adapter.request("adapter.inbound", other).await;
    assert_eq!(err_of(&r).0, 403, "{r}");
    let r = adapter
        .request("adapter.inbound", inbound(json!("hi"), "forum"))
        .await;
    let (code, msg) = err_of(&r);
    assert_eq!(code, 400);
    assert!(
        msg.contains("message.surface.kind") && msg.contains("forum"),
        "{msg}"
    );
    let huge = "x".repeat(64 * 1024 + 1);
    let r = adapter
        .request("adapter.inbound", inbound(json!(huge), "dm"))
        .await;
    let (code, msg) = err_of(&r);
    assert_eq!(code, 400);
    assert!(msg.contains("message.text"), "{msg}");
    let mut no_id = inbound(json!("hi"), "dm");
    no_id["message"]["surface"]["id"] = json!(" ");
    let r = adapter.request("adapter.inbound", no_id).await;
    assert!(err_of(&r).1.contains("message.surface.id"), "{r}");
    // A service cannot link anyone.
    let r = adapter
        .request("sys.link.consume", json!({"code": "ABCD-EFGH"}))
        .await;
    assert_eq!(err_of(&r).0, 403, "{r}");
    // A user's bad adapter name.
    let r = alice
        .request(
            "adapter.send",
            json!({"adapter": "", "accountId": ACCOUNT,
                   "surface": {"kind": "dm", "id": DM_ROOM}, "text": "x"}),
        )
        .await
        .unwrap();
    assert!(err_of(&r).1.contains("adapter:"), "{r}");

    let links = root.call("sys.link.list", json!({})).await.unwrap();
    assert_eq!(links["links"], json!([]));
    let challenges: i64 = k
        .kernel
        .db()
        .call(|c| Ok(c.query_row("SELECT count(*) FROM link_challenges", [], |r| r.get(0))?))
        .await
        .unwrap();
    assert_eq!(challenges, 0, "no code was issued");
    assert!(m.requests().is_empty(), "nothing was delivered");
}
