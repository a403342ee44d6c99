//! `sys.mcp.*`: add, list, remove, refresh and call a user's MCP servers.
//! Non-root callers are scoped to themselves; another user's server is
//! not found. State changes are signalled as `mcp.changed` to the owner.

use std::collections::BTreeMap;
use std::sync::Arc;

use gsv_protocol::mcp::{
    AddArgs, AddResult, CallArgs, CallResult, ListArgs, ListResult, McpConnectionState,
    McpServerSummary, McpTransportType, RefreshResult, RemoveResult, ServerArgs,
};
use serde_json::json;

use super::client::{self, McpError};
use super::store::{self, ServerRow};
use super::{MAX_NAME_CHARS, check_url};
use crate::db::now_ms;
use crate::domains::accounts;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};

fn target_uid(s: &Session, uid: Option<i64>) -> Result<i64, KernelError> {
    match uid {
        Some(u) if u != s.identity.uid && !s.identity.is_root() => {
            Err(KernelError::PermissionDenied(format!("uid {u}")))
        }
        Some(u) => Ok(u),
        None => Ok(s.identity.uid),
    }
}

fn invalid(reason: impl std::fmt::Display) -> KernelError {
    KernelError::InvalidArgs {
        call: "sys.mcp.add".into(),
        reason: reason.to_string(),
    }
}

impl From<McpError> for KernelError {
    fn from(e: McpError) -> Self {
        match e {
            McpError::Header(_) | McpError::AuthRequired { .. } => {
                KernelError::BadRequest(e.to_string())
            }
            McpError::Connect { .. } | McpError::Timeout { .. } | McpError::Call(_) => {
                KernelError::Unavailable(e.to_string())
            }
        }
    }
}

/// Tells the owner's sockets that a server changed.
fn changed(k: &Kernel, uid: i64, server_id: &str, state: Option<McpConnectionState>) {
    let payload = match state {
        Some(state) => json!({"serverId": server_id, "uid": uid, "state": state}),
        None => json!({"serverId": server_id, "uid": uid, "removed": true}),
    };
    k.pool.signal_user(uid, Role::User, "mcp.changed", payload);
}

/// (Re)connects `row`'s server and records how that went.
async fn connect(k: &Arc<Kernel>, row: &ServerRow) -> Result<(), McpError> {
    k.mcp.connecting(&row.server_id);
    changed(
        k,
        row.uid,
        &row.server_id,
        Some(McpConnectionState::Connecting),
    );
    let outcome = client::connect(&row.url, &row.headers).await;
    let state = match outcome {
        Ok((session, discovered)) => {
            k.mcp.ready(&row.server_id, session, discovered);
            Ok(())
        }
        Err(e) => {
            k.mcp.failed(&row.server_id, e.to_string());
            Err(e)
        }
    };
    changed(
        k,
        row.uid,
        &row.server_id,
        Some(k.mcp.state(&row.server_id)),
    );
    state
}

/// Connects the rows never tried since the kernel started.
async fn connect_untried(k: &Arc<Kernel>, rows: &[ServerRow]) {
    let untried = rows
        .iter()
        .filter(|r| k.mcp.state(&r.server_id) == McpConnectionState::NotConnected);
    futures::future::join_all(untried.map(|r| connect(k, r))).await;
}

/// `uid`'s servers, each connected once since start: `sys.mcp.list`, and
/// CodeMode's tool functions.
pub async fn servers_of(k: &Arc<Kernel>, uid: i64) -> Result<Vec<McpServerSummary>, KernelError> {
    let rows = k.db.call(move |c| store::list(c, uid)).await?;
    connect_untried(k, &rows).await;
    Ok(rows.iter().map(|r| k.mcp.summary(r)).collect())
}

