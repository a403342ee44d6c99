//! `proc.spawn|list|send|history|abort|hil|reset|kill`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a spawned process works.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceSpec {
    /// `none`, `new` or `attach`.
    #[serde(default)]
    pub mode: Option<String>,
    pub workspace_id: Option<String>,
    pub label: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpawnArgs {
    pub label: Option<String>,
    pub prompt: Option<String>,
    pub parent_pid: Option<String>,
    pub cwd: Option<String>,
    pub workspace: Option<WorkspaceSpec>,
    pub interactive: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct ListArgs {
    pub uid: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendArgs {
    pub pid: String,
    pub message: String,
    /// Accepted for the reference CLI; one conversation per process.
    pub conversation_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct HistoryArgs {
    pub pid: String,
    pub limit: Option<usize>,
    pub offset: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct PidArgs {
    pub pid: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HilArgs {
    pub request_id: String,
    /// `approve` or `deny`.
    pub decision: String,
    #[serde(default)]
    pub remember: bool,
    pub pid: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct KillArgs {
    pub pid: String,
    pub archive: Option<bool>,
}

/// One process as `proc.list` shows it.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    pub pid: String,
    /// The owning human.
    pub uid: i64,
    pub username: String,
    pub interactive: bool,
    pub parent_pid: Option<String>,
    pub label: Option<String>,
    pub cwd: String,
    pub workspace_id: Option<String>,
    /// `idle` or `running`.
    pub state: String,
    pub active_run_id: Option<String>,
    pub queued_count: i64,
    pub last_active_at: Option<i64>,
    pub created_at: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ListResult {
    pub processes: Vec<ProcessInfo>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpawnResult {
    pub ok: bool,
    pub pid: String,
    pub cwd: String,
    pub label: Option<String>,
    pub workspace_id: Option<String>,
    /// Present when a `prompt` started (or queued) a run: that run's id,
    /// `null` if none is active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<Option<String>>,
}

/// `proc.send`: a run started, or the message queued behind the active one.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendResult {
    pub ok: bool,
    /// `started`.
    pub status: String,
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_count: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryResult {
    pub ok: bool,
    pub pid: String,
    /// Stored messages (`user`, `assistant` with `toolCalls`,
    /// `toolResult`, `system`), each as the model loop wrote it.
    pub messages: Vec<serde_json::Value>,
    pub message_count: usize,
    pub truncated: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AbortResult {
    pub ok: bool,
    pub pid: String,
    pub aborted: bool,
    pub run_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HilResult {
    pub ok: bool,
    pub pid: String,
    pub request_id: String,
    pub decision: String,
    /// Whether a waiting run took the answer.
    pub resumed: bool,
}

/// `proc.reset`. `archivedMessages`/`archivedTo` are the reference's
/// names (its CLI prints them); `archivePath` is kept for our callers.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResetResult {
    pub ok: bool,
    pub pid: String,
    pub archive_path: Option<String>,
    pub archived_messages: usize,
    pub archived_to: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KillResult {
    pub ok: bool,
    pub pid: String,
    pub archive_path: Option<String>,
}
