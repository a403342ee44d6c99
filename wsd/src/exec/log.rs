//! The durable exec log: one SQLite database file, one writer thread, and a
//! small pool of read connections. Tables, durability settings and the
//! group-commit rule are described in `DESIGN.md`.
//!
//! The writer thread ([`ExecLogWriter`]) is the only connection that writes.
//! It owns the in-memory byte accounting used for eviction, so eviction
//! decisions never race with appends. Async callers talk to it over a bounded
//! channel and get each result back on a oneshot once the transaction that
//! holds their command has committed.
//!
//! Readers ([`ExecLogReader`]) are blocking; async callers run them on
//! `spawn_blocking`. WAL mode lets them read while the writer commits.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};
use wsd_sqlite::{
    CleanClose, JournalMode, LegacyBookkeeping, Migration, MigrationSet, OnDamage, Opened, Pragmas,
    Setup, Synchronous,
};

use super::{EXIT_LOST, EventKind, ExecError, ExecEvent};

/// Commands queued for the writer thread. Each live exec has at most
/// `PIPELINE_DEPTH` appends outstanding, so the queue holds at most
/// `max_concurrent * PIPELINE_DEPTH` events in practice; the capacity only
/// bounds bursts of control commands. A full queue makes senders wait.
pub(crate) const LOG_QUEUE_CAPACITY: usize = 256;
/// Most commands committed in one transaction (one "group").
pub(crate) const GROUP_MAX_COMMANDS: usize = 256;
/// Most payload bytes committed in one transaction.
pub(crate) const GROUP_MAX_BYTES: usize = 8 * 1024 * 1024;
/// A replay page ends once it holds this many payload bytes ...
pub(crate) const REPLAY_PAGE_BYTES: usize = 256 * 1024;
/// ... or this many events.
pub(crate) const REPLAY_PAGE_EVENTS: usize = 256;
/// Read connections kept open between replays; more are opened on demand
/// and closed after use.
const IDLE_READERS: usize = 4;
/// How long a connection waits on a lock held by another connection
/// (checkpoints, a reader upgrading) before failing with `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// WAL pages written between automatic checkpoints (64 MiB with 4 KiB
/// pages; SQLite's default of 1000 pages is 4 MiB). Heavy output evicts and
/// rewrites the same pages over and over: the wider the window, the more of
/// those rewrites a checkpoint copies once instead of many times. It took
/// 1 GiB of output from ~140 to ~200-300 MiB/s detached and from ~80-100 to
/// ~160 MiB/s with a live reader, at no cost to a short command (its few
/// pages are copied as before). The WAL file grows to ~64 MiB under heavy
/// output.
const WAL_AUTOCHECKPOINT_PAGES: u32 = 16 * 1024;
/// The log's migrations (owner `exec_log`); logs written before
/// `wsd-sqlite` counted them in `PRAGMA user_version`. Migration 1 tolerates
/// its tables existing: version 1 created them before stamping its version.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "exec tables",
        sql: "
        CREATE TABLE IF NOT EXISTS exec_meta (
            exec_id    TEXT PRIMARY KEY,
            generation INTEGER NOT NULL,
            started_at INTEGER NOT NULL,
            exited_at  INTEGER,
            exit_code  INTEGER,
            first_seq  INTEGER NOT NULL,
            last_seq   INTEGER NOT NULL,
            bytes      INTEGER NOT NULL
        );
        CREATE TABLE IF NOT EXISTS exec_event (
            exec_id TEXT NOT NULL,
            seq     INTEGER NOT NULL,
            kind    INTEGER NOT NULL,
            data    BLOB NOT NULL,
            PRIMARY KEY (exec_id, seq)
        );",
    },
    // The process group of each exec, so a restarted daemon can find the
    // commands a lost exec may have left running (NULL for older execs).
    Migration {
        version: 2,
        name: "process groups",
        sql: "ALTER TABLE exec_meta ADD COLUMN pgid INTEGER;
              ALTER TABLE exec_meta ADD COLUMN leader_start INTEGER;",
    },
];

/// Connection settings of the writer and the readers. WAL: readers never
/// block the writer. NORMAL: a commit does not fsync; the WAL is synced at
/// checkpoints, so a power loss may drop the last few groups but never
/// corrupts the log. An exec log is worth losing a few milliseconds of
/// output for a commit cost in microseconds.
const PRAGMAS: Pragmas = Pragmas {
    journal_mode: JournalMode::Wal,
    synchronous: Synchronous::Normal,
    busy_timeout: BUSY_TIMEOUT,
    foreign_keys: false,
    wal_autocheckpoint: Some(WAL_AUTOCHECKPOINT_PAGES),
    cache_kib: None,
    stable_query_plans: false,
    statement_cache: None,
};

/// A damaged log is set aside: it is not derived from anything, but a
/// daemon that cannot run commands because old output is unreadable helps
/// no one; the old file is kept for a person.
const SETUP: Setup<'static> = Setup {
    what: "the exec log",
    pragmas: PRAGMAS,
    application_id: None,
    migrations: &[MigrationSet {
        owner: "exec_log",
        migrations: MIGRATIONS,
        legacy: LegacyBookkeeping::UserVersion,
    }],
    on_damage: OnDamage::SetAside,
};

const KIND_STDOUT: i64 = 0;
const KIND_STDERR: i64 = 1;
const KIND_EXIT: i64 = 2;

/// Byte caps enforced by the writer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogCaps {
    pub per_exec: u64,
    pub global: u64,
}

/// Outcome of deleting a finished exec's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeleteOutcome {
    Deleted,
    NotFound,
    /// The id belongs to an exec that has no exit event yet; nothing was
    /// deleted (the caller must go through the live exec instead).
    Live,
}

/// An exec's row in `exec_meta`, as a reader sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MetaRow {
    pub generation: u64,
    pub finished: bool,
    pub first_seq: u64,
    pub last_seq: u64,
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn kind_code(kind: &EventKind) -> i64 {
    match kind {
        EventKind::Stdout(_) => KIND_STDOUT,
        EventKind::Stderr(_) => KIND_STDERR,
        EventKind::Exit(_) => KIND_EXIT,
    }
}

fn decode_event(id: &str, seq: i64, kind: i64, data: Vec<u8>) -> Result<ExecEvent, ExecError> {
    let kind = match kind {
        KIND_STDOUT => EventKind::Stdout(data),
        KIND_STDERR => EventKind::Stderr(data),
        KIND_EXIT => {
            let bytes: [u8; 4] = data.as_slice().try_into().map_err(|_| {
                ExecError::Storage(format!("exec {id:?} seq {seq}: exit row is not 4 bytes"))
            })?;
            EventKind::Exit(i32::from_le_bytes(bytes))
        }
        other => {
            return Err(ExecError::Storage(format!(
                "exec {id:?} seq {seq}: unknown kind {other}"
            )));
        }
    };
    Ok(ExecEvent {
        id: id.to_owned(),
        seq: seq as u64,
        kind,
        rev: 0,
    })
}

