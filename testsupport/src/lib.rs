//! Test plumbing shared by every crate's tests (and the soak and
//! benchmarks): where this workspace's binaries are, a free loopback port,
//! a real `wsd serve` child that dies with its handle, commands run under
//! a deadline so a hang fails instead of wedging, and a byte-exact digest
//! of a directory tree. Nothing here knows the crates under test; it
//! drives them as programs.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// Longest wait for one step of a test: a daemon to listen, a CLI run, a
/// condition to become true.
pub const STEP: Duration = Duration::from_secs(30);

/// A binary of this workspace's target directory, e.g. `bin("wsd")`.
/// `<NAME>_BIN` in the environment (`WSD_BIN`, `GSV_BIN`) overrides it.
/// `cargo test` builds a package's binaries when the package has
/// integration tests, so run the workspace's tests (or `cargo build`)
/// before a test that needs another package's binary.
pub fn bin(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_uppercase().replace('-', "_"));
    if let Some(p) = std::env::var_os(&var) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/<name>; a bench or
    // example sits one level deeper in the same way.
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: run `cargo build --bin {name}` (or set {var})",
        path.display()
    );
    path
}

/// The `wsd` binary (see [`bin`]).
pub fn wsd_bin() -> PathBuf {
    bin("wsd")
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local address")
        .port()
}

/// `count` distinct loopback ports that were free a moment ago (held
/// together while picked, so no two are the same; for a server that binds
/// several, such as SeaweedFS).
pub fn free_ports(count: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("local address").port())
        .collect()
}

/// `127.0.0.1:<free port>`.
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A `wsd` command with the client's environment variables removed, so a
/// developer's shell cannot change what a test runs, and with pushes
/// starting no background agent (`WSD_AGENT=off`): tests that want one
/// remove it and stop the agent themselves.
pub fn wsd_command() -> Command {
    let mut c = Command::new(wsd_bin());
    c.env_remove("WSD_REMOTE")
        .env_remove("WSD_TOKEN_FILE")
        .env_remove("WSD_TOKEN")
        .env("WSD_AGENT", "off");
    c
}

/// How to start a [`Daemon`]: `wsd serve --listen ADDR --root ROOT` plus
/// what the test adds.
#[derive(Debug, Clone)]
pub struct DaemonBuilder {
    root: PathBuf,
    state: Option<PathBuf>,
    token_file: Option<PathBuf>,
    program: Vec<OsString>,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    log: Option<PathBuf>,
    listen: Option<String>,
}

impl DaemonBuilder {
    /// `--listen ADDR` (`host:port`) instead of a free loopback port: an
    /// address of another network namespace, with [`DaemonBuilder::program`]
    /// running the daemon there (`ip netns exec NS wsd`). The test process
    /// must reach it, since [`DaemonBuilder::start`] waits for it to accept.
    pub fn listen(mut self, addr: &str) -> Self {
        self.listen = Some(addr.to_owned());
        self
    }

    /// `--state DIR`; without it the daemon uses its default
    /// (`ROOT/.wsd`).
    pub fn state(mut self, dir: &Path) -> Self {
        self.state = Some(dir.to_owned());
        self
    }

    pub fn token_file(mut self, file: &Path) -> Self {
        self.token_file = Some(file.to_owned());
        self
    }

    /// Another program (and its leading arguments) in place of the `wsd`
    /// binary: a wrapper that execs it, or a binary embedding the daemon.
    pub fn program<I, S>(mut self, argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.program = argv.into_iter().map(|s| s.as_ref().to_owned()).collect();
        self
    }

    /// Extra `wsd serve` arguments.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.args
            .extend(args.into_iter().map(|s| s.as_ref().to_owned()));
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Appends the daemon's stderr to `file` (default: discarded); an
    /// early exit then quotes it.
    pub fn log(mut self, file: &Path) -> Self {
        self.log = Some(file.to_owned());
        self
    }

    /// Starts it on a free loopback port and waits until it accepts
    /// connections (panics, quoting its log, if it exits first).
    pub fn start(self) -> Daemon {
        let state = self.state.clone().unwrap_or_else(|| self.root.join(".wsd"));
        let mut d = Daemon {
            root: self.root.clone(),
            state,
            addr: self.listen.clone().unwrap_or_else(free_addr),
            token_file: self.token_file.clone(),
            spec: self,
            child: None,
        };
        d.spawn();
        d
    }
}

/// A `wsd serve` child process; killed (SIGKILL) and reaped when dropped.
#[derive(Debug)]
pub struct Daemon {
    pub root: PathBuf,
    /// Its state directory (`--state`, or the default inside the root).
    pub state: PathBuf,
    pub addr: String,
    pub token_file: Option<PathBuf>,
    spec: DaemonBuilder,
    child: Option<Child>,
}

impl Daemon {
    /// A daemon serving `root` (see [`DaemonBuilder`]).
    pub fn builder(root: &Path) -> DaemonBuilder {
        DaemonBuilder {
            root: root.to_owned(),
            state: None,
            token_file: None,
            program: Vec::new(),
            args: Vec::new(),
            env: Vec::new(),
            log: None,
            listen: None,
        }
    }

    /// `wsd serve --root root --state state [--token-file F]`, started.
    pub fn start(root: &Path, state: &Path, token_file: Option<&Path>) -> Daemon {
        let mut b = Daemon::builder(root).state(state);
        if let Some(t) = token_file {
            b = b.token_file(t);
        }
        b.start()
    }

