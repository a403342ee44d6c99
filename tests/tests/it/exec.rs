//! The shell half end to end: a real `wsd serve` on loopback, driven through
//! the RPC client (`wsd_client::client`) and through the `wsd exec`, `attach`
//! and `kill` CLI. Commands are real `/bin/sh` processes in a temp
//! workspace. Ordering is forced with FIFOs ("gates") the command blocks
//! on, never with sleeps; every wait is bounded (`STEP`).

use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use wsd::rpc::{ExecEvent, ExecEventKind, ExecRequest, ExecSignal, ResumeFrom, WireError};
use wsd_client::client::{self, Client, ExecStream};
use wsd_sync::{ChangeCursor, EntryState, ErrorCode};
use wsd_tests::{bytes, free_port, wsd_bin};

/// Longest wait for any single step (an event, a process, a gate).
const STEP: Duration = Duration::from_secs(20);

/// A `wsd serve` on a temp workspace, with extra flags and environment;
/// SIGKILLed when dropped.
struct Served {
    _tmp: TempDir,
    root: PathBuf,
    state: PathBuf,
    addr: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// A program (and its arguments) that execs the daemon's command line.
    wrapper: Vec<String>,
    child: Option<Child>,
}

impl Served {
    fn start() -> Served {
        Served::start_with(&[], &[])
    }

    fn start_with(args: &[&str], env: &[(&str, &str)]) -> Served {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(&root).unwrap();
        let mut d = Served {
            root: root.canonicalize().unwrap(),
            state: tmp.path().join("state"),
            _tmp: tmp,
            addr: format!("127.0.0.1:{}", free_port()),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            wrapper: Vec::new(),
            child: None,
        };
        d.spawn();
        d
    }

    /// A daemon started the way a background job of a non-interactive
    /// shell under `nohup` is: SIGINT, SIGQUIT and SIGHUP ignored.
    fn start_ignoring_signals() -> Served {
        let mut d = Served::start_with(&[], &[]);
        d.kill9();
        d.wrapper = ["sh", "-c", "trap '' INT QUIT HUP; exec \"$@\"", "sh"]
            .map(str::to_owned)
            .to_vec();
        d.spawn();
        d
    }

