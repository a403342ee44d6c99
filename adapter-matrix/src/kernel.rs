//! The kernel side: one WebSocket connection as `role:"service"`,
//! `client.channel:"matrix"`, authenticated by a service token.
//!
//! The adapter calls `adapter.inbound` for each queued Matrix message, one
//! at a time and in order (a message whose answer did not arrive is sent
//! again, with the same `deliveryId`, on the next connection), and
//! `adapter.state.update` whenever the Matrix side's state changes. The
//! kernel's `adapter.send|connect|disconnect|status` requests are answered
//! concurrently. The connection is retried with exponential backoff, reset
//! after each successful handshake; a refused handshake (bad token, setup
//! required) stops the adapter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::{SinkExt, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use gsv_protocol::PROTOCOL;
use gsv_protocol::adapter::{
    self, AccountStatus, ConnectArgs, ConnectResult, Connected, DisconnectArgs, Disconnected,
    InboundArgs, InboundResult, SendArgs, StateUpdateArgs, StatusArgs, StatusResult,
};
use gsv_protocol::frames::{self, Inbound, Outbound, Response};
use gsv_protocol::{OpResult, WireError};

use crate::{ADAPTER, AdapterError, Config, MatrixBot};

/// How long connecting (TCP + WebSocket upgrade) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the kernel may take to answer `sys.connect`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the kernel may take to answer one of our calls; past it the
/// connection is taken for hung and replaced.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a dropped connection's writer may take to send its close.
const CLOSE_GRACE: Duration = Duration::from_secs(2);
/// Frames queued for the writer.
const OUTBOUND_QUEUE: usize = 64;

/// The connection to the kernel and what it serves.
#[derive(Debug)]
pub struct Link {
    url: String,
    token: String,
    min_backoff: Duration,
    max_backoff: Duration,
    bot: MatrixBot,
    /// Whether the Matrix sync runs (`adapter.connect|disconnect`).
    enabled: watch::Sender<bool>,
    status: watch::Receiver<AccountStatus>,
}

