//! `sys.workspace.create|list|get|archive`.

use gsv_protocol::workspace::{
    BackendArg, BackendSpec, CreateArgs, GetResult, IdArgs, ListArgs, ListResult, WorkspaceResult,
};
use std::sync::Arc;

use crate::db::now_ms;
use crate::domains::accounts;
use crate::domains::snapshot;
use crate::domains::workspace::{self, Backend, WorkspaceRow};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

pub async fn create(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: CreateArgs,
) -> Result<WorkspaceResult, KernelError> {
    let backend = match a.backend {
        None => Backend::Local,
        Some(BackendArg::Name(n)) if n == "local" => Backend::Local,
        Some(BackendArg::Name(n)) => {
            return Err(KernelError::BadRequest(format!(
                "Unknown backend '{n}': use \"local\" or {{kind:\"remote\", address, tokenFile}}"
            )));
        }
        Some(BackendArg::Spec(BackendSpec::Local)) => Backend::Local,
        Some(BackendArg::Spec(BackendSpec::Remote {
            address,
            token_file,
        })) => {
            // Naming a file the kernel reads is a privilege: a user could
            // otherwise point it at any file the kernel can open.
            if !s.identity.is_root() {
                return Err(KernelError::PermissionDenied(
                    "remote workspace backends (root only)".into(),
                ));
            }
            if address.is_empty() {
                return Err(KernelError::BadRequest(
                    "remote backend needs an address".into(),
                ));
            }
            Backend::Remote {
                address,
                token_file,
            }
        }
    };
    let label = a
        .label
        .map(|l| l.trim().chars().take(120).collect::<String>());
    let now = now_ms();
    let row = WorkspaceRow {
        id: format!("ws_{}", accounts::random_hex(12)),
        owner_uid: s.identity.uid,
        label: label.filter(|l| !l.is_empty()),
        kind: "thread".into(),
        state: "active".into(),
        backend,
        created_at: now,
        updated_at: now,
    };
    let r = row.clone();
    k.db.call(move |c| workspace::insert_row(c, &r)).await?;
    let w = k.workspaces.open(&row).await?;
    if let Some(snapshot_id) = &a.from_snapshot
        && let Err(e) = snapshot::calls::fork_into(&k, &s, snapshot_id, &w).await
    {
        // Nothing half-made stays: the row goes, the store is closed.
        let id = row.id.clone();
        k.workspaces.close(&id).await;
        let _ = k.workspaces.delete_row(&k.db, &id).await;
        let _ = std::fs::remove_dir_all(&w.dir);
        return Err(e);
    }
    tracing::info!(workspace = %row.id, owner = row.owner_uid, "workspace created");
    Ok(WorkspaceResult {
        workspace: row.to_info(),
    })
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let owner = match a.uid {
        Some(u) if u != s.identity.uid && !s.identity.is_root() => {
            return Err(KernelError::PermissionDenied(format!(
                "workspaces of uid {u}"
            )));
        }
        Some(u) => Some(u),
        None => Some(s.identity.uid),
    };
    let limit = a.limit.unwrap_or(100).clamp(1, 1000);
    let rows =
        k.db.call(move |c| workspace::list_rows(c, owner, a.state.as_deref(), limit))
            .await?;
    // Each workspace's process count and active process (issue 26).
    let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
    let procs =
        k.db.call(move |c| {
            ids.iter()
                .map(|id| crate::domains::proc::store::workspace_processes(c, id))
                .collect::<Result<Vec<_>, _>>()
        })
        .await?;
    Ok(ListResult {
        workspaces: rows
            .iter()
            .zip(procs)
            .map(|(r, (count, active))| {
                let mut info = r.to_info();
                info.process_count = count;
                info.active_process = active;
                info
            })
            .collect(),
    })
}

pub async fn get(k: Arc<Kernel>, s: Arc<Session>, a: IdArgs) -> Result<GetResult, KernelError> {
    let row = k
        .workspaces
        .visible_row(&k.db, &s.identity, &a.workspace_id)
        .await
        .ok();
    Ok(GetResult {
        workspace: row.map(|r| r.to_info()),
    })
}

pub async fn archive(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: IdArgs,
) -> Result<WorkspaceResult, KernelError> {
    let row = k
        .workspaces
        .visible_row(&k.db, &s.identity, &a.workspace_id)
        .await?;
    k.workspaces.set_state(&k.db, &row.id, "archived").await?;
    k.workspaces.close(&row.id).await;
    let id = row.id.clone();
    let row =
        k.db.call(move |c| workspace::get_row(c, &id))
            .await?
            .ok_or_else(|| KernelError::Internal("archived workspace vanished".into()))?;
    Ok(WorkspaceResult {
        workspace: row.to_info(),
    })
}
