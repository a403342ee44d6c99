//! The in-memory half of routing: each device's one live driver
//! connection, each adapter's one live service connection, and the callers
//! waiting for a routed answer. A waiting route ends exactly once, by
//! whoever takes its entry out first: its answer
//! ([`Router::on_response`]), its peer going away
//! ([`Router::fail_connection`]) or its caller (`routing::forward`'s
//! guard). The durable half (the device rows, the route rows, the device
//! shell sessions) is the device domain's, reached through [`Devices`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::body::{Body, BodyError, BodyInbox, Descriptor};
use crate::domains::device::Devices;
use crate::error::KernelError;
use crate::session::{Outgoing, Session};
use gsv_protocol::OpResult;
use gsv_protocol::fs::{FsError, MAX_IMAGE_BYTES, MAX_READ_CONTENT_BYTES, TextWindow};

/// Most bytes of a routed `net.fetch` body relayed inline; the rest is
/// counted and `truncated`.
pub const MAX_FETCH_BODY_BYTES: usize = 1 << 20;

/// How long a routed answer's binary body may take to arrive in full
/// (the reference gateway's stream timeout).
const BODY_WAIT: Duration = Duration::from_secs(120);

/// The largest file a routed `fs.transfer.send` relays: it is held in
/// memory and answered inline (base64), so it shares the image limit.
pub const MAX_TRANSFER_BYTES: u64 = MAX_IMAGE_BYTES;

/// How a route ended, as seen by the waiting caller.
pub type Answer = Result<Value, KernelError>;

/// Who answers a route: a device's driver connection or an adapter's
/// service connection (`client.channel`). Their names live apart, so a
/// device id can never stand in for an adapter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Peer {
    Device(String),
    Adapter(String),
}

impl Peer {
    /// The failure of a route whose peer went away.
    pub fn disconnected(&self) -> KernelError {
        KernelError::Unavailable(match self {
            Peer::Device(d) => format!("Device disconnected: {d}"),
            Peer::Adapter(a) => format!("Adapter disconnected: {a}"),
        })
    }

    /// The failure of a route whose TTL passed (504).
    pub fn timed_out(&self, call: &str) -> KernelError {
        match self {
            Peer::Device(d) => KernelError::DeviceTimeout {
                call: call.to_owned(),
                device: d.clone(),
            },
            Peer::Adapter(a) => KernelError::AdapterTimeout {
                call: call.to_owned(),
                adapter: a.clone(),
            },
        }
    }

    /// How `routing_table.device_id` names it.
    pub fn row_id(&self) -> String {
        match self {
            Peer::Device(d) => d.clone(),
            Peer::Adapter(a) => format!("adapter:{a}"),
        }
    }
}

/// One route waiting for its peer.
#[derive(Debug)]
pub struct Pending {
    pub peer: Peer,
    pub driver_connection_id: String,
    pub call: String,
    /// `args.offset` of a routed `fs.read`: numbers the lines of a body.
    pub read_offset: u64,
    pub answer: oneshot::Sender<Answer>,
}

/// The live connection of a device (or of an adapter).
#[derive(Debug, Clone)]
pub struct Driver {
    pub connection_id: String,
    pub tx: mpsc::Sender<Outgoing>,
}

/// What routing works with: the device domain (its rows), the TTLs of
/// routed calls, and in memory the live drivers and adapters and the
/// waiting callers. The kernel holds one; the routes in `routing` need
/// nothing else of it.
#[derive(Debug)]
pub struct Router {
    pub devices: Devices,
    /// TTL of a routed call other than `shell.exec` (reference §3.5).
    pub routed_call_ttl: Duration,
    /// TTL of a call forwarded to an adapter (`gsv serve --adapter-timeout`).
    pub adapter_ttl: Duration,
    drivers: Mutex<HashMap<String, Driver>>,
    adapters: Mutex<HashMap<String, Driver>>,
    pending: Mutex<HashMap<String, Pending>>,
}

impl Router {
    pub fn new(devices: Devices, routed_call_ttl: Duration, adapter_ttl: Duration) -> Router {
        Router {
            devices,
            routed_call_ttl,
            adapter_ttl,
            drivers: Mutex::default(),
            adapters: Mutex::default(),
            pending: Mutex::default(),
        }
    }

    /// Makes `driver` the live connection of `device_id`, answering the
    /// routes of a superseded connection with 503 now rather than at
    /// their TTL.
    pub fn install_driver(&self, device_id: &str, driver: Driver) {
        self.install(&self.drivers, device_id, driver);
    }

