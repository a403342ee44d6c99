//! The `pty` domain: interactive terminals in workspaces (`shell.pty.*`,
//! calls in [`calls`]).
//!
//! The terminal itself runs in the workspace's wsd (`Shell.startPty`),
//! whose durable exec log keeps its output (bounded: wsd's per-exec cap,
//! oldest first). The kernel keeps, per terminal, who owns it, its size,
//! how many output bytes it has seen, and a sparse index from output
//! offsets to log seqs, so an attach `after` a byte offset re-reads the log
//! from at most [`CHECKPOINT_BYTES`] before it. Each attached connection
//! has its own delivery task reading its own wsd subscription; wsd hands
//! each of them every event exactly once, replay then live.
//!
//! Each terminal also has a row (`ptys`: owner, workspace, command, size)
//! and its offset index (`pty_checkpoints`), so a restarted kernel finds
//! the terminals still running in a wsd that outlived it (a remote
//! backend, or a local one the previous kernel left, which it adopts) and
//! serves them from where its index ends. A crash leaves local wsd
//! children running; so does a graceful shutdown for a child a terminal
//! runs in (it stops the others). A terminal whose wsd did not survive
//! (killed, or another wsd binary now) answers `closed` after the restart
//! ([`Ptys::ended`]), not `not_found`.

pub mod calls;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use gsv_protocol::pty::{PtyInfo, PtyStatus};
use rusqlite::{Connection, params};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use wsd_client::WsdHandle;

use crate::db::Migration;
use crate::error::KernelError;

/// The `ptys` and `pty_checkpoints` tables. Never edit a released
/// migration; add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 130,
    name: "terminals",
    sql: "CREATE TABLE ptys(
            pty_id TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            workspace_id TEXT NOT NULL,
            command TEXT NOT NULL,
            cols INTEGER NOT NULL,
            rows INTEGER NOT NULL,
            created_at INTEGER NOT NULL);
         CREATE TABLE pty_checkpoints(
            pty_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            output_bytes INTEGER NOT NULL,
            PRIMARY KEY (pty_id, seq));",
}];

/// Output bytes between two entries of a terminal's offset index: the most
/// an attach re-reads from the log before its offset.
pub const CHECKPOINT_BYTES: u64 = 256 * 1024;

/// What a terminal's driver has learned from its log.
#[derive(Debug, Default)]
struct Progress {
    cols: u16,
    rows: u16,
    /// Output bytes seen so far.
    output_bytes: u64,
    /// `(seq, output bytes through that seq)`, ascending, one per
    /// [`CHECKPOINT_BYTES`] of output.
    checkpoints: Vec<(u64, u64)>,
    exit_code: Option<i32>,
    /// The signal `shell.pty.close` sent, for `shell.pty.exit`.
    close_signal: Option<wsd_client::Signal>,
}

impl Progress {
    /// Counts output event `seq`; the checkpoint it made, if any.
    fn record_output(&mut self, seq: u64, len: usize) -> Option<(u64, u64)> {
        self.output_bytes += len as u64;
        let last = self.checkpoints.last().map_or(0, |c| c.1);
        if self.output_bytes - last >= CHECKPOINT_BYTES {
            self.checkpoints.push((seq, self.output_bytes));
            return Some((seq, self.output_bytes));
        }
        None
    }

    fn checkpoint_before(&self, after: u64) -> (u64, u64) {
        let i = self.checkpoints.partition_point(|c| c.1 <= after);
        if i == 0 {
            (0, 0)
        } else {
            self.checkpoints[i - 1]
        }
    }
}

/// One terminal.
#[derive(Debug)]
pub struct Pty {
    pub id: String,
    pub owner_uid: i64,
    pub workspace_id: String,
    pub command: Vec<String>,
    pub created_at: i64,
    /// The workspace's wsd connection the terminal runs on.
    pub handle: WsdHandle,
    progress: Mutex<Progress>,
    /// Flips to true once the exit is known.
    exited: watch::Sender<bool>,
}

