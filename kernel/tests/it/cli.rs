//! The `gsv` binary: `serve` plus the user CLI against it.

use std::io::{BufRead, BufReader, Write as _};
use std::process::{Child, Command, Stdio};

use crate::harness::wsd_bin;

/// `gsv serve` on a free port; killed when dropped.
pub(crate) struct Served {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        // SIGTERM: the kernel stops its wsd children on the way out (a
        // SIGKILL would orphan them), except those a terminal runs in,
        // which it leaves for a next kernel: killed below.
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg(self.child.id().to_string())
                .status();
            let exited = (0..500).any(|_| {
                std::thread::sleep(std::time::Duration::from_millis(10));
                matches!(self.child.try_wait(), Ok(Some(_)))
            });
            if !exited {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
        crate::harness::kill_leftover_children(&self._dir.path().join("data"));
    }
}

pub(crate) fn serve() -> Served {
    serve_in(tempfile::tempdir().unwrap())
}

pub(crate) fn serve_in(dir: tempfile::TempDir) -> Served {
    serve_with(dir, &[])
}

fn serve_with(dir: tempfile::TempDir, extra: &[&str]) -> Served {
    let listen: &[&str] = if extra.contains(&"--listen") {
        &[]
    } else {
        &["--listen", "127.0.0.1:0"]
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_gsv"))
        .arg("serve")
        .args(listen)
        .args(extra)
        .arg("--data")
        .arg(dir.path().join("data"))
        .arg("--wsd-bin")
        .arg(wsd_bin())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .expect(&line)
        .to_owned();
    Served {
        child,
        url: format!("ws://{addr}/ws"),
        _dir: dir,
    }
}

pub(crate) fn gsv(s: &Served, args: &[&str]) -> (bool, String) {
    let (ok, out, _) = gsv_err(s, args);
    (ok, out)
}

/// `gsv` against `s` as alice, with a client config directory of the
/// test's own (never the user's).
fn gsv_cmd(s: &Served) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gsv"));
    c.env("GSV_URL", &s.url)
        .env("GSV_USER", "alice")
        .env("GSV_PASSWORD", "alice-password")
        .env("XDG_CONFIG_HOME", s._dir.path().join("config"))
        .env_remove("GSV_TOKEN");
    c
}

