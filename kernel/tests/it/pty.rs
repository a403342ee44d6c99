//! `shell.pty.*` over the real WebSocket on workspaces backed by real `wsd`
//! children (sandboxed under bwrap where it is installed, as the kernel
//! runs them by default): typed input and output, resize, re-attaching
//! after a dropped socket with the missed output exactly once, close and
//! exit, and bad input that changes nothing.

use std::collections::VecDeque;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};

use crate::harness::{ALICE_PW, TestKernel, bwrap_available, new_workspace};

/// What [`Term::take`] read.
enum Took {
    Output,
    Lagged(u64),
    Exit,
}

/// A socket attached to one terminal: it keeps the signals it reads while
/// waiting for answers and the output bytes in order.
struct Term {
    c: GsvClient,
    pty_id: String,
    signals: VecDeque<Value>,
    /// Output received, from offset `base`.
    out: Vec<u8>,
    base: u64,
    exit: Option<Value>,
}

impl Term {
    fn new(c: GsvClient) -> Term {
        Term {
            c,
            pty_id: String::new(),
            signals: VecDeque::new(),
            out: Vec::new(),
            base: 0,
            exit: None,
        }
    }

    /// The answer's `data` (signals read meanwhile are kept).
    async fn call(&mut self, call: &str, args: Value) -> Value {
        let id = self.c.fresh_id();
        self.c.send_request(&id, call, args).await.unwrap();
        loop {
            let f = self.c.recv().await.unwrap();
            if f["type"] == "sig" {
                self.signals.push_back(f);
            } else if f["type"] == "res" && f["id"] == id.as_str() {
                assert_eq!(f["ok"], true, "{call}: {f}");
                return f["data"].clone();
            }
        }
    }

    async fn open(&mut self, args: Value) -> Value {
        let d = self.call("shell.pty.open", args).await;
        assert_eq!(d["ok"], true, "{d}");
        assert_eq!(d["status"], "running", "{d}");
        assert!(
            self.signals.is_empty(),
            "output came before the answer: {:?}",
            self.signals
        );
        self.pty_id = d["ptyId"].as_str().unwrap().to_owned();
        d
    }

    async fn attach(&mut self, pty_id: &str, after: u64) -> Value {
        let d = self
            .call("shell.pty.attach", json!({"ptyId": pty_id, "after": after}))
            .await;
        assert_eq!(d["ok"], true, "{d}");
        assert_eq!(d["offset"], after);
        self.pty_id = pty_id.to_owned();
        self.out.clear();
        self.base = after;
        d
    }

    async fn input(&mut self, text: &str) {
        let d = self
            .call(
                "shell.pty.input",
                json!({"ptyId": self.pty_id, "data": text}),
            )
            .await;
        assert_eq!(d["ok"], true, "{d}");
        assert_eq!(d["bytes"], text.len());
    }

    /// Takes one signal: output (appended), an exit, or a lag at an offset.
    async fn take(&mut self) -> Took {
        let s = match self.signals.pop_front() {
            Some(s) => s,
            None => loop {
                let f = self.c.recv().await.unwrap();
                if f["type"] == "sig" {
                    break f;
                }
            },
        };
        let p = &s["payload"];
        assert_eq!(p["ptyId"], self.pty_id.as_str(), "{s}");
        match s["signal"].as_str().unwrap() {
            "shell.pty.output" => {
                assert_eq!(
                    p["offset"].as_u64().unwrap(),
                    self.offset(),
                    "output offsets follow on without gap or overlap: {s}"
                );
                let bytes = STANDARD.decode(p["dataBase64"].as_str().unwrap()).unwrap();
                self.out.extend_from_slice(&bytes);
                Took::Output
            }
            "shell.pty.lagged" => Took::Lagged(p["offset"].as_u64().unwrap()),
            "shell.pty.exit" => {
                self.exit = Some(p.clone());
                Took::Exit
            }
            other => panic!("unexpected signal {other}: {s}"),
        }
    }

    /// Takes one signal, which must not be a lag (a test whose output is
    /// small).
    async fn pump(&mut self) {
        if let Took::Lagged(at) = self.take().await {
            panic!("lagged at {at}: {}", self.text());
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.out).into_owned()
    }

    /// Reads output until it holds `needle` (the client's own recv timeout
    /// bounds each wait).
    async fn until(&mut self, needle: &str) {
        while !self.text().contains(needle) {
            assert!(
                self.exit.is_none(),
                "exited before {needle:?}: {}",
                self.text()
            );
            self.pump().await;
        }
    }

