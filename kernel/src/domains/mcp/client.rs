//! Speaking MCP to one server: connect over streamable HTTP (rmcp),
//! discover what it offers, call a tool. Nothing here knows users or rows.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use gsv_protocol::mcp::{CallResult, McpToolSummary};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{Peer, RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Map, Value};

/// Connecting and discovering take at most this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// One tool call takes at most this long.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A live session with a server.
pub type Session = RunningService<RoleClient, ()>;

/// What a server said about itself when it was discovered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Discovered {
    pub instructions: Option<String>,
    pub capabilities: Option<Value>,
    pub tools: Vec<McpToolSummary>,
    pub resource_count: u64,
    pub prompt_count: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("header '{0}' is not a valid HTTP header")]
    Header(String),
    #[error("{url} needs OAuth sign-in: open the server's authUrl (sys.mcp.list)")]
    AuthRequired { url: String },
    #[error("could not connect to {url}: {reason}")]
    Connect { url: String, reason: String },
    #[error("{url} did not answer within {secs} s")]
    Timeout { url: String, secs: u64 },
    #[error("{0}")]
    Call(String),
}

/// Connects to `url` with `headers` on every request and discovers its
/// tools, resources and prompts.
pub async fn connect(
    url: &str,
    headers: &BTreeMap<String, String>,
) -> Result<(Session, Discovered), McpError> {
    // rmcp's reqwest is built without a TLS provider: the workspace's
    // ring is installed once, process-wide (an error means one is set).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut custom = HashMap::new();
    for (k, v) in headers {
        let name = HeaderName::from_bytes(k.as_bytes()).map_err(|_| McpError::Header(k.clone()))?;
        let value = HeaderValue::from_str(v).map_err(|_| McpError::Header(k.clone()))?;
        custom.insert(name, value);
    }
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom);
    let transport = StreamableHttpClientTransport::from_config(config);
    let work = async {
        let session = ().serve(transport).await.map_err(|e| {
            let debug = format!("{e:?}");
            if debug.contains("AuthRequired") {
                McpError::AuthRequired {
                    url: url.to_owned(),
                }
            } else {
                McpError::Connect {
                    url: url.to_owned(),
                    reason: e.to_string(),
                }
            }
        })?;
        let discovered = discover(&session, url).await?;
        Ok((session, discovered))
    };
    tokio::time::timeout(CONNECT_TIMEOUT, work)
        .await
        .map_err(|_| McpError::Timeout {
            url: url.to_owned(),
            secs: CONNECT_TIMEOUT.as_secs(),
        })?
}

async fn discover(session: &Session, url: &str) -> Result<Discovered, McpError> {
    let info = session
        .peer_info()
        .and_then(|i| serde_json::to_value(&*i).ok())
        .unwrap_or(Value::Null);
    let capabilities = info.get("capabilities").cloned().filter(|c| !c.is_null());
    let has = |cap: &str| capabilities.as_ref().is_some_and(|c| c.get(cap).is_some());
    let tools = if has("tools") {
        session
            .list_all_tools()
            .await
            .map_err(|e| McpError::Connect {
                url: url.to_owned(),
                reason: format!("listing tools: {e}"),
            })?
    } else {
        Vec::new()
    };
    let tools = tools
        .iter()
        .filter_map(|t| serde_json::to_value(t).ok())
        .map(|t| McpToolSummary {
            name: t["name"].as_str().unwrap_or_default().to_owned(),
            description: t["description"].as_str().map(str::to_owned),
            input_schema: t.get("inputSchema").cloned().filter(|v| !v.is_null()),
            output_schema: t.get("outputSchema").cloned().filter(|v| !v.is_null()),
        })
        .collect();
    // Counts are informative: a server that fails to list them has none
    // usable.
    let resource_count = if has("resources") {
        session
            .list_all_resources()
            .await
            .map_or(0, |r| r.len() as u64)
    } else {
        0
    };
    let prompt_count = if has("prompts") {
        session
            .list_all_prompts()
            .await
            .map_or(0, |p| p.len() as u64)
    } else {
        0
    };
    Ok(Discovered {
        instructions: info
            .get("instructions")
            .and_then(Value::as_str)
            .map(str::to_owned),
        capabilities,
        tools,
        resource_count,
        prompt_count,
    })
}

/// Calls tool `name`; a tool that fails is `isError: true` in the result,
/// a transport or protocol failure is the error.
pub async fn call(
    peer: &Peer<RoleClient>,
    name: &str,
    arguments: Option<Map<String, Value>>,
) -> Result<CallResult, McpError> {
    let mut params = CallToolRequestParams::new(name.to_owned());
    params.arguments = arguments;
    let result = tokio::time::timeout(CALL_TIMEOUT, peer.call_tool(params))
        .await
        .map_err(|_| {
            McpError::Call(format!(
                "{name} did not answer within {} s",
                CALL_TIMEOUT.as_secs()
            ))
        })?
        .map_err(|e| McpError::Call(format!("{name}: {e}")))?;
    let v = serde_json::to_value(&result).map_err(|e| McpError::Call(format!("{name}: {e}")))?;
    Ok(CallResult {
        content: v.get("content").cloned(),
        structured_content: v.get("structuredContent").cloned().filter(|s| !s.is_null()),
        is_error: v.get("isError").and_then(Value::as_bool),
    })
}
