//! The gsv kernel's wire contract, shared by the kernel (`gsv-kernel`),
//! the device driver (`gsv-node`) and clients: the JSON frames on the
//! WebSocket ([`frames`]), the wire error codes ([`error`]), the protocol
//! version, and per domain the typed arguments and results of every
//! syscall, with their JSON schemas ([`tool_parameters`]) for the model's
//! tool definitions. It holds no I/O: no async runtime, no database, no
//! HTTP.

pub mod account;
pub mod adapter;
pub mod ai;
pub mod codemode;
pub mod device;
pub mod error;
pub mod frames;
pub mod fs;
pub mod link;
pub mod mcp;
pub mod oauth;
pub mod proc;
pub mod pty;
pub mod repo;
pub mod shell;
pub mod sys;
pub mod workspace;

use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde::{Deserialize, Serialize};
use serde_json::Value;
pub mod snapshot;
pub mod watch;

pub use error::{FrameError, WireError};

/// The protocol version this kernel speaks (`sys.connect` `protocol`).
pub const PROTOCOL: i64 = 2;

/// The result of a call whose failures are operation results (the seed's
/// `OperationError`): `{ok:true, ...T}` or `{ok:false, error}`, both sent
/// as `ok:true` frames. A family whose failures carry more than
/// [`OpFailure`] names its own failure type `F` (`fs.watch`'s expired
/// cursor: [`watch::WatchFailure`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OpResult<T, F = OpFailure> {
    Done(Done<T>),
    Failed(F),
}

/// A successful operation: `ok: true` beside the result's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Done<T> {
    pub ok: bool,
    #[serde(flatten)]
    pub result: T,
}

impl<T> Done<T> {
    pub fn new(result: T) -> Self {
        Done { ok: true, result }
    }
}

/// A failed operation: `{ok:false, error}`, and for the families that
/// have them a stable `code` (`fs.*`: [`fs::FsErrorCode`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct OpFailure {
    pub ok: bool,
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

impl<T> OpResult<T> {
    pub fn done(result: T) -> Self {
        OpResult::Done(Done { ok: true, result })
    }

    pub fn failed(error: impl Into<String>) -> Self {
        OpResult::Failed(OpFailure {
            ok: false,
            error: error.into(),
            code: None,
        })
    }
}

/// The JSON schema of `T` as a tool's `parameters`: inline (no `$defs`),
/// without the `$schema`/`title`/`description` of the root (the tool has
/// its own description).
pub fn tool_parameters<T: JsonSchema>() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.inline_subschemas = true;
    let schema = settings.into_generator().into_root_schema_for::<T>();
    let mut v = schema.to_value();
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
        o.remove("description");
    }
    v
}

/// A routable call's arguments with the device to run it on.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct Targeted<T> {
    #[serde(flatten)]
    pub args: T,
    /// "gsv" (default) or a device id.
    pub target: Option<String>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_operation_result_is_ok_beside_its_fields_or_ok_false_with_the_error() {
        let done = OpResult::done(fs::DeleteResult { path: "/a".into() });
        assert_eq!(
            serde_json::to_value(done).unwrap(),
            json!({"ok": true, "path": "/a"})
        );
        let failed = OpResult::<fs::DeleteResult>::failed("nope");
        assert_eq!(
            serde_json::to_value(failed).unwrap(),
            json!({"ok": false, "error": "nope"})
        );
        let missing = OpResult::<fs::DeleteResult>::from(Err(fs::FsError::not_found("/a")));
        assert_eq!(
            serde_json::to_value(missing).unwrap(),
            json!({"ok": false, "error": "Path not found: /a", "code": "not_found"})
        );
    }

    #[test]
    fn truncated_is_sent_only_when_true() {
        let file = |cap| {
            let mut w = fs::TextWindow::with_cap(0, cap);
            w.push_text("xy\nz\n", false);
            fs::ReadResult::Text(w.finish("/f".into(), 5, "text/plain".into()))
        };
        let whole = serde_json::to_value(file(100)).unwrap();
        assert!(whole.get("truncated").is_none(), "{whole}");
        assert!(whole.get("nextOffset").is_none(), "{whole}");
        assert_eq!(whole["kind"], "text");
        assert_eq!(whole["contentType"], "text/plain");
        let cut = serde_json::to_value(file(5)).unwrap();
        assert_eq!(
            (&cut["truncated"], &cut["nextOffset"]),
            (&json!(true), &json!(1))
        );
        let back: fs::ReadResult = serde_json::from_value(cut).unwrap();
        assert!(matches!(back, fs::ReadResult::Text(t) if t.content == "1\txy"));
    }

    #[test]
    fn a_refused_exec_has_no_status_and_a_failed_one_has_empty_output() {
        assert_eq!(
            serde_json::to_value(shell::ExecResult::refused("bad")).unwrap(),
            json!({"ok": false, "error": "bad"})
        );
        assert_eq!(
            serde_json::to_value(shell::ExecResult::failed("gone")).unwrap(),
            json!({"status": "failed", "output": "", "error": "gone"})
        );
    }

    #[test]
    fn tool_parameters_inline_nested_types_and_add_the_target() {
        let p = tool_parameters::<Targeted<fs::EditArgs>>();
        assert_eq!(p["type"], "object");
        assert!(p["properties"]["target"].is_object(), "{p}");
        assert!(p["properties"]["oldString"].is_object(), "{p}");
        assert!(
            p.get("$schema").is_none() && p.get("$defs").is_none(),
            "{p}"
        );
    }
}