enum Command {
    Begin {
        id: String,
        reply: oneshot::Sender<Result<u64, ExecError>>,
    },
    Append {
        event: ExecEvent,
        reply: oneshot::Sender<Result<ExecEvent, ExecError>>,
    },
    Finish {
        id: String,
        seq: u64,
        code: i32,
        reply: oneshot::Sender<Result<(), ExecError>>,
    },
    Delete {
        id: String,
        generation: u64,
        reply: oneshot::Sender<Result<DeleteOutcome, ExecError>>,
    },
    /// Delete a finished exec's log with the next group (answered at once,
    /// without a transaction of its own).
    Forget {
        id: String,
        reply: oneshot::Sender<Result<DeleteOutcome, ExecError>>,
    },
    Sweep {
        cutoff_ms: i64,
        reply: oneshot::Sender<Result<usize, ExecError>>,
    },
    /// Record the process group of a spawned exec (no reply: it commits
    /// with the exec's first events).
    Spawned {
        id: String,
        generation: u64,
        pgid: i32,
        leader_start: Option<u64>,
    },
    /// Commit what is queued before it, close the database and stop.
    Close { reply: oneshot::Sender<()> },
}

impl Command {
    fn payload_len(&self) -> usize {
        match self {
            Command::Append { event, .. } => event.kind.payload_len(),
            _ => 0,
        }
    }
}

/// A command's result, held until its group commits.
enum Reply {
    Begin(
        oneshot::Sender<Result<u64, ExecError>>,
        Result<u64, ExecError>,
    ),
    Append(
        oneshot::Sender<Result<ExecEvent, ExecError>>,
        Result<ExecEvent, ExecError>,
    ),
    Unit(
        oneshot::Sender<Result<(), ExecError>>,
        Result<(), ExecError>,
    ),
    Delete(
        oneshot::Sender<Result<DeleteOutcome, ExecError>>,
        Result<DeleteOutcome, ExecError>,
    ),
    Sweep(
        oneshot::Sender<Result<usize, ExecError>>,
        Result<usize, ExecError>,
    ),
    /// A command nobody waits on.
    None,
}

impl Reply {
    /// Sends the result, or `failed` instead of an `Ok` when the group's
    /// commit failed. A receiver that went away is not an error: its exec
    /// is being torn down.
    fn send(self, failed: Option<&str>) {
        let fail = |msg: &str| ExecError::Storage(format!("commit failed: {msg}"));
        match self {
            Reply::Begin(tx, r) => {
                drop(tx.send(r.and_then(|v| failed.map_or(Ok(v), |m| Err(fail(m))))))
            }
            Reply::Append(tx, r) => {
                drop(tx.send(r.and_then(|v| failed.map_or(Ok(v), |m| Err(fail(m))))))
            }
            Reply::Unit(tx, r) => {
                drop(tx.send(r.and_then(|v| failed.map_or(Ok(v), |m| Err(fail(m))))))
            }
            Reply::Delete(tx, r) => {
                drop(tx.send(r.and_then(|v| failed.map_or(Ok(v), |m| Err(fail(m))))))
            }
            Reply::Sweep(tx, r) => {
                drop(tx.send(r.and_then(|v| failed.map_or(Ok(v), |m| Err(fail(m))))))
            }
            Reply::None => {}
        }
    }
}

/// The writer's view of one exec: the `exec_meta` row plus a dirty flag.
#[derive(Debug, Clone)]
struct ExecAccount {
    generation: u64,
    started_at: i64,
    exited_at: Option<i64>,
    exit_code: Option<i32>,
    /// Lowest retained seq; `last_seq + 1` when nothing is retained.
    first_seq: u64,
    /// Highest seq written, 0 before the first event.
    last_seq: u64,
    /// Payload bytes of the retained stdout/stderr rows.
    bytes: u64,
    /// The command's process group, once spawned.
    pgid: Option<i32>,
    /// The group leader's start time (`/proc/<pgid>/stat` field 22, clock
    /// ticks since boot): a pid that now names another process has another
    /// start time.
    leader_start: Option<u64>,
    dirty: bool,
}

/// Handle to the writer thread. Cloning shares the thread; the thread exits
/// once every handle is dropped and its queue is drained.
#[derive(Debug, Clone)]
pub(crate) struct ExecLogWriter {
    tx: mpsc::Sender<Command>,
    path: PathBuf,
    /// Logs forgotten but not yet deleted (see [`ExecLogWriter::forget_finished`]).
    forgotten: ForgottenLogs,
    /// Transactions the writer has run (groups); read by the tests that
    /// check batching.
    #[cfg_attr(not(test), allow(dead_code))]
    groups: Arc<AtomicU64>,
}

/// The logs of finished execs that were disposed of but whose deletion has
/// not committed yet (id → generation). A dispose of a finished exec is
/// answered at once and its rows go with the next group: readers treat a
/// log listed here as gone. The writer adds an entry before it answers the
/// dispose and removes it once the deletion has committed.
#[derive(Debug, Clone, Default)]
pub(crate) struct ForgottenLogs(Arc<Mutex<HashMap<String, u64>>>);

impl ForgottenLogs {
    fn generation(&self, id: &str) -> Option<u64> {
        self.0
            .lock()
            .expect("forgotten logs poisoned")
            .get(id)
            .copied()
    }

    fn insert(&self, id: &str, generation: u64) {
        self.0
            .lock()
            .expect("forgotten logs poisoned")
            .insert(id.to_owned(), generation);
    }

    /// Drops the entries of these deletions, now committed.
    fn committed(&self, deleted: &[(String, u64)]) {
        let mut map = self.0.lock().expect("forgotten logs poisoned");
        for (id, generation) in deleted {
            if map.get(id) == Some(generation) {
                map.remove(id);
            }
        }
    }
}

/// The process group a lost exec ran in, as the previous daemon recorded
/// it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LostGroup {
    pub id: String,
    pub pgid: i32,
    pub leader_start: u64,
}

/// What `open` found and repaired.
#[derive(Debug, Default)]
pub(crate) struct OpenReport {
    /// Execs that were running when the previous daemon stopped; each got an
    /// `EXIT_LOST` exit event.
    pub lost: Vec<String>,
    /// The recorded process groups of the lost execs (those spawned far
    /// enough to record one): their commands may still be running.
    pub groups: Vec<LostGroup>,
    /// Finished execs whose logs were kept.
    pub retained: usize,
}

