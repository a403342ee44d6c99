//! The `schedules` table (migration 22). Each enabled schedule with a
//! next run has a timer `sched:<id>` at that time in the timer table, and
//! every change to one writes both in one transaction, so the table and
//! its wake never disagree.

use rusqlite::{Connection, OptionalExtension, Row, Transaction, params};

use super::types::{OverlapPolicy, RunStatus, ScheduleRecord, ScheduleState};
use crate::domains::timers::table as timers;
use crate::error::KernelError;

pub const MIGRATION: &str = "CREATE TABLE schedules(
        schedule_id TEXT PRIMARY KEY,
        owner_uid INTEGER NOT NULL,
        name TEXT NOT NULL,
        description TEXT,
        enabled INTEGER NOT NULL,
        expression_json TEXT NOT NULL,
        target_json TEXT NOT NULL,
        next_run_at INTEGER,
        running_at INTEGER,
        last_run_at INTEGER,
        last_status TEXT,
        last_error TEXT,
        last_duration_ms INTEGER,
        run_count INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL);
     CREATE INDEX schedules_owner ON schedules(owner_uid);
     CREATE INDEX schedules_next ON schedules(next_run_at) WHERE enabled = 1;";

/// The kind of schedule wake timers (see `domains::timers`).
pub const TIMER_KIND: &str = "sched";

pub fn timer_id(schedule_id: &str) -> String {
    format!("{TIMER_KIND}:{schedule_id}")
}

/// The schedule id a wake timer names.
pub fn id_of_timer(timer_id: &str) -> Option<&str> {
    timer_id
        .strip_prefix(TIMER_KIND)
        .and_then(|s| s.strip_prefix(':'))
}

const COLUMNS: &str = "schedule_id, owner_uid, name, description, enabled, expression_json,
    target_json, next_run_at, running_at, last_run_at, last_status, last_error,
    last_duration_ms, run_count, created_at, updated_at";

/// A JSON column as `T`; a row this build cannot read is a database error.
fn json_column<T: serde::de::DeserializeOwned>(r: &Row<'_>, i: usize) -> rusqlite::Result<T> {
    let text: String = r.get(i)?;
    serde_json::from_str(&text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(i, rusqlite::types::Type::Text, e.into())
    })
}

fn record(r: &Row<'_>) -> rusqlite::Result<ScheduleRecord> {
    let status: Option<String> = r.get(10)?;
    Ok(ScheduleRecord {
        id: r.get(0)?,
        owner_uid: r.get(1)?,
        name: r.get(2)?,
        description: r.get(3)?,
        enabled: r.get(4)?,
        expression: json_column(r, 5)?,
        target: json_column(r, 6)?,
        overlap_policy: OverlapPolicy::Skip,
        created_at_ms: r.get(14)?,
        updated_at_ms: r.get(15)?,
        state: ScheduleState {
            next_run_at_ms: r.get(7)?,
            running_at_ms: r.get(8)?,
            last_run_at_ms: r.get(9)?,
            last_status: status.as_deref().and_then(RunStatus::parse),
            last_error: r.get(11)?,
            last_duration_ms: r.get(12)?,
            run_count: r.get(13)?,
        },
    })
}

fn json(v: &impl serde::Serialize) -> Result<String, KernelError> {
    serde_json::to_string(v).map_err(|e| KernelError::internal("schedule json", e))
}

/// Arms the schedule's wake at its next run, or cancels it.
fn sync_timer(tx: &Transaction<'_>, s: &ScheduleRecord) -> Result<(), KernelError> {
    let id = timer_id(&s.id);
    match s.state.next_run_at_ms {
        Some(at) if s.enabled => timers::arm(tx, &id, at, TIMER_KIND, "{}"),
        _ => timers::cancel(tx, &id).map(drop),
    }
}

/// Stores a new schedule and arms its wake.
pub fn insert(c: &mut Connection, s: &ScheduleRecord) -> Result<(), KernelError> {
    let tx = c.transaction()?;
    tx.execute(
        &format!("INSERT INTO schedules({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)"),
        params![
            s.id,
            s.owner_uid,
            s.name,
            s.description,
            s.enabled,
            json(&s.expression)?,
            json(&s.target)?,
            s.state.next_run_at_ms,
            s.state.running_at_ms,
            s.state.last_run_at_ms,
            s.state.last_status.map(RunStatus::as_str),
            s.state.last_error,
            s.state.last_duration_ms,
            s.state.run_count,
            s.created_at_ms,
            s.updated_at_ms
        ],
    )?;
    sync_timer(&tx, s)?;
    tx.commit()?;
    Ok(())
}

pub fn get(c: &Connection, id: &str) -> Result<Option<ScheduleRecord>, KernelError> {
    Ok(c.query_row(
        &format!("SELECT {COLUMNS} FROM schedules WHERE schedule_id = ?1"),
        [id],
        record,
    )
    .optional()?)
}