    /// Reads until the exit, attaching again after each lag.
    async fn until_exit(&mut self) -> Value {
        while self.exit.is_none() {
            if let Took::Lagged(at) = self.take().await {
                self.reattach(at).await;
            }
        }
        self.exit.clone().unwrap()
    }

    /// Types `exit code` and checks the terminal exits with it.
    async fn exit_with(&mut self, code: i32) {
        self.input(&format!("exit {code}\n")).await;
        assert_eq!(self.until_exit().await["exitCode"], code);
    }

    /// Attaches again at `at`, where the kernel said this connection
    /// lagged (the output so far is dropped).
    async fn reattach(&mut self, at: u64) {
        assert_eq!(at, self.offset(), "a lag names the next offset");
        let id = self.pty_id.clone();
        self.attach(&id, at).await;
    }

    /// Reads until at least `len` output bytes are in.
    async fn read_bytes(&mut self, len: usize) {
        while self.out.len() < len {
            self.pump().await;
        }
    }

    /// Whether the output's last bytes hold `needle` (the output may be
    /// far too long to search whole after every chunk).
    fn tail_has(&self, needle: &[u8]) -> bool {
        let from = self
            .out
            .len()
            .saturating_sub(needle.len() + gsv_protocol::pty::MAX_OUTPUT_CHUNK);
        self.out[from..].windows(needle.len()).any(|w| w == needle)
    }

    /// Reads until the output holds `needle`, attaching again wherever
    /// the kernel says this connection lagged; all output from `base` on.
    async fn follow_to(&mut self, needle: &[u8]) -> Vec<u8> {
        let mut whole = Vec::new();
        while !self.tail_has(needle) {
            match self.take().await {
                Took::Output => {}
                Took::Lagged(at) => {
                    whole.extend_from_slice(&self.out);
                    self.reattach(at).await;
                }
                Took::Exit => panic!("exited before the marker"),
            }
        }
        whole.extend_from_slice(&self.out);
        whole
    }

    /// The offset just past the output received.
    fn offset(&self) -> u64 {
        self.base + self.out.len() as u64
    }
}

async fn alice_term(k: &TestKernel, client_id: &str) -> Term {
    Term::new(k.login_from(client_id, "alice", ALICE_PW).await)
}

/// Alice's socket `client_id` with a new terminal open in workspace `ws`.
async fn alice_open(k: &TestKernel, ws: &str, client_id: &str) -> Term {
    let mut t = alice_term(k, client_id).await;
    t.open(json!({"workspaceId": ws})).await;
    t
}

