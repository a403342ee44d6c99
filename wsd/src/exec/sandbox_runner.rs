//! The sandbox runner: `wsd serve --sandbox` starts ONE bwrap (the layout
//! of [`super::sandbox`]) running `wsd sandbox-runner` inside it, and every
//! command is forked and executed by that runner, in the namespaces the
//! bwrap made once. A new bwrap per command costs 15-25 ms of namespaces and
//! bind mounts on this kind of machine (`bench/RESULTS.md`, issue 32); a
//! fork in the runner costs what a host spawn costs.
//!
//! Wire (unix `SOCK_SEQPACKET`, one message per datagram, descriptors with
//! `SCM_RIGHTS`):
//!
//! * control socket (daemon ↔ runner, inherited by bwrap as a numbered fd):
//!   the runner sends [`HELLO`] once ready; the daemon sends one request per
//!   command, carrying a new per-command reply socket and the command's
//!   stdio (three pipe ends, or a terminal's slave). Closing it stops the
//!   runner, and with it the sandbox.
//! * reply socket (one per command): the runner answers [`STARTED`] (the
//!   pid inside, and a pidfd: its `fdinfo` names the pid on the host, which
//!   is the command's process group there) or [`FAILED`] (errno, message),
//!   then [`EXITED`] (how it ended). It keeps the exited command a zombie,
//!   so its pid (the group's id the daemon signals) cannot be reused, until
//!   the daemon closes its end; only then does it reap it.
//!
//! A runner that dies takes the sandbox's pid namespace down, and every
//! command in it; each reply socket then reads EOF, so no wait hangs, and
//! the next command starts a new runner.

use std::ffi::OsString;
use std::io::{BufRead, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketFlags, SocketType,
};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::sandbox_limits::{SandboxLimits, apply_limits};

/// The Debian package that ships `bwrap`.
pub const BWRAP_PACKAGE: &str = "bubblewrap";

/// Why the sandbox cannot be used. Reported at `wsd serve` start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    #[error(
        "--sandbox needs bwrap, which is not on PATH: install bubblewrap (Debian/Ubuntu: apt-get install {BWRAP_PACKAGE})"
    )]
    NotInstalled,
    #[error("--sandbox: {path} cannot be made visible inside the sandbox: {source}")]
    Path {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--sandbox: running {bwrap} failed: {source}")]
    Spawn {
        bwrap: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "--sandbox: bwrap cannot create the sandbox here ({status}): {stderr} (it needs root, or unprivileged user namespaces)"
    )]
    Unusable { status: String, stderr: String },
}

/// Where the `wsd` binary is bound (read-only) inside the sandbox.
pub(crate) const RUNNER_PATH: &str = "/run/wsd/sandbox-runner";
/// The hidden subcommand the runner is.
pub const RUNNER_SUBCOMMAND: &str = "sandbox-runner";

/// The runner is ready for requests.
const HELLO: u8 = b'R';
/// Request: `argv` with three stdio descriptors.
const REQ_PIPES: u8 = b'p';
/// Request: `argv` on a terminal (one descriptor, the slave), as the leader
/// of a session of its own with the terminal as its controlling one.
const REQ_TERMINAL: u8 = b't';
/// Reply: started; `u32` pid inside, the pidfd attached.
const STARTED: u8 = b'S';
/// Reply: could not start; `i32` errno, then a UTF-8 message.
const FAILED: u8 = b'F';
/// Reply: ended; `i32` exit code, `i32` signal (one of them 0).
const EXITED: u8 = b'E';

/// Largest request: a 64 KiB command and 64 KiB of environment, with room
/// to spare (a seqpacket datagram must fit the socket's send buffer, about
/// 208 KiB by default).
const MAX_REQUEST_BYTES: usize = 192 << 10;
/// How long the daemon waits for the runner to say it is ready, to take a
/// request, or to answer one, before it gives up on it.
const RUNNER_TIMEOUT: Duration = Duration::from_secs(30);
/// Stack of the runner's per-command wait threads (they only wait and
/// send a few bytes).
const WAIT_THREAD_STACK: usize = 64 << 10;

/// One command for the runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SpawnRequest {
    pub terminal: bool,
    pub cwd: PathBuf,
    pub argv: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
}

