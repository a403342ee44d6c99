//! The rows of `proc.ipc.call` (migration 110): one per call, `pending`
//! until the target's run that took the request finishes (`completed`),
//! the deadline passes (`timed_out`) or the target is killed or reset
//! (`completed` with an error). A settled call stays until its reply is
//! delivered to the calling process, so a kernel that stops in between
//! delivers it at the next start.

use rusqlite::{Connection, params};
use serde_json::{Value, json};

use crate::db::{now_ms, opt};
use crate::error::KernelError;

/// The key a request message carries in its stored body: the run that
/// appends it is the run whose answer is the reply.
pub const REQUEST_KEY: &str = "ipc";

/// One call.
#[derive(Debug, Clone, PartialEq)]
pub struct IpcCall {
    pub call_id: String,
    pub uid: i64,
    pub source_pid: String,
    /// The caller's run when the call was made, if it had one.
    pub source_run_id: Option<String>,
    /// Where the reply is appended in the calling process.
    pub source_conversation_id: String,
    pub target_pid: String,
    pub target_conversation_id: String,
    /// The run the request started or queued behind.
    pub target_run_id: Option<String>,
    /// `pending`, `completed` or `timed_out`.
    pub status: String,
    pub deadline_at: i64,
    pub created_at: i64,
    /// The target's answer (`{text, usage}`) once completed.
    pub response: Option<Value>,
    pub error: Option<String>,
}

impl IpcCall {
    /// The `ipc.reply` / `ipc.timeout` signal this settled call sends.
    pub fn signal(&self) -> &'static str {
        if self.status == "timed_out" {
            "ipc.timeout"
        } else {
            "ipc.reply"
        }
    }

    /// The payload of [`IpcCall::signal`] (the reference's shape).
    pub fn payload(&self) -> Value {
        let mut p = json!({
            "callId": self.call_id,
            "sourcePid": self.source_pid,
            "targetPid": self.target_pid,
            "runId": self.target_run_id,
            "deadlineAt": self.deadline_at,
            "createdAt": self.created_at,
            "status": self.status,
        });
        if let Some(r) = &self.source_run_id {
            p["sourceRunId"] = json!(r);
        }
        if self.status == "completed" {
            p["response"] = self.response.clone().unwrap_or(Value::Null);
        }
        if let Some(e) = &self.error {
            p["error"] = json!(e);
        }
        p
    }
}

pub const MIGRATION: &str = "CREATE TABLE ipc_calls(
        call_id TEXT PRIMARY KEY,
        uid INTEGER NOT NULL,
        source_pid TEXT NOT NULL,
        source_run_id TEXT,
        source_conversation_id TEXT NOT NULL,
        target_pid TEXT NOT NULL,
        target_conversation_id TEXT NOT NULL,
        target_run_id TEXT,
        status TEXT NOT NULL DEFAULT 'pending',
        deadline_at INTEGER NOT NULL,
        created_at INTEGER NOT NULL,
        response TEXT,
        error TEXT);
     CREATE INDEX ipc_calls_target ON ipc_calls(target_pid, status);";

const COLS: &str = "call_id, uid, source_pid, source_run_id, source_conversation_id, target_pid,
    target_conversation_id, target_run_id, status, deadline_at, created_at, response, error";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<IpcCall> {
    let response: Option<String> = r.get(11)?;
    Ok(IpcCall {
        call_id: r.get(0)?,
        uid: r.get(1)?,
        source_pid: r.get(2)?,
        source_run_id: r.get(3)?,
        source_conversation_id: r.get(4)?,
        target_pid: r.get(5)?,
        target_conversation_id: r.get(6)?,
        target_run_id: r.get(7)?,
        status: r.get(8)?,
        deadline_at: r.get(9)?,
        created_at: r.get(10)?,
        response: response.and_then(|t| serde_json::from_str(&t).ok()),
        error: r.get(12)?,
    })
}

pub fn insert(c: &Connection, call: &IpcCall) -> Result<(), KernelError> {
    c.execute(
        "INSERT INTO ipc_calls(call_id, uid, source_pid, source_run_id, source_conversation_id,
            target_pid, target_conversation_id, target_run_id, status, deadline_at, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            call.call_id,
            call.uid,
            call.source_pid,
            call.source_run_id,
            call.source_conversation_id,
            call.target_pid,
            call.target_conversation_id,
            call.target_run_id,
            call.status,
            call.deadline_at,
            call.created_at
        ],
    )?;
    Ok(())
}

pub fn get(c: &Connection, call_id: &str) -> Result<Option<IpcCall>, KernelError> {
    opt(c.query_row(
        &format!("SELECT {COLS} FROM ipc_calls WHERE call_id = ?1"),
        [call_id],
        row,
    ))
}

pub fn set_target_run(
    c: &Connection,
    call_id: &str,
    run_id: Option<&str>,
) -> Result<(), KernelError> {
    c.execute(
        "UPDATE ipc_calls SET target_run_id = ?2 WHERE call_id = ?1",
        params![call_id, run_id],
    )?;
    Ok(())
}

pub fn delete(c: &Connection, call_id: &str) -> Result<(), KernelError> {
    c.execute("DELETE FROM ipc_calls WHERE call_id = ?1", [call_id])?;
    Ok(())
}

/// Pending calls whose request is a message of run `run_id` of `pid`.
pub fn pending_of_run(c: &Connection, pid: &str, run_id: &str) -> Result<Vec<String>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT k.call_id FROM proc_messages m
           JOIN ipc_calls k ON k.call_id = json_extract(m.body, '$.{REQUEST_KEY}.callId')
         WHERE m.pid = ?1 AND m.run_id = ?2 AND k.status = 'pending'"
    ))?;
    let rows = stmt.query_map(params![pid, run_id], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Pending calls to `pid` (all, or those to conversation `conv`).
pub fn pending_to(
    c: &Connection,
    pid: &str,
    conv: Option<&str>,
) -> Result<Vec<String>, KernelError> {
    let mut stmt = c.prepare(
        "SELECT call_id FROM ipc_calls WHERE target_pid = ?1 AND status = 'pending'
           AND (?2 IS NULL OR target_conversation_id = ?2)",
    )?;
    let rows = stmt.query_map(params![pid, conv], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Settles a pending call as `completed`; false when it was settled
/// already (timed out, failed, answered).
pub fn complete(
    c: &Connection,
    call_id: &str,
    response: Option<&Value>,
    error: Option<&str>,
) -> Result<bool, KernelError> {
    Ok(c.execute(
        "UPDATE ipc_calls SET status = 'completed', response = ?2, error = ?3
         WHERE call_id = ?1 AND status = 'pending'",
        params![call_id, response.map(Value::to_string), error],
    )? > 0)
}

/// Settles a pending call whose deadline has passed as `timed_out`.
pub fn time_out(c: &Connection, call_id: &str) -> Result<bool, KernelError> {
    Ok(c.execute(
        "UPDATE ipc_calls SET status = 'timed_out', error = 'IPC call timed out'
         WHERE call_id = ?1 AND status = 'pending' AND deadline_at <= ?2",
        params![call_id, now_ms()],
    )? > 0)
}

/// Settled calls whose reply has not been delivered yet.
pub fn undelivered(c: &Connection) -> Result<Vec<String>, KernelError> {
    let mut stmt = c.prepare("SELECT call_id FROM ipc_calls WHERE status != 'pending'")?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}
