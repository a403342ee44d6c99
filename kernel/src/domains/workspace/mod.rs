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

/// `row` (the workspace `id`'s, if it exists) if `who` may use it. One
/// that does not exist is 404 "Workspace not found" (its owner's typo, or
/// one long gone); someone else's is still refused (403), as the seed
/// prescribes. Ids are 48 random bits, so the difference tells a prober
/// only about ids it cannot guess.
fn visible(
    who: &ProcessIdentity,
    id: &str,
    row: Option<WorkspaceRow>,
) -> Result<WorkspaceRow, KernelError> {
    match row {
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

fn delete_row(conn: &Connection, id: &str) -> Result<(), KernelError> {
    conn.execute("DELETE FROM workspaces WHERE workspace_id = ?1", [id])?;
    Ok(())
}

fn set_state(conn: &Connection, id: &str, state: &str) -> Result<(), KernelError> {
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

/// The rows [`Workspaces::visible_row`] read, by id, so a call on a
/// workspace (every `shell.exec`) checks its caller without a database
/// read on the blocking pool. Rows change only through [`Workspaces`]
/// (`set_state`, `delete_row`), which drop the entry after the write; a
/// lookup that read the database before such a write does not cache what
/// it read (the epoch moved). A row's owner never changes, and every
/// lookup checks the caller against the row, cached or not.
#[derive(Debug, Default)]
struct RowCache {
    rows: HashMap<String, WorkspaceRow>,
    /// Bumped by every row write.
    epoch: u64,
}

/// Rows kept at most; past it the cache starts over (a bound, not a
/// policy: a kernel uses far fewer workspaces at once).
const ROW_CACHE_MAX: usize = 4096;

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
    rows: Mutex<RowCache>,
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
            rows: Mutex::new(RowCache::default()),
        }
    }

    /// The row of workspace `id` if `who` may use it (404 if there is
    /// none, 403 if it is someone else's: see [`visible`]), read from the
    /// database once and then kept ([`RowCache`]).
    pub async fn visible_row(
        &self,
        db: &Db,
        who: &ProcessIdentity,
        id: &str,
    ) -> Result<WorkspaceRow, KernelError> {
        let (cached, epoch) = {
            let cache = self.rows.lock().unwrap();
            (cache.rows.get(id).cloned(), cache.epoch)
        };
        if let Some(row) = cached {
            return visible(who, id, Some(row));
        }
        let wid = id.to_owned();
        let row = db.call(move |c| get_row(c, &wid)).await?;
        if let Some(row) = &row {
            let mut cache = self.rows.lock().unwrap();
            if cache.epoch == epoch {
                if cache.rows.len() >= ROW_CACHE_MAX {
                    cache.rows.clear();
                }
                cache.rows.insert(id.to_owned(), row.clone());
            }
        }
        visible(who, id, row)
    }

    /// Sets workspace `id`'s state (`archived`).
    pub async fn set_state(&self, db: &Db, id: &str, state: &str) -> Result<(), KernelError> {
        let (wid, state) = (id.to_owned(), state.to_owned());
        let written = db.call(move |c| set_state(c, &wid, &state)).await;
        self.row_changed(id);
        written
    }

    /// Removes workspace `id`'s row (a create or recover that failed
    /// half-way).
    pub async fn delete_row(&self, db: &Db, id: &str) -> Result<(), KernelError> {
        let wid = id.to_owned();
        let written = db.call(move |c| delete_row(c, &wid)).await;
        self.row_changed(id);
        written
    }

    /// Drops the cached row of `id` after a write (whether or not the write
    /// went through: the database says).
    fn row_changed(&self, id: &str) {
        let mut cache = self.rows.lock().unwrap();
        cache.rows.remove(id);
        cache.epoch += 1;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn user(uid: i64, name: &str) -> ProcessIdentity {
        ProcessIdentity {
            uid,
            gid: uid,
            gids: vec![uid],
            username: name.into(),
            home: format!("/home/{name}"),
            cwd: format!("/home/{name}"),
        }
    }

    fn row(id: &str, owner_uid: i64) -> WorkspaceRow {
        WorkspaceRow {
            id: id.into(),
            owner_uid,
            label: None,
            kind: "thread".into(),
            state: "active".into(),
            backend: Backend::Local,
            created_at: 1,
            updated_at: 1,
        }
    }

    #[tokio::test]
    async fn a_cached_row_still_refuses_other_users_and_follows_archive_and_delete() {
        let db = Db::open_in_memory(MIGRATIONS).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspaces::new(dir.path().to_owned(), "wsd".into());
        let (alice, bob) = (user(1000, "alice"), user(1001, "bob"));
        let r = row("ws_a1", alice.uid);
        db.call(move |c| insert_row(c, &r)).await.unwrap();

        // Read once, then from the cache: the owner passes, bob is refused
        // every time, root passes.
        for _ in 0..2 {
            let got = ws.visible_row(&db, &alice, "ws_a1").await.unwrap();
            assert_eq!((got.owner_uid, got.state.as_str()), (1000, "active"));
            assert!(matches!(
                ws.visible_row(&db, &bob, "ws_a1").await,
                Err(KernelError::AccessDenied { .. })
            ));
            assert!(ws.visible_row(&db, &user(0, "root"), "ws_a1").await.is_ok());
        }
        assert!(ws.rows.lock().unwrap().rows.contains_key("ws_a1"));

        // An archive is seen by the next lookup.
        ws.set_state(&db, "ws_a1", "archived").await.unwrap();
        let got = ws.visible_row(&db, &alice, "ws_a1").await.unwrap();
        assert!(got.is_archived());

        // So is a deletion, and a missing row is never cached.
        ws.delete_row(&db, "ws_a1").await.unwrap();
        for _ in 0..2 {
            assert!(matches!(
                ws.visible_row(&db, &alice, "ws_a1").await,
                Err(KernelError::NotFound { .. })
            ));
        }
        assert!(ws.rows.lock().unwrap().rows.is_empty());
        // A row created under that id afterwards is found.
        let r = row("ws_a1", bob.uid);
        db.call(move |c| insert_row(c, &r)).await.unwrap();
        assert_eq!(
            ws.visible_row(&db, &bob, "ws_a1").await.unwrap().owner_uid,
            bob.uid
        );
        assert!(matches!(
            ws.visible_row(&db, &alice, "ws_a1").await,
            Err(KernelError::AccessDenied { .. })
        ));
    }

    #[tokio::test]
    async fn a_lookup_that_read_before_a_write_does_not_cache_what_it_read() {
        let db = Db::open_in_memory(MIGRATIONS).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let ws = Workspaces::new(dir.path().to_owned(), "wsd".into());
        let alice = user(1000, "alice");
        let r = row("ws_b1", alice.uid);
        db.call(move |c| insert_row(c, &r)).await.unwrap();
        // Hold the connection, so the lookup's read waits behind it.
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (held_tx, held) = tokio::sync::oneshot::channel::<()>();
        let holder = tokio::spawn({
            let db = db.clone();
            async move {
                db.call(move |_| {
                    held_tx.send(()).unwrap();
                    released.recv().unwrap();
                    Ok(())
                })
                .await
            }
        });
        held.await.unwrap();
        let lookup = ws.visible_row(&db, &alice, "ws_b1");
        tokio::pin!(lookup);
        assert!(futures::poll!(&mut lookup).is_pending());
        // A write of the row lands between the lookup's start and its read.
        ws.row_changed("ws_b1");
        release.send(()).unwrap();
        assert_eq!(lookup.await.unwrap().state, "active");
        holder.await.unwrap().unwrap();
        assert!(
            ws.rows.lock().unwrap().rows.is_empty(),
            "what a lookup read under an older epoch is not cached"
        );
        // The next lookup caches.
        ws.visible_row(&db, &alice, "ws_b1").await.unwrap();
        assert!(ws.rows.lock().unwrap().rows.contains_key("ws_b1"));
    }
}
