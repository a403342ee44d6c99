//! Workspaces: a row in the kernel database, a dofs store under
//! `DATA/workspaces/<id>/dofs.sqlite3`, and a wsd backend (a local child
//! the kernel starts, or a remote address + token file).
//!
//! Each open workspace has one bracket lock: every mutation of its store
//! (an `fs.write`, a push → exec → pull bracket) holds it, so two brackets
//! on one workspace never interleave their syncs, while reads go to the
//! store directly. That lock plays the role of the workspace actor of the
//! design: one owner at a time, in arrival order (tokio's mutex is fair).
//!
//! The backend the lock owns is [`backend`]; the commands running in a
//! workspace between `shell.exec` calls are `domains::shell`. None of this takes
//! the kernel: [`calls`] drives it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use gsv_protocol::workspace::{BackendInfo, Workspace as WorkspaceInfo};
use rusqlite::{Connection, params};
use wsd_dofs::{Dofs, SharedChunkStore};

pub mod backend;
pub mod calls;

use crate::db::Migration;
use crate::db::{Db, now_ms, opt};
use crate::domains::accounts::ProcessIdentity;
use crate::domains::fs::vfs;
use crate::error::KernelError;

pub use backend::{Backend, BackendState};

/// A `workspaces` row.
#[derive(Debug, Clone)]
pub struct WorkspaceRow {
    pub id: String,
    pub owner_uid: i64,
    pub label: Option<String>,
    pub kind: String,
    pub state: String,
    pub backend: Backend,
    pub created_at: i64,
    pub updated_at: i64,
}

impl WorkspaceRow {
    pub fn is_archived(&self) -> bool {
        self.state == "archived"
    }

    /// The seed's `sys.workspace.list` entry shape, plus `backend`.
    /// The row as `sys.workspace.*` shows it.
    pub fn to_info(&self) -> WorkspaceInfo {
        let backend = match &self.backend {
            Backend::Local => BackendInfo::Local,
            Backend::Remote { address, .. } => BackendInfo::Remote {
                address: address.clone(),
            },
        };
        WorkspaceInfo {
            workspace_id: self.id.clone(),
            owner_uid: self.owner_uid,
            label: self.label.clone(),
            kind: self.kind.clone(),
            state: self.state.clone(),
            created_at: self.created_at,
            updated_at: self.updated_at,
            default_branch: "main".to_owned(),
            head_commit: None,
            active_process: None,
            process_count: 0,
            backend,
            path: format!("/workspaces/{}", self.id),
        }
    }
}

const ROW_COLUMNS: &str = "workspace_id, owner_uid, label, kind, state, backend, remote_address,
    remote_token_file, created_at, updated_at";

fn row_from_sql(r: &rusqlite::Row<'_>) -> rusqlite::Result<WorkspaceRow> {
    let backend: String = r.get(5)?;
    let backend = if backend == "remote" {
        Backend::Remote {
            address: r.get::<_, Option<String>>(6)?.unwrap_or_default(),
            token_file: PathBuf::from(r.get::<_, Option<String>>(7)?.unwrap_or_default()),
        }
    } else {
        Backend::Local
    };
    Ok(WorkspaceRow {
        id: r.get(0)?,
        owner_uid: r.get(1)?,
        label: r.get(2)?,
        kind: r.get(3)?,
        state: r.get(4)?,
        backend,
        created_at: r.get(8)?,
        updated_at: r.get(9)?,
    })
}

pub fn insert_row(conn: &Connection, row: &WorkspaceRow) -> Result<(), KernelError> {
    let (backend, addr, tf) = match &row.backend {
        Backend::Local => ("local", None, None),
        Backend::Remote {
            address,
            token_file,
        } => (
            "remote",
            Some(address.clone()),
            Some(token_file.display().to_string()),
        ),
    };
    conn.execute(
        &format!(
            "INSERT INTO workspaces({ROW_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"
        ),
        params![
            row.id,
            row.owner_uid,
            row.label,
            row.kind,
            row.state,
            backend,
            addr,
            tf,
            row.created_at,
            row.updated_at
        ],
    )?;
    Ok(())
}

pub fn get_row(conn: &Connection, id: &str) -> Result<Option<WorkspaceRow>, KernelError> {
    opt(conn.query_row(
        &format!("SELECT {ROW_COLUMNS} FROM workspaces WHERE workspace_id = ?1"),
        [id],
        row_from_sql,
    ))
}

