//! The `notifications` table (migration 21) and its expiry timers: every
//! row with an `expires_at` has a timer `notification:<id>` at that time,
//! armed in the same transaction as the row's change.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::types::{NotificationRecord, NotificationSource};
use crate::domains::timers::table as timers;
use crate::error::KernelError;

pub const MIGRATION: &str = "CREATE TABLE notifications(
        notification_id TEXT PRIMARY KEY,
        uid INTEGER NOT NULL,
        title TEXT NOT NULL,
        body TEXT,
        level TEXT NOT NULL,
        source_json TEXT NOT NULL,
        actions_json TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        read_at INTEGER,
        dismissed_at INTEGER,
        expires_at INTEGER);
     CREATE INDEX notifications_uid ON notifications(uid, created_at);";

/// The kind of the expiry timers (see `domains::timers`).
pub const TIMER_KIND: &str = "notification";

fn timer_id(notification_id: &str) -> String {
    format!("{TIMER_KIND}:{notification_id}")
}

const COLUMNS: &str = "notification_id, title, body, level, source_json, actions_json,
                       created_at, read_at, dismissed_at, expires_at";

fn record(r: &Row<'_>) -> rusqlite::Result<NotificationRecord> {
    let level: String = r.get(3)?;
    let source: String = r.get(4)?;
    let actions: String = r.get(5)?;
    Ok(NotificationRecord {
        notification_id: r.get(0)?,
        title: r.get(1)?,
        body: r.get(2)?,
        level: serde_json::from_value(serde_json::Value::String(level)).unwrap_or_default(),
        source: serde_json::from_str(&source).unwrap_or(NotificationSource::User),
        actions: serde_json::from_str(&actions).unwrap_or_default(),
        created_at: r.get(6)?,
        read_at: r.get(7)?,
        dismissed_at: r.get(8)?,
        expires_at: r.get(9)?,
    })
}

fn json(v: &impl serde::Serialize) -> Result<String, KernelError> {
    serde_json::to_string(v).map_err(|e| KernelError::internal("notification json", e))
}

/// Stores `n` for `uid` and arms its expiry.
pub fn insert(c: &mut Connection, uid: i64, n: &NotificationRecord) -> Result<(), KernelError> {
    let tx = c.transaction()?;
    tx.execute(
        "INSERT INTO notifications(notification_id, uid, title, body, level, source_json,
            actions_json, created_at, read_at, dismissed_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            n.notification_id,
            uid,
            n.title,
            n.body,
            n.level.as_str(),
            json(&n.source)?,
            json(&n.actions)?,
            n.created_at,
            n.read_at,
            n.dismissed_at,
            n.expires_at
        ],
    )?;
    if let Some(at) = n.expires_at {
        timers::arm(&tx, &timer_id(&n.notification_id), at, TIMER_KIND, "{}")?;
    }
    tx.commit()?;
    Ok(())
}

/// Deletes every notification expired at `now`, with its timer.
pub fn prune_expired(c: &mut Connection, now: i64) -> Result<usize, KernelError> {
    let tx = c.transaction()?;
    let ids: Vec<String> = {
        let mut stmt = tx.prepare(
            "SELECT notification_id FROM notifications
             WHERE expires_at IS NOT NULL AND expires_at <= ?1",
        )?;
        stmt.query_map([now], |r| r.get(0))?
            .collect::<Result<_, _>>()?
    };
    for id in &ids {
        tx.execute("DELETE FROM notifications WHERE notification_id = ?1", [id])?;
        timers::cancel(&tx, &timer_id(id))?;
    }
    tx.commit()?;
    Ok(ids.len())
}

/// `uid`'s notifications, newest first.
pub fn list(
    c: &Connection,
    uid: i64,
    include_read: bool,
    include_dismissed: bool,
    limit: usize,
) -> Result<Vec<NotificationRecord>, KernelError> {
    let mut sql = format!("SELECT {COLUMNS} FROM notifications WHERE uid = ?1");
    if !include_read {
        sql.push_str(" AND read_at IS NULL");
    }
    if !include_dismissed {
        sql.push_str(" AND dismissed_at IS NULL");
    }
    sql.push_str(" ORDER BY created_at DESC, rowid DESC LIMIT ?2");
    let mut stmt = c.prepare(&sql)?;
    let rows = stmt
        .query_map(params![uid, limit as i64], record)?
        .collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Which mark a notification gets.
#[derive(Debug, Clone, Copy)]
pub enum Mark {
    Read,
    Dismissed,
}

/// Marks `uid`'s notification `id` at `now`, expiring it at `expires_at`;
/// the updated record, or `None` when `uid` has no such notification.
pub fn mark(
    c: &mut Connection,
    uid: i64,
    id: &str,
    mark: Mark,
    now: i64,
    expires_at: i64,
) -> Result<Option<NotificationRecord>, KernelError> {
    let tx = c.transaction()?;
    let sql = match mark {
        // A second mark_read keeps the first read time.
        Mark::Read => {
            "UPDATE notifications SET read_at = coalesce(read_at, ?3), expires_at = ?4
             WHERE uid = ?1 AND notification_id = ?2"
        }
        Mark::Dismissed => {
            "UPDATE notifications SET dismissed_at = ?3, expires_at = ?4
             WHERE uid = ?1 AND notification_id = ?2"
        }
    };
    if tx.execute(sql, params![uid, id, now, expires_at])? == 0 {
        return Ok(None);
    }
    timers::arm(&tx, &timer_id(id), expires_at, TIMER_KIND, "{}")?;
    let updated = tx
        .query_row(
            &format!("SELECT {COLUMNS} FROM notifications WHERE notification_id = ?1"),
            [id],
            record,
        )
        .optional()?;
    tx.commit()?;
    Ok(updated)
}

/// The notification id a timer of this domain names.
pub fn id_of_timer(timer_id: &str) -> Option<&str> {
    timer_id
        .strip_prefix(TIMER_KIND)
        .and_then(|s| s.strip_prefix(':'))
}

/// Deletes notification `id` when it has expired at `now` (an expiry
/// timer that fired); whether it was deleted.
pub fn expire(c: &Connection, id: &str, now: i64) -> Result<bool, KernelError> {
    Ok(c.execute(
        "DELETE FROM notifications
         WHERE notification_id = ?1 AND expires_at IS NOT NULL AND expires_at <= ?2",
        params![id, now],
    )? > 0)
}

/// Whether notification `id` exists (tests and diagnostics).
pub fn exists(c: &Connection, id: &str) -> Result<bool, KernelError> {
    Ok(c.query_row(
        "SELECT 1 FROM notifications WHERE notification_id = ?1",
        [id],
        |_| Ok(()),
    )
    .optional()?
    .is_some())
}
