//! `wsd serve --sandbox`: a real daemon child running its commands under
//! bubblewrap, driven by the real `wsd exec`/`push`/`pull` clients. Each
//! escape a command might try (a file the test planted outside the
//! workspace, the daemon's state directory and token, writing outside the
//! workspace, the host's processes and listening sockets) fails, while
//! ordinary work in the workspace, exit codes, stdin, signals and timeouts
//! behave as without the sandbox.
//!
//! Needs `bwrap` (Debian package bubblewrap; `.ci/run` installs it). Where
//! it is missing the sandboxed tests say so and pass, unless
//! `WSD_REQUIRE_SANDBOX=1` (set by `.ci/run`) makes that a failure.

use std::path::PathBuf;
use std::process::{Command, Output};

use wsd_test_support::{Daemon, STEP, run_bounded, show, text, wait_until, wsd_command};

const TOKEN: &str = "sandbox-test-token-0123456789abcdef";

fn bwrap_available() -> bool {
    let found = Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("WSD_REQUIRE_SANDBOX").is_none(),
            "WSD_REQUIRE_SANDBOX is set but bwrap is not installed (apt-get install bubblewrap)"
        );
        eprintln!("bwrap is not installed (apt-get install bubblewrap): sandbox test skipped");
    }
    found
}

/// A `wsd serve --sandbox` child over `TMP/ws` with its state in the
/// default `TMP/ws/.wsd`, a token in `TMP/token` (outside the workspace),
/// listening on a free loopback port; killed before its directory is
/// removed.
struct Sandboxed {
    daemon: Daemon,
    tmp: tempfile::TempDir,
}

impl Sandboxed {
    fn start(extra: &[&str]) -> Sandboxed {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(tmp.path().join("token"), TOKEN).unwrap();
        let daemon = Daemon::builder(&root)
            .token_file(&tmp.path().join("token"))
            .args(["--sandbox"])
            .args(extra)
            .log(&tmp.path().join("serve.log"))
            .start();
        Sandboxed { daemon, tmp }
    }

    fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.tmp.path().join("ws")).unwrap()
    }

    fn outside(&self) -> PathBuf {
        std::fs::canonicalize(self.tmp.path()).unwrap()
    }

    fn cli_with_input(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        self.daemon.cli_with_input(args, stdin)
    }

    fn cli(&self, args: &[&str]) -> Output {
        self.daemon.cli(args)
    }

    /// Runs a shell command line in the sandbox.
    fn sh(&self, line: &str) -> Output {
        self.cli(&["exec", "--", line])
    }
}

#[test]
fn a_sandboxed_command_cannot_reach_files_outside_the_workspace_or_the_daemons_state() {
    if !bwrap_available() {
        return;
    }
    let d = Sandboxed::start(&[]);
    let outside = d.outside();
    let root = d.root();
    let planted = outside.join("planted.txt");
    std::fs::write(&planted, "planted-secret").unwrap();

    // A file planted next to the workspace is not there.
    let out = d.sh(&format!("cat {}", planted.display()));
    assert_ne!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        !text(&out.stdout).contains("planted-secret"),
        "{}",
        show(&out)
    );

    // The token file, outside the workspace: not there either.
    let token = outside.join("token");
    let out = d.sh(&format!("cat {}", token.display()));
    assert_ne!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!text(&out.stdout).contains(TOKEN), "{}", show(&out));

    // The state directory sits inside the workspace (the default ROOT/.wsd)
    // and holds the index and the exec log: inside, it is an empty,
    // read-only directory.
    let state = root.join(".wsd");
    assert!(state.join("exec.sqlite3").exists(), "the daemon's exec log");
    let out = d.sh(&format!("ls -A {}", state.display()));
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(text(&out.stdout), "", "{}", show(&out));
    let out = d.sh(&format!(
        "cat {0}/exec.sqlite3 {0}/index.sqlite3",
        state.display()
    ));
    assert_ne!(out.status.code(), Some(0), "{}", show(&out));
    assert!(out.stdout.is_empty(), "{}", show(&out));
    let out = d.sh(&format!("echo x > {}/planted-by-command", state.display()));
    assert_ne!(out.status.code(), Some(0), "{}", show(&out));
    assert!(!state.join("planted-by-command").exists());

    // Writing outside the workspace: the system is read-only, and the
    // host's directories beside the workspace are not the host's.
    for target in ["/escaped", "/usr/escaped", "/etc/escaped"] {
        let out = d.sh(&format!("echo x > {target}"));
        assert_ne!(out.status.code(), Some(0), "{target}: {}", show(&out));
    }
    let escaped = outside.join("escaped");
    let _ = d.sh(&format!("echo x > {}", escaped.display()));
    assert!(
        !escaped.exists(),
        "a write outside the workspace reached the host"
    );
    let out = d.sh(&format!("cd {} && cd .. && ls -A", root.display()));
    assert!(!text(&out.stdout).contains("planted.txt"), "{}", show(&out));
    assert!(!text(&out.stdout).contains("token"), "{}", show(&out));

    // The host's /etc beyond what commands need is not there.
    let out = d.sh("cat /etc/hostname; cat /etc/shadow; hostname");
    assert_eq!(text(&out.stdout), "wsd-sandbox\n", "{}", show(&out));

    // An ordinary command still works in the workspace, and its file is
    // the workspace's.
    let out = d.sh("echo made-inside > made.txt && cat made.txt && pwd");
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(
        text(&out.stdout),
        format!("made-inside\n{}\n", root.display()),
        "the workspace is at its own path"
    );
    assert_eq!(
        std::fs::read_to_string(root.join("made.txt")).unwrap(),
        "made-inside\n"
    );
}