/// The row of a workspace the caller may use. One that does not exist is
/// 404 "Workspace not found" (its owner's typo, or one long gone); someone
/// else's is still refused (403), as the seed prescribes. Ids are 48
/// random bits, so the difference tells a prober only about ids it cannot
/// guess.
pub async fn visible_row(
    db: &Db,
    who: &ProcessIdentity,
    id: &str,
) -> Result<WorkspaceRow, KernelError> {
    let wid = id.to_owned();
    match db.call(move |c| get_row(c, &wid)).await? {
        Some(row) if vfs::check_workspace(who, row.owner_uid) => Ok(row),
        Some(_) => Err(KernelError::AccessDenied {
            kind: "workspace",
            id: id.to_owned(),
        }),
        None => Err(KernelError::NotFound {
            kind: "Workspace",
            id: id.to_owned(),
        }),
    }
}

pub fn list_rows(
    conn: &Connection,
    owner: Option<i64>,
    state: Option<&str>,
    limit: i64,
) -> Result<Vec<WorkspaceRow>, KernelError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT {ROW_COLUMNS} FROM workspaces
         WHERE (?1 IS NULL OR owner_uid = ?1) AND (?2 IS NULL OR state = ?2)
         ORDER BY created_at DESC, workspace_id LIMIT ?3"
    ))?;
    let rows = stmt.query_map(params![owner, state, limit], row_from_sql)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// Removes a workspace row (a create that failed half-way).
pub fn delete_row(conn: &Connection, id: &str) -> Result<(), KernelError> {
    conn.execute("DELETE FROM workspaces WHERE workspace_id = ?1", [id])?;
    Ok(())
}

pub fn set_state(conn: &Connection, id: &str, state: &str) -> Result<(), KernelError> {
    conn.execute(
        "UPDATE workspaces SET state = ?2, updated_at = ?3 WHERE workspace_id = ?1",
        params![id, state, now_ms()],
    )?;
    Ok(())
}

/// An open workspace: its store and its bracket lock.
#[derive(Debug)]
pub struct Workspace {
    pub id: String,
    pub dir: PathBuf,
    /// Shared with the sync driver during push/pull (it takes the store as
    /// `Arc<Mutex<_>>`); everyone else locks it briefly on a blocking task.
    pub dofs: Arc<Mutex<Dofs>>,
    /// Held for every mutation and every bracket (see the module docs).
    pub bracket: tokio::sync::Mutex<BackendState>,
}

/// Open workspaces by id.
#[derive(Debug)]
pub struct Workspaces {
    pub dir: PathBuf,
    pub wsd_bin: PathBuf,
    /// Local wsd children run their commands sandboxed (`wsd serve --sandbox`).
    pub wsd_sandbox: bool,
    /// The object store every workspace store keeps its chunks in
    /// (`--chunk-store`); `None`: in the store itself.
    chunk_store: Option<SharedChunkStore>,
    /// The deadline of every wsd call (`KernelConfig::wsd_timeout`).
    pub wsd_timeout: std::time::Duration,
    open: Mutex<HashMap<String, Arc<Workspace>>>,
}

