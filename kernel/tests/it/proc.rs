//! `proc.*` and the agent loop against a scripted OpenAI-compatible server:
//! a real axum app on 127.0.0.1:0 streaming server-sent events.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Read as _;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::StreamExt;
use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::harness::{ALICE_PW, TestKernel, err_of};

/// One scripted answer of the model server.
pub(crate) enum Reply {
    /// These chunks, then `[DONE]`.
    Sse(Vec<Value>),
    /// These chunks, then wait for the gate before `[DONE]`.
    Gated(Vec<Value>, Arc<Notify>),
    /// These chunks, wait for the gate, then those chunks and `[DONE]`.
    GatedThen(Vec<Value>, Arc<Notify>, Vec<Value>),
    /// These chunks, then never another byte.
    StreamThenHang(Vec<Value>),
    Status(u16),
    /// Accept the request and never answer.
    Hang,
}

#[derive(Default)]
struct Script {
    replies: Mutex<VecDeque<Reply>>,
    /// Request bodies, in arrival order.
    requests: Mutex<Vec<Value>>,
}

pub(crate) struct ModelServer {
    pub(crate) base_url: String,
    script: Arc<Script>,
}

impl ModelServer {
    pub(crate) async fn start(replies: Vec<Reply>) -> ModelServer {
        let script = Arc::new(Script {
            replies: Mutex::new(replies.into()),
            requests: Mutex::default(),
        });
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        ModelServer { base_url, script }
    }

    pub(crate) fn requests(&self) -> Vec<Value> {
        self.script.requests.lock().unwrap().clone()
    }
}

fn sse(chunks: Vec<Value>) -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok(Bytes::from(format!("data: {c}\n\n")))),
    )
}

fn done() -> impl futures::Stream<Item = Result<Bytes, Infallible>> {
    futures::stream::iter([Ok(Bytes::from_static(b"data: [DONE]\n\n"))])
}

fn stream_response(body: Body) -> Response {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap()
}

async fn completions(State(s): State<Arc<Script>>, body: String) -> Response {
    s.requests
        .lock()
        .unwrap()
        .push(serde_json::from_str(&body).unwrap());
    let reply = s.replies.lock().unwrap().pop_front();
    match reply {
        None => (StatusCode::INTERNAL_SERVER_ERROR, "script exhausted").into_response(),
        Some(Reply::Status(code)) => {
            (StatusCode::from_u16(code).unwrap(), "scripted failure").into_response()
        }
        Some(Reply::Sse(chunks)) => stream_response(Body::from_stream(sse(chunks).chain(done()))),
        Some(Reply::Gated(chunks, gate)) => {
            let wait = futures::stream::once(async move {
                gate.notified().await;
                Ok::<_, Infallible>(Bytes::new())
            });
            stream_response(Body::from_stream(sse(chunks).chain(wait).chain(done())))
        }
        Some(Reply::GatedThen(first, gate, then)) => {
            let wait = futures::stream::once(async move {
                gate.notified().await;
                Ok::<_, Infallible>(Bytes::new())
            });
            stream_response(Body::from_stream(
                sse(first).chain(wait).chain(sse(then)).chain(done()),
            ))
        }
        Some(Reply::StreamThenHang(chunks)) => stream_response(Body::from_stream(
            sse(chunks).chain(futures::stream::pending()),
        )),
        Some(Reply::Hang) => {
            std::future::pending::<()>().await;
            unreachable!()
        }
    }
}

pub(crate) fn text(t: &str) -> Value {
    json!({"choices": [{"index": 0, "delta": {"content": t}}]})
}

pub(crate) fn tool(id: &str, name: &str, args: Value) -> Value {
    json!({"choices": [{"index": 0, "delta": {"tool_calls": [{
        "index": 0, "id": id, "type": "function",
        "function": {"name": name, "arguments": args.to_string()}}]}}]})
}

pub(crate) fn answer(t: &str) -> Reply {
    Reply::Sse(vec![text(t)])
}

/// A user client that keeps the signals it sees while waiting for answers.
pub(crate) struct Watcher {
    pub(crate) c: GsvClient,
    pub(crate) seen: VecDeque<Value>,
}

impl Watcher {
    pub(crate) fn new(c: GsvClient) -> Watcher {
        Watcher {
            c,
            seen: VecDeque::new(),
        }
    }

    pub(crate) async fn request(&mut self, call: &str, args: Value) -> Value {
        let id = self.c.fresh_id();
        self.c.send_request(&id, call, args).await.unwrap();
        loop {
            let f = self.c.recv().await.unwrap();
            if f["type"] == "res" && f["id"] == id {
                return f;
            }
            if f["type"] == "sig" {
                self.seen.push_back(f);
            }
        }
    }

    pub(crate) async fn call(&mut self, call: &str, args: Value) -> Value {
        let f = self.request(call, args).await;
        assert_eq!(f["ok"], true, "{call}: {f}");
        f["data"].clone()
    }

