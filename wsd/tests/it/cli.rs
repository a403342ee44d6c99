//! The `wsd` binary's own surface: help text, argument errors, exit codes.
//! (Its presence also makes `cargo test` build the binary that the
//! cross-crate scenarios in `tests/` drive.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use wsd_test_support::{Daemon, STEP, free_port, run_bounded, text, wait_until, wsd_command};

#[test]
fn help_lists_every_subcommand() {
    let out = wsd_command().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for sub in [
        "serve",
        "push",
        "pull",
        "sync",
        "watermarks",
        "status",
        "exec",
        "attach",
        "kill",
        "exclude",
        "completions",
        "man",
    ] {
        assert!(text.contains(sub), "--help does not mention {sub}:\n{text}");
    }
}

#[test]
fn a_missing_remote_is_a_usage_error_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let out = wsd_command().arg("push").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--remote"));
}

#[test]
fn an_unreachable_remote_fails_with_exit_code_1_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    // A port that was just free: nothing listens on it.
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let out = wsd_command()
        .arg("push")
        .arg(dir.path())
        .args(["--remote", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&addr), "{err}");
}

/// A `wsd serve` child on a free loopback port over `TMP/ws`, state in
/// `TMP/state`; killed before its directory is removed.
struct Served {
    daemon: Daemon,
    tmp: tempfile::TempDir,
}

impl Served {
    fn start() -> Served {
        Served::start_with(&[])
    }

    /// A daemon with `extra` arguments for `wsd serve`.
    fn start_with(extra: &[&str]) -> Served {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(&root).unwrap();
        let daemon = Daemon::builder(&root)
            .state(&tmp.path().join("state"))
            .args(extra)
            .start();
        Served { daemon, tmp }
    }

    fn root(&self) -> PathBuf {
        self.tmp.path().join("ws")
    }
}

impl std::ops::Deref for Served {
    type Target = Daemon;
    fn deref(&self) -> &Daemon {
        &self.daemon
    }
}

