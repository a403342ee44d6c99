//! `sched.*` on the wire (seed 000, "Scheduler: sched.*"): expressions,
//! targets, the record, arguments and results, camelCase.

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// When a schedule runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind")]
pub enum ScheduleExpression {
    /// Once, at this instant (ms since the epoch).
    #[serde(rename = "at", rename_all = "camelCase")]
    At { at_ms: i64 },
    /// Once, this long after it was added (or last updated).
    #[serde(rename = "after", rename_all = "camelCase")]
    After { after_ms: i64 },
    /// Every `everyMs` (at least 1000) from `anchorMs` (default: when added).
    #[serde(rename = "every", rename_all = "camelCase")]
    Every {
        every_ms: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        anchor_ms: Option<i64>,
    },
    /// A five-field cron expression in an IANA zone. The zone may be left
    /// out: the kernel fills in `config/server/timezone`, else `UTC`.
    #[serde(rename = "cron")]
    Cron {
        expr: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timezone: Option<String>,
    },
}

/// What a schedule does when it runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind")]
pub enum ScheduleTarget {
    /// Starts a process (profile `cron` unless named) with `prompt`.
    #[serde(rename = "process.spawn", rename_all = "camelCase")]
    ProcessSpawn {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        profile: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        label: Option<String>,
        prompt: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        parent_pid: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        workspace: Option<Value>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mounts: Option<Vec<Value>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        assignment: Option<Value>,
    },
    /// Sends `message` to process `pid` (a run starts, or it queues).
    #[serde(rename = "process.event", rename_all = "camelCase")]
    ProcessEvent {
        pid: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        conversation_id: Option<String>,
        message: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Map<String, Value>>,
    },
}

/// The one overlap policy: a schedule still running is not started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum OverlapPolicy {
    #[default]
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Ok,
    Error,
    Skipped,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Error => "error",
            RunStatus::Skipped => "skipped",
        }
    }

    pub fn parse(s: &str) -> Option<RunStatus> {
        match s {
            "ok" => Some(RunStatus::Ok),
            "error" => Some(RunStatus::Error),
            "skipped" => Some(RunStatus::Skipped),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleState {
    pub next_run_at_ms: Option<i64>,
    pub running_at_ms: Option<i64>,
    pub last_run_at_ms: Option<i64>,
    pub last_status: Option<RunStatus>,
    pub last_error: Option<String>,
    pub last_duration_ms: Option<i64>,
    pub run_count: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleRecord {
    pub id: String,
    pub owner_uid: i64,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub enabled: bool,
    pub expression: ScheduleExpression,
    pub target: ScheduleTarget,
    pub overlap_policy: OverlapPolicy,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub state: ScheduleState,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListArgs {
    /// Root only: whose schedules (default: everyone's for root).
    #[serde(default)]
    pub owner_uid: Option<i64>,
    #[serde(default)]
    pub include_disabled: Option<bool>,
    /// Clamped to 1 ..= 500; 100 when absent.
    #[serde(default)]
    pub limit: Option<f64>,
    #[serde(default)]
    pub offset: Option<f64>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddArgs {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub enabled: Option<bool>,
    pub expression: ScheduleExpression,
    pub target: ScheduleTarget,
}

/// Absent leaves a field; `description: null` clears it.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SchedulePatch {
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "present")]
    pub description: Option<Option<String>>,
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub expression: Option<ScheduleExpression>,
    #[serde(default)]
    pub target: Option<ScheduleTarget>,
}

/// A field that is present (even as `null`) is `Some`.
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct UpdateArgs {
    pub id: String,
    pub patch: SchedulePatch,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
pub struct RemoveArgs {
    pub id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    /// Run what is due now (one schedule with `id`, else all the caller's).
    #[default]
    Due,
    /// Run schedule `id` now, due or not; its `nextRunAtMs` stays.
    Force,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
pub struct RunArgs {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub mode: Option<RunMode>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListResult {
    pub schedules: Vec<ScheduleRecord>,
    /// All matching schedules, not just this page.
    pub count: i64,
}

/// `sched.add` and `sched.update`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ScheduleResult {
    pub schedule: ScheduleRecord,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RemoveResult {
    pub removed: bool,
}

/// One schedule's run.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunOutcome {
    pub schedule_id: String,
    pub status: RunStatus,
    /// Why it failed, or why it was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    pub duration_ms: i64,
    /// The schedule's next run after this one (absent when skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run_at_ms: Option<Option<i64>>,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct RunResult {
    /// Runs that were not skipped.
    pub ran: usize,
    pub results: Vec<RunOutcome>,
}