impl Pty {
    pub fn new(
        id: String,
        owner_uid: i64,
        workspace_id: String,
        command: Vec<String>,
        created_at: i64,
        handle: WsdHandle,
        (cols, rows): (u16, u16),
    ) -> Pty {
        Pty {
            id,
            owner_uid,
            workspace_id,
            command,
            created_at,
            handle,
            progress: Mutex::new(Progress {
                cols,
                rows,
                ..Progress::default()
            }),
            exited: watch::channel(false).0,
        }
    }

    /// Notes output event `seq` of `len` bytes (the driver, in seq
    /// order); the checkpoint it made, for the terminal's row.
    pub fn record_output(&self, seq: u64, len: usize) -> Option<(u64, u64)> {
        self.progress.lock().unwrap().record_output(seq, len)
    }

    /// Takes up the offset index a previous kernel kept (`(seq, output
    /// bytes)`, ascending): the driver goes on after its last entry.
    pub fn restore_index(&self, checkpoints: Vec<(u64, u64)>) {
        let mut p = self.progress.lock().unwrap();
        p.output_bytes = checkpoints.last().map_or(0, |c| c.1);
        p.checkpoints = checkpoints;
    }

    /// The last entry of the offset index (`(0, 0)`: none).
    pub fn last_checkpoint(&self) -> (u64, u64) {
        self.progress
            .lock()
            .unwrap()
            .checkpoints
            .last()
            .copied()
            .unwrap_or((0, 0))
    }

    /// The latest `(seq, offset)` at or before output offset `after`
    /// (`(0, 0)`: the start of the log).
    pub fn checkpoint_before(&self, after: u64) -> (u64, u64) {
        self.progress.lock().unwrap().checkpoint_before(after)
    }

    pub fn output_bytes(&self) -> u64 {
        self.progress.lock().unwrap().output_bytes
    }

    pub fn record_exit(&self, code: i32) {
        self.progress.lock().unwrap().exit_code = Some(code);
        self.exited.send_replace(true);
    }

    pub fn exit_code(&self) -> Option<i32> {
        self.progress.lock().unwrap().exit_code
    }

    /// A receiver that turns true once the program's exit is recorded.
    pub fn exited(&self) -> watch::Receiver<bool> {
        self.exited.subscribe()
    }

    pub fn status(&self) -> PtyStatus {
        match self.exit_code() {
            None => PtyStatus::Running,
            Some(_) => PtyStatus::Exited,
        }
    }

    pub fn set_size(&self, cols: u16, rows: u16) {
        let mut p = self.progress.lock().unwrap();
        (p.cols, p.rows) = (cols, rows);
    }

    pub fn note_close(&self, signal: wsd_client::Signal) {
        self.progress.lock().unwrap().close_signal = Some(signal);
    }

    /// The close signal's name when `code` says it ended the program.
    pub fn ending_signal(&self, code: i32) -> Option<String> {
        let p = self.progress.lock().unwrap();
        p.close_signal
            .filter(|s| code == 128 + s.number())
            .map(|s| s.name().to_owned())
    }

    pub fn info(&self) -> PtyInfo {
        let p = self.progress.lock().unwrap();
        PtyInfo {
            pty_id: self.id.clone(),
            workspace_id: self.workspace_id.clone(),
            command: self.command.clone(),
            status: match p.exit_code {
                None => PtyStatus::Running,
                Some(_) => PtyStatus::Exited,
            },
            cols: p.cols,
            rows: p.rows,
            output_bytes: p.output_bytes,
            exit_code: p.exit_code,
            created_at: self.created_at,
        }
    }
}

/// One connection's attachment to one terminal.
#[derive(Debug)]
struct Attachment {
    cancel: CancellationToken,
    /// Lets the delivery start once the call's answer is queued.
    start: Option<oneshot::Sender<()>>,
    generation: u64,
}

/// What a new attachment's delivery task gets from the registry.
#[derive(Debug)]
pub struct Attached {
    pub cancel: CancellationToken,
    pub start: oneshot::Receiver<()>,
    pub generation: u64,
}