/// A page of schedules (of `owner`, or everyone's), soonest next run
/// first, then never-running ones by last update; and how many match.
pub fn list(
    c: &Connection,
    owner: Option<i64>,
    include_disabled: bool,
    limit: usize,
    offset: usize,
) -> Result<(Vec<ScheduleRecord>, i64), KernelError> {
    let mut clauses = vec!["(?1 IS NULL OR owner_uid = ?1)"];
    if !include_disabled {
        clauses.push("enabled = 1");
    }
    let filter = clauses.join(" AND ");
    let count = c.query_row(
        &format!("SELECT count(*) FROM schedules WHERE {filter}"),
        [owner],
        |r| r.get(0),
    )?;
    let mut stmt = c.prepare(&format!(
        "SELECT {COLUMNS} FROM schedules WHERE {filter}
         ORDER BY next_run_at IS NULL, next_run_at, updated_at DESC, schedule_id
         LIMIT ?2 OFFSET ?3"
    ))?;
    let rows = stmt
        .query_map(params![owner, limit as i64, offset as i64], record)?
        .collect::<Result<_, _>>()?;
    Ok((rows, count))
}

/// Ids of enabled schedules (of `owner`, or everyone's) due at `now`.
pub fn due_ids(c: &Connection, now: i64, owner: Option<i64>) -> Result<Vec<String>, KernelError> {
    let mut stmt = c.prepare(
        "SELECT schedule_id FROM schedules
         WHERE enabled = 1 AND next_run_at IS NOT NULL AND next_run_at <= ?1
           AND (?2 IS NULL OR owner_uid = ?2)
         ORDER BY next_run_at, schedule_id",
    )?;
    let ids = stmt
        .query_map(params![now, owner], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(ids)
}

/// Writes the schedule's settings and state as given and re-arms its wake.
pub fn save(c: &mut Connection, s: &ScheduleRecord) -> Result<(), KernelError> {
    let tx = c.transaction()?;
    tx.execute(
        "UPDATE schedules SET name = ?2, description = ?3, enabled = ?4, expression_json = ?5,
            target_json = ?6, next_run_at = ?7, running_at = ?8, last_run_at = ?9,
            last_status = ?10, last_error = ?11, last_duration_ms = ?12, run_count = ?13,
            updated_at = ?14
         WHERE schedule_id = ?1",
        params![
            s.id,
            s.name,
            s.description,
            s.enabled,
            json(&s.expression)?,
            json(&s.target)?,
            s.state.next_run_at_ms,
            s.state.running_at_ms,
            s.state.last_run_at_ms,
            s.state.last_status.map(RunStatus::as_str),
            s.state.last_error,
            s.state.last_duration_ms,
            s.state.run_count,
            s.updated_at_ms
        ],
    )?;
    sync_timer(&tx, s)?;
    tx.commit()?;
    Ok(())
}

/// Deletes a schedule and its wake; whether it existed.
pub fn remove(c: &mut Connection, id: &str) -> Result<bool, KernelError> {
    let tx = c.transaction()?;
    let n = tx.execute("DELETE FROM schedules WHERE schedule_id = ?1", [id])?;
    timers::cancel(&tx, &timer_id(id))?;
    tx.commit()?;
    Ok(n > 0)
}

/// Marks the schedule running at `now` unless it already is (overlap
/// `skip`); the record as it was before, when marked.
pub fn mark_running(
    c: &Connection,
    id: &str,
    now: i64,
) -> Result<Option<ScheduleRecord>, KernelError> {
    let before = get(c, id)?;
    let marked = c.execute(
        "UPDATE schedules SET running_at = ?2 WHERE schedule_id = ?1 AND running_at IS NULL",
        params![id, now],
    )?;
    Ok(before.filter(|_| marked > 0))
}

/// Schedules a stopped kernel left marked running.
pub fn interrupted(c: &Connection) -> Result<Vec<ScheduleRecord>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {COLUMNS} FROM schedules WHERE running_at IS NOT NULL"
    ))?;
    let rows = stmt.query_map([], record)?.collect::<Result<_, _>>()?;
    Ok(rows)
}

/// Gives every armed schedule its wake back if it lost it (a timer taken
/// but not yet acted on when the kernel stopped); how many were re-armed.
pub fn rearm_all(c: &Connection) -> Result<usize, KernelError> {
    let mut stmt = c.prepare(
        "SELECT schedule_id, next_run_at FROM schedules
         WHERE enabled = 1 AND next_run_at IS NOT NULL",
    )?;
    let due: Vec<(String, i64)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut rearmed = 0;
    for (id, at) in due {
        if timers::arm_if_missing(c, &timer_id(&id), at, TIMER_KIND, "{}")? {
            rearmed += 1;
        }
    }
    Ok(rearmed)
}
