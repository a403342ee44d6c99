//! `sys.token.*` and `sys.config.*`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::domains::accounts::{self, NewToken};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// The uid a call acts on: the caller's own unless root names another.
fn target_uid(s: &Session, uid: Option<i64>) -> Result<i64, KernelError> {
    match uid {
        Some(u) if u != s.identity.uid && !s.identity.is_root() => {
            Err(KernelError::PermissionDenied(format!("uid {u}")))
        }
        Some(u) => Ok(u),
        None => Ok(s.identity.uid),
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreateArgs {
    uid: Option<i64>,
    kind: String,
    label: Option<String>,
    allowed_role: Option<String>,
    allowed_device_id: Option<String>,
    expires_at: Option<i64>,
}

pub async fn token_create(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: TokenCreateArgs,
) -> Result<Value, KernelError> {
    let uid = target_uid(&s, a.uid)?;
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
    let mut token = serde_json::to_value(&info).map_err(|e| KernelError::internal("token", e))?;
    token["token"] = json!(raw);
    for k in ["lastUsedAt", "revokedAt", "revokedReason"] {
        if let Some(o) = token.as_object_mut() {
            o.remove(k);
        }
    }
    Ok(json!({ "token": token }))
}

#[derive(Debug, Deserialize)]
pub struct UidArgs {
    uid: Option<i64>,
}

pub async fn token_list(k: Arc<Kernel>, s: Arc<Session>, a: UidArgs) -> Result<Value, KernelError> {
    let scope = if s.identity.is_root() {
        a.uid
    } else {
        Some(target_uid(&s, a.uid)?)
    };
    let tokens = k.db.call(move |c| accounts::list_tokens(c, scope)).await?;
    Ok(json!({ "tokens": tokens }))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenRevokeArgs {
    token_id: String,
    reason: Option<String>,
    uid: Option<i64>,
}

pub async fn token_revoke(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: TokenRevokeArgs,
) -> Result<Value, KernelError> {
    let scope = if s.identity.is_root() {
        a.uid
    } else {
        Some(target_uid(&s, a.uid)?)
    };
    let revoked =
        k.db.call(move |c| accounts::revoke_token(c, &a.token_id, scope, a.reason.as_deref()))
            .await?;
    Ok(json!({ "revoked": revoked }))
}

#[derive(Debug, Deserialize)]
pub struct ConfigGetArgs {
    key: Option<String>,
}

pub async fn config_get(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConfigGetArgs,
) -> Result<Value, KernelError> {
    let uid = s.identity.uid;
    let entries =
        k.db.call(move |c| accounts::config_get(c, uid, a.key.as_deref()))
            .await?;
    let entries: Vec<Value> = entries
        .into_iter()
        .map(|(key, value)| json!({"key": key, "value": value}))
        .collect();
    Ok(json!({ "entries": entries }))
}

#[derive(Debug, Deserialize)]
pub struct ConfigSetArgs {
    key: String,
    value: Value,
}

pub async fn config_set(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConfigSetArgs,
) -> Result<Value, KernelError> {
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
    Ok(json!({ "ok": true }))
}
