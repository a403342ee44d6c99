//! The process rows (migrations 4 and 60): registry, messages (each in a
//! conversation), runs, the queue, HIL requests and remembered allow
//! rules. Conversations and segments are [`super::conversations`]. Plain functions on a
//! connection, called through [`crate::db::Db::call`].

use gsv_protocol::proc::{HilRequest, ProcessInfo};
use rusqlite::{Connection, params};
use serde_json::Value;

use crate::db::{now_ms, opt};
use crate::error::KernelError;

/// One registry row (shown as [`ProcessInfo`]).
#[derive(Debug, Clone)]
pub struct ProcRow {
    pub pid: String,
    /// The owning human (visibility and signal routing key on it).
    pub owner_uid: i64,
    pub run_as_uid: i64,
    pub username: String,
    pub interactive: bool,
    pub parent_pid: Option<String>,
    pub label: Option<String>,
    pub cwd: String,
    pub workspace_id: Option<String>,
    pub state: String,
    pub active_run_id: Option<String>,
    pub queued_count: i64,
    pub last_active_at: Option<i64>,
    pub created_at: i64,
    /// A system profile id (`super::profiles`).
    pub profile: String,
}

impl ProcRow {
    /// The row as `proc.list` shows it.
    pub fn to_info(&self) -> ProcessInfo {
        ProcessInfo {
            pid: self.pid.clone(),
            uid: self.owner_uid,
            username: self.username.clone(),
            interactive: self.interactive,
            parent_pid: self.parent_pid.clone(),
            label: self.label.clone(),
            cwd: self.cwd.clone(),
            workspace_id: self.workspace_id.clone(),
            state: self.state.clone(),
            profile: self.profile.clone(),
            active_run_id: self.active_run_id.clone(),
            queued_count: self.queued_count,
            last_active_at: self.last_active_at,
            created_at: self.created_at,
        }
    }
}

const COLS: &str = "pid, owner_uid, uid, username, interactive, parent_pid, label, cwd, \
                    workspace_id, state, active_run_id, queued_count, last_active_at, created_at, profile";

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ProcRow> {
    Ok(ProcRow {
        pid: r.get(0)?,
        owner_uid: r.get(1)?,
        run_as_uid: r.get(2)?,
        username: r.get(3)?,
        interactive: r.get(4)?,
        parent_pid: r.get(5)?,
        label: r.get(6)?,
        cwd: r.get(7)?,
        workspace_id: r.get(8)?,
        state: r.get(9)?,
        active_run_id: r.get(10)?,
        queued_count: r.get(11)?,
        last_active_at: r.get(12)?,
        created_at: r.get(13)?,
        profile: r.get(14)?,
    })
}

pub fn insert(c: &Connection, p: &ProcRow) -> Result<(), KernelError> {
    c.execute(
        &format!(
            "INSERT INTO processes({COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15)"
        ),
        params![
            p.pid,
            p.owner_uid,
            p.run_as_uid,
            p.username,
            p.interactive,
            p.parent_pid,
            p.label,
            p.cwd,
            p.workspace_id,
            p.state,
            p.active_run_id,
            p.queued_count,
            p.last_active_at,
            p.created_at,
            p.profile
        ],
    )?;
    Ok(())
}

pub fn get(c: &Connection, pid: &str) -> Result<Option<ProcRow>, KernelError> {
    opt(c.query_row(
        &format!("SELECT {COLS} FROM processes WHERE pid = ?1"),
        [pid],
        row,
    ))
}