    /// The next signal named `name` whose payload satisfies `pred`; earlier
    /// non-matching signals are kept. Bounded by the client's timeout.
    pub(crate) async fn signal(&mut self, name: &str, pred: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self
            .seen
            .iter()
            .position(|s| s["signal"] == name && pred(&s["payload"]))
        {
            return self.seen.remove(i).unwrap()["payload"].clone();
        }
        loop {
            let f = match self.c.recv().await {
                Ok(f) => f,
                Err(e) => panic!("waiting for {name}: {e}; seen {:?}", self.seen),
            };
            if f["type"] == "sig" {
                if f["signal"] == name && pred(&f["payload"]) {
                    return f["payload"].clone();
                }
                self.seen.push_back(f);
            }
        }
    }

    /// A new process of this user and the answer to its first `proc.send`.
    pub(crate) async fn spawn_and_send(&mut self, message: &str) -> (Value, Value) {
        let pid = self.call("proc.spawn", json!({})).await["pid"].clone();
        let sent = self
            .call("proc.send", json!({"pid": pid, "message": message}))
            .await;
        (pid, sent)
    }

    pub(crate) async fn finished(&mut self, run_id: &Value) -> Value {
        let r = run_id.clone();
        self.signal("proc.run.finished", move |p| p["runId"] == r)
            .await
    }
}

/// Points the kernel at `server` (root owns `config/ai/*`).
pub(crate) async fn configure(k: &TestKernel, base_url: &str, extra: &[(&str, &str)]) {
    let mut root = k.login("root", "root-password").await;
    let mut set = vec![
        ("config/ai/provider", "openai"),
        ("config/ai/model", "scripted"),
        ("config/ai/base_url", base_url),
        ("config/ai/api_key", "sk-test"),
        ("config/ai/retry_base_ms", "10"),
    ];
    set.extend_from_slice(extra);
    for (key, value) in set {
        root.call("sys.config.set", json!({"key": key, "value": value}))
            .await
            .unwrap();
    }
    root.close().await;
}

pub(crate) async fn setup(
    replies: Vec<Reply>,
    extra: &[(&str, &str)],
) -> (TestKernel, ModelServer, Watcher) {
    let k = TestKernel::with_users().await;
    let m = ModelServer::start(replies).await;
    configure(&k, &m.base_url, extra).await;
    let a = Watcher::new(k.alice().await);
    (k, m, a)
}

#[tokio::test]
async fn a_run_that_writes_a_file_then_answers_leaves_the_file_in_the_workspace() {
    let (_k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool(
                "c1",
                "Write",
                json!({"path": "hello.txt", "content": "hi from the model\n"}),
            )]),
            Reply::Sse(vec![text("Wrote "), text("hello.txt.")]),
        ],
        &[],
    )
    .await;
    let p = a
        .call(
            "proc.spawn",
            json!({"label": "w", "workspace": {"mode": "new"}}),
        )
        .await;
    let pid = p["pid"].clone();
    assert!(pid.as_str().unwrap().starts_with("proc:"), "{p}");
    let ws = p["workspaceId"].as_str().unwrap().to_owned();
    assert_eq!(p["cwd"], format!("/workspaces/{ws}"));
    let s = a
        .call(
            "proc.send",
            json!({"pid": pid, "message": "write hello.txt"}),
        )
        .await;
    assert_eq!(s["status"], "started");
    let started = a.signal("proc.run.tool.started", |_| true).await;
    assert_eq!(started["syscall"], "fs.write");
    let done = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Write")
        .await;
    assert_eq!(done["isError"], false, "{done}");
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["status"], "completed");
    assert_eq!(fin["text"], "Wrote hello.txt.");
    assert_eq!(fin["pid"], pid);
    let r = a
        .call(
            "fs.read",
            json!({"path": format!("/workspaces/{ws}/hello.txt")}),
        )
        .await;
    assert_eq!(r["content"], "1\thi from the model");
    let h = a.call("proc.history", json!({"pid": pid})).await;
    let roles: Vec<&str> = h["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "toolResult", "assistant"]);
    // The second model call saw the tool result, tied to its call id.
    let second = &m.requests()[1];
    let tool_msg = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(tool_msg["tool_call_id"], "c1");
    assert_eq!(second["model"], "scripted");
    assert_eq!(second["stream"], true);
    let list = a.call("proc.list", json!({})).await;
    assert_eq!(list["processes"][0]["state"], "idle");
}

#[tokio::test]
async fn streamed_text_arrives_as_text_delta_signals() {
    let (_k, _m, mut a) = setup(
        vec![Reply::Sse(vec![text("Hel"), text("lo")])],
        &[("config/ai/context.d/00-rules.md", "Be brief.")],
    )
    .await;
    let (_, s) = a.spawn_and_send("hi").await;
    let mut events = Vec::new();
    loop {
        let e = a.signal("proc.run.stream", |_| true).await;
        let done = e["event"]["type"] == "done";
        events.push(e);
        if done {
            break;
        }
    }
    let kinds: Vec<Value> = events.iter().map(|e| e["event"].clone()).collect();
    assert_eq!(
        kinds,
        vec![
            json!({"type": "text_start", "contentIndex": 0}),
            json!({"type": "text_delta", "contentIndex": 0, "delta": "Hel"}),
            json!({"type": "text_delta", "contentIndex": 0, "delta": "lo"}),
            json!({"type": "text_end", "contentIndex": 0}),
            json!({"type": "done", "reason": "stop"}),
        ]
    );
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, [0, 1, 2, 3, 4]);
    assert!(events.iter().all(|e| e["conversationId"] == "default"));
    assert_eq!(a.finished(&s["runId"]).await["text"], "Hello");
}

