//! `sys.workspace.create|list|get|archive`.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A backend by name (`"local"`) or as a spec.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum BackendArg {
    Name(String),
    Spec(BackendSpec),
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BackendSpec {
    /// A `wsd serve` child the kernel starts.
    Local,
    /// A running wsd at `address`, with its token in `tokenFile`.
    #[serde(rename_all = "camelCase")]
    Remote {
        address: String,
        token_file: PathBuf,
    },
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateArgs {
    pub label: Option<String>,
    pub backend: Option<BackendArg>,
    /// Fork: start with the tree of this snapshot (of a workspace the
    /// caller may use).
    pub from_snapshot: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct ListArgs {
    pub uid: Option<i64>,
    pub state: Option<String>,
    pub limit: Option<i64>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdArgs {
    pub workspace_id: String,
}

/// Where a workspace's commands run, as shown (a remote's token file is
/// never shown).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum BackendInfo {
    Local,
    Remote { address: String },
}

/// A workspace as `sys.workspace.*` shows it.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    pub workspace_id: String,
    pub owner_uid: i64,
    pub label: Option<String>,
    pub kind: String,
    pub state: String,
    pub created_at: i64,
    pub updated_at: i64,
    pub default_branch: String,
    pub head_commit: Option<String>,
    pub active_process: Option<String>,
    pub process_count: i64,
    pub backend: BackendInfo,
    /// `/workspaces/<id>`.
    pub path: String,
}

/// `sys.workspace.create` and `sys.workspace.archive`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct WorkspaceResult {
    pub workspace: Workspace,
}

/// `sys.workspace.get`: `null` when there is none the caller may see.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct GetResult {
    pub workspace: Option<Workspace>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ListResult {
    pub workspaces: Vec<Workspace>,
}
