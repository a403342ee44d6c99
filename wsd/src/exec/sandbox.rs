//! The exec sandbox (`wsd serve --sandbox`): every command runs under
//! bubblewrap (`bwrap`) in its own mount, pid, IPC and UTS namespace (and by
//! default its own network namespace), with the workspace bound read-write
//! at its own path, a read-only view of the system (`/usr`, `/bin`, `/lib*`,
//! a few files of `/etc`), a fresh `/proc`, `/dev` and `/tmp`, and nothing
//! else of the host. The daemon's state directory, token file and sockets
//! are masked even where they sit inside a visible tree. Resource limits are
//! rlimits set on `bwrap` before it runs, so every process inside inherits
//! them.
//!
//! The namespaces are bwrap's; this module only builds its argument list.
//! One bwrap is started per sandbox, not per command: a runner inside
//! forks the commands ([`super::sandbox_runner`]).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use super::sandbox_limits::{
    DEFAULT_SANDBOX_MEMORY, DEFAULT_SANDBOX_OPEN_FILES, SandboxLimits,
};
pub use super::sandbox_runner::{BWRAP_PACKAGE, SandboxError};
use super::sandbox_runner::{Launch, RunnerLink, SandboxedChild, SpawnRequest, current_runner_exe};

/// The hostname commands see (their own UTS namespace).
pub const SANDBOX_HOSTNAME: &str = "wsd-sandbox";

/// `HOME` and `TMPDIR` inside the sandbox: the fresh, private `/tmp` (the
/// daemon's home is not visible there).
pub const SANDBOX_HOME: &str = "/tmp";

/// Files and directories of `/etc` a command may need (dynamic linker,
/// users and groups for `id`, name resolution, TLS roots, time zone,
/// Debian's alternatives symlinks). Missing ones are skipped. The host's
/// `/etc/hostname`, `/etc/shadow`, `/etc/ssh`, ... are not among them.
const ETC_ENTRIES: [&str; 20] = [
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "passwd",
    "group",
    "nsswitch.conf",
    "hosts",
    "host.conf",
    "resolv.conf",
    "gai.conf",
    "services",
    "protocols",
    "localtime",
    "timezone",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "os-release",
    "mime.types",
];

/// Top-level system directories bound read-only (symlinks, as on merged-usr
/// systems, are recreated as symlinks). Missing ones are skipped.
const SYSTEM_DIRS: [&str; 7] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// Whether sandboxed commands get a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SandboxNetwork {
    /// Their own network namespace: only a loopback device, no route out,
    /// and no view of the host's listening sockets (abstract unix sockets
    /// included).
    #[default]
    None,
    /// The host's network, as an unsandboxed command has.
    Host,
}

/// What `wsd serve --sandbox` asks for.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct SandboxConfig {
    pub network: SandboxNetwork,
    pub limits: SandboxLimits,
    /// Paths that must not be reachable inside even when they lie in a
    /// visible tree (the daemon adds its state directory and sockets, the
    /// CLI the token file). A directory is covered by an empty read-only
    /// tmpfs, anything else by `/dev/null`.
    pub hidden: Vec<PathBuf>,
    /// Extra host directories bound read-only at their own path (toolchains
    /// outside `/usr`, for example).
    pub read_only: Vec<PathBuf>,
    /// The binary run inside as the runner (`wsd sandbox-runner`); `None`:
    /// this process's own executable, which must be `wsd`.
    pub runner_exe: Option<PathBuf>,
}

impl SandboxConfig {
    pub fn new() -> SandboxConfig {
        SandboxConfig::default()
    }
}

/// A running sandbox: `bwrap` found, its layout built, and one bwrap with
/// the runner inside started (see [`super::sandbox_runner`]); every command
/// is forked by that runner. Cheap to clone; the last clone dropped takes
/// the sandbox down.
#[derive(Debug, Clone)]
pub struct Sandbox {
    link: Arc<RunnerLink>,
}

impl Sandbox {
    /// Finds `bwrap`, builds the mount layout around the canonical `root`,
    /// starts the sandbox with this binary as its runner (`wsd
    /// sandbox-runner`) and waits until it is ready, so a sandbox that
    /// cannot work fails here rather than on every exec. Blocks for a few
    /// tens of milliseconds.
    pub fn new(root: &Path, config: &SandboxConfig) -> Result<Sandbox, SandboxError> {
        let bwrap = find_on_path("bwrap").ok_or(SandboxError::NotInstalled)?;
        let root = canonical(root)?;
        let launch = Launch {
            bwrap,
            layout: layout(&root, config)?,
            runner_exe: match &config.runner_exe {
                Some(exe) => canonical(exe)?,
                None => current_runner_exe()?,
            },
            limits: config.limits,
        };
        Ok(Sandbox {
            link: Arc::new(RunnerLink::start(launch)?),
        })
    }