#[tokio::test]
async fn a_runs_signals_go_only_to_the_socket_that_sent_its_message() {
    let (k, _m, mut a) = setup(vec![answer("just for you")], &[]).await;
    let mut second = Watcher::new(k.login_from("second-screen", "alice", ALICE_PW).await);
    let (_, s) = a.spawn_and_send("hi").await;
    assert_eq!(a.finished(&s["runId"]).await["text"], "just for you");
    // One writer per socket: anything sent to the second socket before the
    // run finished arrives ahead of this answer.
    second.call("proc.list", json!({})).await;
    let run_signals: Vec<_> = second
        .seen
        .iter()
        .filter(|f| f["signal"].as_str().unwrap().starts_with("proc.run."))
        .collect();
    assert!(run_signals.is_empty(), "{run_signals:?}");
}

#[tokio::test]
async fn a_runs_signals_reach_the_owners_other_sockets_once_its_socket_is_gone() {
    let gate = Arc::new(Notify::new());
    let (k, _m, mut a) = setup(
        vec![Reply::Gated(vec![text("still here")], gate.clone())],
        &[],
    )
    .await;
    let mut second = Watcher::new(k.login_from("second-screen", "alice", ALICE_PW).await);
    let (_, s) = second.spawn_and_send("hi").await;
    second.signal("proc.run.stream", |_| true).await;
    let before = k.kernel.pool().len();
    second.c.close().await;
    // The kernel notices the close on its own time; bounded wait for it.
    for _ in 0..500 {
        if k.kernel.pool().len() < before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(
        k.kernel.pool().len() < before,
        "the closed socket left the pool"
    );
    gate.notify_one();
    assert_eq!(a.finished(&s["runId"]).await["text"], "still here");
}

#[tokio::test]
async fn the_system_prompt_holds_system_context_and_is_bounded() {
    let (_k, m, mut a) = setup(
        vec![answer("ok")],
        &[
            ("config/ai/context.d/00-rules.md", "Always be brief."),
            ("config/ai/max_context_bytes", "40"),
        ],
    )
    .await;
    let (_, s) = a.spawn_and_send("hi").await;
    a.finished(&s["runId"]).await;
    let sys = m.requests()[0]["messages"][0].clone();
    assert_eq!(sys["role"], "system");
    let content = sys["content"].as_str().unwrap();
    assert!(
        content.starts_with("[system.00-rules.md]\nAlways be brief."),
        "{content}"
    );
    assert!(content.len() <= 40, "{content}");
}

#[tokio::test]
async fn a_delete_waits_for_approval_and_runs_once_approved() {
    let (_k, _m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool(
                "c1",
                "Write",
                json!({"path": "doomed.txt", "content": "x"}),
            )]),
            Reply::Sse(vec![tool("c2", "Delete", json!({"path": "doomed.txt"}))]),
            answer("deleted"),
        ],
        &[],
    )
    .await;
    let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
    let s = a
        .call(
            "proc.send",
            json!({"pid": pid, "message": "make and delete"}),
        )
        .await;
    let req = a.signal("proc.run.hil.requested", |_| true).await;
    assert_eq!(req["syscall"], "fs.delete");
    assert_eq!(req["tags"], json!(["delete"]));
    let list = a.call("proc.list", json!({})).await;
    assert_eq!(list["processes"][0]["state"], "waiting_hil");
    // Still there while waiting.
    a.call("fs.read", json!({"path": "~/doomed.txt"})).await;
    let h = a
        .call(
            "proc.hil",
            json!({"requestId": req["requestId"], "decision": "approve"}),
        )
        .await;
    assert_eq!(h["resumed"], true);
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["text"], "deleted");
    let gone = a.call("fs.read", json!({"path": "~/doomed.txt"})).await;
    assert_eq!(gone["ok"], false, "{gone}");
    // An answered request cannot be answered again.
    let again = a
        .request(
            "proc.hil",
            json!({"requestId": req["requestId"], "decision": "approve"}),
        )
        .await;
    assert_eq!(err_of(&again).0, 403);
}