/// Why a request could not be decoded (the runner answers it `FAILED`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed sandbox runner request: {0}")]
pub(crate) struct MalformedRequest(&'static str);

impl SpawnRequest {
    /// `kind, argc: u32, envc: u32`, then NUL-terminated strings: cwd, each
    /// argument, each `NAME=value`. None of them may hold a NUL (the exec
    /// API refuses those before).
    pub(crate) fn encode(&self) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(256);
        out.push(if self.terminal {
            REQ_TERMINAL
        } else {
            REQ_PIPES
        });
        let count = |n: usize| u32::try_from(n).map_err(std::io::Error::other);
        out.extend(count(self.argv.len())?.to_le_bytes());
        out.extend(count(self.env.len())?.to_le_bytes());
        let mut put = |s: &[u8]| -> std::io::Result<()> {
            if s.contains(&0) {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "an argument, the cwd or the environment contains NUL",
                ));
            }
            out.extend_from_slice(s);
            out.push(0);
            Ok(())
        };
        put(self.cwd.as_os_str().as_bytes())?;
        for a in &self.argv {
            put(a.as_bytes())?;
        }
        for (k, v) in &self.env {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            put(&kv)?;
        }
        if out.len() > MAX_REQUEST_BYTES {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "the command and its environment take {} bytes, more than the sandbox runner takes ({MAX_REQUEST_BYTES})",
                    out.len()
                ),
            ));
        }
        Ok(out)
    }

    pub(crate) fn decode(msg: &[u8]) -> Result<SpawnRequest, MalformedRequest> {
        let (&kind, rest) = msg.split_first().ok_or(MalformedRequest("empty"))?;
        let terminal = match kind {
            REQ_PIPES => false,
            REQ_TERMINAL => true,
            _ => return Err(MalformedRequest("unknown kind")),
        };
        let u32_at = |at: usize| -> Result<usize, MalformedRequest> {
            let b = rest
                .get(at..at + 4)
                .ok_or(MalformedRequest("short header"))?;
            Ok(u32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
        };
        let (argc, envc) = (u32_at(0)?, u32_at(4)?);
        let body = &rest[8..];
        let mut fields = body.split(|&b| b == 0);
        let mut next = || -> Result<OsString, MalformedRequest> {
            fields
                .next()
                .map(|f| OsString::from_vec(f.to_vec()))
                .ok_or(MalformedRequest("too few fields"))
        };
        if body.last() != Some(&0) {
            return Err(MalformedRequest("not NUL-terminated"));
        }
        let cwd = PathBuf::from(next()?);
        let argv = (0..argc).map(|_| next()).collect::<Result<Vec<_>, _>>()?;
        let env = (0..envc)
            .map(|_| {
                let kv = next()?.into_vec();
                let eq = kv
                    .iter()
                    .position(|&b| b == b'=')
                    .ok_or(MalformedRequest("an environment entry without ="))?;
                Ok((
                    OsString::from_vec(kv[..eq].to_vec()),
                    OsString::from_vec(kv[eq + 1..].to_vec()),
                ))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if argv.is_empty() {
            return Err(MalformedRequest("no program"));
        }
        // The split leaves one empty field after the last NUL.
        if fields.next() != Some(&[][..]) || fields.next().is_some() {
            return Err(MalformedRequest("trailing fields"));
        }
        Ok(SpawnRequest {
            terminal,
            cwd,
            argv,
            env,
        })
    }
}

/// How a command ended, as sent in [`EXITED`].
fn encode_exit(status: &rustix::process::WaitIdStatus) -> [u8; 9] {
    let code = status.exit_status().unwrap_or(0);
    let signal = status.terminating_signal().unwrap_or(0);
    let mut out = [0u8; 9];
    out[0] = EXITED;
    out[1..5].copy_from_slice(&code.to_le_bytes());
    out[5..9].copy_from_slice(&signal.to_le_bytes());
    out
}

fn decode_exit(msg: &[u8]) -> Option<ExitStatus> {
    let code = i32::from_le_bytes(msg.get(1..5)?.try_into().ok()?);
    let signal = i32::from_le_bytes(msg.get(5..9)?.try_into().ok()?);
    // The wait(2) status word: a signal in the low 7 bits, else the code
    // in the second byte.
    Some(ExitStatus::from_raw(if signal != 0 {
        signal & 0x7f
    } else {
        (code & 0xff) << 8
    }))
}

/// Sends one datagram with `fds` attached. `MSG_NOSIGNAL`: a peer gone is
/// `EPIPE`, not a signal.
fn send(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(5))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(std::io::Error::other(
            "too many descriptors for one message",
        ));
    }
    let sent = rustix::net::sendmsg(
        socket,
        &[IoSlice::new(bytes)],
        &mut control,
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
    )?;
    if sent != bytes.len() {
        return Err(std::io::Error::other("a short send on a seqpacket socket"));
    }
    Ok(())
}

