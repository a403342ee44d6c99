//! `fs.watch`, `fs.changes`, `fs.unwatch` and the `fs.changed` /
//! `fs.watch.lagged` signals: a change feed over a store's `(rev, path)`
//! index that resumes from an opaque cursor.
//!
//! Level-based: the index keeps each path's newest state, so a resumed
//! feed reports a path once with its state now, not every write between.
//! A cursor the store can no longer serve (below the prune horizon, from
//! another store incarnation, or malformed) is the operation error
//! [`CURSOR_EXPIRED`] with `resync: true`: list the tree again and watch
//! from `"now"`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The operation error code of a cursor the store cannot serve.
pub const CURSOR_EXPIRED: &str = "ECURSOR_EXPIRED";
/// The `after` that means "from the current rev on, no replay".
pub const AFTER_NOW: &str = "now";
/// Seconds a durable watch holds the prune horizon after its last ack
/// when `ttlSeconds` is not given (24 h).
pub const DEFAULT_DURABLE_TTL_SECONDS: u64 = 24 * 60 * 60;

fn yes() -> bool {
    true
}

/// `fs.watch`: replay every change strictly after `after`, then live
/// `fs.changed` signals on this connection.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchArgs {
    /// Directory or file to watch (`/workspaces/<id>/…` or the system tree).
    pub path: String,
    /// Below `path` at any depth (default), or only its direct entries.
    #[serde(default = "yes")]
    pub recursive: bool,
    /// Only paths matching one of these globs (relative to `path`; a glob
    /// without `/` matches the file name).
    #[serde(default)]
    pub include: Vec<String>,
    /// No path matching one of these globs (same matching as `include`).
    #[serde(default)]
    pub exclude: Vec<String>,
    /// A cursor from an earlier `fs.changed`, `fs.changes` or `fs.watch`,
    /// or `"now"` (the default): no replay.
    pub after: Option<String>,
    /// Keep the watch (and hold tombstone pruning at its cursor) across
    /// disconnects and restarts for `ttlSeconds` after its last ack.
    #[serde(default)]
    pub durable: bool,
    /// A durable watch's lifetime after its last ack (default 24 h).
    pub ttl_seconds: Option<u64>,
    /// Resume this durable watch (its filters are kept; `after` defaults
    /// to its stored cursor).
    pub watch_id: Option<String>,
}

/// `fs.watch`'s answer.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchResult {
    pub watch_id: String,
    /// Where the replay starts (the `after` resolved).
    pub cursor: String,
    pub durable: bool,
    /// A durable watch expires this long after its last ack (ms since the
    /// epoch), unless acked again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
}

/// What a path is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeType {
    File,
    Dir,
    Symlink,
    Deleted,
}

/// One path's newest state.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Change {
    /// Absolute, as the caller names it (`/workspaces/<id>/src/a.rs`).
    pub path: String,
    #[serde(rename = "type")]
    pub kind: ChangeType,
    /// The store rev that last changed the path.
    pub rev: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// A file's manifest hash (hex): equal hashes, equal content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
}

/// Signal `fs.changed`: the changes of one rev (a rev with very many
/// paths may come in several batches), in `(rev, path)` order.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangedSignal {
    pub watch_id: String,
    /// Resume from here to get what follows this batch.
    pub cursor: String,
    pub changes: Vec<Change>,
}

/// Signal `fs.watch.lagged`: the connection did not keep up, so the watch
/// stopped at `cursor` (nothing after it was sent). Resume with
/// `fs.watch {after: cursor}` (and `watchId` for a durable watch).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaggedSignal {
    pub watch_id: String,
    pub cursor: String,
}

/// `fs.changes`: the polling form, one page after `after`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangesArgs {
    pub path: String,
    /// A cursor, or `"now"` (an empty page and the current cursor).
    pub after: String,
    /// Changes per page at most (default and cap 1000).
    pub limit: Option<usize>,
    #[serde(default = "yes")]
    pub recursive: bool,
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// `fs.changes`'s answer.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangesResult {
    pub changes: Vec<Change>,
    /// Ask again from here.
    pub cursor: String,
    /// More changes are waiting past `cursor`.
    pub more: bool,
}

/// `fs.unwatch`: stop a watch (a durable one is forgotten too).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnwatchArgs {
    pub watch_id: String,
}

/// `fs.unwatch`'s answer.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnwatchResult {
    pub watch_id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_args_default_to_recursive_live_and_not_durable() {
        let a: WatchArgs = serde_json::from_str(r#"{"path":"/x"}"#).unwrap();
        assert!(a.recursive && !a.durable && a.after.is_none());
        assert!(a.include.is_empty() && a.exclude.is_empty());
    }

    #[test]
    fn a_change_names_its_type_and_leaves_out_what_it_lacks() {
        let c = Change {
            path: "/a".into(),
            kind: ChangeType::Deleted,
            rev: 3,
            size: None,
            mode: None,
            hash: None,
        };
        assert_eq!(
            serde_json::to_value(&c).unwrap(),
            serde_json::json!({"path": "/a", "type": "deleted", "rev": 3})
        );
    }
}