    /// Forgets `connection_id` as the driver of `device_id` after failing
    /// its routes; false when a newer connection had already taken over.
    pub fn remove_driver(&self, connection_id: &str, device_id: &str) -> bool {
        self.remove(&self.drivers, connection_id, device_id)
    }

    /// Makes `adapter` the live service connection of an adapter; routes
    /// of a superseded one fail with 503 now.
    pub fn install_adapter(&self, adapter: &str, service: Driver) {
        self.install(&self.adapters, adapter, service);
    }

    /// Forgets `connection_id` as the service of `adapter` after failing
    /// its routes; false when a newer connection had already taken over.
    pub fn remove_adapter(&self, connection_id: &str, adapter: &str) -> bool {
        self.remove(&self.adapters, connection_id, adapter)
    }

    /// Makes `live` the connection of `name` in `peers` (the drivers or
    /// the adapters), failing a superseded connection's routes.
    fn install(&self, peers: &Mutex<HashMap<String, Driver>>, name: &str, live: Driver) {
        let connection_id = live.connection_id.clone();
        let old = peers.lock().unwrap().insert(name.to_owned(), live);
        if let Some(old) = old.filter(|o| o.connection_id != connection_id) {
            self.fail_connection(&old.connection_id);
        }
    }

    /// Fails `connection_id`'s routes and forgets it as `name`'s live
    /// connection in `peers`; false when a newer one had taken over.
    fn remove(
        &self,
        peers: &Mutex<HashMap<String, Driver>>,
        connection_id: &str,
        name: &str,
    ) -> bool {
        self.fail_connection(connection_id);
        let mut peers = peers.lock().unwrap();
        if peers
            .get(name)
            .is_some_and(|d| d.connection_id == connection_id)
        {
            peers.remove(name);
            true
        } else {
            false
        }
    }

    /// The live service connection of `adapter`.
    pub fn adapter(&self, adapter: &str) -> Option<Driver> {
        self.adapters.lock().unwrap().get(adapter).cloned()
    }

    /// The live connection of `peer`.
    pub fn live(&self, peer: &Peer) -> Option<Driver> {
        match peer {
            Peer::Device(d) => self.driver(d),
            Peer::Adapter(a) => self.adapter(a),
        }
    }

    /// Waits for the answer to route `id` from now on.
    pub fn expect(&self, id: String, pending: Pending) {
        self.pending.lock().unwrap().insert(id, pending);
    }

    /// Stops waiting for route `id`; its entry if it still waited.
    pub fn forget(&self, id: &str) -> Option<Pending> {
        self.pending.lock().unwrap().remove(id)
    }

    /// Fails every route bound to `connection_id` with 503.
    pub fn fail_connection(&self, connection_id: &str) {
        let gone: Vec<Pending> = {
            let mut p = self.pending.lock().unwrap();
            let ids: Vec<String> = p
                .iter()
                .filter(|(_, v)| v.driver_connection_id == connection_id)
                .map(|(k, _)| k.clone())
                .collect();
            ids.into_iter().filter_map(|id| p.remove(&id)).collect()
        };
        for p in gone {
            let _ = p.answer.send(Err(p.peer.disconnected()));
        }
    }

