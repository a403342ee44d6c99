//! The `oauth_flows` and `oauth_accounts` tables (migration 120). A flow
//! is found by the SHA-256 of its `state` (the state itself is never
//! stored) and taken out by its callback, so it is used once. An account
//! is one per `(uid, provider, accountKey)`; its tokens and a flow's PKCE
//! verifier are stored sealed (`super::seal`).

use gsv_protocol::oauth::{OAuthAccountSummary, OAuthConnectionKind, OAuthFlowSummary};
use rusqlite::{Connection, Row, params};
use serde_json::{Map, Value};

use crate::db::{now_ms, opt};
use crate::error::KernelError;

pub const MIGRATION: &str = "CREATE TABLE oauth_flows(
        flow_id TEXT PRIMARY KEY,
        state_hash TEXT NOT NULL UNIQUE,
        uid INTEGER NOT NULL,
        kind TEXT NOT NULL,
        provider TEXT NOT NULL,
        account_key TEXT NOT NULL,
        label TEXT,
        authorization_endpoint TEXT NOT NULL,
        token_endpoint TEXT NOT NULL,
        client_id TEXT NOT NULL,
        redirect_uri TEXT NOT NULL,
        scope TEXT,
        resource TEXT,
        pkce_verifier TEXT NOT NULL,
        mcp_server_id TEXT,
        created_at INTEGER NOT NULL,
        expires_at INTEGER NOT NULL);
     CREATE INDEX oauth_flows_uid ON oauth_flows(uid);
     CREATE TABLE oauth_accounts(
        account_id TEXT PRIMARY KEY,
        uid INTEGER NOT NULL,
        kind TEXT NOT NULL,
        provider TEXT NOT NULL,
        account_key TEXT NOT NULL,
        label TEXT,
        scope TEXT,
        resource TEXT,
        client_id TEXT NOT NULL,
        token_endpoint TEXT NOT NULL,
        token_type TEXT NOT NULL,
        access_token TEXT NOT NULL,
        refresh_token TEXT,
        expires_at INTEGER,
        metadata TEXT NOT NULL DEFAULT '{}',
        created_at INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        last_used_at INTEGER,
        UNIQUE(uid, provider, account_key));";

/// A pending flow with what its callback needs.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowRow {
    pub summary: OAuthFlowSummary,
    pub state_hash: String,
    /// Sealed.
    pub pkce_verifier: String,
    /// The MCP server that asked for this flow, if one did.
    pub mcp_server_id: Option<String>,
}

/// An account with its sealed tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountRow {
    pub summary: OAuthAccountSummary,
    pub token_endpoint: String,
    /// Sealed.
    pub access_token: String,
    /// Sealed.
    pub refresh_token: Option<String>,
}

fn kind_of(s: String) -> OAuthConnectionKind {
    OAuthConnectionKind::parse(&s).unwrap_or(OAuthConnectionKind::Generic)
}

const FLOW_COLS: &str = "flow_id, uid, kind, provider, account_key, label, authorization_endpoint,
    token_endpoint, client_id, redirect_uri, scope, resource, created_at, expires_at, state_hash,
    pkce_verifier, mcp_server_id";

fn flow(r: &Row<'_>) -> rusqlite::Result<FlowRow> {
    Ok(FlowRow {
        summary: OAuthFlowSummary {
            flow_id: r.get(0)?,
            uid: r.get(1)?,
            kind: kind_of(r.get(2)?),
            provider: r.get(3)?,
            account_key: r.get(4)?,
            label: r.get(5)?,
            authorization_endpoint: r.get(6)?,
            token_endpoint: r.get(7)?,
            client_id: r.get(8)?,
            redirect_uri: r.get(9)?,
            scope: r.get(10)?,
            resource: r.get(11)?,
            created_at: r.get(12)?,
            expires_at: r.get(13)?,
        },
        state_hash: r.get(14)?,
        pkce_verifier: r.get(15)?,
        mcp_server_id: r.get(16)?,
    })
}

const ACCOUNT_COLS: &str = "account_id, uid, kind, provider, account_key, label, scope, resource,
    client_id, token_type, expires_at, created_at, updated_at, last_used_at, metadata,
    token_endpoint, access_token, refresh_token";

fn account(r: &Row<'_>) -> rusqlite::Result<AccountRow> {
    let metadata: String = r.get(14)?;
    Ok(AccountRow {
        summary: OAuthAccountSummary {
            account_id: r.get(0)?,
            uid: r.get(1)?,
            kind: kind_of(r.get(2)?),
            provider: r.get(3)?,
            account_key: r.get(4)?,
            label: r.get(5)?,
            scope: r.get(6)?,
            resource: r.get(7)?,
            client_id: r.get(8)?,
            token_type: r.get(9)?,
            expires_at: r.get(10)?,
            created_at: r.get(11)?,
            updated_at: r.get(12)?,
            last_used_at: r.get(13)?,
            metadata: serde_json::from_str::<Map<String, Value>>(&metadata).unwrap_or_default(),
        },
        token_endpoint: r.get(15)?,
        access_token: r.get(16)?,
        refresh_token: r.get(17)?,
    })
}

pub fn insert_flow(c: &Connection, f: &FlowRow) -> Result<(), KernelError> {
    let s = &f.summary;
    c.execute(
        &format!("INSERT INTO oauth_flows({FLOW_COLS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"),
        params![
            s.flow_id,
            s.uid,
            s.kind.as_str(),
            s.provider,
            s.account_key,
            s.label,
            s.authorization_endpoint,
            s.token_endpoint,
            s.client_id,
            s.redirect_uri,
            s.scope,
            s.resource,
            s.created_at,
            s.expires_at,
            f.state_hash,
            f.pkce_verifier,
            f.mcp_server_id
        ],
    )?;
    Ok(())
}

