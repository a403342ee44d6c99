//! `sys.mcp.*`: a user's MCP servers (streamable HTTP), their tools, and
//! calls to them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum McpTransportType {
    /// Streamable HTTP (the one transport this kernel speaks).
    #[default]
    Auto,
    StreamableHttp,
    /// The legacy SSE transport: refused with a clear error.
    Sse,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum McpConnectionState {
    NotConnected,
    Authenticating,
    Connecting,
    Connected,
    Discovering,
    Ready,
    Failed,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpToolSummary {
    pub name: String,
    pub description: Option<String>,
    pub input_schema: Option<Value>,
    pub output_schema: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpServerSummary {
    pub server_id: String,
    pub uid: i64,
    pub name: String,
    pub url: String,
    pub transport: McpTransportType,
    pub state: McpConnectionState,
    pub auth_url: Option<String>,
    pub error: Option<String>,
    pub instructions: Option<String>,
    pub capabilities: Option<Value>,
    pub tools: Vec<McpToolSummary>,
    pub resource_count: u64,
    pub prompt_count: u64,
    pub created_at: i64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct TransportArgs {
    #[serde(rename = "type")]
    pub kind: Option<McpTransportType>,
    /// Sent with every request (e.g. an `Authorization` header).
    pub headers: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddArgs {
    /// Root only: add for another user.
    pub uid: Option<i64>,
    /// 1–80 characters.
    pub name: String,
    /// `https://…`, or `http://` on localhost, 127.0.0.1 or ::1.
    pub url: String,
    pub callback_host: Option<String>,
    pub transport: Option<TransportArgs>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct AddResult {
    pub server: McpServerSummary,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct ListArgs {
    pub uid: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ListResult {
    pub servers: Vec<McpServerSummary>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerArgs {
    pub uid: Option<i64>,
    pub server_id: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct RemoveResult {
    pub removed: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct RefreshResult {
    pub server: Option<McpServerSummary>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallArgs {
    pub uid: Option<i64>,
    pub server_id: String,
    /// The tool's name as the server declares it.
    pub name: String,
    pub arguments: Option<Map<String, Value>>,
}

/// The server's `CallToolResult`: `content` blocks, `structuredContent`,
/// and `isError` for a tool that failed.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallResult {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
}
