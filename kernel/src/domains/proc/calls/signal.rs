//! Process signals (`proc.run.*`): each one is first projected onto the
//! registry row (state, active run, queued count), then sent to the
//! owner's user sockets, so a client that reads the row after a signal
//! never sees an older state; then a finished run answers the IPC calls
//! it took and the signal fires the watches on it. Those listeners (and
//! a chat surface's) start runs themselves, so they are reached through
//! the kernel's [`SignalListeners`](crate::domains::proc::SignalListeners).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::db::now_ms;
use crate::domains::proc::{RunRoute, store};
use crate::kernel::Kernel;
use crate::session::Role;

/// Projects a process signal onto the registry row, then delivers it
/// ([`deliver`]) with the queue length.
pub async fn emit(k: &Arc<Kernel>, owner_uid: i64, pid: &str, signal: &str, mut payload: Value) {
    let (pid_s, sig) = (pid.to_owned(), signal.to_owned());
    let run_id = payload
        .get("runId")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let queued =
        k.db.call(move |c| {
            let q = store::queued_count(c, &pid_s)?;
            let state = match sig.as_str() {
                "proc.run.tool.started" => Some("waiting_tool"),
                "proc.run.hil.requested" => Some("waiting_hil"),
                "proc.run.finished" => Some(if q > 0 { "queued" } else { "idle" }),
                "proc.run.started" | "proc.run.retrying" | "proc.run.tool.finished" => {
                    Some("running")
                }
                _ => None,
            };
            if let Some(state) = state {
                let active = if sig == "proc.run.finished" {
                    None
                } else {
                    run_id.as_deref()
                };
                store::project(c, &pid_s, state, active, q)?;
            }
            Ok(q)
        })
        .await
        .unwrap_or(0);
    k.procs.set_queued(pid, queued);
    payload["pid"] = json!(pid);
    payload["timestamp"] = json!(now_ms());
    payload["queuedCount"] = json!(queued);
    deliver(k, owner_uid, signal, payload.clone());
    let listeners = &k.signal_listeners;
    if signal == "proc.run.finished" {
        (listeners.run_finished)(k.clone(), pid.to_owned(), payload.clone()).await;
    }
    (listeners.watches)(
        k.clone(),
        owner_uid,
        pid.to_owned(),
        signal.to_owned(),
        payload,
    )
    .await;
}

/// Sends a signal of a run along its run route (reference §6.3): to the
/// socket whose `proc.send` started it, or for a run a chat message
/// started, its answer and approval requests to that chat surface
/// (the `surface` listener). A run without a route, one whose
/// socket is gone, and every approval request (any of the owner's
/// clients may answer) go to every user socket of `owner_uid`. The route
/// ends with `proc.run.finished`.
pub fn deliver(k: &Kernel, owner_uid: i64, signal: &str, payload: Value) {
    let run_id = payload["runId"].as_str().map(str::to_owned);
    let route = run_id.as_deref().and_then(|r| k.procs.route_of(r));
    if signal == "proc.run.finished"
        && let Some(r) = &run_id
    {
        k.procs.end_route(r);
    }
    let hil = signal == "proc.run.hil.requested";
    let payload = match route {
        Some(RunRoute::Surface(surface)) => {
            (k.signal_listeners.surface)(k, &surface, signal, &payload);
            if !hil {
                return;
            }
            payload
        }
        Some(RunRoute::Connection(conn)) if !hil => {
            match k.pool.signal_connection(&conn, signal, payload) {
                Ok(()) => return,
                Err(payload) => payload,
            }
        }
        _ => payload,
    };
    k.pool.signal_user(owner_uid, Role::User, signal, payload);
}
