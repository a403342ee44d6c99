//! `workspace.snapshot.create|list|get|diff|restore|delete`, the fork half
//! of `sys.workspace.create {fromSnapshot}`, and `sys.gc`.
//!
//! Unknown and foreign snapshot ids look the same (403, as for
//! workspaces), so ids cannot be probed. Refusals of an operation (the
//! per-workspace limit, a restore while a command or a terminal runs) are results
//! `{ok:false, code, error}`.

use std::sync::Arc;

use gsv_protocol::snapshot::{
    ChangeKind, CreateArgs, DeleteResult, DiffArgs, DiffEntry, DiffResult, GcResult, IdArgs,
    ListArgs, ListResult, OpError, RecoverArgs, RecoverResult, RestoreResult, SnapshotInfo,
};
use serde::Serialize;
use serde_json::Value;
use wsd_dofs::DiffKind;

use crate::db::now_ms;
use crate::domains::accounts;
use crate::domains::fs::calls::with_store;
use crate::domains::fs::vfs;
use crate::domains::snapshot::mirror::{MirroredSnapshot, MirroredWorkspace, Uploaded};
use crate::domains::snapshot::{self, SnapshotRow};
use crate::domains::workspace::{self, Workspace, WorkspaceRow};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

fn to_value(v: impl Serialize) -> Result<Value, KernelError> {
    serde_json::to_value(v).map_err(|e| KernelError::internal("snapshot result", e))
}

fn refuse(code: &str, error: String) -> Result<Value, KernelError> {
    to_value(OpError {
        ok: false,
        code: code.to_owned(),
        error: format!("{code}: {error}"),
    })
}

fn store_error(context: &str, e: wsd_dofs::DofsError) -> KernelError {
    KernelError::internal(context, e)
}

/// The snapshot row `id` if the caller may use its workspace.
async fn visible_snapshot(
    k: &Arc<Kernel>,
    s: &Session,
    id: &str,
) -> Result<SnapshotRow, KernelError> {
    let sid = id.to_owned();
    match k.db.call(move |c| snapshot::get(c, &sid)).await? {
        Some(row) if vfs::check_workspace(&s.identity, row.owner_uid) => Ok(row),
        _ => Err(KernelError::AccessDenied {
            kind: "snapshot",
            id: id.to_owned(),
        }),
    }
}

/// The open workspace behind a usable, not archived workspace row.
async fn open_workspace(
    k: &Arc<Kernel>,
    s: &Session,
    id: &str,
) -> Result<(WorkspaceRow, Arc<Workspace>), KernelError> {
    let row = k.workspaces.visible_row(&k.db, &s.identity, id).await?;
    if row.is_archived() {
        return Err(KernelError::BadRequest(format!(
            "workspace {id} is archived"
        )));
    }
    let w = k.workspaces.open(&row).await?;
    Ok((row, w))
}

pub async fn create(k: Arc<Kernel>, s: Arc<Session>, a: CreateArgs) -> Result<Value, KernelError> {
    let (row, w) = open_workspace(&k, &s, &a.workspace_id).await?;
    // Between brackets: the tree is consistent at the rev it records.
    let _bracket = w.bracket.lock().await;
    let wid = row.id.clone();
    let held = k.db.call(move |c| snapshot::count(c, &wid)).await?;
    let limit = k.config.snapshot_limit;
    if held >= limit {
        return refuse(
            "ELIMIT",
            format!(
                "workspace {} already has {held} snapshots (limit {limit}); delete one first",
                row.id
            ),
        );
    }
    let id = format!("snap_{}", accounts::random_hex(12));
    let sid = id.clone();
    let summary = with_store(&w.dofs, move |d| d.create_snapshot(&sid))
        .await?
        .map_err(|e| store_error("creating a snapshot", e))?;
    let info = SnapshotInfo {
        snapshot_id: id.clone(),
        workspace_id: row.id.clone(),
        rev: summary.rev,
        label: a
            .label
            .map(|l| l.trim().chars().take(120).collect::<String>())
            .filter(|l| !l.is_empty()),
        files: summary.files,
        bytes: summary.bytes,
        new_bytes: summary.new_bytes,
        created_at: now_ms(),
    };
    let new_row = SnapshotRow {
        owner_uid: row.owner_uid,
        info: info.clone(),
    };
    let uploaded = match record(&k, &w, &row, new_row).await {
        Ok(uploaded) => uploaded,
        Err(e) => {
            // No row, no snapshot: the store's copy would be a root nobody sees.
            let sid = id.clone();
            let _ = with_store(&w.dofs, move |d| d.delete_snapshot(&sid)).await;
            return Err(e);
        }
    };
    tracing::info!(
        snapshot = %id,
        workspace = %row.id,
        rev = info.rev,
        new_bytes = info.new_bytes,
        uploaded_chunks = uploaded.map(|u| u.chunks),
        uploaded_bytes = uploaded.map(|u| u.bytes),
        "snapshot created"
    );
    to_value(info)
}