/// Receives one datagram into `buf` with up to `MAX_FDS` descriptors
/// (close-on-exec). `None`: the peer closed its end.
fn recv<const MAX_FDS: usize>(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    flags: RecvFlags,
) -> std::io::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(5))];
    let mut control =
        RecvAncillaryBuffer::new(&mut space[..rustix::cmsg_space!(ScmRights(MAX_FDS))]);
    let msg = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(buf)],
        &mut control,
        flags | RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = m {
            fds.extend(received);
        }
    }
    if msg
        .flags
        .intersects(ReturnFlags::TRUNC | ReturnFlags::CTRUNC)
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "a truncated message from the sandbox runner's peer",
        ));
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    Ok(Some((msg.bytes, fds)))
}

// ---------------------------------------------------------------------------
// Inside the sandbox: `wsd sandbox-runner --control-fd N`.

/// Why the runner stopped other than by its daemon closing the socket.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("sandbox runner: control descriptor {fd}: {source}")]
    Control { fd: RawFd, source: std::io::Error },
}

/// The runner's main loop: reads requests on the inherited `control_fd`
/// until the daemon closes it. Only meant to run inside the sandbox the
/// daemon made (it starts what it is asked to, with this process's rights).
pub fn run_runner(control_fd: RawFd) -> Result<(), RunnerError> {
    let control_err = |source| RunnerError::Control {
        fd: control_fd,
        source,
    };
    if control_fd < 3 {
        return Err(control_err(std::io::Error::from_raw_os_error(
            rustix::io::Errno::BADF.raw_os_error(),
        )));
    }
    // SAFETY: the daemon passes this descriptor number as the control socket
    // it left open for us; nothing else in this process owns it.
    #[allow(unsafe_code)]
    let control = unsafe { OwnedFd::from_raw_fd(control_fd) };
    // Inherited without close-on-exec (bwrap had to pass it); commands must
    // not get it.
    rustix::io::fcntl_setfd(&control, rustix::io::FdFlags::CLOEXEC)
        .map_err(|e| control_err(e.into()))?;
    reset_signal_dispositions();
    send(control.as_fd(), &[HELLO], &[]).map_err(control_err)?;
    let mut buf = vec![0u8; MAX_REQUEST_BYTES];
    loop {
        let received = match recv::<4>(control.as_fd(), &mut buf, RecvFlags::empty()) {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                // A truncated request: its descriptors (if any) were closed
                // by the kernel; nothing to answer on.
                eprintln!("wsd sandbox-runner: receiving a request: {e}");
                continue;
            }
        };
        let (len, mut fds) = received;
        if fds.is_empty() {
            eprintln!("wsd sandbox-runner: a request without its reply socket");
            continue;
        }
        let reply = fds.remove(0);
        match SpawnRequest::decode(&buf[..len]) {
            Ok(req) => start(req, reply, fds),
            Err(e) => answer_failed(&reply, &std::io::Error::other(e.to_string())),
        }
    }
}

/// Gives every signal its default action (the daemon may have been started
/// with some ignored, and an ignore survives exec), except SIGPIPE: the
/// standard library resets that one in each child and ignores it here.
fn reset_signal_dispositions() {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP | Signal::SIGPIPE) {
            continue;
        }
        // SAFETY: installing the default action runs no code of ours.
        #[allow(unsafe_code)]
        let _ = unsafe { sigaction(sig, &default) };
    }
}

