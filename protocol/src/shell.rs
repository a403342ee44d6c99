//! `shell.exec`: run a command (in a workspace, or on a device), or poll
//! or feed a running one by `sessionId`.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecArgs {
    /// Working directory (default: the caller's).
    pub cwd: Option<String>,
    /// The command line, or input for a running session.
    #[serde(default)]
    pub input: String,
    /// Continue a running command.
    pub session_id: Option<String>,
    /// Milliseconds; 0 disables the timeout.
    pub timeout: Option<u64>,
    /// How long to wait for the command before answering `running`.
    pub yield_ms: Option<u64>,
    /// Added to a new command's environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Keeps a new command's stdin open for later writes (`input` or
    /// `control.stdin` with its `sessionId`). Without it the command reads
    /// end of file at once, so nothing waits for input nobody sends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open_stdin: bool,
    /// Answers `running` as soon as there is output no answer has returned
    /// yet, instead of waiting out the budget (a streaming long poll).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
    /// With `sessionId`: acts on the command and answers at once with its
    /// status, taking none of its output (which stays for the next poll).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<ExecControl>,
}

/// What a control call does to a running command, in this order.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecControl {
    /// Written to its stdin (opened with `openStdin`).
    pub stdin: Option<String>,
    /// Closes its stdin: it reads end of file after what was written.
    #[serde(default)]
    pub close_stdin: bool,
    /// `TERM`, `INT`, `KILL` or `HUP`, to its process group.
    pub signal: Option<String>,
}

/// The model's `Shell` tool: `shell.exec` with the command named
/// `command` (the reference's tool shape); the agent loop passes it on as
/// `input`.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShellToolArgs {
    /// Command line.
    pub command: Option<String>,
    /// Milliseconds; 0 disables the timeout.
    pub timeout: Option<u64>,
    /// Continue a running command.
    pub session_id: Option<String>,
}

/// How a `shell.exec` answer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecStatus {
    /// Still running: poll with `sessionId`.
    Running,
    Completed,
    Failed,
}

/// A path a command changed in its workspace.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct FileChange {
    /// `/workspaces/<id>/<path>`.
    pub path: String,
    /// `file`, `dir`, `symlink` or `deleted`.
    pub kind: String,
    pub size: u64,
}

/// `shell.exec`'s answer. An operation failure before anything ran is
/// `ok:false` with `error` (and no status); otherwise `status` says
/// whether the command is still running, and the fields that apply to
/// that status are present.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExecResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ok: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ExecStatus>,
    /// Merged output: the tail (`running`: what no answer returned yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// Per stream, what no earlier answer returned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The wsd's error code (`ENOENT`, `ELIMIT`, `ETIMEDOUT`, ...) when a
    /// call to the workspace's wsd is what failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// What a completed command changed in its workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<FileChange>>,
    /// Present (true) when output was cut to the tail.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl ExecResult {
    /// `{ok:false, error}`: refused before anything ran.
    pub fn refused(error: impl Into<String>) -> Self {
        ExecResult {
            ok: Some(false),
            error: Some(error.into()),
            ..Default::default()
        }
    }

    /// A command that failed (`status: failed`) with no output.
    pub fn failed(error: impl Into<String>) -> Self {
        ExecResult {
            status: Some(ExecStatus::Failed),
            output: Some(String::new()),
            error: Some(error.into()),
            ..Default::default()
        }
    }
}
