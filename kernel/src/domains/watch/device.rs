//! `fs.watch` with `target: <device>`: the device watches its own files
//! (`gsv node` with inotify) and sends `fs.changed` on its driver
//! connection; the kernel relays them to the watching connection.
//!
//! The kernel keeps each device watch in the same registry as its own
//! (so `fs.unwatch`, the watcher's disconnect and the one-answer-first
//! rule work alike), with a relay task per watch fed from a small inbox.
//! A device keeps no change index, so its watches are live only: no
//! replay, no resume, no durable form. A lag or the device going away
//! ends the watch with a signal the watcher sees. This is the state half;
//! opening and relaying are `calls::device`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use crate::routing::{self, Router};

/// The device signal carrying a watch's changes.
pub const CHANGED: &str = "fs.changed";
/// The device signal ending a watch on its side (its watcher failed).
pub const ENDED: &str = "fs.watch.ended";
/// `fs.changed` batches waiting for the relay; one more means the relay
/// fell behind and the watch ends lagged.
pub const INBOX: usize = 64;

/// Whether a driver's signal is about a device watch.
pub fn is_watch_signal(signal: &str) -> bool {
    signal == CHANGED || signal == ENDED
}

/// A device watch's link to the device and to its relay.
#[derive(Debug)]
pub struct DeviceLink {
    pub device: String,
    /// The driver connection the watch was opened on: only it speaks for
    /// the watch, and its closing ends it.
    pub driver_connection_id: String,
    inbox: mpsc::Sender<Value>,
    /// A batch did not fit the inbox: the relay ends the watch lagged.
    overflowed: AtomicBool,
    /// Why the device's side ended the watch, for the watcher.
    ended: Mutex<Option<String>>,
    router: Arc<Router>,
}

impl DeviceLink {
    /// A link to `device` over its live driver connection now (none: the
    /// route will fail), and the relay's end of its inbox.
    pub fn new(router: &Arc<Router>, device: &str) -> (DeviceLink, mpsc::Receiver<Value>) {
        let (inbox, rx) = mpsc::channel(INBOX);
        let link = DeviceLink {
            device: device.to_owned(),
            driver_connection_id: router
                .driver(device)
                .map(|d| d.connection_id)
                .unwrap_or_default(),
            inbox,
            overflowed: AtomicBool::new(false),
            ended: Mutex::new(None),
            router: router.clone(),
        };
        (link, rx)
    }

    /// Whether a batch was lost to a full inbox.
    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Acquire)
    }

    /// Why the device's side ended the watch, once.
    pub fn take_ended(&self) -> Option<String> {
        self.ended.lock().unwrap().take()
    }

    /// Hands an `fs.changed` payload to the relay without waiting.
    pub(super) fn hand_over(&self, payload: Value) {
        if let Err(mpsc::error::TrySendError::Full(_)) = self.inbox.try_send(payload) {
            self.overflowed.store(true, Ordering::Release);
        }
    }

    pub(super) fn set_ended(&self, reason: String) {
        *self.ended.lock().unwrap() = Some(reason);
    }

    /// Asks the device to stop watch `id`, if the driver connection that
    /// serves it is still the device's live one (else the watch died with
    /// that connection on the device's side too).
    pub(super) fn tell_device_to_stop(&self, id: &str) {
        let live = self
            .router
            .driver(&self.device)
            .is_some_and(|d| d.connection_id == self.driver_connection_id);
        if !live {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (router, device, id) = (self.router.clone(), self.device.clone(), id.to_owned());
        rt.spawn(async move {
            let mut args = Map::new();
            args.insert("watchId".into(), json!(id));
            if let Err(e) =
                routing::call_device_as_kernel(&router, &device, &id, "fs.unwatch", args).await
            {
                tracing::debug!(%device, watch = %id, error = %e, "asking a device to stop a watch");
            }
        });
    }
}