fn answer_failed(reply: &OwnedFd, e: &std::io::Error) {
    let mut msg = vec![FAILED];
    msg.extend(e.raw_os_error().unwrap_or(0).to_le_bytes());
    msg.extend(e.to_string().as_bytes());
    let _ = send(reply.as_fd(), &msg, &[]);
}

/// Starts one command and leaves a thread to report its end.
fn start(req: SpawnRequest, reply: OwnedFd, mut stdio: Vec<OwnedFd>) {
    let wanted = if req.terminal { 1 } else { 3 };
    if stdio.len() != wanted {
        answer_failed(
            &reply,
            &std::io::Error::other(format!(
                "expected {wanted} stdio descriptors, got {}",
                stdio.len()
            )),
        );
        return;
    }
    let mut cmd = std::process::Command::new(&req.argv[0]);
    cmd.args(&req.argv[1..])
        .env_clear()
        .envs(req.env)
        .current_dir(&req.cwd);
    let spawned = if req.terminal {
        let pts = stdio.remove(0);
        let dup = |fd: &OwnedFd| fd.try_clone().map(Stdio::from);
        match (dup(&pts), dup(&pts)) {
            (Ok(a), Ok(b)) => {
                cmd.stdin(a).stdout(b).stderr(Stdio::from(pts));
                // SAFETY: between fork and exec only setsid(2) and
                // ioctl(TIOCSCTTY), both async-signal-safe; nothing is
                // allocated.
                #[allow(unsafe_code)]
                unsafe {
                    cmd.pre_exec(|| {
                        rustix::process::setsid()?;
                        rustix::process::ioctl_tiocsctty(BorrowedFd::borrow_raw(0))?;
                        Ok(())
                    });
                }
                cmd.spawn()
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        }
    } else {
        let mut stdio = stdio.into_iter().map(Stdio::from);
        cmd.stdin(stdio.next().expect("three"))
            .stdout(stdio.next().expect("three"))
            .stderr(stdio.next().expect("three"))
            .process_group(0);
        cmd.spawn()
    };
    // The command's copies of its stdio are in the command now; ours must
    // go, or the daemon never sees EOF.
    drop(cmd);
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            answer_failed(&reply, &e);
            return;
        }
    };
    let pid = child.id();
    let started = rustix::process::pidfd_open(
        rustix::process::Pid::from_child(&child),
        rustix::process::PidfdFlags::empty(),
    );
    match started {
        Ok(pidfd) => {
            let mut msg = vec![STARTED];
            msg.extend(pid.to_le_bytes());
            let _ = send(reply.as_fd(), &msg, &[pidfd.as_fd()]);
        }
        Err(e) => answer_failed(&reply, &e.into()),
    }
    // Small stacks: the runner lives under the sandbox's address-space
    // limit, with a thread per running command.
    let spawned = std::thread::Builder::new()
        .name("wait".into())
        .stack_size(WAIT_THREAD_STACK)
        .spawn(move || wait_and_report(child, reply));
    if let Err(e) = spawned {
        // Nobody could report its end: stop it rather than leave the daemon
        // waiting. (The closure and the child went down with the error, and
        // with them the reply socket: the daemon reads EOF, a lost exec.)
        eprintln!("wsd sandbox-runner: no thread to wait for pid {pid}: {e}");
        let _ = rustix::process::kill_process(
            rustix::process::Pid::from_raw(pid as i32).expect("a child's pid is positive"),
            rustix::process::Signal::KILL,
        );
    }
}

/// Waits for the command's end without reaping it, reports it, then reaps
/// it once the daemon closes the reply socket (see the module doc).
fn wait_and_report(mut child: std::process::Child, reply: OwnedFd) {
    let pid = rustix::process::Pid::from_child(&child);
    let options = rustix::process::WaitIdOptions::EXITED | rustix::process::WaitIdOptions::NOWAIT;
    let status = loop {
        match rustix::process::waitid(rustix::process::WaitId::Pid(pid), options) {
            Ok(Some(status)) => break Some(status),
            Ok(None) => continue,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                eprintln!("wsd sandbox-runner: waiting for pid {}: {e}", child.id());
                break None;
            }
        }
    };
    if let Some(status) = status {
        // The daemon's end sits in the non-blocking mode it uses; a full
        // buffer is not possible here (one small message per command).
        let _ = send(reply.as_fd(), &encode_exit(&status), &[]);
        let mut byte = [0u8; 1];
        // Blocks until the daemon closes its end (it sends nothing more).
        while let Ok(Some(_)) = recv::<0>(reply.as_fd(), &mut byte, RecvFlags::empty()) {}
    }
    let _ = child.wait();
}

