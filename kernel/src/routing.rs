//! Device routing (reference §3.3–§3.7): `fs.*`/`shell.exec` calls with
//! `target: <deviceId>`, and shell-session continuations, go to the
//! device's live driver connection and the answer comes back to the
//! caller.
//!
//! Checks run in the reference's order: visibility (403, an unknown device
//! included), online (503), implements (400), live driver connection
//! (503). The route row is written before the frame is sent and carries
//! the kernel's own request id, so two callers' ids never collide on the
//! driver connection. A route ends exactly once: answered, expired (504,
//! `request.cancel` to the device), its driver gone (503), or its caller
//! gone or cancelled (`request.cancel` to the device, no answer). The
//! caller's wait is a future; dropping it (cancel, origin disconnect) is
//! what cancels the route, through [`RouteGuard`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use rusqlite::{Connection, OptionalExtension, params};
use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::accounts::{self, ProcessIdentity};
use crate::body::{Body, BodyError, BodyInbox, Descriptor};
use crate::caps;
use crate::db::now_ms;
use crate::error::KernelError;
use crate::frames::Outbound;
use crate::kernel::Kernel;
use crate::node::MAX_IMAGE_BYTES;
use crate::session::{Outgoing, Session};
use crate::syscalls::fs::MAX_READ_BYTES;

/// TTL of a routed `shell.exec` without a timeout: above the node's
/// 10-minute process watchdog.
pub const SHELL_TTL_CAP: Duration = Duration::from_secs(11 * 60);
/// Added to a routed `shell.exec`'s own timeout for its TTL.
const SHELL_TTL_SLACK: Duration = Duration::from_secs(10);
/// How long a device shell session row lives after its last update.
pub const SESSION_TTL: Duration = Duration::from_secs(24 * 60 * 60);
/// Longest device label and description (reference §2.1).
const MAX_LABEL_CHARS: usize = 120;
const MAX_DESCRIPTION_CHARS: usize = 500;

/// How long a routed answer's binary body may take to arrive in full
/// (the reference gateway's stream timeout).
const BODY_WAIT: Duration = Duration::from_secs(120);

/// How a route ended, as seen by the waiting caller.
type Answer = Result<Value, KernelError>;

/// One route waiting for its device.
#[derive(Debug)]
struct Pending {
    device_id: String,
    driver_connection_id: String,
    call: String,
    /// `args.offset` of a routed `fs.read`: numbers the lines of a body.
    read_offset: u64,
    answer: oneshot::Sender<Answer>,
}

/// The live driver connection of a device.
#[derive(Debug, Clone)]
struct Driver {
    connection_id: String,
    tx: mpsc::Sender<Outgoing>,
}

/// In-memory half of routing: live drivers and waiting callers. The
/// durable half is the `routing_table` and `devices` rows.
#[derive(Debug, Default)]
pub struct Router {
    drivers: Mutex<HashMap<String, Driver>>,
    pending: Mutex<HashMap<String, Pending>>,
}

/// A device row as `sys.device.*` shows it.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub device_id: String,
    pub owner_uid: i64,
    pub label: String,
    pub description: String,
    pub implements: Vec<String>,
    pub platform: String,
    pub version: String,
    pub online: bool,
    pub first_seen_at: i64,
    pub last_seen_at: i64,
    pub connected_at: Option<i64>,
    pub disconnected_at: Option<i64>,
}

const DEVICE_COLUMNS: &str = "device_id, owner_uid, label, description, implements, platform, \
     version, online, first_seen_at, last_seen_at, connected_at, disconnected_at";

fn device_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Device> {
    let implements: String = r.get(4)?;
    Ok(Device {
        device_id: r.get(0)?,
        owner_uid: r.get(1)?,
        label: r.get(2)?,
        description: r.get(3)?,
        implements: serde_json::from_str(&implements).unwrap_or_default(),
        platform: r.get(5)?,
        version: r.get(6)?,
        online: r.get::<_, i64>(7)? != 0,
        first_seen_at: r.get(8)?,
        last_seen_at: r.get(9)?,
        connected_at: r.get(10)?,
        disconnected_at: r.get(11)?,
    })
}

