//! `sys.oauth.start|list|forget`, and the two things the MCP domain asks
//! of OAuth: a flow for a server that answered 401 ([`start_for_mcp`])
//! and the bearer token of a signed-in server, refreshed when it has
//! expired ([`bearer_for`]). The browser's side is [`http`]. Non-root callers are scoped to themselves; another
//! user's account is not found.

pub mod http;

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use gsv_protocol::oauth::{
    ForgetArgs, ForgetResult, ListArgs, ListResult, OAuthConnectionKind, OAuthFlowSummary,
    StartArgs, StartResult,
};
use rand::RngCore;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::client::{self, Endpoints};
use super::discovery;
use super::store::{self, FlowRow};
use super::{
    CALLBACK_PATH, CLIENT_METADATA_PATH, DEFAULT_ACCOUNT_KEY, FLOW_TTL_MS, REFRESH_MARGIN_MS,
    RESERVED_AUTH_PARAMS, TIMER_KIND, check_url,
};
use crate::db::now_ms;
use crate::domains::accounts;
use crate::domains::timers::{Timer, table as timers};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

pub(super) fn timer_id(flow_id: &str) -> String {
    format!("{TIMER_KIND}:{flow_id}")
}

fn invalid(reason: impl Into<String>) -> KernelError {
    KernelError::InvalidArgs {
        call: "sys.oauth.start".into(),
        reason: reason.into(),
    }
}

/// The uid a call acts for: the caller's own, or (root only) `uid`.
fn target_uid(s: &Session, call: &str, uid: Option<i64>) -> Result<i64, KernelError> {
    s.acting_uid(uid).map_err(|_| {
        let u = uid.unwrap_or_default();
        KernelError::PermissionDenied(format!("{call} for uid {u} (only your own)"))
    })
}

/// The SHA-256 of a flow's state, as stored.
pub(super) fn state_hash(state: &str) -> String {
    hex::encode(Sha256::digest(state.as_bytes()))
}

/// What a new flow is for.
struct FlowSpec {
    uid: i64,
    kind: OAuthConnectionKind,
    provider: String,
    account_key: String,
    label: Option<String>,
    authorization_endpoint: String,
    token_endpoint: String,
    client_id: String,
    redirect_uri: String,
    scope: Option<String>,
    resource: Option<String>,
    extra: BTreeMap<String, String>,
    mcp_server_id: Option<String>,
}

/// Stores a pending flow (expiring in [`FLOW_TTL_MS`]) and builds its
/// authorization URL. The state is 32 random bytes; only its hash is kept.
async fn new_flow(k: &Arc<Kernel>, f: FlowSpec) -> Result<(String, OAuthFlowSummary), KernelError> {
    let mut raw = [0u8; 32];
    rand::rng().fill_bytes(&mut raw);
    let state = URL_SAFE_NO_PAD.encode(raw);
    let endpoints = Endpoints {
        authorization: &f.authorization_endpoint,
        token: &f.token_endpoint,
        client_id: &f.client_id,
        redirect_uri: &f.redirect_uri,
    };
    let (url, verifier) = client::authorization_url(
        &endpoints,
        &state,
        f.scope.as_deref(),
        f.resource.as_deref(),
        &f.extra,
    )
    .map_err(|e| invalid(e.to_string()))?;
    let created_at = now_ms();
    let row = FlowRow {
        summary: OAuthFlowSummary {
            flow_id: format!("oauthflow_{}", accounts::random_hex(12)),
            uid: f.uid,
            kind: f.kind,
            provider: f.provider,
            account_key: f.account_key,
            label: f.label,
            authorization_endpoint: f.authorization_endpoint,
            token_endpoint: f.token_endpoint,
            client_id: f.client_id,
            redirect_uri: f.redirect_uri,
            scope: f.scope,
            resource: f.resource,
            created_at,
            expires_at: created_at + FLOW_TTL_MS,
        },
        state_hash: state_hash(&state),
        pkce_verifier: k.oauth.seal.seal(&verifier),
        mcp_server_id: f.mcp_server_id,
    };
    let r = row.clone();
    k.db.call(move |c| {
        let tx = c.transaction()?;
        store::insert_flow(&tx, &r)?;
        let id = &r.summary.flow_id;
        timers::arm(&tx, &timer_id(id), r.summary.expires_at, TIMER_KIND, id)?;
        tx.commit()?;
        Ok(())
    })
    .await?;
    k.timers.poke();
    Ok((url, row.summary))
}