#[tokio::test]
async fn a_denied_delete_becomes_a_tool_error_the_model_sees() {
    let (_k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool(
                "c1",
                "Write",
                json!({"path": "keep.txt", "content": "x"}),
            )]),
            Reply::Sse(vec![tool("c2", "Delete", json!({"path": "keep.txt"}))]),
            answer("ok, kept"),
        ],
        &[],
    )
    .await;
    let (_, s) = a.spawn_and_send("go").await;
    let req = a.signal("proc.run.hil.requested", |_| true).await;
    a.call(
        "proc.hil",
        json!({"requestId": req["requestId"], "decision": "deny"}),
    )
    .await;
    let done = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Delete")
        .await;
    assert_eq!(done["isError"], true);
    assert!(done["error"].as_str().unwrap().contains("denied"), "{done}");
    a.finished(&s["runId"]).await;
    a.call("fs.read", json!({"path": "~/keep.txt"})).await;
    let last = m.requests().last().unwrap().clone();
    let tool_msg = last["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(tool_msg["role"], "tool");
    assert!(tool_msg["content"].as_str().unwrap().contains("denied"));
}

#[tokio::test]
async fn an_approval_request_reaches_every_socket_of_the_owner_and_any_may_answer() {
    let (k, _m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool("c1", "Delete", json!({"path": "gone.txt"}))]),
            answer("as you wish"),
        ],
        &[],
    )
    .await;
    let mut second = Watcher::new(k.login_from("second-screen", "alice", ALICE_PW).await);
    let (_, s) = a.spawn_and_send("go").await;
    let req = second.signal("proc.run.hil.requested", |_| true).await;
    assert_eq!(req["runId"], s["runId"]);
    a.signal("proc.run.hil.requested", |_| true).await;
    second
        .call(
            "proc.hil",
            json!({"requestId": req["requestId"], "decision": "deny"}),
        )
        .await;
    assert_eq!(a.finished(&s["runId"]).await["text"], "as you wish");
}

#[tokio::test]
async fn unknown_tools_and_failed_syscalls_are_tool_result_errors() {
    let (_k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool("c1", "Teleport", json!({}))]),
            Reply::Sse(vec![tool(
                "c2",
                "Read",
                json!({"path": "/nope/missing.txt"}),
            )]),
            answer("gave up"),
        ],
        &[],
    )
    .await;
    let (_, s) = a.spawn_and_send("go").await;
    let t1 = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Teleport")
        .await;
    assert_eq!(t1["error"], "Unknown tool: Teleport");
    let t2 = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Read")
        .await;
    assert_eq!(t2["isError"], true);
    assert_eq!(a.finished(&s["runId"]).await["status"], "completed");
    assert_eq!(m.requests().len(), 3);
}

#[tokio::test]
async fn a_message_sent_during_a_run_is_queued_counted_and_runs_next() {
    let gate = Arc::new(Notify::new());
    let (_k, m, mut a) = setup(
        vec![
            Reply::GatedThen(vec![text("fir")], gate.clone(), vec![text("st")]),
            answer("second"),
        ],
        &[],
    )
    .await;
    let (pid, s1) = a.spawn_and_send("one").await;
    let d1 = a
        .signal("proc.run.stream", |p| p["event"]["type"] == "text_delta")
        .await;
    assert_eq!(d1["queuedCount"], 0, "{d1}");
    let s2 = a
        .call("proc.send", json!({"pid": pid, "message": "two"}))
        .await;
    assert_eq!(s2["queued"], true, "{s2}");
    assert_eq!(s2["runId"], s1["runId"]);
    gate.notify_one();
    let d2 = a
        .signal("proc.run.stream", |p| p["event"]["type"] == "text_delta")
        .await;
    assert_eq!(
        (d2["event"]["delta"].clone(), d2["queuedCount"].clone()),
        (json!("st"), json!(1)),
        "a delta after the send counts the queued message: {d2}"
    );
    let f1 = a.finished(&s1["runId"]).await;
    assert_eq!(
        (f1["text"].clone(), f1["queuedCount"].clone()),
        (json!("first"), json!(1))
    );
    let started = a
        .signal("proc.run.started", |p| p["runId"] != s1["runId"])
        .await;
    let f2 = a.finished(&started["runId"]).await;
    assert_eq!(f2["text"], "second");
    let msgs = m.requests()[1]["messages"].clone();
    assert_eq!(msgs.as_array().unwrap().last().unwrap()["content"], "two");
}

#[tokio::test]
async fn a_queued_message_joins_the_run_at_the_tool_result_boundary() {
    let gate = Arc::new(Notify::new());
    let (_k, m, mut a) = setup(
        vec![
            Reply::Gated(
                vec![tool(
                    "c1",
                    "Write",
                    json!({"path": "a.txt", "content": "a"}),
                )],
                gate.clone(),
            ),
            answer("both handled"),
        ],
        &[],
    )
    .await;
    let (pid, s) = a.spawn_and_send("one").await;
    a.signal("proc.run.stream", |_| true).await;
    let q = a
        .call("proc.send", json!({"pid": pid, "message": "also this"}))
        .await;
    assert_eq!(q["queued"], true);
    gate.notify_one();
    assert_eq!(a.finished(&s["runId"]).await["text"], "both handled");
    let msgs = m.requests()[1]["messages"].clone();
    let last = msgs.as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (last["role"].clone(), last["content"].clone()),
        (json!("user"), json!("also this"))
    );
    assert_eq!(m.requests().len(), 2);
}

