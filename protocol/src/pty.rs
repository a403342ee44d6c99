//! `shell.pty.*`: an interactive terminal in a workspace, and its
//! `shell.pty.output` / `shell.pty.exit` / `shell.pty.lagged` signals.
//!
//! The terminal runs in the workspace's wsd; its output is kept in wsd's
//! durable exec log (bounded: the oldest output goes first), so a client
//! that lost its socket attaches again with `after` set to the output
//! offset it has and gets the rest exactly once, then live output.
//! Offsets count bytes of the terminal's output from 0. Several
//! connections may attach to one terminal; their input goes to one
//! ordered queue. Operation failures are `{ok:false, error, code}` with a
//! [`PtyErrorCode`].

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most bytes of input one `shell.pty.input` may carry (decoded).
pub const MAX_INPUT_BYTES: usize = 64 * 1024;
/// The largest width or height of a terminal; 0 is refused too.
pub const MAX_DIMENSION: u16 = 1000;
/// The window size of a terminal opened without one.
pub const DEFAULT_COLS: u16 = 80;
pub const DEFAULT_ROWS: u16 = 24;
/// Bytes of output one `shell.pty.output` signal carries at most
/// (before base64).
pub const MAX_OUTPUT_CHUNK: usize = 16 * 1024;

fn default_cols() -> u16 {
    DEFAULT_COLS
}

fn default_rows() -> u16 {
    DEFAULT_ROWS
}

/// `shell.pty.open`: starts a program (a shell by default) on a new
/// terminal in a workspace, and attaches this connection from offset 0.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtyOpenArgs {
    /// The workspace to run in (at its root), or give `cwd`.
    pub workspace_id: Option<String>,
    /// A directory under `/workspaces/<id>/` (default: the caller's cwd).
    pub cwd: Option<String>,
    #[serde(default = "default_cols")]
    pub cols: u16,
    #[serde(default = "default_rows")]
    pub rows: u16,
    /// Program and arguments (default: `/bin/sh`).
    pub command: Option<Vec<String>>,
    /// Added to the program's environment (`TERM` is `xterm-256color`
    /// unless set here).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// Whether a terminal's program still runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PtyStatus {
    Running,
    Exited,
}

/// `shell.pty.open`'s answer; output follows as `shell.pty.output`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyOpenResult {
    pub pty_id: String,
    pub workspace_id: String,
    pub status: PtyStatus,
}

/// `shell.pty.input`: typed input, as text (`data`) or bytes
/// (`dataBase64`), exactly one of them.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtyInputArgs {
    pub pty_id: String,
    pub data: Option<String>,
    /// Standard base64 (with padding).
    pub data_base64: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyInputResult {
    pub pty_id: String,
    /// Bytes queued.
    pub bytes: usize,
}

/// `shell.pty.resize`: the program gets `SIGWINCH`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtyResizeArgs {
    pub pty_id: String,
    pub cols: u16,
    pub rows: u16,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyResizeResult {
    pub pty_id: String,
    pub cols: u16,
    pub rows: u16,
}

/// `shell.pty.attach`: replays the output after byte offset `after`
/// (default 0) on this connection, then live output and the exit.
/// Attaching again on the same connection replaces the earlier
/// attachment.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtyAttachArgs {
    pub pty_id: String,
    pub after: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyAttachResult {
    pub pty_id: String,
    pub status: PtyStatus,
    /// Where the replay starts (`after`).
    pub offset: u64,
}

/// `shell.pty.list`: the caller's terminals.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtyListArgs {}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyInfo {
    pub pty_id: String,
    pub workspace_id: String,
    pub command: Vec<String>,
    pub status: PtyStatus,
    pub cols: u16,
    pub rows: u16,
    /// Output bytes so far (what a client that has all of it passes as
    /// `after`).
    pub output_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Milliseconds since the epoch.
    pub created_at: i64,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyListResult {
    pub ptys: Vec<PtyInfo>,
}

/// `shell.pty.close`: signals every process of the terminal's session
/// (`HUP` by default, as a closed terminal does; `SIGKILL` follows if it
/// has not ended after a grace period). `shell.pty.exit` follows.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PtyCloseArgs {
    pub pty_id: String,
    /// `HUP` (default), `TERM`, `INT` or `KILL`.
    pub signal: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyCloseResult {
    pub pty_id: String,
    pub status: PtyStatus,
}

/// Signal `shell.pty.output`: bytes `offset .. offset + len` of the
/// terminal's output. Resume with `shell.pty.attach {after: offset + len}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyOutputSignal {
    pub pty_id: String,
    pub offset: u64,
    pub data_base64: String,
}

/// Signal `shell.pty.exit`: the program ended; no output follows.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyExitSignal {
    pub pty_id: String,
    /// The program's exit code, `128 + n` when signal `n` ended it.
    pub exit_code: i32,
    /// The signal `shell.pty.close` sent, when the code says it ended the
    /// program.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
}