// ---------------------------------------------------------------------------
// The daemon's side.

/// How to start the sandbox: bwrap, its layout, the runner binary, limits.
#[derive(Debug)]
pub(crate) struct Launch {
    pub bwrap: PathBuf,
    /// The layout, ending with `--remount-ro /`; the runner is bound before.
    pub layout: Vec<OsString>,
    pub runner_exe: PathBuf,
    pub limits: SandboxLimits,
}

/// What the keeper thread (the one that spawned bwrap, and so the parent
/// its `--die-with-parent` watches) reports.
enum KeeperEvent {
    Spawned(std::io::Result<OwnedFd>),
    Exited { status: String, stderr: String },
}

/// A running bwrap (and runner). Dropped: SIGKILL, which takes the whole
/// sandbox down (`--die-with-parent` inside).
#[derive(Debug)]
struct Bwrap {
    pidfd: OwnedFd,
    exited: Arc<AtomicBool>,
}

impl Drop for Bwrap {
    fn drop(&mut self) {
        if !self.exited.load(Ordering::Acquire) {
            let _ = rustix::process::pidfd_send_signal(&self.pidfd, rustix::process::Signal::KILL);
        }
    }
}

/// A started runner, before it is registered with the async reactor.
#[derive(Debug)]
struct Started {
    control: OwnedFd,
    bwrap: Bwrap,
}

#[derive(Debug)]
struct Connection {
    control: AsyncFd<OwnedFd>,
    /// Declared after the socket: dropping closes the socket first.
    bwrap: Bwrap,
}