/// Processes of `owner` (every process when `None`), newest first.
pub fn list(c: &Connection, owner: Option<i64>) -> Result<Vec<ProcRow>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {COLS} FROM processes WHERE ?1 IS NULL OR owner_uid = ?1
         ORDER BY created_at DESC, pid"
    ))?;
    let rows = stmt.query_map([owner], row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn delete(c: &Connection, pid: &str) -> Result<(), KernelError> {
    c.execute("DELETE FROM processes WHERE pid = ?1", [pid])?;
    Ok(())
}

/// The runtime projection of a signal (reference §6.1).
pub fn project(
    c: &Connection,
    pid: &str,
    state: &str,
    active_run: Option<&str>,
    queued: i64,
) -> Result<(), KernelError> {
    c.execute(
        "UPDATE processes SET state = ?2, active_run_id = ?3, queued_count = ?4,
         last_active_at = ?5 WHERE pid = ?1",
        params![pid, state, active_run, queued, now_ms()],
    )?;
    Ok(())
}

/// Appends `body` to conversation `conv` of `pid`; its message id.
pub fn append_message(
    c: &Connection,
    pid: &str,
    conv: &str,
    run_id: Option<&str>,
    body: &Value,
) -> Result<i64, KernelError> {
    c.execute(
        "INSERT INTO proc_messages(pid, conversation_id, run_id, body, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![pid, conv, run_id, body.to_string(), now_ms()],
    )?;
    let id = c.last_insert_rowid();
    super::conversations::touch(c, pid, conv)?;
    Ok(id)
}

/// Inserts `body` with the given id (a compaction's summary takes the
/// id of the last archived message, so it sorts at the boundary).
pub fn insert_message_at(
    c: &Connection,
    id: i64,
    pid: &str,
    conv: &str,
    body: &Value,
) -> Result<(), KernelError> {
    c.execute(
        "INSERT INTO proc_messages(id, pid, conversation_id, run_id, body, created_at)
         VALUES (?1, ?2, ?3, NULL, ?4, ?5)",
        params![id, pid, conv, body.to_string(), now_ms()],
    )?;
    Ok(())
}

fn message_row(body: String, id: i64, at: i64) -> Result<Value, KernelError> {
    let mut v: Value = serde_json::from_str(&body)
        .map_err(|e| KernelError::internal("stored process message", e))?;
    v["id"] = Value::from(id);
    v["timestamp"] = Value::from(at);
    Ok(v)
}

/// Messages of conversation `conv` of `pid` with `id` in
/// `(after, through]`, oldest first, each with its `id` and `timestamp`.
pub fn messages_between(
    c: &Connection,
    pid: &str,
    conv: &str,
    after: i64,
    through: i64,
) -> Result<Vec<Value>, KernelError> {
    query_messages(
        c,
        "SELECT body, id, created_at FROM proc_messages
         WHERE pid = ?1 AND conversation_id = ?2 AND id > ?3 AND id <= ?4 ORDER BY id",
        params![pid, conv, after, through],
    )
}

/// The messages a `SELECT body, id, created_at FROM proc_messages` finds.
fn query_messages(
    c: &Connection,
    sql: &str,
    args: impl rusqlite::Params,
) -> Result<Vec<Value>, KernelError> {
    let mut stmt = c.prepare_cached(sql)?;
    let rows = stmt.query_map(args, |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, i64>(1)?,
            r.get::<_, i64>(2)?,
        ))
    })?;
    let mut out = Vec::new();
    for r in rows {
        let (body, id, at) = r?;
        out.push(message_row(body, id, at)?);
    }
    Ok(out)
}

/// Every message of conversation `conv` of `pid`, oldest first.
pub fn messages(c: &Connection, pid: &str, conv: &str) -> Result<Vec<Value>, KernelError> {
    messages_between(c, pid, conv, i64::MIN, i64::MAX)
}

/// One page of a conversation (reads only the page) and the total count.
pub fn messages_page(
    c: &Connection,
    pid: &str,
    conv: &str,
    offset: usize,
    limit: usize,
) -> Result<(Vec<Value>, usize), KernelError> {
    let total = message_count(c, pid, conv)? as usize;
    let page = query_messages(
        c,
        "SELECT body, id, created_at FROM proc_messages
         WHERE pid = ?1 AND conversation_id = ?2 ORDER BY id LIMIT ?3 OFFSET ?4",
        params![pid, conv, limit as i64, offset as i64],
    )?;
    Ok((page, total))
}

pub fn message_count(c: &Connection, pid: &str, conv: &str) -> Result<i64, KernelError> {
    Ok(c.query_row(
        "SELECT count(*) FROM proc_messages WHERE pid = ?1 AND conversation_id = ?2",
        params![pid, conv],
        |r| r.get(0),
    )?)
}