#[tokio::test]
async fn abort_mid_stream_finishes_the_run_as_aborted() {
    let (_k, _m, mut a) = setup(
        vec![
            Reply::StreamThenHang(vec![text("thinking...")]),
            answer("fresh"),
        ],
        &[],
    )
    .await;
    let (pid, s) = a.spawn_and_send("go").await;
    a.signal("proc.run.stream", |_| true).await;
    let ab = a.call("proc.abort", json!({"pid": pid})).await;
    assert_eq!(ab["aborted"], true);
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(
        (fin["status"].clone(), fin["aborted"].clone()),
        (json!("aborted"), json!(true))
    );
    // The process takes new work afterwards.
    let s2 = a
        .call("proc.send", json!({"pid": pid, "message": "again"}))
        .await;
    assert_eq!(a.finished(&s2["runId"]).await["text"], "fresh");
}

#[tokio::test]
async fn a_provider_500_is_retried_and_the_run_completes() {
    let (_k, m, mut a) = setup(vec![Reply::Status(500), answer("recovered")], &[]).await;
    let (_, s) = a.spawn_and_send("go").await;
    let r = a.signal("proc.run.retrying", |_| true).await;
    assert_eq!(r["attempt"], 1);
    assert!(r["error"].as_str().unwrap().contains("500"), "{r}");
    assert_eq!(a.finished(&s["runId"]).await["text"], "recovered");
    assert_eq!(m.requests().len(), 2);
}

#[tokio::test]
async fn a_provider_that_never_answers_times_out_with_a_clear_error() {
    let (_k, _m, mut a) = setup(
        vec![Reply::Hang],
        &[
            ("config/ai/timeout_ms", "300"),
            ("config/ai/max_retries", "0"),
        ],
    )
    .await;
    let (_, s) = a.spawn_and_send("go").await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["status"], "error");
    let e = fin["error"].as_str().unwrap();
    assert!(e.contains("did not answer within 0.3 s"), "{e}");
}

#[tokio::test]
async fn an_unreachable_or_unconfigured_provider_ends_the_run_with_an_error() {
    let k = TestKernel::with_users().await;
    let mut a = Watcher::new(k.alice().await);
    let (pid, s) = a.spawn_and_send("go").await;
    let fin = a.finished(&s["runId"]).await;
    assert!(
        fin["error"]
            .as_str()
            .unwrap()
            .contains("No model configured"),
        "{fin}"
    );
    // A port nothing listens on.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", l.local_addr().unwrap());
    drop(l);
    configure(&k, &dead, &[("config/ai/max_retries", "1")]).await;
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "go"}))
        .await;
    a.signal("proc.run.retrying", |_| true).await;
    let fin = a.finished(&s["runId"]).await;
    let e = fin["error"].as_str().unwrap();
    assert!(e.contains("unreachable") && e.contains(&dead), "{e}");
}

#[tokio::test]
async fn another_user_can_neither_see_nor_drive_the_process() {
    let (k, _m, mut a) = setup(vec![], &[]).await;
    let pid = a.call("proc.spawn", json!({"label": "private"})).await["pid"].clone();
    let mut b = Watcher::new(k.bob().await);
    let list = b.call("proc.list", json!({})).await;
    let pids: Vec<&Value> = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["pid"])
        .collect();
    assert_eq!(pids, [&json!("init:1001")], "only bob's home process");
    let alice_uid = a.call("proc.list", json!({})).await["processes"][0]["uid"].clone();
    let (code, msg) = err_of(&b.request("proc.list", json!({"uid": alice_uid})).await);
    assert_eq!(code, 403, "{msg}");
    for (call, args) in [
        ("proc.send", json!({"pid": pid, "message": "hi"})),
        ("proc.history", json!({"pid": pid})),
        ("proc.abort", json!({"pid": pid})),
        ("proc.reset", json!({"pid": pid})),
        ("proc.kill", json!({"pid": pid})),
        ("proc.conversation.list", json!({"pid": pid})),
        (
            "proc.conversation.compact",
            json!({"pid": pid, "summary": "x", "keepLast": 1}),
        ),
        ("proc.conversation.segments", json!({"pid": pid})),
    ] {
        let f = b.request(call, args).await;
        let (code, msg) = err_of(&f);
        assert_eq!(code, 403, "{call}: {msg}");
        assert!(msg.contains(pid.as_str().unwrap()), "{msg}");
    }
    // Unknown pids answer the same as foreign ones.
    let f = b.request("proc.history", json!({"pid": "proc:nope"})).await;
    assert_eq!(err_of(&f).0, 403);
    let mut root = Watcher::new(k.login("root", "root-password").await);
    let all = root.call("proc.list", json!({})).await;
    assert!(
        all["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pid),
        "{all}"
    );
}

