//! The `ai.*` handlers and [`resolve`], the one reading of a run's
//! configuration (the loop's `ai.config` and a compaction's summary call,
//! through [`provider_config`], both use it).

use std::sync::Arc;

use gsv_protocol::ai::{ConfigArgs, ConfigResult, ContextFile, ToolDevice, ToolInfo, ToolsResult};
use serde_json::{Map, Value, json};

use crate::domains::accounts;
use crate::domains::ai::tools::{TOOLS, tool_defs};
use crate::domains::proc::provider::ProviderConfig;
use crate::domains::proc::store::ProcRow;
use crate::domains::proc::{profiles, store};
use crate::domains::{codemode, mcp};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// Output tokens reserved per answer unless `max_tokens` says.
pub const DEFAULT_MAX_TOKENS: u64 = 8192;
/// Bytes of context files a prompt holds unless `max_context_bytes` says.
pub const DEFAULT_MAX_CONTEXT_BYTES: u64 = 32768;
const DEFAULT_TIMEOUT_MS: u64 = 120_000;

/// The pid of a process-originated call (its session's connection is
/// `process:<pid>`), or 403 for anyone else.
fn process_caller<'a>(s: &'a Session, call: &str) -> Result<&'a str, KernelError> {
    s.connection_id
        .strip_prefix("process:")
        .ok_or_else(|| KernelError::PermissionDenied(call.to_owned()))
}

pub async fn tools(
    k: Arc<Kernel>,
    s: Arc<Session>,
    _a: Map<String, Value>,
) -> Result<ToolsResult, KernelError> {
    process_caller(&s, "ai.tools")?;
    let devices = k
        .devices
        .list(&s.identity)
        .await?
        .into_iter()
        .filter(|d| d.online)
        .map(|d| ToolDevice {
            id: d.device_id,
            implements: d.implements,
            description: Some(d.description).filter(|t| !t.is_empty()),
            platform: Some(d.platform).filter(|t| !t.is_empty()),
        })
        .collect();
    // The CodeMode tool's description lists the user's connected MCP tools.
    let mcp_tools = mcp::calls::codemode_bindings(&k, s.identity.uid).await;
    let tools = codemode::with_declarations(tool_defs(), &mcp_tools)
        .into_iter()
        .map(|d| {
            let f = &d["function"];
            let mut schema = f["parameters"].clone();
            // Routable tools name where they run (seed 000).
            let routable = TOOLS
                .iter()
                .any(|(n, call)| *n == f["name"] && crate::dispatch::is_routable(call));
            if routable
                && schema["properties"].get("target").is_some()
                && let Some(req) = schema["required"].as_array_mut()
                && !req.contains(&json!("target"))
            {
                req.push(json!("target"));
            }
            ToolInfo {
                name: f["name"].as_str().unwrap_or_default().to_owned(),
                description: f["description"].as_str().unwrap_or_default().to_owned(),
                input_schema: schema,
            }
        })
        .collect();
    Ok(ToolsResult { tools, devices })
}

pub async fn config(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConfigArgs,
) -> Result<ConfigResult, KernelError> {
    let pid = process_caller(&s, "ai.config")?.to_owned();
    let row = k.db.call(move |c| store::get(c, &pid)).await?;
    let profile = match a.profile {
        Some(p) => p,
        None => row.map_or_else(|| profiles::TASK.to_owned(), |r| r.profile),
    };
    if profiles::get(&profile).is_none() {
        return Err(KernelError::InvalidArgs {
            call: "ai.config".into(),
            reason: format!("profile: unknown profile '{profile}'"),
        });
    }
    resolve(&k, s.identity.uid, &profile).await
}

/// The run configuration of `uid` with `profile`: each key's user
/// override, else its system value, else the default.
pub async fn resolve(k: &Kernel, uid: i64, profile: &str) -> Result<ConfigResult, KernelError> {
    let profile = profile.to_owned();
    k.db.call(move |c| {
        // `users/<uid>/ai/<name>` over `config/ai/<name>`.
        let get = |name: &str| -> Result<Option<String>, KernelError> {
            match accounts::config_value(c, &format!("users/{uid}/ai/{name}"))? {
                Some(v) => Ok(Some(v)),
                None => accounts::config_value(c, &format!("config/ai/{name}")),
            }
        };
        let num = |name: &str, default: Option<u64>| -> Result<Option<u64>, KernelError> {
            match get(name)? {
                None => Ok(default),
                Some(v) => v.trim().parse::<u64>().map(Some).map_err(|_| {
                    KernelError::BadRequest(format!(
                        "config/ai/{name} must be a whole number, not '{v}'"
                    ))
                }),
            }
        };
        let files = |rows: Vec<(String, String)>| -> Vec<ContextFile> {
            rows.into_iter()
                .map(|(key, text)| ContextFile {
                    name: key.rsplit('/').next().unwrap_or(&key).to_owned(),
                    text,
                })
                .collect()
        };
        let window = num("context_window_tokens", None)?;
        let profile_policy =
            accounts::config_value(c, &format!("config/ai/profile/{profile}/tools/approval"))?;
        let user_policy = accounts::config_value(c, &format!("users/{uid}/ai/tools/approval"))?;
        Ok(ConfigResult {
            provider: get("provider")?.unwrap_or_else(|| "openai".into()),
            model: get("model")?.unwrap_or_default(),
            api_key: get("api_key")?.unwrap_or_default(),
            base_url: get("base_url")?.unwrap_or_else(|| "https://api.openai.com/v1".into()),
            reasoning: get("reasoning")?,
            max_tokens: num("max_tokens", Some(DEFAULT_MAX_TOKENS))?.unwrap_or(DEFAULT_MAX_TOKENS),
            context_window_source: if window.is_some() {
                "config"
            } else {
                "unknown"
            }
            .into(),
            context_window_tokens: window,
            system_context_files: files(accounts::config_entries(
                c,
                "config/ai/context.d/",
                ".md",
            )?),
            profile_context_files: files(accounts::config_entries(
                c,
                &format!("config/ai/profile/{profile}/context.d/"),
                ".md",
            )?),
            profile_approval_policy: profile_policy,
            approval_policy: user_policy,
            max_context_bytes: num("max_context_bytes", Some(DEFAULT_MAX_CONTEXT_BYTES))?
                .unwrap_or(DEFAULT_MAX_CONTEXT_BYTES),
            timeout_ms: num("timeout_ms", Some(DEFAULT_TIMEOUT_MS))?.unwrap_or(DEFAULT_TIMEOUT_MS),
            max_retries: num("max_retries", Some(3))?.unwrap_or(3),
            retry_base_ms: num("retry_base_ms", Some(500))?.unwrap_or(500),
            profile,
        })
    })
    .await
}

/// Provider settings of `row`'s owner and profile, for model calls outside
/// a run (a compaction's summary).
pub async fn provider_config(k: &Kernel, row: &ProcRow) -> Result<ProviderConfig, String> {
    let c = resolve(k, row.owner_uid, &row.profile)
        .await
        .map_err(|e| e.to_string())?;
    ProviderConfig::from_ai_config(&c)
}
