//! `codemode.exec` (the model's `CodeMode` tool) and `codemode.run`: one
//! sandboxed async JavaScript block, and how it ended.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `codemode.exec`: the `CodeMode` tool's arguments.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ExecArgs {
    /// The body of an async function: `await` works at the top level and
    /// `return` gives the result.
    pub code: String,
}

/// `codemode.run`: a block run by a user (the CLI's `gsv codemode run`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunArgs {
    /// The process to run in (its account, cwd and approvals); default
    /// the caller itself, in its home.
    pub pid: Option<String>,
    pub code: String,
    /// Default `target` of `shell` and `fs.*` inside the block.
    pub target: Option<String>,
    /// Default `cwd` of `shell` inside the block.
    pub cwd: Option<String>,
    /// The block's `argv` global.
    #[serde(default)]
    pub argv: Vec<String>,
    /// The block's `args` global (default `{}`).
    pub args: Option<Value>,
}

/// How a block ended: `{status:"completed", result, logs}` or
/// `{status:"failed", error, logs}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum CodeModeResult {
    Completed {
        /// The returned value as JSON (`null` for `undefined`).
        result: Value,
        /// `console.*` lines, capped.
        logs: Vec<String>,
    },
    Failed {
        error: String,
        /// The lines logged before the failure.
        logs: Vec<String>,
    },
}

impl CodeModeResult {
    pub fn is_failed(&self) -> bool {
        matches!(self, CodeModeResult::Failed { .. })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn results_carry_their_status_beside_the_fields() {
        let done = CodeModeResult::Completed {
            result: json!(2),
            logs: vec!["hi".into()],
        };
        assert_eq!(
            serde_json::to_value(done).unwrap(),
            json!({"status": "completed", "result": 2, "logs": ["hi"]})
        );
        let failed = CodeModeResult::Failed {
            error: "Error: no".into(),
            logs: vec![],
        };
        assert_eq!(
            serde_json::to_value(failed).unwrap(),
            json!({"status": "failed", "error": "Error: no", "logs": []})
        );
    }
}
