//! `gsv node`: a device driver. It connects to a kernel as role `driver`
//! with a node token bound to its device id, answers the calls the kernel
//! routes to it through [`NodeTools::handle_cancellable`], sends the node
//! tools' `exec.status` events and its watches' `fs.changed` /
//! `fs.watch.ended`, and reconnects with backoff when the
//! connection drops (see `PROTOCOL.md` for the frames).
//!
//! Requests run concurrently, each in its own task; `request.cancel` stops
//! one and no response is sent for it. When the connection drops, every
//! running request is cancelled (the kernel has already failed their
//! routes), but background shell sessions live on in [`NodeTools`] and are
//! reachable again after the reconnect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::sync::CancellationToken;

use gsv_protocol::PROTOCOL;

use crate::{NodeTools, ToolError};

/// How long connecting (TCP + WebSocket upgrade) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the kernel may take to answer `sys.connect`.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(15);
/// Running requests by the id the kernel gave them, each with the run
/// number that owns the entry (a repeated id replaces it).
type Active = Arc<Mutex<HashMap<String, (u64, CancellationToken)>>>;
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

/// Frames queued for the writer.
const OUTBOUND_QUEUE: usize = 32;

/// Where and who the driver is.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// `ws://HOST:PORT/ws`.
    pub kernel_url: String,
    pub device_id: String,
    /// The account the node token belongs to; empty leaves it to the
    /// kernel, which takes the token's own account.
    pub username: String,
    /// The raw node token.
    pub token: String,
    /// The `implements` patterns sent at connect.
    pub implements: Vec<String>,
    /// First and longest wait between reconnects.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
}

impl DriverConfig {
    pub fn new(kernel_url: String, device_id: String, username: String, token: String) -> Self {
        DriverConfig {
            kernel_url,
            device_id,
            username,
            token,
            implements: crate::IMPLEMENTS.iter().map(|s| s.to_string()).collect(),
            min_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// A driver failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// Worth retrying: the kernel is unreachable or the connection dropped.
    #[error("connection to {url}: {message}")]
    Connection { url: String, message: String },
    /// Not worth retrying until someone acts (e.g. setup required).
    #[error("the kernel at {url} refused the driver ({code}): {message}")]
    Refused {
        url: String,
        code: i64,
        message: String,
    },
}

/// Runs the driver until `stop` fires or the kernel refuses it for good
/// (setup required). Every other failure is retried with exponential
/// backoff, reset after each successful handshake.
pub async fn run(
    config: DriverConfig,
    tools: NodeTools,
    stop: CancellationToken,
) -> Result<(), DriverError> {
    let backoff = || {
        ExponentialBuilder::default()
            .with_min_delay(config.min_backoff)
            .with_max_delay(config.max_backoff)
            .with_jitter()
            .without_max_times()
            .build()
    };
    let mut delays = backoff();
    loop {
        let mut connected = false;
        let r = tokio::select! {
            () = stop.cancelled() => return Ok(()),
            r = run_once(&config, &tools, &stop, &mut connected) => r,
        };
        if stop.is_cancelled() {
            return Ok(());
        }
        match r {
            Err(e @ DriverError::Refused { code: 425, .. }) => return Err(e),
            Err(e) => tracing::warn!(error = %e, "driver connection failed"),
            Ok(()) => tracing::warn!(url = %config.kernel_url, "driver connection closed"),
        }
        if connected {
            delays = backoff();
        }
        let wait = delays.next().unwrap_or(config.max_backoff);
        tracing::info!(?wait, "reconnecting");
        tokio::select! {
            () = stop.cancelled() => return Ok(()),
            () = tokio::time::sleep(wait) => {}
        }
    }
}

/// One connection: handshake, then serve until it drops.
async fn run_once(
    config: &DriverConfig,
    tools: &NodeTools,
    stop: &CancellationToken,
    connected: &mut bool,
) -> Result<(), DriverError> {
    let url = config.kernel_url.clone();
    let lost = |message: String| DriverError::Connection {
        url: url.clone(),
        message,
    };
    let (ws, _) = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::connect_async(&config.kernel_url),
    )
    .await
    .map_err(|_| lost("connect timed out".into()))?
    .map_err(|e| lost(e.to_string()))?;
    let (mut sink, mut stream) = ws.split();
    let mut hello = json!({
        "type": "req",
        "id": "connect",
        "call": "sys.connect",
        "args": {
            "protocol": PROTOCOL,
            "client": {
                "id": config.device_id,
                "version": env!("CARGO_PKG_VERSION"),
                "platform": std::env::consts::OS,
                "role": "driver",
            },
            "driver": {"implements": config.implements},
            "auth": {"token": config.token},
        },
    });
    if !config.username.is_empty() {
        hello["args"]["auth"]["username"] = json!(config.username);
    }
    sink.send(Message::Text(hello.to_string().into()))
        .await
        .map_err(|e| lost(e.to_string()))?;
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
    .map_err(|_| lost("sys.connect timed out".into()))?
    .map_err(lost)?;
    if answer["ok"] != true {
        return Err(DriverError::Refused {
            url: url.clone(),
            code: answer["error"]["code"].as_i64().unwrap_or(0),
            message: answer["error"]["message"].as_str().unwrap_or("").to_owned(),
        });
    }
    *connected = true;
    tracing::info!(url = %config.kernel_url, device = %config.device_id, "driver connected");

    let (tx, mut rx) = mpsc::channel::<Message>(OUTBOUND_QUEUE);
    let writer = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.send(m).await.is_err() {
                break;
            }
        }
        let _ = sink.close().await;
    });
    let active: Active = Arc::default();
    let outbox = tools.exec_events();
    // Watches live on one connection: the kernel ended the earlier ones.
    let mut watch_signals = tools.watch_signals();
    // Events queued while disconnected go out first.
    send_events(&outbox, &tx).await;
    let result = loop {
        let msg = tokio::select! {
            () = stop.cancelled() => break Ok(()),
            () = outbox.wait() => {
                send_events(&outbox, &tx).await;
                continue;
            }
            Some(sig) = watch_signals.recv() => {
                let frame = json!({"type": "sig", "signal": sig.name(), "payload": sig.payload()});
                let _ = tx.send(Message::Text(frame.to_string().into())).await;
                continue;
            }
            m = stream.next() => m,
        };
        match msg {
            None | Some(Ok(Message::Close(_))) => break Ok(()),
            Some(Err(e)) => break Err(lost(e.to_string())),
            Some(Ok(Message::Text(t))) => on_frame(t.as_str(), tools, &tx, &active),
            Some(Ok(Message::Ping(p))) => {
                let _ = tx.send(Message::Pong(p)).await;
            }
            Some(Ok(_)) => {}
        }
    };
    for (_, (_, c)) in active.lock().unwrap().drain() {
        c.cancel();
    }
    tools.stop_watches();
    drop(tx);
    let _ = writer.await;
    result
}

