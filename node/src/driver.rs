//! `gsv node`: a device driver. It connects to a kernel as role `driver`
//! with a node token bound to its device id, answers the calls the kernel
//! routes to it through [`NodeTools::handle_cancellable`] and sends the
//! node tools' `exec.status` events; the connection itself (handshake,
//! reconnecting with backoff, frames) is `gsv_link`'s (see `PROTOCOL.md`
//! for the frames).
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

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use gsv_link::{Client, Connection, Incoming, LinkConfig, Sender};
use gsv_protocol::error::code;
use gsv_protocol::{PROTOCOL, WireError};

use crate::{NodeTools, ToolError};

/// Running requests by the id the kernel gave them, each with the run
/// number that owns the entry (a repeated id replaces it).
type Active = Arc<Mutex<HashMap<String, (u64, CancellationToken)>>>;
static NEXT_RUN: AtomicU64 = AtomicU64::new(0);

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

/// Why the driver stopped for good (everything else is retried).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DriverError {
    /// The kernel needs someone to act first (setup required).
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
    let mut hello = json!({
        "protocol": PROTOCOL,
        "client": {
            "id": config.device_id,
            "version": env!("CARGO_PKG_VERSION"),
            "platform": std::env::consts::OS,
            "role": "driver",
        },
        "driver": {"implements": config.implements},
        "auth": {"token": config.token},
    });
    if !config.username.is_empty() {
        hello["auth"]["username"] = json!(config.username);
    }
    let link = LinkConfig {
        url: config.kernel_url.clone(),
        hello,
        min_backoff: config.min_backoff,
        max_backoff: config.max_backoff,
    };
    let mut driver = Driver { tools };
    gsv_link::run(&link, &mut driver, &stop)
        .await
        .map_err(|r| DriverError::Refused {
            url: r.url,
            code: r.code,
            message: r.message,
        })
}

/// The driver on one connection after another.
struct Driver {
    tools: NodeTools,
}

impl Client for Driver {
    /// Setup required waits for someone; anything else may pass.
    fn refusal_is_final(&self, code: i64) -> bool {
        code == code::SETUP_REQUIRED
    }

    /// Serves routed calls until the connection ends; the requests still
    /// running are cancelled then (the kernel has failed their routes).
    async fn serve(
        &mut self,
        connection: &mut Connection,
        stop: &CancellationToken,
    ) -> Option<String> {
        let sender = connection.sender();
        let active: Active = Arc::default();
        let outbox = self.tools.exec_events();
        // Events queued while disconnected go out first.
        send_events(&outbox, &sender).await;
        let why = loop {
            let incoming = tokio::select! {
                () = stop.cancelled() => break None,
                () = outbox.wait() => {
                    send_events(&outbox, &sender).await;
                    continue;
                }
                m = connection.next() => m,
            };
            match incoming {
                Err(why) => break why,
                Ok(Incoming::Request { id, call, args }) => {
                    start_request(&self.tools, &sender, &active, id, call, args)
                }
                Ok(Incoming::Signal { signal, payload }) if signal == "request.cancel" => {
                    if let Some(id) = payload["id"].as_str()
                        && let Some((_, c)) = active.lock().unwrap().remove(id)
                    {
                        tracing::debug!(%id, reason = ?payload["reason"].as_str(), "request cancelled");
                        c.cancel();
                    }
                }
                Ok(other) => tracing::debug!(frame = ?other, "ignoring a frame"),
            }
        };
        for (_, (_, c)) in active.lock().unwrap().drain() {
            c.cancel();
        }
        why
    }
}

async fn send_events(outbox: &crate::ExecEventOutbox, sender: &Sender) {
    let events = outbox.drain();
    for (i, e) in events.iter().enumerate() {
        if sender.signal("exec.status", json!(e)).await.is_err() {
            outbox.requeue(events[i..].to_vec());
            return;
        }
    }
}

/// Runs one routed call in its own task; a repeated id cancels the older
/// request, and a cancelled request sends no answer.
fn start_request(
    tools: &NodeTools,
    sender: &Sender,
    active: &Active,
    id: String,
    call: String,
    args: Map<String, Value>,
) {
    let cancel = CancellationToken::new();
    let run = NEXT_RUN.fetch_add(1, Ordering::Relaxed);
    if let Some((_, older)) = active
        .lock()
        .unwrap()
        .insert(id.clone(), (run, cancel.clone()))
    {
        older.cancel();
    }
    let (tools, sender, active) = (tools.clone(), sender.clone(), active.clone());
    tokio::spawn(async move {
        let r = tools
            .handle_cancellable(&call, Value::Object(args), &cancel)
            .await;
        {
            let mut a = active.lock().unwrap();
            // Only our own entry: a repeated id replaced it.
            if a.get(&id).is_some_and(|(r, _)| *r == run) {
                a.remove(&id);
            }
        }
        let answer = match r {
            Ok(data) => Ok(data),
            Err(ToolError::Cancelled) => return,
            Err(e) => Err(WireError {
                code: e.code(),
                message: e.to_string(),
                details: None,
            }),
        };
        let _ = sender.respond(id, answer).await;
    });
}