/// Terminals by id, and who is attached to which.
#[derive(Debug, Default)]
pub struct Ptys {
    live: Mutex<HashMap<String, Arc<Pty>>>,
    /// Terminals that ended with the previous kernel (their wsd stopped
    /// with it), by id: their owner.
    ended: Mutex<HashMap<String, i64>>,
    /// By `(pty id, connection id)`.
    attachments: Mutex<HashMap<(String, String), Attachment>>,
    generations: AtomicU64,
    /// Cancelled at kernel shutdown: the drivers stop without recording
    /// an exit (the terminal may outlive this kernel in its wsd).
    stopping: CancellationToken,
}

impl Ptys {
    /// Notes that terminal `id` of `owner_uid` ended with the previous
    /// kernel.
    pub fn mark_ended(&self, id: &str, owner_uid: i64) {
        self.ended.lock().unwrap().insert(id.to_owned(), owner_uid);
    }

    /// Whether `uid`'s terminal `id` ended with the previous kernel.
    pub fn ended(&self, id: &str, uid: i64) -> bool {
        self.ended.lock().unwrap().get(id) == Some(&uid)
    }

    /// Stops every driver and attachment (kernel shutdown).
    pub fn stop_all(&self) {
        self.stopping.cancel();
        for a in self.attachments.lock().unwrap().values() {
            a.cancel.cancel();
        }
    }

    /// Cancelled once the kernel shuts down.
    pub fn stopping(&self) -> CancellationToken {
        self.stopping.clone()
    }

    pub fn insert(&self, pty: Arc<Pty>) {
        self.live.lock().unwrap().insert(pty.id.clone(), pty);
    }

    /// Terminal `id` if `uid` owns it; someone else's looks missing.
    pub fn get_owned(&self, id: &str, uid: i64) -> Option<Arc<Pty>> {
        self.live
            .lock()
            .unwrap()
            .get(id)
            .filter(|p| p.owner_uid == uid)
            .cloned()
    }

    /// Whether a terminal still runs in workspace `id` (its wsd must not
    /// be stopped as idle).
    pub fn running_in(&self, id: &str) -> bool {
        self.live
            .lock()
            .unwrap()
            .values()
            .any(|p| p.workspace_id == id && p.exit_code().is_none())
    }

    /// `uid`'s terminals, oldest first.
    pub fn list(&self, uid: i64) -> Vec<Arc<Pty>> {
        let mut v: Vec<Arc<Pty>> = self
            .live
            .lock()
            .unwrap()
            .values()
            .filter(|p| p.owner_uid == uid)
            .cloned()
            .collect();
        v.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        v
    }

    /// Forgets terminal `id` and stops its attachments.
    pub fn remove(&self, id: &str) {
        self.live.lock().unwrap().remove(id);
        self.attachments.lock().unwrap().retain(|(p, _), a| {
            let keep = p != id;
            if !keep {
                a.cancel.cancel();
            }
            keep
        });
    }

    /// Registers connection `connection_id`'s attachment to `pty_id`,
    /// stopping the one it replaces.
    pub fn attach(&self, pty_id: &str, connection_id: &str) -> Attached {
        let cancel = CancellationToken::new();
        let (start_tx, start) = oneshot::channel();
        let generation = self.generations.fetch_add(1, Ordering::Relaxed);
        let old = self.attachments.lock().unwrap().insert(
            (pty_id.to_owned(), connection_id.to_owned()),
            Attachment {
                cancel: cancel.clone(),
                start: Some(start_tx),
                generation,
            },
        );
        if let Some(old) = old {
            old.cancel.cancel();
        }
        Attached {
            cancel,
            start,
            generation,
        }
    }

    /// The answer that attached `connection_id` to `pty_id` is queued: its
    /// output may follow.
    pub fn start(&self, pty_id: &str, connection_id: &str) {
        let key = (pty_id.to_owned(), connection_id.to_owned());
        if let Some(a) = self.attachments.lock().unwrap().get_mut(&key)
            && let Some(s) = a.start.take()
        {
            let _ = s.send(());
        }
    }

    /// A delivery task ended: forget its attachment unless a newer one
    /// replaced it.
    pub fn detached(&self, pty_id: &str, connection_id: &str, generation: u64) {
        let key = (pty_id.to_owned(), connection_id.to_owned());
        let mut map = self.attachments.lock().unwrap();
        if map.get(&key).is_some_and(|a| a.generation == generation) {
            map.remove(&key);
        }
    }