pub async fn add(k: Arc<Kernel>, s: Arc<Session>, a: AddArgs) -> Result<AddResult, KernelError> {
    let uid = target_uid(&s, a.uid)?;
    let name = a.name.trim().to_owned();
    let chars = name.chars().count();
    if chars == 0 || chars > MAX_NAME_CHARS {
        return Err(invalid(format!(
            "name must be 1 to {MAX_NAME_CHARS} characters"
        )));
    }
    let url = check_url(a.url.trim()).map_err(invalid)?.to_string();
    let transport = a.transport.unwrap_or_default();
    let kind = transport.kind.unwrap_or_default();
    if kind == McpTransportType::Sse {
        return Err(invalid(
            "transport.type sse (the legacy transport) is not supported; use streamable-http",
        ));
    }
    let (u, existing_url) = (uid, url.clone());
    if let Some(existing) =
        k.db.call(move |c| store::by_url(c, u, &existing_url))
            .await?
    {
        connect_untried(&k, std::slice::from_ref(&existing)).await;
        return Ok(AddResult {
            server: k.mcp.summary(&existing),
        });
    }
    let headers: BTreeMap<String, String> = transport.headers.unwrap_or_default();
    // Nothing is stored for a server that cannot be reached.
    let (session, discovered) = client::connect(&url, &headers).await?;
    let now = now_ms();
    let row = ServerRow {
        server_id: format!("mcp_{}", accounts::random_hex(8)),
        uid,
        name,
        url,
        transport: kind,
        headers,
        created_at: now,
        updated_at: now,
    };
    let r = row.clone();
    let stored = k.db.call(move |c| store::insert_or_existing(c, &r)).await?;
    if stored.server_id == row.server_id {
        k.mcp.ready(&row.server_id, session, discovered);
        changed(&k, uid, &row.server_id, Some(McpConnectionState::Ready));
    } else {
        // A concurrent add of the same URL won; its server is the answer.
        drop(session);
        connect_untried(&k, std::slice::from_ref(&stored)).await;
    }
    tracing::info!(server = %stored.server_id, uid, url = %stored.url, "MCP server added");
    Ok(AddResult {
        server: k.mcp.summary(&stored),
    })
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let uid = target_uid(&s, a.uid)?;
    Ok(ListResult {
        servers: servers_of(&k, uid).await?,
    })
}

pub async fn remove(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ServerArgs,
) -> Result<RemoveResult, KernelError> {
    let uid = target_uid(&s, a.uid)?;
    let id = a.server_id.clone();
    let removed = k.db.call(move |c| store::delete(c, uid, &id)).await?;
    if removed {
        k.mcp.remove(&a.server_id);
        changed(&k, uid, &a.server_id, None);
    }
    Ok(RemoveResult { removed })
}

pub async fn refresh(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ServerArgs,
) -> Result<RefreshResult, KernelError> {
    let uid = target_uid(&s, a.uid)?;
    let id = a.server_id.clone();
    let Some(row) = k.db.call(move |c| store::get(c, uid, &id)).await? else {
        return Ok(RefreshResult { server: None });
    };
    // A failure is the summary's state and error, not the call's.
    let _ = connect(&k, &row).await;
    let (id, now) = (row.server_id.clone(), now_ms());
    k.db.call(move |c| store::touch(c, &id, now)).await?;
    Ok(RefreshResult {
        server: Some(k.mcp.summary(&ServerRow {
            updated_at: now,
            ..row
        })),
    })
}

pub async fn call(k: Arc<Kernel>, s: Arc<Session>, a: CallArgs) -> Result<CallResult, KernelError> {
    let uid = target_uid(&s, a.uid)?;
    let id = a.server_id.clone();
    let row =
        k.db.call(move |c| store::get(c, uid, &id))
            .await?
            .ok_or_else(|| KernelError::NotFound {
                kind: "MCP server",
                id: a.server_id.clone(),
            })?;
    if k.mcp.state(&row.server_id) != McpConnectionState::Ready {
        connect(&k, &row).await?;
    }
    let peer = k.mcp.peer(&row.server_id).ok_or_else(|| {
        KernelError::Unavailable(format!("MCP server {} is not ready", row.server_id))
    })?;
    match client::call(&peer, &a.name, a.arguments).await {
        Ok(r) => Ok(r),
        Err(e) => {
            // The session may have died (a restarted server): mark it, so
            // the next call reconnects.
            k.mcp.failed(&row.server_id, e.to_string());
            changed(&k, uid, &row.server_id, Some(McpConnectionState::Failed));
            Err(e.into())
        }
    }
}
