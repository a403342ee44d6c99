//! Conversations and their segments (migration 60): each process has
//! named conversations (`default` always), each with a generation (bumped
//! by a reset), a status, a context-overflow policy and the context
//! pressure its last model call saw. A segment records one compaction:
//! which message ids went to which archive.

use gsv_protocol::proc::{
    ContextPolicy, ContextState, Conversation, ConversationSegment, Overflow,
};
use rusqlite::{Connection, params};

use crate::db::{now_ms, opt};
use crate::error::KernelError;

pub const DEFAULT: &str = "default";

/// Most messages one page of `proc.history` or `segment.read` returns.
pub const MAX_PAGE: usize = 500;

/// A page size: absent is the largest page, and a size is clamped to
/// 1..=[`MAX_PAGE`].
pub fn page_limit(limit: Option<usize>) -> usize {
    limit.unwrap_or(MAX_PAGE).clamp(1, MAX_PAGE)
}

/// A `conversationId` argument: `default` when absent; trimmed, non-empty,
/// at most 128 characters, no `/` (it names an archive directory).
pub fn conversation_arg(call: &str, id: Option<&str>) -> Result<String, KernelError> {
    let Some(id) = id else {
        return Ok(DEFAULT.to_owned());
    };
    let id = id.trim();
    if id.is_empty() || id.len() > 128 || id.contains('/') || id.chars().any(char::is_control) {
        return Err(KernelError::invalid_args(
            call,
            format!(
                "conversationId: must be 1 to 128 characters without '/', not {:?}",
                id
            ),
        ));
    }
    Ok(id.to_owned())
}

const COLS: &str = "c.id, c.generation, c.status, c.title, c.created_at, c.updated_at,
    (SELECT count(*) FROM proc_messages m WHERE m.pid = c.pid AND m.conversation_id = c.id)";

fn conversation(r: &rusqlite::Row<'_>) -> rusqlite::Result<Conversation> {
    Ok(Conversation {
        id: r.get(0)?,
        generation: r.get(1)?,
        status: r.get(2)?,
        title: r.get(3)?,
        created_at: r.get(4)?,
        updated_at: r.get(5)?,
        message_count: r.get(6)?,
    })
}

/// Creates conversation `conv` of `pid` unless it exists; its status.
pub fn ensure_status(c: &Connection, pid: &str, conv: &str) -> Result<Option<String>, KernelError> {
    ensure(c, pid, conv)?;
    Ok(get(c, pid, conv)?.map(|c| c.status))
}

/// Creates conversation `conv` of `pid` (open) unless it exists; whether
/// it was created.
pub fn ensure(c: &Connection, pid: &str, conv: &str) -> Result<bool, KernelError> {
    let now = now_ms();
    let n = c.execute(
        "INSERT OR IGNORE INTO proc_conversations(pid, id, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?3)",
        params![pid, conv, now],
    )?;
    Ok(n > 0)
}

pub fn get(c: &Connection, pid: &str, conv: &str) -> Result<Option<Conversation>, KernelError> {
    opt(c.query_row(
        &format!("SELECT {COLS} FROM proc_conversations c WHERE c.pid = ?1 AND c.id = ?2"),
        params![pid, conv],
        conversation,
    ))
}

/// Conversations of `pid`, oldest first; closed ones only when asked.
pub fn list(
    c: &Connection,
    pid: &str,
    include_closed: bool,
) -> Result<Vec<Conversation>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {COLS} FROM proc_conversations c
         WHERE c.pid = ?1 AND (?2 OR c.status = 'open') ORDER BY c.created_at, c.id"
    ))?;
    let rows = stmt.query_map(params![pid, include_closed], conversation)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Opens (creating or reopening) `conv`, with `title` when given; whether
/// it was created.
pub fn open(
    c: &Connection,
    pid: &str,
    conv: &str,
    title: Option<&str>,
) -> Result<bool, KernelError> {
    let created = ensure(c, pid, conv)?;
    c.execute(
        "UPDATE proc_conversations SET status = 'open', title = coalesce(?3, title),
         updated_at = ?4 WHERE pid = ?1 AND id = ?2",
        params![pid, conv, title, now_ms()],
    )?;
    Ok(created)
}

/// Marks `conv` closed; false when it does not exist.
pub fn close(c: &Connection, pid: &str, conv: &str) -> Result<bool, KernelError> {
    Ok(c.execute(
        "UPDATE proc_conversations SET status = 'closed', updated_at = ?3
         WHERE pid = ?1 AND id = ?2",
        params![pid, conv, now_ms()],
    )? > 0)
}

/// Bumps the generation of `conv` and reopens it; the new generation.
pub fn next_generation(c: &Connection, pid: &str, conv: &str) -> Result<i64, KernelError> {
    ensure(c, pid, conv)?;
    c.execute(
        "UPDATE proc_conversations SET generation = generation + 1, status = 'open',
         context = NULL, updated_at = ?3 WHERE pid = ?1 AND id = ?2",
        params![pid, conv, now_ms()],
    )?;
    Ok(c.query_row(
        "SELECT generation FROM proc_conversations WHERE pid = ?1 AND id = ?2",
        params![pid, conv],
        |r| r.get(0),
    )?)
}