impl Connection {
    fn alive(&self) -> bool {
        !self.bwrap.exited.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
enum LinkState {
    Started(Started),
    Ready(Arc<Connection>),
    Down,
}

/// The daemon's link to its sandbox runner; restarts it when it died.
#[derive(Debug)]
pub(crate) struct RunnerLink {
    launch: Arc<Launch>,
    state: tokio::sync::Mutex<LinkState>,
}

impl Launch {
    /// Starts bwrap with the runner and waits until it says it is ready.
    /// Blocks (tens of milliseconds; at most [`RUNNER_TIMEOUT`]).
    fn start(&self) -> Result<Started, SandboxError> {
        let io_err = |source: std::io::Error| SandboxError::Spawn {
            bwrap: self.bwrap.clone(),
            source,
        };
        let (ours, theirs) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| io_err(e.into()))?;
        let (before_root_ro, root_ro) = self.layout.split_at(self.layout.len() - 2);
        let mut cmd = std::process::Command::new(&self.bwrap);
        cmd.args(before_root_ro)
            .arg("--ro-bind")
            .arg(&self.runner_exe)
            .arg(RUNNER_PATH)
            .args(root_ro)
            .arg("--chdir")
            .arg("/")
            .arg("--")
            .arg(RUNNER_PATH)
            .arg(RUNNER_SUBCOMMAND)
            .arg("--control-fd")
            .arg(theirs.as_raw_fd().to_string())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let limits = self.limits;
        let theirs_raw = theirs.as_raw_fd();
        // SAFETY: between fork and exec only setsid(2), setrlimit(2) and
        // fcntl(2) on values copied in before the fork; nothing allocates.
        #[allow(unsafe_code)]
        unsafe {
            cmd.pre_exec(move || {
                nix::unistd::setsid()?;
                apply_limits(&limits)?;
                rustix::io::fcntl_setfd(
                    BorrowedFd::borrow_raw(theirs_raw),
                    rustix::io::FdFlags::empty(),
                )?;
                Ok(())
            });
        }
        let exited = Arc::new(AtomicBool::new(false));
        let (events_tx, events) = std::sync::mpsc::channel();
        let keeper_exited = exited.clone();
        std::thread::Builder::new()
            .name("wsd-sandbox".into())
            .spawn(move || keep(cmd, theirs, events_tx, keeper_exited))
            .map_err(io_err)?;
        let pidfd = match events.recv() {
            Ok(KeeperEvent::Spawned(r)) => r.map_err(io_err)?,
            _ => return Err(io_err(std::io::Error::other("the keeper thread died"))),
        };
        let bwrap = Bwrap { pidfd, exited };
        let mut hello = [0u8; 1];
        let ready = wait_readable(ours.as_fd(), RUNNER_TIMEOUT)
            .and_then(|()| recv::<0>(ours.as_fd(), &mut hello, RecvFlags::DONTWAIT));
        match ready {
            Ok(Some((1, _))) if hello[0] == HELLO => Ok(Started {
                control: ours,
                bwrap,
            }),
            other => {
                drop(bwrap);
                let (status, stderr) = match events.recv_timeout(RUNNER_TIMEOUT) {
                    Ok(KeeperEvent::Exited { status, stderr }) => (status, stderr),
                    _ => ("still running".into(), String::new()),
                };
                let stderr = match other {
                    Err(e) => format!("{stderr} (waiting for the runner: {e})"),
                    _ => stderr,
                };
                Err(SandboxError::Unusable {
                    status,
                    stderr: stderr.trim().to_owned(),
                })
            }
        }
    }
}

fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec::try_from(left).map_err(std::io::Error::other)?;
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => continue,
            Ok(_) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The keeper thread: spawns bwrap (so its parent-death signal is tied to
/// this thread, which lives exactly as long as bwrap), logs what it writes
/// on stderr, reaps it, and marks it exited.
fn keep(
    mut cmd: std::process::Command,
    theirs: OwnedFd,
    events: std::sync::mpsc::Sender<KeeperEvent>,
    exited: Arc<AtomicBool>,
) {
    let spawned = cmd.spawn();
    drop(theirs);
    drop(cmd);
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            exited.store(true, Ordering::Release);
            let _ = events.send(KeeperEvent::Spawned(Err(e)));
            return;
        }
    };
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_child(&child),
        rustix::process::PidfdFlags::empty(),
    )
    .map_err(std::io::Error::from);
    let failed = pidfd.is_err();
    let _ = events.send(KeeperEvent::Spawned(pidfd));
    if failed {
        let _ = child.kill();
    }
    const KEPT_STDERR: usize = 4096;
    let mut stderr_text = String::new();
    if let Some(stderr) = child.stderr.take() {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            tracing::warn!(target: "wsd::sandbox", "sandbox: {line}");
            if stderr_text.len() < KEPT_STDERR {
                stderr_text.push_str(&line);
                stderr_text.push('\n');
            }
        }
    }
    let status = child
        .wait()
        .map(|s| s.to_string())
        .unwrap_or_else(|e| e.to_string());
    exited.store(true, Ordering::Release);
    tracing::debug!(target: "wsd::sandbox", %status, "sandbox runner exited");
    let _ = events.send(KeeperEvent::Exited {
        status,
        stderr: stderr_text,
    });
}

/// The error of a command whose runner went away.
fn runner_gone(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::BrokenPipe,
        format!("the sandbox runner exited {what}; wsd starts a new one for the next command"),
    )
}

impl RunnerLink {
    /// Starts the runner now (so a sandbox that cannot work fails at
    /// `wsd serve`), blocking for its start.
    pub(crate) fn start(launch: Launch) -> Result<RunnerLink, SandboxError> {
        let started = launch.start()?;
        Ok(RunnerLink {
            launch: Arc::new(launch),
            state: tokio::sync::Mutex::new(LinkState::Started(started)),
        })
    }

    /// The live connection, starting a new runner if the last one died.
    async fn connection(&self) -> std::io::Result<Arc<Connection>> {
        let mut state = self.state.lock().await;
        let started = match std::mem::replace(&mut *state, LinkState::Down) {
            LinkState::Ready(conn) if conn.alive() => {
                *state = LinkState::Ready(conn.clone());
                return Ok(conn);
            }
            LinkState::Started(started) if !started.bwrap.exited.load(Ordering::Acquire) => started,
            LinkState::Ready(_) | LinkState::Started(_) | LinkState::Down => {
                tracing::warn!(target: "wsd::sandbox", "the sandbox runner had exited; starting a new one");
                let launch = self.launch.clone();
                tokio::task::spawn_blocking(move || launch.start())
                    .await
                    .map_err(std::io::Error::other)?
                    .map_err(std::io::Error::other)?
            }
        };
        let conn = Arc::new(Connection {
            control: register(started.control)?,
            bwrap: started.bwrap,
        });
        *state = LinkState::Ready(conn.clone());
        Ok(conn)
    }

