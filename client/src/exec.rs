//! The exec types of the `shell` half, one set shared by the daemon's
//! server, this client and the CLI. Payloads are bytes, never re-encoded.

/// A command to start (`Shell.exec`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// Run as `/bin/sh -c command`.
    pub command: String,
    /// Relative to the workspace root; `None` is the root. Outside the root
    /// is `EINVAL` (the runner checks).
    pub cwd: Option<String>,
    /// `None`: the runner picks a fresh unique id. A live id is `EEXEC_BUSY`.
    pub id: Option<String>,
    /// Added to the runner's allowlisted environment.
    pub env: Vec<(String, String)>,
    /// Written to the command's stdin, then the pipe is closed.
    pub stdin: Option<Vec<u8>>,
    pub timeout_ms: Option<u64>,
}

/// Where a re-attaching reader starts (`Shell.getExec`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ResumeFrom {
    /// Every retained event from seq 1.
    #[default]
    Start,
    /// Events with `seq > n`; older than the retained log is `ELOG_TRUNCATED`.
    After(u64),
    /// Only events logged from now on.
    Tail,
}

/// The signal `killExec` sends to the exec's process group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Signal {
    #[default]
    Term,
    Kill,
    Int,
    Hup,
}

/// What one event carries. Payloads are bytes, never re-encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEventKind {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The exit status; always the last event of an exec.
    Exit(i32),
}

/// One logged event of an exec. `seq` starts at 1 and grows by one per
/// event of that exec, across stdout and stderr.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecEvent {
    pub id: String,
    pub seq: u64,
    pub kind: ExecEventKind,
}
