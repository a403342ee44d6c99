//! A client's connection to a gsv kernel, as the device driver
//! (`gsv node`, role `driver`) and the adapters (`gsv adapter matrix`,
//! role `service`) hold it: connect, authenticate with `sys.connect`,
//! serve until the connection drops, reconnect with exponential backoff
//! (reset after each successful handshake) until stopped or refused for
//! good. On a connection, requests from the kernel and our own calls
//! travel both ways: our calls are correlated with their answers here,
//! everything else is handed to the client ([`Connection::next`]).
//!
//! It knows frames (`gsv_protocol::frames`), not calls: what a request
//! means is the client's [`Client`]. Not to be confused with identity
//! links (`sys.link`), which are a kernel domain.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::stream::SplitStream;
use futures::{SinkExt, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tokio_util::sync::CancellationToken;

use gsv_protocol::WireError;
use gsv_protocol::frames::{self, Inbound, Outbound, Response};

/// How long connecting (TCP + WebSocket upgrade) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the kernel may take to answer `sys.connect`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the kernel may take to answer one of our calls; past it the
/// caller should take the connection for hung.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a dropped connection's writer may take to send its close.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Frames queued for the writer: a client that outpaces the socket
/// waits here, and only it.
const OUTBOUND_QUEUE: usize = 64;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Where a client connects and who it says it is.
#[derive(Debug, Clone)]
pub struct LinkConfig {
    /// `ws://HOST:PORT/ws`.
    pub url: String,
    /// The `args` of `sys.connect` (protocol, client, auth, …).
    pub hello: Value,
    /// First and longest wait between reconnects.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

/// A connection that could not be made or kept.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The kernel is unreachable or the connection dropped.
    #[error("connection to {url}: {message}")]
    Lost { url: String, message: String },
    /// The kernel answered `sys.connect` with an error.
    #[error(transparent)]
    Refused(Refused),
}

/// The kernel's error answer to `sys.connect`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the kernel at {url} refused the connection ({code}): {message}")]
pub struct Refused {
    pub url: String,
    pub code: i64,
    pub message: String,
}

impl LinkError {
    fn lost(url: &str, message: impl ToString) -> Self {
        LinkError::Lost {
            url: url.to_owned(),
            message: message.to_string(),
        }
    }
}

/// Why one of our calls got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    #[error("the connection to the kernel was lost")]
    Lost,
    #[error("the kernel did not answer {call} within {CALL_TIMEOUT:?}")]
    Timeout { call: &'static str },
    #[error("{call} failed ({code}): {message}")]
    Kernel {
        call: &'static str,
        code: i64,
        message: String,
    },
    #[error("{call}: unexpected answer: {reason}")]
    BadAnswer { call: &'static str, reason: String },
}

/// The connection is gone: nothing more can be sent on it.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the connection to the kernel is closed")]
pub struct Closed;

/// What the kernel sends a client, besides the answers to its calls.
#[derive(Debug, Clone)]
pub enum Incoming {
    Request {
        id: String,
        call: String,
        args: Map<String, Value>,
    },
    Signal {
        signal: String,
        payload: Value,
    },
}

/// The sending half of a connection: our calls, our answers, our
/// signals. Cloned into every task that sends; all of it goes through
/// the connection's one writer.
#[derive(Debug, Clone)]
pub struct Sender {
    tx: mpsc::Sender<Message>,
    pending: Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>,
    next: Arc<AtomicU64>,
}

impl Sender {
    async fn send_text(&self, text: String) -> Result<(), Closed> {
        self.tx
            .send(Message::Text(text.into()))
            .await
            .map_err(|_| Closed)
    }

    /// Calls `call` on the kernel and waits (at most [`CALL_TIMEOUT`]) for
    /// its `data`.
    pub async fn call<A: Serialize, R: DeserializeOwned>(
        &self,
        call: &'static str,
        args: &A,
    ) -> Result<R, CallError> {
        let id = format!("m{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (done, answer) = oneshot::channel();
        self.pending.lock().unwrap().insert(id.clone(), done);
        let frame = json!({"type": "req", "id": id, "call": call, "args": args});
        if self.send_text(frame.to_string()).await.is_err() {
            self.pending.lock().unwrap().remove(&id);
            return Err(CallError::Lost);
        }
        let res = match tokio::time::timeout(CALL_TIMEOUT, answer).await {
            Ok(Ok(res)) => res,
            Ok(Err(_)) => return Err(CallError::Lost),
            Err(_) => {
                self.pending.lock().unwrap().remove(&id);
                return Err(CallError::Timeout { call });
            }
        };
        if res["ok"] != true {
            return Err(CallError::Kernel {
                call,
                code: res["error"]["code"].as_i64().unwrap_or(0),
                message: res["error"]["message"].as_str().unwrap_or("").to_owned(),
            });
        }
        serde_json::from_value(res.get("data").cloned().unwrap_or(Value::Null)).map_err(|e| {
            CallError::BadAnswer {
                call,
                reason: e.to_string(),
            }
        })
    }

    /// Answers the kernel's request `id`.
    pub async fn respond(
        &self,
        id: String,
        result: Result<Value, WireError>,
    ) -> Result<(), Closed> {
        let res = match result {
            Ok(data) => Response::ok(id, data),
            Err(e) => Response::err(id, e),
        };
        self.send_text(Outbound::Res(res).to_text()).await
    }

    /// Sends a signal to the kernel.
    pub async fn signal(&self, signal: &str, payload: Value) -> Result<(), Closed> {
        let sig = Outbound::Sig {
            signal: signal.to_owned(),
            payload,
            seq: None,
        };
        self.send_text(sig.to_text()).await
    }

    fn answered(&self, id: &str, frame: Value) {
        if let Some(done) = self.pending.lock().unwrap().remove(id) {
            let _ = done.send(frame);
        }
    }
}

/// One authenticated connection.
#[derive(Debug)]
pub struct Connection {
    sender: Sender,
    stream: SplitStream<Socket>,
    writer: JoinHandle<()>,
}

impl Connection {
    /// Connects to `config.url` and completes `sys.connect`.
    pub async fn open(config: &LinkConfig) -> Result<Connection, LinkError> {
        let url = config.url.as_str();
        let (ws, _) = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio_tungstenite::connect_async_with_config(url, None, true),
        )
        .await
        .map_err(|_| LinkError::lost(url, "connect timed out"))?
        .map_err(|e| LinkError::lost(url, e))?;
        let (mut sink, mut stream) = ws.split();
        let hello =
            json!({"type": "req", "id": "connect", "call": "sys.connect", "args": config.hello});
        sink.send(Message::Text(hello.to_string().into()))
            .await
            .map_err(|e| LinkError::lost(url, e))?;
        let answer = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake_answer(&mut stream))
            .await
            .map_err(|_| LinkError::lost(url, "sys.connect timed out"))?
            .map_err(|e| LinkError::lost(url, e))?;
        if answer["ok"] != true {
            return Err(LinkError::Refused(Refused {
                url: url.to_owned(),
                code: answer["error"]["code"].as_i64().unwrap_or(0),
                message: answer["error"]["message"].as_str().unwrap_or("").to_owned(),
            }));
        }
        let (tx, mut rx) = mpsc::channel::<Message>(OUTBOUND_QUEUE);
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        Ok(Connection {
            sender: Sender {
                tx,
                pending: Arc::default(),
                next: Arc::default(),
            },
            stream,
            writer,
        })
    }

    /// A handle to send on this connection.
    pub fn sender(&self) -> Sender {
        self.sender.clone()
    }

    /// The next request or signal from the kernel; answers to our calls
    /// reach their callers on the way. `Err` when the connection ends:
    /// why it broke, or `None` when the kernel closed it. Cancel-safe.
    pub async fn next(&mut self) -> Result<Incoming, Option<String>> {
        loop {
            let text = match self.stream.next().await {
                None | Some(Ok(Message::Close(_))) => return Err(None),
                Some(Err(e)) => return Err(Some(e.to_string())),
                Some(Ok(Message::Text(t))) => t,
                Some(Ok(Message::Ping(p))) => {
                    // A full queue means the writer is behind; the kernel
                    // only needs some answer, not each one.
                    let _ = self.sender.tx.try_send(Message::Pong(p));
                    continue;
                }
                Some(Ok(_)) => continue,
            };
            match frames::parse(text.as_str()) {
                Ok(Inbound::Res { id, frame, .. }) => self.sender.answered(&id, frame),
                Ok(Inbound::Req { id, call, args }) => {
                    return Ok(Incoming::Request { id, call, args });
                }
                Ok(Inbound::Sig { signal, payload }) => {
                    return Ok(Incoming::Signal { signal, payload });
                }
                Err(e) => tracing::warn!(error = %e, "ignoring a malformed frame from the kernel"),
            }
        }
    }

    /// Ends the connection: our calls still waiting see
    /// [`CallError::Lost`]; the close frame goes out unless answers still
    /// being sent hold the writer past a short grace.
    pub async fn close(self) {
        let Connection { sender, writer, .. } = self;
        sender.pending.lock().unwrap().clear();
        drop(sender);
        let abort = writer.abort_handle();
        if tokio::time::timeout(CLOSE_GRACE, writer).await.is_err() {
            abort.abort();
        }
    }
}

/// Reads frames until the answer to `sys.connect`.
async fn handshake_answer(stream: &mut SplitStream<Socket>) -> Result<Value, String> {
    while let Some(m) = stream.next().await {
        match m {
            Ok(Message::Text(t)) => {
                let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                if v["type"] == "res" && v["id"] == "connect" {
                    return Ok(v);
                }
            }
            Ok(Message::Close(c)) => return Err(format!("closed during the handshake: {c:?}")),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("closed during the handshake".to_owned())
}

/// What a client does with its connections.
pub trait Client: Send {
    /// Whether a refused `sys.connect` with `code` ends the client (a bad
    /// token, setup required) rather than being retried (overload).
    fn refusal_is_final(&self, code: i64) -> bool;

    /// Serves one connection until it ends (its [`Connection::next`]
    /// failed), `stop` fires, or the client drops it; why, if it broke.
    fn serve(
        &mut self,
        connection: &mut Connection,
        stop: &CancellationToken,
    ) -> impl Future<Output = Option<String>> + Send;
}

/// Runs `client` until `stop` fires (`Ok`) or the kernel refuses it for
/// good ([`Client::refusal_is_final`]); every other failure is retried
/// with exponential backoff, reset after each successful handshake.
pub async fn run<C: Client>(
    config: &LinkConfig,
    client: &mut C,
    stop: &CancellationToken,
) -> Result<(), Refused> {
    let mut backoff = Backoff::new(config.min_backoff, config.max_backoff);
    loop {
        let mut connected = false;
        let r = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            r = run_once(config, client, stop, &mut connected) => r,
        };
        if stop.is_cancelled() {
            return Ok(());
        }
        match r {
            Err(LinkError::Refused(r)) if client.refusal_is_final(r.code) => return Err(r),
            Err(e) => tracing::warn!(error = %e, "kernel connection failed"),
            Ok(Some(why)) => tracing::warn!(url = %config.url, %why, "kernel connection dropped"),
            Ok(None) => tracing::warn!(url = %config.url, "kernel connection closed"),
        }
        if connected {
            backoff.reset();
        }
        if !backoff.wait(stop).await {
            return Ok(());
        }
    }
}

/// One connection: handshake, then the client serves until it ends.
async fn run_once<C: Client>(
    config: &LinkConfig,
    client: &mut C,
    stop: &CancellationToken,
    connected: &mut bool,
) -> Result<Option<String>, LinkError> {
    let mut connection = Connection::open(config).await?;
    *connected = true;
    tracing::info!(url = %config.url, "connected to the kernel");
    let why = client.serve(&mut connection, stop).await;
    connection.close().await;
    Ok(why)
}

/// The waits between reconnects: exponential with jitter between the two
/// bounds, never giving up.
struct Backoff {
    min: Duration,
    max: Duration,
    delays: ExponentialBackoff,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            delays: Backoff::delays(min, max),
        }
    }

    fn delays(min: Duration, max: Duration) -> ExponentialBackoff {
        ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// Starts again from the shortest wait.
    fn reset(&mut self) {
        self.delays = Backoff::delays(self.min, self.max);
    }

    /// Waits the next delay; false when `stop` fired first.
    async fn wait(&mut self, stop: &CancellationToken) -> bool {
        let wait = self.delays.next().unwrap_or(self.max);
        tracing::info!(?wait, "reconnecting to the kernel");
        tokio::select! {
            () = stop.cancelled() => false,
            () = tokio::time::sleep(wait) => true,
        }
    }
}