    /// Marks `conn` dead (it is replaced at the next command).
    async fn abandon(&self, conn: &Arc<Connection>) {
        let mut state = self.state.lock().await;
        if let LinkState::Ready(current) = &*state
            && Arc::ptr_eq(current, conn)
        {
            *state = LinkState::Down;
        }
    }

    /// Starts `req` in the sandbox with `stdio` (three descriptors, or one
    /// terminal slave) and returns once it runs.
    pub(crate) async fn spawn(
        &self,
        req: &SpawnRequest,
        stdio: &[BorrowedFd<'_>],
    ) -> std::io::Result<SandboxedChild> {
        let msg = req.encode()?;
        // A runner found dead while sending never got the request: start a
        // new one and send it again, once.
        let mut retried = false;
        loop {
            let conn = self.connection().await?;
            let (ours, theirs) = rustix::net::socketpair(
                AddressFamily::UNIX,
                SocketType::SEQPACKET,
                SocketFlags::CLOEXEC,
                None,
            )?;
            let mut fds = vec![theirs.as_fd()];
            fds.extend_from_slice(stdio);
            let sent = tokio::time::timeout(
                RUNNER_TIMEOUT,
                conn.control
                    .async_io(Interest::WRITABLE, |fd| send(fd.as_fd(), &msg, &fds)),
            )
            .await;
            drop(fds);
            drop(theirs);
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(e))
                    if !retried
                        && matches!(
                            e.kind(),
                            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                        ) =>
                {
                    self.abandon(&conn).await;
                    retried = true;
                    continue;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    self.abandon(&conn).await;
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the sandbox runner took no request for 30 s; wsd starts a new one for the next command",
                    ));
                }
            }
            let reply = register(ours)?;
            let answer = tokio::time::timeout(RUNNER_TIMEOUT, recv_async::<1>(&reply)).await;
            let (msg, mut fds) = match answer {
                Ok(Ok(Some(m))) => m,
                Ok(Ok(None)) => {
                    self.abandon(&conn).await;
                    return Err(runner_gone("before starting the command"));
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    self.abandon(&conn).await;
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the sandbox runner did not start the command within 30 s",
                    ));
                }
            };
            return match msg.first() {
                Some(&STARTED) if fds.len() == 1 => {
                    let pidfd = fds.remove(0);
                    let pid = host_pid(&pidfd)?;
                    Ok(SandboxedChild {
                        reply,
                        pid,
                        status: None,
                    })
                }
                Some(&FAILED) if msg.len() >= 5 => {
                    let errno = i32::from_le_bytes(msg[1..5].try_into().expect("4 bytes"));
                    let text = String::from_utf8_lossy(&msg[5..]).into_owned();
                    Err(if errno != 0 {
                        let os = std::io::Error::from_raw_os_error(errno);
                        std::io::Error::new(os.kind(), text)
                    } else {
                        std::io::Error::other(text)
                    })
                }
                _ => Err(std::io::Error::other(
                    "an unexpected answer from the sandbox runner",
                )),
            };
        }
    }
}

/// Registers a socket of ours with the reactor (in non-blocking mode).
fn register(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    rustix::io::ioctl_fionbio(&fd, true)?;
    // SAFETY: the descriptor is owned by the `AsyncFd` from here on, and
    // nothing closes or replaces it while it is registered.
    #[allow(unsafe_code)]
    unsafe { AsyncFd::register(fd) }.map_err(std::io::Error::from)
}

