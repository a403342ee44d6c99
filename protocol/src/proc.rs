//! `proc.*`: the registry calls (`spawn|list|profile.list`), the calls a
//! process answers (`send|history|abort|hil|reset|kill`) and its
//! conversations (`proc.conversation.*`). `pid` is optional wherever the
//! seed has it optional: the caller's home process `init:{uid}`.

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
    /// A system profile (`proc.profile.list`); `task` when absent.
    pub profile: Option<String>,
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
    pub pid: Option<String>,
    pub message: String,
    /// `default` when absent; opened if new, refused if closed.
    pub conversation_id: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HistoryArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
    /// Clamped to 1..=500; all (up to 500) when absent.
    pub limit: Option<usize>,
    pub offset: Option<usize>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct PidArgs {
    pub pid: Option<String>,
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
    /// Extension: also delete the registry row (the explicit removal;
    /// refused for a home process).
    #[serde(default)]
    pub remove: bool,
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
    /// The system profile it was spawned with.
    pub profile: String,
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
    pub profile: String,
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
    pub conversation_id: String,
    /// Stored messages (`user`, `assistant` with `toolCalls`,
    /// `toolResult`, `system`), each as the model loop wrote it, with its
    /// integer `id` and `timestamp`.
    pub messages: Vec<serde_json::Value>,
    pub message_count: usize,
    pub truncated: bool,
    /// The context pressure the last model call of this conversation saw.
    pub context: Option<ContextState>,
    /// The process's approval request still waiting for an answer.
    pub pending_hil: Option<HilRequest>,
}

/// A tool call waiting for a human's approval (`proc.hil` answers it).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HilRequest {
    pub request_id: String,
    pub run_id: String,
    pub conversation_id: String,
    pub call_id: String,
    pub tool_name: String,
    pub syscall: String,
    pub args: serde_json::Value,
    pub created_at: i64,
}

/// How full the model's context was at the last model call.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextState {
    pub input_tokens: u64,
    /// `provider` (reported usage) or `estimate` (characters / 4 × 1.15).
    pub source: String,
    pub context_window_tokens: Option<u64>,
    /// input / (window − max output); `null` without a window.
    pub pressure: Option<f64>,
    pub measured_at: i64,
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
    pub archives: Vec<ArchiveEntry>,
}

/// `proc.kill`: the state is cleared, the registry row stays.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KillResult {
    pub ok: bool,
    pub pid: String,
    pub archive_path: Option<String>,
    pub archived_messages: usize,
    pub archived_to: Option<String>,
    pub archives: Vec<ArchiveEntry>,
}

/// One conversation's archive written by a reset or kill.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArchiveEntry {
    pub conversation_id: String,
    pub generation: i64,
    pub messages: usize,
    pub path: String,
}

/// One entry of `proc.profile.list`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileInfo {
    pub id: String,
    /// `system`.
    pub kind: String,
    pub display_name: String,
    pub description: Option<String>,
    pub interactive: bool,
    pub startable: bool,
    pub background: bool,
    /// `singleton` or `new`.
    pub spawn_mode: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ProfileListResult {
    pub profiles: Vec<ProfileInfo>,
}

/// A process-local conversation.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Conversation {
    pub id: String,
    pub generation: i64,
    /// `open` or `closed`.
    pub status: String,
    pub title: Option<String>,
    pub message_count: i64,
    pub created_at: i64,
    pub updated_at: i64,
}

/// A recorded compaction: which messages went to which archive.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationSegment {
    pub id: String,
    pub conversation_id: String,
    pub generation: i64,
    /// `compaction`.
    pub kind: String,
    pub from_message_id: i64,
    pub to_message_id: i64,
    pub archive_path: String,
    pub summary_message_id: Option<i64>,
    pub created_at: i64,
}

/// What the run preflight does when the context is too full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Overflow {
    Manual,
    AutoCompact,
    Fail,
}