pub async fn start(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: StartArgs,
) -> Result<StartResult, KernelError> {
    let uid = target_uid(&s, "sys.oauth.start", a.uid)?;
    let provider = a.provider.trim().to_owned();
    if provider.is_empty() || provider.chars().count() > 200 {
        return Err(invalid("provider: must be 1 to 200 characters"));
    }
    let client_id = a.client_id.trim().to_owned();
    if client_id.is_empty() {
        return Err(invalid("clientId: must not be empty"));
    }
    check_url("authorizationEndpoint", &a.authorization_endpoint)?;
    check_url("tokenEndpoint", &a.token_endpoint)?;
    let redirect = check_url("redirectUri", &a.redirect_uri)?;
    if redirect.path() != CALLBACK_PATH {
        return Err(invalid(format!(
            "redirectUri: must be this kernel's {CALLBACK_PATH}, not {}",
            redirect.path()
        )));
    }
    let extra = a.extra_auth_params.unwrap_or_default();
    if let Some(reserved) = extra
        .keys()
        .find(|k| RESERVED_AUTH_PARAMS.contains(&k.to_ascii_lowercase().as_str()))
    {
        return Err(invalid(format!(
            "extraAuthParams.{reserved}: a parameter of the flow itself cannot be overridden"
        )));
    }
    let account_key = a
        .account_key
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
        .unwrap_or_else(|| DEFAULT_ACCOUNT_KEY.to_owned());
    let (authorization_url, flow) = new_flow(
        &k,
        FlowSpec {
            uid,
            kind: a.kind,
            provider,
            account_key,
            label: a
                .label
                .map(|l| l.trim().to_owned())
                .filter(|l| !l.is_empty()),
            authorization_endpoint: a.authorization_endpoint,
            token_endpoint: a.token_endpoint,
            client_id,
            redirect_uri: a.redirect_uri,
            scope: a.scope.filter(|s| !s.trim().is_empty()),
            resource: a.resource.filter(|r| !r.trim().is_empty()),
            extra,
            mcp_server_id: None,
        },
    )
    .await?;
    Ok(StartResult {
        authorization_url,
        flow,
    })
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let scope = match a.uid {
        None if s.identity.is_root() => None,
        uid => Some(target_uid(&s, "sys.oauth.list", uid)?),
    };
    let pending = a.include_pending;
    let (accounts, flows) =
        k.db.call(move |c| {
            let flows = if pending {
                Some(store::flows(c, scope)?)
            } else {
                None
            };
            Ok((store::accounts(c, scope)?, flows))
        })
        .await?;
    Ok(ListResult {
        accounts: accounts.into_iter().map(|a| a.summary).collect(),
        flows,
    })
}

pub async fn forget(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ForgetArgs,
) -> Result<ForgetResult, KernelError> {
    // Root forgets any account (or one of `uid`'s); anyone else only
    // their own, and another user's looks like a missing one.
    let scope = match a.uid {
        None if s.identity.is_root() => None,
        uid => Some(target_uid(&s, "sys.oauth.forget", uid)?),
    };
    let id = a.account_id.clone();
    let forgotten =
        k.db.call(move |c| store::delete_account(c, scope, &id))
            .await?;
    if forgotten {
        tracing::info!(account = %a.account_id, "OAuth account forgotten");
    }
    Ok(ForgetResult { forgotten })
}

/// A flow's expiry.
pub async fn on_timer(k: Arc<Kernel>, timer: Timer) {
    let id = timer.payload;
    let i = id.clone();
    if let Err(e) = k.db.call(move |c| store::delete_expired_flow(c, &i)).await {
        tracing::error!(flow = %id, error = %e, "expiring an OAuth flow");
    }
}