/// The device row, if any.
pub fn get_device(c: &Connection, id: &str) -> Result<Option<Device>, KernelError> {
    Ok(c.query_row(
        &format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE device_id = ?1"),
        [id],
        device_from_row,
    )
    .optional()?)
}

/// Whether `who` may see and use `device` (reference `canAccess`).
pub fn can_access(
    c: &Connection,
    device: &Device,
    who: &ProcessIdentity,
) -> Result<bool, KernelError> {
    if who.is_root() || device.owner_uid == who.uid {
        return Ok(true);
    }
    let mut stmt = c.prepare_cached("SELECT gid FROM device_access WHERE device_id = ?1")?;
    let gids: Vec<i64> = stmt
        .query_map([&device.device_id], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(gids.iter().any(|g| who.gids.contains(g) || *g == who.gid))
}

/// The device `id` if `who` may see it; an unknown device is 403 exactly
/// like a hidden one, so ids cannot be probed.
pub fn visible_device(
    c: &Connection,
    id: &str,
    who: &ProcessIdentity,
) -> Result<Device, KernelError> {
    let denied = || KernelError::AccessDenied {
        kind: "device",
        id: id.to_owned(),
    };
    let d = get_device(c, id)?.ok_or_else(denied)?;
    if can_access(c, &d, who)? {
        Ok(d)
    } else {
        Err(denied())
    }
}

/// Devices `who` can see, by id.
pub fn list_devices(c: &Connection, who: &ProcessIdentity) -> Result<Vec<Device>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {DEVICE_COLUMNS} FROM devices ORDER BY device_id"
    ))?;
    let all: Vec<Device> = stmt
        .query_map([], device_from_row)?
        .collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for d in all {
        if can_access(c, &d, who)? {
            out.push(d);
        }
    }
    Ok(out)
}

/// Owner-set metadata of a device (`sys.device.update`).
pub fn update_device(
    c: &Connection,
    id: &str,
    label: Option<&str>,
    description: Option<&str>,
) -> Result<(), KernelError> {
    if let Some(l) = label {
        let l = clean_label(l, id);
        c.execute(
            "UPDATE devices SET label = ?2 WHERE device_id = ?1",
            params![id, l],
        )?;
    }
    if let Some(d) = description {
        let d: String = d.trim().chars().take(MAX_DESCRIPTION_CHARS).collect();
        c.execute(
            "UPDATE devices SET description = ?2 WHERE device_id = ?1",
            params![id, d],
        )?;
    }
    Ok(())
}

fn clean_label(label: &str, id: &str) -> String {
    let l = label.trim();
    let l = if l.is_empty() { id } else { l };
    l.chars().take(MAX_LABEL_CHARS).collect()
}

/// Refuses a driver whose device id already belongs to another user
/// (103, reference §1.6).
pub fn check_device_owner(c: &Connection, device_id: &str, uid: i64) -> Result<(), KernelError> {
    let owner: Option<i64> = c
        .query_row(
            "SELECT owner_uid FROM devices WHERE device_id = ?1",
            [device_id],
            |r| r.get(0),
        )
        .optional()?;
    match owner {
        Some(o) if o != uid => Err(KernelError::InvalidClient(format!(
            "Device id already belongs to another user: {device_id}"
        ))),
        _ => Ok(()),
    }
}

/// At start no driver is connected and no caller is waiting: every device
/// is offline and every route row is stale (its caller's socket died with
/// the previous kernel).
pub fn reset_at_start(c: &mut Connection) -> Result<(), KernelError> {
    let now = now_ms();
    c.execute(
        "UPDATE devices SET online = 0, disconnected_at = ?1 WHERE online = 1",
        [now],
    )?;
    c.execute("DELETE FROM routing_table", [])?;
    Ok(())
}

/// What a driver's `sys.connect` says about its device.
#[derive(Debug, Clone)]
pub struct Registration {
    pub device_id: String,
    pub implements: Vec<String>,
    pub platform: String,
    pub version: String,
}

