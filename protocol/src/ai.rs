//! `ai.tools` and `ai.config`: what an agent run needs, asked for by the
//! process's own loop (internal calls, refused to sockets).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One tool the model may call.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolInfo {
    pub name: String,
    pub description: String,
    /// The JSON schema of its arguments.
    pub input_schema: serde_json::Value,
}

/// An online device the process's account may route tools to.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolDevice {
    pub id: String,
    pub implements: Vec<String>,
    pub description: Option<String>,
    pub platform: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ToolsResult {
    pub tools: Vec<ToolInfo>,
    pub devices: Vec<ToolDevice>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct ConfigArgs {
    /// The process's own profile when absent.
    pub profile: Option<String>,
}

/// A named context file.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ContextFile {
    pub name: String,
    pub text: String,
}

/// `ai.config`: the user's override over the system value of each key.
/// `baseUrl`, `timeoutMs`, `maxRetries`, `retryBaseMs` and
/// `approvalPolicy` (the account's own) extend the seed's shape.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigResult {
    pub profile: String,
    pub provider: String,
    /// Empty when none is configured (a run then fails naming the key).
    pub model: String,
    pub api_key: String,
    pub base_url: String,
    pub reasoning: Option<String>,
    pub max_tokens: u64,
    pub context_window_tokens: Option<u64>,
    /// `config` or `unknown`.
    pub context_window_source: String,
    pub system_context_files: Vec<ContextFile>,
    pub profile_context_files: Vec<ContextFile>,
    pub profile_approval_policy: Option<String>,
    pub approval_policy: Option<String>,
    pub max_context_bytes: u64,
    pub timeout_ms: u64,
    pub max_retries: u64,
    pub retry_base_ms: u64,
    /// Whether the model accepts image input (`config/ai/images`, default
    /// `true`): when `false`, images read by `Read` reach it as a text note.
    pub images: bool,
}