/// Why one of our calls got no answer.
#[derive(Debug, thiserror::Error)]
enum CallError {
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

/// Our calls in flight on one connection.
#[derive(Debug, Clone)]
struct Calls {
    tx: mpsc::Sender<Message>,
    pending: Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>,
    next: Arc<AtomicU64>,
}

impl Calls {
    async fn call<A: Serialize, R: DeserializeOwned>(
        &self,
        call: &'static str,
        args: &A,
    ) -> Result<R, CallError> {
        let id = format!("m{}", self.next.fetch_add(1, Ordering::Relaxed));
        let (done, answer) = oneshot::channel();
        self.pending.lock().unwrap().insert(id.clone(), done);
        let frame = json!({"type": "req", "id": id, "call": call, "args": args});
        if self
            .tx
            .send(Message::Text(frame.to_string().into()))
            .await
            .is_err()
        {
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

    fn answered(&self, id: &str, frame: Value) {
        if let Some(done) = self.pending.lock().unwrap().remove(id) {
            let _ = done.send(frame);
        }
    }
}

impl Link {
    pub fn new(
        config: &Config,
        bot: MatrixBot,
        enabled: watch::Sender<bool>,
        status: watch::Receiver<AccountStatus>,
    ) -> Self {
        Link {
            url: config.kernel_url.clone(),
            token: config.service_token.clone(),
            min_backoff: config.min_backoff,
            max_backoff: config.max_backoff,
            bot,
            enabled,
            status,
        }
    }

    /// Serves the kernel until `stop` or a refused handshake.
    pub async fn run(
        self,
        mut inbound: mpsc::Receiver<InboundArgs>,
        stop: CancellationToken,
    ) -> Result<(), AdapterError> {
        let backoff = || {
            ExponentialBuilder::default()
                .with_min_delay(self.min_backoff)
                .with_max_delay(self.max_backoff)
                .with_jitter()
                .without_max_times()
                .build()
        };
        let mut delays = backoff();
        // The message whose `adapter.inbound` got no answer yet.
        let mut carry: Option<InboundArgs> = None;
        loop {
            let mut connected = false;
            let r = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                r = self.run_once(&mut inbound, &mut carry, &stop, &mut connected) => r,
            };
            if stop.is_cancelled() {
                return Ok(());
            }
            match r {
                Err(ConnectionError::Refused(e)) => return Err(e),
                Err(e) => tracing::warn!(error = %e, "kernel connection failed"),
                Ok(Some(why)) => tracing::warn!(url = %self.url, %why, "kernel connection dropped"),
                Ok(None) => tracing::warn!(url = %self.url, "kernel connection closed"),
            }
            if connected {
                delays = backoff();
            }
            let wait = delays.next().unwrap_or(self.max_backoff);
            tracing::info!(?wait, "reconnecting to the kernel");
            tokio::select! {
                () = stop.cancelled() => return Ok(()),
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One connection: handshake, then serve until it drops. `Ok(Some)`
    /// says why we dropped it.
    async fn run_once(
        &self,
        inbound: &mut mpsc::Receiver<InboundArgs>,
        carry: &mut Option<InboundArgs>,
        stop: &CancellationToken,
        connected: &mut bool,
    ) -> Result<Option<String>, ConnectionError> {
        let url = self.url.clone();
        let (ws, _) = tokio::time::timeout(CONNECT_TIMEOUT, tokio_tungstenite::connect_async(&url))
            .await
            .map_err(|_| ConnectionError::lost(&url, "connect timed out"))?
            .map_err(|e| ConnectionError::lost(&url, e))?;
        let (mut sink, mut stream) = ws.split();
        let hello = json!({
            "type": "req",
            "id": "connect",
            "call": "sys.connect",
            "args": {
                "protocol": PROTOCOL,
                "client": {
                    "id": format!("{ADAPTER}:{}", self.bot.account_id()),
                    "version": env!("CARGO_PKG_VERSION"),
                    "platform": std::env::consts::OS,
                    "role": "service",
                    "channel": ADAPTER,
                },
                "auth": {"token": self.token},
            },
        });
        sink.send(Message::Text(hello.to_string().into()))
            .await
            .map_err(|e| ConnectionError::lost(&url, e))?;
        let answer = tokio::time::timeout(HANDSHAKE_TIMEOUT, async {
            while let Some(m) = stream.next().await {
                match m {
                    Ok(Message::Text(t)) => {
                        let v: Value = serde_json::from_str(t.as_str()).unwrap_or(Value::Null);
                        if v["type"] == "res" && v["id"] == "connect" {
                            return Ok(v);
                        }
                    }
                    Ok(Message::Close(c)) => {
                        return Err(format!("closed during the handshake: {c:?}"));
                    }
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            Err("closed during the handshake".to_owned())
        })
        .await
        .map_err(|_| ConnectionError::lost(&url, "sys.connect timed out"))?
        .map_err(|e| ConnectionError::lost(&url, e))?;
        if answer["ok"] != true {
            let code = answer["error"]["code"].as_i64().unwrap_or(0);
            let message = answer["error"]["message"].as_str().unwrap_or("").to_owned();
            // Overload passes; a bad token or a kernel in setup does not.
            if code == 429 || code == 503 {
                return Err(ConnectionError::lost(&url, format!("{code}: {message}")));
            }
            return Err(ConnectionError::Refused(AdapterError::KernelRefused {
                url,
                code,
                message,
            }));
        }
        *connected = true;
        tracing::info!(url = %url, account = %self.bot.account_id(), "connected to the kernel");

        let (tx, mut rx) = mpsc::channel::<Message>(OUTBOUND_QUEUE);
        let writer = tokio::spawn(async move {
            while let Some(m) = rx.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let calls = Calls {
            tx: tx.clone(),
            pending: Arc::default(),
            next: Arc::default(),
        };
        // The kernel learns the current state first on every connection.
        let mut status = self.status.clone();
        status.mark_changed();
        let pump = pump_inbound(calls.clone(), &self.bot, inbound, carry);
        let result = {
            tokio::pin!(pump);
            loop {
                tokio::select! {
                    () = stop.cancelled() => break None,
                    why = &mut pump => break Some(why),
                    r = status.changed() => {
                        if r.is_err() {
                            break Some("the Matrix side stopped".into());
                        }
                        let current = status.borrow_and_update().clone();
                        let calls = calls.clone();
                        tokio::spawn(async move { update_state(&calls, current).await });
                    }
                    m = stream.next() => match m {
                        None | Some(Ok(Message::Close(_))) => break None,
                        Some(Err(e)) => break Some(e.to_string()),
                        Some(Ok(Message::Text(t))) => self.on_frame(t.as_str(), &calls, &tx),
                        Some(Ok(Message::Ping(p))) => {
                            let _ = tx.send(Message::Pong(p)).await;
                        }
                        Some(Ok(_)) => {}
                    },
                }
            }
        };
        // Calls still waiting see `Lost`.
        calls.pending.lock().unwrap().clear();
        drop((calls, tx));
        // Requests still being served hold the writer open; a close frame
        // is a courtesy worth a short wait only.
        let abort = writer.abort_handle();
        if tokio::time::timeout(CLOSE_GRACE, writer).await.is_err() {
            abort.abort();
        }
        Ok(result)
    }

    fn on_frame(&self, text: &str, calls: &Calls, tx: &mpsc::Sender<Message>) {
        let frame = match frames::parse(text) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "ignoring a malformed frame from the kernel");
                return;
            }
        };
        match frame {
            Inbound::Res { id, frame, .. } => calls.answered(&id, frame),
            Inbound::Req { id, call, args } => {
                let (bot, enabled, status) =
                    (self.bot.clone(), self.enabled.clone(), self.status.clone());
                let tx = tx.clone();
                tokio::spawn(async move {
                    let args = Value::Object(args);
                    let r = serve(&bot, &enabled, &status, &call, args).await;
                    let res = match r {
                        Ok(data) => Response::ok(id, data),
                        Err(e) => Response::err(id, e),
                    };
                    let _ = tx
                        .send(Message::Text(Outbound::Res(res).to_text().into()))
                        .await;
                });
            }
            // `adapter.status` broadcasts and the like: nothing to do.
            Inbound::Sig { .. } => {}
        }
    }
}

/// A connection that failed: worth retrying, or refused for good.
#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("connection to {url}: {message}")]
    Lost { url: String, message: String },
    #[error(transparent)]
    Refused(AdapterError),
}

impl ConnectionError {
    fn lost(url: &str, message: impl ToString) -> Self {
        ConnectionError::Lost {
            url: url.to_owned(),
            message: message.to_string(),
        }
    }
}

/// Sends the queued Matrix messages to the kernel one at a time, in order,
/// and posts the kernel's immediate answers. Returns (to drop the
/// connection) when a call goes unanswered; the message stays in `carry`.
async fn pump_inbound(
    calls: Calls,
    bot: &MatrixBot,
    inbound: &mut mpsc::Receiver<InboundArgs>,
    carry: &mut Option<InboundArgs>,
) -> String {
    loop {
        let args = match carry {
            Some(a) => a.clone(),
            None => match inbound.recv().await {
                Some(a) => carry.insert(a).clone(),
                None => return "the Matrix side stopped".into(),
            },
        };
        match calls
            .call::<_, InboundResult>(adapter::INBOUND, &args)
            .await
        {
            Ok(result) => {
                *carry = None;
                tracing::debug!(message = %args.message.message_id, ?result, "delivered to the kernel");
                if let Some(reason) = &result.dropped_reason {
                    tracing::info!(message = %args.message.message_id, %reason, "the kernel dropped a message");
                }
                if result.challenge.is_some() || result.reply.is_some() {
                    let bot = bot.clone();
                    tokio::spawn(async move { bot.post_inbound_result(&args, &result).await });
                }
            }
            Err(e @ (CallError::Lost | CallError::Timeout { .. })) => return e.to_string(),
            // The kernel refused this message (bad input, too large…):
            // sending it again would fail the same way.
            Err(e) => {
                *carry = None;
                tracing::warn!(message = %args.message.message_id, error = %e, "the kernel refused a message");
            }
        }
    }
}

async fn update_state(calls: &Calls, status: AccountStatus) {
    tracing::debug!(?status, "adapter.state.update");
    let args = StateUpdateArgs {
        adapter: ADAPTER.into(),
        account_id: status.account_id.clone(),
        status,
    };
    if let Err(e) = calls.call::<_, Value>(adapter::STATE_UPDATE, &args).await {
        tracing::warn!(error = %e, "adapter.state.update failed");
    }
}

/// Answers one kernel request.
async fn serve(
    bot: &MatrixBot,
    enabled: &watch::Sender<bool>,
    status: &watch::Receiver<AccountStatus>,
    call: &str,
    args: Value,
) -> Result<Value, WireError> {
    let account = bot.account_id();
    let unknown = |adapter_name: &str, account_id: &str| {
        (adapter_name != ADAPTER || account_id != account).then(|| {
            format!("this adapter serves {ADAPTER} account {account}, not {adapter_name} account {account_id}")
        })
    };
    let value = match call {
        adapter::SEND => {
            let a: SendArgs = parse(call, args)?;
            let r = match unknown(&a.adapter, &a.account_id) {
                Some(e) => gsv_protocol::adapter::SendResult::failed(e, false),
                None => bot.send(&a).await,
            };
            to_value(&r)
        }
        adapter::CONNECT => {
            let a: ConnectArgs = parse(call, args)?;
            let r = match unknown(&a.adapter, &a.account_id) {
                Some(e) => ConnectResult::failed(e),
                None => {
                    enabled.send_replace(true);
                    ConnectResult::connected(Connected {
                        adapter: ADAPTER.into(),
                        account_id: account.into(),
                        connected: true,
                        authenticated: true,
                        message: Some("syncing".into()),
                        challenge: None,
                    })
                }
            };
            to_value(&r)
        }
        adapter::DISCONNECT => {
            let a: DisconnectArgs = parse(call, args)?;
            let r = match unknown(&a.adapter, &a.account_id) {
                Some(e) => OpResult::failed(e),
                None => {
                    enabled.send_replace(false);
                    OpResult::done(Disconnected {
                        adapter: ADAPTER.into(),
                        account_id: account.into(),
                        message: Some("sync paused".into()),
                    })
                }
            };
            to_value(&r)
        }
        adapter::STATUS => {
            let a: StatusArgs = parse(call, args)?;
            let current = status.borrow().clone();
            let accounts = match &a.account_id {
                Some(id) if id != account => vec![],
                _ => vec![current],
            };
            to_value(&StatusResult {
                adapter: ADAPTER.into(),
                accounts,
            })
        }
        _ => {
            return Err(WireError {
                code: 404,
                message: format!("the {ADAPTER} adapter does not serve {call}"),
                details: None,
            });
        }
    };
    Ok(value)
}

fn parse<T: DeserializeOwned>(call: &str, args: Value) -> Result<T, WireError> {
    serde_json::from_value(args).map_err(|e| WireError {
        code: 400,
        message: format!("{call}: invalid arguments: {e}"),
        details: None,
    })
}

fn to_value<T: Serialize>(v: &T) -> Value {
    // The protocol types serialise to JSON objects without fail.
    serde_json::to_value(v).expect("protocol types serialise")
}