/// [`gsv`] with its stderr too.
fn gsv_err(s: &Served, args: &[&str]) -> (bool, String, String) {
    let out = gsv_cmd(s).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn the_cli_sets_up_creates_a_workspace_writes_runs_and_reads_back() {
    let s = serve();
    let (ok, out) = gsv(
        &s,
        &[
            "call",
            "sys.setup",
            r#"{"username":"alice","password":"alice-password"}"#,
        ],
    );
    assert!(ok, "{out}");
    let (ok, ws) = gsv(&s, &["workspace", "create", "--label", "demo"]);
    assert!(ok);
    let ws = ws.trim().to_owned();
    assert!(ws.starts_with("ws_"), "{ws}");
    let (_, list) = gsv(&s, &["workspace", "list"]);
    assert!(list.contains(&ws) && list.contains("demo"), "{list}");
    let args = format!(r#"{{"path":"/workspaces/{ws}/hello.txt","content":"hi from the cli\n"}}"#);
    assert!(gsv(&s, &["call", "fs.write", &args]).0);
    let (ok, out) = gsv(
        &s,
        &["exec", &ws, "--", "cat hello.txt && echo ran > out.txt"],
    );
    assert!(ok, "{out}");
    assert_eq!(out, "hi from the cli\n");
    let args = format!(r#"{{"path":"/workspaces/{ws}/out.txt"}}"#);
    let (ok, out) = gsv(&s, &["call", "fs.read", &args]);
    assert!(ok);
    assert!(out.contains("1\\tran"), "{out}");
    let (ok, out) = gsv(&s, &["exec", &ws, "--", "exit", "7"]);
    assert!(!ok, "a failing command fails the CLI: {out}");
    let (ok, out) = gsv(&s, &["call", "no.such.call"]);
    assert!(!ok && out.contains("403"), "{out}");
}

#[test]
fn a_kernel_restarted_after_sigkill_stops_the_wsd_its_predecessor_left() {
    let mut s = serve();
    gsv(
        &s,
        &[
            "call",
            "sys.setup",
            r#"{"username":"alice","password":"alice-password"}"#,
        ],
    );
    let (_, ws) = gsv(&s, &["workspace", "create"]);
    let ws = ws.trim().to_owned();
    assert!(gsv(&s, &["exec", &ws, "--", "true"]).0);
    let pid_file = s._dir.path().join(format!("data/workspaces/{ws}/wsd.pid"));
    let old: u32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert!(
        std::path::Path::new(&format!("/proc/{old}")).exists(),
        "the orphan lives on"
    );
    // Take the data dir over to a new kernel (the old handle's Drop then
    // has nothing left to stop).
    let dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    let s2 = serve_in(dir);
    assert!(gsv(&s2, &["exec", &ws, "--", "true"]).0);
    let mut gone = false;
    for _ in 0..500 {
        let stat = std::fs::read_to_string(format!("/proc/{old}/stat")).unwrap_or_default();
        // Gone, or a zombie waiting for init to reap it.
        if stat.is_empty() || stat.contains(") Z ") {
            gone = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(gone, "the leftover wsd {old} was not stopped");
}

#[test]
fn a_reader_that_closed_its_pipe_does_not_make_gsv_call_panic() {
    let s = serve();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let status = Command::new(env!("CARGO_BIN_EXE_gsv"))
        .args([
            "call",
            "sys.setup",
            r#"{"username":"alice","password":"alice-password"}"#,
        ])
        .env("GSV_URL", &s.url)
        .env("XDG_CONFIG_HOME", s._dir.path().join("config"))
        .env_remove("GSV_TOKEN")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(status.status.success(), "the call itself worked: {stderr}");
}

/// A set-up kernel (exec answers `running` after 250 ms) and a workspace.
fn served_workspace() -> (Served, String) {
    let s = serve_with(tempfile::tempdir().unwrap(), &["--exec-wait-ms", "250"]);
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    let (ok, ws) = gsv(&s, &["workspace", "create"]);
    assert!(ok, "{ws}");
    let ws = ws.trim().to_owned();
    (s, ws)
}

#[test]
fn a_command_that_outlives_the_first_answer_has_each_line_printed_once() {
    let (s, ws) = served_workspace();
    let (ok, out) = gsv(
        &s,
        &[
            "exec",
            &ws,
            "--",
            "for i in 1 2 3 4 5; do echo n$i; sleep 0.3; done",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(out, "n1\nn2\nn3\nn4\nn5\n");
}

#[test]
fn several_words_after_the_dashes_are_an_argv_and_one_word_is_a_shell_line() {
    let (s, ws) = served_workspace();
    let (ok, out) = gsv(
        &s,
        &["exec", &ws, "--", "sh", "-c", r#"echo "a b" | wc -w"#],
    );
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "2", "the -c script reached sh as one word");
    let (ok, out) = gsv(&s, &["exec", &ws, "--", "printf", "%s|", "a b", "$HOME"]);
    assert!(ok, "{out}");
    assert_eq!(out, "a b|$HOME|", "each word is quoted, none expanded");
    let (ok, out) = gsv(&s, &["exec", &ws, "--", "echo one | tr o O"]);
    assert!(ok, "{out}");
    assert_eq!(out, "One\n");
}

#[test]
fn the_commands_stderr_comes_out_on_stderr_each_line_once() {
    let (s, ws) = served_workspace();
    let (ok, out, err) = gsv_err(
        &s,
        &[
            "exec",
            &ws,
            "--",
            "for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.3; done",
        ],
    );
    assert!(ok, "{out} {err}");
    assert_eq!(out, "o1\no2\no3\n");
    assert_eq!(err, "e1\ne2\ne3\n");
}

#[test]
fn the_cli_adds_lists_runs_and_removes_schedules_and_notifies() {
    let s = serve();
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);

    let (ok, id) = gsv(
        &s,
        &[
            "sched", "add", "nightly", "--every", "1h", "--prompt", "report",
        ],
    );
    assert!(ok, "{id}");
    let id = id.trim().to_owned();
    let (ok, list) = gsv(&s, &["sched", "list"]);
    assert!(ok);
    let row: Vec<&str> = list.lines().next().unwrap().split('\t').collect();
    assert_eq!(row[0], id);
    assert_eq!(
        (row[1], row[3], row[4], row[5]),
        ("on", "-", "0", "nightly")
    );
    assert_eq!(row[6], "every 3600000ms");
    let (_, json) = gsv(&s, &["sched", "list", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["count"], 1);
    assert_eq!(v["schedules"][0]["target"]["prompt"], "report");

    let (ok, ran) = gsv(&s, &["sched", "run", &id, "--force"]);
    assert!(ok, "{ran}");
    assert!(
        ran.starts_with(&format!("{id}\tok\tspawned process proc:")),
        "{ran}"
    );

    let (ok, _, err) = gsv_err(
        &s,
        &[
            "sched",
            "add",
            "bad",
            "--cron",
            "0 0 12 * * *",
            "--prompt",
            "x",
        ],
    );
    assert!(!ok);
    assert!(err.contains("five fields"), "{err}");
    let (ok, _, err) = gsv_err(
        &s,
        &["sched", "add", "fast", "--every", "500ms", "--prompt", "x"],
    );
    assert!(!ok && err.contains("everyMs"), "{err}");

    assert!(gsv(&s, &["sched", "rm", &id]).0);
    let (ok, _, err) = gsv_err(&s, &["sched", "rm", &id]);
    assert!(!ok && err.contains("no schedule"), "{err}");
    assert_eq!(gsv(&s, &["sched", "list"]).1, "");

    let (ok, nid) = gsv(
        &s,
        &[
            "notify",
            "Deploy done",
            "--level",
            "success",
            "--ttl",
            "10m",
        ],
    );
    assert!(ok, "{nid}");
    let nid = nid.trim().to_owned();
    let (_, list) = gsv(&s, &["notifications"]);
    let row: Vec<&str> = list.lines().next().unwrap().split('\t').collect();
    assert_eq!(row[0], nid);
    assert_eq!(
        (row[2], row[3], row[4]),
        ("success", "unread", "Deploy done")
    );
    assert!(gsv(&s, &["notifications", "--read", &nid]).0);
    assert_eq!(gsv(&s, &["notifications", "--unread"]).1, "");
    let (_, json) = gsv(&s, &["notifications", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["notifications"][0]["notificationId"], nid.as_str());
    assert!(v["notifications"][0]["readAt"].is_i64());
    let (ok, _, err) = gsv_err(&s, &["notifications", "--dismiss", "nope"]);
    assert!(!ok && err.contains("no notification"), "{err}");
}

#[test]
fn the_cli_lists_compacts_and_forks_the_home_process_conversations() {
    let s = serve();
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    // No model is configured: each send leaves the message and a failed
    // run's system message in the home process's `default` conversation.
    for (n, m) in ["one", "two"].into_iter().enumerate() {
        let args = format!(r#"{{"message":"{m}"}}"#);
        // Sent while the last run is ending, it queues and runs next.
        assert!(gsv(&s, &["call", "proc.send", &args]).0);
        let done = (0..200).any(|_| {
            let (_, out) = gsv(&s, &["call", "proc.history", "{}"]);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            let msgs = v["data"]["messages"].as_array().unwrap().clone();
            if msgs.len() == 2 * (n + 1) && msgs.last().unwrap()["role"] == "system" {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            false
        });
        assert!(done, "the run of {m:?} ended");
    }
    let (ok, list) = gsv(&s, &["proc", "conversations"]);
    assert!(ok, "{list}");
    assert_eq!(list, "default\topen\t0\t4\t\n");
    let (ok, out) = gsv(
        &s,
        &[
            "proc",
            "compact",
            "--keep-last",
            "1",
            "--summary",
            "earlier: one, two",
        ],
    );
    assert!(ok, "{out}");
    let cols: Vec<&str> = out.trim().split('\t').collect();
    assert!(cols[0].starts_with("seg_"), "{out}");
    assert_eq!(cols[1], "3");
    assert!(cols[2].starts_with("/var/sessions/alice/init-"), "{out}");
    let (ok, out) = gsv(&s, &["proc", "fork", "--segment", cols[0], "--to", "copy"]);
    assert!(ok, "{out}");
    assert_eq!(out, "copy\t4\n");
    let (_, json) = gsv(&s, &["proc", "conversations", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["conversations"].as_array().unwrap().len(), 2);
    let (ok, _, err) = gsv_err(&s, &["proc", "fork"]);
    assert!(!ok);
    assert!(err.contains("--segment"), "{err}");
}

/// Runs `gsv` with `stdin` as its input; (exit code, stdout, stderr).
fn gsv_with_input(s: &Served, args: &[&str], stdin: &str) -> (Option<i32>, String, String) {
    let mut child = gsv_cmd(s)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[test]
fn exec_dash_i_streams_our_stdin_and_without_it_the_command_reads_end_of_file() {
    let (s, ws) = served_workspace();
    let (code, out, err) = gsv_with_input(&s, &["exec", "-i", &ws, "--", "cat"], "piped\n");
    assert_eq!((code, out.as_str()), (Some(0), "piped\n"), "{err}");
    // Without -i our stdin stays ours: held open here, yet `cat` ends.
    let mut child = gsv_cmd(&s)
        .args(["exec", &ws, "--", "cat; echo done"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let held_open = child.stdin.take();
    let out = child.wait_with_output().unwrap();
    drop(held_open);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8(out.stdout).unwrap(), "done\n");
}

/// The first line is printed while the command still runs: it cannot end
/// before a second `gsv exec` (another connection of the same user, which
/// must not knock the first off) creates the file it waits for, and the
/// test only runs that after reading the first line.
#[test]
fn exec_prints_output_as_it_comes_and_two_commands_of_one_user_run_side_by_side() {
    let (s, ws) = served_workspace();
    let mut first = gsv_cmd(&s)
        .args([
            "exec",
            "--timeout",
            "120",
            &ws,
            "--",
            "echo first; while [ ! -e go ]; do sleep 0.05; done; echo second",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    let (ok, out, err) = gsv_err(&s, &["exec", &ws, "--", "touch go"]);
    assert!(ok, "{out} {err}");
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(lines.next().is_none());
    let status = first.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut first.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
}

#[test]
fn exec_exits_with_the_commands_code_and_says_when_its_timeout_killed_it() {
    let (s, ws) = served_workspace();
    let status = gsv_cmd(&s)
        .args(["exec", &ws, "--", "exit", "7"])
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(7));
    let out = gsv_cmd(&s)
        .args(["exec", "--timeout", "1", &ws, "--", "exec sleep 60"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(143), "{err}");
    assert!(err.contains("timed out after 1s"), "{err}");
    let out = gsv_cmd(&s)
        .args([
            "exec",
            "-e",
            "GREETING=hi there",
            &ws,
            "--",
            "echo \"$GREETING\"",
        ])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hi there\n");
}

#[test]
fn ctrl_c_sends_term_to_the_command_and_detach_then_attach_follows_it() {
    let (s, ws) = served_workspace();
    let mut child = gsv_cmd(&s)
        .args(["exec", &ws, "--", "echo up; exec sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "up");
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(143), "the command's TERM exit: {err}");
    assert!(err.contains("interrupted"), "{err}");

    let (ok, sid, err) = gsv_err(
        &s,
        &[
            "exec",
            "--detach",
            &ws,
            "--",
            "while [ ! -e go2 ]; do sleep 0.05; done; echo later; exit 3",
        ],
    );
    assert!(ok, "{err}");
    let sid = sid.trim().to_owned();
    assert!(sid.starts_with("sh_"), "{sid}");
    assert!(gsv(&s, &["exec", &ws, "--", "touch go2"]).0);
    let out = gsv_cmd(&s).args(["attach", &sid]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "later\n");
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn a_second_kernel_on_the_same_data_directory_is_refused_at_start() {
    let s = serve();
    let out = Command::new(env!("CARGO_BIN_EXE_gsv"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(s._dir.path().join("data"))
        .arg("--wsd-bin")
        .arg(wsd_bin())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("another kernel already serves") && err.contains("--data"),
        "{err}"
    );
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening"),
        "it never listened"
    );
}

#[test]
fn gsv_call_fails_when_the_operation_fails_inside_an_ok_frame() {
    let (s, _ws) = served_workspace();
    let (ok, out) = gsv(
        &s,
        &["call", "fs.read", r#"{"path":"/home/alice/nope.txt"}"#],
    );
    assert!(out.contains("\"ok\": false"), "{out}");
    assert!(!ok, "an operation error is a failure: {out}");
    let (ok, out) = gsv(&s, &["call", "fs.read", r#"{"path":"/home/alice"}"#]);
    assert!(ok, "{out}");
}

/// The first run as the README gives it, from an empty data directory:
/// errors name `gsv setup`, setup logs in (a config file with a token, no
/// password), later commands need no credentials, a token alone logs in,
/// `gsv config set` writes the user's model, `--user` after the
/// subcommand is taken.
#[test]
fn setup_login_and_config_set_from_an_empty_data_directory() {
    let s = serve();
    let bare = || {
        let mut c = gsv_cmd(&s);
        c.env_remove("GSV_USER").env_remove("GSV_PASSWORD");
        c
    };
    let out = gsv_cmd(&s).args(["workspace", "list"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("run `gsv setup`"), "{err}");

    let out = bare()
        .args(["setup", "--user", "carol", "--password", "carol-password"])
        .args(["--model", "tiny", "--base-url", "http://127.0.0.1:9/v1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = std::fs::read_to_string(s._dir.path().join("config/gsv/config.json")).unwrap();
    assert!(
        config.contains("\"username\": \"carol\"") && config.contains("\"token\""),
        "{config}"
    );
    assert!(
        !config.contains("carol-password"),
        "no password stored: {config}"
    );

    let (ok, ws) = {
        let out = bare().args(["workspace", "create"]).output().unwrap();
        (out.status.success(), String::from_utf8(out.stdout).unwrap())
    };
    assert!(ok && ws.starts_with("ws_"), "{ws}");
    let out = bare()
        .args(["config", "set", "ai.model", "bigger"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bare().args(["config", "get", "ai.model"]).output().unwrap();
    let got = String::from_utf8(out.stdout).unwrap();
    assert!(got.contains("users/1000/ai/model\tbigger"), "{got}");
    assert!(
        got.contains("config/ai/model\ttiny"),
        "setup's model: {got}"
    );

    // A token names its account: `gsv login --token` needs no username.
    let out = bare().args(["token", "create"]).output().unwrap();
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    std::fs::remove_file(s._dir.path().join("config/gsv/config.json")).unwrap();
    let out = bare().args(["login", "--token", &token]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bare().args(["workspace", "list"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(ws.trim()));

    // The global flags after the subcommand; a wrong one is refused with
    // the command to run.
    let out = bare()
        .args([
            "workspace",
            "list",
            "--user",
            "carol",
            "--password",
            "wrong",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gsv login"));

    let out = bare()
        .args(["token", "create", "--node", "laptop", "--out"])
        .arg(s._dir.path().join("laptop.token"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t = std::fs::read_to_string(s._dir.path().join("laptop.token")).unwrap();
    assert!(!t.trim().is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("gsv node --kernel"));

    let out = bare()
        .args(["workspace", "rm", ws.trim()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = bare().args(["workspace", "list"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("archived"));
}

#[test]
fn a_chat_whose_first_turn_fails_removes_the_process_and_workspace_it_made() {
    let (s, _ws) = served_workspace();
    let out = gsv_cmd(&s)
        .args(["chat", "--workspace", "-m", "hello"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no model is configured: {err}");
    assert!(
        err.contains("gsv config set ai.model"),
        "names the fix: {err}"
    );
    let pid = err
        .split_whitespace()
        .find(|w| w.starts_with("proc:"))
        .expect(&err)
        .to_owned();
    let (ok, procs) = gsv(&s, &["call", "proc.list"]);
    assert!(ok, "{procs}");
    assert!(!procs.contains(&pid), "the process is gone: {procs}");
    let (_, list) = gsv(&s, &["workspace", "list"]);
    let active: Vec<&str> = list.lines().filter(|l| l.contains("\tactive\t")).collect();
    assert_eq!(active.len(), 1, "only the test's own workspace: {list}");
}

/// A kernel killed and started again on the same data directory (its lock
/// went with the killed process) while `gsv exec` follows a command: the
/// CLI logs in again, learns the result was lost, and exits 255 saying so.
#[test]
fn exec_reconnects_after_a_kernel_restart_and_reports_a_lost_command_as_255() {
    let (mut s, ws) = served_workspace();
    let addr = s
        .url
        .trim_start_matches("ws://")
        .trim_end_matches("/ws")
        .to_owned();
    let mut child = gsv_cmd(&s)
        .args(["exec", &ws, "--", "echo up; exec sleep 60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "up");
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    let dir = std::mem::replace(&mut s._dir, tempfile::tempdir().unwrap());
    let s2 = serve_with(dir, &["--listen", &addr]);
    // The killed kernel's wsd child (running the lost command) outlives
    // it, and the new kernel never uses that workspace: killed at the end
    // (before `s2` removes its directory).
    let children = crate::harness::LeftoverChildren(s2._dir.path().join("data"));
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(255), "{err}");
    assert!(err.contains("result is lost"), "{err}");
    drop(children);
    drop(s2);
}

#[test]
fn the_cli_runs_codemode_scripts_from_a_file_or_stdin() {
    let s = serve();
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("s.js");
    std::fs::write(
        &script,
        "console.log('hello from js'); return {argv, n: args.n, who: args.who};",
    )
    .unwrap();
    let path = script.to_str().unwrap();
    let (ok, out, err) = gsv_err(
        &s,
        &[
            "codemode", "run", path, "--arg", "n=2", "--arg", "who=me", "--", "x", "y",
        ],
    );
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"argv": ["x", "y"], "n": 2, "who": "me"})
    );
    assert_eq!(err, "hello from js\n");

    let mut child = Command::new(env!("CARGO_BIN_EXE_gsv"))
        .args(["codemode", "run", "-", "--json"])
        .env("GSV_URL", &s.url)
        .env("GSV_USER", "alice")
        .env("GSV_PASSWORD", "alice-password")
        .env_remove("GSV_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"throw new Error('from stdin');")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "a failed block exits 1");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"status": "failed", "error": "Error: from stdin", "logs": []})
    );
}

#[test]
fn the_cli_adds_lists_calls_and_removes_mcp_servers() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(mcp) = rt.block_on(crate::mcp::McpServer::start()) else {
        return;
    };
    let s = serve();
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    let (ok, id, err) = gsv_err(&s, &["mcp", "add", "Math", &mcp.url]);
    assert!(ok, "{err}");
    let id = id.trim().to_owned();
    assert!(id.starts_with("mcp_"), "{id}");
    let (ok, list) = gsv(&s, &["mcp", "list"]);
    assert!(ok);
    let row: Vec<&str> = list.lines().next().unwrap().split('\t').collect();
    assert_eq!(&row[..4], &[id.as_str(), "ready", "Math", mcp.url.as_str()]);
    assert!(row[4].split(',').any(|t| t == "get-sum"), "{list}");
    let (ok, out) = gsv(
        &s,
        &["mcp", "call", &id, "get-sum", "--args", r#"{"a":1,"b":2}"#],
    );
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v, serde_json::json!({"sum": 3}));
    let (ok, out) = gsv(
        &s,
        &["mcp", "call", &id, "echo", "--args", r#"{"message":"yo"}"#],
    );
    assert!(ok);
    assert_eq!(out, "yo\n");
    let (ok, _, err) = gsv_err(
        &s,
        &[
            "mcp",
            "call",
            &id,
            "explode",
            "--args",
            r#"{"reason":"cli"}"#,
        ],
    );
    assert!(!ok && err.contains("exploded: cli"), "{err}");
    assert!(gsv(&s, &["mcp", "rm", &id]).0);
    let (ok, _, err) = gsv_err(&s, &["mcp", "rm", &id]);
    assert!(!ok && err.contains("no MCP server"), "{err}");
    assert_eq!(gsv(&s, &["mcp", "list"]).1, "");
}

#[test]
fn gsv_watch_replays_from_a_cursor_and_prints_where_to_resume() {
    let s = serve();
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    let (_, ws) = gsv(&s, &["workspace", "create"]);
    let ws = ws.trim().to_owned();
    let args = format!(r#"{{"path":"/workspaces/{ws}","after":"now"}}"#);
    let (ok, out) = gsv(&s, &["call", "fs.changes", &args]);
    assert!(ok, "{out}");
    let frame: serde_json::Value = serde_json::from_str(&out).unwrap();
    let start = frame["data"]["cursor"].as_str().unwrap().to_owned();
    for (name, body) in [("a.txt", "aa"), ("b.txt", "bbb")] {
        let args = format!(r#"{{"path":"/workspaces/{ws}/{name}","content":"{body}"}}"#);
        assert!(gsv(&s, &["call", "fs.write", &args]).0);
    }
    let (ok, out) = gsv(&s, &["watch", &ws, "--after", &start, "--count", "2"]);
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[..2],
        [
            format!("file\t/workspaces/{ws}/a.txt\t2"),
            format!("file\t/workspaces/{ws}/b.txt\t3")
        ]
    );
    let resume = lines[2].strip_prefix("cursor\t").expect(&out).to_owned();
    let args = format!(r#"{{"path":"/workspaces/{ws}/sub/c.txt","content":"c"}}"#);
    assert!(gsv(&s, &["call", "fs.write", &args]).0);
    let (ok, out) = gsv(
        &s,
        &[
            "watch", &ws, "sub", "--after", &resume, "--count", "2", "--json",
        ],
    );
    assert!(ok, "{out}");
    let batches: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let paths: Vec<&str> = batches
        .iter()
        .flat_map(|b| b["changes"].as_array().into_iter().flatten())
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            format!("/workspaces/{ws}/sub"),
            format!("/workspaces/{ws}/sub/c.txt")
        ]
    );
    assert!(batches.last().unwrap()["cursor"].is_string());
    let (ok, _, err) = gsv_err(&s, &["watch", &ws, "--after", "garbage"]);
    assert!(!ok && err.contains("Cursor expired"), "{err}");
}

/// A scripted chat adapter on `url` (role service, channel `matrix`):
/// answers `adapter.connect` and `adapter.status`, never
/// `adapter.disconnect` (a hung adapter); it sends one DM from
/// `@alice:x` when told and hands the kernel's answer back.
async fn cli_adapter(
    url: String,
    token: String,
    mut dm: tokio::sync::mpsc::Receiver<tokio::sync::oneshot::Sender<serde_json::Value>>,
) {
    use serde_json::json;
    let mut ws = gsv_kernel::client::GsvClient::connect(&url).await.unwrap();
    let mut args =
        gsv_kernel::client::connect_args("matrix-adapter", "service", json!({"token": token}));
    args["client"]["channel"] = json!("matrix");
    ws.call("sys.connect", args).await.unwrap();
    let mut asked: Option<tokio::sync::oneshot::Sender<serde_json::Value>> = None;
    loop {
        tokio::select! {
            Some(reply) = dm.recv() => {
                let req = json!({"type": "req", "id": "dm1", "call": "adapter.inbound",
                    "args": {"adapter": "matrix", "accountId": "@bot:x", "message": {
                        "messageId": "$1", "surface": {"kind": "dm", "id": "!r:x"},
                        "actor": {"id": "@alice:x"}, "text": "hi"}}});
                ws.send_text(req.to_string()).await.unwrap();
                asked = Some(reply);
            }
            f = ws.recv() => {
                let Ok(f) = f else { return };
                if f["type"] == "res" && f["id"] == "dm1" {
                    if let Some(r) = asked.take() {
                        let _ = r.send(f["data"].clone());
                    }
                    continue;
                }
                let data = match f["call"].as_str() {
                    Some("adapter.connect") => json!({"ok": true, "adapter": "matrix",
                        "accountId": f["args"]["accountId"], "connected": true,
                        "authenticated": true, "message": "logged in"}),
                    Some("adapter.status") => json!({"adapter": "matrix", "accounts": [
                        {"accountId": "@bot:x", "connected": true, "authenticated": true,
                         "mode": "sync", "lastActivity": 0}]}),
                    _ => continue,
                };
                let res = json!({"type": "res", "id": f["id"], "ok": true, "data": data});
                ws.send_text(res.to_string()).await.unwrap();
            }
        }
    }
}

#[test]
fn the_cli_drives_an_adapter_and_links_a_chat_identity_with_a_code() {
    let s = serve_with(tempfile::tempdir().unwrap(), &["--adapter-timeout", "1"]);
    let setup =
        r#"{"username":"alice","password":"alice-password","rootPassword":"root-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    let (ok, out) = gsv(&s, &["adapter", "status", "--adapter", "Matrix"]);
    assert!(ok, "{out}");
    assert_eq!(out, "adapter=matrix (no accounts)\n");
    let (ok, _, err) = gsv_err(&s, &["adapter", "connect", "--adapter", "matrix"]);
    assert!(!ok);
    assert!(
        err.contains("503") && err.contains("No adapter connected"),
        "{err}"
    );

    let token_file = s._dir.path().join("service.token");
    let out = gsv_cmd(&s)
        .env("GSV_USER", "root")
        .env("GSV_PASSWORD", "root-password")
        .args(["token", "create", "--service", "--out"])
        .arg(&token_file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (dm_tx, dm_rx) = tokio::sync::mpsc::channel(1);
    let adapter = rt.spawn(cli_adapter(s.url.clone(), token, dm_rx));
    let connected = (0..200).find_map(|_| {
        let (ok, out) = gsv(
            &s,
            &[
                "adapter",
                "connect",
                "--adapter",
                "matrix",
                "--account-id",
                "@bot:x",
            ],
        );
        if ok {
            return Some(out);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        None
    });
    assert_eq!(
        connected.as_deref(),
        Some("Adapter matrix:@bot:x connected=true authenticated=true\nmessage: logged in\n")
    );
    let (ok, out) = gsv(&s, &["adapter", "status", "--adapter", "matrix"]);
    assert!(ok, "{out}");
    assert_eq!(
        out,
        "matrix:@bot:x connected=true authenticated=true mode=sync \
         last_activity=1970-01-01T00:00:00+00:00 error=-\n"
    );
    // The hung adapter: 504 after --adapter-timeout, and the kernel serves on.
    let (ok, _, err) = gsv_err(&s, &["adapter", "disconnect", "--adapter", "matrix"]);
    assert!(!ok);
    assert!(err.contains("504"), "{err}");

    let (tx, rx) = tokio::sync::oneshot::channel();
    dm_tx.blocking_send(tx).unwrap();
    let answer = rx.blocking_recv().unwrap();
    let code = answer["challenge"]["code"].as_str().unwrap().to_owned();
    let (ok, out) = gsv(&s, &["auth", "link", &code]);
    assert!(ok, "{out}");
    assert_eq!(out, "Linked matrix:@bot:x:@alice:x -> uid 1000\n");
    let (ok, _, err) = gsv_err(&s, &["auth", "link", &code]);
    assert!(!ok);
    assert!(err.contains("already used"), "{err}");
    let (ok, out) = gsv(&s, &["auth", "link-list"]);
    assert!(ok);
    assert!(
        out.starts_with("matrix:@bot:x:@alice:x -> uid=1000 created="),
        "{out}"
    );
    assert!(out.ends_with(" linked_by=1000\n"), "{out}");
    let (ok, _, err) = gsv_err(&s, &["auth", "link", &code, "--adapter", "matrix"]);
    assert!(!ok && err.contains("either"), "{err}");
    let (ok, out) = gsv(
        &s,
        &[
            "auth",
            "unlink",
            "--adapter",
            "matrix",
            "--account-id",
            "@bot:x",
            "--actor-id",
            "@alice:x",
        ],
    );
    assert!(ok && out == "unlinked\n", "{out}");
    adapter.abort();
}

/// `gsv workspace snapshot|snapshots|restore|fork|snapshot-rm` and
/// `gsv gc` as a person would run them: ids on stdout, refusals as
/// failures with the kernel's reason, root-only collection.
#[test]
fn the_cli_snapshots_restores_forks_and_collects() {
    let s = serve_with(tempfile::tempdir().unwrap(), &["--gc-grace", "0s"]);
    let setup =
        r#"{"username":"alice","password":"alice-password","rootPassword":"root-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    let (_, ws) = gsv(&s, &["workspace", "create"]);
    let ws = ws.trim().to_owned();
    let write = |content: &str| {
        let args = format!(r#"{{"path":"/workspaces/{ws}/f.txt","content":"{content}"}}"#);
        assert!(gsv(&s, &["call", "fs.write", &args]).0);
    };
    write("before");
    let (ok, snap) = gsv(&s, &["workspace", "snapshot", &ws, "--label", "first"]);
    assert!(ok, "{snap}");
    let snap = snap.trim().to_owned();
    assert!(snap.starts_with("snap_"), "{snap}");
    let (ok, again) = gsv(&s, &["workspace", "snapshot", &ws, "--json"]);
    assert!(ok, "{again}");
    let again: serde_json::Value = serde_json::from_str(&again).unwrap();
    assert_eq!(again["newBytes"], 0, "an unchanged tree: {again}");

    let (ok, list) = gsv(&s, &["workspace", "snapshots", &ws]);
    assert!(ok, "{list}");
    let lines: Vec<&str> = list.lines().collect();
    assert_eq!(lines.len(), 2, "{list}");
    let first: Vec<&str> = lines[0].split('\t').collect();
    assert_eq!(first[0], snap, "{list}");
    assert_eq!(&first[2..], ["1", "6", "6", "first"], "{list}");

    write("after");
    let (ok, out) = gsv(&s, &["workspace", "restore", &snap]);
    assert!(ok, "{out}");
    assert!(out.contains("1 changed, 0 removed"), "{out}");
    let (ok, out) = gsv(&s, &["exec", &ws, "--", "cat f.txt"]);
    assert!(ok, "{out}");
    assert_eq!(out, "before");

    let (ok, fork) = gsv(&s, &["workspace", "fork", &snap, "--label", "copy"]);
    assert!(ok, "{fork}");
    let fork = fork.trim().to_owned();
    assert!(fork.starts_with("ws_") && fork != ws, "{fork}");
    let (ok, out) = gsv(&s, &["exec", &fork, "--", "cat f.txt"]);
    assert!(ok && out == "before", "{out}");

    let (ok, _, err) = gsv_err(&s, &["gc"]);
    assert!(!ok, "alice may not collect");
    assert!(err.contains("403") || err.contains("ermission"), "{err}");
    let root = |args: &[&str]| {
        let out = gsv_cmd(&s)
            .args(["--user", "root", "--password", "root-password"])
            .args(args)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8(out.stdout).unwrap())
    };
    let (ok, out) = root(&["gc", "--json"]);
    assert!(ok, "{out}");
    let gc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(gc["chunks"], 1, "`after`, overwritten by the restore: {gc}");

    write("third");
    let (ok, _) = gsv(&s, &["workspace", "snapshot-rm", &snap]);
    assert!(ok);
    let (_, list) = gsv(&s, &["workspace", "snapshots", &ws]);
    assert_eq!(list.lines().count(), 1, "{list}");
    // `before` is still held by the other snapshot: nothing to free.
    let (ok, out) = root(&["gc"]);
    assert!(ok && out.starts_with("freed 0 chunks"), "{out}");

    let (ok, _, err) = gsv_err(&s, &["workspace", "restore", "snap_nope"]);
    assert!(!ok && err.contains("snap_nope"), "{err}");
}

#[test]
fn gsv_help_explains_snapshots_and_collection() {
    let help = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_gsv"))
            .args(args)
            .arg("--help")
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap()
    };
    let ws = help(&["workspace"]);
    for sub in ["snapshot", "snapshots", "snapshot-rm", "restore", "fork"] {
        assert!(ws.contains(sub), "{sub} in:\n{ws}");
    }
    assert!(help(&["workspace", "restore"]).contains("Refused while a command runs"));
    assert!(help(&["gc"]).contains("grace window"));
    let serve = help(&["serve"]);
    assert!(
        serve.contains("--chunk-store") && serve.contains("AWS_ACCESS_KEY_ID"),
        "{serve}"
    );
}

#[test]
fn the_cli_lists_and_forgets_oauth_accounts() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let Some(mcp) = rt.block_on(crate::mcp::McpServer::start_script("oauth_server.py", &[])) else {
        return;
    };
    let s = serve();
    let setup = r#"{"username":"alice","password":"alice-password"}"#;
    assert!(gsv(&s, &["call", "sys.setup", setup]).0);
    assert_eq!(gsv(&s, &["oauth", "list"]), (true, String::new()));
    let (ok, id, err) = gsv_err(&s, &["mcp", "add", "Guarded", &mcp.url]);
    assert!(ok, "{err}");
    let id = id.trim().to_owned();
    let (_, pending) = gsv(&s, &["oauth", "list", "--pending"]);
    let row: Vec<&str> = pending.trim_end().split('\t').collect();
    assert_eq!(row[0], "flow", "{pending}");
    assert_eq!(&row[2..5], &["mcp-server", mcp.url.as_str(), id.as_str()]);
    // The browser step, then the account is listed without its tokens.
    let (_, listed) = gsv(&s, &["call", "sys.mcp.list"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let auth_url = listed["data"]["servers"][0]["authUrl"]
        .as_str()
        .unwrap()
        .to_owned();
    let status = rt.block_on(async { reqwest::get(&auth_url).await.unwrap().status() });
    assert_eq!(status.as_u16(), 200);
    let (ok, accounts) = gsv(&s, &["oauth", "list"]);
    assert!(ok);
    let row: Vec<&str> = accounts.trim_end().split('\t').collect();
    assert_eq!(row.len(), 7, "{accounts}");
    assert_eq!(row[0], "account");
    assert_eq!(&row[2..5], &["mcp-server", mcp.url.as_str(), id.as_str()]);
    assert_eq!(row[6], "Guarded");
    let account = row[1].to_owned();
    assert!(account.starts_with("oauth_"), "{account}");
    let (ok, json) = gsv(&s, &["oauth", "list", "--json"]);
    assert!(
        ok && json.contains(&account) && !json.contains("accessToken"),
        "{json}"
    );
    assert_eq!(
        gsv(&s, &["oauth", "forget", &account]),
        (true, format!("forgotten\t{account}\n"))
    );
    let (ok, _, err) = gsv_err(&s, &["oauth", "forget", &account]);
    assert!(!ok);
    assert!(err.contains("no OAuth account of yours"), "{err}");
    assert_eq!(gsv(&s, &["oauth", "list"]), (true, String::new()));
}

#[test]
fn gsv_adapter_matrix_refuses_a_user_that_is_no_matrix_id_and_an_empty_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    let (token, password) = (dir.path().join("token"), dir.path().join("password"));
    std::fs::write(&token, "gsv_service_token\n").unwrap();
    std::fs::write(&password, "").unwrap();
    let run = |user: &str| {
        Command::new(env!("CARGO_BIN_EXE_gsv"))
            .args(["adapter", "matrix", "--kernel", "ws://127.0.0.1:9/ws"])
            .arg("--token-file")
            .arg(&token)
            .args(["--homeserver", "http://127.0.0.1:9", "--user", user])
            .arg("--password-file")
            .arg(&password)
            .env_remove("GSV_USER")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let out = run("bot");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--user @bot:SERVER"), "{err}");
    let out = run("@bot:localhost");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--password-file") && err.contains("empty"),
        "{err}"
    );
}

#[test]
fn gsv_shell_runs_a_terminal_from_piped_input_and_exits_with_its_code() {
    let (s, ws) = served_workspace();
    let (code, out, err) = gsv_with_input(&s, &["shell", &ws], "echo hi-$((40+2)); exit 3\n");
    assert_eq!(code, Some(3), "{out}\n{err}");
    assert!(out.contains("hi-42"), "{out}");
    // `exec -t`: one word is a shell line, on a terminal (80x24 without one).
    let (code, out, err) = gsv_with_input(&s, &["exec", "-t", &ws, "--", "stty size; exit 4"], "");
    assert_eq!(code, Some(4), "{out}\n{err}");
    assert!(out.contains("24 80"), "{out}");
}

#[test]
fn gsv_shell_detaches_on_ctrl_bracket_and_reattaches_from_an_offset() {
    let (s, ws) = served_workspace();
    let (code, _, err) = gsv_with_input(&s, &["shell", &ws], "echo one-$((0+1))\n\x1d");
    assert_eq!(code, Some(0), "{err}");
    let hint = err
        .lines()
        .find_map(|l| l.trim().strip_prefix("[detached: gsv shell "))
        .unwrap_or_else(|| panic!("no re-attach hint: {err}"));
    let words: Vec<&str> = hint.trim_end_matches(']').split_whitespace().collect();
    assert_eq!((words[0], words[2]), ("--attach", "--after"), "{hint}");
    let pty = words[1].to_owned();
    // From 0: the whole output again, then the program's end.
    let (code, out, err) =
        gsv_with_input(&s, &["shell", "--attach", &pty, "--after", "0"], "exit 5\n");
    assert_eq!(code, Some(5), "{out}\n{err}");
    assert!(out.contains("one-1"), "{out}");
    let (ok, _, err) = gsv_err(&s, &["shell", "--attach", "pty_nope"]);
    assert!(!ok && err.contains("Unknown ptyId"), "{err}");
}
