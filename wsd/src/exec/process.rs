//! Process hygiene: signal names, signalling a whole process group, the
//! environment allowlist and `cwd` validation. Everything here is
//! synchronous and small; the runner calls it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, killpg, sigaction};
use nix::unistd::Pid;
use wsd_sync::{ErrorCode, SyncPath};

use super::ExecError;

/// Variables copied from the daemon's environment into every command. Names
/// starting with `LC_` are copied too. Anything else (tokens, cloud
/// credentials, the daemon's own configuration) never reaches a command
/// unless the caller passes it explicitly in the request's `env`.
pub const ENV_ALLOWLIST: [&str; 6] = ["PATH", "HOME", "TMPDIR", "TZ", "LANG", "TERM"];

/// Whether a daemon variable may be passed on to commands.
pub(crate) fn env_allowed(name: &str) -> bool {
    ENV_ALLOWLIST.contains(&name) || name.starts_with("LC_")
}

/// The environment of a command: the allowlisted part of `daemon_env`, then
/// the per-call `env` (which wins on a clash).
pub(crate) fn command_env(
    daemon_env: &[(OsString, OsString)],
    call_env: &[(String, String)],
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = daemon_env
        .iter()
        .filter(|(k, _)| k.to_str().is_some_and(env_allowed))
        .cloned()
        .collect();
    for (k, v) in call_env {
        out.retain(|(ek, _)| ek.as_os_str() != k.as_str());
        out.push((k.into(), v.into()));
    }
    out
}

/// Parses a signal as `TERM`, `SIGTERM` (any case) or a number (`9`).
/// Signal 0 (a probe, not a signal), unknown names and numbers without a
/// name (the real-time range, which the C library partly reserves) are
/// `EINVAL`.
pub fn parse_signal(s: &str) -> Result<i32, ExecError> {
    let bad = || ExecError::Invalid(format!("unknown signal {s:?}"));
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map(|sig| sig as i32).map_err(|_| bad());
    }
    let upper = s.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    format!("SIG{name}")
        .parse::<Signal>()
        .map(|sig| sig as i32)
        .map_err(|_| bad())
}

/// Sends `sig` to every process in the group `pgid`. A group that no longer
/// exists (`ESRCH`) is not an error: the exec is already over.
pub(crate) fn signal_group(pgid: i32, sig: i32) -> std::io::Result<()> {
    // A pgid <= 1 would address our own group or every process we may
    // signal; the runner never stores such a value, this is a last guard.
    if pgid <= 1 {
        return Err(Errno::EINVAL.into());
    }
    let sig = Signal::try_from(sig)?;
    match killpg(Pid::from_raw(pgid), sig) {
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Sends `sig` to every process of the session a terminal's leader
/// `leader` leads (field 6 of `stat`): the leader and every job an
/// interactive shell put in a group of its own. Sandboxed terminals too:
/// the sandbox's runner makes the program a session leader, and `/proc`
/// here names it by its host pid. A process forked while `/proc` is read
/// can be missed; the runner's SIGKILL escalation reads it again.
pub(crate) fn signal_terminal(leader: i32, sig: i32) -> std::io::Result<()> {
    if leader <= 1 {
        return Err(Errno::EINVAL.into());
    }
    let sig = Signal::try_from(sig)?;
    for entry in std::fs::read_dir("/proc")? {
        let Some(pid) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if parse_stat_field(&stat, 6) == Some(leader as u64) {
            match nix::sys::signal::kill(Pid::from_raw(pid), sig) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// The start time of process `pid`: field 22 of `/proc/<pid>/stat`, in
/// clock ticks since boot. With the pid it names one process for the life of
/// the machine, so a recycled pid is told apart from the process it once
/// named.
pub(crate) fn process_start_time(pid: i32) -> std::io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_start_time(&stat).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat has no start time field"),
        )
    })
}

/// Field 22 of a `/proc/<pid>/stat` line.
fn parse_start_time(stat: &str) -> Option<u64> {
    parse_stat_field(stat, 22)
}

/// Numeric field `n` (from 3) of a `/proc/<pid>/stat` line. The command
/// name (field 2) is in parentheses and may itself hold spaces and `)`, so
/// fields are counted from the last `)`: field 3 is the first after it.
fn parse_stat_field(stat: &str, n: usize) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(n - 3)?.parse().ok()
}

/// What became of a process group a previous daemon left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OrphanOutcome {
    /// The leader (same pid, same start time) was still running: the group
    /// got SIGKILL.
    Killed,
    /// The leader is gone but members of its group remain: they got SIGKILL.
    /// Linux does not reuse a pid while a process group of that number
    /// exists, so the group can only be the exec's.
    KilledMembers,
    /// The pid names another process now (another start time): left alone.
    Recycled,
    /// Nothing of the group is left.
    Gone,
}

