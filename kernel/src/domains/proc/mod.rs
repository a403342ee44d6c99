//! Agent processes (issue 14), as data: the registry rows ([`store`]),
//! the active run of each process in memory ([`active`]), human approval
//! rules ([`hil`]) and the OpenAI-compatible model provider
//! ([`provider`]). Nothing here takes the kernel; the loop that drives a
//! run and the `proc.*` calls are [`calls`].
//!
//! In memory there is only what a restart may lose: which run is active
//! and how to abort it or answer its approval. Everything else is a row;
//! on start `calls::run::recover` ends runs a dead kernel left
//! `running` and starts processes that still have queued messages.

pub mod active;
pub mod calls;
pub mod conversations;
pub mod hil;
pub mod ipc;
pub mod profiles;
pub mod provider;
pub mod signal_watches;
pub mod store;

pub use active::{Active, Procs, RunRoute};

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::db::Migration;
use crate::domains::adapter::SurfaceRoute;

/// Who hears a process signal besides the owner's sockets: the IPC calls
/// a finished run answers, the watches on the process, and the chat
/// surface a run reports to. Each of them starts runs, which emit
/// signals, so the signal path (`calls::signal`) reaches them through
/// these pointers, filled where the domains are wired
/// (`domains::signal_listeners`), instead of importing them.
pub struct SignalListeners<K> {
    /// `proc.run.finished` of a process (its pid and the payload).
    pub run_finished: fn(Arc<K>, String, Value) -> BoxFuture<'static, ()>,
    /// Any signal of a process: owner, pid, signal, payload.
    pub watches: fn(Arc<K>, i64, String, String, Value) -> BoxFuture<'static, ()>,
    /// A signal of a run a chat message started, for that chat surface.
    pub surface: fn(&K, &SurfaceRoute, &str, &Value),
}

impl<K> std::fmt::Debug for SignalListeners<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SignalListeners")
    }
}

/// This domain's tables: the process registry, history, runs, queue and approvals. Listed in `domains::MIGRATIONS`;
/// never edit a released migration (its checksum is checked at every
/// start), add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 4,
    name: "processes",
    sql: "CREATE TABLE processes(
            pid TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            uid INTEGER NOT NULL,
            username TEXT NOT NULL,
            interactive INTEGER NOT NULL DEFAULT 1,
            parent_pid TEXT,
            label TEXT,
            cwd TEXT NOT NULL,
            workspace_id TEXT,
            state TEXT NOT NULL DEFAULT 'idle',
            active_run_id TEXT,
            queued_count INTEGER NOT NULL DEFAULT 0,
            last_active_at INTEGER,
            created_at INTEGER NOT NULL);
         CREATE INDEX processes_owner ON processes(owner_uid);
         CREATE TABLE proc_messages(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            run_id TEXT,
            body TEXT NOT NULL,
            created_at INTEGER NOT NULL);
         CREATE INDEX proc_messages_pid ON proc_messages(pid, id);
         CREATE TABLE proc_runs(
            run_id TEXT PRIMARY KEY,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            status TEXT NOT NULL,
            error TEXT,
            started_at INTEGER NOT NULL,
            finished_at INTEGER);
         CREATE INDEX proc_runs_status ON proc_runs(status);
         CREATE TABLE proc_queue(
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            body TEXT NOT NULL,
            created_at INTEGER NOT NULL);
         CREATE TABLE proc_hil(
            request_id TEXT PRIMARY KEY,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            run_id TEXT NOT NULL,
            call TEXT NOT NULL,
            args TEXT NOT NULL,
            status TEXT NOT NULL DEFAULT 'pending',
            created_at INTEGER NOT NULL);
         CREATE TABLE proc_allow(
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            call TEXT NOT NULL,
            PRIMARY KEY(pid, call));",
}];

/// Profiles and conversations (issue 26): listed after the domains whose
/// ids lie between 4 and 60.
pub const CONVERSATION_MIGRATIONS: &[Migration] = &[Migration {
        version: 60,
        name: "proc_conversations",
        sql: "ALTER TABLE processes ADD COLUMN profile TEXT NOT NULL DEFAULT 'task';
         ALTER TABLE proc_messages ADD COLUMN conversation_id TEXT NOT NULL DEFAULT 'default';
         CREATE INDEX proc_messages_conversation ON proc_messages(pid, conversation_id, id);
         ALTER TABLE proc_queue ADD COLUMN conversation_id TEXT NOT NULL DEFAULT 'default';
         ALTER TABLE proc_runs ADD COLUMN conversation_id TEXT NOT NULL DEFAULT 'default';
         ALTER TABLE proc_hil ADD COLUMN conversation_id TEXT NOT NULL DEFAULT 'default';
         ALTER TABLE proc_hil ADD COLUMN tool_call_id TEXT NOT NULL DEFAULT '';
         ALTER TABLE proc_hil ADD COLUMN tool_name TEXT NOT NULL DEFAULT '';
         CREATE TABLE proc_conversations(
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            id TEXT NOT NULL,
            generation INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL DEFAULT 'open',
            title TEXT,
            overflow TEXT NOT NULL DEFAULT 'manual',
            compact_at_pressure REAL NOT NULL DEFAULT 0.9,
            keep_last INTEGER NOT NULL DEFAULT 80,
            policy_updated_at INTEGER,
            context TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            PRIMARY KEY(pid, id));
         CREATE TABLE proc_segments(
            id TEXT PRIMARY KEY,
            pid TEXT NOT NULL REFERENCES processes(pid) ON DELETE CASCADE,
            conversation_id TEXT NOT NULL,
            generation INTEGER NOT NULL,
            kind TEXT NOT NULL,
            from_message_id INTEGER NOT NULL,
            to_message_id INTEGER NOT NULL,
            live_through_id INTEGER NOT NULL,
            archive_path TEXT NOT NULL,
            summary_message_id INTEGER,
            created_at INTEGER NOT NULL);
         CREATE INDEX proc_segments_conversation ON proc_segments(pid, conversation_id, created_at);",
}];

/// IPC calls and signal watches (issue 28): listed after the MCP
/// domain's 70.
pub const IPC_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 110,
        name: "ipc_calls",
        sql: ipc::MIGRATION,
    },
    Migration {
        version: 111,
        name: "signal_watches",
        sql: signal_watches::MIGRATION,
    },
];
