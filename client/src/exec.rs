//! The exec types of the `shell` half, one set shared by the daemon's
//! server, this client and the CLI. Payloads are bytes, never re-encoded.

use wsd_sync::ErrorCode;

use crate::WsdError;

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
    /// Written to the command's stdin; the pipe is then closed unless
    /// `stdin_open`. `None` without `stdin_open`: stdin is `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// SIGTERM to the group after this long, SIGKILL a grace period later.
    /// `Some(0)` disables the timeout (on the wire `0` is "none", which the
    /// daemon reads as its configured default); `None` uses the default.
    pub timeout_ms: Option<u64>,
    /// Keep stdin open after `stdin` for `writeStdin` and `closeStdin`.
    pub stdin_open: bool,
}

/// A program to start on a new pseudo-terminal (`Shell.startPty`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PtyRequest {
    /// Program and arguments; empty is `/bin/sh`.
    pub argv: Vec<String>,
    /// Relative to the workspace root; `None` is the root.
    pub cwd: Option<String>,
    /// `None`: the runner picks a fresh unique id. A live id is `EEXEC_BUSY`.
    pub id: Option<String>,
    /// Added to the runner's allowlisted environment.
    pub env: Vec<(String, String)>,
    /// The window size, 1 ..= [`crate::limits::MAX_PTY_DIMENSION`] each.
    pub cols: u16,
    pub rows: u16,
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

/// The signal `killExec` sends to the exec's process group: the wire's
/// closed set, typed from the CLI's flag to the runner's `kill(2)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Signal {
    #[default]
    Term,
    Kill,
    Int,
    Hup,
}

impl Signal {
    pub const ALL: [Signal; 4] = [Signal::Term, Signal::Kill, Signal::Int, Signal::Hup];

    /// The name without `SIG`: `TERM`, `KILL`, `INT`, `HUP`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
            Signal::Int => "INT",
            Signal::Hup => "HUP",
        }
    }

    /// The POSIX number (the same on every Unix wsd runs on).
    pub fn number(self) -> i32 {
        match self {
            Signal::Term => 15,
            Signal::Kill => 9,
            Signal::Int => 2,
            Signal::Hup => 1,
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Signal {
    type Err = WsdError;

    /// `TERM`, `SIGTERM`, `term` or `15` (and likewise for the others);
    /// anything else is `EINVAL` naming it.
    fn from_str(s: &str) -> Result<Signal, WsdError> {
        let upper = s.to_ascii_uppercase();
        let name = upper.strip_prefix("SIG").unwrap_or(&upper);
        Signal::ALL
            .into_iter()
            .find(|sig| sig.name() == name || sig.number().to_string() == name)
            .ok_or_else(|| {
                WsdError::new(
                    ErrorCode::Invalid,
                    format!("unsupported signal {s:?} (TERM, KILL, INT or HUP)"),
                )
                .with_subject(s)
            })
    }
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
    /// With the exit, as received: the daemon's store rev once the
    /// command's writes were settled (0: not said; see `ExecEvent.rev` in
    /// the schema). The daemon's runner sets it from the settle before
    /// the exit; its server fills in an exit that has none when sending.
    pub rev: u64,
}

impl ExecEventKind {
    /// Output bytes the event carries (0 for the exit).
    pub fn payload_len(&self) -> usize {
        match self {
            ExecEventKind::Stdout(d) | ExecEventKind::Stderr(d) => d.len(),
            ExecEventKind::Exit(_) => 0,
        }
    }
}

impl ExecEvent {
    pub fn is_exit(&self) -> bool {
        matches!(self.kind, ExecEventKind::Exit(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signal_parses_from_its_name_prefixed_name_and_number() {
        for sig in Signal::ALL {
            for text in [
                sig.name().to_owned(),
                format!("SIG{}", sig.name()),
                sig.name().to_lowercase(),
                sig.number().to_string(),
            ] {
                assert_eq!(text.parse::<Signal>().unwrap(), sig, "{text}");
            }
        }
        let e = "USR1".parse::<Signal>().unwrap_err();
        assert_eq!(e.code, ErrorCode::Invalid);
        assert_eq!(e.subject.as_deref(), Some("USR1"));
    }
}
