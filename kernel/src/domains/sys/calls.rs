//! `sys.token.*` and `sys.config.*`.

use gsv_protocol::sys::{
    ConfigEntry, ConfigGetArgs, ConfigGetResult, ConfigSetArgs, ConfigSetResult, CreatedToken,
    TokenCreateArgs, TokenCreateResult, TokenListResult, TokenRevokeArgs, TokenRevokeResult,
    UidArgs,
};
use std::sync::Arc;

use serde_json::Value;

use crate::domains::accounts::{self, NewToken};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

pub async fn token_create(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: TokenCreateArgs,
) -> Result<TokenCreateResult, KernelError> {
    let uid = s.acting_uid(a.uid)?;
    let role_for_kind = match a.kind.as_str() {
        "node" => "driver",
        "service" => "service",
        "user" => "user",
        other => {
            return Err(KernelError::BadRequest(format!(
                "Invalid token kind: {other} (node, service or user)"
            )));
        }
    };
    if let Some(r) = &a.allowed_role
        && r != role_for_kind
    {
        return Err(KernelError::BadRequest(format!(
            "A {} token can only allow role {role_for_kind}, not {r}",
            a.kind
        )));
    }
    if a.kind == "node" && a.allowed_device_id.as_deref().is_none_or(str::is_empty) {
        return Err(KernelError::BadRequest(
            "A node token must be bound to a device: give allowedDeviceId".into(),
        ));
    }
    let t = NewToken {
        uid,
        kind: a.kind,
        label: a.label,
        allowed_role: Some(role_for_kind.to_owned()),
        allowed_device_id: a.allowed_device_id,
        expires_at: a.expires_at,
    };
    let (raw, info) =
        k.db.call(move |c| {
            if accounts::identity_by_uid(c, t.uid)?.is_none() {
                return Err(KernelError::BadRequest(format!("Unknown uid {}", t.uid)));
            }
            accounts::create_token(c, &t)
        })
        .await?;
    Ok(TokenCreateResult {
        token: CreatedToken::new(info, raw),
    })
}

pub async fn token_list(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: UidArgs,
) -> Result<TokenListResult, KernelError> {
    let scope = if s.identity.is_root() {
        a.uid
    } else {
        Some(s.acting_uid(a.uid)?)
    };
    let tokens = k.db.call(move |c| accounts::list_tokens(c, scope)).await?;
    Ok(TokenListResult { tokens })
}

pub async fn token_revoke(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: TokenRevokeArgs,
) -> Result<TokenRevokeResult, KernelError> {
    let scope = if s.identity.is_root() {
        a.uid
    } else {
        Some(s.acting_uid(a.uid)?)
    };
    let revoked =
        k.db.call(move |c| accounts::revoke_token(c, &a.token_id, scope, a.reason.as_deref()))
            .await?;
    Ok(TokenRevokeResult { revoked })
}

pub async fn config_get(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConfigGetArgs,
) -> Result<ConfigGetResult, KernelError> {
    let uid = s.identity.uid;
    let entries =
        k.db.call(move |c| accounts::config_get(c, uid, a.key.as_deref()))
            .await?;
    let entries = entries
        .into_iter()
        .map(|(key, value)| ConfigEntry { key, value })
        .collect();
    Ok(ConfigGetResult { entries })
}

pub async fn config_set(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConfigSetArgs,
) -> Result<ConfigSetResult, KernelError> {
    if a.key.is_empty() {
        return Err(KernelError::BadRequest("Config key required".into()));
    }
    if !accounts::config_writable(s.identity.uid, &a.key) {
        return Err(KernelError::PermissionDenied(format!(
            "config key {}",
            a.key
        )));
    }
    // Values are coerced to strings, as the reference's String(value).
    let value = match a.value {
        Value::String(s) => s,
        other => other.to_string(),
    };
    k.db.call(move |c| accounts::config_set(c, &a.key, &value))
        .await?;
    Ok(ConfigSetResult { ok: true })
}
