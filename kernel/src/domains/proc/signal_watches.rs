//! The rows of `signal.watch` (migration 110): a process watching a
//! signal of another process of the same owner. A `key` names a watch
//! within its watcher, so watching again with it replaces the watch.
//! Expiry is a timer (`signal-watch:<id>`); matching skips an expired row
//! the timer has not removed yet.

use rusqlite::{Connection, params};
use serde_json::Value;

use crate::db::{now_ms, opt};
use crate::error::KernelError;

/// One watch.
#[derive(Debug, Clone, PartialEq)]
pub struct SignalWatch {
    pub watch_id: String,
    pub uid: i64,
    /// The process a firing starts a run in.
    pub watcher_pid: String,
    pub signal: String,
    /// The process whose signal is watched.
    pub process_id: String,
    pub key: Option<String>,
    pub state: Value,
    pub once: bool,
    /// `active` or `failed`.
    pub status: String,
    pub error: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
}

pub const MIGRATION: &str = "CREATE TABLE signal_watches(
        watch_id TEXT PRIMARY KEY,
        uid INTEGER NOT NULL,
        watcher_pid TEXT NOT NULL,
        signal TEXT NOT NULL,
        process_id TEXT NOT NULL,
        watch_key TEXT,
        state TEXT NOT NULL DEFAULT 'null',
        once INTEGER NOT NULL DEFAULT 1,
        status TEXT NOT NULL DEFAULT 'active',
        error TEXT,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        expires_at INTEGER);
     CREATE UNIQUE INDEX signal_watches_key ON signal_watches(watcher_pid, watch_key)
        WHERE watch_key IS NOT NULL;
     CREATE INDEX signal_watches_match ON signal_watches(process_id, signal);";

const COLS: &str = "watch_id, uid, watcher_pid, signal, process_id, watch_key, state, once,
    status, error, created_at, expires_at";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SignalWatch> {
    let state: String = r.get(6)?;
    Ok(SignalWatch {
        watch_id: r.get(0)?,
        uid: r.get(1)?,
        watcher_pid: r.get(2)?,
        signal: r.get(3)?,
        process_id: r.get(4)?,
        key: r.get(5)?,
        state: serde_json::from_str(&state).unwrap_or(Value::Null),
        once: r.get(7)?,
        status: r.get(8)?,
        error: r.get(9)?,
        created_at: r.get(10)?,
        expires_at: r.get(11)?,
    })
}

/// Inserts `w`, or replaces the watch of the same watcher and key (which
/// keeps its id and creation time); the stored watch and whether it is new.
pub fn upsert(c: &mut Connection, w: &SignalWatch) -> Result<(SignalWatch, bool), KernelError> {
    let tx = c.transaction()?;
    let existing = match &w.key {
        Some(key) => opt(tx.query_row(
            &format!("SELECT {COLS} FROM signal_watches WHERE watcher_pid = ?1 AND watch_key = ?2"),
            params![w.watcher_pid, key],
            row,
        ))?,
        None => None,
    };
    let (stored, created) = match existing {
        Some(old) => {
            tx.execute(
                "UPDATE signal_watches SET signal = ?2, process_id = ?3, state = ?4, once = ?5,
                    status = 'active', error = NULL, updated_at = ?6, expires_at = ?7
                 WHERE watch_id = ?1",
                params![
                    old.watch_id,
                    w.signal,
                    w.process_id,
                    w.state.to_string(),
                    w.once,
                    now_ms(),
                    w.expires_at
                ],
            )?;
            (
                SignalWatch {
                    watch_id: old.watch_id,
                    created_at: old.created_at,
                    ..w.clone()
                },
                false,
            )
        }
        None => {
            tx.execute(
                "INSERT INTO signal_watches(watch_id, uid, watcher_pid, signal, process_id,
                    watch_key, state, once, status, created_at, updated_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, 'active', ?9, ?9, ?10)",
                params![
                    w.watch_id,
                    w.uid,
                    w.watcher_pid,
                    w.signal,
                    w.process_id,
                    w.key,
                    w.state.to_string(),
                    w.once,
                    w.created_at,
                    w.expires_at
                ],
            )?;
            (w.clone(), true)
        }
    };
    tx.commit()?;
    Ok((stored, created))
}

/// Active, unexpired watches of `signal` from process `pid` of `uid`,
/// oldest first.
pub fn matching(
    c: &Connection,
    uid: i64,
    pid: &str,
    signal: &str,
) -> Result<Vec<SignalWatch>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {COLS} FROM signal_watches
         WHERE uid = ?1 AND process_id = ?2 AND signal = ?3 AND status = 'active'
           AND (expires_at IS NULL OR expires_at > ?4)
         ORDER BY created_at, watch_id"
    ))?;
    let rows = stmt.query_map(params![uid, pid, signal, now_ms()], row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Removes `watcher`'s watch `watch_id` or the one named `key`; the ids
/// removed.
pub fn remove(
    c: &Connection,
    watcher: &str,
    watch_id: Option<&str>,
    key: Option<&str>,
) -> Result<Vec<String>, KernelError> {
    let mut stmt = c.prepare(
        "DELETE FROM signal_watches WHERE watcher_pid = ?1
           AND (?2 IS NULL OR watch_id = ?2) AND (?3 IS NULL OR watch_key = ?3)
         RETURNING watch_id",
    )?;
    let rows = stmt.query_map(params![watcher, watch_id, key], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Deletes watch `watch_id` (fired once, or expired).
pub fn delete(c: &Connection, watch_id: &str) -> Result<bool, KernelError> {
    Ok(c.execute("DELETE FROM signal_watches WHERE watch_id = ?1", [watch_id])? > 0)
}

/// Deletes watch `watch_id` if it has expired.
pub fn delete_expired(c: &Connection, watch_id: &str) -> Result<bool, KernelError> {
    Ok(c.execute(
        "DELETE FROM signal_watches WHERE watch_id = ?1 AND expires_at <= ?2",
        params![watch_id, now_ms()],
    )? > 0)
}

/// Marks a watch whose firing could not be delivered.
pub fn mark_failed(c: &Connection, watch_id: &str, error: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE signal_watches SET status = 'failed', error = ?2, updated_at = ?3
         WHERE watch_id = ?1",
        params![watch_id, error, now_ms()],
    )?;
    Ok(())
}