    fn spawn(&mut self) {
        let spec = &self.spec;
        let mut cmd = match spec.program.split_first() {
            Some((program, lead)) => {
                let mut c = Command::new(program);
                c.args(lead);
                c
            }
            None => Command::new(wsd_bin()),
        };
        cmd.args(["serve", "--listen", &self.addr])
            .arg("--root")
            .arg(&self.root);
        if let Some(state) = &spec.state {
            cmd.arg("--state").arg(state);
        }
        if let Some(t) = &self.token_file {
            cmd.arg("--token-file").arg(t);
        }
        cmd.args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env_remove("WSD_TOKEN")
            .env_remove("WSD_TOKEN_FILE")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(log) = &spec.log {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("open the daemon log");
            cmd.stderr(f);
        }
        let mut child = cmd.spawn().expect("spawn wsd serve");
        let deadline = Instant::now() + STEP;
        while TcpStream::connect(&self.addr).is_err() {
            if let Some(status) = child.try_wait().expect("wait for wsd serve") {
                let log = spec
                    .log
                    .as_ref()
                    .and_then(|l| std::fs::read_to_string(l).ok())
                    .unwrap_or_default();
                panic!("wsd serve exited early ({status}): {log}");
            }
            assert!(
                Instant::now() < deadline,
                "wsd serve did not listen on {} within {STEP:?}",
                self.addr
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(child);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// True while the child process has not exited.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().map(|s| s.is_none()).unwrap_or(false),
            None => false,
        }
    }

    /// SIGKILL, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: a graceful stop.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        let status = Command::new("kill")
            .arg(c.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success());
        c.wait().expect("wait for wsd serve")
    }

    /// Starts the daemon again on the same root, state and address.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// `wsd SUB --remote ADDR [--token-file F] ARGS...` (the subcommand
    /// first, then this daemon's flags), not yet run.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = wsd_command();
        if let Some((sub, rest)) = args.split_first() {
            cmd.arg(sub);
            cmd.args(["--remote", &self.addr]);
            if let Some(t) = &self.token_file {
                cmd.arg("--token-file").arg(t);
            }
            cmd.args(rest);
        }
        cmd
    }

    /// Runs a `wsd` client subcommand against this daemon, under [`STEP`].
    pub fn cli(&self, args: &[&str]) -> Output {
        run_bounded(&mut self.command(args), None, STEP)
    }

    /// Like [`Daemon::cli`] with `stdin` written to the command.
    pub fn cli_with_input(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        run_bounded(&mut self.command(args), stdin, STEP)
    }

    /// `wsd push|pull LOCAL --json`, asserting success; returns the summary.
    pub fn transfer(&self, verb: &str, local: &Path) -> serde_json::Value {
        let out = self.cli(&[verb, local.to_str().unwrap(), "--json", "--create"]);
        assert!(out.status.success(), "wsd {verb} failed: {}", show(&out));
        let stdout = String::from_utf8(out.stdout).unwrap();
        serde_json::from_str(stdout.lines().last().expect("a JSON summary")).unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Runs `cmd` with `stdin` written to it and then closed (`None`: no
/// input), capturing its output. If it is still running after `limit` it
/// is killed and the test fails naming it, so a hang cannot wedge a test.
pub fn run_bounded(cmd: &mut Command, stdin: Option<&[u8]>, limit: Duration) -> Output {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    let mut input = child.stdin.take().expect("piped stdin");
    let data = stdin.map(<[u8]>::to_vec);
    let writer = std::thread::spawn(move || {
        if let Some(d) = data {
            // The command may exit without reading all of it.
            let _ = input.write_all(&d);
        }
    });
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let expired = done_rx.recv_timeout(limit).is_err();
        if expired {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
        }
        expired
    });
    let out = child.wait_with_output().expect("collect output");
    let _ = done_tx.send(());
    let expired = watchdog.join().expect("watchdog");
    writer.join().expect("stdin writer");
    assert!(
        !expired,
        "{cmd:?} was still running after {limit:?} and was killed; {}",
        show(&out)
    );
    out
}

/// Polls `cond` every 20 ms until it holds; fails the test naming `what`
/// after [`STEP`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + STEP;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Bytes as text, invalid UTF-8 replaced.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A command's exit code, stdout and stderr, for an assertion message.
pub fn show(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

/// One line per path under `root` (relative; `.wsd` excluded): its kind,
/// mode and size and SHA-256 for files, its target for symlinks. Two trees
/// are equal as synced content when their digests are equal (mtimes are
/// not compared).
pub fn tree_digest(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let rel = path
            .strip_prefix(root)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        if rel == ".wsd" {
            continue;
        }
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let mode = meta.permissions().mode() & 0o7777;
        if meta.file_type().is_symlink() {
            out.insert(
                rel,
                format!("l {}", std::fs::read_link(&path).unwrap().display()),
            );
        } else if meta.is_dir() {
            out.insert(rel, format!("d {mode:o}"));
            walk(root, &path, out);
        } else {
            let bytes = std::fs::read(&path).unwrap();
            out.insert(
                rel,
                format!(
                    "f {mode:o} {} {}",
                    bytes.len(),
                    hex::encode(Sha256::digest(&bytes))
                ),
            );
        }
    }
}