/// Signal `shell.pty.lagged`: this connection did not read fast enough,
/// so its attachment stopped after `offset` bytes (nothing after them was
/// sent). Resume with `shell.pty.attach {after: offset}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PtyLaggedSignal {
    pub pty_id: String,
    pub offset: u64,
}

/// The machine-readable kind of a [`PtyError`] (`code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum PtyErrorCode {
    InvalidArgument,
    /// No such terminal for this caller (someone else's looks the same).
    NotFound,
    TooLarge,
    /// The terminal's program has exited.
    Closed,
    /// The output before the requested offset is no longer retained.
    Truncated,
    /// The workspace's wsd refused or could not be reached.
    Unavailable,
}

impl PtyErrorCode {
    /// The code as sent (`not_found`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            PtyErrorCode::InvalidArgument => "invalid_argument",
            PtyErrorCode::NotFound => "not_found",
            PtyErrorCode::TooLarge => "too_large",
            PtyErrorCode::Closed => "closed",
            PtyErrorCode::Truncated => "truncated",
            PtyErrorCode::Unavailable => "unavailable",
        }
    }
}

/// An operation failure of a `shell.pty.*` call, naming the argument or
/// terminal at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum PtyError {
    #[error("Invalid argument {arg}: {reason}")]
    Invalid { arg: &'static str, reason: String },
    #[error("Unknown ptyId: {0}")]
    NotFound(String),
    #[error("{what} is {got} bytes; the limit is {max}")]
    TooLarge {
        what: &'static str,
        max: usize,
        got: usize,
    },
    #[error("Terminal {0} has exited; it takes no input")]
    Closed(String),
    #[error(
        "Terminal {pty_id}: the output after offset {after} is no longer all kept \
         (it has {available} bytes so far); attach with a later offset"
    )]
    Truncated {
        pty_id: String,
        after: u64,
        available: u64,
    },
    #[error("{0}")]
    Unavailable(String),
    #[error(
        "Terminal {0} ended when the kernel restarted (its workspace's wsd stopped with the kernel)"
    )]
    EndedWithKernel(String),
}

impl PtyError {
    pub fn code(&self) -> PtyErrorCode {
        match self {
            PtyError::Invalid { .. } => PtyErrorCode::InvalidArgument,
            PtyError::NotFound(_) => PtyErrorCode::NotFound,
            PtyError::TooLarge { .. } => PtyErrorCode::TooLarge,
            PtyError::Closed(_) | PtyError::EndedWithKernel(_) => PtyErrorCode::Closed,
            PtyError::Truncated { .. } => PtyErrorCode::Truncated,
            PtyError::Unavailable(_) => PtyErrorCode::Unavailable,
        }
    }

    pub fn invalid(arg: &'static str, reason: impl Into<String>) -> PtyError {
        PtyError::Invalid {
            arg,
            reason: reason.into(),
        }
    }

    /// Checks a window size: each side 1 ..= [`MAX_DIMENSION`].
    pub fn check_size(cols: u16, rows: u16) -> Result<(), PtyError> {
        for (arg, v) in [("cols", cols), ("rows", rows)] {
            if v == 0 || v > MAX_DIMENSION {
                return Err(PtyError::invalid(
                    arg,
                    format!("{v} is outside 1..={MAX_DIMENSION}"),
                ));
            }
        }
        Ok(())
    }
}

impl From<PtyError> for crate::OpFailure {
    fn from(e: PtyError) -> Self {
        crate::OpFailure {
            ok: false,
            error: e.to_string(),
            code: Some(e.code().as_str().to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn open_defaults_to_80x24_and_refuses_unknown_fields() {
        let a: PtyOpenArgs = serde_json::from_value(json!({"workspaceId": "w"})).unwrap();
        assert_eq!((a.cols, a.rows), (DEFAULT_COLS, DEFAULT_ROWS));
        assert!(serde_json::from_value::<PtyOpenArgs>(json!({"colums": 3})).is_err());
    }

    #[test]
    fn sizes_outside_the_range_name_their_argument() {
        assert!(PtyError::check_size(80, 24).is_ok());
        let e = PtyError::check_size(0, 0).unwrap_err();
        assert_eq!(e.code(), PtyErrorCode::InvalidArgument);
        assert!(e.to_string().contains("cols"), "{e}");
        let e = PtyError::check_size(80, 10_000).unwrap_err();
        assert!(e.to_string().contains("rows"), "{e}");
    }

    #[test]
    fn signals_use_the_documented_field_names() {
        let v = serde_json::to_value(PtyOutputSignal {
            pty_id: "p".into(),
            offset: 3,
            data_base64: "aGk=".into(),
        })
        .unwrap();
        assert_eq!(v, json!({"ptyId": "p", "offset": 3, "dataBase64": "aGk="}));
        let v = serde_json::to_value(PtyExitSignal {
            pty_id: "p".into(),
            exit_code: 3,
            signal: None,
        })
        .unwrap();
        assert_eq!(v, json!({"ptyId": "p", "exitCode": 3}));
    }
}
