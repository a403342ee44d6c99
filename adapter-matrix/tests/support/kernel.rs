//! A scripted stand-in for the kernel: a real WebSocket server on
//! loopback that checks the adapter's `sys.connect` (service role, matrix
//! channel, token) and lets the test read the adapter's calls and send it
//! requests. `adapter.state.update` is answered on its own and recorded.

use std::collections::VecDeque;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;

/// Every wait on the adapter: generous, the machine is shared.
pub const WAIT: Duration = Duration::from_secs(90);

#[derive(Debug)]
pub struct FakeKernel {
    pub url: String,
    conns: mpsc::Receiver<KernelConn>,
    accept: tokio::task::JoinHandle<()>,
}

/// One accepted adapter connection.
#[derive(Debug)]
pub struct KernelConn {
    ws: WebSocketStream<TcpStream>,
    /// The adapter's `sys.connect` arguments.
    pub hello: Value,
    /// Requests of the adapter not yet taken by the test.
    queued: VecDeque<(String, String, Value)>,
    /// The statuses of every `adapter.state.update`, in order.
    pub states: Vec<Value>,
    next_id: u64,
}

impl FakeKernel {
    /// Accepts adapters that present `token`; others get a 401.
    pub async fn start(token: &str) -> FakeKernel {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("ws://{}/ws", listener.local_addr().unwrap());
        let (tx, conns) = mpsc::channel(8);
        let token = token.to_owned();
        let accept = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let Ok(mut ws) = tokio_tungstenite::accept_async(tcp).await else {
                    continue;
                };
                let Some(Ok(Message::Text(t))) = ws.next().await else {
                    continue;
                };
                let hello: Value = serde_json::from_str(t.as_str()).unwrap();
                assert_eq!(hello["call"], "sys.connect", "{hello}");
                let args = hello["args"].clone();
                if args["auth"]["token"] != token.as_str() {
                    let refusal = json!({"type": "res", "id": hello["id"], "ok": false,
                        "error": {"code": 401, "message": "Authentication failed"}});
                    let _ = ws.send(Message::Text(refusal.to_string().into())).await;
                    continue;
                }
                let ok = json!({"type": "res", "id": hello["id"], "ok": true,
                    "data": {"protocol": 2, "channel": args["client"]["channel"]}});
                ws.send(Message::Text(ok.to_string().into())).await.unwrap();
                let conn = KernelConn {
                    ws,
                    hello: args,
                    queued: VecDeque::new(),
                    states: Vec::new(),
                    next_id: 0,
                };
                if tx.send(conn).await.is_err() {
                    return;
                }
            }
        });
        FakeKernel { url, conns, accept }
    }

    /// The next adapter connection that passed the handshake.
    pub async fn connection(&mut self) -> KernelConn {
        tokio::time::timeout(WAIT, self.conns.recv())
            .await
            .expect("the adapter did not connect in time")
            .expect("the fake kernel stopped")
    }
}

impl Drop for FakeKernel {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl KernelConn {
    /// Reads one frame; answers and records `adapter.state.update`.
    async fn read(&mut self) -> Frame {
        loop {
            let m = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("no frame from the adapter in time")
                .expect("the adapter closed the connection")
                .unwrap();
            let Message::Text(t) = m else { continue };
            let v: Value = serde_json::from_str(t.as_str()).unwrap();
            match v["type"].as_str() {
                Some("req") if v["call"] == "adapter.state.update" => {
                    self.states.push(v["args"]["status"].clone());
                    self.answer(v["id"].as_str().unwrap(), json!({"ok": true}))
                        .await;
                    return Frame::State;
                }
                Some("req") => {
                    return Frame::Req(
                        v["id"].as_str().unwrap().to_owned(),
                        v["call"].as_str().unwrap().to_owned(),
                        v["args"].clone(),
                    );
                }
                Some("res") => return Frame::Res(v),
                _ => panic!("unexpected frame from the adapter: {v}"),
            }
        }
    }

    /// Waits until the adapter reports its Matrix sync running.
    pub async fn wait_connected(&mut self) {
        while !self.states.last().is_some_and(|s| s["connected"] == true) {
            match self.read().await {
                Frame::Req(id, call, args) => self.queued.push_back((id, call, args)),
                Frame::Res(v) => panic!("unexpected response {v}"),
                Frame::State => {}
            }
        }
    }

    /// The adapter's next request of `call` (others stay queued).
    pub async fn request(&mut self, call: &str) -> (String, Value) {
        if let Some(i) = self.queued.iter().position(|(_, c, _)| c == call) {
            let (id, _, args) = self.queued.remove(i).unwrap();
            return (id, args);
        }
        loop {
            match self.read().await {
                Frame::Req(id, c, args) if c == call => return (id, args),
                Frame::Req(id, c, args) => self.queued.push_back((id, c, args)),
                Frame::Res(v) => panic!("unexpected response {v}"),
                Frame::State => {}
            }
        }
    }

    pub async fn answer(&mut self, id: &str, data: Value) {
        let res = json!({"type": "res", "id": id, "ok": true, "data": data});
        self.ws
            .send(Message::Text(res.to_string().into()))
            .await
            .unwrap();
    }

    /// Sends the adapter a request and returns its whole response frame.
    pub async fn call(&mut self, call: &str, args: Value) -> Value {
        self.next_id += 1;
        let id = format!("k{}", self.next_id);
        let req = json!({"type": "req", "id": id, "call": call, "args": args});
        self.ws
            .send(Message::Text(req.to_string().into()))
            .await
            .unwrap();
        loop {
            match self.read().await {
                Frame::Res(v) if v["id"] == id.as_str() => return v,
                Frame::Res(v) => panic!("a response to nothing we asked: {v}"),
                Frame::Req(id, c, args) => self.queued.push_back((id, c, args)),
                Frame::State => {}
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self.ws.close(None).await;
    }
}

#[derive(Debug)]
enum Frame {
    /// A request `(id, call, args)` of the adapter.
    Req(String, String, Value),
    Res(Value),
    /// An `adapter.state.update`, already answered and recorded.
    State,
}
