//! Snapshots of workspaces: a row here per snapshot (who owns it, which
//! workspace, label, sizes) and the snapshot's tree in the workspace's own
//! dofs store (`snapshot_entries`, over chunks the store already holds, so
//! it is a GC root there and survives a kernel restart and a wsd that lost
//! its state). The calls are [`calls`].

use rusqlite::{Connection, params};

pub mod calls;
pub mod mirror;

use gsv_protocol::snapshot::SnapshotInfo;

use crate::db::{Migration, opt};
use crate::error::KernelError;

/// A `snapshots` row: the snapshot as the API shows it, and its owner.
#[derive(Debug, Clone)]
pub struct SnapshotRow {
    pub owner_uid: i64,
    pub info: SnapshotInfo,
}

const COLUMNS: &str =
    "snapshot_id, workspace_id, owner_uid, label, rev, files, bytes, new_bytes, created_at";

fn from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotRow> {
    Ok(SnapshotRow {
        owner_uid: r.get(2)?,
        info: SnapshotInfo {
            snapshot_id: r.get(0)?,
            workspace_id: r.get(1)?,
            label: r.get(3)?,
            rev: r.get(4)?,
            files: r.get(5)?,
            bytes: r.get(6)?,
            new_bytes: r.get(7)?,
            created_at: r.get(8)?,
        },
    })
}

pub fn insert(conn: &Connection, row: &SnapshotRow) -> Result<(), KernelError> {
    let i = &row.info;
    conn.execute(
        &format!("INSERT INTO snapshots({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"),
        params![
            i.snapshot_id,
            i.workspace_id,
            row.owner_uid,
            i.label,
            i.rev,
            i.files,
            i.bytes,
            i.new_bytes,
            i.created_at
        ],
    )?;
    Ok(())
}

pub fn get(conn: &Connection, id: &str) -> Result<Option<SnapshotRow>, KernelError> {
    opt(conn.query_row(
        &format!("SELECT {COLUMNS} FROM snapshots WHERE snapshot_id = ?1"),
        [id],
        from_sql,
    ))
}

/// A workspace's snapshots, oldest first (two taken in the same
/// millisecond in the order they were taken: their rowids).
pub fn list(conn: &Connection, workspace_id: &str) -> Result<Vec<SnapshotRow>, KernelError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {COLUMNS} FROM snapshots WHERE workspace_id = ?1 ORDER BY created_at, rowid"
    ))?;
    let rows = stmt.query_map([workspace_id], from_sql)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub fn count(conn: &Connection, workspace_id: &str) -> Result<u64, KernelError> {
    Ok(conn.query_row(
        "SELECT count(*) FROM snapshots WHERE workspace_id = ?1",
        [workspace_id],
        |r| r.get(0),
    )?)
}

pub fn delete(conn: &Connection, id: &str) -> Result<(), KernelError> {
    conn.execute("DELETE FROM snapshots WHERE snapshot_id = ?1", [id])?;
    Ok(())
}

/// This domain's table; listed in `domains::MIGRATIONS`. Never edit a
/// released migration, add one (ids 50..59 are this domain's).
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 50,
    name: "snapshots",
    sql: "CREATE TABLE snapshots(
            snapshot_id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL,
            owner_uid INTEGER NOT NULL,
            label TEXT,
            rev INTEGER NOT NULL,
            files INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            new_bytes INTEGER NOT NULL,
            created_at INTEGER NOT NULL);
         CREATE INDEX snapshots_by_workspace ON snapshots(workspace_id, created_at);",
}];
