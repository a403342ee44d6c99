//! Agent processes (issue 14): the registry rows ([`store`]), the loop as
//! one tokio task per active run ([`run`]), human approval ([`hil`]) and
//! the OpenAI-compatible model provider ([`provider`]).
//!
//! In memory there is only what a restart may lose: which run is active
//! and how to abort it or answer its approval. Everything else is a row;
//! on start [`recover`] ends runs a dead kernel left `running` and starts
//! processes that still have queued messages.

pub mod hil;
pub mod provider;
pub mod run;
pub mod store;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::db::now_ms;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Role;

/// The active run of one process.
#[derive(Debug)]
pub struct Active {
    pub run_id: String,
    pub cancel: CancellationToken,
    /// Waiting approvals of this run by request id.
    pub hil: HashMap<String, oneshot::Sender<bool>>,
}

/// Active runs by pid. A run is started and ended only under this lock,
/// so `proc.send` either sees the run (and queues) or starts one.
#[derive(Debug, Default)]
pub struct Procs {
    active: Mutex<HashMap<String, Active>>,
    http: reqwest::Client,
}

impl Procs {
    pub fn active_run(&self, pid: &str) -> Option<String> {
        self.active
            .lock()
            .unwrap()
            .get(pid)
            .map(|a| a.run_id.clone())
    }

    /// Cancels the active run of `pid`; its task ends it.
    pub fn abort(&self, pid: &str) -> Option<String> {
        let live = self.active.lock().unwrap();
        live.get(pid).map(|a| {
            a.cancel.cancel();
            a.run_id.clone()
        })
    }

    /// Hands a decision to the waiting run; false when nothing waits.
    pub fn answer_hil(&self, pid: &str, request_id: &str, approve: bool) -> bool {
        let mut live = self.active.lock().unwrap();
        match live.get_mut(pid).and_then(|a| a.hil.remove(request_id)) {
            Some(tx) => tx.send(approve).is_ok(),
            None => false,
        }
    }
}

/// Sends a process signal to every user socket of `owner_uid` after
/// projecting it onto the registry row.
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
    payload["pid"] = json!(pid);
    payload["timestamp"] = json!(now_ms());
    payload["queuedCount"] = json!(queued);
    k.pool.signal_user(owner_uid, Role::User, signal, payload);
}

/// Ends runs a stopped kernel left `running` and restarts queued work.
pub async fn recover(k: &Arc<Kernel>) -> Result<(), KernelError> {
    let stale = k.db.call(|c| store::interrupted_runs(c)).await?;
    for (pid, run_id) in stale {
        let msg = "the kernel stopped during this run".to_owned();
        let (p, r, m) = (pid.clone(), run_id.clone(), msg.clone());
        let owner =
            k.db.call(move |c| {
                store::finish_run(c, &r, "error", Some(&m))?;
                store::append_message(
                    c,
                    &p,
                    Some(&r),
                    &json!({"role": "system", "content": format!("Run failed: {m}")}),
                )?;
                store::expire_hil(c, &p)?;
                Ok(store::get(c, &p)?.map(|row| row.owner_uid))
            })
            .await?;
        tracing::warn!(%pid, run = %run_id, "run interrupted by a kernel stop");
        if let Some(owner) = owner {
            emit(
                k,
                owner,
                &pid,
                "proc.run.finished",
                json!({"runId": run_id, "status": "error", "text": "", "usage": {}, "error": msg}),
            )
            .await;
        }
    }
    for pid in k.db.call(|c| store::pids_with_queue(c)).await? {
        run::promote_queued(k.clone(), pid).await;
    }
    Ok(())
}