/// `{ok:false, code}` of a call.
async fn refused(t: &mut Term, call: &str, args: Value) -> String {
    let d = t.call(call, args).await;
    assert_eq!(d["ok"], false, "{call} should fail: {d}");
    assert!(d["error"].as_str().is_some_and(|e| !e.is_empty()), "{d}");
    d["code"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_terminal_echoes_typed_input_follows_a_resize_and_ends_on_close() {
    let sandboxed = bwrap_available();
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut t = alice_term(&k, "term").await;
    let d = t
        .open(json!({"workspaceId": ws, "cols": 80, "rows": 24}))
        .await;
    assert_eq!(d["workspaceId"], ws.as_str());
    // The sum shows only in the shell's answer, not in the echoed line.
    t.input("echo hi-$((40+2))\n").await;
    t.until("hi-42").await;
    t.input("stty size\n").await;
    t.until("24 80").await;
    let r = t
        .call(
            "shell.pty.resize",
            json!({"ptyId": t.pty_id, "cols": 100, "rows": 30}),
        )
        .await;
    assert_eq!(
        (r["cols"].as_u64(), r["rows"].as_u64()),
        (Some(100), Some(30))
    );
    t.input("stty size\n").await;
    t.until("30 100").await;
    if !sandboxed {
        // bwrap's fresh /dev has no entry for the host's pts.
        t.input("tty\n").await;
        t.until("/dev/pts/").await;
    }
    // What the terminal writes reaches the workspace once it exits.
    t.input("echo typed > made.txt; echo made-$((0+1))\n").await;
    t.until("made-1").await;
    let list = t.call("shell.pty.list", json!({})).await;
    let mine = &list["ptys"][0];
    assert_eq!(mine["ptyId"], t.pty_id.as_str(), "{list}");
    assert_eq!(mine["status"], "running");
    assert_eq!(
        (mine["cols"].as_u64(), mine["rows"].as_u64()),
        (Some(100), Some(30))
    );
    let c = t.call("shell.pty.close", json!({"ptyId": t.pty_id})).await;
    assert_eq!(c["ok"], true, "{c}");
    let exit = t.until_exit().await;
    assert_eq!(exit["exitCode"], 129, "SIGHUP ends the shell: {exit}");
    assert_eq!(exit["signal"], "HUP", "{exit}");
    // The pull follows the exit.
    let read = read_until(&mut a, &format!("/workspaces/{ws}/made.txt"), "1\ttyped").await;
    assert_eq!(read["content"], "1\ttyped", "{read}");
    let list = t.call("shell.pty.list", json!({})).await;
    assert_eq!(list["ptys"][0]["status"], "exited", "{list}");
    assert_eq!(list["ptys"][0]["exitCode"], 129, "{list}");
}

#[tokio::test]
async fn a_dropped_socket_reattaches_after_its_offset_and_gets_the_missed_output_once() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut t = alice_open(&k, &ws, "term-1").await;
    let pty = t.pty_id.clone();
    t.input("echo one-$((0+1))\n").await;
    t.until("one-1").await;
    let first = t.out.clone();
    let cut = t.offset();
    drop(t);

    // Typed from another connection while the first is gone.
    let mut other = alice_term(&k, "term-2").await;
    other.pty_id = pty.clone();
    other
        .call(
            "shell.pty.input",
            json!({"ptyId": pty, "data": "seq 1 300; echo two-$((1+1))\n"}),
        )
        .await;

    let mut back = alice_term(&k, "term-3").await;
    back.attach(&pty, cut).await;
    back.until("two-2").await;
    let missed = back.text();
    assert_eq!(missed.matches("two-2").count(), 1, "{missed}");
    assert!(
        !missed.contains("one-1"),
        "output before the offset came again: {missed}"
    );
    assert!(
        missed.contains("\n300\r\n") || missed.contains("300\r\n"),
        "{missed}"
    );

    // What the two attachments got, joined, is the terminal's output.
    let mut whole = alice_term(&k, "term-4").await;
    whole.attach(&pty, 0).await;
    let total = first.len() + back.out.len();
    whole.read_bytes(total).await;
    let mut joined = first.clone();
    joined.extend_from_slice(&back.out);
    assert_eq!(whole.out[..total], joined[..], "replay from 0 agrees");

    // Input typed on one attachment reaches every attached connection.
    back.exit_with(3).await;
    assert_eq!(whole.until_exit().await["exitCode"], 3);
}

#[tokio::test]
async fn bad_terminal_calls_get_typed_errors_and_change_nothing() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut t = alice_term(&k, "term").await;
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.open",
            json!({"workspaceId": ws, "cols": 0, "rows": 0})
        )
        .await,
        "invalid_argument"
    );
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.open",
            json!({"workspaceId": ws, "cols": 10000})
        )
        .await,
        "invalid_argument"
    );
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.input",
            json!({"ptyId": "pty_nope", "data": "x"})
        )
        .await,
        "not_found"
    );
    assert_eq!(
        refused(&mut t, "shell.pty.attach", json!({"ptyId": "pty_nope"})).await,
        "not_found"
    );
    t.open(json!({"workspaceId": ws})).await;
    let pty = t.pty_id.clone();
    let big = "x".repeat(gsv_protocol::pty::MAX_INPUT_BYTES + 1);
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.input",
            json!({"ptyId": pty, "data": big})
        )
        .await,
        "too_large"
    );
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.input",
            json!({"ptyId": pty, "dataBase64": "%%%not"})
        )
        .await,
        "invalid_argument"
    );
    assert_eq!(
        refused(&mut t, "shell.pty.input", json!({"ptyId": pty})).await,
        "invalid_argument"
    );
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.resize",
            json!({"ptyId": pty, "cols": 0, "rows": 0})
        )
        .await,
        "invalid_argument"
    );
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.resize",
            json!({"ptyId": pty, "cols": 10000, "rows": 24})
        )
        .await,
        "invalid_argument"
    );
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.close",
            json!({"ptyId": pty, "signal": "USR9"})
        )
        .await,
        "invalid_argument"
    );

    // Another user can neither see, attach to, type into nor close it.
    let mut bob = Term::new(k.bob().await);
    for (call, args) in [
        ("shell.pty.attach", json!({"ptyId": pty})),
        (
            "shell.pty.input",
            json!({"ptyId": pty, "data": "echo bob\n"}),
        ),
        (
            "shell.pty.resize",
            json!({"ptyId": pty, "cols": 10, "rows": 10}),
        ),
        ("shell.pty.close", json!({"ptyId": pty})),
    ] {
        assert_eq!(refused(&mut bob, call, args).await, "not_found", "{call}");
    }
    assert_eq!(
        bob.call("shell.pty.list", json!({})).await["ptys"],
        json!([])
    );

    // The terminal still works, bytes in base64 too.
    let line = STANDARD.encode("echo fine-$((2+3))\n");
    t.call("shell.pty.input", json!({"ptyId": pty, "dataBase64": line}))
        .await;
    t.until("fine-5").await;
    assert!(!t.text().contains("bob"), "{}", t.text());
    t.exit_with(7).await;
    assert_eq!(
        refused(
            &mut t,
            "shell.pty.input",
            json!({"ptyId": pty, "data": "x"})
        )
        .await,
        "closed"
    );
}

