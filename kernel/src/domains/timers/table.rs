//! The one durable timer table (`timers(id, due_at, kind, payload)`) and
//! the wake the kernel holds for it. Everything that must happen later
//! (a schedule's next run, a notification's expiry) is a row here first,
//! so a timer that falls due while the kernel is down fires after the
//! next start. Ids are chosen by the owning domain (`sched:<id>`,
//! `notification:<id>`), so arming again replaces and cancelling is one
//! delete.

use rusqlite::{Connection, params};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::KernelError;

/// Migration 20 of the kernel database (see `MIGRATIONS`).
pub const MIGRATION: &str = "CREATE TABLE timers(
        id TEXT PRIMARY KEY,
        due_at INTEGER NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL DEFAULT '{}');
     CREATE INDEX timers_due ON timers(due_at);";

/// One armed timer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timer {
    pub id: String,
    /// Milliseconds since the Unix epoch.
    pub due_at: i64,
    /// Which domain fires it (`sched`, `notification`).
    pub kind: String,
    /// The domain's own JSON text.
    pub payload: String,
}

/// The timer task's wake-up and stop: arming a timer may move the
/// earliest due time, so every change pokes [`TimerWake::poke`]; the task
/// re-reads the table and sleeps again.
#[derive(Debug, Default)]
pub struct TimerWake {
    changed: Notify,
    stop: CancellationToken,
}

impl TimerWake {
    /// The table changed: the sleeping task re-reads the earliest due time.
    pub fn poke(&self) {
        self.changed.notify_one();
    }

    /// Resolves at the next [`TimerWake::poke`] (or one made before).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Ends the timer task (the kernel is going away).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    pub fn stopped(&self) -> &CancellationToken {
        &self.stop
    }
}

/// Arms (or re-arms) timer `id` at `due_at`.
pub fn arm(
    c: &Connection,
    id: &str,
    due_at: i64,
    kind: &str,
    payload: &str,
) -> Result<(), KernelError> {
    c.execute(
        "INSERT INTO timers(id, due_at, kind, payload) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT(id) DO UPDATE SET due_at = excluded.due_at, kind = excluded.kind,
                                      payload = excluded.payload",
        params![id, due_at, kind, payload],
    )?;
    Ok(())
}

/// Arms timer `id` at `due_at` unless it is armed already; whether it was
/// armed now.
pub fn arm_if_missing(
    c: &Connection,
    id: &str,
    due_at: i64,
    kind: &str,
    payload: &str,
) -> Result<bool, KernelError> {
    Ok(c.execute(
        "INSERT OR IGNORE INTO timers(id, due_at, kind, payload) VALUES (?1, ?2, ?3, ?4)",
        params![id, due_at, kind, payload],
    )? > 0)
}

/// Cancels timer `id`; whether it was armed.
pub fn cancel(c: &Connection, id: &str) -> Result<bool, KernelError> {
    Ok(c.execute("DELETE FROM timers WHERE id = ?1", [id])? > 0)
}

/// The earliest due time, if any timer is armed.
pub fn next_due(c: &Connection) -> Result<Option<i64>, KernelError> {
    Ok(c.query_row("SELECT min(due_at) FROM timers", [], |r| r.get(0))?)
}

/// Removes and returns up to `max` timers due at `now`, earliest first.
/// Taking them out is the claim: the domain's handler makes its own state
/// durable (and re-arms) before anything else can see the timer again.
pub fn take_due(c: &mut Connection, now: i64, max: usize) -> Result<Vec<Timer>, KernelError> {
    let tx = c.transaction()?;
    let due: Vec<Timer> = {
        let mut stmt = tx.prepare(
            "SELECT id, due_at, kind, payload FROM timers WHERE due_at <= ?1
             ORDER BY due_at, id LIMIT ?2",
        )?;
        stmt.query_map(params![now, max as i64], |r| {
            Ok(Timer {
                id: r.get(0)?,
                due_at: r.get(1)?,
                kind: r.get(2)?,
                payload: r.get(3)?,
            })
        })?
        .collect::<Result<_, _>>()?
    };
    for t in &due {
        tx.execute(
            "DELETE FROM timers WHERE id = ?1 AND due_at = ?2",
            params![t.id, t.due_at],
        )?;
    }
    tx.commit()?;
    Ok(due)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::Db;

    #[tokio::test]
    async fn rearming_replaces_and_take_due_claims_only_what_is_due() {
        let db = Db::open_in_memory(super::super::MIGRATIONS).unwrap();
        db.call(|c| {
            arm(c, "a", 100, "sched", "{}")?;
            arm(c, "b", 300, "notification", "{}")?;
            arm(c, "a", 200, "sched", "{\"x\":1}")?;
            assert_eq!(next_due(c)?, Some(200));
            assert!(take_due(c, 199, 10)?.is_empty());
            let due = take_due(c, 250, 10)?;
            assert_eq!(due.len(), 1);
            assert_eq!(
                (due[0].id.as_str(), due[0].payload.as_str()),
                ("a", "{\"x\":1}")
            );
            assert_eq!(next_due(c)?, Some(300));
            assert!(cancel(c, "b")?);
            assert!(!cancel(c, "b")?);
            assert_eq!(next_due(c)?, None);
            Ok(())
        })
        .await
        .unwrap();
    }
}