#[test]
fn exec_with_several_words_runs_exactly_that_argv() {
    let d = Served::start();
    let out = d.cli(&["exec", "--", "sh", "-c", "echo \"a b\" | wc -w"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Joined with spaces (ssh-style), `sh -c echo` would print an empty line.
    assert_eq!(text(&out.stdout).trim(), "2");
    let out = d.cli(&["exec", "--", "sh", "-c", "echo \"a   b\""]);
    assert_eq!(text(&out.stdout), "a   b\n");
    // Words with spaces, quotes and `$` reach the program untouched.
    let out = d.cli(&["exec", "--", "printf", "[%s]", "a b", "$HOME", "it's", ""]);
    assert_eq!(text(&out.stdout), "[a b][$HOME][it's][]");
}

#[test]
fn exec_with_one_word_runs_a_shell_command_line() {
    let d = Served::start();
    let out = d.cli(&["exec", "--", "echo one && echo two | tr a-z A-Z"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\nTWO\n");
}

#[test]
fn exec_dash_i_streams_stdin_and_without_it_stdin_is_closed() {
    let d = Served::start();
    let out = d.cli_with_input(&["exec", "-i", "--", "wc", "-c"], Some(b"hello world"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "11");
    // `--stdin` stays an alias of `-i`.
    let out = d.cli_with_input(&["exec", "--stdin", "--", "cat"], Some(b"via alias"));
    assert_eq!(text(&out.stdout), "via alias");
    // Without -i the command reads end of file at once, whatever we hold.
    let out = d.cli_with_input(&["exec", "--", "cat"], Some(b"not forwarded"));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "");
}

#[test]
fn exec_honours_cwd_and_env_and_refuses_a_cwd_outside_the_workspace() {
    let d = Served::start();
    std::fs::create_dir_all(d.root().join("sub/dir")).unwrap();
    let out = d.cli(&[
        "exec",
        "--cwd",
        "sub/dir",
        "--env",
        "GREETING=hi there",
        "-e",
        "N=2",
        "--",
        "sh",
        "-c",
        "basename \"$PWD\"; echo \"$GREETING/$N\"",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "dir\nhi there/2\n");
    let out = d.cli(&["exec", "--cwd", "../..", "--", "pwd"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    assert!(text(&out.stderr).contains("../.."), "{}", text(&out.stderr));
}

#[test]
fn exec_exits_with_the_commands_code_128_plus_a_signal_and_143_after_a_timeout() {
    let d = Served::start();
    let out = d.cli(&["exec", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = d.cli(&["exec", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(128 + 9));
    let out = d.cli(&[
        "exec",
        "--timeout",
        "300ms",
        "--",
        "sh",
        "-c",
        "echo slow; sleep 60",
    ]);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "slow\n");
    // The kill is explained, not just an exit code.
    let err = text(&out.stderr);
    assert!(err.contains("timed out after 300ms; sent TERM"), "{err}");
}

#[test]
fn a_bare_timeout_is_seconds_and_help_says_so() {
    let d = Served::start();
    // 2 means two seconds: a command that takes 300 ms finishes (as
    // milliseconds it would have been killed first).
    let out = d.cli(&["exec", "--timeout", "2", "--", "sleep 0.3; echo done"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "done\n");
    assert!(
        !text(&out.stderr).contains("timed out"),
        "{}",
        text(&out.stderr)
    );
    // An exit by TERM that was not our timeout is not reported as one.
    let out = d.cli(&["exec", "--timeout", "60", "--", "kill -TERM $$"]);
    assert_eq!(out.status.code(), Some(128 + 15));
    assert!(
        !text(&out.stderr).contains("timed out"),
        "{}",
        text(&out.stderr)
    );

    let help = text(
        &wsd_command()
            .args(["exec", "--help"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(help.contains("a bare number is seconds"), "{help}");
    let out = wsd_command()
        .args([
            "exec",
            "--remote",
            "127.0.0.1:1",
            "--timeout",
            "0",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn exec_exits_255_when_the_daemon_goes_away_while_the_command_runs() {
    let mut d = Served::start();
    let mut cmd = wsd_command();
    cmd.args(["exec", "--remote", &d.addr, "--reattach-for", "1s", "--"])
        // The command's own pid, so that the test can stop what the killed
        // daemon leaves running.
        .arg("echo $$ > pid; exec sleep 30")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let client = cmd.spawn().unwrap();
    let pid_file = d.root().join("pid");
    wait_until("the command did not start", || {
        std::fs::read_to_string(&pid_file).is_ok_and(|p| p.ends_with('\n'))
    });
    d.daemon.kill9();
    let out = client.wait_with_output().unwrap();
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    let _ = Command::new("kill").args(["-9", pid.trim()]).status();
    assert_eq!(out.status.code(), Some(255), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("lost the daemon"), "{err}");
}

#[test]
fn a_client_without_a_token_is_told_none_was_given_and_a_wrong_one_is_wrong() {
    let tokens = tempfile::tempdir().unwrap();
    let right = tokens.path().join("right");
    std::fs::write(&right, "correct horse battery staple").unwrap();
    let wrong = tokens.path().join("wrong");
    std::fs::write(&wrong, "incorrect").unwrap();
    let d = Served::start_with(&["--token-file", right.to_str().unwrap()]);
    let out = d.cli(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("EAUTH") && err.contains("no token given"),
        "{err}"
    );
    assert!(err.contains("--token-file"), "{err}");
    assert!(!err.contains("wrong token"), "{err}");
    let out = d.cli(&["status", "--token-file", wrong.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("EAUTH") && err.contains("wrong token"),
        "{err}"
    );
    let out = d.cli(&["status", "--token-file", right.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn exec_rejects_a_timeout_that_is_not_a_duration() {
    let out = wsd_command()
        .args([
            "exec",
            "--remote",
            "127.0.0.1:1",
            "--timeout",
            "soon",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("soon"), "{}", text(&out.stderr));
}

#[test]
fn status_reports_version_root_rev_live_execs_and_syncing_peers() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("a.txt"), b"hello").unwrap();
    let out = d.cli(&["push", local.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = d.cli(&["exec", "--detach", "--id", "sleeper", "--", "sleep 60"]);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = d.cli(&["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    let root = d.root().canonicalize().unwrap();
    assert_eq!(v["root"], root.to_str().unwrap());
    assert!(v["currentRev"].as_u64().unwrap() >= 1, "{v}");
    assert!(v["uptimeMs"].is_u64(), "{v}");
    assert_eq!(v["liveExecs"], serde_json::json!(["sleeper"]));
    // The pushing directory's peer, and not the exec client or the probe.
    let peers = v["peers"].as_array().unwrap();
    assert_eq!(peers.len(), 1, "{v}");
    assert!(
        peers[0]["pushedThrough"]["rev"].as_u64().unwrap() >= 1,
        "{v}"
    );

    let out = d.cli(&["status"]);
    assert_eq!(out.status.code(), Some(0));
    let human = text(&out.stdout);
    assert!(human.contains(root.to_str().unwrap()), "{human}");
    assert!(human.contains("live execs:  1 (sleeper)"), "{human}");

    let out = d.cli(&["kill", "sleeper", "--signal", "KILL"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn status_text_and_json_say_the_same_true_thing_about_pushes_and_pulls() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let l = local.path().to_str().unwrap();
    std::fs::write(local.path().join("mine.txt"), b"pushed").unwrap();
    let out = d.cli(&["push", l, "-q"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for i in 0..3 {
        std::fs::write(d.root().join(format!("theirs-{i}")), b"pulled").unwrap();
        let out = d.cli(&["pull", l, "-q"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(local.path().join(format!("theirs-{i}")).exists());
    }

    let out = d.cli(&["status", "--json", l]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let current = v["currentRev"].as_u64().unwrap();
    let peer = &v["peers"][0];
    let pushed = peer["pushedThrough"]["rev"].as_u64().unwrap();
    assert!(pushed >= 1, "{v}");
    // No daemon-side names whose meaning is the reverse of the text.
    assert!(
        peer.get("pushCursor").is_none() && peer.get("fetchCursor").is_none(),
        "{v}"
    );
    let mine = &v["local"];
    assert_eq!(mine["peer"], peer["peer"], "{v}");
    // Three pulls brought everything: the local side is at the daemon's rev.
    assert_eq!(mine["pulledThrough"]["rev"].as_u64(), Some(current), "{v}");
    assert_eq!(mine["pushedThrough"]["rev"].as_u64(), Some(pushed), "{v}");

    let out = d.cli(&["status", l]);
    let human = text(&out.stdout);
    let name = peer["peer"].as_str().unwrap();
    assert!(
        human.contains(&format!("peer {name}: pushed its revs through {pushed}\n")),
        "{human}"
    );
    assert!(
        human.contains(&format!(
            "pulled:    the daemon's revs through {current} (it is at {current})"
        )),
        "{human}"
    );
    assert!(!human.contains("fetched"), "{human}");
}

#[test]
fn an_exclude_is_remembered_until_dropped_and_dropping_it_sends_what_it_hid() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let l = local.path().to_str().unwrap();
    let env = local.path().join(".env");
    std::fs::write(&env, b"SECRET=1").unwrap();
    std::fs::write(local.path().join("main.rs"), b"fn main() {}").unwrap();
    let out = d.cli(&["push", l, "--exclude", ".env*", "-q"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(d.root().join("main.rs").exists());
    assert!(!d.root().join(".env").exists());

    // Later transfers without the flag still leave it out.
    std::fs::write(&env, b"SECRET=2").unwrap();
    let out = d.cli(&["sync", l, "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!text(&out.stdout).contains(".env"), "{}", text(&out.stdout));
    let out = d.cli(&["sync", l, "-q"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!d.root().join(".env").exists());

    // Shown by `wsd exclude list` and `wsd status LOCAL_DIR`.
    let out = wsd_command().args(["exclude", "list", l]).output().unwrap();
    assert_eq!(text(&out.stdout), ".env*\n", "{}", text(&out.stderr));
    let out = d.cli(&["status", l]);
    assert!(
        text(&out.stdout).contains("excludes:  .env*\n"),
        "{}",
        text(&out.stdout)
    );
    let out = d.cli(&["status", "--json", l]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["local"]["excludes"]["excludes"],
        serde_json::json!([".env*"]),
        "{v}"
    );

    // Dropping a pattern that is not remembered fails and changes nothing.
    let out = d.cli(&["sync", l, "--no-exclude", "*.env"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("\"*.env\""),
        "{}",
        text(&out.stderr)
    );
    let out = wsd_command()
        .args(["exclude", "rm", l, "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(".env*"), "{}", text(&out.stderr));

    // Dropped explicitly: the next push sends the file the cursor passed.
    let out = wsd_command()
        .args(["exclude", "rm", l, ".env*"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = wsd_command()
        .args(["exclude", "list", "--json", l])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["excludes"], serde_json::json!([]), "{v}");
    assert_eq!(v["unsent"], serde_json::json!([".env*"]), "{v}");
    let out = d.cli(&["push", l, "--dry-run"]);
    assert_eq!(
        text(&out.stdout),
        "push: write .env\n",
        "{}",
        text(&out.stderr)
    );
    assert!(!d.root().join(".env").exists());
    let out = d.cli(&["push", l, "-q"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(d.root().join(".env")).unwrap(), b"SECRET=2");
    let out = wsd_command()
        .args(["exclude", "list", "--json", l])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["unsent"], serde_json::json!([]), "{v}");

    // The same through a transfer's --no-exclude, sub-directories included.
    std::fs::create_dir_all(local.path().join("logs/old")).unwrap();
    std::fs::write(local.path().join("logs/old/a.log"), b"a").unwrap();
    let out = d.cli(&["push", l, "-q", "--exclude", "logs/"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!d.root().join("logs").exists());
    let out = d.cli(&["sync", l, "-q", "--no-exclude", "logs/"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read(d.root().join("logs/old/a.log")).unwrap(),
        b"a"
    );
    let out = wsd_command().args(["exclude", "list", l]).output().unwrap();
    assert_eq!(text(&out.stdout), "", "{}", text(&out.stderr));
}

#[test]
fn status_of_an_unreachable_daemon_exits_1_naming_the_address() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let out = run_bounded(
        &mut {
            let mut c = wsd_command();
            c.args(["status", "--remote", &addr, "--json"]);
            c
        },
        None,
        STEP,
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(text(&out.stdout), "");
    assert!(text(&out.stderr).contains(&addr), "{}", text(&out.stderr));
}

#[test]
fn status_gives_up_on_a_daemon_that_accepts_but_never_answers() {
    // A listener that accepts and then says nothing: a hung daemon.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap().to_string();
    let out = run_bounded(
        &mut {
            let mut c = wsd_command();
            c.args(["status", "--remote", &addr, "--timeout", "300ms"]);
            c
        },
        None,
        STEP,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&addr), "{}", text(&out.stderr));
    drop(silent);
}

#[test]
fn excluded_paths_from_flags_and_wsdignore_are_neither_pushed_nor_pulled() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let l = local.path();
    std::fs::write(l.join(".wsdignore"), b"# build output\nbuild/\n\n").unwrap();
    std::fs::create_dir_all(l.join("build")).unwrap();
    std::fs::write(l.join("build/out.o"), b"object").unwrap();
    std::fs::write(l.join("secret.env"), b"KEY=1").unwrap();
    std::fs::write(l.join("main.rs"), b"fn main() {}").unwrap();
    let out = d.cli(&["push", l.to_str().unwrap(), "--exclude", "*.env", "-q"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(d.root().join("main.rs").exists());
    assert!(d.root().join(".wsdignore").exists());
    assert!(!d.root().join("build").exists());
    assert!(!d.root().join("secret.env").exists());

    // Written on the daemon's side: an excluded pattern keeps it out of a pull.
    std::fs::write(d.root().join("trace.log"), b"noise").unwrap();
    std::fs::write(d.root().join("notes.txt"), b"keep").unwrap();
    let other = tempfile::tempdir().unwrap();
    let o = other.path();
    let out = d.cli(&[
        "pull",
        o.to_str().unwrap(),
        "--exclude",
        "*.log",
        "--exclude",
        "*.env",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(o.join("notes.txt")).unwrap(), b"keep");
    assert!(o.join("main.rs").exists());
    assert!(!o.join("trace.log").exists());
}

#[test]
fn a_malformed_exclude_pattern_is_an_error_naming_it() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let out = d.cli(&["push", local.path().to_str().unwrap(), "--exclude", "[z-a]"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("[z-a]"), "{}", text(&out.stderr));
    assert!(std::fs::read_dir(d.root()).unwrap().next().is_none());
}

#[test]
fn a_missing_local_dir_is_an_error_unless_create_is_given() {
    let d = Served::start();
    let parent = tempfile::tempdir().unwrap();
    let missing = parent.path().join("not-here");
    let out = d.cli(&["pull", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not-here does not exist (give --create"),
        "{}",
        text(&out.stderr)
    );
    assert!(!missing.exists());
    // A file where the directory should be: --create cannot help, so the
    // message does not suggest it.
    let file = parent.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = d.cli(&["pull", file.to_str().unwrap(), "--create"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("a-file"), "{err}");
    assert!(!err.contains("give --create"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    let out = d.cli(&["pull", missing.to_str().unwrap(), "--create"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(missing.is_dir());
}

#[test]
fn quiet_transfers_print_no_summary() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    std::fs::write(local.path().join("f"), b"x").unwrap();
    let out = d.cli(&["push", local.path().to_str().unwrap()]);
    assert!(text(&out.stderr).contains("push:"), "{}", text(&out.stderr));
    std::fs::write(local.path().join("g"), b"y").unwrap();
    let out = d.cli(&["push", local.path().to_str().unwrap(), "-q"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(text(&out.stderr), "");
    assert!(d.root().join("g").exists());
}

#[test]
fn dry_run_lists_what_would_change_and_changes_neither_side() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let l = local.path().to_str().unwrap();
    std::fs::write(local.path().join("new.txt"), b"new").unwrap();
    std::fs::write(local.path().join("skip.log"), b"log").unwrap();
    let out = d.cli(&["push", l, "--dry-run", "--exclude", "*.log"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "push: write new.txt\n");
    assert!(!d.root().join("new.txt").exists());

    // The real push still sends it: the dry run moved no watermark.
    let out = d.cli(&["push", l, "-q", "--exclude", "*.log"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(d.root().join("new.txt").exists());

    std::fs::write(d.root().join("remote.txt"), b"r").unwrap();
    std::fs::remove_file(d.root().join("new.txt")).unwrap();
    let out = d.cli(&["pull", l, "-n", "--json", "--exclude", "*.log"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut changes: Vec<String> = v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    changes.sort();
    assert_eq!(changes, ["delete new.txt", "write remote.txt"], "{v}");
    assert!(local.path().join("new.txt").exists());
    assert!(!local.path().join("remote.txt").exists());
}

#[test]
fn an_error_names_its_cause_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let root = tempfile::tempdir().unwrap();
    let out = run_bounded(
        &mut {
            let mut c = wsd_command();
            c.args(["serve", "--listen", &addr, "--root"])
                .arg(root.path());
            c
        },
        None,
        STEP,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(&addr), "{err}");
    assert_eq!(err.matches("in use").count(), 1, "{err}");
    drop(taken);
}

/// The stderr of a `wsd serve` that ran until it logged that it listens,
/// then was killed.
fn serve_log(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr");
    let root = dir.path().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    let mut daemon = Daemon::builder(&root).args(extra).log(&log).start();
    // "serving" is logged once the listeners are bound and the store open.
    wait_until("the serving line", || {
        std::fs::read_to_string(&log).unwrap().contains("serving")
    });
    daemon.kill9();
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn logs_have_no_ansi_escapes_when_stderr_is_not_a_terminal_and_json_on_request() {
    let err = serve_log(&[]);
    assert!(err.contains("serving"), "{err}");
    assert!(!err.contains('\u{1b}'), "{err:?}");
    let err = serve_log(&["--log-format", "json"]);
    assert!(err.contains("serving"), "{err}");
    for line in err.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string(), "{line}");
    }
}

#[test]
fn completions_and_the_man_page_are_generated_from_the_cli() {
    let out = wsd_command()
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let script = text(&out.stdout);
    assert!(script.contains("complete"), "{script}");
    assert!(
        script.contains("status") && script.contains("--exclude"),
        "{script}"
    );
    let out = wsd_command().args(["completions", "zsh"]).output().unwrap();
    assert!(out.status.success());
    assert!(text(&out.stdout).starts_with("#compdef wsd"));
    let out = wsd_command().arg("man").output().unwrap();
    assert!(out.status.success());
    let page = text(&out.stdout);
    assert!(page.contains(".TH wsd 1"), "{page}");
    // NAME is "wsd \- what it is", the name said once.
    let name = page
        .lines()
        .skip_while(|l| *l != ".SH NAME")
        .nth(1)
        .unwrap_or_default();
    assert!(name.starts_with("wsd \\- "), "{page}");
    assert_eq!(name.matches("wsd").count(), 1, "{name}");
    assert!(page.contains("status"), "{page}");
    let out = wsd_command()
        .args(["completions", "cmd.exe"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// Runs `docker/entrypoint.sh ARGS` with `WSD_BIN` set to the real `wsd`
/// (or to `bin`), and the given environment.
fn entrypoint(args: &[&str], env: &[(&str, &str)], bin: Option<&std::path::Path>) -> Output {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docker/entrypoint.sh");
    let mut c = Command::new("sh");
    c.arg(script)
        .args(args)
        .env_remove("WSD_TOKEN")
        .env_remove("WSD_TOKEN_FILE")
        .env_remove("WSD_ROOT")
        .env_remove("WSD_LISTEN")
        .env(
            "WSD_BIN",
            bin.map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_wsd")), Path::to_owned),
        )
        .envs(env.iter().copied());
    run_bounded(&mut c, None, STEP)
}

#[test]
fn the_container_entrypoint_maps_its_arguments_onto_wsd() {
    // A stand-in wsd that prints the argv it was given, one word a line.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("wsd");
    std::fs::write(&fake, "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let argv = |args: &[&str], env: &[(&str, &str)]| {
        let out = entrypoint(args, env, Some(&fake));
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let token = [("WSD_TOKEN", "t0ken")];
    assert_eq!(
        argv(&[], &token),
        "serve\n--root\n/workspace\n--listen\n0.0.0.0:45678\n"
    );
    assert_eq!(
        argv(
            &["--exec-log-cap", "1024"],
            &[("WSD_TOKEN_FILE", "/run/t"), ("WSD_ROOT", "/data")]
        ),
        "serve\n--root\n/data\n--listen\n0.0.0.0:45678\n--exec-log-cap\n1024\n"
    );
    assert_eq!(
        argv(&["health"], &[]),
        "status\n--remote\n127.0.0.1:45678\n"
    );
    assert_eq!(
        argv(
            &["health", "--json"],
            &[("WSD_LISTEN", "unix:/run/wsd.sock")]
        ),
        "status\n--remote\nunix:/run/wsd.sock\n--json\n"
    );
    assert_eq!(argv(&["push", "a b"], &[]), "push\na b\n");
    // Anything else is a program of its own.
    let out = entrypoint(&["echo", "plain"], &[], Some(&fake));
    assert_eq!(text(&out.stdout), "plain\n");
    // Loopback needs no token.
    assert_eq!(
        argv(&[], &[("WSD_LISTEN", "127.0.0.1:9")]),
        "serve\n--root\n/workspace\n--listen\n127.0.0.1:9\n"
    );
}

#[test]
fn the_container_entrypoint_refuses_a_public_listener_without_a_token() {
    let out = entrypoint(&[], &[], None);
    assert_eq!(out.status.code(), Some(64));
    let err = text(&out.stderr);
    assert!(
        err.contains("0.0.0.0:45678") && err.contains("WSD_TOKEN"),
        "{err}"
    );
}

#[test]
fn the_container_health_probe_passes_on_a_live_daemon_and_fails_without_one() {
    let d = Served::start();
    let out = entrypoint(&["health"], &[("WSD_LISTEN", &d.addr)], None);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("current rev"));
    let addr = d.addr.clone();
    drop(d);
    let out = entrypoint(
        &["health", "--timeout", "2s"],
        &[("WSD_LISTEN", &addr)],
        None,
    );
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn sync_watch_picks_up_local_and_daemon_side_edits_without_waiting_for_the_interval() {
    let d = Served::start();
    let local = tempfile::tempdir().unwrap();
    let l = local.path();
    std::fs::write(l.join("first"), b"1").unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    // An hour between safety rounds: only change notifications can make
    // the edits below arrive within the test's bound.
    let child = wsd_command()
        .args([
            "sync",
            "--remote",
            &d.addr,
            "--watch",
            "--interval",
            "3600000",
        ])
        .arg(l)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut child = Kill(child);
    let log_text = || std::fs::read_to_string(log.path()).unwrap_or_default();
    wait_until("the first round did not push `first`", || {
        d.root().join("first").exists()
    });

    std::fs::write(l.join("local-edit"), b"from the local side").unwrap();
    wait_until("a local edit was not pushed", || {
        std::fs::read(d.root().join("local-edit")).ok().as_deref() == Some(b"from the local side")
    });

    std::fs::create_dir(d.root().join("sub")).unwrap();
    std::fs::write(d.root().join("sub/daemon-edit"), b"from the daemon side").unwrap();
    wait_until("a daemon-side edit was not pulled", || {
        std::fs::read(l.join("sub/daemon-edit")).ok().as_deref() == Some(b"from the daemon side")
    });

    std::fs::remove_file(l.join("first")).unwrap();
    wait_until("a local deletion was not pushed", || {
        !d.root().join("first").exists()
    });
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "sync --watch exited: {}",
        log_text()
    );
}