async fn send_events(outbox: &crate::ExecEventOutbox, tx: &mpsc::Sender<Message>) {
    let events = outbox.drain();
    for (i, e) in events.iter().enumerate() {
        let frame = json!({"type": "sig", "signal": "exec.status", "payload": e});
        if tx
            .send(Message::Text(frame.to_string().into()))
            .await
            .is_err()
        {
            outbox.requeue(events[i..].to_vec());
            return;
        }
    }
}

fn on_frame(text: &str, tools: &NodeTools, tx: &mpsc::Sender<Message>, active: &Active) {
    let Ok(v) = serde_json::from_str::<Value>(text) else {
        tracing::warn!("ignoring a frame that is not JSON");
        return;
    };
    match v["type"].as_str() {
        Some("req") => {
            let (Some(id), Some(call)) = (v["id"].as_str(), v["call"].as_str()) else {
                tracing::warn!("ignoring a request without id or call");
                return;
            };
            let (id, call) = (id.to_owned(), call.to_owned());
            let args = match v.get("args") {
                Some(a) if a.is_object() => a.clone(),
                _ => json!({}),
            };
            let cancel = CancellationToken::new();
            let run = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
            if let Some((_, older)) = active
                .lock()
                .unwrap()
                .insert(id.clone(), (run, cancel.clone()))
            {
                older.cancel();
            }
            let (tools, tx, active) = (tools.clone(), tx.clone(), active.clone());
            tokio::spawn(async move {
                let r = tools.handle_cancellable(&call, args, &cancel).await;
                {
                    let mut a = active.lock().unwrap();
                    // Only our own entry: a repeated id replaced it.
                    if a.get(&id).is_some_and(|(r, _)| *r == run) {
                        a.remove(&id);
                    }
                }
                let frame = match r {
                    Ok(data) => json!({"type": "res", "id": id, "ok": true, "data": data}),
                    Err(ToolError::Cancelled) => return,
                    Err(e) => json!({"type": "res", "id": id, "ok": false,
                        "error": {"code": e.code(), "message": e.to_string()}}),
                };
                let _ = tx.send(Message::Text(frame.to_string().into())).await;
            });
        }
        Some("sig") if v["signal"] == "request.cancel" => {
            if let Some(id) = v["payload"]["id"].as_str()
                && let Some((_, c)) = active.lock().unwrap().remove(id)
            {
                tracing::debug!(%id, reason = ?v["payload"]["reason"].as_str(), "request cancelled");
                c.cancel();
            }
        }
        _ => {
            tracing::debug!(frame = %text.chars().take(200).collect::<String>(), "ignoring a frame")
        }
    }
}