#[tokio::test]
async fn reset_archives_the_history_as_gzip_jsonl_and_clears_it() {
    let (k, _m, mut a) = setup(vec![answer("hello there")], &[]).await;
    let (pid, s) = a.spawn_and_send("hi").await;
    a.finished(&s["runId"]).await;
    let r = a.call("proc.reset", json!({"pid": pid})).await;
    let path = r["archivePath"].as_str().unwrap().to_owned();
    // The reference CLI prints these two; every conversation's archive
    // lies in the one directory.
    assert_eq!(r["archivedMessages"], 2);
    let dir = r["archivedTo"].as_str().unwrap();
    assert_eq!(path, format!("{dir}/default.jsonl.gz"));
    assert_eq!(
        r["archives"],
        json!([{"conversationId": "default", "generation": 0, "messages": 2, "path": path}])
    );
    let uuid = pid.as_str().unwrap().trim_start_matches("proc:");
    assert!(
        path.starts_with(&format!("/var/sessions/alice/{uuid}/")),
        "{path}"
    );
    assert!(path.ends_with(".jsonl.gz"));
    let h = a.call("proc.history", json!({"pid": pid})).await;
    assert_eq!(h["messages"], json!([]));
    let p = wsd_sync::SyncPath::canonicalize(path.trim_start_matches('/')).unwrap();
    let gz = k.kernel.system().lock().unwrap().read_file(&p).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut text)
        .unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        (lines[0]["role"].clone(), lines[0]["content"].clone()),
        (json!("user"), json!("hi"))
    );
    assert_eq!(lines[1]["content"], "hello there");
    let killed = a
        .call("proc.kill", json!({"pid": pid, "archive": false}))
        .await;
    assert_eq!(killed["ok"], true);
    // Killing clears the state but keeps the registry row.
    let list = a.call("proc.list", json!({})).await;
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == pid),
        "{list}"
    );
}

#[tokio::test]
async fn a_non_interactive_process_gets_a_tool_error_instead_of_asking() {
    let (_k, _m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool(
                "c1",
                "Shell",
                json!({"command": "sudo rm -rf /"}),
            )]),
            answer("could not"),
        ],
        &[],
    )
    .await;
    let pid = a.call("proc.spawn", json!({"interactive": false})).await["pid"].clone();
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "go"}))
        .await;
    let t = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Shell")
        .await;
    let e = t["error"].as_str().unwrap();
    assert!(
        e.contains("needs approval") && e.contains("destructive"),
        "{e}"
    );
    assert_eq!(a.finished(&s["runId"]).await["text"], "could not");
}

#[tokio::test]
async fn remember_allows_later_deletes_of_the_same_process_without_asking() {
    let (_k, _m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool("c1", "Delete", json!({"path": "x1"}))]),
            answer("one"),
            Reply::Sse(vec![tool("c2", "Delete", json!({"path": "x2"}))]),
            answer("two"),
        ],
        &[],
    )
    .await;
    let (pid, s) = a.spawn_and_send("a").await;
    let req = a.signal("proc.run.hil.requested", |_| true).await;
    a.call(
        "proc.hil",
        json!({"requestId": req["requestId"], "decision": "approve", "remember": true}),
    )
    .await;
    a.finished(&s["runId"]).await;
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "b"}))
        .await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["text"], "two");
    assert!(
        !a.seen
            .iter()
            .any(|f| f["signal"] == "proc.run.hil.requested"),
        "asked again"
    );
}

/// The first kernel runs on its own runtime so that dropping the runtime
/// stops it mid-run, like a crash: no shutdown code runs.
#[test]
fn a_restart_ends_the_interrupted_run_with_an_error_and_runs_the_queued_message() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // The forgotten kernel's wsd child outlives it, as after a crash.
    let _children = crate::harness::LeftoverChildren(data.clone());
    let main_rt = tokio::runtime::Runtime::new().unwrap();
    let gate = Arc::new(Notify::new());
    let m = main_rt.block_on(ModelServer::start(vec![
        Reply::StreamThenHang(vec![text("working")]),
        Reply::Gated(vec![text("after restart")], gate.clone()),
    ]));
    let crashed = tokio::runtime::Runtime::new().unwrap();
    let (pid, first_run) = crashed.block_on(async {
        let k = start_kernel_at(&data).await;
        k.setup().await;
        configure(&k, &m.base_url, &[]).await;
        let mut a = Watcher::new(k.alice().await);
        let pid = a.call("proc.spawn", json!({})).await["pid"].clone();
        let s = a
            .call("proc.send", json!({"pid": pid, "message": "one"}))
            .await;
        a.signal("proc.run.stream", |_| true).await;
        let q = a
            .call("proc.send", json!({"pid": pid, "message": "two"}))
            .await;
        assert_eq!(q["queued"], true);
        std::mem::forget(k);
        (pid, s["runId"].clone())
    });
    crashed.shutdown_background();
    main_rt.block_on(async {
        let k = start_kernel_at(&data).await;
        let mut a = Watcher::new(k.alice().await);
        let h = a.call("proc.history", json!({"pid": pid})).await;
        let msgs = h["messages"].as_array().unwrap().clone();
        assert!(
            msgs.iter().any(|m| m["role"] == "system"
                && m["content"].as_str().unwrap().contains("kernel stopped")),
            "{msgs:?}"
        );
        gate.notify_one();
        let fr = first_run.clone();
        let fin = a
            .signal("proc.run.finished", move |p| p["runId"] != fr)
            .await;
        assert_eq!(fin["text"], "after restart");
        let last_req = m.requests().last().unwrap().clone();
        let last = last_req["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()
            .clone();
        assert_eq!(last["content"], "two");
    });
}