#[test]
fn a_sandboxed_command_sees_neither_the_hosts_processes_nor_its_network() {
    if !bwrap_available() {
        return;
    }
    let d = Sandboxed::start(&[]);
    let daemon_pid = d.daemon.pid();
    let own_pid = std::process::id();

    // Its own /proc: only the sandbox's few processes, none of the host's.
    let out = d.sh("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done");
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let procs = text(&out.stdout);
    assert!(!procs.contains("serve"), "the daemon is visible:\n{procs}");
    let test_binary = std::env::current_exe().unwrap();
    assert!(
        !procs.contains(test_binary.to_str().unwrap()),
        "the test is visible:\n{procs}"
    );
    assert!(
        procs.lines().filter(|l| !l.trim().is_empty()).count() <= 5,
        "{procs}"
    );
    for pid in [daemon_pid, own_pid] {
        let out = d.sh(&format!("test -e /proc/{pid} || kill -0 {pid}"));
        assert_ne!(out.status.code(), Some(0), "pid {pid}: {}", show(&out));
    }

    // Its own network namespace: the daemon's listening port is not among
    // its sockets, and loopback is its only interface.
    let out = d.sh("cat /proc/net/tcp /proc/net/tcp6");
    let port = format!(
        ":{:04X} ",
        d.daemon
            .addr
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap()
    );
    assert!(!text(&out.stdout).contains(&port), "{}", show(&out));
    let out = d.sh("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
    assert_eq!(text(&out.stdout), "lo\n", "{}", show(&out));

    // No capabilities, even under a root daemon: no mounts, no devices.
    let out = d.sh("grep CapEff /proc/self/status");
    assert_eq!(
        text(&out.stdout),
        "CapEff:\t0000000000000000\n",
        "{}",
        show(&out)
    );
    let out = d.sh("mount -t tmpfs none /tmp || mknod /tmp/disk b 8 0");
    assert_ne!(out.status.code(), Some(0), "{}", show(&out));

    // The limits are set on every process inside.
    let out = d.sh("cat /proc/self/limits");
    let limits = text(&out.stdout);
    let line = |name: &str| {
        limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} in {limits}"))
            .split_whitespace()
            .skip(name.split_whitespace().count())
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(line("Max address space"), "4294967296 4294967296");
    assert_eq!(line("Max open files"), "4096 4096");
}

#[test]
fn host_networking_and_limits_are_flags() {
    if !bwrap_available() {
        return;
    }
    let d = Sandboxed::start(&[
        "--sandbox-net",
        "host",
        "--sandbox-mem",
        "256MiB",
        "--sandbox-nofile",
        "64",
    ]);
    let out = d.sh("cat /proc/net/tcp /proc/net/tcp6");
    let port = format!(
        ":{:04X} ",
        d.daemon
            .addr
            .rsplit(':')
            .next()
            .unwrap()
            .parse::<u16>()
            .unwrap()
    );
    assert!(text(&out.stdout).contains(&port), "{}", show(&out));
    let out = d.sh("cat /proc/self/limits");
    let limits = text(&out.stdout);
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max address space") && l.contains("268435456")),
        "{limits}"
    );
    assert!(
        limits
            .lines()
            .any(|l| l.starts_with("Max open files") && l.contains(" 64 ")),
        "{limits}"
    );
    // Still no view of the host's processes or files.
    let out = d.sh(&format!("test -e /proc/{}", d.daemon.pid()));
    assert_ne!(out.status.code(), Some(0), "{}", show(&out));
}

