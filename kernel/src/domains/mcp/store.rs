//! The `mcp_servers` table (migration 70): one row per server a user
//! added; `(uid, url)` is unique, so adding a URL twice finds the first.

use std::collections::BTreeMap;

use gsv_protocol::mcp::McpTransportType;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::KernelError;

pub const MIGRATION: &str = "CREATE TABLE mcp_servers(
        server_id TEXT PRIMARY KEY,
        uid INTEGER NOT NULL,
        name TEXT NOT NULL,
        url TEXT NOT NULL,
        transport TEXT NOT NULL,
        headers_json TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        UNIQUE(uid, url));";

/// One added server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerRow {
    pub server_id: String,
    pub uid: i64,
    pub name: String,
    pub url: String,
    pub transport: McpTransportType,
    /// Sent with every request; never returned by a call.
    pub headers: BTreeMap<String, String>,
    pub created_at: i64,
    pub updated_at: i64,
}

const COLUMNS: &str = "server_id, uid, name, url, transport, headers_json, created_at, updated_at";

fn row(r: &Row<'_>) -> rusqlite::Result<ServerRow> {
    let transport: String = r.get(4)?;
    let headers: String = r.get(5)?;
    Ok(ServerRow {
        server_id: r.get(0)?,
        uid: r.get(1)?,
        name: r.get(2)?,
        url: r.get(3)?,
        transport: serde_json::from_value(serde_json::Value::String(transport)).unwrap_or_default(),
        headers: serde_json::from_str(&headers).unwrap_or_default(),
        created_at: r.get(6)?,
        updated_at: r.get(7)?,
    })
}

fn transport_name(t: McpTransportType) -> String {
    serde_json::to_value(t)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "auto".into())
}

/// Stores `s`, or returns the row `(uid, url)` already has.
pub fn insert_or_existing(c: &mut Connection, s: &ServerRow) -> Result<ServerRow, KernelError> {
    let tx = c.transaction()?;
    if let Some(existing) = by_url(&tx, s.uid, &s.url)? {
        return Ok(existing);
    }
    let headers = serde_json::to_string(&s.headers)
        .map_err(|e| KernelError::internal("mcp server headers", e))?;
    tx.execute(
        "INSERT INTO mcp_servers(server_id, uid, name, url, transport, headers_json, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![
            s.server_id,
            s.uid,
            s.name,
            s.url,
            transport_name(s.transport),
            headers,
            s.created_at,
            s.updated_at
        ],
    )?;
    tx.commit()?;
    Ok(s.clone())
}

pub fn by_url(c: &Connection, uid: i64, url: &str) -> Result<Option<ServerRow>, KernelError> {
    Ok(c.query_row(
        &format!("SELECT {COLUMNS} FROM mcp_servers WHERE uid = ?1 AND url = ?2"),
        params![uid, url],
        row,
    )
    .optional()?)
}

/// `uid`'s server `server_id`; another user's is `None`.
pub fn get(c: &Connection, uid: i64, server_id: &str) -> Result<Option<ServerRow>, KernelError> {
    Ok(c.query_row(
        &format!("SELECT {COLUMNS} FROM mcp_servers WHERE uid = ?1 AND server_id = ?2"),
        params![uid, server_id],
        row,
    )
    .optional()?)
}

pub fn list(c: &Connection, uid: i64) -> Result<Vec<ServerRow>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {COLUMNS} FROM mcp_servers WHERE uid = ?1 ORDER BY created_at, server_id"
    ))?;
    let rows = stmt.query_map([uid], row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn touch(c: &Connection, server_id: &str, now: i64) -> Result<(), KernelError> {
    c.execute(
        "UPDATE mcp_servers SET updated_at = ?2 WHERE server_id = ?1",
        params![server_id, now],
    )?;
    Ok(())
}

/// Whether `uid`'s row was there to delete.
pub fn delete(c: &Connection, uid: i64, server_id: &str) -> Result<bool, KernelError> {
    Ok(c.execute(
        "DELETE FROM mcp_servers WHERE uid = ?1 AND server_id = ?2",
        params![uid, server_id],
    )? > 0)
}