impl Router {
    /// Registers a driver connection that has just completed `sys.connect`:
    /// the device row (owner metadata kept, `implements`/`platform`/
    /// `version` replaced), the owner's primary group in its ACL, and this
    /// connection as the device's one live driver. An older driver
    /// connection is superseded: its routes fail with 503 now rather than
    /// at their TTL.
    pub async fn register_driver(
        k: &Arc<Kernel>,
        connection_id: &str,
        tx: mpsc::Sender<Outgoing>,
        who: &ProcessIdentity,
        reg: Registration,
    ) -> Result<(), KernelError> {
        let (uid, gid) = (who.uid, who.gid);
        let r = reg.clone();
        k.db.call(move |c| {
            let tx = c.transaction()?;
            check_device_owner(&tx, &r.device_id, uid)?;
            let now = now_ms();
            let implements = serde_json::to_string(&r.implements)
                .map_err(|e| KernelError::internal("encoding implements", e))?;
            tx.execute(
                "INSERT INTO devices(device_id, owner_uid, label, implements, platform, version,
                     online, first_seen_at, last_seen_at, connected_at)
                 VALUES (?1, ?2, ?1, ?3, ?4, ?5, 1, ?6, ?6, ?6)
                 ON CONFLICT(device_id) DO UPDATE SET implements = ?3, platform = ?4,
                     version = ?5, online = 1, last_seen_at = ?6, connected_at = ?6",
                params![r.device_id, uid, implements, r.platform, r.version, now],
            )?;
            tx.execute(
                "INSERT OR IGNORE INTO device_access(device_id, gid) VALUES (?1, ?2)",
                params![r.device_id, gid],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await?;
        let old = k.router.drivers.lock().unwrap().insert(
            reg.device_id.clone(),
            Driver {
                connection_id: connection_id.to_owned(),
                tx,
            },
        );
        if let Some(old) = old.filter(|o| o.connection_id != connection_id) {
            k.router.fail_connection(&old.connection_id, &reg.device_id);
        }
        tracing::info!(device = %reg.device_id, conn = %connection_id, "driver registered");
        Ok(())
    }

    /// A driver connection closed: its routes fail with 503, and the device
    /// goes offline unless a newer connection already took over. Running
    /// shell sessions are left alone: the device reports their end itself
    /// (`exec.status`), and a reconnect is not an exit.
    pub async fn driver_disconnected(k: &Arc<Kernel>, connection_id: &str, device_id: &str) {
        k.router.fail_connection(connection_id, device_id);
        let was_current = {
            let mut drivers = k.router.drivers.lock().unwrap();
            if drivers
                .get(device_id)
                .is_some_and(|d| d.connection_id == connection_id)
            {
                drivers.remove(device_id);
                true
            } else {
                false
            }
        };
        let (dev, conn) = (device_id.to_owned(), connection_id.to_owned());
        let r =
            k.db.call(move |c| {
                c.execute(
                    "DELETE FROM routing_table WHERE driver_connection_id = ?1",
                    [&conn],
                )?;
                if was_current {
                    c.execute(
                        "UPDATE devices SET online = 0, disconnected_at = ?2, last_seen_at = ?2
                         WHERE device_id = ?1",
                        params![dev, now_ms()],
                    )?;
                }
                Ok(())
            })
            .await;
        if let Err(e) = r {
            tracing::warn!(device = %device_id, error = %e, "recording a driver disconnect");
        }
        tracing::info!(device = %device_id, conn = %connection_id, "driver disconnected");
    }

    /// Fails every route bound to `connection_id` with 503.
    fn fail_connection(&self, connection_id: &str, device_id: &str) {
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
            let _ = p.answer.send(Err(KernelError::Unavailable(format!(
                "Device disconnected: {device_id}"
            ))));
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
            device: p.device_id.clone(),
            reason,
        };
        if let Some(desc) = frame.get("body").filter(|b| !b.is_null()) {
            let answer = match (ok, Descriptor::parse(desc)) {
                (false, _) => Err(bad("an error response cannot carry a body".into())),
                (true, Err(e)) => Err(bad(e.to_string())),
                (true, Ok(_)) if p.call != "fs.read" => Err(bad(format!(
                    "binary bodies are relayed only for fs.read, not {}",
                    p.call
                ))),
                (true, Ok(d)) => {
                    let data = frame.get("data").cloned().unwrap_or(Value::Null);
                    let keep = if data["kind"] == "image" {
                        MAX_IMAGE_BYTES as usize + 1
                    } else {
                        MAX_READ_BYTES
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
                                    Ok(body) => Ok(inline_read_body(data, body, p.read_offset)),
                                    Err(BodyError::Closed(_)) => Err(KernelError::Unavailable(
                                        format!("Device disconnected: {}", p.device_id),
                                    )),
                                    Err(e) => Err(KernelError::BadDeviceResponse {
                                        device: p.device_id.clone(),
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

    fn driver(&self, device_id: &str) -> Option<Driver> {
        self.drivers.lock().unwrap().get(device_id).cloned()
    }
}

/// A signal from a driver connection: `exec.status` updates the device's
/// shell session; `device.ping` is answered with `device.pong`.
pub async fn on_driver_signal(
    k: &Arc<Kernel>,
    session: &Session,
    tx: &mpsc::Sender<Outgoing>,
    signal: &str,
    payload: Value,
) {
    let Some((device_id, _)) = session.device.clone() else {
        return;
    };
    match signal {
        "device.ping" => {
            let out = Outbound::Sig {
                signal: "device.pong".into(),
                payload,
                seq: None,
            };
            let _ = tx.send(Outgoing::Text(out.to_text())).await;
        }
        "exec.status" => {
            // Only the device's current driver speaks for its sessions.
            let current = k
                .router
                .driver(&device_id)
                .is_some_and(|d| d.connection_id == session.connection_id);
            let Some(sid) = payload["sessionId"].as_str().filter(|s| !s.is_empty()) else {
                return;
            };
            if !current {
                return;
            }
            let status = match payload["event"].as_str() {
                Some("finished") => "completed",
                Some("failed" | "timed_out") => "failed",
                _ => "running",
            };
            let exit = payload["exitCode"].as_i64();
            let error = payload["signal"].as_str().map(str::to_owned);
            let sid = sid.to_owned();
            let r =
                k.db.call(move |c| {
                    c.execute(
                        "UPDATE device_shell_sessions SET status = ?3, exit_code = ?4, error = ?5,
                             updated_at = ?6, expires_at = ?7
                         WHERE session_id = ?1 AND device_id = ?2",
                        params![
                            sid,
                            device_id,
                            status,
                            exit,
                            error,
                            now_ms(),
                            now_ms() + SESSION_TTL.as_millis() as i64
                        ],
                    )?;
                    Ok(())
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "recording exec.status");
            }
        }
        other => tracing::debug!(signal = other, "ignoring a driver signal"),
    }
}

/// The device shell session a `shell.exec` continues, if it names one this
/// kernel routed. `None` means the call is not a device continuation (a
/// workspace session, or no session at all).
pub async fn device_session(
    k: &Arc<Kernel>,
    call: &str,
    args: &Map<String, Value>,
) -> Result<Option<DeviceSession>, KernelError> {
    if call != "shell.exec" {
        return Ok(None);
    }
    let Some(sid) = args
        .get("sessionId")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|s| !s.is_empty())
    else {
        return Ok(None);
    };
    let sid = sid.to_owned();
    k.db.call(move |c| {
        let now = now_ms();
        // Pruned here, on the path that reads them, so rows never pile up.
        c.execute(
            "DELETE FROM device_shell_sessions WHERE expires_at <= ?1",
            [now],
        )?;
        Ok(c.query_row(
            "SELECT session_id, device_id, owner_uid, status, exit_code, error
             FROM device_shell_sessions WHERE session_id = ?1",
            [&sid],
            |r| {
                Ok(DeviceSession {
                    session_id: r.get(0)?,
                    device_id: r.get(1)?,
                    owner_uid: r.get(2)?,
                    status: r.get(3)?,
                    exit_code: r.get(4)?,
                    error: r.get(5)?,
                })
            },
        )
        .optional()?)
    })
    .await
}

/// A row of `device_shell_sessions`.
#[derive(Debug, Clone)]
pub struct DeviceSession {
    pub session_id: String,
    pub device_id: String,
    pub owner_uid: i64,
    pub status: String,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
}

/// Continues a device shell session: owner only (others 403, unlike the
/// reference), the same device if a target is named (400), a failed
/// session answered from its row, else routed to its device.
pub async fn continue_session(
    k: &Arc<Kernel>,
    session: &Session,
    s: DeviceSession,
    target: Option<String>,
    args: Map<String, Value>,
) -> Result<Value, KernelError> {
    let who = session.identity.clone();
    if !who.is_root() && who.uid != s.owner_uid {
        return Err(KernelError::AccessDenied {
            kind: "shell session",
            id: s.session_id,
        });
    }
    if target.as_deref().is_some_and(|t| t != s.device_id) {
        return Err(KernelError::BadRequest(
            "Shell session target does not match the requested target".into(),
        ));
    }
    let dev = s.device_id.clone();
    let device = k.db.call(move |c| visible_device(c, &dev, &who)).await?;
    if s.status == "failed" && s.error.is_some() {
        let mut out = json!({
            "status": "failed",
            "output": "",
            "error": s.error,
            "sessionId": s.session_id,
        });
        if let Some(code) = s.exit_code {
            out["exitCode"] = json!(code);
        }
        return Ok(out);
    }
    route(k, session, "shell.exec", device, args).await
}

/// Routes `call` to the device `target` (already removed from `args`).
pub async fn route_to_target(
    k: &Arc<Kernel>,
    session: &Session,
    call: &str,
    target: String,
    args: Map<String, Value>,
) -> Result<Value, KernelError> {
    let who = session.identity.clone();
    let device = k.db.call(move |c| visible_device(c, &target, &who)).await?;
    route(k, session, call, device, args).await
}

/// The TTL of a routed call (reference §3.5); `default` for every call but
/// `shell.exec`.
pub fn ttl(default: Duration, call: &str, args: &Map<String, Value>) -> Duration {
    if call == "shell.exec" {
        return match args.get("timeout").and_then(Value::as_f64) {
            Some(t) if t.is_finite() && t > 0.0 => {
                let t = Duration::from_millis(t as u64) + SHELL_TTL_SLACK;
                t.clamp(Duration::from_secs(1), SHELL_TTL_CAP)
            }
            _ => SHELL_TTL_CAP,
        };
    }
    default
}

/// Ends a route that is dropped before its answer (caller cancelled or
/// gone, or the TTL passed): the row is deleted and the device is told to
/// stop, so it sends nothing more.
struct RouteGuard {
    k: Arc<Kernel>,
    id: String,
    reason: &'static str,
    done: bool,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let p = self.k.router.pending.lock().unwrap().remove(&self.id);
        if let Some(p) = p
            && let Some(d) = self.k.router.driver(&p.device_id)
            && d.connection_id == p.driver_connection_id
        {
            let out = Outbound::Sig {
                signal: "request.cancel".into(),
                payload: json!({"id": self.id, "reason": self.reason}),
                seq: None,
            };
            // A full queue means the driver is not reading; the route is
            // gone either way and its late answer will be dropped.
            let _ = d.tx.try_send(Outgoing::Text(out.to_text()));
        }
        let (db, id) = (self.k.db.clone(), self.id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = db
                    .call(move |c| {
                        c.execute("DELETE FROM routing_table WHERE id = ?1", [&id])?;
                        Ok(())
                    })
                    .await;
            });
        }
    }
}

async fn route(
    k: &Arc<Kernel>,
    session: &Session,
    call: &str,
    device: Device,
    args: Map<String, Value>,
) -> Result<Value, KernelError> {
    let dev = device.device_id.clone();
    if !device.online {
        return Err(KernelError::Unavailable(format!("Device offline: {dev}")));
    }
    if !device.implements.iter().any(|p| caps::matches(p, call)) {
        return Err(KernelError::BadRequest(format!(
            "Device {dev} does not implement {call}"
        )));
    }
    let Some(driver) = k.router.driver(&dev) else {
        return Err(KernelError::Unavailable(format!(
            "No active connection for device: {dev}"
        )));
    };
    let ttl = ttl(k.config.routed_call_ttl, call, &args);
    let id = format!("rt_{}", accounts::random_hex(12));
    // Armed before the row exists: a caller dropped at any await below
    // leaves neither a row nor a waiting entry behind.
    let mut guard = RouteGuard {
        k: k.clone(),
        id: id.clone(),
        reason: "Request cancelled",
        done: false,
    };
    let deadline = tokio::time::Instant::now() + ttl;
    let now = now_ms();
    let row = (
        id.clone(),
        call.to_owned(),
        session.connection_id.clone(),
        dev.clone(),
        driver.connection_id.clone(),
    );
    k.db.call(move |c| {
        c.execute(
            "INSERT OR REPLACE INTO routing_table(id, call, origin_type, origin_id, device_id,
                 driver_connection_id, created_at, expires_at)
             VALUES (?1, ?2, 'connection', ?3, ?4, ?5, ?6, ?7)",
            params![
                row.0,
                row.1,
                row.2,
                row.3,
                row.4,
                now,
                now + ttl.as_millis() as i64
            ],
        )?;
        Ok(())
    })
    .await?;
    let (answer_tx, answer_rx) = oneshot::channel();
    k.router.pending.lock().unwrap().insert(
        id.clone(),
        Pending {
            device_id: dev.clone(),
            driver_connection_id: driver.connection_id.clone(),
            call: call.to_owned(),
            read_offset: args.get("offset").and_then(Value::as_u64).unwrap_or(0),
            answer: answer_tx,
        },
    );
    let frame = json!({"type": "req", "id": id, "call": call, "args": args});
    // The driver's queue is bounded; a driver that stops reading costs
    // this caller its TTL, never more.
    match tokio::time::timeout_at(deadline, driver.tx.send(Outgoing::Text(frame.to_string()))).await
    {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            return Err(KernelError::Unavailable(format!(
                "Device disconnected: {dev}"
            )));
        }
        Err(_) => {
            guard.reason = "Request timed out";
            return Err(KernelError::DeviceTimeout {
                call: call.to_owned(),
                device: dev,
            });
        }
    }
    tracing::debug!(route = %id, %call, device = %dev, ?ttl, "routed");
    let answer = match tokio::time::timeout_at(deadline, answer_rx).await {
        Err(_) => {
            guard.reason = "Request timed out";
            return Err(KernelError::DeviceTimeout {
                call: call.to_owned(),
                device: dev,
            });
        }
        // The sender is dropped only with the pending entry, which every
        // ending answers first; treat it as the driver going away.
        Ok(Err(_)) => Err(KernelError::Unavailable(format!(
            "Device disconnected: {dev}"
        ))),
        Ok(Ok(a)) => a,
    };
    guard.done = true;
    let db = k.db.clone();
    let rid = id.clone();
    let _ = db
        .call(move |c| {
            c.execute("DELETE FROM routing_table WHERE id = ?1", [&rid])?;
            Ok(())
        })
        .await;
    let data = answer?;
    if call == "shell.exec" {
        remember_session(k, &session.identity, &dev, &data).await?;
    }
    Ok(data)
}

/// Records `sessionId → device` with its owner when a routed `shell.exec`
/// answers with a session (reference §3.6 step 5).
async fn remember_session(
    k: &Arc<Kernel>,
    who: &ProcessIdentity,
    device_id: &str,
    data: &Value,
) -> Result<(), KernelError> {
    let Some(sid) = data["sessionId"].as_str().filter(|s| !s.is_empty()) else {
        return Ok(());
    };
    let status = match data["status"].as_str() {
        Some("completed") => "completed",
        Some("failed") => "failed",
        _ => "running",
    };
    let (sid, dev, uid) = (sid.to_owned(), device_id.to_owned(), who.uid);
    let exit = data["exitCode"].as_i64();
    let error = data["error"].as_str().map(str::to_owned);
    k.db.call(move |c| {
        let now = now_ms();
        let exp = now + SESSION_TTL.as_millis() as i64;
        // A session id already recorded for another device or owner is
        // left as it is: an answer never hands someone else's session over.
        c.execute(
            "INSERT INTO device_shell_sessions(session_id, device_id, owner_uid, status,
                 exit_code, error, created_at, updated_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7, ?8)
             ON CONFLICT(session_id) DO UPDATE SET status = ?4, exit_code = ?5, error = ?6,
                 updated_at = ?7, expires_at = ?8
             WHERE device_id = ?2 AND owner_uid = ?3",
            params![sid, dev, uid, status, exit, error, now, exp],
        )?;
        Ok(())
    })
    .await
}

/// Puts a routed `fs.read`'s body where every other `fs.read` has it, so a
/// caller sees one shape whichever target answered: text as numbered lines
/// in `data.content` (the reference node sends the selected lines bare),
/// an image as `content:[{type:"image", data, mimeType}]`.
fn inline_read_body(mut data: Value, body: Body, offset: u64) -> Value {
    if !data.is_object() {
        data = json!({"ok": true});
    }
    if data["kind"] == "image" {
        if body.total > MAX_IMAGE_BYTES {
            return json!({
                "ok": false,
                "error": format!(
                    "Image too large: {} bytes (limit {MAX_IMAGE_BYTES})",
                    body.total
                ),
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
    let text = match String::from_utf8(body.bytes) {
        Ok(t) => t,
        // A cut at the limit may split a character; drop the partial one.
        Err(e) if truncated && e.utf8_error().error_len().is_none() => {
            let valid = e.utf8_error().valid_up_to();
            let mut b = e.into_bytes();
            b.truncate(valid);
            String::from_utf8(b).unwrap_or_default()
        }
        Err(_) => {
            let path = data["path"].as_str().unwrap_or("?").to_owned();
            return json!({"ok": false, "error": format!("Binary file - not a text file: {path}")});
        }
    };
    // The reference splits on every `\n`, so a final newline shows as an
    // extra empty line; other targets count lines, not separators.
    let text = text.strip_suffix('\n').unwrap_or(&text);
    let mut content = String::with_capacity(text.len() + text.len() / 8);
    let mut lines = 0u64;
    if !text.is_empty() {
        for (i, line) in text.split('\n').enumerate() {
            if i > 0 {
                content.push('\n');
            }
            content.push_str(&format!("{}\t{line}", offset + i as u64 + 1));
            lines += 1;
        }
    }
    data["content"] = Value::String(content);
    data["lines"] = json!(lines);
    if truncated {
        data["truncated"] = json!(true);
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_routed_shell_exec_lives_its_timeout_plus_ten_seconds_capped_at_eleven_minutes() {
        let d = Duration::from_secs(60);
        let t = |v| ttl(d, "shell.exec", &args(v));
        assert_eq!(t(json!({"timeout": 120_000})), Duration::from_secs(130));
        assert_eq!(t(json!({})), SHELL_TTL_CAP);
        assert_eq!(t(json!({"timeout": -5})), SHELL_TTL_CAP);
        assert_eq!(t(json!({"timeout": 10_000_000})), SHELL_TTL_CAP);
        assert_eq!(ttl(d, "fs.read", &args(json!({"timeout": 1}))), d);
    }

    fn ident(uid: i64, gids: &[i64]) -> ProcessIdentity {
        ProcessIdentity {
            uid,
            gid: uid,
            gids: gids.to_vec(),
            username: format!("u{uid}"),
            home: "/".into(),
            cwd: "/".into(),
        }
    }

    #[tokio::test]
    async fn a_device_is_visible_to_root_its_owner_and_its_acl_groups_only() {
        let db = crate::db::Db::open_in_memory().unwrap();
        db.call(|c| {
            c.execute_batch(
                "INSERT INTO devices(device_id, owner_uid, online, first_seen_at, last_seen_at)
                    VALUES ('d', 1000, 1, 0, 0);
                 INSERT INTO device_access VALUES ('d', 500);
                 INSERT INTO routing_table(id, call, origin_type, origin_id, device_id, created_at)
                    VALUES ('stale', 'fs.read', 'connection', 'c', 'd', 0);",
            )?;
            for (who, ok) in [
                (ident(0, &[0]), true),
                (ident(1000, &[1000, 100]), true),
                (ident(1001, &[1001, 500]), true),
                (ident(1002, &[1002, 100]), false),
            ] {
                assert_eq!(visible_device(c, "d", &who).is_ok(), ok, "{who:?}");
            }
            assert!(matches!(
                visible_device(c, "missing", &ident(0, &[0])),
                Err(KernelError::AccessDenied { .. })
            ));
            reset_at_start(c)?;
            assert!(!get_device(c, "d")?.unwrap().online);
            let routes: i64 =
                c.query_row("SELECT count(*) FROM routing_table", [], |r| r.get(0))?;
            assert_eq!(routes, 0);
            Ok(())
        })
        .await
        .unwrap();
    }

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
        assert_eq!(d["ok"], false, "{d}");
    }
}
