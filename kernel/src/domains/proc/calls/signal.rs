//! Process signals (`proc.run.*`): each one is first projected onto the
//! registry row (state, active run, queued count), then sent to the
//! owner's user sockets, so a client that reads the row after a signal
//! never sees an older state; then a finished run answers the IPC calls
//! it took ([`super::ipc`]) and the signal fires the watches on it
//! ([`super::signal_watch`]).

use std::sync::Arc;

use serde_json::{Value, json};

use crate::db::now_ms;
use crate::domains::proc::store;
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
    if signal == "proc.run.finished" {
        super::ipc::on_run_finished(k.clone(), pid.to_owned(), payload.clone()).await;
    }
    super::signal_watch::fire(
        k.clone(),
        owner_uid,
        pid.to_owned(),
        signal.to_owned(),
        payload,
    )
    .await;
}

/// Sends a signal of a run to the socket whose `proc.send` started it
/// (reference §6.3: its run route), or to every user socket of
/// `owner_uid` when the run has no route, that socket is gone, or the
/// signal asks for approval (any of the owner's clients may answer). The
/// route ends with `proc.run.finished`.
pub fn deliver(k: &Kernel, owner_uid: i64, signal: &str, payload: Value) {
    let run_id = payload["runId"].as_str().map(str::to_owned);
    let route = run_id
        .as_deref()
        .filter(|_| signal != "proc.run.hil.requested")
        .and_then(|r| k.procs.route_of(r));
    if signal == "proc.run.finished"
        && let Some(r) = &run_id
    {
        k.procs.end_route(r);
    }
    let payload = match route {
        Some(conn) => match k.pool.signal_connection(&conn, signal, payload) {
            Ok(()) => return,
            Err(payload) => payload,
        },
        None => payload,
    };
    k.pool.signal_user(owner_uid, Role::User, signal, payload);
}
