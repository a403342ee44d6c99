//! Process hygiene: signal names, signalling a whole process group, the
//! environment allowlist and `cwd` validation. Everything here is
//! synchronous and small; the runner calls it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

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
/// Signal 0 (a probe, not a signal) and unknown names are `EINVAL`.
pub fn parse_signal(s: &str) -> Result<i32, ExecError> {
    let bad = || ExecError::Invalid(format!("unknown signal {s:?}"));
    if let Ok(n) = s.parse::<i32>() {
        // Linux numbers signals 1..=64 (SIGRTMAX).
        return if (1..=64).contains(&n) {
            Ok(n)
        } else {
            Err(bad())
        };
    }
    let upper = s.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    let sig = match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "ILL" => libc::SIGILL,
        "TRAP" => libc::SIGTRAP,
        "ABRT" => libc::SIGABRT,
        "BUS" => libc::SIGBUS,
        "FPE" => libc::SIGFPE,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "SEGV" => libc::SIGSEGV,
        "USR2" => libc::SIGUSR2,
        "PIPE" => libc::SIGPIPE,
        "ALRM" => libc::SIGALRM,
        "TERM" => libc::SIGTERM,
        "CHLD" => libc::SIGCHLD,
        "CONT" => libc::SIGCONT,
        "STOP" => libc::SIGSTOP,
        "TSTP" => libc::SIGTSTP,
        "TTIN" => libc::SIGTTIN,
        "TTOU" => libc::SIGTTOU,
        "URG" => libc::SIGURG,
        "XCPU" => libc::SIGXCPU,
        "XFSZ" => libc::SIGXFSZ,
        "VTALRM" => libc::SIGVTALRM,
        "PROF" => libc::SIGPROF,
        "WINCH" => libc::SIGWINCH,
        "IO" => libc::SIGIO,
        "SYS" => libc::SIGSYS,
        _ => return Err(bad()),
    };
    Ok(sig)
}

/// Sends `sig` to every process in the group `pgid`. A group that no longer
/// exists (`ESRCH`) is not an error: the exec is already over.
#[allow(unsafe_code)]
pub(crate) fn signal_group(pgid: i32, sig: i32) -> std::io::Result<()> {
    // A pgid <= 1 would address our own group or every process we may
    // signal; the runner never stores such a value, this is a last guard.
    if pgid <= 1 {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: killpg has no memory-safety preconditions; it only reads its
    // two integer arguments.
    let rc = unsafe { libc::killpg(pgid, sig) };
    if rc == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        return Ok(());
    }
    Err(err)
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
        for sig in 1..=libc::SIGRTMAX() {
            if matches!(
                sig,
                libc::SIGKILL
                    | libc::SIGSTOP
                    | libc::SIGPIPE
                    | libc::SIGCHLD
                    | libc::SIGTSTP
                    | libc::SIGTTIN
                    | libc::SIGTTOU
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

extern "C" fn empty_handler(_: libc::c_int) {}

#[allow(unsafe_code)]
fn replace_ignore_with_empty_handler(sig: libc::c_int) -> bool {
    // SAFETY: sigaction reads and writes only the zero-initialised
    // structures passed to it; the installed handler does nothing, so it is
    // async-signal-safe. Numbers the C library reserves fail with EINVAL.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction != libc::SIG_IGN
        {
            return false;
        }
        let mut new: libc::sigaction = std::mem::zeroed();
        new.sa_sigaction = empty_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
        new.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut new.sa_mask);
        libc::sigaction(sig, &new, std::ptr::null_mut()) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_signals_have_the_numbers_this_platform_gives_their_names() {
        for sig in wsd_client::Signal::ALL {
            assert_eq!(parse_signal(sig.name()).unwrap(), sig.number(), "{sig}");
        }
    }

    #[test]
    fn signal_names_numbers_and_prefixes_parse() {
        assert_eq!(parse_signal("TERM").unwrap(), libc::SIGTERM);
        assert_eq!(parse_signal("SIGKILL").unwrap(), libc::SIGKILL);
        assert_eq!(parse_signal("sigint").unwrap(), libc::SIGINT);
        assert_eq!(parse_signal("hup").unwrap(), libc::SIGHUP);
        assert_eq!(parse_signal("9").unwrap(), 9);
        for bad in ["0", "65", "-1", "", "SIG", "TERMINATE", "SIGFOO"] {
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
