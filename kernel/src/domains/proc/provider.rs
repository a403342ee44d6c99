//! The model provider: any OpenAI-compatible chat completions server
//! (hosted APIs, llama.cpp server, Ollama, vLLM), streamed as server-sent
//! events. One call = one POST; retries and signals are the loop's.

use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use gsv_protocol::ai::ConfigResult;
use serde_json::{Value, json};

/// Where and how to call the model (from `config/ai/*`).
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    pub provider: String,
    pub model: String,
    pub api_key: Option<String>,
    pub base_url: String,
    /// Deadline for the response headers and for each gap between chunks.
    pub timeout: Duration,
    pub max_retries: usize,
    pub retry_base: Duration,
    /// The model's context window, when configured
    /// (`config/ai/context_window_tokens`); context pressure needs it.
    pub context_window_tokens: Option<u64>,
    /// Output tokens reserved for the answer (`config/ai/max_tokens`).
    pub max_tokens: u64,
}

impl ProviderConfig {
    /// Provider settings from a run's `ai.config`, or a message naming the
    /// missing or unsupported key.
    pub fn from_ai_config(c: &ConfigResult) -> Result<ProviderConfig, String> {
        if !matches!(c.provider.as_str(), "openai" | "openai-compatible") {
            return Err(format!(
                "config/ai/provider is '{}': only \"openai\" (any OpenAI-compatible server) is supported",
                c.provider
            ));
        }
        if c.model.is_empty() {
            return Err(
                "No model configured: run `gsv config set ai.model NAME` and `gsv config set ai.base_url URL` (config/ai/model, config/ai/base_url)"
                    .into(),
            );
        }
        Ok(ProviderConfig {
            provider: c.provider.clone(),
            model: c.model.clone(),
            api_key: Some(c.api_key.clone()).filter(|k| !k.is_empty()),
            base_url: c.base_url.clone(),
            timeout: Duration::from_millis(c.timeout_ms),
            max_retries: c.max_retries as usize,
            retry_base: Duration::from_millis(c.retry_base_ms),
            context_window_tokens: c.context_window_tokens,
            max_tokens: c.max_tokens,
        })
    }
}

/// A failed model call.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("model server {url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("model server {url} unreachable: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("model server {url} did not answer within {secs} s")]
    Timeout { url: String, secs: f64 },
    #[error("model server {url} sent a malformed stream: {reason}")]
    Malformed { url: String, reason: String },
}

impl ProviderError {
    /// 429, 5xx and refused connections are worth another try.
    pub fn retryable(&self) -> bool {
        match self {
            ProviderError::Status { status, .. } => *status == 429 || *status >= 500,
            ProviderError::Unreachable { .. } => true,
            _ => false,
        }
    }
}

/// A streamed piece of the answer, forwarded as `proc.run.stream`.
#[derive(Debug, Clone)]
pub enum Delta {
    Text(String),
    /// Reasoning text (`reasoning_content` or `reasoning` deltas).
    Thinking(String),
    ToolCall {
        index: u64,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
}

/// One tool call of the answer.
#[derive(Debug, Clone, Default)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// The whole answer.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub text: String,
    pub thinking: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Value,
}

/// Calls the model once, streaming deltas to `on_delta`.
pub async fn complete(
    http: &reqwest::Client,
    cfg: &ProviderConfig,
    messages: &[Value],
    tools: &[Value],
    mut on_delta: impl FnMut(Delta),
) -> Result<Completion, ProviderError> {
    let url = format!("{}/chat/completions", cfg.base_url.trim_end_matches('/'));
    let mut body = json!({
        "model": cfg.model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    if !tools.is_empty() {
        body["tools"] = Value::from(tools.to_vec());
    }
    let mut req = http.post(&url).json(&body);
    if let Some(k) = &cfg.api_key {
        req = req.bearer_auth(k);
    }
    let timeout = |url: &str| ProviderError::Timeout {
        url: url.to_owned(),
        secs: cfg.timeout.as_secs_f64(),
    };
    let resp = tokio::time::timeout(cfg.timeout, req.send())
        .await
        .map_err(|_| timeout(&url))?
        .map_err(|e| ProviderError::Unreachable {
            url: url.clone(),
            reason: error_chain(&e),
        })?;
    let status = resp.status();
    if !status.is_success() {
        let text = tokio::time::timeout(cfg.timeout, resp.text())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        return Err(ProviderError::Status {
            url,
            status: status.as_u16(),
            body: text.chars().take(500).collect(),
        });
    }
    let mut events = resp.bytes_stream().eventsource();
    let mut out = Completion::default();
    let malformed = |reason: String| ProviderError::Malformed {
        url: url.clone(),
        reason,
    };
    loop {
        let ev = match tokio::time::timeout(cfg.timeout, events.next()).await {
            Err(_) => return Err(timeout(&url)),
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(malformed(e.to_string())),
            Ok(Some(Ok(ev))) => ev,
        };
        if ev.data.trim() == "[DONE]" {
            break;
        }
        let chunk: Value =
            serde_json::from_str(&ev.data).map_err(|e| malformed(format!("{e}: {}", ev.data)))?;
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            out.usage = u.clone();
        }
        let Some(delta) = chunk.pointer("/choices/0/delta") else {
            continue;
        };
        for key in ["reasoning_content", "reasoning"] {
            if let Some(t) = delta.get(key).and_then(Value::as_str)
                && !t.is_empty()
            {
                out.thinking.push_str(t);
                on_delta(Delta::Thinking(t.to_owned()));
            }
        }
        if let Some(t) = delta.get("content").and_then(Value::as_str)
            && !t.is_empty()
        {
            out.text.push_str(t);
            on_delta(Delta::Text(t.to_owned()));
        }
        for tc in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = tc.get("index").and_then(Value::as_u64).unwrap_or(0);
            let i = index as usize;
            if i > 64 {
                return Err(malformed(format!("tool call index {i}")));
            }
            if out.tool_calls.len() <= i {
                out.tool_calls.resize(i + 1, ToolCall::default());
            }
            let slot = &mut out.tool_calls[i];
            let id = tc.get("id").and_then(Value::as_str).map(str::to_owned);
            let name = tc
                .pointer("/function/name")
                .and_then(Value::as_str)
                .map(str::to_owned);
            let args = tc
                .pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or("");
            if let Some(id) = &id {
                slot.id.clone_from(id);
            }
            if let Some(n) = &name {
                slot.name.push_str(n);
            }
            slot.arguments.push_str(args);
            on_delta(Delta::ToolCall {
                index,
                id,
                name,
                arguments: args.to_owned(),
            });
        }
    }
    for (i, tc) in out.tool_calls.iter_mut().enumerate() {
        if tc.id.is_empty() {
            tc.id = format!("call_{i}");
        }
    }
    Ok(out)
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