#[tokio::test]
async fn a_running_terminal_keeps_its_workspaces_wsd_from_being_stopped_as_idle() {
    let k = TestKernel::with_users_tuned(|c| {
        c.wsd_idle_stop = std::time::Duration::from_millis(200);
    })
    .await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut t = alice_open(&k, &ws, "term").await;
    // Several idle-stop periods with nothing typed.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    t.input("echo alive-$((1+1))\n").await;
    t.until("alive-2").await;
    t.exit_with(0).await;
}

/// Reads workspace file `path` until its content is `want` (bounded: 300
/// reads 100 ms apart); the last answer.
async fn read_until(c: &mut GsvClient, path: &str, want: &str) -> Value {
    let mut read = Value::Null;
    for _ in 0..300 {
        read = c.call("fs.read", json!({"path": path})).await.unwrap();
        if read["content"] == want {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    read
}

#[tokio::test]
async fn what_a_terminal_writes_reaches_fs_read_while_it_is_open_and_fs_write_reaches_it() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut t = alice_open(&k, &ws, "term").await;
    t.input("echo hi > f; echo wrote-$((1+1))\n").await;
    t.until("wrote-2").await;
    let read = read_until(&mut a, &format!("/workspaces/{ws}/f"), "1\thi").await;
    assert_eq!(read["content"], "1\thi", "{read}");
    let list = t.call("shell.pty.list", json!({})).await;
    assert_eq!(list["ptys"][0]["status"], "running", "still open: {list}");

    // An fs.write while the terminal is open reaches it without a command
    // ending in between.
    let w = a
        .call(
            "fs.write",
            json!({"path": format!("/workspaces/{ws}/g"), "content": "from-dofs"}),
        )
        .await
        .unwrap();
    assert_eq!(w["ok"], true, "{w}");
    let mut seen = false;
    for n in 0..300 {
        t.input(&format!("cat g 2>/dev/null; echo seen-$(({n}+0))\n"))
            .await;
        t.until(&format!("seen-{n}\r")).await;
        if t.text().contains("from-dofs") {
            seen = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        seen,
        "the terminal never saw the written file: {}",
        t.text()
    );
    t.exit_with(0).await;
}

#[tokio::test]
async fn a_snapshot_restore_while_a_terminal_is_open_is_refused() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let path = format!("/workspaces/{ws}/f");
    a.call("fs.write", json!({"path": path, "content": "v1"}))
        .await
        .unwrap();
    let snap = a
        .call("workspace.snapshot.create", json!({"workspaceId": ws}))
        .await
        .unwrap();
    let sid = snap["snapshotId"].as_str().unwrap().to_owned();
    a.call("fs.write", json!({"path": path, "content": "v2"}))
        .await
        .unwrap();
    let mut t = alice_open(&k, &ws, "term").await;
    let r = a
        .call("workspace.snapshot.restore", json!({"snapshotId": sid}))
        .await
        .unwrap();
    assert_eq!(r["ok"], false, "{r}");
    assert_eq!(r["code"], "EBUSY", "{r}");
    assert!(r["error"].as_str().unwrap().contains("terminal"), "{r}");
    let read = a.call("fs.read", json!({"path": path})).await.unwrap();
    assert_eq!(read["content"], "1\tv2", "nothing changed: {read}");

    t.exit_with(0).await;
    // The exit signal may come before the kernel has recorded the exit.
    let mut r = Value::Null;
    for _ in 0..300 {
        r = a
            .call("workspace.snapshot.restore", json!({"snapshotId": sid}))
            .await
            .unwrap();
        if r["code"] != "EBUSY" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_ne!(r["ok"], false, "{r}");
    let read = a.call("fs.read", json!({"path": path})).await.unwrap();
    assert_eq!(read["content"], "1\tv1", "{read}");
}

/// The output up to and including the first `needle`.
fn through<'a>(out: &'a [u8], needle: &[u8]) -> &'a [u8] {
    let at = out
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("the marker is there");
    &out[..at + needle.len()]
}