/// Kills the process group `pgid` of an exec a previous daemon ran, but only
/// if it is provably still that exec's group (see [`OrphanOutcome`]).
pub(crate) fn kill_orphaned_group(pgid: i32, leader_start: u64) -> std::io::Result<OrphanOutcome> {
    match process_start_time(pgid) {
        Ok(t) if t == leader_start => {
            signal_group(pgid, Signal::SIGKILL as i32)?;
            Ok(OrphanOutcome::Killed)
        }
        Ok(_) => Ok(OrphanOutcome::Recycled),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if group_exists(pgid) {
                signal_group(pgid, Signal::SIGKILL as i32)?;
                Ok(OrphanOutcome::KilledMembers)
            } else {
                Ok(OrphanOutcome::Gone)
            }
        }
        Err(e) => Err(e),
    }
}

/// Whether any process is in group `pgid` (signal 0 checks without
/// signalling; `EPERM` means it exists but is not ours to signal).
fn group_exists(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    matches!(
        killpg(Pid::from_raw(pgid), None),
        Ok(()) | Err(Errno::EPERM)
    )
}

/// Resolves a request's `cwd` to a canonical directory inside `root`
/// (`root` must already be canonical). `None`, `""` and `"."` mean the root.
/// Rejected with `EINVAL`: absolute paths, `..`, a path that does not exist
/// or is not a directory, and a path whose symlinks lead outside the root.
///
/// This is a check of intent, not a sandbox: the command itself can `cd`
/// anywhere, and a symlink swapped between this check and the spawn is not
/// re-checked.
pub(crate) fn resolve_cwd(root: &Path, cwd: Option<&str>) -> Result<PathBuf, ExecError> {
    let cwd = match cwd {
        None | Some("") | Some(".") => return Ok(root.to_path_buf()),
        Some(c) => c,
    };
    let invalid = |reason: String| ExecError::InvalidCwd {
        cwd: cwd.to_owned(),
        reason,
    };
    let rel = SyncPath::canonicalize(cwd).map_err(|e| match e.code() {
        ErrorCode::Limit => ExecError::Invalid(format!("cwd {cwd:?}: {e}")),
        _ => invalid(e.to_string()),
    })?;
    let joined = root.join(rel.as_str());
    let real = std::fs::canonicalize(&joined).map_err(|e| invalid(e.to_string()))?;
    if !real.starts_with(root) {
        return Err(invalid("resolves outside the workspace root".into()));
    }
    if !real.is_dir() {
        return Err(invalid("not a directory".into()));
    }
    Ok(real)
}

/// Makes the signals this process inherited as ignored reach the commands
/// it runs with their default action. A daemon started in the background
/// by a non-interactive shell ignores SIGINT and SIGQUIT (under `nohup`,
/// SIGHUP too), and an ignored signal stays ignored across `exec`: every
/// command would inherit that, and `killExec` with such a signal would do
/// nothing until the SIGKILL after the grace period.
///
/// Each such signal gets an empty handler instead: the daemon still does
/// nothing on it, and a handler (unlike an ignore) is reset to the default
/// by `exec`. This keeps the fast `posix_spawn` path (a `pre_exec` reset in
/// the child would force a full `fork`, +0.35 ms per exec). SIGPIPE is left
/// alone (the standard library resets it in children) and SIGCHLD is
/// tokio's. The job-control signals keep an inherited ignore: caught
/// instead, SIGTTOU would make every terminal write of a background daemon
/// stop and restart (commands run without a terminal anyway). Runs once
/// per process, before the first command is spawned.
pub(crate) fn stop_ignoring_inherited_signals() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let mut changed = Vec::new();
        for sig in ignored_signals() {
            if matches!(
                sig,
                Signal::SIGKILL
                    | Signal::SIGSTOP
                    | Signal::SIGPIPE
                    | Signal::SIGCHLD
                    | Signal::SIGTSTP
                    | Signal::SIGTTIN
                    | Signal::SIGTTOU
            ) {
                continue;
            }
            if replace_ignore_with_empty_handler(sig) {
                changed.push(sig);
            }
        }
        if !changed.is_empty() {
            tracing::debug!(signals = ?changed, "inherited ignored signals now reach commands with their default action");
        }
    });
}

/// The named signals this process ignores, from the `SigIgn` mask of
/// `/proc/self/status` (reading a disposition through `sigaction` would
/// mean replacing it for a moment). Real-time signals are left out: they
/// have no name, and the C library reserves some of them.
fn ignored_signals() -> Vec<Signal> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mask = status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap_or(0);
    Signal::iterator()
        .filter(|sig| mask & (1u64 << (*sig as i32 - 1)) != 0)
        .collect()
}