/// Takes the unexpired flow whose state hashes to `state_hash` out of the
/// table: a callback uses a flow once.
pub fn take_flow(c: &mut Connection, state_hash: &str) -> Result<Option<FlowRow>, KernelError> {
    let tx = c.transaction()?;
    let found = opt(tx.query_row(
        &format!("SELECT {FLOW_COLS} FROM oauth_flows WHERE state_hash = ?1 AND expires_at > ?2"),
        params![state_hash, now_ms()],
        flow,
    ))?;
    if let Some(f) = &found {
        tx.execute(
            "DELETE FROM oauth_flows WHERE flow_id = ?1",
            [&f.summary.flow_id],
        )?;
    }
    tx.commit()?;
    Ok(found)
}

/// Unexpired flows of `uid` (every user's when `None`), newest first.
pub fn flows(c: &Connection, uid: Option<i64>) -> Result<Vec<OAuthFlowSummary>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {FLOW_COLS} FROM oauth_flows WHERE (?1 IS NULL OR uid = ?1) AND expires_at > ?2
         ORDER BY created_at DESC, flow_id"
    ))?;
    let rows = stmt.query_map(params![uid, now_ms()], flow)?;
    Ok(rows
        .map(|r| r.map(|f| f.summary))
        .collect::<Result<_, _>>()?)
}

/// Deletes flow `flow_id` if it has expired.
pub fn delete_expired_flow(c: &Connection, flow_id: &str) -> Result<bool, KernelError> {
    Ok(c.execute(
        "DELETE FROM oauth_flows WHERE flow_id = ?1 AND expires_at <= ?2",
        params![flow_id, now_ms()],
    )? > 0)
}

/// Stores `a`, replacing the tokens of the account `(uid, provider,
/// accountKey)` already has (which keeps its id and creation time).
pub fn upsert_account(c: &Connection, a: &AccountRow) -> Result<AccountRow, KernelError> {
    let s = &a.summary;
    c.execute(
        &format!(
            "INSERT INTO oauth_accounts({ACCOUNT_COLS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)
             ON CONFLICT(uid, provider, account_key) DO UPDATE SET
               kind = excluded.kind, label = excluded.label, scope = excluded.scope,
               resource = excluded.resource, client_id = excluded.client_id,
               token_type = excluded.token_type, expires_at = excluded.expires_at,
               updated_at = excluded.updated_at, metadata = excluded.metadata,
               token_endpoint = excluded.token_endpoint, access_token = excluded.access_token,
               refresh_token = excluded.refresh_token"
        ),
        params![
            s.account_id,
            s.uid,
            s.kind.as_str(),
            s.provider,
            s.account_key,
            s.label,
            s.scope,
            s.resource,
            s.client_id,
            s.token_type,
            s.expires_at,
            s.created_at,
            s.updated_at,
            s.last_used_at,
            Value::Object(s.metadata.clone()).to_string(),
            a.token_endpoint,
            a.access_token,
            a.refresh_token
        ],
    )?;
    let stored = opt(c.query_row(
        &format!(
            "SELECT {ACCOUNT_COLS} FROM oauth_accounts
             WHERE uid = ?1 AND provider = ?2 AND account_key = ?3"
        ),
        params![s.uid, s.provider, s.account_key],
        account,
    ))?;
    stored.ok_or_else(|| KernelError::Internal("an upserted OAuth account vanished".into()))
}

/// Accounts of `uid` (every user's when `None`), oldest first.
pub fn accounts(c: &Connection, uid: Option<i64>) -> Result<Vec<AccountRow>, KernelError> {
    let mut stmt = c.prepare(&format!(
        "SELECT {ACCOUNT_COLS} FROM oauth_accounts WHERE ?1 IS NULL OR uid = ?1
         ORDER BY created_at, account_id"
    ))?;
    let rows = stmt.query_map([uid], account)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

/// `uid`'s account of `kind` named `account_key`.
pub fn account_by_key(
    c: &Connection,
    uid: i64,
    kind: OAuthConnectionKind,
    account_key: &str,
) -> Result<Option<AccountRow>, KernelError> {
    opt(c.query_row(
        &format!(
            "SELECT {ACCOUNT_COLS} FROM oauth_accounts
             WHERE uid = ?1 AND kind = ?2 AND account_key = ?3
             ORDER BY updated_at DESC LIMIT 1"
        ),
        params![uid, kind.as_str(), account_key],
        account,
    ))
}

/// Replaces an account's tokens after a refresh.
pub fn set_tokens(
    c: &Connection,
    account_id: &str,
    access_token: &str,
    refresh_token: Option<&str>,
    expires_at: Option<i64>,
) -> Result<(), KernelError> {
    let now = now_ms();
    c.execute(
        "UPDATE oauth_accounts SET access_token = ?2,
            refresh_token = coalesce(?3, refresh_token), expires_at = ?4,
            updated_at = ?5, last_used_at = ?5
         WHERE account_id = ?1",
        params![account_id, access_token, refresh_token, expires_at, now],
    )?;
    Ok(())
}

pub fn touch_used(c: &Connection, account_id: &str) -> Result<(), KernelError> {
    c.execute(
        "UPDATE oauth_accounts SET last_used_at = ?2 WHERE account_id = ?1",
        params![account_id, now_ms()],
    )?;
    Ok(())
}

/// Deletes account `account_id` of `uid` (any user's when `None`).
pub fn delete_account(
    c: &Connection,
    uid: Option<i64>,
    account_id: &str,
) -> Result<bool, KernelError> {
    Ok(c.execute(
        "DELETE FROM oauth_accounts WHERE account_id = ?1 AND (?2 IS NULL OR uid = ?2)",
        params![account_id, uid],
    )? > 0)
}