impl ExecLogWriter {
    /// Opens (or creates) the log at `path`, gives every exec left running by
    /// a previous daemon its `EXIT_LOST` exit event, and starts the writer
    /// thread. Blocks for the schema check and that repair; call it once at
    /// startup.
    pub(crate) fn open(
        path: &Path,
        caps: LogCaps,
    ) -> Result<(ExecLogWriter, OpenReport), ExecError> {
        let opened = wsd_sqlite::open(path, &SETUP)?;
        if let Some(aside) = &opened.set_aside {
            // Not derived from anything: the old output is lost to the
            // daemon (kept aside for a person), which must be said loudly.
            tracing::warn!(
                exec_log = %path.display(),
                moved_to = %aside.moved_to.display(),
                reason = %aside.reason,
                "the exec log was damaged and started empty; earlier execs' output and exit codes are gone"
            );
        }
        let Opened {
            conn, clean_close, ..
        } = opened;

        let forgotten = ForgottenLogs::default();
        let mut state = WriterState {
            conn,
            clean_close: Some(clean_close),
            caps,
            execs: HashMap::new(),
            global_bytes: 0,
            next_generation: 1,
            groups: Arc::new(AtomicU64::new(0)),
            forgotten: forgotten.clone(),
            to_delete: Vec::new(),
        };
        state.load_accounts()?;
        let report = state.mark_lost()?;

        let (tx, rx) = mpsc::channel(LOG_QUEUE_CAPACITY);
        let groups = state.groups.clone();
        std::thread::Builder::new()
            .name("wsd-exec-log".into())
            .spawn(move || state.run(rx))
            .map_err(|e| ExecError::io("starting the exec log writer thread", e))?;
        Ok((
            ExecLogWriter {
                tx,
                path: path.to_owned(),
                forgotten,
                groups,
            },
            report,
        ))
    }

    /// A reader of this log that treats forgotten logs as gone.
    pub(crate) fn reader(&self) -> ExecLogReader {
        ExecLogReader {
            path: self.path.clone(),
            forgotten: self.forgotten.clone(),
            idle: Mutex::new(Vec::new()),
            closed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    async fn call<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T, ExecError>>) -> Command,
    ) -> Result<T, ExecError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).await.map_err(|_| writer_gone())?;
        rx.await.map_err(|_| writer_gone())?
    }

    /// Starts the log of a new exec, replacing a finished exec's log under
    /// the same id. Returns the exec's generation (a number unique within
    /// this database, so a reader can tell a reused id from the exec it was
    /// reading). An unfinished exec under that id is `EEXEC_BUSY`.
    pub(crate) async fn begin(&self, id: &str) -> Result<u64, ExecError> {
        self.call(|reply| Command::Begin {
            id: id.to_owned(),
            reply,
        })
        .await
    }

    /// Queues an event and returns at once; the receiver yields the event
    /// back once it is committed. Waits only while the queue is full.
    pub(crate) async fn append(
        &self,
        event: ExecEvent,
    ) -> Result<oneshot::Receiver<Result<ExecEvent, ExecError>>, ExecError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Command::Append { event, reply })
            .await
            .map_err(|_| writer_gone())?;
        Ok(rx)
    }

    /// Writes the exit event (seq `seq`) and marks the exec finished, which
    /// starts its TTL.
    pub(crate) async fn finish(&self, id: &str, seq: u64, code: i32) -> Result<(), ExecError> {
        self.call(|reply| Command::Finish {
            id: id.to_owned(),
            seq,
            code,
            reply,
        })
        .await
    }

    /// Commits everything queued so far, closes the database and stops
    /// the writer thread; later calls fail with "writer stopped". Returns
    /// once the database is closed.
    pub(crate) async fn close(&self) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Command::Close { reply }).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Records the process group of exec `id` (this `generation`) and its
    /// leader's start time. Queued behind `begin`; it commits with the next
    /// group. The runner queues it with the exec's first output, or once
    /// the command has run 20 ms, never for a command that exited sooner,
    /// so a crash in that window loses it (the exec is then logged as lost
    /// without its group being killed).
    pub(crate) async fn spawned(
        &self,
        id: &str,
        generation: u64,
        pgid: i32,
        leader_start: Option<u64>,
    ) -> Result<(), ExecError> {
        self.tx
            .send(Command::Spawned {
                id: id.to_owned(),
                generation,
                pgid,
                leader_start,
            })
            .await
            .map_err(|_| writer_gone())
    }

    /// Transactions run so far.
    #[cfg(test)]
    pub(crate) fn groups_committed(&self) -> u64 {
        self.groups.load(Ordering::Relaxed)
    }

    /// Forgets a finished exec's log: answered without a transaction of
    /// its own (readers see the log gone at once), its rows are deleted
    /// with the next group the writer commits, a sweep's at the latest. A
    /// crash before that leaves the log to its TTL. An unfinished exec is
    /// left alone (`DeleteOutcome::Live`).
    pub(crate) async fn forget_finished(&self, id: &str) -> Result<DeleteOutcome, ExecError> {
        self.call(|reply| Command::Forget {
            id: id.to_owned(),
            reply,
        })
        .await
    }

    /// Deletes the log of exactly this generation of `id`, finished or not.
    /// The runner uses it when its exec is disposed; the generation check
    /// keeps it from deleting a newer exec that reused the id.
    pub(crate) async fn delete_generation(
        &self,
        id: &str,
        generation: u64,
    ) -> Result<DeleteOutcome, ExecError> {
        self.call(|reply| Command::Delete {
            id: id.to_owned(),
            generation,
            reply,
        })
        .await
    }

    /// Deletes every finished exec that exited at or before `cutoff_ms`
    /// (unix milliseconds). Returns how many were deleted.
    pub(crate) async fn sweep(&self, cutoff_ms: i64) -> Result<usize, ExecError> {
        self.call(|reply| Command::Sweep { cutoff_ms, reply }).await
    }
}

fn writer_gone() -> ExecError {
    ExecError::Storage("the exec log writer thread has stopped".into())
}

struct WriterState {
    conn: Connection,
    /// Stamps the log clean once `conn` has closed (declared after it, so
    /// an early drop also closes the connection first).
    clean_close: Option<CleanClose>,
    caps: LogCaps,
    execs: HashMap<String, ExecAccount>,
    global_bytes: u64,
    next_generation: u64,
    groups: Arc<AtomicU64>,
    /// Shared with the readers: what `to_delete` holds.
    forgotten: ForgottenLogs,
    /// Forgotten logs (id, generation) whose rows go with the next group.
    to_delete: Vec<(String, u64)>,
}

