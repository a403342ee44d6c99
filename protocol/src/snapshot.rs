//! `workspace.snapshot.*` and `sys.gc`: typed arguments and results.
//!
//! A snapshot is a workspace's tree at one rev, over chunks the workspace
//! store already holds (nothing is copied); see kernel/PROTOCOL.md.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `workspace.snapshot.create`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateArgs {
    pub workspace_id: String,
    pub label: Option<String>,
}

/// One snapshot, as `create`, `list` and `get` return it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotInfo {
    pub snapshot_id: String,
    pub workspace_id: String,
    /// The workspace store's rev the snapshot is consistent at.
    pub rev: u64,
    pub label: Option<String>,
    /// Regular files in the snapshot.
    pub files: u64,
    /// Bytes of those files.
    pub bytes: u64,
    /// Bytes of chunks no earlier snapshot of the workspace held.
    pub new_bytes: u64,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// `workspace.snapshot.list`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListArgs {
    pub workspace_id: String,
}

/// `workspace.snapshot.list` result, oldest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListResult {
    pub snapshots: Vec<SnapshotInfo>,
}

/// `workspace.snapshot.get|restore|delete`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdArgs {
    pub snapshot_id: String,
}

/// `workspace.snapshot.diff`: from snapshot `from` to snapshot `to`, or to
/// the workspace's current tree when `to` is absent.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DiffArgs {
    pub from: String,
    pub to: Option<String>,
}

/// How one path differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Removed,
    Modified,
}

/// One differing path (relative to the workspace root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiffEntry {
    pub path: String,
    pub change: ChangeKind,
}

/// `workspace.snapshot.diff` result, in path order.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiffResult {
    pub changes: Vec<DiffEntry>,
}

/// `workspace.snapshot.restore` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreResult {
    /// The rev of the one change batch (the current rev when nothing differed).
    pub rev: u64,
    /// Paths written back.
    pub changed: u64,
    /// Paths the snapshot did not have, now deleted.
    pub removed: u64,
}

/// `workspace.snapshot.delete` result.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeleteResult {
    pub deleted: bool,
}

/// `sys.gc` result: what one collection freed over every workspace store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GcResult {
    pub workspaces: u64,
    pub manifests: u64,
    pub chunks: u64,
    /// Chunks deleted from the object store snapshots are mirrored to
    /// (`gsv serve --chunk-store`; 0 without one), and the bytes the
    /// store shrank by (deleted objects, and dead chunks left out of
    /// rewritten packs).
    #[serde(default)]
    pub store_chunks: u64,
    #[serde(default)]
    pub store_bytes: u64,
    /// Packs rewritten without their dead chunks (mostly dead ones).
    #[serde(default)]
    pub store_repacked: u64,
}

/// `workspace.recover`: rebuild a workspace this kernel lost from the
/// snapshot manifests mirrored to its object store.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RecoverArgs {
    pub workspace_id: String,
}

/// `workspace.recover` result: the workspace as recovered, how many
/// snapshots came back, and the one its tree was restored from (the
/// newest) with the store rev of that restore.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecoverResult {
    pub workspace: crate::workspace::Workspace,
    pub snapshots: u64,
    pub restored_from: String,
    pub rev: u64,
}

/// An operation refused by the snapshot calls, carried as `{ok:false,
/// code, error}` in the result (frame errors are for kernel faults,
/// unknown or foreign ids).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpError {
    pub ok: bool,
    /// `ELIMIT` (too many snapshots), `EBUSY` (a command runs), `ENOENT`,
    /// `EEXIST` (recovering a workspace this kernel has).
    pub code: String,
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_are_camel_case_and_unknown_fields_are_refused() {
        let a: CreateArgs =
            serde_json::from_str(r#"{"workspaceId":"ws_1","label":"before"}"#).unwrap();
        assert_eq!(a.workspace_id, "ws_1");
        assert!(serde_json::from_str::<IdArgs>(r#"{"snapshotId":"s","x":1}"#).is_err());
        let d = DiffEntry {
            path: "a/b".into(),
            change: ChangeKind::Modified,
        };
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            serde_json::json!({"path": "a/b", "change": "modified"})
        );
        let schema = schemars::schema_for!(SnapshotInfo);
        let text = serde_json::to_string(&schema).unwrap();
        assert!(text.contains("newBytes"), "{text}");
    }
}