async fn recv_async<const MAX_FDS: usize>(
    fd: &AsyncFd<OwnedFd>,
) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    let mut buf = [0u8; 512];
    let got = fd
        .async_io(Interest::READABLE, |fd| {
            recv::<MAX_FDS>(fd.as_fd(), &mut buf, RecvFlags::DONTWAIT)
        })
        .await?;
    Ok(got.map(|(n, fds)| (buf[..n].to_vec(), fds)))
}

/// The pid (in this process's pid namespace, the host's) of the process a
/// pidfd refers to, from its `fdinfo`.
fn host_pid(pidfd: &OwnedFd) -> std::io::Result<i32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|p| p.trim().parse::<i32>().ok())
        .filter(|&p| p > 1)
        .ok_or_else(|| std::io::Error::other("the command's pid on the host is unknown"))
}

/// A command the runner started. Dropping it lets the runner reap the
/// command (see the module doc).
#[derive(Debug)]
pub(crate) struct SandboxedChild {
    reply: AsyncFd<OwnedFd>,
    /// The command's pid on the host: its process group (and, for a
    /// terminal, session) id.
    pid: i32,
    status: Option<ExitStatus>,
}

impl SandboxedChild {
    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// How the command ended. Cancel-safe. An error if the runner died
    /// first (the command died with it).
    pub(crate) async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        let status = match recv_async::<0>(&self.reply).await? {
            Some((msg, _)) if msg.first() == Some(&EXITED) => {
                decode_exit(&msg).ok_or_else(|| {
                    std::io::Error::other("a short exit report from the sandbox runner")
                })?
            }
            Some(_) => {
                return Err(std::io::Error::other(
                    "an unexpected message from the sandbox runner",
                ));
            }
            None => return Err(runner_gone("while the command ran, and took it down")),
        };
        self.status = Some(status);
        Ok(status)
    }
}

/// The canonical path of the binary that serves as the runner: this one.
pub(crate) fn current_runner_exe() -> Result<PathBuf, SandboxError> {
    let exe = std::env::current_exe().map_err(|source| SandboxError::Path {
        path: PathBuf::from("/proc/self/exe"),
        source,
    })?;
    std::fs::canonicalize(&exe).map_err(|source| SandboxError::Path { path: exe, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_survives_its_encoding() {
        let req = SpawnRequest {
            terminal: true,
            cwd: PathBuf::from("/work/ws/sub dir"),
            argv: vec!["/bin/sh".into(), "-c".into(), "echo 'a=b' \u{e9}".into()],
            env: vec![
                ("PATH".into(), "/usr/bin:/bin".into()),
                ("EMPTY".into(), "".into()),
                ("WITH_EQ".into(), "x=y=z".into()),
            ],
        };
        let encoded = req.encode().unwrap();
        assert_eq!(SpawnRequest::decode(&encoded).unwrap(), req);
        let no_env = SpawnRequest {
            terminal: false,
            env: Vec::new(),
            ..req.clone()
        };
        assert_eq!(
            SpawnRequest::decode(&no_env.encode().unwrap()).unwrap(),
            no_env
        );
    }

    #[test]
    fn malformed_requests_are_refused_not_misread() {
        let req = SpawnRequest {
            terminal: false,
            cwd: PathBuf::from("/w"),
            argv: vec!["true".into()],
            env: vec![("A".into(), "1".into())],
        };
        let good = req.encode().unwrap();
        for bad in [
            &[][..],
            &good[..1],
            &good[..good.len() - 1],
            &[b'x', 0, 0, 0, 0, 0, 0, 0, 0, b'/', 0][..],
        ] {
            assert!(SpawnRequest::decode(bad).is_err(), "{bad:?}");
        }
        let mut extra = good.clone();
        extra.extend(b"more\0");
        assert!(SpawnRequest::decode(&extra).is_err());
        let nul = SpawnRequest {
            argv: vec!["a\0b".into()],
            ..req
        };
        assert_eq!(
            nul.encode().unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn exit_reports_keep_the_code_or_the_signal() {
        let code = decode_exit(&[EXITED, 7, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!((code.code(), code.signal()), (Some(7), None));
        let sig = decode_exit(&[EXITED, 0, 0, 0, 0, 9, 0, 0, 0]).unwrap();
        assert_eq!((sig.code(), sig.signal()), (None, Some(9)));
        assert!(decode_exit(&[EXITED, 1]).is_none());
    }
}