    /// A `res` frame from a driver connection. Only the connection the
    /// route was sent on may answer it; anything else is dropped. An answer
    /// with a binary body (the reference node's `fs.read`) is completed
    /// once the body has arrived on that connection's `inbox`.
    pub fn on_response(
        &self,
        session: &Session,
        inbox: &Arc<BodyInbox>,
        id: &str,
        ok: bool,
        frame: Value,
    ) {
        let pending = {
            let mut p = self.pending.lock().unwrap();
            match p.get(id) {
                Some(v) if v.driver_connection_id == session.connection_id => p.remove(id),
                _ => None,
            }
        };
        let Some(p) = pending else {
            tracing::debug!(conn = %session.connection_id, %id, "dropping a response with no route");
            return;
        };
        let bad = |reason: String| KernelError::BadDeviceResponse {
            device: p.peer.row_id(),
            reason,
        };
        if let Some(desc) = frame.get("body").filter(|b| !b.is_null()) {
            let answer = match (ok, Descriptor::parse(desc)) {
                (false, _) => Err(bad("an error response cannot carry a body".into())),
                (true, Err(e)) => Err(bad(e.to_string())),
                (true, Ok(d)) => {
                    let data = frame.get("data").cloned().unwrap_or(Value::Null);
                    let Some(keep) = body_keep(&p.call, &data) else {
                        let _ = p.answer.send(Err(bad(format!(
                            "binary bodies are relayed only for fs.read, net.fetch and \
                             fs.transfer.send, not {}",
                            p.call
                        ))));
                        return;
                    };
                    match inbox.expect(d, keep) {
                        Err(e) => Err(bad(e.to_string())),
                        Ok(rx) => {
                            let inbox = inbox.clone();
                            tokio::spawn(async move {
                                let got = match tokio::time::timeout(BODY_WAIT, rx).await {
                                    Ok(Ok(r)) => r,
                                    Ok(Err(_)) => Err(BodyError::Closed(d.stream_id)),
                                    Err(_) => {
                                        inbox.forget(d.stream_id);
                                        Err(BodyError::Sender {
                                            stream: d.stream_id,
                                            reason: format!(
                                                "no end within {}s",
                                                BODY_WAIT.as_secs()
                                            ),
                                        })
                                    }
                                };
                                let answer = match got {
                                    Ok(body) => Ok(inline_body(&p.call, data, body, p.read_offset)),
                                    Err(BodyError::Closed(_)) => Err(p.peer.disconnected()),
                                    Err(e) => Err(KernelError::BadDeviceResponse {
                                        device: p.peer.row_id(),
                                        reason: e.to_string(),
                                    }),
                                };
                                let _ = p.answer.send(answer);
                            });
                            return;
                        }
                    }
                }
            };
            let _ = p.answer.send(answer);
            return;
        }
        let answer = if ok {
            Ok(frame.get("data").cloned().unwrap_or(Value::Null))
        } else {
            let e = &frame["error"];
            match (e["code"].as_i64(), e["message"].as_str()) {
                (Some(code), Some(message)) => Err(KernelError::Device {
                    code,
                    message: message.to_owned(),
                }),
                _ => Err(bad("ok:false without error.code and error.message".into())),
            }
        };
        let _ = p.answer.send(answer);
    }

    pub fn driver(&self, device_id: &str) -> Option<Driver> {
        self.drivers.lock().unwrap().get(device_id).cloned()
    }
}

/// How many bytes of a routed answer's body the kernel keeps for `call`
/// (the rest is counted); `None` for a call whose answers carry no body.
fn body_keep(call: &str, data: &Value) -> Option<usize> {
    match call {
        "fs.read" if data["kind"] == "image" => Some(MAX_IMAGE_BYTES as usize + 1),
        // A text body past the read cap cannot fit the numbered window.
        "fs.read" => Some(MAX_READ_CONTENT_BYTES + 1),
        "net.fetch" => Some(MAX_FETCH_BODY_BYTES),
        "fs.transfer.send" => Some(MAX_TRANSFER_BYTES as usize),
        _ => None,
    }
}

/// Puts a routed answer's body into its JSON `data`, since this kernel
/// answers callers in JSON frames only.
fn inline_body(call: &str, data: Value, body: Body, read_offset: u64) -> Value {
    match call {
        "net.fetch" => inline_fetch_body(data, body),
        "fs.transfer.send" => inline_transfer_body(data, body),
        _ => inline_read_body(data, body, read_offset),
    }
}