impl WriterState {
    fn load_accounts(&mut self) -> Result<(), ExecError> {
        let mut stmt = self.conn.prepare(
            "SELECT exec_id, generation, started_at, exited_at, exit_code, first_seq, last_seq, bytes,
                    pgid, leader_start
             FROM exec_meta",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                ExecAccount {
                    generation: r.get::<_, i64>(1)? as u64,
                    started_at: r.get(2)?,
                    exited_at: r.get(3)?,
                    exit_code: r.get(4)?,
                    first_seq: r.get::<_, i64>(5)? as u64,
                    last_seq: r.get::<_, i64>(6)? as u64,
                    bytes: r.get::<_, i64>(7)? as u64,
                    pgid: r.get(8)?,
                    leader_start: r.get::<_, Option<i64>>(9)?.map(|t| t as u64),
                    dirty: false,
                },
            ))
        })?;
        let mut execs = HashMap::new();
        for row in rows {
            let (id, acct) = row?;
            execs.insert(id, acct);
        }
        drop(stmt);
        self.global_bytes = execs.values().map(|a| a.bytes).sum();
        self.next_generation = execs.values().map(|a| a.generation + 1).max().unwrap_or(1);
        self.execs = execs;
        Ok(())
    }

    /// Gives every unfinished exec an `EXIT_LOST` exit event: its runner
    /// died with the previous daemon, and without this a reader attached to
    /// it would wait forever.
    fn mark_lost(&mut self) -> Result<OpenReport, ExecError> {
        let mut report = OpenReport::default();
        let mut lost: Vec<String> = self
            .execs
            .iter()
            .filter(|(_, a)| a.exited_at.is_none())
            .map(|(id, _)| id.clone())
            .collect();
        lost.sort();
        report.retained = self.execs.len() - lost.len();
        report.groups = lost
            .iter()
            .filter_map(|id| {
                let a = &self.execs[id];
                Some(LostGroup {
                    id: id.clone(),
                    pgid: a.pgid?,
                    leader_start: a.leader_start?,
                })
            })
            .collect();
        if lost.is_empty() {
            return Ok(report);
        }
        self.conn.execute_batch("BEGIN IMMEDIATE")?;
        let result = (|| {
            for id in &lost {
                let seq = self.execs[id].last_seq + 1;
                self.apply_finish(id, seq, EXIT_LOST)?;
            }
            self.flush_accounts()
        })();
        match result.and_then(|()| Ok(self.conn.execute_batch("COMMIT")?)) {
            Ok(()) => {
                report.lost = lost;
                Ok(report)
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        // Group commit: take every command already queued (up to the group
        // caps) and commit them in one transaction. There is no timed window:
        // while one group commits, new events queue up and form the next
        // group, so batching grows with load and an idle log commits a lone
        // event at once instead of waiting for company.
        let mut closed = None;
        while let Some(first) = rx.blocking_recv() {
            if let Command::Close { reply } = first {
                closed = Some(reply);
                break;
            }
            let mut bytes = first.payload_len();
            let mut group = vec![first];
            while group.len() < GROUP_MAX_COMMANDS && bytes < GROUP_MAX_BYTES {
                match rx.try_recv() {
                    Ok(Command::Close { reply }) => {
                        closed = Some(reply);
                        break;
                    }
                    Ok(cmd) => {
                        bytes += cmd.payload_len();
                        group.push(cmd);
                    }
                    Err(_) => break,
                }
            }
            self.apply_group(group);
            if closed.is_some() {
                break;
            }
        }
        if closed.is_some() && !self.to_delete.is_empty() {
            // A clean close deletes the forgotten logs first.
            self.apply_group(Vec::new());
        }
        tracing::debug!(
            groups = self.groups.load(Ordering::Relaxed),
            "exec log writer stopped"
        );
        // Closing the last connection checkpoints the WAL and removes the
        // `-wal` and `-shm` files (the readers closed theirs first).
        let WriterState {
            conn, clean_close, ..
        } = self;
        match clean_close {
            Some(clean_close) => clean_close.close(conn),
            None => drop(conn),
        }
        if let Some(reply) = closed {
            let _ = reply.send(());
        }
    }

    fn apply_group(&mut self, group: Vec<Command>) {
        if !group.is_empty() && group.iter().all(|c| matches!(c, Command::Forget { .. })) {
            // Nothing to commit now: the deletions ride on the next group.
            for cmd in group {
                self.apply(cmd).send(None);
            }
            return;
        }
        self.groups.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.conn.execute_batch("BEGIN IMMEDIATE") {
            let msg = e.to_string();
            tracing::error!(error = %msg, "exec log: cannot begin a transaction");
            for cmd in group {
                fail_command(cmd, &msg);
            }
            return;
        }
        let replies: Vec<Reply> = group.into_iter().map(|cmd| self.apply(cmd)).collect();
        let to_delete = std::mem::take(&mut self.to_delete);
        let committed = self
            .delete_forgotten(&to_delete)
            .and_then(|()| self.flush_accounts())
            .and_then(|()| Ok(self.conn.execute_batch("COMMIT")?));
        match committed {
            Ok(()) => {
                self.forgotten.committed(&to_delete);
                replies.into_iter().for_each(|r| r.send(None));
            }
            Err(e) => {
                let msg = e.to_string();
                tracing::error!(error = %msg, "exec log: group commit failed");
                let _ = self.conn.execute_batch("ROLLBACK");
                // The in-memory accounts described the rolled-back state.
                if let Err(e) = self.load_accounts() {
                    tracing::error!(error = %e, "exec log: reloading accounts after a rollback failed");
                }
                // Still forgotten: deleted with the next group.
                self.to_delete = to_delete;
                replies.into_iter().for_each(|r| r.send(Some(&msg)));
            }
        }
    }

    /// Deletes the forgotten logs that are still the generation that was
    /// forgotten (a reused id's new exec replaced the old log already).
    fn delete_forgotten(&mut self, to_delete: &[(String, u64)]) -> Result<(), ExecError> {
        for (id, generation) in to_delete {
            if self
                .execs
                .get(id)
                .is_some_and(|a| a.generation == *generation)
            {
                self.delete_exec(id)?;
            }
        }
        Ok(())
    }

    fn apply(&mut self, cmd: Command) -> Reply {
        match cmd {
            Command::Begin { id, reply } => {
                let r = self.apply_begin(&id);
                Reply::Begin(reply, r)
            }
            Command::Append { event, reply } => {
                let r = self.apply_append(&event);
                Reply::Append(reply, r.map(|()| event))
            }
            Command::Finish {
                id,
                seq,
                code,
                reply,
            } => {
                let r = self.apply_finish(&id, seq, code);
                Reply::Unit(reply, r)
            }
            Command::Delete {
                id,
                generation,
                reply,
            } => {
                let r = match self.execs.get(&id) {
                    Some(a) if a.generation == generation => {
                        self.delete_exec(&id).map(|()| DeleteOutcome::Deleted)
                    }
                    _ => Ok(DeleteOutcome::NotFound),
                };
                Reply::Delete(reply, r)
            }
            Command::Forget { id, reply } => {
                let outcome = match self.execs.get(&id) {
                    None => DeleteOutcome::NotFound,
                    Some(a) if self.forgotten.generation(&id) == Some(a.generation) => {
                        DeleteOutcome::NotFound
                    }
                    Some(a) if a.exited_at.is_none() => DeleteOutcome::Live,
                    Some(a) => {
                        // Listed before the answer: a read after it sees
                        // the log gone.
                        self.forgotten.insert(&id, a.generation);
                        self.to_delete.push((id, a.generation));
                        DeleteOutcome::Deleted
                    }
                };
                // The outcome does not depend on a commit: answered now.
                drop(reply.send(Ok(outcome)));
                Reply::None
            }
            // `run` takes it out of the queue before grouping; answering it
            // here too keeps the caller from waiting forever.
            Command::Close { reply } => {
                let _ = reply.send(());
                Reply::None
            }
            Command::Spawned {
                id,
                generation,
                pgid,
                leader_start,
            } => {
                if let Some(a) = self.execs.get_mut(&id)
                    && a.generation == generation
                {
                    a.pgid = Some(pgid);
                    a.leader_start = leader_start;
                    a.dirty = true;
                }
                Reply::None
            }
            Command::Sweep { cutoff_ms, reply } => {
                let expired: Vec<String> = self
                    .execs
                    .iter()
                    .filter(|(_, a)| a.exited_at.is_some_and(|t| t <= cutoff_ms))
                    .map(|(id, _)| id.clone())
                    .collect();
                let r = expired
                    .iter()
                    .try_for_each(|id| self.delete_exec(id))
                    .map(|()| expired.len());
                Reply::Sweep(reply, r)
            }
        }
    }

    fn apply_begin(&mut self, id: &str) -> Result<u64, ExecError> {
        if let Some(a) = self.execs.get(id) {
            if a.exited_at.is_none() {
                return Err(ExecError::Busy { id: id.to_owned() });
            }
            self.delete_exec(id)?;
        }
        let generation = self.next_generation;
        self.next_generation += 1;
        self.execs.insert(
            id.to_owned(),
            ExecAccount {
                generation,
                started_at: now_ms(),
                exited_at: None,
                exit_code: None,
                first_seq: 1,
                last_seq: 0,
                bytes: 0,
                pgid: None,
                leader_start: None,
                dirty: true,
            },
        );
        Ok(generation)
    }

    fn apply_append(&mut self, event: &ExecEvent) -> Result<(), ExecError> {
        let id = event.id.as_str();
        let acct = self
            .execs
            .get(id)
            .ok_or_else(|| ExecError::NotFound { id: id.to_owned() })?;
        if acct.exited_at.is_some() || event.seq != acct.last_seq + 1 {
            return Err(ExecError::Storage(format!(
                "exec {id:?}: append of seq {} after seq {}{}",
                event.seq,
                acct.last_seq,
                if acct.exited_at.is_some() {
                    " and its exit"
                } else {
                    ""
                }
            )));
        }
        let (data, size) = match &event.kind {
            EventKind::Stdout(d) | EventKind::Stderr(d) => (d.as_slice(), d.len() as u64),
            EventKind::Exit(_) => {
                return Err(ExecError::Storage("exit events go through finish".into()));
            }
        };
        // The newest event is always kept, even if it alone exceeds a cap.
        if acct.bytes + size > self.caps.per_exec {
            self.evict_oldest(id, acct.bytes + size - self.caps.per_exec)?;
        }
        while self.global_bytes + size > self.caps.global {
            let Some(victim) = self.global_victim() else {
                break;
            };
            let freed = self.evict_oldest(&victim, self.global_bytes + size - self.caps.global)?;
            if freed == 0 {
                break;
            }
        }
        self.conn
            .prepare_cached(
                "INSERT INTO exec_event (exec_id, seq, kind, data) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![id, event.seq as i64, kind_code(&event.kind), data])?;
        let acct = self.execs.get_mut(id).expect("checked above");
        acct.last_seq = event.seq;
        acct.bytes += size;
        acct.dirty = true;
        self.global_bytes += size;
        Ok(())
    }

    fn apply_finish(&mut self, id: &str, seq: u64, code: i32) -> Result<(), ExecError> {
        let acct = self
            .execs
            .get_mut(id)
            .ok_or_else(|| ExecError::NotFound { id: id.to_owned() })?;
        if acct.exited_at.is_some() || seq != acct.last_seq + 1 {
            return Err(ExecError::Storage(format!(
                "exec {id:?}: exit at seq {seq} after seq {} (already finished: {})",
                acct.last_seq,
                acct.exited_at.is_some()
            )));
        }
        self.conn
            .prepare_cached(
                "INSERT INTO exec_event (exec_id, seq, kind, data) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![
                id,
                seq as i64,
                KIND_EXIT,
                code.to_le_bytes().as_slice()
            ])?;
        acct.last_seq = seq;
        acct.exited_at = Some(now_ms());
        acct.exit_code = Some(code);
        acct.dirty = true;
        Ok(())
    }

    /// The exec whose oldest output goes first when the global cap is hit:
    /// finished execs before live ones, the earliest to finish (or start)
    /// first. Exit rows are never evicted, so only execs with retained
    /// output bytes qualify.
    fn global_victim(&self) -> Option<String> {
        self.execs
            .iter()
            .filter(|(_, a)| a.bytes > 0)
            .min_by_key(|(_, a)| match a.exited_at {
                Some(t) => (0, t, a.generation),
                None => (1, a.started_at, a.generation),
            })
            .map(|(id, _)| id.clone())
    }

    /// Deletes the oldest output rows of `id` until at least `need` payload
    /// bytes are freed or no output row is left. Keeps the retained rows a
    /// contiguous suffix `first_seq..=last_seq`. Returns the bytes freed.
    fn evict_oldest(&mut self, id: &str, need: u64) -> Result<u64, ExecError> {
        let acct = &self.execs[id];
        // An exit row is the last row and is never evicted.
        let last_output = if acct.exited_at.is_some() {
            acct.last_seq - 1
        } else {
            acct.last_seq
        };
        let mut freed = 0u64;
        let mut new_first = acct.first_seq;
        {
            let mut stmt = self.conn.prepare_cached(
                "SELECT seq, length(data) FROM exec_event
                 WHERE exec_id = ?1 AND seq >= ?2 AND seq <= ?3 ORDER BY seq",
            )?;
            let mut rows = stmt.query(params![id, acct.first_seq as i64, last_output as i64])?;
            while freed < need {
                let Some(row) = rows.next()? else { break };
                let seq: i64 = row.get(0)?;
                let len: i64 = row.get(1)?;
                freed += len as u64;
                new_first = seq as u64 + 1;
            }
        }
        if new_first == acct.first_seq {
            return Ok(0);
        }
        self.conn
            .prepare_cached("DELETE FROM exec_event WHERE exec_id = ?1 AND seq >= ?2 AND seq < ?3")?
            .execute(params![id, acct.first_seq as i64, new_first as i64])?;
        tracing::debug!(
            exec = id,
            freed,
            first_seq = new_first,
            "exec log: evicted oldest events"
        );
        let acct = self.execs.get_mut(id).expect("looked up above");
        acct.first_seq = new_first;
        acct.bytes -= freed;
        acct.dirty = true;
        self.global_bytes -= freed;
        Ok(freed)
    }

    fn delete_exec(&mut self, id: &str) -> Result<(), ExecError> {
        self.conn
            .prepare_cached("DELETE FROM exec_event WHERE exec_id = ?1")?
            .execute([id])?;
        self.conn
            .prepare_cached("DELETE FROM exec_meta WHERE exec_id = ?1")?
            .execute([id])?;
        if let Some(a) = self.execs.remove(id) {
            self.global_bytes -= a.bytes;
        }
        Ok(())
    }

    /// Writes the `exec_meta` rows changed in this group, once per group
    /// rather than once per event.
    fn flush_accounts(&mut self) -> Result<(), ExecError> {
        let mut stmt = self.conn.prepare_cached(
            "INSERT OR REPLACE INTO exec_meta
             (exec_id, generation, started_at, exited_at, exit_code, first_seq, last_seq, bytes,
              pgid, leader_start)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?;
        for (id, a) in self.execs.iter_mut().filter(|(_, a)| a.dirty) {
            stmt.execute(params![
                id,
                a.generation as i64,
                a.started_at,
                a.exited_at,
                a.exit_code,
                a.first_seq as i64,
                a.last_seq as i64,
                a.bytes as i64,
                a.pgid,
                a.leader_start.map(|t| t as i64)
            ])?;
            a.dirty = false;
        }
        Ok(())
    }
}

fn fail_command(cmd: Command, msg: &str) {
    let err = || ExecError::Storage(msg.to_owned());
    match cmd {
        Command::Begin { reply, .. } => drop(reply.send(Err(err()))),
        Command::Append { reply, .. } => drop(reply.send(Err(err()))),
        Command::Finish { reply, .. } => drop(reply.send(Err(err()))),
        Command::Delete { reply, .. } | Command::Forget { reply, .. } => {
            drop(reply.send(Err(err())))
        }
        Command::Sweep { reply, .. } => drop(reply.send(Err(err()))),
        Command::Close { reply } => drop(reply.send(())),
        Command::Spawned { .. } => {}
    }
}

/// Blocking read access to the log; run its methods on `spawn_blocking`.
#[derive(Debug)]
pub(crate) struct ExecLogReader {
    path: PathBuf,
    /// Logs disposed of whose rows may still be there: gone to readers.
    forgotten: ForgottenLogs,
    idle: Mutex<Vec<Connection>>,
    /// Set by `close`: connections are no longer pooled.
    closed: std::sync::atomic::AtomicBool,
}

impl ExecLogReader {
    /// Closes the pooled connections and stops pooling (before the writer
    /// closes, so that its close is the last and removes the WAL).
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.idle.lock().expect("reader pool poisoned").clear();
    }

    fn with_conn<T>(
        &self,
        f: impl FnOnce(&mut Connection) -> Result<T, ExecError>,
    ) -> Result<T, ExecError> {
        let pooled = self.idle.lock().expect("reader pool poisoned").pop();
        let mut conn = match pooled {
            Some(c) => c,
            None => {
                let c = wsd_sqlite::open_connection(&self.path, &PRAGMAS)?;
                c.pragma_update(None, "query_only", true)?;
                c
            }
        };
        let result = f(&mut conn);
        let mut idle = self.idle.lock().expect("reader pool poisoned");
        if idle.len() < IDLE_READERS && !self.closed.load(Ordering::SeqCst) {
            idle.push(conn);
        }
        result
    }

    /// The exec's meta row, if the exec is retained (and not forgotten).
    pub(crate) fn meta(&self, id: &str) -> Result<Option<MetaRow>, ExecError> {
        // Looked up before the read too: the writer unlists a forgotten
        // log only after its deletion committed, so either the read sees
        // it deleted or one of the two looks sees it listed.
        let before = self.forgotten.generation(id);
        let meta = self.with_conn(|conn| read_meta(conn, id))?;
        Ok(meta.filter(|m| {
            before != Some(m.generation) && self.forgotten.generation(id) != Some(m.generation)
        }))
    }

    /// Events of exec `id` (of this `generation`) with `after < seq <= until`,
    /// oldest first, at most one page (`REPLAY_PAGE_BYTES` /
    /// `REPLAY_PAGE_EVENTS`, and at least one event if any is due). Meta and
    /// rows are read in one transaction, so the truncation check and the rows
    /// agree.
    pub(crate) fn page(
        &self,
        id: &str,
        generation: u64,
        after: u64,
        until: u64,
    ) -> Result<Vec<ExecEvent>, ExecError> {
        self.with_conn(|conn| {
            let tx = conn.transaction()?;
            let meta = read_meta(&tx, id)?;
            let meta = match meta {
                Some(m)
                    if m.generation == generation
                        && self.forgotten.generation(id) != Some(generation) =>
                {
                    m
                }
                _ => return Err(ExecError::NotFound { id: id.to_owned() }),
            };
            if after + 1 < meta.first_seq {
                return Err(ExecError::Truncated {
                    id: id.to_owned(),
                    after,
                    first_retained: meta.first_seq,
                });
            }
            let mut out = Vec::new();
            let mut bytes = 0usize;
            {
                let mut stmt = tx.prepare_cached(
                    "SELECT seq, kind, data FROM exec_event
                     WHERE exec_id = ?1 AND seq > ?2 AND seq <= ?3 ORDER BY seq",
                )?;
                let until = until.min(i64::MAX as u64) as i64;
                let mut rows = stmt.query(params![id, after as i64, until])?;
                while bytes < REPLAY_PAGE_BYTES && out.len() < REPLAY_PAGE_EVENTS {
                    let Some(row) = rows.next()? else { break };
                    let event = decode_event(id, row.get(0)?, row.get(1)?, row.get(2)?)?;
                    bytes += event.kind.payload_len();
                    out.push(event);
                }
            }
            tx.commit()?;
            Ok(out)
        })
    }
}

fn read_meta(conn: &Connection, id: &str) -> Result<Option<MetaRow>, ExecError> {
    Ok(conn
        .prepare_cached(
            "SELECT generation, exited_at, first_seq, last_seq FROM exec_meta WHERE exec_id = ?1",
        )?
        .query_row([id], |r| {
            Ok(MetaRow {
                generation: r.get::<_, i64>(0)? as u64,
                finished: r.get::<_, Option<i64>>(1)?.is_some(),
                first_seq: r.get::<_, i64>(2)? as u64,
                last_seq: r.get::<_, i64>(3)? as u64,
            })
        })
        .optional()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No cap on a log or on all of them.
    const NO_CAPS: LogCaps = LogCaps {
        per_exec: u64::MAX,
        global: u64::MAX,
    };

    fn out(id: &str, seq: u64, n: usize) -> ExecEvent {
        ExecEvent {
            id: id.into(),
            seq,
            kind: EventKind::Stdout(vec![b'x'; n]),
            rev: 0,
        }
    }

    async fn append(w: &ExecLogWriter, ev: ExecEvent) -> ExecEvent {
        w.append(ev).await.unwrap().await.unwrap().unwrap()
    }

    fn seqs(r: &ExecLogReader, id: &str, generation: u64) -> Vec<u64> {
        r.page(id, generation, 0, u64::MAX)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    #[tokio::test]
    async fn per_exec_cap_evicts_the_oldest_events_and_keeps_a_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let (w, _) = ExecLogWriter::open(
            &path,
            LogCaps {
                per_exec: 250,
                global: u64::MAX,
            },
        )
        .unwrap();
        let r = w.reader();
        let g = w.begin("a").await.unwrap();
        for seq in 1..=5 {
            append(&w, out("a", seq, 100)).await;
        }
        // 500 bytes written, cap 250: only the two newest (seq 4, 5) fit.
        let meta = r.meta("a").unwrap().unwrap();
        assert_eq!((meta.first_seq, meta.last_seq), (4, 5));
        assert_eq!(
            r.page("a", g, 3, u64::MAX)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>(),
            [4, 5]
        );
        let err = r.page("a", g, 2, u64::MAX).unwrap_err();
        assert!(
            matches!(
                err,
                ExecError::Truncated {
                    after: 2,
                    first_retained: 4,
                    ..
                }
            ),
            "{err}"
        );
        // A single event above the cap is still kept (the newest always is).
        append(&w, out("a", 6, 400)).await;
        assert_eq!(r.meta("a").unwrap().unwrap().first_seq, 6);
        assert_eq!(
            r.page("a", g, 5, u64::MAX)
                .unwrap()
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>(),
            [6]
        );
        // A second exec has its own window.
        let g2 = w.begin("b").await.unwrap();
        append(&w, out("b", 1, 100)).await;
        assert_eq!(seqs(&r, "b", g2), [1]);
    }

    #[tokio::test]
    async fn global_cap_evicts_finished_execs_first_and_keeps_their_exit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let (w, _) = ExecLogWriter::open(
            &path,
            LogCaps {
                per_exec: u64::MAX,
                global: 300,
            },
        )
        .unwrap();
        let r = w.reader();
        let ga = w.begin("a").await.unwrap();
        append(&w, out("a", 1, 100)).await;
        append(&w, out("a", 2, 100)).await;
        w.finish("a", 3, 0).await.unwrap();
        let gb = w.begin("b").await.unwrap();
        append(&w, out("b", 1, 100)).await;
        // Over the cap by 100: the finished exec `a` loses its oldest event.
        append(&w, out("b", 2, 100)).await;
        assert_eq!(r.meta("a").unwrap().unwrap().first_seq, 2);
        assert_eq!(seqs(&r, "b", gb), [1, 2]);
        // Over by 200 more: `a` loses its last output, keeps its exit, and
        // then the live exec's oldest output goes.
        append(&w, out("b", 3, 200)).await;
        let page = r.page("a", ga, 2, u64::MAX).unwrap();
        assert_eq!(page.len(), 1);
        assert!(matches!(page[0].kind, EventKind::Exit(0)));
        assert_eq!(r.meta("b").unwrap().unwrap().first_seq, 2);
    }

    #[tokio::test]
    async fn reopening_reports_the_recorded_process_groups_of_lost_execs_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let caps = NO_CAPS;
        {
            let (w, _) = ExecLogWriter::open(&path, caps).unwrap();
            let g = w.begin("done").await.unwrap();
            w.spawned("done", g, 4242, Some(17)).await.unwrap();
            w.finish("done", 1, 0).await.unwrap();
            let g = w.begin("running").await.unwrap();
            w.spawned("running", g, 4343, Some(99)).await.unwrap();
            // A record for an older generation of the id is ignored.
            w.spawned("running", g - 1, 1, Some(1)).await.unwrap();
            append(&w, out("running", 1, 3)).await;
            w.begin("unrecorded").await.unwrap();
            append(&w, out("unrecorded", 1, 3)).await;
            w.close().await;
        }
        let (_, report) = ExecLogWriter::open(&path, caps).unwrap();
        assert_eq!(report.lost, ["running", "unrecorded"]);
        assert_eq!(
            report.groups,
            [LostGroup {
                id: "running".into(),
                pgid: 4343,
                leader_start: 99
            }]
        );
        let (_, report) = ExecLogWriter::open(&path, caps).unwrap();
        assert!(report.groups.is_empty(), "reported once, then finished");
    }

    #[tokio::test]
    async fn a_version_1_log_gains_the_process_group_columns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE exec_meta (exec_id TEXT PRIMARY KEY, generation INTEGER NOT NULL,
                    started_at INTEGER NOT NULL, exited_at INTEGER, exit_code INTEGER,
                    first_seq INTEGER NOT NULL, last_seq INTEGER NOT NULL, bytes INTEGER NOT NULL);
                 CREATE TABLE exec_event (exec_id TEXT NOT NULL, seq INTEGER NOT NULL,
                    kind INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (exec_id, seq));
                 INSERT INTO exec_meta VALUES ('old', 1, 0, NULL, NULL, 1, 0, 0);
                 PRAGMA user_version = 1;",
            )
            .unwrap();
        }
        let caps = NO_CAPS;
        let (w, report) = ExecLogWriter::open(&path, caps).unwrap();
        assert_eq!(report.lost, ["old"]);
        assert!(report.groups.is_empty(), "no group was recorded for it");
        let g = w.begin("new").await.unwrap();
        w.spawned("new", g, 77, Some(5)).await.unwrap();
        append(&w, out("new", 1, 3)).await;
        w.close().await;
        let (_, report) = ExecLogWriter::open(&path, caps).unwrap();
        assert_eq!(report.groups.len(), 1);
        let recorded: i64 = Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM schema_migrations WHERE owner = 'exec_log'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(recorded, MIGRATIONS.len() as i64);
    }

    #[tokio::test]
    async fn reopening_gives_unfinished_execs_a_lost_exit_and_keeps_finished_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let caps = NO_CAPS;
        {
            let (w, _) = ExecLogWriter::open(&path, caps).unwrap();
            w.begin("done").await.unwrap();
            append(&w, out("done", 1, 3)).await;
            w.finish("done", 2, 7).await.unwrap();
            w.begin("running").await.unwrap();
            append(&w, out("running", 1, 3)).await;
        }
        let (w, report) = ExecLogWriter::open(&path, caps).unwrap();
        assert_eq!(report.lost, ["running"]);
        assert_eq!(report.retained, 1);
        let r = w.reader();
        let m = r.meta("running").unwrap().unwrap();
        let page = r.page("running", m.generation, 0, u64::MAX).unwrap();
        assert_eq!(page.len(), 2);
        assert!(matches!(page[1].kind, EventKind::Exit(EXIT_LOST)));
        let m = r.meta("done").unwrap().unwrap();
        assert!(matches!(
            r.page("done", m.generation, 1, u64::MAX).unwrap()[0].kind,
            EventKind::Exit(7)
        ));
        // A reused id replaces the finished log under a new generation.
        let g2 = w.begin("done").await.unwrap();
        assert!(g2 > m.generation);
        assert!(matches!(
            r.page("done", m.generation, 0, u64::MAX),
            Err(ExecError::NotFound { .. })
        ));
        assert!(matches!(w.begin("done").await, Err(ExecError::Busy { .. })));
        assert_eq!(
            w.forget_finished("done").await.unwrap(),
            DeleteOutcome::Live
        );
        assert_eq!(
            w.forget_finished("running").await.unwrap(),
            DeleteOutcome::Deleted
        );
        assert_eq!(
            w.forget_finished("running").await.unwrap(),
            DeleteOutcome::NotFound
        );
    }

    fn rows_of(path: &Path, id: &str) -> i64 {
        Connection::open(path)
            .unwrap()
            .query_row(
                "SELECT (SELECT count(*) FROM exec_meta WHERE exec_id = ?1)
                      + (SELECT count(*) FROM exec_event WHERE exec_id = ?1)",
                [id],
                |r| r.get(0),
            )
            .unwrap()
    }

    #[tokio::test]
    async fn a_forgotten_log_is_gone_to_readers_at_once_and_its_rows_go_with_the_next_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let caps = NO_CAPS;
        let (w, _) = ExecLogWriter::open(&path, caps).unwrap();
        let r = w.reader();
        let g = w.begin("a").await.unwrap();
        append(&w, out("a", 1, 3)).await;
        w.finish("a", 2, 0).await.unwrap();
        let groups = w.groups_committed();
        assert_eq!(
            w.forget_finished("a").await.unwrap(),
            DeleteOutcome::Deleted
        );
        assert_eq!(w.groups_committed(), groups, "no transaction of its own");
        assert_eq!(r.meta("a").unwrap(), None);
        assert!(matches!(
            r.page("a", g, 0, u64::MAX),
            Err(ExecError::NotFound { .. })
        ));
        assert_eq!(rows_of(&path, "a"), 3, "still on disk");
        assert_eq!(
            w.forget_finished("a").await.unwrap(),
            DeleteOutcome::NotFound
        );
        // The next group deletes the rows.
        w.begin("b").await.unwrap();
        assert_eq!(rows_of(&path, "a"), 0);
        assert_eq!(r.meta("a").unwrap(), None);

        // Reusing a forgotten id before its rows went: the new exec is
        // readable, and the old rows are gone with its begin.
        let g1 = w.begin("c").await.unwrap();
        w.finish("c", 1, 0).await.unwrap();
        w.forget_finished("c").await.unwrap();
        let g2 = w.begin("c").await.unwrap();
        assert!(g2 > g1);
        assert_eq!(r.meta("c").unwrap().map(|m| m.generation), Some(g2));
        w.finish("c", 1, 3).await.unwrap();
        assert!(matches!(
            r.page("c", g2, 0, u64::MAX).unwrap()[0].kind,
            EventKind::Exit(3)
        ));

        // A clean close deletes what is still forgotten.
        w.forget_finished("c").await.unwrap();
        assert_eq!(rows_of(&path, "c"), 2);
        w.close().await;
        assert_eq!(rows_of(&path, "c"), 0);
    }

    #[tokio::test]
    async fn a_forgotten_log_a_crash_kept_is_still_readable_and_expires_with_its_ttl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let caps = NO_CAPS;
        {
            let (w, _) = ExecLogWriter::open(&path, caps).unwrap();
            w.begin("a").await.unwrap();
            w.finish("a", 1, 0).await.unwrap();
            w.forget_finished("a").await.unwrap();
            // Dropped without a close: as far as the log knows, a crash.
        }
        let (w, report) = ExecLogWriter::open(&path, caps).unwrap();
        assert!(report.lost.is_empty());
        assert_eq!(report.retained, 1);
        assert!(w.reader().meta("a").unwrap().is_some());
        assert_eq!(w.sweep(now_ms()).await.unwrap(), 1);
        assert_eq!(rows_of(&path, "a"), 0);
    }

    #[tokio::test]
    async fn queued_events_are_committed_together_in_one_group() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let caps = NO_CAPS;
        let (w, _) = ExecLogWriter::open(&path, caps).unwrap();
        let g = w.begin("a").await.unwrap();
        let before = w.groups_committed();
        // Hold the write lock so the writer stalls on its next group while
        // 100 events queue behind it.
        let blocker = Connection::open(&path).unwrap();
        blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
        let mut acks = Vec::new();
        for seq in 1..=100 {
            acks.push(w.append(out("a", seq, 10)).await.unwrap());
        }
        blocker.execute_batch("COMMIT").unwrap();
        for ack in acks {
            ack.await.unwrap().unwrap();
        }
        let groups = w.groups_committed() - before;
        assert!(groups <= 2, "100 queued events took {groups} transactions");
        let r = w.reader();
        assert_eq!(r.meta("a").unwrap().unwrap().last_seq, 100);
        assert_eq!(r.page("a", g, 0, u64::MAX).unwrap().len(), 100);
    }

    #[tokio::test]
    async fn heavy_output_reuses_evicted_pages_within_a_wide_wal_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        let caps = LogCaps {
            per_exec: 1024 * 1024,
            global: u64::MAX,
        };
        let (w, _) = ExecLogWriter::open(&path, caps).unwrap();
        w.begin("a").await.unwrap();
        // 16 MiB through a 1 MiB window.
        for seq in 1..=256 {
            append(&w, out("a", seq, 65536)).await;
        }
        let wal = std::fs::metadata(dir.path().join("log.db-wal"))
            .unwrap()
            .len();
        // No checkpoint yet: SQLite's default would have reset the WAL at
        // 4 MiB.
        assert!(wal > 8 << 20, "WAL {wal} bytes");
        // Evicted pages were reused: the database holds ~1 MiB of output,
        // not 16.
        let conn = Connection::open(&path).unwrap();
        let pages: i64 = conn
            .pragma_query_value(None, "page_count", |r| r.get(0))
            .unwrap();
        let page_size: i64 = conn
            .pragma_query_value(None, "page_size", |r| r.get(0))
            .unwrap();
        assert!(pages * page_size < 2 << 20, "{pages} pages of {page_size}");
    }

    #[tokio::test]
    async fn a_schema_newer_than_this_build_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log.db");
        Connection::open(&path)
            .unwrap()
            .pragma_update(None, "user_version", MIGRATIONS.len() as i64 + 1)
            .unwrap();
        let err = ExecLogWriter::open(
            &path,
            LogCaps {
                per_exec: 1,
                global: 1,
            },
        )
        .unwrap_err();
        assert_eq!(err.code(), wsd_sync::ErrorCode::Io);
    }
}