#[tokio::test]
async fn a_reader_that_stops_reading_lags_alone_and_resumes_without_loss() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    let mut fast = alice_open(&k, &ws, "term-fast").await;
    let pty = fast.pty_id.clone();
    // A small receive buffer: the kernel's queue for this socket fills
    // early in the flood, when a delivery that held its wsd subscription
    // unread would stall the terminal for everyone.
    let mut slow = Term::new(
        k.login_small_buffer("term-slow", "alice", ALICE_PW, 16 * 1024)
            .await,
    );
    slow.attach(&pty, 0).await;
    // 10 MB: far more than a socket that reads nothing buffers (its
    // connection's queue of 64 frames and the socket buffers), less than
    // wsd keeps of a terminal (16 MiB).
    fast.input("head -c 10000000 /dev/zero | tr '\\0' x; echo; echo end-$((2+3))\n")
        .await;
    // The slow socket reads nothing meanwhile: the terminal and the other
    // attachment go on to the end, and the terminal still answers.
    let all = fast.follow_to(b"end-5").await;
    let all = through(&all, b"end-5").to_vec();
    fast.input("echo alive-$((1+1))\n").await;
    fast.follow_to(b"alive-2").await;

    // Only now does the slow socket read: what was queued for it, then
    // the lag at the offset it got to.
    let lagged_at = loop {
        match slow.take().await {
            Took::Output => {}
            Took::Lagged(at) => break at,
            Took::Exit => panic!("the terminal exited"),
        }
    };
    assert_eq!(lagged_at, slow.offset(), "the lag names the next offset");
    assert!(
        lagged_at < all.len() as u64,
        "it lagged before the end ({lagged_at} of {})",
        all.len()
    );
    let mut joined = slow.out.clone();
    slow.attach(&pty, lagged_at).await;
    joined.extend(slow.follow_to(b"end-5").await);
    assert_eq!(
        through(&joined, b"end-5"),
        &all[..],
        "the output before the lag and after the re-attach is the whole"
    );
    fast.exit_with(0).await;
    assert_eq!(slow.until_exit().await["exitCode"], 0);
}

/// After a kernel restart, for a terminal running `seq 1 100000; echo
/// end-7` whose output before it was `first` (read to offset `cut`):
/// attaches `back` after `cut` and `whole` from the start, and checks that
/// `first` and what `back` got join into `whole`'s replay, byte for byte,
/// with all of seq's output. The joined output, through `end-7`.
async fn rejoined_after_restart(
    pty: &str,
    first: &[u8],
    cut: u64,
    back: &mut Term,
    mut whole: Term,
) -> Vec<u8> {
    back.attach(pty, cut).await;
    let mut joined = first.to_vec();
    joined.extend_from_slice(&back.follow_to(b"end-7").await);
    let joined = through(&joined, b"end-7").to_vec();
    whole.attach(pty, 0).await;
    let all = whole.follow_to(b"end-7").await;
    assert_eq!(
        through(&all, b"end-7"),
        &joined[..],
        "the output before the restart and after it is the whole, byte for byte"
    );
    let seq: String = (1..=100000).map(|n| format!("{n}\r\n")).collect();
    assert!(
        String::from_utf8_lossy(&joined).contains(&seq),
        "seq's output is all there"
    );
    joined
}

