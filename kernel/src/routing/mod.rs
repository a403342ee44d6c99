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
//!
//! Everything here takes the [`Router`] (database, TTL, live drivers and
//! waiting routes), never the kernel, so routing sits below `Kernel`; the
//! live state is [`router`], the rows are the device domain's
//! ([`Devices`]: devices, routes, device shell sessions).

pub mod router;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::sync::{mpsc, oneshot};

use crate::caps;
use crate::dispatch::{Entry, is_routable};
use crate::domains::accounts::{self, ProcessIdentity};
use crate::error::KernelError;
use crate::session::{Outgoing, Session};
use gsv_protocol::frames::Outbound;

pub use crate::domains::device::routes::Origin;
use crate::domains::device::routes::RouteRow;
pub use crate::domains::device::shell_sessions::DeviceSession;
use crate::domains::device::shell_sessions::SessionReport;
pub use crate::domains::device::{Device, Registration};
use router::{Driver, Pending};
pub use router::{Peer, Router};

/// TTL of a routed `shell.exec` without a timeout: above the node's
/// 10-minute process watchdog.
pub const SHELL_TTL_CAP: Duration = Duration::from_secs(11 * 60);
/// Longest TTL of a routed `net.fetch` (the reference's `MAX_NET_FETCH_TIMEOUT_MS`).
pub const NET_FETCH_TTL_CAP: Duration = Duration::from_secs(10 * 60);
/// Added to a routed `shell.exec`'s own timeout for its TTL.
const SHELL_TTL_SLACK: Duration = Duration::from_secs(10);

/// Runs an authorised call, native or routed; `entry` is `None` for a
/// routable call with no native handler (it can only be routed).
///
/// `args.target` of a routable call (`fs.*`, `shell.*`, `net.*`) is
/// handled here and only here: absent, empty or `"gsv"` means native; any
/// other value is a device route, as is a `shell.exec` continuing a device's
/// shell session. A routed call needs no native handler: only the
/// caller's capability is checked before routing.
pub async fn run_call<K: Send + Sync + 'static>(
    router: &Arc<Router>,
    entry: Option<Entry<K>>,
    state: Arc<K>,
    session: Arc<Session>,
    call: &str,
    mut args: Map<String, Value>,
) -> Result<Value, KernelError> {
    // Only a routable call's `target` names a device (seed 000); other
    // domains own the name (`sched.add` has a schedule `target`).
    let target = if is_routable(call) {
        args.remove("target")
    } else {
        None
    };
    if let Some(s) = device_session(router, call, &args).await? {
        let target = target.and_then(|t| t.as_str().map(str::to_owned));
        return continue_session(router, &session, s, target, args).await;
    }
    match target {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t.is_empty() || t == "gsv" => {}
        Some(Value::String(t)) => {
            return route_to_target(router, &session, call, t, args).await;
        }
        Some(_) => {
            return Err(KernelError::InvalidArgs {
                call: call.to_owned(),
                reason: "target must be a string".into(),
            });
        }
    }
    let Some(entry) = entry else {
        return Err(KernelError::UnknownSyscall(call.to_owned()));
    };
    entry.call(state, session, Value::Object(args)).await
}

/// Registers a driver connection that has just completed `sys.connect`:
/// the device row (owner metadata kept, `implements`/`platform`/
/// `version` replaced), the owner's primary group in its ACL, and this
/// connection as the device's one live driver. An older driver
/// connection is superseded: its routes fail with 503 now rather than
/// at their TTL.
pub async fn register_driver(
    r: &Arc<Router>,
    connection_id: &str,
    tx: mpsc::Sender<Outgoing>,
    who: &ProcessIdentity,
    reg: Registration,
) -> Result<(), KernelError> {
    let device_id = reg.device_id.clone();
    r.devices.register(reg, who).await?;
    r.install_driver(
        &device_id,
        Driver {
            connection_id: connection_id.to_owned(),
            tx,
        },
    );
    tracing::info!(device = %device_id, conn = %connection_id, "driver registered");
    Ok(())
}

/// A driver connection closed: its routes fail with 503, and the device
/// goes offline unless a newer connection already took over. Running
/// shell sessions are left alone: the device reports their end itself
/// (`exec.status`), and a reconnect is not an exit.
pub async fn driver_disconnected(r: &Arc<Router>, connection_id: &str, device_id: &str) {
    let was_current = r.remove_driver(connection_id, device_id);
    let r = r
        .devices
        .driver_gone(connection_id, device_id, was_current)
        .await;
    if let Err(e) = r {
        tracing::warn!(device = %device_id, error = %e, "recording a driver disconnect");
    }
    tracing::info!(device = %device_id, conn = %connection_id, "driver disconnected");
}

