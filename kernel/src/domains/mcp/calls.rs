//! `sys.mcp.*`: add, list, remove, refresh and call a user's MCP servers.
//! Non-root callers are scoped to themselves; another user's server is
//! not found. State changes are signalled as `mcp.changed` to the owner.
//! A server that asks for authorization goes `authenticating` with an
//! `authUrl`; the OAuth callback ([`signed_in`]) connects it.

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
use crate::domains::codemode::{self, sandbox::McpBinding};
use crate::domains::{accounts, oauth};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};

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

/// `row`'s headers with its OAuth account's bearer token, when it has
/// one (refreshed if it expired).
async fn headers_of(
    k: &Arc<Kernel>,
    row: &ServerRow,
) -> Result<BTreeMap<String, String>, McpError> {
    let mut headers = row.headers.clone();
    match oauth::calls::bearer_for(k, row.uid, &row.server_id).await {
        Ok(Some(token)) => {
            headers.insert("Authorization".into(), format!("Bearer {token}"));
        }
        Ok(None) => {}
        Err(e) => {
            return Err(McpError::Connect {
                url: row.url.clone(),
                reason: format!("reading its OAuth account: {e}"),
            });
        }
    }
    Ok(headers)
}

/// Starts the sign-in of `row`'s server: `authenticating` with an
/// `authUrl`, or `failed` when no flow could start.
async fn sign_in(k: &Arc<Kernel>, row: &ServerRow, callback_host: Option<&str>) {
    match oauth::calls::start_for_mcp(
        k,
        row.uid,
        &row.server_id,
        &row.name,
        &row.url,
        callback_host,
    )
    .await
    {
        Ok(auth_url) => k.mcp.authenticating(&row.server_id, auth_url),
        Err(e) => k.mcp.failed(
            &row.server_id,
            format!("{} needs OAuth sign-in: {e}", row.url),
        ),
    }
}

/// (Re)connects `row`'s server and records how that went; a server that
/// asks for authorization starts a sign-in.
async fn connect(k: &Arc<Kernel>, row: &ServerRow) -> Result<(), McpError> {
    k.mcp.connecting(&row.server_id);
    changed(
        k,
        row.uid,
        &row.server_id,
        Some(McpConnectionState::Connecting),
    );
    let outcome = match headers_of(k, row).await {
        Ok(headers) => client::connect(&row.url, &headers).await,
        Err(e) => Err(e),
    };
    let state = match outcome {
        Ok((session, discovered)) => {
            k.mcp.ready(&row.server_id, session, discovered);
            Ok(())
        }
        Err(e @ McpError::AuthRequired { .. }) => {
            sign_in(k, row, None).await;
            Err(e)
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

/// The functions a CodeMode block of `uid` gets for their ready MCP tools
/// (none if the servers cannot be listed: the block still runs, without
/// them).
pub async fn codemode_bindings(k: &Arc<Kernel>, uid: i64) -> Vec<McpBinding> {
    match servers_of(k, uid).await {
        Ok(servers) => codemode::bindings(&servers),
        Err(e) => {
            tracing::warn!(uid, error = %e, "listing MCP servers for CodeMode");
            Vec::new()
        }
    }
}

pub async fn add(k: Arc<Kernel>, s: Arc<Session>, a: AddArgs) -> Result<AddResult, KernelError> {
    let uid = s.acting_uid(a.uid)?;
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
    let callback_host = a.callback_host.filter(|h| !h.trim().is_empty());
    if let Some(h) = &callback_host {
        check_url(h.trim()).map_err(|e| invalid(format!("callbackHost: {e}")))?;
    }
    // Nothing is stored for a server that cannot be reached; one that
    // asks for authorization is stored and waits for its sign-in.
    let connected = match client::connect(&url, &headers).await {
        Ok(c) => Some(c),
        Err(McpError::AuthRequired { .. }) => None,
        Err(e) => return Err(e.into()),
    };
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
    if stored.server_id != row.server_id {
        // A concurrent add of the same URL won; its server is the answer.
        drop(connected);
        connect_untried(&k, std::slice::from_ref(&stored)).await;
    } else if let Some((session, discovered)) = connected {
        k.mcp.ready(&row.server_id, session, discovered);
        changed(&k, uid, &row.server_id, Some(McpConnectionState::Ready));
    } else {
        sign_in(&k, &row, callback_host.as_deref().map(str::trim)).await;
        changed(&k, uid, &row.server_id, Some(k.mcp.state(&row.server_id)));
    }
    tracing::info!(server = %stored.server_id, uid, url = %stored.url, "MCP server added");
    Ok(AddResult {
        server: k.mcp.summary(&stored),
    })
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let uid = s.acting_uid(a.uid)?;
    Ok(ListResult {
        servers: servers_of(&k, uid).await?,
    })
}

pub async fn remove(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ServerArgs,
) -> Result<RemoveResult, KernelError> {
    let uid = s.acting_uid(a.uid)?;
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
    let uid = s.acting_uid(a.uid)?;
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
    let uid = s.acting_uid(a.uid)?;
    let id = a.server_id.clone();
    let row =
        k.db.call(move |c| store::get(c, uid, &id))
            .await?
            .ok_or_else(|| KernelError::NotFound {
                kind: "MCP server",
                id: a.server_id.clone(),
            })?;
    match k.mcp.state(&row.server_id) {
        McpConnectionState::Ready => {}
        // Reconnecting would only start another sign-in.
        McpConnectionState::Authenticating => {
            return Err(KernelError::BadRequest(format!(
                "MCP server {} needs OAuth sign-in first: {}",
                row.server_id,
                k.mcp.auth_url(&row.server_id).unwrap_or_default()
            )));
        }
        _ => connect(&k, &row).await?,
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

/// The OAuth callback stored the account of server `server_id` of `uid`:
/// it connects with it (and becomes `ready`).
pub async fn signed_in(k: &Arc<Kernel>, uid: i64, server_id: &str) {
    let id = server_id.to_owned();
    match k.db.call(move |c| store::get(c, uid, &id)).await {
        Ok(Some(row)) => {
            if let Err(e) = connect(k, &row).await {
                tracing::warn!(server = %server_id, error = %e, "MCP server still not connected after sign-in");
            }
        }
        Ok(None) => {
            tracing::info!(server = %server_id, "signed in to an MCP server removed meanwhile")
        }
        Err(e) => {
            tracing::error!(server = %server_id, error = %e, "reading a signed-in MCP server")
        }
    }
}

/// The sign-in of server `server_id` of `uid` failed at its callback.
pub fn sign_in_failed(k: &Kernel, uid: i64, server_id: &str, why: &str) {
    k.mcp
        .failed(server_id, format!("OAuth sign-in failed: {why}"));
    changed(k, uid, server_id, Some(McpConnectionState::Failed));
}
