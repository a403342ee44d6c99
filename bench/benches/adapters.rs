//! Inbound-to-answer latency of the adapter plane (issue 31), against an
//! in-process kernel on loopback with a scripted OpenAI-compatible model
//! server (a real axum app answering every completion at once with one
//! streamed chunk) and a scripted adapter (a real WebSocket client
//! connected as `role:"service"`, channel `matrix`):
//!
//! * `adapter.inbound` acknowledged: from sending a linked actor's DM to
//!   the kernel's `{delivered}` answer;
//! * inbound to answer: from sending it to the kernel's `adapter.send` of
//!   the agent's answer arriving at the adapter (the whole turn: routing,
//!   the run, one model call, the outbox, the forward);
//! * a redelivered message answered from the ingress-receipt ledger.
//!
//! `cargo bench -p wsd-bench --bench adapters [-- MESSAGES]` prints them;
//! results go in `bench/RESULTS.md` by hand. The Matrix homeserver is not
//! in the loop (its own latency is Synapse's).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use gsv_kernel::KernelConfig;
use gsv_kernel::client::{GsvClient, connect_args};
use serde_json::{Value, json};
use wsd_bench::gateway::{login, report, serve_set_up};

const ACCOUNT: &str = "@bot:bench";
const ACTOR: &str = "@alice:bench";

fn main() {
    // `cargo bench` passes `--bench`; the one other argument is the
    // number of messages.
    let messages: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(messages));
}

/// Answers every chat completion with one chunk and `[DONE]`.
async fn model_server() -> String {
    let chunk = json!({"choices": [{"index": 0, "delta": {"content": "pong"}}]});
    let body = format!("data: {chunk}\n\ndata: [DONE]\n\n");
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move || {
            let body = body.clone();
            async move { ([("content-type", "text/event-stream")], body) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base_url
}

/// The adapter's socket: its own calls, and the kernel's requests kept
/// while it waits for something else.
struct Adapter {
    ws: GsvClient,
    stash: VecDeque<Value>,
}

impl Adapter {
    async fn inbound(&mut self, message_id: &str, text: &str) -> Value {
        let id = self.ws.fresh_id();
        let args = json!({"adapter": "matrix", "accountId": ACCOUNT, "deliveryId": message_id,
            "message": {"messageId": message_id, "surface": {"kind": "dm", "id": "!dm:bench"},
                        "actor": {"id": ACTOR}, "text": text}});
        self.ws
            .send_request(&id, "adapter.inbound", args)
            .await
            .unwrap();
        loop {
            let f = self.ws.recv().await.unwrap();
            if f["type"] == "res" && f["id"] == id {
                assert_eq!(f["ok"], true, "{f}");
                return f["data"].clone();
            }
            self.stash.push_back(f);
        }
    }

    /// The kernel's next `adapter.send`, answered as posted; its args.
    async fn next_send(&mut self) -> Value {
        let is_send = |f: &Value| f["type"] == "req" && f["call"] == "adapter.send";
        let req = match self.stash.iter().position(is_send) {
            Some(i) => self.stash.remove(i).unwrap(),
            None => loop {
                let f = self.ws.recv().await.unwrap();
                if is_send(&f) {
                    break f;
                }
            },
        };
        let a = &req["args"];
        let res = json!({"type": "res", "id": req["id"], "ok": true,
            "data": {"ok": true, "adapter": "matrix", "accountId": a["accountId"],
                     "surfaceId": a["surface"]["id"], "messageId": "$posted"}});
        self.ws.send_text(res.to_string()).await.unwrap();
        req["args"].clone()
    }
}

async fn run(messages: usize) {
    let tmp = tempfile::tempdir().unwrap();
    let (_kernel, url) = serve_set_up(KernelConfig::new(tmp.path().join("data"))).await;
    let base_url = model_server().await;
    let mut root = login(&url, "root", "root-password").await;
    for (key, value) in [
        ("config/ai/provider", "openai"),
        ("config/ai/model", "bench"),
        ("config/ai/base_url", base_url.as_str()),
        ("config/ai/api_key", "sk-bench"),
    ] {
        root.call("sys.config.set", json!({"key": key, "value": value}))
            .await
            .unwrap();
    }
    let token = root
        .call("sys.token.create", json!({"kind": "service"}))
        .await
        .unwrap()["token"]["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut alice = login(&url, "alice", "alice-password").await;
    alice
        .call(
            "sys.link",
            json!({"adapter": "matrix", "accountId": ACCOUNT, "actorId": ACTOR}),
        )
        .await
        .unwrap();
    let mut ws = GsvClient::connect(&url).await.unwrap();
    ws.timeout = Duration::from_secs(60);
    let mut args = connect_args("bench-adapter", "service", json!({"token": token}));
    args["client"]["channel"] = json!("matrix");
    let hello = ws.request("sys.connect", args).await.unwrap();
    assert_eq!(hello["ok"], true, "{hello}");
    let mut adapter = Adapter {
        ws,
        stash: VecDeque::new(),
    };

    // Warm-up: the home process and its first turn.
    for i in 0..10 {
        adapter.inbound(&format!("$warm{i}"), "ping").await;
        adapter.next_send().await;
    }
    let (mut acked, mut answered, mut replayed) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..messages {
        let id = format!("$m{i}");
        let t = Instant::now();
        let r = adapter.inbound(&id, "ping").await;
        acked.push(t.elapsed());
        assert!(r["delivered"]["runId"].is_string(), "{r}");
        let sent = adapter.next_send().await;
        answered.push(t.elapsed());
        assert_eq!(sent["text"], "pong");
        let t = Instant::now();
        let again = adapter.inbound(&id, "ping").await;
        replayed.push(t.elapsed());
        assert_eq!(again["replayed"], "completed", "{again}");
    }
    report("adapter.inbound acknowledged (delivered)", acked);
    report(
        "inbound to answer (adapter.send of the agent's answer)",
        answered,
    );
    report("a redelivered message (ledger replay)", replayed);
}