/// Makes a service connection that has just completed `sys.connect` the
/// live connection of the adapter its `client.channel` names; an older
/// one's forwarded calls fail with 503 now.
pub fn register_adapter(
    r: &Arc<Router>,
    connection_id: &str,
    tx: mpsc::Sender<Outgoing>,
    adapter: &str,
) {
    r.install_adapter(
        adapter,
        Driver {
            connection_id: connection_id.to_owned(),
            tx,
        },
    );
    tracing::info!(%adapter, conn = %connection_id, "adapter connected");
}

/// A service connection closed: the calls forwarded to it fail with 503.
pub fn adapter_disconnected(r: &Arc<Router>, connection_id: &str, adapter: &str) {
    r.remove_adapter(connection_id, adapter);
    tracing::info!(%adapter, conn = %connection_id, "adapter disconnected");
}

/// A signal from a driver connection: `exec.status` updates the device's
/// shell session; `device.ping` is answered with `device.pong`.
pub async fn on_driver_signal(
    r: &Arc<Router>,
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
            let current = r
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
            let report = SessionReport {
                status,
                exit_code: payload["exitCode"].as_i64(),
                error: payload["signal"].as_str().map(str::to_owned),
            };
            let r = r
                .devices
                .update_shell_session(sid, &device_id, report)
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
    r: &Arc<Router>,
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
    r.devices.shell_session(sid).await
}

/// Continues a device shell session: owner only (others 403, unlike the
/// reference), the same device if a target is named (400), a failed
/// session answered from its row, else routed to its device.
pub async fn continue_session(
    r: &Arc<Router>,
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
    let device = r.devices.visible(&s.device_id, &who).await?;
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
    route(r, session, "shell.exec", device, args).await
}

/// Routes `call` to the device `target` (already removed from `args`).
pub async fn route_to_target(
    r: &Arc<Router>,
    session: &Session,
    call: &str,
    target: String,
    args: Map<String, Value>,
) -> Result<Value, KernelError> {
    if call == "fs.transfer.receive" {
        // The file arrives as the request's binary body, and this kernel
        // refuses request bodies (frames.rs); without one the device
        // would write an empty file.
        return Err(KernelError::BadRequest(format!(
            "fs.transfer.receive is not relayed to device {target}: it needs a request body, \
             which this kernel does not accept yet (write the file with fs.write)"
        )));
    }
    let device = r.devices.visible(&target, &session.identity).await?;
    route(r, session, call, device, args).await
}

/// The TTL of a routed call (reference §3.5); `default` for every call but
/// `shell.exec` and `net.fetch` (its `timeoutMs`, at most 10 minutes, as
/// the reference gateway gives the device).
pub fn ttl(default: Duration, call: &str, args: &Map<String, Value>) -> Duration {
    if call == "net.fetch" {
        return match args.get("timeoutMs").and_then(Value::as_f64) {
            Some(t) if t.is_finite() && t > 0.0 => {
                Duration::from_millis(t as u64).clamp(Duration::from_secs(1), NET_FETCH_TTL_CAP)
            }
            _ => default,
        };
    }
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
    r: Arc<Router>,
    id: String,
    reason: &'static str,
    done: bool,
}

impl Drop for RouteGuard {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let p = self.r.forget(&self.id);
        if let Some(p) = p
            && let Some(d) = self.r.live(&p.peer)
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
        let (devices, id) = (self.r.devices.clone(), self.id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = devices.end_route(&id).await;
            });
        }
    }
}

async fn route(
    r: &Arc<Router>,
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
    let Some(driver) = r.driver(&dev) else {
        return Err(KernelError::Unavailable(format!(
            "No active connection for device: {dev}"
        )));
    };
    let ttl = ttl(r.routed_call_ttl, call, &args);
    let origin = Origin::Connection(&session.connection_id);
    let data = forward(
        r,
        origin,
        call,
        Peer::Device(dev.clone()),
        driver,
        ttl,
        args,
    )
    .await?;
    if call == "shell.exec" {
        remember_session(r, &session.identity, &dev, &data).await?;
    }
    Ok(data)
}