/// A routed `net.fetch` (reference: `data{ok, url, status, statusText,
/// headers, redirected}` + the response body): the body as `data.body`
/// when it is UTF-8 text, else as `data.bodyBase64`; `bodyBytes` is what
/// the device sent in all, and past [`MAX_FETCH_BODY_BYTES`] it is cut with
/// `truncated:true`, as `fs.read` is.
fn inline_fetch_body(mut data: Value, body: Body) -> Value {
    if !data.is_object() {
        data = json!({});
    }
    let truncated = body.truncated();
    data["bodyBytes"] = json!(body.total);
    match utf8_prefix(body.bytes, truncated) {
        Ok(text) => data["body"] = Value::String(text),
        Err(bytes) => {
            data["bodyBase64"] =
                Value::String(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
    if truncated {
        data["truncated"] = json!(true);
    }
    data
}

/// A routed `fs.transfer.send` (reference: `data{ok, path, size,
/// contentType}` + the file's bytes): the bytes as `data.contentBase64`.
/// A file is never cut: one over [`MAX_TRANSFER_BYTES`] is an operation
/// error naming its path and size.
fn inline_transfer_body(mut data: Value, body: Body) -> Value {
    if !data.is_object() {
        data = json!({"ok": true});
    }
    if body.total > MAX_TRANSFER_BYTES {
        let path = data["path"].as_str().unwrap_or("?").to_owned();
        return json!({
            "ok": false,
            "error": format!(
                "File too large to relay: {path} is {} bytes (limit {MAX_TRANSFER_BYTES})",
                body.total
            ),
        });
    }
    data["contentBase64"] =
        Value::String(base64::engine::general_purpose::STANDARD.encode(&body.bytes));
    data
}

/// The bytes as text if they are UTF-8; a body cut at the limit may end in
/// a split character, which is dropped. Anything else gives the bytes back.
fn utf8_prefix(bytes: Vec<u8>, truncated: bool) -> Result<String, Vec<u8>> {
    match String::from_utf8(bytes) {
        Ok(t) => Ok(t),
        Err(e) if truncated && e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut b = e.into_bytes();
            b.truncate(valid);
            Ok(String::from_utf8(b).unwrap_or_default())
        }
        Err(e) => Err(e.into_bytes()),
    }
}

/// Puts a routed `fs.read`'s body where every other `fs.read` has it, so a
/// caller sees the one `fs.*` contract whichever target answered: text as
/// numbered lines in `data.content` through the same [`TextWindow`] (the
/// reference node sends the selected lines bare), an image as
/// `content:[{type:"image", data, mimeType}]`, failures as `FsError`s.
fn inline_read_body(mut data: Value, body: Body, offset: u64) -> Value {
    if !data.is_object() {
        data = json!({"ok": true});
    }
    let path = data["path"].as_str().unwrap_or("?").to_owned();
    let failed =
        |e: FsError| serde_json::to_value(OpResult::<()>::Failed(e.into())).unwrap_or_default();
    if data["kind"] == "image" {
        if body.total > MAX_IMAGE_BYTES {
            return failed(FsError::TooLarge {
                path,
                size: body.total,
                limit: MAX_IMAGE_BYTES,
            });
        }
        let mime = data["contentType"]
            .as_str()
            .unwrap_or("image/png")
            .to_owned();
        let b64 = base64::engine::general_purpose::STANDARD.encode(&body.bytes);
        data["content"] = json!([{"type": "image", "data": b64, "mimeType": mime}]);
        return data;
    }
    let truncated = body.truncated();
    let total = body.total;
    let text = match utf8_prefix(body.bytes, truncated) {
        Ok(t) => t,
        Err(_) => {
            let content_type = data["contentType"].as_str().unwrap_or("unknown").to_owned();
            return failed(FsError::Binary {
                path,
                content_type,
                size: data["size"].as_u64().unwrap_or(total),
            });
        }
    };
    let mut window = TextWindow::new(offset);
    window.push_text(&text, truncated);
    let content_type = data["contentType"]
        .as_str()
        .unwrap_or("text/plain")
        .to_owned();
    let size = data["size"].as_u64().unwrap_or(total);
    let file = window.finish(path, size, content_type);
    let shaped = match serde_json::to_value(OpResult::done(file)) {
        Ok(Value::Object(m)) => m,
        _ => return data,
    };
    // The device's other fields stay; the contract's replace its own.
    if let Value::Object(d) = &mut data {
        d.remove("truncated");
        d.remove("nextOffset");
        d.extend(shaped);
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_body_is_numbered_from_the_offset_without_a_phantom_last_line() {
        let body = |b: &[u8]| crate::body::Body {
            bytes: b.to_vec(),
            total: b.len() as u64,
        };
        let d = inline_read_body(json!({"ok": true, "kind": "text"}), body(b"a\nb\n"), 4);
        assert_eq!(
            (&d["content"], &d["lines"]),
            (&json!("5\ta\n6\tb"), &json!(2))
        );
        let d = inline_read_body(json!({"ok": true}), body(b""), 0);
        assert_eq!((&d["content"], &d["lines"]), (&json!(""), &json!(0)));
        let d = inline_read_body(json!({"ok": true, "path": "/x"}), body(&[0xff, 0xfe]), 0);
        assert_eq!(
            (&d["ok"], &d["code"]),
            (&json!(false), &json!("binary_file")),
            "{d}"
        );
    }
}