async fn start_kernel_at(data: &std::path::Path) -> TestKernel {
    TestKernel::start_in(data.to_owned(), |_| {}).await
}

#[tokio::test]
async fn proc_spawn_with_a_prompt_starts_a_run_and_bad_args_are_refused() {
    let (_k, _m, mut a) = setup(vec![answer("hi!")], &[]).await;
    let p = a.call("proc.spawn", json!({"prompt": "hello"})).await;
    let fin = a.finished(&p["runId"]).await;
    assert_eq!(fin["text"], "hi!");
    let f = a
        .request("proc.spawn", json!({"workspace": {"mode": "teleport"}}))
        .await;
    assert_eq!(err_of(&f).0, 400);
    let f = a
        .request(
            "proc.hil",
            json!({"requestId": "hil_nope", "decision": "maybe"}),
        )
        .await;
    assert_eq!(err_of(&f).0, 400);
}

#[tokio::test]
async fn shell_runs_inside_the_process_workspace_and_its_files_come_back() {
    let (_k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool(
                "c1",
                "Shell",
                json!({"command": "echo made-by-shell > out.txt && cat out.txt"}),
            )]),
            answer("done"),
        ],
        &[],
    )
    .await;
    let p = a
        .call("proc.spawn", json!({"workspace": {"mode": "new"}}))
        .await;
    let (pid, ws) = (
        p["pid"].clone(),
        p["workspaceId"].as_str().unwrap().to_owned(),
    );
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "run it"}))
        .await;
    let t = a
        .signal("proc.run.tool.finished", |p| p["toolName"] == "Shell")
        .await;
    assert_eq!(t["isError"], false, "{t}");
    assert_eq!(t["output"]["status"], "completed", "{t}");
    assert_eq!(t["output"]["exitCode"], 0, "{t}");
    assert!(
        t["output"]["output"]
            .as_str()
            .unwrap()
            .contains("made-by-shell"),
        "{t}"
    );
    assert_eq!(a.finished(&s["runId"]).await["text"], "done");
    let r = a
        .call(
            "fs.read",
            json!({"path": format!("/workspaces/{ws}/out.txt")}),
        )
        .await;
    assert_eq!(r["content"], "1\tmade-by-shell");
    let seen = m.requests()[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(seen["content"].as_str().unwrap().contains("made-by-shell"));
}

#[tokio::test]
async fn sys_setup_with_ai_configures_the_model_endpoint() {
    let m = ModelServer::start(vec![answer("configured at setup")]).await;
    let k = TestKernel::start().await;
    let mut raw = k.raw().await;
    raw.call(
        "sys.setup",
        json!({"username": "alice", "password": crate::harness::ALICE_PW,
               "ai": {"provider": "openai", "model": "tiny", "apiKey": "sk-x", "baseUrl": m.base_url}}),
    )
    .await
    .unwrap();
    let mut a = Watcher::new(k.alice().await);
    let p = a.call("proc.spawn", json!({"prompt": "hi"})).await;
    assert_eq!(a.finished(&p["runId"]).await["text"], "configured at setup");
    assert_eq!(m.requests()[0]["model"], "tiny");
}

#[tokio::test]
async fn the_users_home_context_and_a_per_user_model_override_are_used() {
    let (_k, m, mut a) = setup(vec![answer("ok")], &[]).await;
    a.call(
        "fs.write",
        json!({"path": "~/context.d/10-me.md", "content": "I like short answers."}),
    )
    .await;
    a.call(
        "sys.config.set",
        json!({"key": "users/1000/ai/model", "value": "alices-model"}),
    )
    .await;
    let p = a.call("proc.spawn", json!({"prompt": "hi"})).await;
    a.finished(&p["runId"]).await;
    let req = &m.requests()[0];
    let sys = req["messages"][0]["content"].as_str().unwrap();
    assert!(
        sys.contains("[home.10-me.md]\nI like short answers."),
        "{sys}"
    );
    assert_eq!(req["model"], "alices-model");
}