/// Records a snapshot the workspace store holds: its row, then (when the
/// kernel keeps chunks in an object store) its chunks still held only
/// here and its manifest, copied there. Not mirrored, not recorded: the
/// snapshot would not outlive this machine as configured.
async fn record(
    k: &Arc<Kernel>,
    w: &Arc<Workspace>,
    workspace: &WorkspaceRow,
    row: SnapshotRow,
) -> Result<Option<Uploaded>, KernelError> {
    let id = row.info.snapshot_id.clone();
    let info = row.info.clone();
    k.db.call(move |c| snapshot::insert(c, &row)).await?;
    let Some(mirror) = &k.mirror else {
        return Ok(None);
    };
    let mirrored = async {
        let uploaded = mirror.upload(&w.dofs, &id).await?;
        let described = mirrored_workspace(k, workspace).await?;
        mirror.publish(&w.dofs, info, described).await?;
        Ok::<_, KernelError>(uploaded)
    }
    .await;
    match mirrored {
        Ok(uploaded) => Ok(Some(uploaded)),
        Err(e) => {
            let _ = k.db.call(move |c| snapshot::delete(c, &id)).await;
            Err(e)
        }
    }
}

/// What a recovery elsewhere needs of `row`: its owner by name, label, kind.
async fn mirrored_workspace(
    k: &Arc<Kernel>,
    row: &WorkspaceRow,
) -> Result<MirroredWorkspace, KernelError> {
    let uid = row.owner_uid;
    let owner =
        k.db.call(move |c| accounts::identity_by_uid(c, uid))
            .await?
            .map(|i| i.username)
            .ok_or_else(|| {
                KernelError::internal("mirroring a snapshot", format!("no account has uid {uid}"))
            })?;
    Ok(MirroredWorkspace {
        owner,
        label: row.label.clone(),
        kind: row.kind.clone(),
    })
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<Value, KernelError> {
    let row = k
        .workspaces
        .visible_row(&k.db, &s.identity, &a.workspace_id)
        .await?;
    let rows = k.db.call(move |c| snapshot::list(c, &row.id)).await?;
    to_value(ListResult {
        snapshots: rows.into_iter().map(|r| r.info).collect(),
    })
}

pub async fn get(k: Arc<Kernel>, s: Arc<Session>, a: IdArgs) -> Result<Value, KernelError> {
    to_value(visible_snapshot(&k, &s, &a.snapshot_id).await?.info)
}

pub async fn diff(k: Arc<Kernel>, s: Arc<Session>, a: DiffArgs) -> Result<Value, KernelError> {
    let from = visible_snapshot(&k, &s, &a.from).await?;
    if let Some(to) = &a.to {
        let to = visible_snapshot(&k, &s, to).await?;
        if to.info.workspace_id != from.info.workspace_id {
            return Err(KernelError::BadRequest(format!(
                "snapshots {} and {} are of different workspaces",
                a.from, to.info.snapshot_id
            )));
        }
    }
    let (_, w) = open_workspace(&k, &s, &from.info.workspace_id).await?;
    let (f, t) = (a.from.clone(), a.to.clone());
    let changes = with_store(&w.dofs, move |d| d.diff_snapshot(&f, t.as_deref()))
        .await?
        .map_err(|e| store_error("diffing snapshots", e))?;
    to_value(DiffResult {
        changes: changes
            .into_iter()
            .map(|(path, kind)| DiffEntry {
                path,
                change: match kind {
                    DiffKind::Added => ChangeKind::Added,
                    DiffKind::Removed => ChangeKind::Removed,
                    DiffKind::Modified => ChangeKind::Modified,
                },
            })
            .collect(),
    })
}

/// Refused, not queued, while a command or a terminal runs in the
/// workspace: its changes would land on top of (or under) the restored
/// tree.
pub async fn restore(k: Arc<Kernel>, s: Arc<Session>, a: IdArgs) -> Result<Value, KernelError> {
    let snap = visible_snapshot(&k, &s, &a.snapshot_id).await?;
    let (row, w) = open_workspace(&k, &s, &snap.info.workspace_id).await?;
    let _bracket = w.bracket.lock().await;
    if k.sessions.running_in(&row.id) {
        return refuse(
            "EBUSY",
            format!(
                "a command is running in workspace {}; wait for it (or kill it) and restore again",
                row.id
            ),
        );
    }
    if k.ptys.running_in(&row.id) {
        return refuse(
            "EBUSY",
            format!(
                "a terminal is open in workspace {}; close it (shell.pty.close) and restore again",
                row.id
            ),
        );
    }
    let sid = a.snapshot_id.clone();
    let out = with_store(&w.dofs, move |d| {
        d.restore_snapshot(&sid)
            .and_then(|out| Ok((out, d.current_rev()?)))
    })
    .await?
    .map_err(|e| store_error("restoring a snapshot", e))?;
    let (out, current) = out;
    tracing::info!(snapshot = %a.snapshot_id, workspace = %row.id, changed = out.changed, removed = out.removed, "snapshot restored");
    to_value(RestoreResult {
        rev: out.rev.unwrap_or(current),
        changed: out.changed,
        removed: out.removed,
    })
}

pub async fn delete(k: Arc<Kernel>, s: Arc<Session>, a: IdArgs) -> Result<Value, KernelError> {
    let snap = visible_snapshot(&k, &s, &a.snapshot_id).await?;
    if let Some(mirror) = &k.mirror {
        // The mirrored manifest first: a failure leaves the snapshot whole.
        mirror
            .forget(&snap.info.workspace_id, &a.snapshot_id)
            .await?;
    }
    let sid = a.snapshot_id.clone();
    k.db.call(move |c| snapshot::delete(c, &sid)).await?;
    let wid = snap.info.workspace_id.clone();
    if let Some(row) = k.db.call(move |c| workspace::get_row(c, &wid)).await? {
        let w = k.workspaces.open(&row).await?;
        let sid = a.snapshot_id.clone();
        with_store(&w.dofs, move |d| d.delete_snapshot(&sid))
            .await?
            .map_err(|e| store_error("deleting a snapshot", e))?;
    }
    to_value(DeleteResult { deleted: true })
}

/// Whether `id` has the shape of a workspace id (`ws_` and hex): it names a
/// directory under the data directory.
fn is_workspace_id(id: &str) -> bool {
    id.strip_prefix("ws_").is_some_and(|hex| {
        !hex.is_empty() && hex.len() <= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())
    })
}