    /// Starts `req` inside (stdio: three descriptors, or a terminal's
    /// slave) and returns once it runs.
    pub(crate) async fn spawn(
        &self,
        req: &SpawnRequest,
        stdio: &[std::os::fd::BorrowedFd<'_>],
    ) -> std::io::Result<SandboxedChild> {
        self.link.spawn(req, stdio).await
    }
}

/// The bwrap arguments of the mount and namespace layout (see the module
/// doc). Order matters: later mounts cover earlier ones.
fn layout(root: &Path, config: &SandboxConfig) -> Result<Vec<OsString>, SandboxError> {
    let mut args = Args::default();
    args.flags(&[
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        // bwrap run by root keeps root's capabilities (mount, mknod, ...)
        // unless told otherwise; nothing inside needs one.
        "--cap-drop",
        "ALL",
        "--hostname",
        SANDBOX_HOSTNAME,
    ]);
    if config.network == SandboxNetwork::None {
        args.flags(&["--unshare-net"]);
    }
    // Trees visible inside, as canonical host paths: the hidden paths are
    // masked where they fall under one of them.
    let mut visible: Vec<PathBuf> = Vec::new();
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                let target = std::fs::read_link(path).map_err(|source| SandboxError::Path {
                    path: path.to_path_buf(),
                    source,
                })?;
                args.op3("--symlink", target.as_os_str(), path.as_os_str());
            }
            Ok(_) => {
                args.op3("--ro-bind", path.as_os_str(), path.as_os_str());
                visible.push(canonical(path)?);
            }
            Err(_) => {}
        }
    }
    for entry in ETC_ENTRIES {
        let path = Path::new("/etc").join(entry);
        if let Ok(real) = std::fs::canonicalize(&path) {
            args.op3("--ro-bind", real.as_os_str(), path.as_os_str());
            visible.push(real);
        }
    }
    for dir in &config.read_only {
        let real = canonical(dir)?;
        args.op3("--ro-bind", real.as_os_str(), real.as_os_str());
        visible.push(real);
    }
    args.flags(&["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]);
    args.op3("--bind", root.as_os_str(), root.as_os_str());
    visible.push(root.to_path_buf());
    for hidden in &config.hidden {
        let Ok(real) = std::fs::canonicalize(hidden) else {
            // Not there yet: nothing to reach.
            continue;
        };
        if !visible.iter().any(|v| real.starts_with(v)) {
            continue;
        }
        if real.is_dir() {
            args.op2("--tmpfs", real.as_os_str());
            args.op2("--remount-ro", real.as_os_str());
        } else {
            args.op3("--ro-bind", "/dev/null".as_ref(), real.as_os_str());
        }
    }
    // bwrap's own root is a writable tmpfs: nothing outside the workspace
    // and /tmp may be written.
    args.flags(&["--remount-ro", "/"]);
    Ok(args.0)
}

fn canonical(path: &Path) -> Result<PathBuf, SandboxError> {
    std::fs::canonicalize(path).map_err(|source| SandboxError::Path {
        path: path.to_path_buf(),
        source,
    })
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flags(&mut self, flags: &[&str]) {
        self.0.extend(flags.iter().map(OsString::from));
    }

    fn op2(&mut self, op: &str, a: &std::ffi::OsStr) {
        self.0.push(op.into());
        self.0.push(a.into());
    }

    fn op3(&mut self, op: &str, a: &std::ffi::OsStr, b: &std::ffi::OsStr) {
        self.0.push(op.into());
        self.0.push(a.into());
        self.0.push(b.into());
    }
}

/// The first executable `name` in the directories of `PATH`.
fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The daemon environment as sandboxed commands get it: `HOME` and `TMPDIR`
/// point at the private `/tmp` (the daemon's own are not visible there).
pub(crate) fn sandboxed_env(daemon_env: &[(OsString, OsString)]) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = daemon_env
        .iter()
        .filter(|(k, _)| k != "HOME" && k != "TMPDIR")
        .cloned()
        .collect();
    env.push(("HOME".into(), SANDBOX_HOME.into()));
    env.push(("TMPDIR".into(), SANDBOX_HOME.into()));
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arg_pairs(args: &[OsString]) -> Vec<String> {
        args.iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn hidden_paths_are_masked_only_inside_visible_trees() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap().join("ws");
        std::fs::create_dir_all(root.join(".wsd")).unwrap();
        std::fs::write(root.join("token"), b"t").unwrap();
        let outside = tmp.path().join("state-elsewhere");
        std::fs::create_dir(&outside).unwrap();
        let config = SandboxConfig {
            hidden: vec![
                root.join(".wsd"),
                root.join("token"),
                outside.clone(),
                root.join("not-there"),
            ],
            ..SandboxConfig::default()
        };
        let args = arg_pairs(&layout(&root, &config).unwrap());
        let joined = args.join(" ");
        let state = root.join(".wsd").display().to_string();
        let token = root.join("token").display().to_string();
        assert!(
            joined.contains(&format!("--tmpfs {state} --remount-ro {state}")),
            "{joined}"
        );
        assert!(
            joined.contains(&format!("--ro-bind /dev/null {token}")),
            "{joined}"
        );
        assert!(!joined.contains("state-elsewhere"), "{joined}");
        assert!(!joined.contains("not-there"), "{joined}");
        // The mask comes after the workspace bind it covers, and the root
        // is made read-only last.
        let bind = joined
            .find(&format!("--bind {0} {0}", root.display()))
            .unwrap();
        assert!(bind < joined.find(&format!("--tmpfs {state}")).unwrap());
        assert!(joined.ends_with("--remount-ro /"), "{joined}");
        assert!(args.contains(&"--unshare-net".to_owned()));
    }

    #[test]
    fn host_network_keeps_the_network_namespace() {
        let tmp = tempfile::tempdir().unwrap();
        let config = SandboxConfig {
            network: SandboxNetwork::Host,
            ..SandboxConfig::default()
        };
        let args = arg_pairs(&layout(tmp.path(), &config).unwrap());
        assert!(!args.contains(&"--unshare-net".to_owned()));
        assert!(args.contains(&"--unshare-pid".to_owned()));
    }

    #[test]
    fn sandboxed_commands_get_the_private_tmp_as_home() {
        let env = sandboxed_env(&[
            ("HOME".into(), "/root".into()),
            ("PATH".into(), "/usr/bin".into()),
        ]);
        assert_eq!(
            env,
            [
                ("PATH".into(), "/usr/bin".into()),
                ("HOME".into(), "/tmp".into()),
                ("TMPDIR".into(), "/tmp".into())
            ]
        );
    }
}
