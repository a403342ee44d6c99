//! The timer task: one tokio task sleeps until the earliest `due_at` of
//! the [`table`], takes what is due and hands each timer to the domain
//! that armed it. While nothing is due it costs nothing: it waits on the
//! earliest deadline, a poke (the table changed) or the kernel's stop.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::table;
use super::{Timer, TimerWake};
use crate::db::now_ms;
use crate::domains::{notification, oauth, proc, sched};
use crate::kernel::Kernel;

/// Longest single sleep: a wall-clock step (NTP, suspend) is noticed
/// within this much instead of sleeping on a stale monotonic deadline.
const MAX_SLEEP: Duration = Duration::from_secs(600);
/// Timers taken per table read; more due ones are taken on the next pass.
const BATCH: usize = 256;
/// Pause after a failed table read, so a broken database is not spun on.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(1);

/// Starts the timer task of `kernel`; it ends with [`TimerWake::stop`] or
/// when the kernel is dropped.
pub fn start(kernel: &Arc<Kernel>) {
    tokio::spawn(run(Arc::downgrade(kernel), kernel.timers.clone()));
}

async fn run(kernel: Weak<Kernel>, wake: Arc<TimerWake>) {
    loop {
        let sleep = match kernel.upgrade() {
            None => return,
            Some(k) => match fire_due(&k).await {
                Ok(next) => next,
                Err(e) => {
                    tracing::error!(error = %e, "timer table");
                    Some(RETRY_AFTER_ERROR)
                }
            },
        };
        let sleep = sleep.map_or(MAX_SLEEP, |d| d.min(MAX_SLEEP));
        tokio::select! {
            () = wake.stopped().cancelled() => return,
            () = wake.changed() => {}
            () = tokio::time::sleep(sleep) => {}
        }
    }
}

/// Fires every due timer; how long until the next one (`None`: none armed).
async fn fire_due(k: &Arc<Kernel>) -> Result<Option<Duration>, crate::KernelError> {
    loop {
        let now = now_ms();
        let due = k.db.call(move |c| table::take_due(c, now, BATCH)).await?;
        let full = due.len() == BATCH;
        for timer in due {
            tokio::spawn(fire(k.clone(), timer));
        }
        if full {
            continue;
        }
        let next = k.db.call(|c| table::next_due(c)).await?;
        return Ok(next.map(|at| Duration::from_millis((at - now_ms()).max(0) as u64)));
    }
}

/// Hands `timer` to the domain that armed it.
async fn fire(k: Arc<Kernel>, timer: Timer) {
    tracing::debug!(id = %timer.id, kind = %timer.kind, due_at = timer.due_at, "timer fired");
    match timer.kind.as_str() {
        sched::TIMER_KIND => sched::calls::on_timer(k, timer).await,
        notification::TIMER_KIND => notification::calls::on_timer(k, timer).await,
        oauth::TIMER_KIND => oauth::calls::on_timer(k, timer).await,
        proc::calls::ipc::TIMER_KIND => proc::calls::ipc::on_timer(k, timer).await,
        proc::calls::signal_watch::TIMER_KIND => {
            proc::calls::signal_watch::on_timer(k, timer).await
        }
        other => tracing::warn!(id = %timer.id, kind = %other, "timer of an unknown kind dropped"),
    }
}