/// A `wsd serve` of the test's own (a remote backend, which a kernel
/// restart leaves running): the child, its socket and its token file.
async fn remote_wsd(
    dir: &std::path::Path,
) -> (
    tokio::process::Child,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let token = dir.join("token");
    std::fs::write(&token, "remote-secret-token").unwrap();
    let sock = dir.join("wsd.sock");
    let mut command = tokio::process::Command::new(crate::harness::wsd_bin());
    command.arg("serve");
    if bwrap_available() {
        command.arg("--sandbox");
    }
    let child = command
        .arg("--root")
        .arg(dir.join("root"))
        .arg("--state")
        .arg(dir.join("state"))
        .arg("--listen")
        .arg(format!("unix:{}", sock.display()))
        .arg("--token-file")
        .arg(&token)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    for _ in 0..500 {
        if tokio::net::UnixStream::connect(&sock).await.is_ok() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    (child, sock, token)
}

const ROOT_PW: &str = "root-password";

async fn root_term(k: &TestKernel, client_id: &str) -> Term {
    Term::new(k.login_from(client_id, "root", ROOT_PW).await)
}

#[tokio::test]
async fn a_terminal_on_a_wsd_that_outlives_the_kernel_is_attached_again_after_a_restart() {
    let k = TestKernel::with_users().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut wsd, sock, token) = remote_wsd(dir.path()).await;
    let mut root = k.login("root", ROOT_PW).await;
    let d = root
        .call(
            "sys.workspace.create",
            json!({"backend": {"kind": "remote", "address": format!("unix:{}", sock.display()), "tokenFile": token}}),
        )
        .await
        .unwrap();
    let ws = d["workspace"]["workspaceId"].as_str().unwrap().to_owned();
    root.close().await;
    let mut t = root_term(&k, "term-1").await;
    t.open(json!({"workspaceId": ws})).await;
    let pty = t.pty_id.clone();
    // More than two checkpoints of output (256 KiB each): the restarted
    // kernel serves offsets from the index the first one saved.
    t.input("seq 1 100000; echo end-$((3+4))\n").await;
    let first = t.follow_to(b"\n5000\r\n").await;
    let cut = t.offset();
    assert_eq!(cut, first.len() as u64);
    t.c.close().await;

    let k = k.stop().await.start().await;
    let mut back = root_term(&k, "term-2").await;
    let joined =
        rejoined_after_restart(&pty, &first, cut, &mut back, root_term(&k, "term-3").await).await;
    let joined = &joined[..];
    // An offset past the first checkpoints replays from the saved index.
    let mid = 300_000u64;
    let mut part = root_term(&k, "term-4").await;
    part.attach(&pty, mid).await;
    let tail = part.follow_to(b"end-7").await;
    assert_eq!(through(&tail, b"end-7"), &joined[mid as usize..]);
    // It still takes input and reports its exit.
    back.input("exit 5\n").await;
    let exit = back.until_exit().await;
    assert_eq!(exit["exitCode"], 5, "{exit}");
    let _ = wsd.kill().await;
}

#[tokio::test]
async fn a_terminal_on_a_local_wsd_goes_on_across_a_graceful_restart() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    a.close().await;
    let mut t = alice_open(&k, &ws, "term-1").await;
    let pty = t.pty_id.clone();
    t.input("echo shell-$$; seq 1 100000; echo end-$((3+4))\n")
        .await;
    let first = t.follow_to(b"\n5000\r\n").await;
    let cut = t.offset();
    let shell = number_after(&t.text(), "shell-");
    let wsd = k.kernel.workspaces().local_pid(&ws).await.unwrap() as i32;
    t.c.close().await;

    // A graceful shutdown leaves the wsd the terminal runs in; the next
    // kernel adopts it.
    let k = k.stop().await;
    assert!(
        running(wsd),
        "the wsd of a running terminal outlives the shutdown"
    );
    let k = k.start().await;
    let mut back = alice_term(&k, "term-2").await;
    rejoined_after_restart(&pty, &first, cut, &mut back, alice_term(&k, "term-3").await).await;
    back.input("echo shell-$$\n").await;
    back.until(&format!("shell-{shell}")).await;
    assert_eq!(
        k.kernel.workspaces().local_pid(&ws).await,
        Some(wsd as u32),
        "the same wsd, adopted, not a new one"
    );
    back.input("exit 3\n").await;
    assert_eq!(back.until_exit().await["exitCode"], 3);

    // With no terminal running any more, a shutdown stops it.
    let _k = k.stop().await;
    assert!(!running(wsd), "the adopted wsd {wsd} was left running");
}

