//! `fs.watch` on a device: opening it (checked, registered, routed) and
//! relaying its `fs.changed` to the watcher (the state is
//! `watch::device`).

use std::sync::Arc;
use std::time::Duration;

use gsv_protocol::OpResult;
use gsv_protocol::watch::{
    AFTER_NOW, ChangedSignal, DEVICE_WATCHES_ARE_LIVE, EndedSignal, LaggedSignal, WatchArgs,
    WatchOutcome, WatchResult,
};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::{Fail, WatchError, sig_text};
use crate::domains::accounts;
use crate::domains::watch::device::{CHANGED, DeviceLink, ENDED};
use crate::domains::watch::{LiveSource, Registered};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::routing;
use crate::session::{Outgoing, Session};

/// How long the relay waits for room to tell the watcher why the watch
/// ended before giving up on a socket that does not read.
const ENDED_WAIT: Duration = Duration::from_secs(10);

/// `fs.watch` on device `target`: checked for what a device cannot do,
/// registered (so no early signal is lost), then routed like any `fs.*`
/// call (visibility, online, implements); the device answers with the
/// kernel's watch id.
pub(super) async fn open(
    k: &Arc<Kernel>,
    s: &Session,
    a: WatchArgs,
    target: String,
) -> Result<WatchResult, Fail> {
    if a.watch_id.is_some() || a.after.as_deref().is_some_and(|x| x != AFTER_NOW) {
        return Err(WatchError::CursorExpired(format!(
            "{DEVICE_WATCHES_ARE_LIVE} (device {target})"
        ))
        .into());
    }
    if a.durable {
        return Err(WatchError::Invalid(format!(
            "durable watches are not kept for devices: {DEVICE_WATCHES_ARE_LIVE}"
        ))
        .into());
    }
    let tx = k
        .pool
        .sender(&s.connection_id)
        .ok_or_else(|| Fail::Kernel(KernelError::Cancelled("the connection closed".into())))?;
    let id = format!("w_{}", accounts::random_hex(8));
    let (link, inbox_rx) = DeviceLink::new(&k.router, &target);
    let link = Arc::new(link);
    let reg = k.watches.register(
        &id,
        s.identity.uid,
        &s.connection_id,
        LiveSource::Device(link.clone()),
    );
    tokio::spawn(relay(k.clone(), id.clone(), link, inbox_rx, tx, reg));
    let mut args = Map::new();
    args.insert("path".into(), json!(a.path));
    args.insert("recursive".into(), json!(a.recursive));
    args.insert("include".into(), json!(a.include));
    args.insert("exclude".into(), json!(a.exclude));
    args.insert("watchId".into(), json!(id));
    let data = match routing::route_to_target(&k.router, s, "fs.watch", target.clone(), args).await
    {
        Ok(d) => d,
        // The device may have opened it and answered too late.
        Err(e @ KernelError::DeviceTimeout { .. }) => {
            k.watches.stop(&id, None);
            return Err(Fail::Kernel(e));
        }
        Err(e) => {
            k.watches.forget(&id);
            return Err(Fail::Kernel(e));
        }
    };
    match serde_json::from_value::<WatchOutcome<WatchResult>>(data) {
        Ok(OpResult::Done(d)) if d.result.watch_id == id => Ok(WatchResult {
            watch_id: id,
            cursor: d.result.cursor,
            durable: false,
            expires_at: None,
        }),
        Ok(OpResult::Failed(f)) => {
            k.watches.forget(&id);
            Err(Fail::Device(f))
        }
        Ok(OpResult::Done(_)) | Err(_) => {
            k.watches.stop(&id, None);
            Err(Fail::Kernel(KernelError::BadDeviceResponse {
                device: target,
                reason: format!("fs.watch was not answered with the watch id it was given ({id})"),
            }))
        }
    }
}

/// Relays one device watch's `fs.changed` to the watching connection once
/// the `fs.watch` answer is queued; ends it with `fs.watch.lagged` when
/// the socket or the inbox is full, or with `fs.watch.ended` when the
/// device's side ended it.
async fn relay(
    k: Arc<Kernel>,
    id: String,
    link: Arc<DeviceLink>,
    mut inbox: mpsc::Receiver<Value>,
    tx: mpsc::Sender<Outgoing>,
    reg: Registered,
) {
    let Registered {
        cancel,
        start,
        generation,
        stopped,
    } = reg;
    tokio::select! {
        biased;
        _ = cancel.cancelled() => return,
        _ = start => {}
    }
    // The cursor of the last batch handed over (a lagged watch names it).
    let mut cursor = String::new();
    loop {
        let payload = tokio::select! {
            biased;
            _ = cancel.cancelled() => {
                if let Some(reason) = link.take_ended() {
                    send_ended(&tx, &id, reason).await;
                }
                break;
            }
            p = inbox.recv() => match p {
                Some(p) => p,
                None => break,
            },
        };
        if link.overflowed() {
            lagged(&k, &id, &cursor, &tx).await;
            break;
        }
        let batch = match serde_json::from_value::<ChangedSignal>(payload) {
            Ok(b) if b.watch_id == id => b,
            Ok(_) | Err(_) => {
                tracing::warn!(device = %link.device, watch = %id, "dropping a malformed fs.changed");
                continue;
            }
        };
        let next = batch.cursor.clone();
        let text = sig_text(CHANGED, batch);
        // Held across the send: a stop waits for it, so no signal
        // follows the answer to `fs.unwatch`.
        let full = {
            let gate = stopped.lock().unwrap();
            if *gate {
                break;
            }
            match tx.try_send(Outgoing::Text(text)) {
                Ok(()) => false,
                Err(mpsc::error::TrySendError::Full(_)) => true,
                Err(mpsc::error::TrySendError::Closed(_)) => break,
            }
        };
        if full {
            lagged(&k, &id, &cursor, &tx).await;
            break;
        }
        cursor = next;
    }
    k.watches.ended(&id, generation);
}

/// Stops the watch (the device too) and, once the socket has room, says
/// where it stopped. A device watch cannot resume from there: it is said
/// so that the client knows what it has.
async fn lagged(k: &Arc<Kernel>, id: &str, cursor: &str, tx: &mpsc::Sender<Outgoing>) {
    k.watches.stop(id, None);
    let text = sig_text(
        "fs.watch.lagged",
        LaggedSignal {
            watch_id: id.to_owned(),
            cursor: cursor.to_owned(),
        },
    );
    if let Ok(Ok(p)) = tokio::time::timeout(ENDED_WAIT, tx.reserve()).await {
        p.send(Outgoing::Text(text));
    }
}

async fn send_ended(tx: &mpsc::Sender<Outgoing>, id: &str, reason: String) {
    let text = sig_text(
        ENDED,
        EndedSignal {
            watch_id: id.to_owned(),
            reason,
            resync: true,
        },
    );
    if let Ok(Ok(p)) = tokio::time::timeout(ENDED_WAIT, tx.reserve()).await {
        p.send(Outgoing::Text(text));
    }
}