extern "C" fn empty_handler(_: std::ffi::c_int) {}

#[allow(unsafe_code)]
fn replace_ignore_with_empty_handler(sig: Signal) -> bool {
    let action = SigAction::new(
        SigHandler::Handler(empty_handler),
        SaFlags::SA_RESTART,
        SigSet::empty(),
    );
    // SAFETY: the installed handler does nothing, so it is async-signal-safe
    // and cannot break any invariant of the interrupted code.
    unsafe { sigaction(sig, &action) }.is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_time_is_field_22_even_with_a_parenthesis_in_the_name() {
        let line =
            "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(line), Some(987654));
        assert_eq!(parse_start_time("4242 (sh) S 1"), None);
        let own = process_start_time(std::process::id() as i32).unwrap();
        assert!(own > 0);
        assert_eq!(process_start_time(std::process::id() as i32).unwrap(), own);
    }

    #[test]
    fn an_orphaned_group_is_killed_only_while_its_leader_has_the_recorded_start_time() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let start = process_start_time(pid).unwrap();
        assert_eq!(
            kill_orphaned_group(pid, start + 1).unwrap(),
            OrphanOutcome::Recycled
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "a mismatch kills nothing"
        );
        assert_eq!(
            kill_orphaned_group(pid, start).unwrap(),
            OrphanOutcome::Killed
        );
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(Signal::SIGKILL as i32));
        assert_eq!(
            kill_orphaned_group(pid, start).unwrap(),
            OrphanOutcome::Gone
        );
    }

    #[test]
    fn the_wire_signals_have_the_numbers_this_platform_gives_their_names() {
        for sig in wsd_client::Signal::ALL {
            assert_eq!(parse_signal(sig.name()).unwrap(), sig.number(), "{sig}");
        }
    }

    #[test]
    fn signal_names_numbers_and_prefixes_parse() {
        assert_eq!(parse_signal("TERM").unwrap(), 15);
        assert_eq!(parse_signal("SIGKILL").unwrap(), 9);
        assert_eq!(parse_signal("sigint").unwrap(), 2);
        assert_eq!(parse_signal("hup").unwrap(), 1);
        assert_eq!(parse_signal("9").unwrap(), 9);
        assert_eq!(parse_signal("winch").unwrap(), 28);
        for bad in ["0", "40", "65", "-1", "", "SIG", "TERMINATE", "SIGFOO"] {
            assert_eq!(
                parse_signal(bad).unwrap_err().code(),
                ErrorCode::Invalid,
                "{bad}"
            );
        }
    }

    #[test]
    fn command_env_keeps_only_allowlisted_daemon_vars_and_call_env_wins() {
        let daemon: Vec<(OsString, OsString)> = [
            ("PATH", "/bin"),
            ("HOME", "/home/d"),
            ("LC_ALL", "C"),
            ("AWS_SECRET_ACCESS_KEY", "s3cret"),
            ("WSD_TOKEN", "t"),
        ]
        .into_iter()
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
        let env = command_env(
            &daemon,
            &[("HOME".into(), "/x".into()), ("FOO".into(), "1".into())],
        );
        let names: Vec<_> = env
            .iter()
            .map(|(k, v)| (k.to_str().unwrap(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("PATH", "/bin"),
                ("LC_ALL", "C"),
                ("HOME", "/x"),
                ("FOO", "1")
            ]
        );
    }

    #[test]
    fn cwd_must_be_an_existing_directory_inside_the_root() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap().join("root");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("file"), b"x").unwrap();
        std::fs::create_dir(tmp.path().join("outside")).unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("inside")).unwrap();
        std::os::unix::fs::symlink(tmp.path(), root.join("escape")).unwrap();

        assert_eq!(resolve_cwd(&root, None).unwrap(), root);
        assert_eq!(resolve_cwd(&root, Some("")).unwrap(), root);
        assert_eq!(
            resolve_cwd(&root, Some("a/./b/")).unwrap(),
            root.join("a/b")
        );
        assert_eq!(
            resolve_cwd(&root, Some("inside/b")).unwrap(),
            root.join("a/b")
        );
        for bad in [
            "/tmp",
            "../root",
            "a/../..",
            "missing",
            "file",
            "escape",
            "escape/outside",
        ] {
            let err = resolve_cwd(&root, Some(bad)).unwrap_err();
            assert_eq!(err.code(), ErrorCode::Invalid, "{bad}: {err}");
        }
    }
}