/// Forwards `call` to the live service connection of `adapter` as a
/// request frame and waits for its answer, as a device route does: 503
/// when no adapter is connected or it goes away, 504 at
/// [`Router::adapter_ttl`], `request.cancel` to the adapter when the
/// caller gives up.
pub async fn route_to_adapter(
    r: &Arc<Router>,
    origin: Origin<'_>,
    call: &str,
    adapter: &str,
    args: Map<String, Value>,
) -> Result<Value, KernelError> {
    let Some(service) = r.adapter(adapter) else {
        return Err(KernelError::Unavailable(format!(
            "No adapter connected: {adapter} (an adapter connects as role service with \
             client.channel \"{adapter}\")"
        )));
    };
    let ttl = r.adapter_ttl;
    forward(
        r,
        origin,
        call,
        Peer::Adapter(adapter.to_owned()),
        service,
        ttl,
        args,
    )
    .await
}

/// Sends `call` to `peer`'s live connection under the kernel's own
/// request id and waits for the answer until `ttl`: the one route every
/// device call and adapter call takes.
async fn forward(
    r: &Arc<Router>,
    origin: Origin<'_>,
    call: &str,
    peer: Peer,
    driver: Driver,
    ttl: Duration,
    args: Map<String, Value>,
) -> Result<Value, KernelError> {
    let id = format!("rt_{}", accounts::random_hex(12));
    // Armed before the row exists: a caller dropped at any await below
    // leaves neither a row nor a waiting entry behind.
    let mut guard = RouteGuard {
        r: r.clone(),
        id: id.clone(),
        reason: "Request cancelled",
        done: false,
    };
    let deadline = tokio::time::Instant::now() + ttl;
    r.devices
        .record_route(RouteRow {
            id: &id,
            call,
            origin,
            peer: &peer.row_id(),
            driver_connection_id: &driver.connection_id,
            ttl,
        })
        .await?;
    let (answer_tx, answer_rx) = oneshot::channel();
    r.expect(
        id.clone(),
        Pending {
            peer: peer.clone(),
            driver_connection_id: driver.connection_id.clone(),
            call: call.to_owned(),
            read_offset: args.get("offset").and_then(Value::as_u64).unwrap_or(0),
            answer: answer_tx,
        },
    );
    let frame = json!({"type": "req", "id": id, "call": call, "args": args});
    // The peer's queue is bounded; a peer that stops reading costs this
    // caller its TTL, never more.
    match tokio::time::timeout_at(deadline, driver.tx.send(Outgoing::Text(frame.to_string()))).await
    {
        Ok(Ok(())) => {}
        Ok(Err(_)) => return Err(peer.disconnected()),
        Err(_) => {
            guard.reason = "Request timed out";
            return Err(peer.timed_out(call));
        }
    }
    tracing::debug!(route = %id, %call, peer = %peer.row_id(), ?ttl, "routed");
    let answer = match tokio::time::timeout_at(deadline, answer_rx).await {
        Err(_) => {
            guard.reason = "Request timed out";
            return Err(peer.timed_out(call));
        }
        // The sender is dropped only with the pending entry, which every
        // ending answers first; treat it as the peer going away.
        Ok(Err(_)) => Err(peer.disconnected()),
        Ok(Ok(a)) => a,
    };
    guard.done = true;
    let _ = r.devices.end_route(&id).await;
    answer
}

/// Records `sessionId → device` with its owner when a routed `shell.exec`
/// answers with a session (reference §3.6 step 5).
async fn remember_session(
    r: &Arc<Router>,
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
    let report = SessionReport {
        status,
        exit_code: data["exitCode"].as_i64(),
        error: data["error"].as_str().map(str::to_owned),
    };
    r.devices
        .remember_shell_session(sid, device_id, who.uid, report)
        .await
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

    #[test]
    fn a_routed_net_fetch_lives_its_timeout_ms_capped_at_ten_minutes() {
        let d = Duration::from_secs(60);
        let t = |v| ttl(d, "net.fetch", &args(v));
        assert_eq!(t(json!({"timeoutMs": 5_000})), Duration::from_secs(5));
        assert_eq!(t(json!({})), d);
        assert_eq!(t(json!({"timeoutMs": 0})), d);
        assert_eq!(t(json!({"timeoutMs": 50_000_000})), NET_FETCH_TTL_CAP);
    }
}