    /// How many connections are attached to `pty_id`.
    pub fn attached_count(&self, pty_id: &str) -> usize {
        self.attachments
            .lock()
            .unwrap()
            .keys()
            .filter(|(p, _)| p == pty_id)
            .count()
    }
}

/// A terminal's row.
#[derive(Debug, Clone)]
pub struct PtyRow {
    pub id: String,
    pub owner_uid: i64,
    pub workspace_id: String,
    pub command: Vec<String>,
    pub cols: u16,
    pub rows: u16,
    pub created_at: i64,
}

pub fn insert_row(c: &Connection, row: &PtyRow) -> Result<(), KernelError> {
    let command = serde_json::to_string(&row.command)
        .map_err(|e| KernelError::internal("a terminal's command", e))?;
    c.execute(
        "INSERT INTO ptys(pty_id, owner_uid, workspace_id, command, cols, rows, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            row.id,
            row.owner_uid,
            row.workspace_id,
            command,
            row.cols,
            row.rows,
            row.created_at
        ],
    )?;
    Ok(())
}

pub fn set_size(c: &Connection, id: &str, cols: u16, rows: u16) -> Result<(), KernelError> {
    c.execute(
        "UPDATE ptys SET cols = ?2, rows = ?3 WHERE pty_id = ?1",
        params![id, cols, rows],
    )?;
    Ok(())
}

pub fn add_checkpoint(c: &Connection, id: &str, seq: u64, bytes: u64) -> Result<(), KernelError> {
    c.execute(
        "INSERT OR IGNORE INTO pty_checkpoints(pty_id, seq, output_bytes) VALUES (?1, ?2, ?3)",
        params![id, seq as i64, bytes as i64],
    )?;
    Ok(())
}

/// Forgets terminal `id` (its row and its index).
pub fn delete_row(c: &Connection, id: &str) -> Result<(), KernelError> {
    c.execute("DELETE FROM pty_checkpoints WHERE pty_id = ?1", [id])?;
    c.execute("DELETE FROM ptys WHERE pty_id = ?1", [id])?;
    Ok(())
}

/// Every terminal row, oldest first, with its offset index.
/// A terminal's offset index: `(seq, output bytes through it)`, ascending.
pub type OffsetIndex = Vec<(u64, u64)>;

pub fn all_rows(c: &Connection) -> Result<Vec<(PtyRow, OffsetIndex)>, KernelError> {
    let mut stmt = c.prepare(
        "SELECT pty_id, owner_uid, workspace_id, command, cols, rows, created_at
         FROM ptys ORDER BY created_at, pty_id",
    )?;
    let rows = stmt
        .query_map([], |r| {
            let command: String = r.get(3)?;
            Ok(PtyRow {
                id: r.get(0)?,
                owner_uid: r.get(1)?,
                workspace_id: r.get(2)?,
                command: serde_json::from_str(&command).unwrap_or_default(),
                cols: r.get(4)?,
                rows: r.get(5)?,
                created_at: r.get(6)?,
            })
        })?
        .collect::<Result<Vec<_>, _>>()?;
    let mut stmt =
        c.prepare("SELECT seq, output_bytes FROM pty_checkpoints WHERE pty_id = ?1 ORDER BY seq")?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let index = stmt
            .query_map([&row.id], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        out.push((row, index));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_index_finds_the_last_checkpoint_at_or_before_an_offset() {
        let mut p = Progress::default();
        let big = CHECKPOINT_BYTES as usize;
        for (seq, len) in [(1u64, 10usize), (2, big), (3, 5), (4, big)] {
            let _ = p.record_output(seq, len);
        }
        let c = CHECKPOINT_BYTES;
        assert_eq!(p.output_bytes, 15 + 2 * c);
        assert_eq!(p.checkpoints, vec![(2, 10 + c), (4, 15 + 2 * c)]);
        assert_eq!(p.checkpoint_before(0), (0, 0));
        assert_eq!(p.checkpoint_before(10 + c - 1), (0, 0));
        assert_eq!(p.checkpoint_before(10 + c), (2, 10 + c));
        assert_eq!(p.checkpoint_before(u64::MAX), (4, 15 + 2 * c));
    }
}