/// `workspace.recover`: rebuilds a workspace this kernel does not have
/// (it lost its data directory) from the snapshot manifests mirrored to
/// the object store: the row (owned by the account of the recorded owner's
/// name), every snapshot, and the tree restored from the newest one. The
/// caller must be that owner or root; a workspace with no manifest looks
/// like someone else's (403). Nothing half-made stays on failure.
pub async fn recover(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: RecoverArgs,
) -> Result<Value, KernelError> {
    let Some(mirror) = &k.mirror else {
        return Err(KernelError::BadRequest(
            "nothing to recover from: this kernel keeps no object store (gsv serve --chunk-store s3://...)"
                .into(),
        ));
    };
    let id = a.workspace_id;
    if !is_workspace_id(&id) {
        return Err(KernelError::BadRequest(format!(
            "workspace id {id:?} is not of the form ws_<hex>"
        )));
    }
    let wid = id.clone();
    if k.db
        .call(move |c| workspace::get_row(c, &wid))
        .await?
        .is_some()
    {
        return refuse(
            "EEXIST",
            format!("workspace {id} exists on this kernel; recover rebuilds only a lost one"),
        );
    }
    let denied = || KernelError::AccessDenied {
        kind: "workspace",
        id: id.clone(),
    };
    let manifests = mirror.manifests(&id).await?;
    let Some((_, newest)) = manifests.last() else {
        return Err(denied());
    };
    let owner_name = newest.workspace.owner.clone();
    let owner_uid = match k
        .db
        .call(move |c| accounts::identity(c, &owner_name))
        .await?
    {
        Some(owner) => owner.uid,
        // The owner's account did not come back: root keeps the workspace.
        None if s.identity.is_root() => s.identity.uid,
        None => return Err(denied()),
    };
    if !vfs::check_workspace(&s.identity, owner_uid) {
        return Err(denied());
    }
    let now = now_ms();
    let row = WorkspaceRow {
        id: id.clone(),
        owner_uid,
        label: newest.workspace.label.clone(),
        kind: newest.workspace.kind.clone(),
        state: "active".into(),
        backend: workspace::Backend::Local,
        created_at: now,
        updated_at: now,
    };
    let r = row.clone();
    k.db.call(move |c| workspace::insert_row(c, &r)).await?;
    let rebuilt = rebuild(&k, &row, &manifests).await;
    let (w, rev) = match rebuilt {
        Ok(done) => done,
        Err(e) => {
            k.workspaces.close(&id).await;
            let wid = id.clone();
            let snapshots_gone =
                k.db.call(move |c| {
                    for r in snapshot::list(c, &wid)? {
                        snapshot::delete(c, &r.info.snapshot_id)?;
                    }
                    Ok(())
                })
                .await;
            if snapshots_gone.is_ok() {
                let _ = k.workspaces.delete_row(&k.db, &id).await;
            }
            let _ = std::fs::remove_dir_all(k.workspaces.dir.join(&id));
            return Err(e);
        }
    };
    let restored_from = newest.snapshot.snapshot_id.clone();
    tracing::info!(workspace = %id, snapshots = manifests.len(), restored_from = %restored_from, dir = %w.dir.display(), "workspace recovered from the object store");
    to_value(RecoverResult {
        workspace: row.to_info(),
        snapshots: manifests.len() as u64,
        restored_from,
        rev,
    })
}