/// Why an MCP server's sign-in could not start.
#[derive(Debug, thiserror::Error)]
pub enum McpSignInError {
    #[error(
        "no public URL for the OAuth callback: pass callbackHost, or start gsv serve with --public-url"
    )]
    NoOrigin,
    #[error("callbackHost: {0}")]
    CallbackHost(String),
    #[error("{0}")]
    Discovery(#[from] discovery::DiscoveryError),
    #[error("{0}")]
    Kernel(#[from] KernelError),
}

/// Starts the sign-in of MCP server `server_id` (at `url`, named `name`)
/// of `uid`: discovery, client registration, a pending flow; its
/// authorization URL.
pub async fn start_for_mcp(
    k: &Arc<Kernel>,
    uid: i64,
    server_id: &str,
    name: &str,
    url: &str,
    callback_host: Option<&str>,
) -> Result<String, McpSignInError> {
    let origin = match callback_host {
        Some(h) => {
            let u = crate::domains::mcp::check_url(h)
                .map_err(|e| McpSignInError::CallbackHost(e.to_string()))?;
            u.origin().ascii_serialization()
        }
        None => k.oauth.origin().ok_or(McpSignInError::NoOrigin)?.to_owned(),
    };
    let redirect_uri = format!("{origin}{CALLBACK_PATH}");
    let server = discovery::discover(&k.oauth.http, url).await?;
    let client_id = match discovery::register(&k.oauth.http, &server, &redirect_uri).await {
        Ok(id) => id,
        // Without registration, the metadata document's URL is the id.
        Err(discovery::DiscoveryError::NoRegistration(_)) => {
            format!("{origin}{CLIENT_METADATA_PATH}")
        }
        Err(e) => return Err(e.into()),
    };
    let (auth_url, _) = new_flow(
        k,
        FlowSpec {
            uid,
            kind: OAuthConnectionKind::McpServer,
            provider: url.to_owned(),
            account_key: server_id.to_owned(),
            label: Some(name.to_owned()),
            authorization_endpoint: server.authorization_endpoint,
            token_endpoint: server.token_endpoint,
            client_id,
            redirect_uri,
            scope: server.scope,
            resource: Some(server.resource),
            extra: BTreeMap::new(),
            mcp_server_id: Some(server_id.to_owned()),
        },
    )
    .await?;
    Ok(auth_url)
}

/// The access token of MCP server `server_id` of `uid`, refreshed first
/// when it has expired (or is about to) and a refresh token exists;
/// `None` when the server was never signed in to.
pub async fn bearer_for(
    k: &Arc<Kernel>,
    uid: i64,
    server_id: &str,
) -> Result<Option<String>, KernelError> {
    let key = server_id.to_owned();
    let Some(account) =
        k.db.call(move |c| store::account_by_key(c, uid, OAuthConnectionKind::McpServer, &key))
            .await?
    else {
        return Ok(None);
    };
    let s = &account.summary;
    let expiring = s
        .expires_at
        .is_some_and(|at| at <= now_ms() + REFRESH_MARGIN_MS);
    if expiring && let Some(sealed) = &account.refresh_token {
        let refresh_token = k.oauth.seal.open(sealed)?;
        let meta = |key: &str| s.metadata.get(key).and_then(Value::as_str).unwrap_or("");
        let endpoints = Endpoints {
            authorization: meta("authorizationEndpoint"),
            token: &account.token_endpoint,
            client_id: &s.client_id,
            redirect_uri: meta("redirectUri"),
        };
        match client::refresh(
            &k.oauth.http,
            &endpoints,
            &refresh_token,
            s.resource.as_deref(),
        )
        .await
        {
            Ok(g) => {
                let (id, access, refresh, at) = (
                    s.account_id.clone(),
                    k.oauth.seal.seal(&g.access_token),
                    g.refresh_token.as_deref().map(|t| k.oauth.seal.seal(t)),
                    g.expires_at,
                );
                k.db.call(move |c| store::set_tokens(c, &id, &access, refresh.as_deref(), at))
                    .await?;
                tracing::info!(account = %s.account_id, "OAuth token refreshed");
                return Ok(Some(g.access_token));
            }
            // The server decides: an expired token it refuses leads to a
            // new sign-in.
            Err(e) => tracing::warn!(account = %s.account_id, error = %e, "OAuth refresh failed"),
        }
    }
    let id = s.account_id.clone();
    k.db.call(move |c| store::touch_used(c, &id)).await?;
    Ok(Some(k.oauth.seal.open(&account.access_token)?))
}