    fn spawn(&mut self) {
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(wsd_bin());
                c
            }
            None => Command::new(wsd_bin()),
        };
        cmd.args(["serve", "--listen", &self.addr])
            .arg("--root")
            .arg(&self.root)
            .arg("--state")
            .arg(&self.state)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env_remove("WSD_TOKEN")
            .env_remove("WSD_TOKEN_FILE")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn wsd serve");
        let deadline = Instant::now() + STEP;
        while std::net::TcpStream::connect(&self.addr).is_err() {
            if let Some(status) = child.try_wait().unwrap() {
                panic!("wsd serve exited early: {status}");
            }
            assert!(Instant::now() < deadline, "wsd serve did not listen");
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(child);
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL (a crash), then the same daemon again on the same state.
    fn crash_and_restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn cli_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(wsd_bin());
        cmd.args(args)
            .env("WSD_REMOTE", &self.addr)
            .env_remove("WSD_TOKEN_FILE")
            .env_remove("RUST_LOG");
        cmd
    }

    /// Runs `wsd ARGS` against this daemon (`--remote` through
    /// `WSD_REMOTE`, so it never lands after a `--`).
    fn cli(&self, args: &[&str]) -> Output {
        self.cli_command(args)
            .stdin(Stdio::null())
            .output()
            .expect("run wsd")
    }

    /// Starts `wsd ARGS` with piped stdout and stderr.
    fn cli_spawn(&self, args: &[&str]) -> CliChild {
        let child = self
            .cli_command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn wsd");
        CliChild::new(child)
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    fn mkfifo(&self, name: &str) {
        let status = Command::new("mkfifo")
            .arg(self.path(name))
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Pids the command wrote, one per line, to `name`.
    fn pids(&self, name: &str) -> Vec<i32> {
        std::fs::read_to_string(self.path(name))
            .unwrap()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    }
}

impl Drop for Served {
    /// A graceful stop first: the daemon SIGKILLs the process groups of the
    /// commands still running, which a SIGKILL of the daemon would orphan.
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = Command::new("kill").arg(c.id().to_string()).status();
            let deadline = Instant::now() + STEP;
            while Instant::now() < deadline {
                if !matches!(c.try_wait(), Ok(None)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.kill9();
    }
}

/// Opens a gate: writes a line into the FIFO once the command has opened it
/// for reading (`read x < gate`), waiting at most `STEP` for that.
fn try_open_gate(path: &Path) -> bool {
    match std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    {
        Ok(mut f) => {
            f.write_all(b"\n").unwrap();
            true
        }
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => false,
        Err(e) => panic!("opening the gate {}: {e}", path.display()),
    }
}

fn open_gate(path: &Path) {
    let deadline = Instant::now() + STEP;
    while !try_open_gate(path) {
        assert!(Instant::now() < deadline, "nobody read {}", path.display());
        std::thread::sleep(Duration::from_millis(5));
    }
}

async fn open_gate_async(path: &Path) {
    let deadline = Instant::now() + STEP;
    while !try_open_gate(path) {
        assert!(Instant::now() < deadline, "nobody read {}", path.display());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Whether `pid` is a live (non-zombie) process.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            !matches!(state, Some('Z' | 'X'))
        }
    }
}

fn assert_all_dead(pids: &[i32]) {
    let deadline = Instant::now() + STEP;
    loop {
        let survivors: Vec<i32> = pids.iter().copied().filter(|&p| alive(p)).collect();
        if survivors.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "processes of the exec survived: {survivors:?} of {pids:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// SIGKILLs a process group when dropped: for commands orphaned by a daemon
/// crash, which nothing else would stop.
struct KillGroupOnDrop(i32);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if self.0 > 1 {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", self.0)])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A running `wsd` client process whose stdout and stderr are read line by
/// line on threads; killed when dropped.
struct CliChild {
    child: Child,
    lines: mpsc::Receiver<String>,
    err_lines: mpsc::Receiver<String>,
}

/// Sends each line of `from` (with its newline, if any) to a channel.
fn line_reader(from: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut r = BufReader::new(from);
        loop {
            let mut line = Vec::new();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    if tx.send(text(&line)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

impl CliChild {
    fn new(mut child: Child) -> CliChild {
        let lines = line_reader(child.stdout.take().unwrap());
        let err_lines = line_reader(child.stderr.take().unwrap());
        CliChild {
            child,
            lines,
            err_lines,
        }
    }

    /// The next stdout line, without its newline.
    fn next_line(&self) -> String {
        let line = self
            .lines
            .recv_timeout(STEP)
            .expect("no output line from wsd within STEP");
        line.trim_end_matches('\n').to_owned()
    }

    /// The next stderr line, without its newline.
    fn next_err_line(&self) -> String {
        let line = self
            .err_lines
            .recv_timeout(STEP)
            .expect("no stderr line from wsd within STEP");
        line.trim_end_matches('\n').to_owned()
    }

    /// Every remaining stdout line, after the process exited.
    fn rest(&self) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(STEP) {
            out.push(l.trim_end_matches('\n').to_owned());
        }
        out
    }

    /// The rest of stderr, byte for byte, after the process exited.
    fn stderr(&self) -> String {
        let mut out = String::new();
        while let Ok(l) = self.err_lines.recv_timeout(STEP) {
            out.push_str(&l);
        }
        out
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn wait(&mut self) -> i32 {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().expect("wsd exited by a signal");
            }
            assert!(Instant::now() < deadline, "wsd did not exit within STEP");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for CliChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `f` on a current-thread runtime inside a `LocalSet`, as the client
/// requires, bounded by a minute.
fn run<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio::task::LocalSet::new().block_on(&rt, async {
        tokio::time::timeout(Duration::from_secs(60), f)
            .await
            .expect("the test's client work took over a minute")
    })
}

async fn connect(addr: &str) -> Client {
    client::connect(addr, None, "exec-e2e").await.unwrap()
}

fn req(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        ..ExecRequest::default()
    }
}

fn req_id(command: &str, id: &str) -> ExecRequest {
    ExecRequest {
        id: Some(id.into()),
        ..req(command)
    }
}

async fn next(s: &mut ExecStream) -> Option<ExecEvent> {
    tokio::time::timeout(STEP, s.next())
        .await
        .expect("no exec event within STEP")
        .unwrap_or_else(|e| panic!("exec stream failed: {e}"))
}

/// Every event up to the end of the stream.
async fn collect(s: &mut ExecStream) -> Vec<ExecEvent> {
    let mut out = Vec::new();
    while let Some(e) = next(s).await {
        out.push(e);
    }
    out
}

/// Reads events into `seen` until stdout ends with `out` and stderr ends
/// with `err` (the last output before the command blocks on a gate).
async fn read_until(s: &mut ExecStream, out: &[u8], err: &[u8], seen: &mut Vec<ExecEvent>) {
    while !(stdout_of(seen).ends_with(out) && stderr_of(seen).ends_with(err)) {
        let e = next(s).await.expect("the stream ended early");
        seen.push(e);
    }
}

fn stdout_of(events: &[ExecEvent]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            ExecEventKind::Stdout(b) => Some(b.as_slice()),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

fn stderr_of(events: &[ExecEvent]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            ExecEventKind::Stderr(b) => Some(b.as_slice()),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

/// Checks the events are one exec's complete log from seq 1 (each seq once,
/// in order, the exit last) and returns its exit code.
fn exit_of(events: &[ExecEvent]) -> i32 {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    let want: Vec<u64> = (1..=events.len() as u64).collect();
    assert_eq!(seqs, want, "seqs are not 1..=n in order");
    for e in &events[..events.len() - 1] {
        assert!(
            !matches!(e.kind, ExecEventKind::Exit(_)),
            "exit before the end"
        );
    }
    match events.last().map(|e| &e.kind) {
        Some(ExecEventKind::Exit(code)) => *code,
        other => panic!("the last event is not an exit: {other:?}"),
    }
}

fn last_seq(events: &[ExecEvent]) -> u64 {
    events.last().map_or(0, |e| e.seq)
}

fn code_of<T: std::fmt::Debug>(r: Result<T, WireError>) -> ErrorCode {
    let e = r.expect_err("expected an error");
    assert!(
        !e.message.starts_with(e.code.as_str()),
        "the code is repeated in the message: {e}"
    );
    e.code
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn lines(prefix: &str, from: u32, to: u32) -> Vec<u8> {
    (from..=to)
        .flat_map(|i| format!("{prefix} {i}\n").into_bytes())
        .collect()
}

// ---------------------------------------------------------------------------
// The event stream: resume, replay, tail.

#[test]
fn output_arrives_exactly_once_and_in_seq_order_across_dropped_connections() {
    let d = Served::start();
    d.mkfifo("g1");
    d.mkfifo("g2");
    let script = r#"i=0
while [ $i -lt 600 ]; do
  i=$((i+1)); echo "out $i"; echo "err $i" >&2
  if [ $i = 200 ]; then read x < g1; fi
  if [ $i = 400 ]; then read x < g2; fi
done
exit 5"#;
    run(async {
        let mut seen = Vec::new();
        // 1: start it, read up to where it blocks, drop the connection.
        let c = connect(&d.addr).await;
        let mut s = c.exec(&req(script)).await.unwrap();
        let id = s.id().to_owned();
        read_until(&mut s, b"out 200\n", b"err 200\n", &mut seen).await;
        drop((s, c));
        open_gate_async(&d.path("g1")).await;

        // 2: resume after the last seq seen: lines 201..=400 come partly
        // from the log, partly live.
        let c = connect(&d.addr).await;
        let mut s = c
            .get_exec(&id, ResumeFrom::After(last_seq(&seen)))
            .await
            .unwrap();
        read_until(&mut s, b"out 400\n", b"err 400\n", &mut seen).await;
        drop((s, c));
        open_gate_async(&d.path("g2")).await;

        // 3: resume, take a few events while the command is still writing,
        // and drop mid-stream with events in flight.
        let c = connect(&d.addr).await;
        let mut s = c
            .get_exec(&id, ResumeFrom::After(last_seq(&seen)))
            .await
            .unwrap();
        for _ in 0..3 {
            match next(&mut s).await {
                Some(e) => seen.push(e),
                None => break,
            }
        }
        drop((s, c));

        // 4: the rest.
        let c = connect(&d.addr).await;
        let mut s = c
            .get_exec(&id, ResumeFrom::After(last_seq(&seen)))
            .await
            .unwrap();
        seen.extend(collect(&mut s).await);

        assert_eq!(exit_of(&seen), 5);
        assert_eq!(text(&stdout_of(&seen)), text(&lines("out", 1, 600)));
        assert_eq!(text(&stderr_of(&seen)), text(&lines("err", 1, 600)));
        // A full replay is the same log, event for event.
        let mut s = c.get_exec(&id, ResumeFrom::Start).await.unwrap();
        assert_eq!(collect(&mut s).await, seen);
    });
}

#[test]
fn omitting_after_replays_every_event_and_tail_sees_only_later_ones() {
    let d = Served::start();
    d.mkfifo("gate");
    run(async {
        let c = connect(&d.addr).await;
        let mut s = c
            .exec(&req(
                "echo one; echo uno >&2; read x < gate; echo two; exit 3",
            ))
            .await
            .unwrap();
        let id = s.id().to_owned();
        let mut before = Vec::new();
        read_until(&mut s, b"one\n", b"uno\n", &mut before).await;
        // Other connections attach while the command waits at the gate.
        let c2 = connect(&d.addr).await;
        let mut all = c2.get_exec(&id, ResumeFrom::Start).await.unwrap();
        let mut tail = c2.get_exec(&id, ResumeFrom::Tail).await.unwrap();
        let mut after1 = c2.get_exec(&id, ResumeFrom::After(1)).await.unwrap();
        open_gate_async(&d.path("gate")).await;

        let mut original = before.clone();
        original.extend(collect(&mut s).await);
        assert_eq!(exit_of(&original), 3);
        assert_eq!(stdout_of(&original), b"one\ntwo\n");
        assert_eq!(collect(&mut all).await, original);
        assert_eq!(collect(&mut tail).await, original[before.len()..]);
        assert_eq!(collect(&mut after1).await, original[1..]);

        // Finished: omitted `after` replays everything, a number resumes
        // after it, tail has nothing left to show and ends at once.
        let n = original.len() as u64;
        let mut s = c2.get_exec(&id, ResumeFrom::Start).await.unwrap();
        assert_eq!(collect(&mut s).await, original);
        let mut s = c2.get_exec(&id, ResumeFrom::After(n - 1)).await.unwrap();
        assert_eq!(collect(&mut s).await, original[n as usize - 1..]);
        let mut s = c2.get_exec(&id, ResumeFrom::After(n)).await.unwrap();
        assert!(collect(&mut s).await.is_empty());
        let mut s = c2.get_exec(&id, ResumeFrom::Tail).await.unwrap();
        assert!(collect(&mut s).await.is_empty());
    });
}

#[test]
fn a_live_id_is_busy_and_unknown_ids_are_not_found() {
    let d = Served::start();
    d.mkfifo("gate");
    run(async {
        let c = connect(&d.addr).await;
        let mut s = c
            .exec(&req_id("read x < gate; echo ok", "job"))
            .await
            .unwrap();
        assert_eq!(s.id(), "job");
        assert_eq!(
            code_of(c.exec(&req_id("true", "job")).await),
            ErrorCode::ExecBusy
        );
        for missing in ["nosuch", "job2"] {
            assert_eq!(
                code_of(c.get_exec(missing, ResumeFrom::Start).await),
                ErrorCode::NotFound
            );
            assert_eq!(
                code_of(c.kill_exec(missing, ExecSignal::Term).await),
                ErrorCode::NotFound
            );
            assert_eq!(code_of(c.dispose_exec(missing).await), ErrorCode::NotFound);
        }
        // The busy refusal did not disturb the running exec.
        open_gate_async(&d.path("gate")).await;
        let events = collect(&mut s).await;
        assert_eq!(
            (stdout_of(&events), exit_of(&events)),
            (b"ok\n".to_vec(), 0)
        );
        // A finished id can be reused; a disposed one is gone.
        let mut again = c.exec(&req_id("echo again", "job")).await.unwrap();
        assert_eq!(stdout_of(&collect(&mut again).await), b"again\n");
        c.dispose_exec("job").await.unwrap();
        assert_eq!(
            code_of(c.get_exec("job", ResumeFrom::Start).await),
            ErrorCode::NotFound
        );
    });

    // The CLI reports the codes once and fails.
    let out = d.cli(&["attach", "nosuch"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ENOENT: no exec with id \"nosuch\"") && !err.contains("ENOENT: ENOENT"),
        "{err}"
    );
    let out = d.cli(&["kill", "nosuch"]);
    assert_eq!(out.status.code(), Some(1));
    let busy = d.cli(&["exec", "--id", "held", "--detach", "--", "read x < gate"]);
    assert!(busy.status.success());
    let out = d.cli(&["exec", "--id", "held", "--", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("EEXEC_BUSY") && !err.contains("EEXEC_BUSY: EEXEC_BUSY"),
        "{err}"
    );
    open_gate(&d.path("gate"));
}

#[test]
fn malformed_or_oversized_requests_are_refused_with_their_codes() {
    let d = Served::start();
    run(async {
        let c = connect(&d.addr).await;
        let bad: Vec<(ExecRequest, ErrorCode)> = vec![
            (req("   "), ErrorCode::Invalid),
            (req_id("true", "has space"), ErrorCode::Invalid),
            (req_id("true", ""), ErrorCode::Invalid),
            (req_id("true", &"x".repeat(129)), ErrorCode::Limit),
            (
                ExecRequest {
                    env: vec![("A=B".into(), "1".into())],
                    ..req("true")
                },
                ErrorCode::Invalid,
            ),
            (
                ExecRequest {
                    cwd: Some("/etc".into()),
                    ..req("true")
                },
                ErrorCode::Invalid,
            ),
            (
                ExecRequest {
                    stdin: Some(vec![0; 8 * 1024 * 1024 + 1]),
                    ..req("cat")
                },
                ErrorCode::Limit,
            ),
            (req(&"x".repeat(64 * 1024 + 1)), ErrorCode::Limit),
        ];
        for (request, code) in bad {
            assert_eq!(code_of(c.exec(&request).await), code, "{:?}", request.id);
        }
        // Nothing was started, and the connection is still usable.
        let events = collect(&mut c.exec(&req("echo fine")).await.unwrap()).await;
        assert_eq!(stdout_of(&events), b"fine\n");
    });
}

#[test]
fn disposing_a_live_exec_kills_it_and_its_readers_end_with_enoent() {
    let d = Served::start();
    run(async {
        let c = connect(&d.addr).await;
        let mut s = c
            .exec(&req_id(
                "echo $$ >> pids; sleep 60 & echo $! >> pids; echo up; wait",
                "gone",
            ))
            .await
            .unwrap();
        read_until(&mut s, b"up\n", b"", &mut Vec::new()).await;
        let pids = d.pids("pids");
        let other = connect(&d.addr).await;
        let mut watcher = other.get_exec("gone", ResumeFrom::Tail).await.unwrap();
        c.dispose_exec("gone").await.unwrap();
        for stream in [&mut s, &mut watcher] {
            let end = tokio::time::timeout(STEP, async {
                loop {
                    match stream.next().await {
                        Ok(Some(e)) => assert!(!matches!(e.kind, ExecEventKind::Exit(_))),
                        other => return other,
                    }
                }
            })
            .await
            .expect("the stream did not end");
            assert_eq!(end.map(|_| ()).unwrap_err().code, ErrorCode::NotFound);
        }
        assert_all_dead(&pids);
        assert_eq!(
            code_of(c.get_exec("gone", ResumeFrom::Start).await),
            ErrorCode::NotFound
        );
        // A finished exec's log can be disposed too.
        let mut s = c.exec(&req_id("echo once", "done")).await.unwrap();
        collect(&mut s).await;
        c.dispose_exec("done").await.unwrap();
        assert_eq!(
            code_of(c.get_exec("done", ResumeFrom::Start).await),
            ErrorCode::NotFound
        );
    });
}

// ---------------------------------------------------------------------------
// Process hygiene.

/// A command that starts background children (one in a subshell, one that
/// ignores SIGTERM and has a child of its own), records every pid in
/// `pids`, says "ready" and waits.
const FAMILY: &str = r#"echo $$ >> pids
sleep 60 & echo $! >> pids
( sleep 60 & echo $! >> pids; wait ) & echo $! >> pids
sh -c 'trap "" TERM; sleep 60 & echo $! >> pids; echo $$ >> pids; wait' &
while [ "$(wc -l < pids)" -lt 6 ]; do sleep 0.01; done
echo ready
wait"#;

#[test]
fn killing_an_exec_leaves_no_process_of_its_group_alive() {
    let d = Served::start();
    run(async {
        let c = connect(&d.addr).await;
        let mut s = c.exec(&req(FAMILY)).await.unwrap();
        let mut seen = Vec::new();
        read_until(&mut s, b"ready\n", b"", &mut seen).await;
        let pids = d.pids("pids");
        assert_eq!(pids.len(), 6);
        assert!(pids.iter().all(|&p| alive(p)));
        // SIGTERM to the group; the member that ignores it is SIGKILLed
        // after the kill grace.
        c.kill_exec(s.id(), ExecSignal::Term).await.unwrap();
        seen.extend(collect(&mut s).await);
        assert_eq!(exit_of(&seen), 143);
        assert_all_dead(&pids);
        // Killing a finished exec signals nothing, and says so.
        assert_eq!(
            code_of(c.kill_exec(s.id(), ExecSignal::Kill).await),
            ErrorCode::NotFound
        );
    });
}

#[test]
fn wsd_kill_with_signal_kill_ends_the_whole_group_at_once() {
    let d = Served::start();
    let out = d.cli(&["exec", "--detach", "--id", "fam", "--", FAMILY]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "fam\n");
    let mut attach = d.cli_spawn(&["attach", "fam"]);
    assert_eq!(attach.next_line(), "ready");
    let pids = d.pids("pids");
    let out = d.cli(&["kill", "fam", "--signal", "KILL"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(attach.wait(), 137);
    assert_all_dead(&pids);
}

#[test]
fn signals_the_daemon_inherited_as_ignored_reach_commands_with_their_default_action() {
    let d = Served::start_ignoring_signals();
    let bit = |sig: i32| 1u64 << (sig - 1);
    // The daemon still shrugs SIGHUP off, as under nohup (it now has a
    // handler that does nothing instead of an ignore).
    #[allow(unsafe_code)]
    // SAFETY: kill(2) has no memory-safety preconditions.
    let rc = unsafe { libc::kill(d.pid() as i32, libc::SIGHUP) };
    assert_eq!(rc, 0);
    run(async {
        let c = connect(&d.addr).await;
        let mut s = c
            .exec(&req("grep '^SigIgn:' /proc/self/status"))
            .await
            .unwrap();
        let events = collect(&mut s).await;
        assert_eq!(exit_of(&events), 0, "{}", text(&stderr_of(&events)));
        let out = text(&stdout_of(&events));
        let mask = u64::from_str_radix(out.split_whitespace().nth(1).unwrap(), 16).unwrap();
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP] {
            assert_eq!(
                mask & bit(sig),
                0,
                "signal {sig} ignored in the command: {out}"
            );
        }
        // A kill with SIGINT ends the command by SIGINT, not by the
        // SIGKILL after the grace period.
        let mut s = c
            .exec(&req("echo $$ > pid; echo ready; exec sleep 100"))
            .await
            .unwrap();
        let mut seen = Vec::new();
        read_until(&mut s, b"ready\n", b"", &mut seen).await;
        // dash catches SIGINT while it runs: signal the sleep itself.
        let pid = d.pids("pid")[0];
        let deadline = Instant::now() + STEP;
        while std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() != "sleep\n"
        {
            assert!(Instant::now() < deadline, "the command never ran sleep");
            std::thread::sleep(Duration::from_millis(5));
        }
        c.kill_exec(s.id(), ExecSignal::Int).await.unwrap();
        seen.extend(collect(&mut s).await);
        assert_eq!(exit_of(&seen), 128 + libc::SIGINT);
    });
}

#[test]
fn a_timeout_terminates_the_command_and_its_children() {
    let d = Served::start();
    run(async {
        let c = connect(&d.addr).await;
        let request = ExecRequest {
            timeout_ms: Some(300),
            ..req("echo $$ >> pids; sleep 60 & echo $! >> pids; echo started; wait")
        };
        let mut s = c.exec(&request).await.unwrap();
        let events = collect(&mut s).await;
        assert_eq!(stdout_of(&events), b"started\n");
        assert_eq!(exit_of(&events), 143);
        assert_all_dead(&d.pids("pids"));
    });
    let out = d.cli(&["exec", "--timeout", "300ms", "--", "echo slow; sleep 60"]);
    assert_eq!(out.status.code(), Some(143));
    assert_eq!(text(&out.stdout), "slow\n");
}

#[test]
fn the_daemons_secrets_are_not_visible_to_commands() {
    let d = Served::start_with(
        &[],
        &[
            ("WSD_SECRET", "hunter2-daemon-secret"),
            ("AWS_SECRET_ACCESS_KEY", "hunter2-aws"),
            ("TZ", "UTC"),
            ("LC_ALL", "C"),
        ],
    );
    let out = d.cli(&["exec", "--env", "CALLER=given", "--", "env"]);
    assert!(out.status.success());
    let env = text(&out.stdout);
    assert!(!env.contains("hunter2"), "a daemon secret leaked:\n{env}");
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    for want in ["TZ", "LC_ALL", "CALLER"] {
        assert!(names.contains(&want), "{want} missing:\n{env}");
    }
    assert!(env.lines().any(|l| l == "CALLER=given"), "{env}");
    // Whatever the daemon had, only allowlisted names (plus the caller's
    // and what sh sets itself) reach the command.
    let allowed = [
        "PATH", "HOME", "TMPDIR", "TZ", "LANG", "TERM", "CALLER", "PWD",
    ];
    for name in names {
        assert!(
            allowed.contains(&name) || name.starts_with("LC_") || name == "SHLVL" || name == "_",
            "{name} reached the command:\n{env}"
        );
    }
    // Over RPC, a caller may pass a secret explicitly.
    run(async {
        let c = connect(&d.addr).await;
        let request = ExecRequest {
            env: vec![("TOKEN".into(), "passed-on-purpose".into())],
            ..req("echo \"$TOKEN/$WSD_SECRET/$AWS_SECRET_ACCESS_KEY\"")
        };
        let events = collect(&mut c.exec(&request).await.unwrap()).await;
        assert_eq!(stdout_of(&events), b"passed-on-purpose//\n");
    });
}

// ---------------------------------------------------------------------------
// Bytes in and out.

/// Every byte value, then pseudo-random bytes: several events' worth.
fn binary_payload() -> Vec<u8> {
    let mut data: Vec<u8> = (0..=255u8).collect();
    data.extend((0..=255u8).rev());
    data.extend(bytes(300_000, 7));
    data
}

#[test]
fn stdin_bytes_reach_the_command_which_then_sees_end_of_file() {
    let d = Served::start();
    let data = binary_payload();
    run(async {
        let c = connect(&d.addr).await;
        let request = ExecRequest {
            stdin: Some(data.clone()),
            ..req("cat; echo eof >&2")
        };
        let events = collect(&mut c.exec(&request).await.unwrap()).await;
        assert_eq!(exit_of(&events), 0);
        assert!(stdout_of(&events) == data, "stdin did not round-trip");
        assert_eq!(stderr_of(&events), b"eof\n");
        // Without stdin the command reads end-of-file at once.
        let events = collect(&mut c.exec(&req("wc -c")).await.unwrap()).await;
        assert_eq!(text(&stdout_of(&events)).trim(), "0");
    });
}

#[test]
fn binary_output_with_every_byte_value_round_trips() {
    let d = Served::start();
    let data = binary_payload();
    std::fs::write(d.path("all.bin"), &data).unwrap();
    run(async {
        let c = connect(&d.addr).await;
        let mut s = c.exec(&req("cat all.bin; cat all.bin >&2")).await.unwrap();
        let events = collect(&mut s).await;
        assert_eq!(exit_of(&events), 0);
        assert!(stdout_of(&events) == data, "stdout differs");
        assert!(stderr_of(&events) == data, "stderr differs");
        let mut s = c.get_exec(s.id(), ResumeFrom::Start).await.unwrap();
        assert_eq!(collect(&mut s).await, events, "the replay differs");
    });
    let out = d.cli(&["exec", "--", "cat all.bin; cat all.bin >&2"]);
    assert!(out.status.success());
    assert!(out.stdout == data, "CLI stdout differs");
    assert!(out.stderr == data, "CLI stderr differs");
}

// ---------------------------------------------------------------------------
// Retention.

#[test]
fn the_log_keeps_a_window_of_the_newest_events_and_older_resumes_are_truncated() {
    let d = Served::start_with(&["--exec-log-cap", "4096"], &[]);
    d.mkfifo("g1");
    d.mkfifo("g2");
    let script = "head -c 20000 /dev/zero | tr '\\0' a; read x < g1; \
                  head -c 20000 /dev/zero | tr '\\0' b; read x < g2; echo end";
    let expected = [vec![b'a'; 20000], vec![b'b'; 20000], b"end\n".to_vec()].concat();
    let (id, live) = run(async {
        let c = connect(&d.addr).await;
        let mut s = c.exec(&req(script)).await.unwrap();
        let id = s.id().to_owned();
        let mut seen = Vec::new();
        read_until(&mut s, &[b'a'; 20000], b"", &mut seen).await;
        open_gate_async(&d.path("g1")).await;
        read_until(&mut s, &[b'b'; 20000], b"", &mut seen).await;
        // The a's are evicted: a replay from the start is refused while the
        // exec runs, and a tail attach still works.
        assert_eq!(
            code_of(c.get_exec(&id, ResumeFrom::Start).await),
            ErrorCode::LogTruncated
        );
        assert_eq!(
            code_of(c.get_exec(&id, ResumeFrom::After(0)).await),
            ErrorCode::LogTruncated
        );
        let mut tail = c.get_exec(&id, ResumeFrom::Tail).await.unwrap();
        open_gate_async(&d.path("g2")).await;
        // The live stream is untouched by eviction.
        seen.extend(collect(&mut s).await);
        assert_eq!(exit_of(&seen), 0);
        assert!(stdout_of(&seen) == expected, "the live stream lost bytes");
        let tail = collect(&mut tail).await;
        assert_eq!(stdout_of(&tail), b"end\n");

        // The retained window is a suffix of the log: find where it starts.
        let mut first_kept = None;
        for after in 0..seen.len() as u64 {
            match c.get_exec(&id, ResumeFrom::After(after)).await {
                Err(e) => assert_eq!(e.code, ErrorCode::LogTruncated, "{e}"),
                Ok(mut s) => {
                    let kept = collect(&mut s).await;
                    assert_eq!(kept, seen[after as usize..]);
                    first_kept = Some(after + 1);
                    break;
                }
            }
        }
        let first_kept = first_kept.expect("the exit event is always kept");
        assert!(first_kept > 1, "nothing was evicted");
        let kept_bytes = stdout_of(&seen[first_kept as usize - 1..]).len();
        assert!(
            kept_bytes <= 4096 || first_kept as usize + 1 >= seen.len(),
            "{kept_bytes} bytes kept over a 4096-byte cap"
        );
        (id, seen)
    });
    // The CLI: a full replay is refused; resuming inside the window works.
    let out = d.cli(&["attach", &id]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ELOG_TRUNCATED") && !err.contains("ELOG_TRUNCATED: ELOG_TRUNCATED"),
        "{err}"
    );
    let before_exit = (live.len() - 1).to_string();
    let out = d.cli(&["attach", &id, "--after", &before_exit]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

// ---------------------------------------------------------------------------
// Restart.

#[test]
fn a_daemon_crash_during_an_exec_gives_a_reattaching_reader_the_lost_exit() {
    let mut d = Served::start();
    let finished = run(async {
        let c = connect(&d.addr).await;
        let finished = collect(
            &mut c
                .exec(&req_id("echo finished; exit 4", "done"))
                .await
                .unwrap(),
        )
        .await;
        let mut s = c
            .exec(&req_id("echo $$ > pgid; echo started; sleep 60", "running"))
            .await
            .unwrap();
        read_until(&mut s, b"started\n", b"", &mut Vec::new()).await;
        finished
    });
    let _orphan = KillGroupOnDrop(d.pids("pgid")[0]);
    // A CLI attached to the running exec outlives the crash: it re-attaches
    // once the daemon is back and reports the lost exit.
    let mut attached = d.cli_spawn(&["attach", "running"]);
    assert_eq!(attached.next_line(), "started");
    d.crash_and_restart();
    assert_eq!(attached.wait(), 255, "{}", attached.stderr());
    assert!(attached.rest().is_empty());

    run(async {
        let c = connect(&d.addr).await;
        let mut s = c.get_exec("running", ResumeFrom::Start).await.unwrap();
        let events = collect(&mut s).await;
        assert_eq!(stdout_of(&events), b"started\n");
        assert_eq!(exit_of(&events), -1, "the documented lost code");
        // The finished exec's log survived as it was.
        // Its exit carries the rev as of its sending, not its settle's: the
        // `pgid` file the second command wrote is indexed by now (this fetch
        // settles; under load a restart's own scan used to, now and then).
        c.fetch_changes(&ChangeCursor::ZERO, &[]).await.unwrap();
        let mut s = c.get_exec("done", ResumeFrom::Start).await.unwrap();
        let replayed = collect(&mut s).await;
        let exit_rev = |events: &[ExecEvent]| events.last().map_or(0, |e| e.rev);
        assert!(exit_rev(&replayed) > exit_rev(&finished), "{replayed:?}");
        let without_revs = |events: &[ExecEvent]| {
            let mut events = events.to_vec();
            events.iter_mut().for_each(|e| e.rev = 0);
            events
        };
        assert_eq!(without_revs(&replayed), without_revs(&finished));
        assert_eq!(exit_of(&finished), 4);
        // The lost exec's id is free again.
        let mut s = c.exec(&req_id("echo reused", "running")).await.unwrap();
        assert_eq!(stdout_of(&collect(&mut s).await), b"reused\n");
    });
    // The CLI maps the lost exit to 255.
    let out = d.cli(&[
        "exec",
        "--detach",
        "--id",
        "again",
        "--",
        "echo $$ > pgid2; sleep 60",
    ]);
    assert!(out.status.success());
    let deadline = Instant::now() + STEP;
    while !d.path("pgid2").exists() || d.pids("pgid2").is_empty() {
        assert!(Instant::now() < deadline, "the command did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    let _orphan2 = KillGroupOnDrop(d.pids("pgid2")[0]);
    d.crash_and_restart();
    let out = d.cli(&["attach", "again"]);
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
}

// ---------------------------------------------------------------------------
// Exit after settle.

#[test]
fn files_written_by_a_command_are_in_the_first_fetch_after_its_exit() {
    let d = Served::start();
    run(async {
        let c = connect(&d.addr).await;
        let mut s = c
            .exec(&req(
                "mkdir -p out; i=0; while [ $i -lt 50 ]; do i=$((i+1)); echo $i > out/f$i; done; \
                 rm out/f7; printf last > out/f50",
            ))
            .await
            .unwrap();
        assert_eq!(exit_of(&collect(&mut s).await), 0);
        let (_, mut changes) = c.fetch_changes(&ChangeCursor::ZERO, &[]).await.unwrap();
        let mut files = std::collections::BTreeMap::new();
        loop {
            let batch = changes.next(4096).await.unwrap();
            if batch.is_empty() {
                break;
            }
            for e in batch {
                if let EntryState::File { size, .. } = e.state {
                    files.insert(e.path.as_str().to_owned(), size);
                }
            }
        }
        for i in 1..=50 {
            let path = format!("out/f{i}");
            let size = files.get(&path).copied();
            match i {
                7 => assert_eq!(size, None, "{path} was removed"),
                50 => assert_eq!(size, Some(4), "{path}"),
                _ => assert_eq!(size, Some(format!("{i}\n").len() as u64), "{path}"),
            }
        }
    });
    // The same through the CLI: `wsd exec` then `wsd pull`.
    let local = tempfile::tempdir().unwrap();
    let out = d.cli(&["exec", "--", "echo hello > made.txt"]);
    assert!(out.status.success());
    let out = d.cli(&["pull", local.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(local.path().join("made.txt")).unwrap(),
        b"hello\n"
    );
}

// ---------------------------------------------------------------------------
// The CLI.

#[test]
fn wsd_exec_streams_stdout_and_stderr_to_their_own_fds_and_exits_with_the_code() {
    let d = Served::start();
    let out = d.cli(&["exec", "--", "echo out; echo err >&2; echo more; exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(text(&out.stdout), "out\nmore\n");
    assert_eq!(text(&out.stderr), "err\n");
    // One word after `--` is a shell command line; --cwd and --env reach
    // it. (Several words are an argv: see wsd/tests/cli.rs.)
    std::fs::create_dir_all(d.path("sub/dir")).unwrap();
    let out = d.cli(&[
        "exec",
        "--cwd",
        "sub/dir",
        "--env",
        "X=1",
        "--",
        "echo $X $(pwd)",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("1 {}\n", d.path("sub/dir").display())
    );
    let out = d.cli(&["exec", "--cwd", "../outside", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("EINVAL"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn wsd_exec_detach_prints_the_id_and_attach_replays_or_resumes() {
    let d = Served::start();
    d.mkfifo("g1");
    d.mkfifo("g2");
    // One event per write: a, b (after g1), c (after g2), then the exit.
    let out = d.cli(&[
        "exec",
        "--detach",
        "--",
        "echo a; read x < g1; echo b >&2; read x < g2; echo c; exit 9",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let id = text(&out.stdout).trim().to_owned();
    assert_eq!(id.len(), 32, "{id:?}");
    // The command is still running: it waits at g1.
    open_gate(&d.path("g1"));
    let mut live = d.cli_spawn(&["attach", &id]);
    assert_eq!(live.next_line(), "a");
    open_gate(&d.path("g2"));
    assert_eq!(live.wait(), 9);
    assert_eq!(live.rest(), ["c"]);
    assert_eq!(live.stderr(), "b\n");

    let out = d.cli(&["attach", &id]);
    assert_eq!(out.status.code(), Some(9));
    assert_eq!(
        (text(&out.stdout), text(&out.stderr)),
        ("a\nc\n".into(), "b\n".into())
    );
    let out = d.cli(&["attach", &id, "--after", "1"]);
    assert_eq!(out.status.code(), Some(9));
    assert_eq!(
        (text(&out.stdout), text(&out.stderr)),
        ("c\n".into(), "b\n".into())
    );
    let out = d.cli(&["attach", &id, "--after", "2"]);
    assert_eq!(out.status.code(), Some(9));
    assert_eq!(
        (text(&out.stdout), text(&out.stderr)),
        ("c\n".into(), "".into())
    );
    // Nothing is left to tail on a finished exec: the CLI says so and
    // still exits with the command's code.
    let out = d.cli(&["attach", &id, "--tail"]);
    assert_eq!(out.status.code(), Some(9), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

#[test]
fn wsd_attach_tail_shows_only_output_from_after_it_attached() {
    let d = Served::start();
    d.mkfifo("gate");
    let out = d.cli(&[
        "exec",
        "--detach",
        "--id",
        "ticker",
        "--",
        "echo early; read x < gate; i=0; \
         while [ ! -e stop ] && [ $i -lt 3000 ]; do i=$((i+1)); echo \"tick $i\"; sleep 0.02; done; \
         echo end",
    ]);
    assert!(out.status.success());
    // Once a reader has seen "early" it was delivered, so a later tail
    // attach must not show it.
    let first_reader = d.cli_spawn(&["attach", "ticker"]);
    assert_eq!(first_reader.next_line(), "early");
    drop(first_reader);
    open_gate(&d.path("gate"));
    let mut tail = d.cli_spawn(&["attach", "ticker", "--tail"]);
    let first = tail.next_line();
    std::fs::write(d.path("stop"), b"").unwrap();
    assert_eq!(tail.wait(), 0);
    let mut got = vec![first];
    got.extend(tail.rest());
    assert_eq!(got.last().map(String::as_str), Some("end"), "{got:?}");
    assert!(!got.contains(&"early".to_owned()), "{got:?}");
    let ticks: Vec<u32> = got[..got.len() - 1]
        .iter()
        .map(|l| l.strip_prefix("tick ").expect(l).parse().unwrap())
        .collect();
    let start = ticks.first().copied().unwrap_or(0);
    assert_eq!(
        ticks,
        (start..start + ticks.len() as u32).collect::<Vec<_>>(),
        "tail skipped or repeated ticks"
    );
}

#[test]
fn ctrl_c_on_wsd_exec_kills_the_remote_command() {
    let d = Served::start();
    let mut exec = d.cli_spawn(&[
        "exec",
        "--",
        "echo $$ >> pids; sleep 60 & echo $! >> pids; echo ready; wait",
    ]);
    assert_eq!(exec.next_line(), "ready");
    let pids = d.pids("pids");
    exec.signal("INT");
    assert_eq!(exec.wait(), 143, "the remote command got SIGTERM");
    assert!(exec.stderr().contains("interrupted"));
    assert_all_dead(&pids);
}

#[test]
fn a_second_ctrl_c_detaches_and_the_daemon_still_escalates_to_sigkill() {
    let d = Served::start();
    // The whole group ignores SIGTERM.
    let mut exec = d.cli_spawn(&[
        "exec",
        "--id",
        "stubborn",
        "--",
        "trap '' TERM; echo $$ >> pids; sleep 60 & echo $! >> pids; echo ready; wait",
    ]);
    assert_eq!(exec.next_line(), "ready");
    let pids = d.pids("pids");
    exec.signal("INT");
    assert!(exec.next_err_line().contains("interrupted"));
    exec.signal("INT");
    assert_eq!(exec.wait(), 130, "detached by the second Ctrl-C");
    // The kill grace (5 s) later the daemon SIGKILLs the group.
    let out = d.cli(&["attach", "stubborn", "--after", "1"]);
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert_all_dead(&pids);
}

#[test]
fn ctrl_c_on_wsd_attach_only_detaches() {
    let d = Served::start();
    d.mkfifo("gate");
    let out = d.cli(&[
        "exec",
        "--detach",
        "--id",
        "watched",
        "--",
        "echo up; read x < gate; exit 6",
    ]);
    assert!(out.status.success());
    let mut watcher = d.cli_spawn(&["attach", "watched"]);
    assert_eq!(watcher.next_line(), "up");
    watcher.signal("INT");
    assert_eq!(watcher.wait(), 130);
    assert!(watcher.stderr().contains("detached"));
    // The command was left alone: it still waits at the gate.
    open_gate(&d.path("gate"));
    let out = d.cli(&["attach", "watched"]);
    assert_eq!(out.status.code(), Some(6));
    // Resuming at or past the exit reports the exit code too.
    let out = d.cli(&["attach", "watched", "--after", "2"]);
    assert_eq!(out.status.code(), Some(6), "{}", text(&out.stderr));
    assert!(out.stdout.is_empty());
}

#[test]
fn wsd_exec_stops_the_remote_command_when_its_own_stdout_closes() {
    let d = Served::start();
    let mut child = d
        .cli_command(&["exec", "--", "echo $$ >> pids; yes & echo $! >> pids; wait"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut some = [0u8; 64 * 1024];
    stdout.read_exact(&mut some).unwrap();
    assert!(some.starts_with(b"y\ny\n"));
    // As in `wsd exec -- yes | head`: the reader goes away.
    drop(stdout);
    let mut exec = CliChild {
        lines: mpsc::channel().1,
        err_lines: line_reader(child.stderr.take().unwrap()),
        child,
    };
    assert_eq!(exec.wait(), 141);
    assert!(exec.stderr().contains("sent TERM"));
    let deadline = Instant::now() + STEP;
    while d.pids("pids").len() < 2 {
        assert!(Instant::now() < deadline, "pids were not written");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_all_dead(&d.pids("pids"));
}

// ---------------------------------------------------------------------------
// Memory with a large output (WSD_SLOW_TESTS=1).

fn slow_tests() -> bool {
    std::env::var_os("WSD_SLOW_TESTS").is_some_and(|v| v == "1")
}

/// Peak resident set of `pid` (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .expect("VmHWM in /proc/PID/status");
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

const GIB: u64 = 1024 * 1024 * 1024;
/// Generous: the design bound is a few MiB per exec plus SQLite's caches.
const RSS_BOUND: u64 = 200 * 1024 * 1024;

#[test]
fn one_gib_of_output_keeps_daemon_memory_bounded_with_a_live_reader() {
    if !slow_tests() {
        eprintln!("skipped: set WSD_SLOW_TESTS=1");
        return;
    }
    let d = Served::start();
    let started = Instant::now();
    let (received, code) = run(async {
        let c = connect(&d.addr).await;
        let mut s = c.exec(&req("head -c 1073741824 /dev/zero")).await.unwrap();
        let (mut received, mut expected_seq) = (0u64, 1u64);
        loop {
            let e = next(&mut s).await.expect("ended before the exit");
            assert_eq!(e.seq, expected_seq);
            expected_seq += 1;
            match e.kind {
                ExecEventKind::Stdout(b) => {
                    assert!(b.iter().all(|&x| x == 0));
                    received += b.len() as u64;
                }
                ExecEventKind::Stderr(b) => panic!("stderr: {}", text(&b)),
                ExecEventKind::Exit(code) => return (received, code),
            }
        }
    });
    let secs = started.elapsed().as_secs_f64();
    let rss = peak_rss(d.pid());
    eprintln!(
        "1 GiB with a live reader: {:.0} MiB/s, daemon peak RSS {} MiB",
        GIB as f64 / secs / 1048576.0,
        rss / 1048576
    );
    assert_eq!((received, code), (GIB, 0));
    assert!(rss < RSS_BOUND, "daemon peak RSS {rss} bytes");
}

#[test]
fn one_gib_of_output_keeps_daemon_memory_bounded_with_no_reader() {
    if !slow_tests() {
        eprintln!("skipped: set WSD_SLOW_TESTS=1");
        return;
    }
    let d = Served::start();
    let started = Instant::now();
    let out = d.cli(&[
        "exec",
        "--detach",
        "--id",
        "big",
        "--",
        "head -c 1073741824 /dev/zero; echo $? > status",
    ]);
    assert!(out.status.success());
    // Nobody reads while the command runs; wait for it on the filesystem.
    let deadline = Instant::now() + Duration::from_secs(600);
    while !d.path("status").exists() {
        assert!(Instant::now() < deadline, "1 GiB did not finish");
        std::thread::sleep(Duration::from_millis(50));
    }
    let secs = started.elapsed().as_secs_f64();
    // The exit follows the settle; attach to it (the output was evicted
    // down to the per-exec cap, so resume near the end).
    let code = run(async {
        let c = connect(&d.addr).await;
        let mut s = c.get_exec("big", ResumeFrom::Tail).await.unwrap();
        let tail = collect(&mut s).await;
        match tail.last().map(|e| &e.kind) {
            Some(ExecEventKind::Exit(code)) => *code,
            _ => 0, // exited before the tail attached
        }
    });
    let rss = peak_rss(d.pid());
    eprintln!(
        "1 GiB with no reader: {:.0} MiB/s, daemon peak RSS {} MiB",
        GIB as f64 / secs / 1048576.0,
        rss / 1048576
    );
    assert_eq!(code, 0);
    assert_eq!(std::fs::read_to_string(d.path("status")).unwrap(), "0\n");
    assert!(rss < RSS_BOUND, "daemon peak RSS {rss} bytes");
}

#[test]
fn an_exec_stream_outlives_the_client_handle_it_came_from() {
    let d = Served::start();
    run(async {
        // The client handle is a temporary: only the stream is kept.
        let mut s = connect(&d.addr)
            .await
            .exec(&req("echo still here"))
            .await
            .unwrap();
        let events = collect(&mut s).await;
        assert_eq!(stdout_of(&events), b"still here\n");
        assert_eq!(exit_of(&events), 0);
        let mut s = connect(&d.addr)
            .await
            .get_exec(s.id(), ResumeFrom::Start)
            .await
            .unwrap();
        assert_eq!(collect(&mut s).await, events);
    });
}

#[test]
fn dropped_connections_free_their_subscriber_slots() {
    let d = Served::start();
    d.mkfifo("gate");
    run(async {
        let c = connect(&d.addr).await;
        let s = c
            .exec(&req_id("read x < gate; echo done", "slots"))
            .await
            .unwrap();
        // The exec's own stream is one subscriber; 15 more fit, then ELIMIT.
        let mut held = Vec::new();
        for _ in 0..15 {
            held.push(c.get_exec("slots", ResumeFrom::Tail).await.unwrap());
        }
        assert_eq!(
            code_of(c.get_exec("slots", ResumeFrom::Tail).await),
            ErrorCode::Limit
        );
        drop(held);
        drop(s);
        // Readers that come and go on their own connections do not leak
        // slots (a slot frees once the daemon sees the connection close).
        for _ in 0..40 {
            let deadline = Instant::now() + STEP;
            loop {
                let other = connect(&d.addr).await;
                match other.get_exec("slots", ResumeFrom::Tail).await {
                    Ok(stream) => {
                        drop((stream, other));
                        break;
                    }
                    Err(e) if e.code == ErrorCode::Limit && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => panic!("attaching: {e}"),
                }
            }
        }
        let mut last = c.get_exec("slots", ResumeFrom::Tail).await.unwrap();
        open_gate_async(&d.path("gate")).await;
        let events = collect(&mut last).await;
        assert_eq!(stdout_of(&events), b"done\n");
    });
}

#[test]
fn a_daemon_killed_with_sigkill_has_its_commands_killed_when_it_restarts() {
    let mut d = Served::start();
    let out = d.cli(&["exec", "--detach", "--id", "fam", "--", FAMILY]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut attach = d.cli_spawn(&["attach", "fam"]);
    assert_eq!(attach.next_line(), "ready");
    let pids = d.pids("pids");
    // Whatever this test asserts, nothing of the family outlives it.
    let _orphan = KillGroupOnDrop(pids[0]);
    d.crash_and_restart();
    assert_eq!(attach.wait(), 255, "{}", attach.stderr());
    assert_all_dead(&pids);

    // Its log ends with the lost exit, and a signal finds nothing to stop.
    let out = d.cli(&["attach", "fam"]);
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    let out = d.cli(&["kill", "fam"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ENOENT") && err.contains("not running"),
        "{err}"
    );
}

#[test]
fn killing_a_finished_exec_is_enoent_and_the_cli_fails() {
    let d = Served::start();
    let out = d.cli(&["exec", "--id", "quick", "--", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = d.cli(&["kill", "quick"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("ENOENT") && err.contains("not running"),
        "{err}"
    );
    run(async {
        let c = connect(&d.addr).await;
        assert_eq!(
            code_of(c.kill_exec("quick", ExecSignal::Term).await),
            ErrorCode::NotFound
        );
    });
}

// ---------------------------------------------------------------------------
// The `Send` handle (`wsd_client::WsdHandle`), from a multi-threaded runtime.

/// A multi-threaded runtime, as a gateway runs: no `LocalSet` anywhere.
fn run_multi_threaded<F: Future>(f: F) -> F::Output {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(STEP * 3, f)
            .await
            .expect("test timed out")
    })
}

/// The name the local store keeps a handle's daemon watermarks under.
const HANDLE_REMOTE: &str = "workspace-under-test";

async fn handle_to(d: &Served) -> wsd_client::WsdHandle {
    let opts = wsd_client::ClientOptions {
        peer: "gateway".into(),
        remote_name: Some(HANDLE_REMOTE.into()),
        ..Default::default()
    };
    wsd_client::WsdHandle::connect(d.addr.parse().unwrap(), opts)
        .await
        .unwrap()
}

/// Every event of a handle's exec, up to its end.
async fn collect_handle(events: &mut wsd_client::ExecEvents) -> Vec<ExecEvent> {
    let mut out = Vec::new();
    while let Some(e) = tokio::time::timeout(STEP, events.next())
        .await
        .expect("no event within STEP")
        .unwrap()
    {
        out.push(e);
    }
    out
}

#[test]
fn a_send_handle_pushes_runs_a_command_and_pulls_what_it_changed_from_any_thread() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let mut dofs = wsd_dofs::Dofs::open(local.path().join("local.db")).unwrap();
    dofs.write_file_with(
        &wsd_sync::SyncPath::new("src/in.txt").unwrap(),
        &b"input"[..],
        wsd_dofs::WriteOptions {
            create_parents: true,
            ..Default::default()
        },
    )
    .unwrap();
    let store = std::sync::Arc::new(std::sync::Mutex::new(dofs));
    run_multi_threaded(async {
        let handle = handle_to(&d).await;

        // From a spawned task: the handle and the store move across threads.
        let (h, s) = (handle.clone(), store.clone());
        let pushed = tokio::spawn(async move { h.push(s).await })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(pushed.sync.entries, 2, "src and src/in.txt: {pushed:?}");
        assert_eq!(std::fs::read(d.path("src/in.txt")).unwrap(), b"input");

        let mut events = handle
            .exec(req(
                "mkdir out && cat src/in.txt src/in.txt > out/twice.txt && echo made",
            ))
            .await
            .unwrap();
        let seen = collect_handle(&mut events).await;
        assert_eq!(exit_of(&seen), 0, "{seen:?}");
        assert_eq!(stdout_of(&seen), b"made\n");

        let pulled = handle.pull(store.clone()).await.unwrap();
        let file = pulled
            .applied
            .iter()
            .find(|e| e.path.as_str() == "out/twice.txt")
            .unwrap_or_else(|| panic!("the new file is reported: {pulled:?}"));
        assert_eq!(file.kind, Some(wsd_sync::Kind::File));
        assert_eq!(file.size, 10);
        use std::os::unix::fs::PermissionsExt;
        let on_disk = std::fs::metadata(d.path("out/twice.txt")).unwrap();
        assert_eq!(file.mode, on_disk.permissions().mode() & 0o7777);
        assert!(
            pulled
                .applied
                .iter()
                .any(|e| e.path.as_str() == "out" && e.kind == Some(wsd_sync::Kind::Dir)),
            "{pulled:?}"
        );
        assert!(
            !pulled
                .applied
                .iter()
                .any(|e| e.path.as_str() == "src/in.txt"),
            "our own push is not echoed back: {pulled:?}"
        );
        let got = store
            .lock()
            .unwrap()
            .read_file(&wsd_sync::SyncPath::new("out/twice.txt").unwrap())
            .unwrap();
        assert_eq!(got, b"inputinput");

        // Converged: a round both ways moves nothing, and the local store
        // keeps the watermarks under the configured name.
        let (pulled, pushed) = handle.sync(store.clone()).await.unwrap();
        assert!(pulled.applied.is_empty(), "{pulled:?}");
        assert_eq!(pushed.sync.entries, 0, "{pushed:?}");
        let wm = wsd_sync::Store::watermarks(&mut *store.lock().unwrap(), HANDLE_REMOTE).unwrap();
        assert_ne!(wm.push_cursor, ChangeCursor::ZERO);
        assert_ne!(wm.fetch_cursor, ChangeCursor::ZERO);
    });
}

#[test]
fn bytes_written_to_a_running_commands_stdin_come_back_through_cat_until_it_is_closed() {
    let d = Served::start();
    run_multi_threaded(async {
        let handle = handle_to(&d).await;
        let mut events = handle
            .exec(ExecRequest {
                command: "cat".into(),
                stdin: Some(b"first;".to_vec()),
                stdin_open: true,
                ..ExecRequest::default()
            })
            .await
            .unwrap();
        let id = events.id().to_owned();
        let payload = binary_payload();
        handle.write_stdin(&id, b"second;".to_vec()).await.unwrap();
        handle.write_stdin(&id, payload.clone()).await.unwrap();

        // Still running: cat is waiting for more until stdin closes.
        let mut seen = Vec::new();
        let want = [&b"first;second;"[..], &payload].concat();
        while stdout_of(&seen).len() < want.len() {
            let e = tokio::time::timeout(STEP, events.next())
                .await
                .expect("output within STEP")
                .unwrap()
                .expect("no exit before stdin closes");
            assert!(!matches!(e.kind, ExecEventKind::Exit(_)), "{e:?}");
            seen.push(e);
        }
        handle.close_stdin(&id).await.unwrap();
        handle
            .close_stdin(&id)
            .await
            .expect("closing twice is harmless");
        seen.extend(collect_handle(&mut events).await);
        assert_eq!(stdout_of(&seen), want);
        assert_eq!(exit_of(&seen), 0);

        // After the exit: closed for writes, still harmless to close.
        let err = handle.write_stdin(&id, b"late".to_vec()).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::Invalid, "{err}");
        handle.close_stdin(&id).await.unwrap();
    });
}

#[test]
fn stdin_writes_are_refused_with_typed_errors_naming_what_is_wrong() {
    let d = Served::start();
    run_multi_threaded(async {
        let handle = handle_to(&d).await;
        let err = handle.write_stdin("nope", b"x".to_vec()).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound, "{err}");
        let err = handle.close_stdin("nope").await.unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound, "{err}");

        // A command started without `stdin_open` has no stdin to write to.
        let gate = "gate";
        d.mkfifo(gate);
        let mut events = handle
            .exec(req_id(&format!("read x < {gate}"), "closed-stdin"))
            .await
            .unwrap();
        let err = handle
            .write_stdin("closed-stdin", b"x".to_vec())
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Invalid, "{err}");
        assert!(err.message.contains("closed-stdin"), "{err}");

        let too_big = vec![0u8; wsd_client::limits::MAX_STDIN_WRITE_BYTES + 1];
        let err = handle
            .write_stdin("closed-stdin", too_big)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Limit, "{err}");
        assert_eq!(err.subject.as_deref(), Some("stdin bytes per write"));

        open_gate_async(&d.path(gate)).await;
        assert_eq!(exit_of(&collect_handle(&mut events).await), 0);
    });
}

#[test]
fn a_send_handle_redials_after_the_daemon_restarts_and_its_next_push_lands() {
    let mut d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let dofs = wsd_dofs::Dofs::open(local.path().join("local.db")).unwrap();
    let store = std::sync::Arc::new(std::sync::Mutex::new(dofs));
    let put = |path: &str, bytes: &[u8]| {
        store
            .lock()
            .unwrap()
            .write_file_with(
                &wsd_sync::SyncPath::new(path).unwrap(),
                bytes,
                wsd_dofs::WriteOptions::default(),
            )
            .unwrap();
    };
    put("before", b"1");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let handle = rt.block_on(handle_to(&d));
    rt.block_on(handle.push(store.clone())).unwrap();

    d.crash_and_restart();
    put("after", b"2");
    let pushed = rt
        .block_on(async { tokio::time::timeout(STEP, handle.push(store.clone())).await })
        .expect("push after a restart hung")
        .unwrap();
    assert_eq!(pushed.sync.entries, 1, "only the new file: {pushed:?}");
    assert_eq!(std::fs::read(d.path("after")).unwrap(), b"2");
    assert_eq!(std::fs::read(d.path("before")).unwrap(), b"1");
    let mut events = rt.block_on(handle.exec(req("echo still here"))).unwrap();
    let seen = rt.block_on(collect_handle(&mut events));
    assert_eq!(stdout_of(&seen), b"still here\n");
}

/// A handle's event stream whose daemon freezes (SIGSTOP: the connection
/// stays open and silent, as on a cut link) ends with `ETIMEDOUT` once it
/// was quiet for the call deadline and a status call got no answer either,
/// instead of waiting forever; a command quiet for longer than the
/// deadline on a daemon that answers runs to its end, and the handle
/// works again once the daemon does.
#[test]
fn a_handle_stream_ends_at_the_deadline_when_its_daemon_freezes_not_when_its_command_is_quiet() {
    let d = Served::start();
    run_multi_threaded(async {
        let opts = wsd_client::ClientOptions {
            peer: "gateway".into(),
            call_timeout: Duration::from_secs(1),
            ..Default::default()
        };
        let handle = wsd_client::WsdHandle::connect(d.addr.parse().unwrap(), opts)
            .await
            .unwrap();
        let mut events = handle.exec(req("sleep 2.5; echo woke")).await.unwrap();
        let seen = collect_handle(&mut events).await;
        assert_eq!((exit_of(&seen), stdout_of(&seen)), (0, b"woke\n".to_vec()));

        let mut events = handle.exec(req("echo up; exec sleep 60")).await.unwrap();
        let first = tokio::time::timeout(STEP, events.next())
            .await
            .expect("no first event")
            .unwrap()
            .expect("an event");
        assert_eq!(first.kind, ExecEventKind::Stdout(b"up\n".to_vec()));
        let signal = |sig: &str| {
            let status = Command::new("kill")
                .args([sig, &d.pid().to_string()])
                .status()
                .unwrap();
            assert!(status.success(), "kill {sig}");
        };
        signal("-STOP");
        let err = tokio::time::timeout(STEP, events.next())
            .await
            .expect("the stream still waits on a frozen daemon")
            .unwrap_err();
        signal("-CONT");
        assert_eq!(err.code, ErrorCode::Timeout, "{err}");
        assert!(err.message.contains("status"), "names the probe: {err}");

        let mut events = handle.exec(req("echo back")).await.unwrap();
        assert_eq!(stdout_of(&collect_handle(&mut events).await), b"back\n");
    });
}

#[test]
fn a_send_handle_attaches_kills_with_a_typed_signal_and_disposes() {
    let d = Served::start();
    run_multi_threaded(async {
        let handle = handle_to(&d).await;
        let gate = "started";
        d.mkfifo(gate);
        let mut owner = handle
            .exec(req_id(
                &format!("echo up > {gate}; exec sleep 60"),
                "sleeper",
            ))
            .await
            .unwrap();
        // Wait until the command runs, then read its start from a second
        // reader on another task.
        let mut f = tokio::fs::File::open(d.path(gate)).await.unwrap();
        let mut line = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut f, &mut line)
            .await
            .unwrap();
        assert_eq!(line, "up\n");
        let h = handle.clone();
        let watcher = tokio::spawn(async move {
            let mut events = h.attach("sleeper", ResumeFrom::Start).await.unwrap();
            collect_handle(&mut events).await
        });

        handle
            .kill("sleeper", wsd_client::Signal::Kill)
            .await
            .unwrap();
        let killed = 128 + wsd_client::Signal::Kill.number();
        assert_eq!(exit_of(&collect_handle(&mut owner).await), killed);
        assert_eq!(exit_of(&watcher.await.unwrap()), killed);

        handle.dispose("sleeper").await.unwrap();
        let err = handle
            .attach("sleeper", ResumeFrom::Start)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound, "{err}");
        assert_eq!(err.subject.as_deref(), Some("sleeper"));
        let err = handle
            .kill("sleeper", wsd_client::Signal::Term)
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::NotFound, "{err}");
    });
}

#[test]
fn wsd_exec_with_stdin_passes_its_input_to_the_command_until_end_of_file() {
    let d = Served::start();
    let input = binary_payload().repeat(3);
    let mut child = d
        .cli_command(&["exec", "--stdin", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wsd");
    let mut stdin = child.stdin.take().unwrap();
    let writer = {
        let input = input.clone();
        std::thread::spawn(move || stdin.write_all(&input))
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = rx
        .recv_timeout(STEP)
        .expect("wsd exec --stdin did not finish")
        .unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, input);
}