impl Workspaces {
    pub fn new(dir: PathBuf, wsd_bin: PathBuf) -> Workspaces {
        Workspaces {
            dir,
            wsd_bin,
            wsd_sandbox: false,
            chunk_store: None,
            wsd_timeout: wsd_client::DEFAULT_CALL_TIMEOUT,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Whether local wsd children sandbox their commands.
    pub fn with_wsd_sandbox(mut self, sandbox: bool) -> Workspaces {
        self.wsd_sandbox = sandbox;
        self
    }

    /// The deadline of every wsd call.
    pub fn with_wsd_timeout(mut self, timeout: std::time::Duration) -> Workspaces {
        self.wsd_timeout = timeout;
        self
    }

    /// Whether workspace stores keep their chunks in an object store.
    pub fn with_chunk_store(mut self, store: Option<SharedChunkStore>) -> Workspaces {
        self.chunk_store = store;
        self
    }

    /// The open workspace `row`, opening its store on first use.
    pub async fn open(&self, row: &WorkspaceRow) -> Result<Arc<Workspace>, KernelError> {
        if let Some(w) = self.open.lock().unwrap().get(&row.id) {
            return Ok(w.clone());
        }
        let dir = self.dir.join(&row.id);
        let (d, chunk_store) = (dir.clone(), self.chunk_store.clone());
        let dofs = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&d)
                .map_err(|e| KernelError::internal(&format!("creating {}", d.display()), e))?;
            let opening =
                |e| KernelError::internal(&format!("opening the store of {}", d.display()), e);
            let mut dofs = Dofs::open(d.join("dofs.sqlite3")).map_err(opening)?;
            match chunk_store {
                Some(store) => dofs.keep_chunks_in(store),
                // Never served half: its content is in a store we lack.
                None if dofs.keeps_chunks_elsewhere().map_err(opening)? => {
                    return Err(KernelError::Unavailable(format!(
                        "the store of {} keeps its content in an object store: start the kernel with its --chunk-store",
                        d.display()
                    )));
                }
                None => {}
            }
            Ok(dofs)
        })
        .await
        .map_err(|e| KernelError::internal("opening a workspace", e))??;
        let w = Arc::new(Workspace {
            id: row.id.clone(),
            dofs: Arc::new(Mutex::new(dofs)),
            bracket: tokio::sync::Mutex::new(
                BackendState::new(&dir, row.backend.clone())
                    .with_sandbox(self.wsd_sandbox)
                    .with_call_timeout(self.wsd_timeout),
            ),
            dir,
        });
        // Two racing opens: the first one in wins, the other store closes.
        Ok(self
            .open
            .lock()
            .unwrap()
            .entry(row.id.clone())
            .or_insert(w)
            .clone())
    }

    /// Drops an open workspace (archive), stopping its local wsd.
    pub async fn close(&self, id: &str) {
        let w = self.open.lock().unwrap().remove(id);
        if let Some(w) = w {
            w.bracket.lock().await.stop().await;
        }
    }

    /// Stops every local wsd child, except in workspaces `keep` names
    /// (a terminal runs there): those are left running, with their pid
    /// file, for the next kernel to adopt ([`BackendState::adopt_leftover`]).
    pub async fn shutdown(&self, keep: impl Fn(&str) -> bool) {
        let all: Vec<_> = self.open.lock().unwrap().drain().map(|(_, w)| w).collect();
        let mut left = 0usize;
        for w in all {
            let mut backend = w.bracket.lock().await;
            if keep(&w.id)
                && let Some(pid) = backend.leave_running()
            {
                tracing::info!(workspace = %w.id, pid, pid_file = %w.dir.join("wsd.pid").display(), "leaving this workspace's local wsd running: a terminal runs in it, and the next kernel adopts it");
                left += 1;
                continue;
            }
            backend.stop().await;
        }
        if left > 0 {
            tracing::info!(
                left,
                "left local wsd processes running for their terminals: the next `gsv serve` on this data directory takes them up (and stops them once idle); without one, stop each with SIGTERM to the pid in its wsd.pid"
            );
        }
    }

    /// Stops local children unused for `idle` whose workspace runs no
    /// command; a later bracket starts them again. Busy workspaces are
    /// skipped (their bracket lock is taken).
    pub async fn stop_idle(&self, idle: std::time::Duration, busy: impl Fn(&str) -> bool) {
        let all: Vec<_> = self.open.lock().unwrap().values().cloned().collect();
        for w in all {
            if busy(&w.id) {
                continue;
            }
            let Ok(mut b) = w.bracket.try_lock() else {
                continue;
            };
            if b.idle_child(idle) {
                tracing::info!(workspace = %w.id, "stopping an idle local wsd");
                b.stop().await;
            }
        }
    }

    /// The pid of an open workspace's local wsd child, if running.
    pub async fn local_pid(&self, id: &str) -> Option<u32> {
        let w = self.open.lock().unwrap().get(id).cloned()?;
        w.bracket.lock().await.child_pid()
    }

    /// Every open workspace.
    pub fn open_list(&self) -> Vec<Arc<Workspace>> {
        self.open.lock().unwrap().values().cloned().collect()
    }

    pub fn open_count(&self) -> usize {
        self.open.lock().unwrap().len()
    }
}

/// This domain's tables: workspace rows and the workspace shell sessions' rows (the `shell` domain's). Listed in `domains::MIGRATIONS`;
/// never edit a released migration (its checksum is checked at every
/// start), add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 2,
    name: "workspaces",
    sql: "CREATE TABLE workspaces(
            workspace_id TEXT PRIMARY KEY,
            owner_uid INTEGER NOT NULL,
            label TEXT,
            kind TEXT NOT NULL DEFAULT 'thread',
            state TEXT NOT NULL DEFAULT 'active',
            backend TEXT NOT NULL DEFAULT 'local',
            remote_address TEXT,
            remote_token_file TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL);
         CREATE INDEX workspaces_owner ON workspaces(owner_uid);
         CREATE TABLE shell_sessions(
            session_id TEXT PRIMARY KEY,
            workspace_id TEXT NOT NULL,
            owner_uid INTEGER NOT NULL,
            exec_id TEXT NOT NULL,
            status TEXT NOT NULL,
            exit_code INTEGER,
            error TEXT,
            created_at INTEGER NOT NULL,
            updated_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL);
         CREATE INDEX shell_sessions_expiry ON shell_sessions(expires_at);",
}];