/// Deletes messages of `conv` with `id <= through`.
pub fn delete_messages_through(
    c: &Connection,
    pid: &str,
    conv: &str,
    through: i64,
) -> Result<(), KernelError> {
    c.execute(
        "DELETE FROM proc_messages WHERE pid = ?1 AND conversation_id = ?2 AND id <= ?3",
        params![pid, conv, through],
    )?;
    Ok(())
}

pub fn clear_conversation(c: &Connection, pid: &str, conv: &str) -> Result<(), KernelError> {
    c.execute(
        "DELETE FROM proc_messages WHERE pid = ?1 AND conversation_id = ?2",
        params![pid, conv],
    )?;
    c.execute(
        "DELETE FROM proc_queue WHERE pid = ?1 AND conversation_id = ?2",
        params![pid, conv],
    )?;
    Ok(())
}

pub fn start_run(c: &Connection, pid: &str, conv: &str, run_id: &str) -> Result<(), KernelError> {
    c.execute(
        "INSERT INTO proc_runs(run_id, pid, conversation_id, status, started_at)
         VALUES (?1, ?2, ?3, 'running', ?4)",
        params![run_id, pid, conv, now_ms()],
    )?;
    Ok(())
}

pub fn finish_run(
    c: &Connection,
    run_id: &str,
    status: &str,
    error: Option<&str>,
) -> Result<(), KernelError> {
    c.execute(
        "UPDATE proc_runs SET status = ?2, error = ?3, finished_at = ?4 WHERE run_id = ?1",
        params![run_id, status, error, now_ms()],
    )?;
    Ok(())
}