/// Imports every manifest into the (new, empty) store of `row`, records
/// their rows, and restores the newest; the store rev after it.
async fn rebuild(
    k: &Arc<Kernel>,
    row: &WorkspaceRow,
    manifests: &[(String, MirroredSnapshot)],
) -> Result<(Arc<Workspace>, u64), KernelError> {
    let w = k.workspaces.open(row).await?;
    for (name, manifest) in manifests {
        let tree = manifest.tree(name)?;
        let info = manifest.snapshot.clone();
        let (sid, created_at) = (info.snapshot_id.clone(), info.created_at);
        with_store(&w.dofs, move |d| d.import_snapshot(&sid, created_at, &tree))
            .await?
            .map_err(|e| KernelError::Upstream(format!("recovering from {name}: {e}")))?;
        let snapshot_row = SnapshotRow {
            owner_uid: row.owner_uid,
            info: SnapshotInfo {
                workspace_id: row.id.clone(),
                ..info
            },
        };
        k.db.call(move |c| snapshot::insert(c, &snapshot_row))
            .await?;
    }
    let newest = manifests
        .last()
        .map(|(_, m)| m.snapshot.snapshot_id.clone())
        .unwrap_or_default();
    let rev = with_store(&w.dofs, move |d| {
        d.restore_snapshot(&newest)?;
        d.current_rev()
    })
    .await?
    .map_err(|e| store_error("restoring a recovered snapshot", e))?;
    Ok((w, rev))
}

