//! `signal.watch|unwatch`: a process asks to be run when another process
//! of its owner emits a signal. [`fire`] runs from every process signal
//! ([`super::signal::emit`]): each matching watch appends a message to
//! its watcher's `default` conversation (a run starts, or it queues);
//! a `once` watch is removed before it fires (so it fires once), a
//! lasting watch whose delivery failed is marked `failed` and fires no
//! more. Expiry is a timer (`signal-watch:<id>`).

use std::sync::Arc;

use futures::future::BoxFuture;
use gsv_protocol::proc::{
    SignalUnwatchArgs, SignalUnwatchResult, SignalWatchArgs, SignalWatchResult,
};
use serde_json::{Value, json};

use super::ipc::{caller, same_owner};
use super::run;
use crate::db::now_ms;
use crate::domains::proc::conversations::DEFAULT;
use crate::domains::proc::signal_watches::{self, SignalWatch};
use crate::domains::proc::store;
use crate::domains::timers::{Timer, table as timers};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// The timer kind of a watch's expiry (`signal-watch:<id>`).
pub const TIMER_KIND: &str = "signal-watch";
/// `ttlMs` when absent, and its bounds (seed 000).
pub const DEFAULT_TTL_MS: i64 = 24 * 60 * 60 * 1000;
pub const MIN_TTL_MS: i64 = 1000;
pub const MAX_TTL_MS: i64 = 30 * 24 * 60 * 60 * 1000;

fn timer_id(watch_id: &str) -> String {
    format!("{TIMER_KIND}:{watch_id}")
}

pub async fn watch(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SignalWatchArgs,
) -> Result<SignalWatchResult, KernelError> {
    let watcher = caller(&k, &s, "signal.watch").await?;
    let invalid = |reason: String| KernelError::InvalidArgs {
        call: "signal.watch".into(),
        reason,
    };
    let signal = a.signal.trim().to_owned();
    if signal.is_empty() {
        return Err(invalid("signal: must not be empty".into()));
    }
    let Some(pid) = a
        .process_id
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
    else {
        return Err(invalid(
            "processId: a process must name the process it watches".into(),
        ));
    };
    if pid == watcher.pid {
        return Err(invalid(format!(
            "processId: {pid} is the calling process (a process cannot watch itself)"
        )));
    }
    let watched = same_owner(&k, &watcher, &pid).await?;
    let created_at = now_ms();
    let ttl = a
        .ttl_ms
        .unwrap_or(DEFAULT_TTL_MS)
        .clamp(MIN_TTL_MS, MAX_TTL_MS);
    let w = SignalWatch {
        watch_id: format!("watch_{}", uuid::Uuid::new_v4().simple()),
        uid: watcher.owner_uid,
        watcher_pid: watcher.pid.clone(),
        signal,
        process_id: watched.pid,
        key: a.key.map(|k| k.trim().to_owned()).filter(|k| !k.is_empty()),
        state: a.state.unwrap_or(Value::Null),
        once: a.once.unwrap_or(true),
        status: "active".into(),
        error: None,
        created_at,
        expires_at: Some(created_at + ttl),
    };
    let (stored, created) =
        k.db.call(move |c| {
            let (stored, created) = signal_watches::upsert(c, &w)?;
            if let Some(at) = stored.expires_at {
                timers::arm(
                    c,
                    &timer_id(&stored.watch_id),
                    at,
                    TIMER_KIND,
                    &stored.watch_id,
                )?;
            }
            Ok((stored, created))
        })
        .await?;
    k.timers.poke();
    Ok(SignalWatchResult {
        watch_id: stored.watch_id,
        created,
        created_at: stored.created_at,
        expires_at: stored.expires_at,
    })
}

pub async fn unwatch(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SignalUnwatchArgs,
) -> Result<SignalUnwatchResult, KernelError> {
    let watcher = caller(&k, &s, "signal.unwatch").await?;
    if a.watch_id.is_some() == a.key.is_some() {
        return Err(KernelError::InvalidArgs {
            call: "signal.unwatch".into(),
            reason: "exactly one of watchId and key is needed".into(),
        });
    }
    let removed =
        k.db.call(move |c| {
            let tx = c.transaction()?;
            let ids = signal_watches::remove(
                &tx,
                &watcher.pid,
                a.watch_id.as_deref(),
                a.key.as_deref().map(str::trim),
            )?;
            for id in &ids {
                timers::cancel(&tx, &timer_id(id))?;
            }
            tx.commit()?;
            Ok(ids.len() as u64)
        })
        .await?;
    Ok(SignalUnwatchResult { removed })
}

/// Process `pid` of `owner` emitted `signal` with `payload`: every
/// matching watch runs its watcher.
pub fn fire(
    k: Arc<Kernel>,
    owner: i64,
    pid: String,
    signal: String,
    payload: Value,
) -> BoxFuture<'static, ()> {
    Box::pin(async move {
        let (p, sig) = (pid.clone(), signal.clone());
        let watches = match k
            .db
            .call(move |c| signal_watches::matching(c, owner, &p, &sig))
            .await
        {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(%pid, %signal, error = %e, "matching signal watches");
                return;
            }
        };
        for w in watches {
            fire_one(&k, &w, &payload).await;
        }
    })
}

async fn fire_one(k: &Arc<Kernel>, w: &SignalWatch, payload: &Value) {
    // A `once` watch is claimed by its removal, so two signals in a row
    // fire it once.
    if w.once {
        let id = w.watch_id.clone();
        let claimed =
            k.db.call(move |c| {
                let gone = signal_watches::delete(c, &id)?;
                timers::cancel(c, &timer_id(&id))?;
                Ok(gone)
            })
            .await;
        if !matches!(claimed, Ok(true)) {
            return;
        }
    }
    let mut watch = json!({"id": w.watch_id});
    if let Some(key) = &w.key {
        watch["key"] = json!(key);
    }
    if !w.state.is_null() {
        watch["state"] = w.state.clone();
    }
    let event = json!({"watched": true, "signal": w.signal, "sourcePid": w.process_id,
                       "watch": watch, "payload": payload});
    let text = format!(
        "[signal.watch] {} from {}{}\n{}",
        w.signal,
        w.process_id,
        w.key
            .as_ref()
            .map(|k| format!(" (watch {k})"))
            .unwrap_or_default(),
        payload
    );
    let message = json!({"role": "user", "content": text, "signalWatch": event});
    let p = w.watcher_pid.clone();
    let delivered = match k.db.call(move |c| store::get(c, &p)).await {
        Ok(Some(watcher)) => run::send(k.clone(), watcher, DEFAULT, message, None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Ok(None) => Err(format!("the watching process {} is gone", w.watcher_pid)),
        Err(e) => Err(e.to_string()),
    };
    if let Err(error) = delivered {
        tracing::warn!(watch = %w.watch_id, %error, "signal watch delivery failed");
        if !w.once {
            let id = w.watch_id.clone();
            if let Err(e) =
                k.db.call(move |c| signal_watches::mark_failed(c, &id, &error))
                    .await
            {
                tracing::error!(watch = %w.watch_id, error = %e, "marking a signal watch failed");
            }
        }
    }
}

/// A watch's expiry.
pub async fn on_timer(k: Arc<Kernel>, timer: Timer) {
    let id = timer.payload;
    let i = id.clone();
    if let Err(e) =
        k.db.call(move |c| signal_watches::delete_expired(c, &i))
            .await
    {
        tracing::error!(watch = %id, error = %e, "expiring a signal watch");
    }
}