#[test]
fn sandboxed_exit_codes_stdin_signals_and_timeouts_work_as_unsandboxed() {
    if !bwrap_available() {
        return;
    }
    let d = Sandboxed::start(&[]);
    let out = d.cli(&["exec", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "{}", show(&out));
    let out = d.cli(&["exec", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", show(&out));

    let out = d.cli_with_input(
        &["exec", "-i", "--", "tr", "a-z", "A-Z"],
        Some(b"piped in\n"),
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(text(&out.stdout), "PIPED IN\n");
    let out = d.cli_with_input(&["exec", "--", "cat"], Some(b"not read\n"));
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(text(&out.stdout), "", "stdin is closed without -i");

    // A timeout sends TERM to the command itself: killed, it is 143 ...
    let out = d.cli(&["exec", "--timeout", "300ms", "--", "echo slow; sleep 60"]);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", show(&out));
    assert_eq!(text(&out.stdout), "slow\n");
    // ... and a command that handles it decides its own exit code (the
    // timeout leaves room for bwrap and the shell to set the trap on a
    // loaded machine: TERM before that would be a plain 143).
    let out = d.cli(&[
        "exec",
        "--timeout",
        "2s",
        "--",
        "trap 'echo cleaned up; exit 3' TERM; touch started; sleep 60 & wait",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", show(&out));
    assert_eq!(text(&out.stdout), "cleaned up\n");

    // `wsd kill --signal INT` reaches a detached command's trap.
    let root = d.root();
    let out = d.cli(&[
        "exec",
        "--detach",
        "--id",
        "interrupted",
        "--",
        "trap 'echo caught; exit 5' INT; touch ready; while :; do sleep 0.1; done",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    wait_until("the command to set its trap", || {
        root.join("ready").exists()
    });
    let out = d.cli(&["kill", "--signal", "INT", "interrupted"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let out = d.cli(&["attach", "interrupted"]);
    assert_eq!(out.status.code(), Some(5), "{}", show(&out));
    assert_eq!(text(&out.stdout), "caught\n");
}

/// The host pid of the sandbox runner under the daemon `daemon` (the
/// process whose argv[0] is the runner's path inside the sandbox).
fn runner_pid(daemon: u32) -> Option<u32> {
    let stat_ppid = |pid: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&pid| {
            let argv0 = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if !argv0.starts_with(b"/run/wsd/sandbox-runner\0") {
                return false;
            }
            let mut p = pid;
            while let Some(parent) = stat_ppid(p).filter(|&pp| pp > 1) {
                if parent == daemon {
                    return true;
                }
                p = parent;
            }
            false
        })
}

#[test]
fn one_sandbox_runs_every_command_and_a_dead_runner_fails_its_commands_then_is_replaced() {
    if !bwrap_available() {
        return;
    }
    let d = Sandboxed::start(&[]);
    let root = d.root();
    // Commands share one sandbox (no bwrap per command) and still see
    // only it.
    let mut runners = Vec::new();
    for _ in 0..3 {
        let out = d.sh("hostname");
        assert_eq!(text(&out.stdout), "wsd-sandbox\n", "{}", show(&out));
        runners.push(runner_pid(d.daemon.pid()).expect("the daemon's sandbox runner"));
    }
    let runner = runners[0];
    assert_eq!(runners, [runner; 3], "the same runner");

    let out = d.cli(&[
        "exec",
        "--detach",
        "--id",
        "orphaned",
        "--",
        "touch started; sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    wait_until("the command to start", || root.join("started").exists());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(runner as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The command died with the sandbox: lost (255), saying why.
    let out = d.cli(&["attach", "orphaned"]);
    assert_eq!(out.status.code(), Some(255), "{}", show(&out));
    assert!(
        text(&out.stderr).contains("sandbox runner exited"),
        "{}",
        show(&out)
    );
    // The next command gets a new runner.
    let out = d.sh("echo again && hostname");
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(text(&out.stdout), "again\nwsd-sandbox\n", "{}", show(&out));
    let replaced = runner_pid(d.daemon.pid()).expect("a new runner");
    assert_ne!(replaced, runner);
}

#[test]
fn files_a_sandboxed_command_writes_sync_like_any_other() {
    if !bwrap_available() {
        return;
    }
    let d = Sandboxed::start(&[]);
    let local = d.outside().join("local");
    std::fs::create_dir_all(&local).unwrap();
    std::fs::write(local.join("input.txt"), "from the client\n").unwrap();
    let out = d.cli(&["push", local.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));

    let out = d.sh("tr a-z A-Z < input.txt > output.txt && mkdir -p sub && echo nested > sub/n");
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));

    let out = d.cli(&["pull", local.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert_eq!(
        std::fs::read_to_string(local.join("output.txt")).unwrap(),
        "FROM THE CLIENT\n"
    );
    assert_eq!(
        std::fs::read_to_string(local.join("sub/n")).unwrap(),
        "nested\n"
    );
}

#[test]
fn serve_sandbox_without_bwrap_fails_at_start_naming_it_and_its_package() {
    let tmp = tempfile::tempdir().unwrap();
    let empty_path = tmp.path().join("bin");
    std::fs::create_dir(&empty_path).unwrap();
    let mut cmd = wsd_command();
    cmd.args(["serve", "--sandbox", "--listen", "127.0.0.1:0", "--root"])
        .arg(tmp.path().join("ws"))
        .env("PATH", &empty_path);
    let out = run_bounded(&mut cmd, None, STEP);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let err = text(&out.stderr);
    assert!(err.contains("bwrap"), "{err}");
    assert!(err.contains("apt-get install bubblewrap"), "{err}");
}

#[test]
fn sandbox_settings_need_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    let out = wsd_command()
        .args(["serve", "--sandbox-net", "host", "--root"])
        .arg(tmp.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", show(&out));
    assert!(text(&out.stderr).contains("--sandbox"), "{}", show(&out));
}