#[tokio::test]
async fn a_terminal_whose_local_wsd_did_not_survive_a_restart_answers_closed() {
    let k = TestKernel::with_users().await;
    let mut a = k.alice().await;
    let ws = new_workspace(&mut a).await;
    a.close().await;
    let mut t = alice_open(&k, &ws, "term-1").await;
    let pty = t.pty_id.clone();
    t.input("echo before-$((1+1))\n").await;
    t.until("before-2").await;
    let wsd = k.kernel.workspaces().local_pid(&ws).await.unwrap() as i32;
    t.c.close().await;

    let k = k.stop().await;
    // The wsd left for the next kernel dies before it starts.
    let pid = rustix::process::Pid::from_raw(wsd).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
    for _ in 0..500 {
        if !running(wsd) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(!running(wsd));
    let k = k.start().await;
    let mut back = alice_term(&k, "term-2").await;
    for (call, args) in [
        ("shell.pty.attach", json!({"ptyId": pty, "after": 0})),
        ("shell.pty.input", json!({"ptyId": pty, "data": "x"})),
    ] {
        let d = back.call(call, args).await;
        assert_eq!(d["ok"], false, "{call}: {d}");
        assert_eq!(d["code"], "closed", "{call}: {d}");
        assert!(
            d["error"].as_str().unwrap().contains("restart"),
            "{call}: {d}"
        );
    }
    // A new terminal in the same workspace works.
    back.open(json!({"workspaceId": ws})).await;
    back.input("echo after-$((1+1))\n").await;
    back.until("after-2").await;
    back.exit_with(0).await;
}

/// Whether process `pid` runs (a zombie does not).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        !stat
            .rsplit_once(')')
            .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
    })
}

/// The number printed after `tag` (e.g. `shell-1234`) in `text`.
fn number_after(text: &str, tag: &str) -> u64 {
    text.match_indices(tag)
        .find_map(|(at, _)| {
            let digits: String = text[at + tag.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            digits.parse().ok()
        })
        .unwrap_or_else(|| panic!("no number after {tag:?} in {text}"))
}

async fn served_alice(s: &crate::cli::Served, client_id: &str) -> Term {
    let mut c = GsvClient::connect(&s.url).await.unwrap();
    c.timeout = std::time::Duration::from_secs(30);
    let auth = json!({"username": "alice", "password": "alice-password"});
    c.call(
        "sys.connect",
        gsv_kernel::client::connect_args(client_id, "user", auth),
    )
    .await
    .unwrap();
    Term::new(c)
}

#[tokio::test]
async fn a_terminal_on_a_local_wsd_goes_on_after_the_kernel_is_killed_and_restarted() {
    use crate::cli::{gsv, serve, serve_in};
    let mut s = serve();
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    let (ok, ws) = gsv(&s, &["workspace", "create"]);
    assert!(ok, "{ws}");
    let ws = ws.trim().to_owned();
    let mut t = served_alice(&s, "term-1").await;
    t.open(json!({"workspaceId": ws})).await;
    let pty = t.pty_id.clone();
    t.input("echo shell-$$; echo before-$((1+1))\n").await;
    t.until("before-2").await;
    let shell = number_after(&t.text(), "shell-");
    let before = t.out.clone();
    let pid_file = s._dir.path().join(format!("data/workspaces/{ws}/wsd.pid"));
    let wsd: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // A failed assertion leaves no daemon behind.
    let _children = crate::harness::LeftoverChildren(s._dir.path().join("data"));

    // A crash: nothing stops the kernel's wsd child.
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert!(running(wsd), "the wsd outlives its kernel");
    let dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    let s2 = serve_in(dir);
    let mut back = served_alice(&s2, "term-2").await;
    back.attach(&pty, 0).await;
    back.read_bytes(before.len()).await;
    assert_eq!(
        back.out[..before.len()],
        before[..],
        "the replay is the output from before the crash"
    );
    back.input("echo shell-$$; echo after-$((2+2))\n").await;
    back.until("after-4").await;
    let after = String::from_utf8_lossy(&back.out[before.len()..]).into_owned();
    assert_eq!(number_after(&after, "shell-"), shell, "the same shell");
    let adopted: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(adopted, wsd, "the same wsd, adopted, not a new one");
    assert!(running(wsd));
    back.exit_with(4).await;

    // A graceful shutdown stops the adopted wsd too.
    drop(s2);
    let mut stopped = false;
    for _ in 0..1000 {
        if !running(wsd) {
            stopped = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert!(stopped, "the adopted wsd {wsd} was left running");
}
