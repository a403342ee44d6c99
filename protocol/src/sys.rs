//! `sys.token.*` and `sys.config.*`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenCreateArgs {
    /// Whose token (root only may name another uid).
    pub uid: Option<i64>,
    /// `node`, `service` or `user`.
    pub kind: String,
    pub label: Option<String>,
    pub allowed_role: Option<String>,
    pub allowed_device_id: Option<String>,
    pub expires_at: Option<i64>,
}

/// `sys.token.list`: the caller's tokens, or (root) another uid's.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct UidArgs {
    pub uid: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenRevokeArgs {
    pub token_id: String,
    pub reason: Option<String>,
    pub uid: Option<i64>,
}

/// `sys.config.get`: one key, or every key the caller may see.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct ConfigGetArgs {
    pub key: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ConfigSetArgs {
    pub key: String,
    /// A string, or any JSON value (stored as its JSON text).
    pub value: Value,
}

/// A token row as listed (never the raw value).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenInfo {
    pub token_id: String,
    pub uid: i64,
    pub kind: String,
    pub label: Option<String>,
    pub token_prefix: String,
    pub allowed_role: Option<String>,
    pub allowed_device_id: Option<String>,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub revoked_reason: Option<String>,
}

/// A new token: its row and, this once, the raw value.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedToken {
    pub token_id: String,
    pub uid: i64,
    pub kind: String,
    pub label: Option<String>,
    pub token_prefix: String,
    pub allowed_role: Option<String>,
    pub allowed_device_id: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub token: String,
}

impl CreatedToken {
    pub fn new(info: TokenInfo, token: String) -> Self {
        CreatedToken {
            token_id: info.token_id,
            uid: info.uid,
            kind: info.kind,
            label: info.label,
            token_prefix: info.token_prefix,
            allowed_role: info.allowed_role,
            allowed_device_id: info.allowed_device_id,
            created_at: info.created_at,
            expires_at: info.expires_at,
            token,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct TokenCreateResult {
    pub token: CreatedToken,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct TokenListResult {
    pub tokens: Vec<TokenInfo>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct TokenRevokeResult {
    pub revoked: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ConfigEntry {
    pub key: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ConfigGetResult {
    pub entries: Vec<ConfigEntry>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ConfigSetResult {
    pub ok: bool,
}
