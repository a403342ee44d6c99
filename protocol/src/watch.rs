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

use globset::{Glob, GlobSet, GlobSetBuilder};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::OpFailure;

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
    /// to its stored cursor). In the request the kernel routes to a
    /// device, the kernel's id for the new watch.
    pub watch_id: Option<String>,
    /// "gsv" (default) or a device id: the device watches its own files
    /// (live only, see [`DEVICE_WATCHES_ARE_LIVE`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// Why a device watch cannot resume: a device keeps no change index, so
/// its watches are live only.
pub const DEVICE_WATCHES_ARE_LIVE: &str = "a device keeps no change index: its watches are live \
     only and cannot replay or resume";

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

/// Signal `fs.watch.ended`: a watch ended without `fs.unwatch` (its
/// device disconnected, or the device's watcher failed). Nothing of it
/// follows. A device watch cannot resume: list again and watch anew.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndedSignal {
    pub watch_id: String,
    pub reason: String,
    /// Always true: what changed meanwhile is not known.
    pub resync: bool,
}

/// `error` of an expired cursor: a code beside the message.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct CodedError {
    pub code: String,
    pub message: String,
}

/// The operation error of a cursor that cannot be served:
/// `{ok:false, error:{code:"ECURSOR_EXPIRED", message}, code, resync:true}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct ExpiredFailure {
    pub ok: bool,
    pub error: CodedError,
    pub code: String,
    pub resync: bool,
}

impl ExpiredFailure {
    pub fn new(message: impl Into<String>) -> ExpiredFailure {
        ExpiredFailure {
            ok: false,
            error: CodedError {
                code: CURSOR_EXPIRED.to_owned(),
                message: message.into(),
            },
            code: CURSOR_EXPIRED.to_owned(),
            resync: true,
        }
    }
}

/// How a watch call fails: an expired cursor, or `{ok:false, error,
/// code}` as `fs.*`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum WatchFailure {
    Expired(ExpiredFailure),
    Op(OpFailure),
}

/// A watch call's answer.
pub type WatchOutcome<T> = crate::OpResult<T, WatchFailure>;

/// A bad include or exclude glob, naming it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("Invalid {which} pattern '{glob}': {reason}")]
pub struct BadGlob {
    pub which: &'static str,
    pub glob: String,
    pub reason: String,
}

/// Globs split by what they match: a glob with `/` matches the path below
/// the watch root, one without matches the file name (as `fs.search`).
#[derive(Debug)]
struct Globs {
    by_name: GlobSet,
    by_path: GlobSet,
    empty: bool,
}

impl Globs {
    fn new(which: &'static str, globs: &[String]) -> Result<Globs, BadGlob> {
        let (mut name, mut path) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        for g in globs {
            let glob = Glob::new(g).map_err(|e| BadGlob {
                which,
                glob: g.clone(),
                reason: e.kind().to_string(),
            })?;
            if g.contains('/') {
                path.add(glob);
            } else {
                name.add(glob);
            }
        }
        let build = |b: GlobSetBuilder, g: &str| {
            b.build().map_err(|e| BadGlob {
                which,
                glob: g.to_owned(),
                reason: e.to_string(),
            })
        };
        let all = globs.join(", ");
        Ok(Globs {
            by_name: build(name, &all)?,
            by_path: build(path, &all)?,
            empty: globs.is_empty(),
        })
    }

    fn matches(&self, rel: &str, name: &str) -> bool {
        self.by_name.is_match(name) || self.by_path.is_match(rel)
    }
}

/// Which paths below a watch's root it reports (depth and globs), the
/// same for the kernel's stores and a device's files.
#[derive(Debug)]
pub struct PathFilter {
    recursive: bool,
    include: Globs,
    exclude: Globs,
}

impl PathFilter {
    pub fn new(
        recursive: bool,
        include: &[String],
        exclude: &[String],
    ) -> Result<PathFilter, BadGlob> {
        Ok(PathFilter {
            recursive,
            include: Globs::new("include", include)?,
            exclude: Globs::new("exclude", exclude)?,
        })
    }

    /// Whether a change at `rel` (`/`-separated below the root, `""` for
    /// the root itself) whose file name is `name` is reported.
    pub fn keeps(&self, rel: &str, name: &str) -> bool {
        if !self.recursive && rel.contains('/') {
            return false;
        }
        if !self.include.empty && !self.include.matches(rel, name) {
            return false;
        }
        self.exclude.empty || !self.exclude.matches(rel, name)
    }
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
    /// Accepted and not needed: a watch is found by its id, wherever it
    /// runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
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
    fn an_expired_cursor_is_coded_with_resync_and_other_failures_are_plain() {
        let expired: WatchOutcome<UnwatchResult> =
            crate::OpResult::Failed(WatchFailure::Expired(ExpiredFailure::new("gone")));
        assert_eq!(
            serde_json::to_value(&expired).unwrap(),
            serde_json::json!({"ok": false, "error": {"code": CURSOR_EXPIRED, "message": "gone"},
                "code": CURSOR_EXPIRED, "resync": true})
        );
        let back: WatchOutcome<UnwatchResult> =
            serde_json::from_value(serde_json::to_value(&expired).unwrap()).unwrap();
        assert_eq!(back, expired);
        let plain: WatchOutcome<UnwatchResult> = serde_json::from_value(
            serde_json::json!({"ok": false, "error": "Unknown watch: w", "code": "not_found"}),
        )
        .unwrap();
        assert!(
            matches!(plain, crate::OpResult::Failed(WatchFailure::Op(f)) if f.code.as_deref() == Some("not_found"))
        );
        let done: WatchOutcome<UnwatchResult> =
            serde_json::from_value(serde_json::json!({"ok": true, "watchId": "w"})).unwrap();
        assert!(matches!(done, crate::OpResult::Done(d) if d.result.watch_id == "w"));
    }

    #[test]
    fn depth_and_globs_decide_what_is_kept() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let f = PathFilter::new(true, &s(&["*.rs", "docs/*.md"]), &s(&["gen_*"])).unwrap();
        assert!(f.keeps("a.rs", "a.rs"));
        assert!(f.keeps("x/b.rs", "b.rs"));
        assert!(f.keeps("docs/r.md", "r.md"));
        assert!(!f.keeps("x/r.md", "r.md"));
        assert!(!f.keeps("gen_a.rs", "gen_a.rs"));
        let shallow = PathFilter::new(false, &[], &[]).unwrap();
        assert!(shallow.keeps("a", "a") && shallow.keeps("", "src"));
        assert!(!shallow.keeps("x/a", "a"));
        let e = PathFilter::new(true, &s(&["a[b"]), &[]).unwrap_err();
        assert_eq!((e.which, e.glob.as_str()), ("include", "a[b"));
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