/// Records a new message's time on its conversation.
pub fn touch(c: &Connection, pid: &str, conv: &str) -> Result<(), KernelError> {
    ensure(c, pid, conv)?;
    c.execute(
        "UPDATE proc_conversations SET updated_at = ?3 WHERE pid = ?1 AND id = ?2",
        params![pid, conv, now_ms()],
    )?;
    Ok(())
}

pub fn policy(c: &Connection, pid: &str, conv: &str) -> Result<ContextPolicy, KernelError> {
    ensure(c, pid, conv)?;
    let (overflow, at, keep, updated): (String, f64, i64, i64) = c.query_row(
        "SELECT overflow, compact_at_pressure, keep_last, coalesce(policy_updated_at, created_at)
         FROM proc_conversations WHERE pid = ?1 AND id = ?2",
        params![pid, conv],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
    )?;
    Ok(ContextPolicy {
        conversation_id: conv.to_owned(),
        overflow: Overflow::parse(&overflow)
            .ok_or_else(|| KernelError::Internal(format!("stored overflow policy '{overflow}'")))?,
        compact_at_pressure: at,
        keep_last: keep.max(0) as u64,
        updated_at: updated,
    })
}

pub fn set_policy(c: &Connection, pid: &str, p: &ContextPolicy) -> Result<(), KernelError> {
    ensure(c, pid, &p.conversation_id)?;
    c.execute(
        "UPDATE proc_conversations SET overflow = ?3, compact_at_pressure = ?4, keep_last = ?5,
         policy_updated_at = ?6 WHERE pid = ?1 AND id = ?2",
        params![
            pid,
            p.conversation_id,
            p.overflow.as_str(),
            p.compact_at_pressure,
            p.keep_last as i64,
            p.updated_at
        ],
    )?;
    Ok(())
}

pub fn context(c: &Connection, pid: &str, conv: &str) -> Result<Option<ContextState>, KernelError> {
    let raw: Option<Option<String>> = opt(c.query_row(
        "SELECT context FROM proc_conversations WHERE pid = ?1 AND id = ?2",
        params![pid, conv],
        |r| r.get(0),
    ))?;
    raw.flatten()
        .map(|s| serde_json::from_str(&s).map_err(|e| KernelError::internal("stored context", e)))
        .transpose()
}

pub fn set_context(
    c: &Connection,
    pid: &str,
    conv: &str,
    s: &ContextState,
) -> Result<(), KernelError> {
    let text = serde_json::to_string(s).map_err(|e| KernelError::internal("context state", e))?;
    c.execute(
        "UPDATE proc_conversations SET context = ?3 WHERE pid = ?1 AND id = ?2",
        params![pid, conv, text],
    )?;
    Ok(())
}

/// A segment row: the seed's record plus the last live message id at the
/// compaction (the live suffix a segment restore brings back).
#[derive(Debug, Clone)]
pub struct SegmentRow {
    pub segment: ConversationSegment,
    pub live_through_id: i64,
}

const SEG_COLS: &str = "id, conversation_id, generation, kind, from_message_id, to_message_id,
    archive_path, summary_message_id, created_at, live_through_id";

fn segment(r: &rusqlite::Row<'_>) -> rusqlite::Result<SegmentRow> {
    Ok(SegmentRow {
        segment: ConversationSegment {
            id: r.get(0)?,
            conversation_id: r.get(1)?,
            generation: r.get(2)?,
            kind: r.get(3)?,
            from_message_id: r.get(4)?,
            to_message_id: r.get(5)?,
            archive_path: r.get(6)?,
            summary_message_id: r.get(7)?,
            created_at: r.get(8)?,
        },
        live_through_id: r.get(9)?,
    })
}

pub fn insert_segment(c: &Connection, pid: &str, s: &SegmentRow) -> Result<(), KernelError> {
    let g = &s.segment;
    c.execute(
        &format!(
            "INSERT INTO proc_segments(pid, {SEG_COLS}) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11)"
        ),
        params![
            pid,
            g.id,
            g.conversation_id,
            g.generation,
            g.kind,
            g.from_message_id,
            g.to_message_id,
            g.archive_path,
            g.summary_message_id,
            g.created_at,
            s.live_through_id
        ],
    )?;
    Ok(())
}

pub fn segments(c: &Connection, pid: &str, conv: &str) -> Result<Vec<SegmentRow>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {SEG_COLS} FROM proc_segments WHERE pid = ?1 AND conversation_id = ?2
         ORDER BY created_at, id"
    ))?;
    let rows = stmt.query_map(params![pid, conv], segment)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn get_segment(c: &Connection, pid: &str, id: &str) -> Result<Option<SegmentRow>, KernelError> {
    opt(c.query_row(
        &format!("SELECT {SEG_COLS} FROM proc_segments WHERE pid = ?1 AND id = ?2"),
        params![pid, id],
        segment,
    ))
}

/// Forgets the measured pressure (a compaction made it stale).
pub fn clear_context(c: &Connection, pid: &str, conv: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE proc_conversations SET context = NULL WHERE pid = ?1 AND id = ?2",
        params![pid, conv],
    )?;
    Ok(())
}