/// Runs left `running` by a kernel that stopped: `(pid, run_id, conversation)`.
pub fn interrupted_runs(c: &Connection) -> Result<Vec<(String, String, String)>, KernelError> {
    let mut stmt =
        c.prepare("SELECT pid, run_id, conversation_id FROM proc_runs WHERE status = 'running'")?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Processes with queued messages.
pub fn pids_with_queue(c: &Connection) -> Result<Vec<String>, KernelError> {
    let mut stmt = c.prepare("SELECT DISTINCT pid FROM proc_queue")?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn enqueue(c: &Connection, pid: &str, conv: &str, body: &Value) -> Result<i64, KernelError> {
    c.execute(
        "INSERT INTO proc_queue(pid, conversation_id, body, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![pid, conv, body.to_string(), now_ms()],
    )?;
    queued_count(c, pid)
}

pub fn queued_count(c: &Connection, pid: &str) -> Result<i64, KernelError> {
    Ok(c.query_row(
        "SELECT count(*) FROM proc_queue WHERE pid = ?1",
        [pid],
        |r| r.get(0),
    )?)
}

/// Removes and returns up to `n` queued messages, oldest first, with
/// their conversations: of `conv` only when given.
pub fn dequeue(
    c: &mut Connection,
    pid: &str,
    conv: Option<&str>,
    n: i64,
) -> Result<Vec<(String, Value)>, KernelError> {
    let tx = c.transaction()?;
    let got: Vec<(i64, String, String)> = {
        let mut stmt = tx.prepare(
            "SELECT id, conversation_id, body FROM proc_queue
             WHERE pid = ?1 AND (?2 IS NULL OR conversation_id = ?2) ORDER BY id LIMIT ?3",
        )?;
        stmt.query_map(params![pid, conv, n], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })?
        .collect::<Result<_, _>>()?
    };
    for (id, _, _) in &got {
        tx.execute("DELETE FROM proc_queue WHERE id = ?1", [id])?;
    }
    tx.commit()?;
    got.into_iter()
        .map(|(_, conv, b)| {
            let v = serde_json::from_str(&b)
                .map_err(|e| KernelError::internal("stored queued message", e))?;
            Ok((conv, v))
        })
        .collect()
}

/// Clears every conversation's messages and the queue of `pid`.
pub fn clear_state(c: &Connection, pid: &str) -> Result<(), KernelError> {
    c.execute("DELETE FROM proc_messages WHERE pid = ?1", [pid])?;
    c.execute("DELETE FROM proc_queue WHERE pid = ?1", [pid])?;
    c.execute("DELETE FROM proc_allow WHERE pid = ?1", [pid])?;
    expire_hil(c, pid)?;
    Ok(())
}

/// Per workspace: the number of processes in it and its active process
/// (one with a run if any, else the one active or spawned last).
pub fn workspace_processes(
    c: &Connection,
    workspace_id: &str,
) -> Result<(i64, Option<String>), KernelError> {
    let count = c.query_row(
        "SELECT count(*) FROM processes WHERE workspace_id = ?1",
        [workspace_id],
        |r| r.get(0),
    )?;
    let active = opt(c.query_row(
        "SELECT pid FROM processes WHERE workspace_id = ?1
         ORDER BY active_run_id IS NOT NULL DESC, coalesce(last_active_at, created_at) DESC
         LIMIT 1",
        [workspace_id],
        |r| r.get(0),
    ))?;
    Ok((count, active))
}

pub fn insert_hil(c: &Connection, pid: &str, h: &HilRequest) -> Result<(), KernelError> {
    c.execute(
        "INSERT INTO proc_hil(request_id, pid, run_id, conversation_id, tool_call_id, tool_name,
         call, args, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        params![
            h.request_id,
            pid,
            h.run_id,
            h.conversation_id,
            h.call_id,
            h.tool_name,
            h.syscall,
            h.args.to_string(),
            h.created_at
        ],
    )?;
    Ok(())
}

/// The newest approval request of `pid` still waiting for an answer.
pub fn pending_hil_of(c: &Connection, pid: &str) -> Result<Option<HilRequest>, KernelError> {
    // The arguments are parsed after the row is read: a row closure can
    // only fail with SQLite's error.
    let got = opt(c.query_row(
        "SELECT request_id, run_id, conversation_id, tool_call_id, tool_name, call, args,
         created_at FROM proc_hil WHERE pid = ?1 AND status = 'pending'
         ORDER BY created_at DESC LIMIT 1",
        [pid],
        |r| {
            Ok((
                HilRequest {
                    request_id: r.get(0)?,
                    run_id: r.get(1)?,
                    conversation_id: r.get(2)?,
                    call_id: r.get(3)?,
                    tool_name: r.get(4)?,
                    syscall: r.get(5)?,
                    args: Value::Null,
                    created_at: r.get(7)?,
                },
                r.get::<_, String>(6)?,
            ))
        },
    ))?;
    got.map(|(mut h, args)| {
        h.args = serde_json::from_str(&args)
            .map_err(|e| KernelError::internal("stored approval arguments", e))?;
        Ok(h)
    })
    .transpose()
}

/// `(pid, call)` of a pending HIL request.
pub fn pending_hil(
    c: &Connection,
    request_id: &str,
) -> Result<Option<(String, String)>, KernelError> {
    opt(c.query_row(
        "SELECT pid, call FROM proc_hil WHERE request_id = ?1 AND status = 'pending'",
        [request_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    ))
}

pub fn settle_hil(c: &Connection, request_id: &str, status: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE proc_hil SET status = ?2 WHERE request_id = ?1",
        params![request_id, status],
    )?;
    Ok(())
}

/// Pending requests of a run that will never be answered become `expired`.
pub fn expire_hil(c: &Connection, pid: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE proc_hil SET status = 'expired' WHERE pid = ?1 AND status = 'pending'",
        [pid],
    )?;
    Ok(())
}

pub fn allow(c: &Connection, pid: &str, call: &str) -> Result<(), KernelError> {
    c.execute(
        "INSERT OR IGNORE INTO proc_allow(pid, call) VALUES (?1, ?2)",
        params![pid, call],
    )?;
    Ok(())
}

pub fn is_allowed(c: &Connection, pid: &str, call: &str) -> Result<bool, KernelError> {
    Ok(c.query_row(
        "SELECT count(*) FROM proc_allow WHERE pid = ?1 AND call = ?2",
        params![pid, call],
        |r| r.get::<_, i64>(0),
    )? > 0)
}

/// Brings an existing home process in line with its account: the name
/// (accounts can be renamed) and the `init` profile.
pub fn reconcile_init(c: &Connection, pid: &str, username: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE processes SET username = ?2, profile = 'init' WHERE pid = ?1",
        params![pid, username],
    )?;
    Ok(())
}
