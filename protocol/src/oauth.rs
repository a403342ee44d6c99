//! `sys.oauth.*`: authorization-code flows with PKCE and the accounts
//! they leave. Tokens never appear in any result.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum OAuthConnectionKind {
    AiProvider,
    McpServer,
    Generic,
}

impl OAuthConnectionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OAuthConnectionKind::AiProvider => "ai-provider",
            OAuthConnectionKind::McpServer => "mcp-server",
            OAuthConnectionKind::Generic => "generic",
        }
    }

    pub fn parse(s: &str) -> Option<OAuthConnectionKind> {
        match s {
            "ai-provider" => Some(OAuthConnectionKind::AiProvider),
            "mcp-server" => Some(OAuthConnectionKind::McpServer),
            "generic" => Some(OAuthConnectionKind::Generic),
            _ => None,
        }
    }
}

/// A pending flow (until its callback or its expiry).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OAuthFlowSummary {
    pub flow_id: String,
    pub uid: i64,
    pub kind: OAuthConnectionKind,
    pub provider: String,
    pub account_key: String,
    pub label: Option<String>,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub client_id: String,
    pub redirect_uri: String,
    pub scope: Option<String>,
    pub resource: Option<String>,
    pub created_at: i64,
    pub expires_at: i64,
}

/// A stored account, without its tokens.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OAuthAccountSummary {
    pub account_id: String,
    pub uid: i64,
    pub kind: OAuthConnectionKind,
    pub provider: String,
    pub account_key: String,
    pub label: Option<String>,
    pub scope: Option<String>,
    pub resource: Option<String>,
    pub client_id: String,
    pub token_type: String,
    pub expires_at: Option<i64>,
    pub created_at: i64,
    pub updated_at: i64,
    pub last_used_at: Option<i64>,
    pub metadata: Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartArgs {
    /// Root only: start for another user.
    pub uid: Option<i64>,
    pub kind: OAuthConnectionKind,
    pub provider: String,
    /// Names the account among the provider's; `default` when absent.
    pub account_key: Option<String>,
    pub label: Option<String>,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub client_id: String,
    /// Must be this kernel's `/oauth/callback`.
    pub redirect_uri: String,
    pub scope: Option<String>,
    pub resource: Option<String>,
    /// Added to the authorization URL; the flow's own parameters
    /// (`state`, `code_challenge`, …) cannot be overridden.
    pub extra_auth_params: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StartResult {
    pub authorization_url: String,
    pub flow: OAuthFlowSummary,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListArgs {
    /// Root only: another user's (all users' when root omits it).
    pub uid: Option<i64>,
    #[serde(default)]
    pub include_pending: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListResult {
    pub accounts: Vec<OAuthAccountSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<Vec<OAuthFlowSummary>>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForgetArgs {
    pub account_id: String,
    pub uid: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ForgetResult {
    pub forgotten: bool,
}