impl Overflow {
    pub fn as_str(self) -> &'static str {
        match self {
            Overflow::Manual => "manual",
            Overflow::AutoCompact => "auto-compact",
            Overflow::Fail => "fail",
        }
    }

    pub fn parse(s: &str) -> Option<Overflow> {
        match s {
            "manual" => Some(Overflow::Manual),
            "auto-compact" => Some(Overflow::AutoCompact),
            "fail" => Some(Overflow::Fail),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextPolicy {
    pub conversation_id: String,
    pub overflow: Overflow,
    pub compact_at_pressure: f64,
    pub keep_last: u64,
    pub updated_at: i64,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationOpenArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
    pub title: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationListArgs {
    pub pid: Option<String>,
    #[serde(default)]
    pub include_closed: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationCloseArgs {
    pub pid: Option<String>,
    pub conversation_id: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationResetArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
    /// Default true.
    pub archive: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicySetArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
    pub overflow: Option<Overflow>,
    /// In (0, 1].
    pub compact_at_pressure: Option<f64>,
    pub keep_last: Option<u64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
    /// Exactly one of `summary` and `generateSummary: true`.
    pub summary: Option<String>,
    pub generate_summary: Option<bool>,
    /// Exactly one of `keepLast` and `throughMessageId`.
    pub keep_last: Option<u64>,
    pub through_message_id: Option<i64>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
    /// Exactly one of `segmentId` and `throughMessageId`.
    pub segment_id: Option<String>,
    pub through_message_id: Option<i64>,
    pub target_conversation_id: Option<String>,
    pub title: Option<String>,
    pub include_live_suffix: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SegmentReadArgs {
    pub pid: Option<String>,
    pub conversation_id: Option<String>,
    pub segment_id: String,
    pub limit: Option<usize>,
    pub offset: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationOpenResult {
    pub pid: String,
    pub conversation: Conversation,
    pub created: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationListResult {
    pub pid: String,
    pub conversations: Vec<Conversation>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationGetResult {
    pub pid: String,
    pub conversation: Option<Conversation>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationCloseResult {
    pub pid: String,
    pub conversation_id: String,
    pub closed: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConversationResetResult {
    pub pid: String,
    pub conversation_id: String,
    pub generation: i64,
    pub archived_messages: usize,
    pub archived_to: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolicyResult {
    pub pid: String,
    pub policy: ContextPolicy,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CompactResult {
    pub pid: String,
    pub conversation_id: String,
    pub segment: ConversationSegment,
    pub archived_messages: usize,
    pub archived_to: String,
    pub summary_message_id: i64,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkResult {
    pub pid: String,
    pub source_conversation_id: String,
    pub target_conversation: Conversation,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub segment: Option<ConversationSegment>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub through_message_id: Option<i64>,
    pub restored_messages: usize,
    pub included_live_suffix: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SegmentReadResult {
    pub pid: String,
    pub conversation_id: String,
    pub segment: ConversationSegment,
    pub messages: Vec<serde_json::Value>,
    pub message_count: usize,
    pub truncated: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SegmentsResult {
    pub pid: String,
    pub conversation_id: String,
    pub segments: Vec<ConversationSegment>,
}

/// `proc.ipc.send`: a message from the calling process to another process
/// of the same owner.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpcSendArgs {
    pub pid: String,
    /// The target's conversation; `default` when absent.
    pub conversation_id: Option<String>,
    pub message: String,
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `proc.ipc.call`: [`IpcSendArgs`] with a deadline for the reply.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpcCallArgs {
    #[serde(flatten)]
    pub send: IpcSendArgs,
    /// 60 000 when absent; clamped to 1 000..=600 000.
    pub timeout_ms: Option<i64>,
}

/// The call half of an IPC envelope.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpcDeliverCall {
    pub call_id: String,
    pub reply_to_pid: String,
    pub deadline_at: i64,
}

/// `proc.ipc.deliver` (kernel-only): the validated envelope the kernel
/// hands the target process.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpcDeliverArgs {
    pub source_pid: String,
    pub source: serde_json::Value,
    pub conversation_id: Option<String>,
    pub message: String,
    pub metadata: Option<serde_json::Map<String, serde_json::Value>>,
    pub sent_at: i64,
    pub call: Option<IpcDeliverCall>,
}

/// `proc.ipc.send`: the message started a run of the target or queued
/// behind its active one.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpcSendResult {
    pub ok: bool,
    /// `started`.
    pub status: String,
    pub pid: String,
    pub source_pid: String,
    pub conversation_id: String,
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<bool>,
}

/// `proc.ipc.call`: accepted; `ipc.reply` or `ipc.timeout` follows.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IpcCallResult {
    pub ok: bool,
    /// `started`.
    pub status: String,
    pub call_id: String,
    pub pid: String,
    pub source_pid: String,
    pub conversation_id: String,
    pub run_id: Option<String>,
    pub deadline_at: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued: Option<bool>,
}

/// `signal.watch`: run the calling process when process `processId`
/// emits `signal`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignalWatchArgs {
    pub signal: String,
    /// The watched process; a process must name another one.
    pub process_id: Option<String>,
    /// Watching again with the same key replaces the watch.
    pub key: Option<String>,
    /// Handed back with every firing.
    pub state: Option<serde_json::Value>,
    /// Removed after its first firing; true when absent.
    pub once: Option<bool>,
    /// 24 h when absent; clamped to 1 s..=30 d.
    pub ttl_ms: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SignalWatchResult {
    pub watch_id: String,
    pub created: bool,
    pub created_at: i64,
    pub expires_at: Option<i64>,
}

/// `signal.unwatch`: exactly one of `watchId` and `key`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SignalUnwatchArgs {
    pub watch_id: Option<String>,
    pub key: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct SignalUnwatchResult {
    pub removed: u64,
}