/// Writes snapshot `snapshot_id` (which the caller must be able to use)
/// into the new, empty workspace `into`.
pub async fn fork_into(
    k: &Arc<Kernel>,
    s: &Session,
    snapshot_id: &str,
    into: &Arc<Workspace>,
) -> Result<(), KernelError> {
    let snap = visible_snapshot(k, s, snapshot_id).await?;
    let (_, source) = open_workspace(k, s, &snap.info.workspace_id).await?;
    let (from, to) = (source.dofs.clone(), into.dofs.clone());
    let sid = snapshot_id.to_owned();
    tokio::task::spawn_blocking(move || {
        let from = from.lock().unwrap_or_else(|p| p.into_inner());
        let mut to = to.lock().unwrap_or_else(|p| p.into_inner());
        to.fork_from(&from, &sid)
    })
    .await
    .map_err(|e| KernelError::internal("forking a workspace", e))?
    .map_err(|e| store_error("forking a workspace", e))?;
    Ok(())
}

/// Collects garbage in one workspace store beside whatever runs there
/// (no bracket lock: a command may hold it for hours): the grace window
/// spares every chunk a pull in flight has staged or probed.
pub async fn collect_one(
    w: &Arc<Workspace>,
    grace: std::time::Duration,
) -> Result<wsd_dofs::GcOutcome, KernelError> {
    let cutoff = std::time::SystemTime::now() - grace;
    with_store(&w.dofs, move |d| d.collect_garbage_stored_before(cutoff))
        .await?
        .map_err(|e| store_error("collecting garbage", e))
}

/// `sys.gc`: collects every workspace store, reporting what it freed.
pub async fn gc(k: Arc<Kernel>, _s: Arc<Session>, _a: Value) -> Result<Value, KernelError> {
    to_value(collect_all(&k).await?)
}

pub async fn collect_all(k: &Arc<Kernel>) -> Result<GcResult, KernelError> {
    let rows =
        k.db.call(|c| workspace::list_rows(c, None, None, i64::MAX))
            .await?;
    let mut out = GcResult::default();
    for row in rows.iter().filter(|r| !r.is_archived()) {
        let w = k.workspaces.open(row).await?;
        let freed = collect_one(&w, k.config.gc_grace).await?;
        out.workspaces += 1;
        out.manifests += freed.manifests as u64;
        out.chunks += freed.chunks as u64;
    }
    if let Some(mirror) = &k.mirror {
        // The mark covers every workspace's snapshots, archived ones too
        // (reopened for it, closed again): a store that cannot be read
        // fails the sweep rather than shrinking the mark.
        let mut stores = Vec::with_capacity(rows.len());
        for row in &rows {
            stores.push(k.workspaces.open(row).await?.dofs.clone());
        }
        let known = rows.iter().map(|r| r.id.clone()).collect();
        let stored_before = std::time::SystemTime::now() - k.config.gc_grace;
        let swept = mirror.sweep(stores, known, stored_before).await;
        for row in rows.iter().filter(|r| r.is_archived()) {
            k.workspaces.close(&row.id).await;
        }
        let swept = swept?;
        out.store_chunks = swept.chunks;
        out.store_bytes = swept.bytes;
        out.store_repacked = swept.repacked;
    }
    tracing::info!(
        workspaces = out.workspaces,
        manifests = out.manifests,
        chunks = out.chunks,
        store_chunks = out.store_chunks,
        store_bytes = out.store_bytes,
        store_repacked = out.store_repacked,
        "garbage collected"
    );
    Ok(out)
}