#[tokio::test]
async fn abort_while_waiting_for_approval_leaves_a_history_the_model_accepts() {
    let (_k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool("c1", "Delete", json!({"path": "x"}))]),
            answer("fresh start"),
        ],
        &[],
    )
    .await;
    let (pid, s) = a.spawn_and_send("del").await;
    let req = a.signal("proc.run.hil.requested", |_| true).await;
    a.call("proc.abort", json!({"pid": pid})).await;
    assert_eq!(a.finished(&s["runId"]).await["aborted"], true);
    // The request died with the run.
    let late = a
        .request(
            "proc.hil",
            json!({"requestId": req["requestId"], "decision": "approve"}),
        )
        .await;
    assert_eq!(err_of(&late).0, 403);
    let s2 = a
        .call("proc.send", json!({"pid": pid, "message": "again"}))
        .await;
    assert_eq!(a.finished(&s2["runId"]).await["text"], "fresh start");
    let msgs = m.requests()[1]["messages"].as_array().unwrap().clone();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
    assert_eq!(msgs[3]["tool_call_id"], "c1");
    assert!(msgs[3]["content"].as_str().unwrap().contains("interrupted"));
}

/// A small PNG at alice's `~/dot.png`.
fn write_dot_png(k: &TestKernel) {
    let p = wsd_sync::SyncPath::new("home/alice/dot.png").unwrap();
    let mut d = k.kernel.system().lock().unwrap();
    let opts = wsd_dofs::WriteOptions {
        create_parents: true,
        ..wsd_dofs::WriteOptions::default()
    };
    d.write_file_with(&p, gsv_protocol::fs::testkit::PNG, opts)
        .unwrap();
}

#[tokio::test]
async fn an_image_the_model_reads_reaches_it_as_an_image_part() {
    use gsv_protocol::fs::testkit::PNG_BASE64;
    let (k, m, mut a) = setup(
        vec![
            Reply::Sse(vec![tool(
                "r1",
                "Read",
                json!({"path": "/home/alice/dot.png"}),
            )]),
            answer("A grey dot."),
        ],
        &[],
    )
    .await;
    write_dot_png(&k);
    let (_pid, s) = a.spawn_and_send("what is in dot.png?").await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["status"], "completed", "{fin}");
    let second = &m.requests()[1];
    let messages = second["messages"].as_array().unwrap();
    let at = messages.iter().position(|m| m["role"] == "tool").unwrap();
    // The tool message answers the call in text, without the base64.
    let tool_msg = &messages[at];
    assert_eq!(tool_msg["tool_call_id"], "r1");
    let said = tool_msg["content"].as_str().unwrap();
    assert!(
        said.contains("image/png") && !said.contains(PNG_BASE64),
        "{said}"
    );
    // The image follows the turn's tool messages as an image_url part.
    let images = &messages[at + 1];
    assert_eq!(images["role"], "user", "{second}");
    let parts = images["content"].as_array().unwrap();
    assert_eq!(parts[0]["type"], "text");
    assert_eq!(
        parts[1],
        json!({"type": "image_url",
               "image_url": {"url": format!("data:image/png;base64,{PNG_BASE64}")}})
    );
    assert_eq!(messages.len(), at + 2, "{second}");
}

#[tokio::test]
async fn a_model_without_image_input_gets_a_note_instead_of_the_image() {
    use gsv_protocol::fs::testkit::PNG_BASE64;
    let read = || {
        Reply::Sse(vec![tool(
            "r1",
            "Read",
            json!({"path": "/home/alice/dot.png"}),
        )])
    };
    let (k, m, mut a) = setup(
        vec![read(), answer("I cannot see it.")],
        &[("config/ai/images", "false")],
    )
    .await;
    write_dot_png(&k);
    let (pid, s) = a.spawn_and_send("what is in dot.png?").await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["status"], "completed", "{fin}");
    let second = &m.requests()[1];
    let text = second.to_string();
    assert!(!text.contains(PNG_BASE64), "the image was sent: {second}");
    assert!(!text.contains("image_url"), "{second}");
    let messages = second["messages"].as_array().unwrap();
    let at = messages.iter().position(|m| m["role"] == "tool").unwrap();
    let said: Value = serde_json::from_str(messages[at]["content"].as_str().unwrap()).unwrap();
    assert_eq!(said["kind"], "image");
    assert_eq!(said["contentType"], "image/png");
    assert!(
        said["content"]
            .as_str()
            .unwrap()
            .contains("does not accept image input"),
        "{said}"
    );
    // The tool message is the last: no user message of images follows.
    assert_eq!(messages.len(), at + 1, "{second}");
    // The stored result keeps the image: only what the model is sent changes.
    let h = a.call("proc.history", json!({"pid": pid})).await;
    assert!(h.to_string().contains(PNG_BASE64), "{h}");

    // A value that is neither true nor false fails the run naming the key,
    // before any model call.
    let mut root = k.login("root", "root-password").await;
    root.call(
        "sys.config.set",
        json!({"key": "config/ai/images", "value": "sometimes"}),
    )
    .await
    .unwrap();
    root.close().await;
    let s = a
        .call("proc.send", json!({"pid": pid, "message": "again"}))
        .await;
    let fin = a.finished(&s["runId"]).await;
    assert_eq!(fin["status"], "error", "{fin}");
    assert!(
        fin["error"].as_str().unwrap().contains("config/ai/images"),
        "{fin}"
    );
    assert_eq!(m.requests().len(), 2);
}
