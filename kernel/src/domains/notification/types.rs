//! `notification.*` on the wire (seed 000, "Notifications and Watches"):
//! arguments, results and the record, camelCase.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NotificationLevel {
    #[default]
    Info,
    Success,
    Warning,
    Error,
}

impl NotificationLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationLevel::Info => "info",
            NotificationLevel::Success => "success",
            NotificationLevel::Warning => "warning",
            NotificationLevel::Error => "error",
        }
    }
}

/// A button or link a client may offer with the notification.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotificationAction {
    pub kind: String,
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Map<String, Value>>,
}

/// Who raised it: derived by the kernel from the caller, never an argument.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind")]
pub enum NotificationSource {
    #[serde(rename = "user")]
    User,
    #[serde(rename = "process", rename_all = "camelCase")]
    Process { process_id: String },
    #[serde(rename = "app", rename_all = "camelCase")]
    App {
        package_id: String,
        package_name: String,
        entrypoint_name: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NotificationRecord {
    pub notification_id: String,
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    pub level: NotificationLevel,
    pub created_at: i64,
    pub read_at: Option<i64>,
    pub dismissed_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub actions: Vec<NotificationAction>,
    pub source: NotificationSource,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateArgs {
    pub title: String,
    #[serde(default)]
    pub body: Option<String>,
    #[serde(default)]
    pub level: Option<NotificationLevel>,
    #[serde(default)]
    pub actions: Option<Vec<NotificationAction>>,
    /// Clamped to 1 s ..= 90 d; 30 d when absent.
    #[serde(default)]
    pub ttl_ms: Option<f64>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListArgs {
    /// Default true.
    #[serde(default)]
    pub include_read: Option<bool>,
    /// Default false.
    #[serde(default)]
    pub include_dismissed: Option<bool>,
    /// Clamped to 1 ..= 500; 100 when absent.
    #[serde(default)]
    pub limit: Option<f64>,
}

/// `notification.mark_read` and `notification.dismiss`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdArgs {
    pub notification_id: String,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct CreateResult {
    pub notification: NotificationRecord,
}

#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ListResult {
    pub notifications: Vec<NotificationRecord>,
}

/// `notification.mark_read` and `notification.dismiss`: `null` when the id
/// is missing, expired or another user's.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct MaybeResult {
    pub notification: Option<NotificationRecord>,
}
