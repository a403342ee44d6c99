//! `sys.device.list|get|update`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListArgs {
    #[serde(default)]
    pub include_offline: bool,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GetArgs {
    pub device_id: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpdateArgs {
    pub device_id: String,
    #[serde(default)]
    pub label: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
}

/// A device row as `sys.device.*` shows it.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub device_id: String,
    pub owner_uid: i64,
    pub label: String,
    pub description: String,
    pub implements: Vec<String>,
    pub platform: String,
    pub version: String,
    pub online: bool,
    pub first_seen_at: i64,
    pub last_seen_at: i64,
    pub connected_at: Option<i64>,
    pub disconnected_at: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ListResult {
    pub devices: Vec<Device>,
}

/// `sys.device.get` and `sys.device.update`: `null` when the caller
/// cannot see the device.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct DeviceResult {
    pub device: Option<Device>,
}
