//! Local agents serve one-shot pushes, pulls and syncs of their directory
//! (`wsd/src/cli/agent.rs`): a running `wsd sync --watch`, or the agent a
//! transfer starts on demand. A push returns only once what was written
//! before it is on the daemon, a pull keeps a local edit made right before
//! it as a conflict copy, and a transfer the agent would not make the same
//! way (other excludes), or with no agent left, walks by itself. The
//! on-demand agent's lifetime: stop, SIGTERM, idle timeout, its directory
//! or state removed; none starts with the switch off.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wsd_tests::{
    Env, STEP, bytes, digest_diff, make_tree, run_bounded, show, text, tree_digest, wait_until,
    write, wsd_bin, wsd_command,
};

/// The `sync --watch` child; killed when dropped.
struct Watching(Child);

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn watch(e: &Env) -> Watching {
    let child = Command::new(wsd_bin())
        .arg("sync")
        .arg(&e.local)
        .args(["--watch", "-q", "--remote", &e.daemon.addr])
        .env_remove("WSD_TOKEN_FILE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let socket = e.local.join(".wsd/agent.sock");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&socket).is_err() {
        assert!(
            Instant::now() < deadline,
            "no agent socket at {}",
            socket.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Watching(child)
}

fn assert_same(a: &Path, b: &Path, what: &str) {
    let (da, db) = (tree_digest(a), tree_digest(b));
    assert!(
        da == db,
        "{what}: trees differ:\n  {}",
        digest_diff(&da, &db, 20).join("\n  ")
    );
}

#[test]
fn a_push_while_sync_watch_runs_is_made_by_it_and_falls_back_to_a_walk_without_it() {
    let e = Env::start();
    make_tree(&e.local, 30, 2);
    e.daemon.transfer("push", &e.local);
    let agent = watch(&e);

    for round in 0..5u64 {
        write(
            &e.local,
            &format!("new/r{round}.txt"),
            &bytes(2000, round),
            0o644,
        );
        std::fs::write(e.local.join("d1/e1/f1.txt"), bytes(300, 50 + round)).unwrap();
        let summary = e.daemon.transfer("push", &e.local);
        assert_eq!(summary["agent"], true, "round {round}: {summary}");
        // Returned: what was written before the push is on the daemon.
        assert_same(&e.local, &e.served, &format!("round {round}"));
    }
    let noop = e.daemon.transfer("push", &e.local);
    assert_eq!(
        (noop["agent"].clone(), noop["entries"].clone()),
        (true.into(), 0.into())
    );

    // Excludes the agent did not start with: the push walks by itself.
    write(&e.local, ".wsdignore", b"*.tmp\n", 0o644);
    let refused = e.daemon.transfer("push", &e.local);
    assert!(refused.get("agent").is_none(), "{refused}");

    // A killed agent leaves its socket; nobody answers, the push walks.
    drop(agent);
    assert!(e.local.join(".wsd/agent.sock").exists());
    write(&e.local, "after/x.txt", b"after the agent", 0o600);
    let walked = e.daemon.transfer("push", &e.local);
    assert!(walked.get("agent").is_none(), "{walked}");
    assert_eq!(
        std::fs::read(e.served.join("after/x.txt")).unwrap(),
        b"after the agent"
    );
}

/// `wsd VERB LOCAL --json ARGS…` as a user runs it: it may start or use an
/// on-demand agent (`WSD_AGENT` unset). Its JSON summaries (a sync prints
/// two) and stderr. The agent's idle timeout is short enough that a
/// failing test leaks none for long.
fn on_demand(e: &Env, verb: &str, args: &[&str]) -> (Vec<serde_json::Value>, String) {
    let mut all = vec![verb, e.local.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    let mut cmd = e.daemon.command(&all);
    cmd.env_remove("WSD_AGENT")
        .env("WSD_AGENT_IDLE_TIMEOUT", "60");
    let out = run_bounded(&mut cmd, None, STEP);
    assert!(out.status.success(), "wsd {verb} failed: {}", show(&out));
    let summaries = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (summaries, text(&out.stderr))
}

/// `wsd push LOCAL --json ARGS…` through [`on_demand`]: its summary.
fn push_on_demand(e: &Env, args: &[&str]) -> serde_json::Value {
    let (mut summaries, _) = on_demand(e, "push", args);
    summaries.pop().expect("a JSON summary")
}

/// `wsd agent VERB LOCAL`'s output, asserting success.
fn agent_cli(local: &Path, verb: &str, args: &[&str]) -> std::process::Output {
    let mut cmd = wsd_command();
    cmd.args(["agent", verb]).arg(local).args(args);
    let out = run_bounded(&mut cmd, None, STEP);
    assert!(
        out.status.success(),
        "wsd agent {verb} failed: {}",
        show(&out)
    );
    out
}

/// The pid of the agent serving `local`, if one answers.
fn agent_pid(local: &Path) -> Option<u32> {
    let out = agent_cli(local, "status", &["--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    (v["running"] == true).then(|| v["pid"].as_u64().unwrap() as u32)
}

/// Waits for an agent other than `not` to serve `local`; its pid.
fn wait_for_agent(local: &Path, not: Option<u32>) -> u32 {
    let mut pid = None;
    wait_until("an agent serving the directory", || {
        pid = agent_pid(local).filter(|p| Some(*p) != not);
        pid.is_some()
    });
    pid.unwrap()
}

/// Whether process `pid` still runs (an exited one waiting for its reaper
/// does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z') && !rest.starts_with('X'))
}

/// Kills the agent with this pid when dropped, if it still runs: no test
/// leaves one behind, whatever fails.
struct Reap(u32);

impl Drop for Reap {
    fn drop(&mut self) {
        if alive(self.0) {
            let _ = Command::new("kill")
                .args(["-9", &self.0.to_string()])
                .status();
        }
    }
}

fn agent_log(local: &Path) -> String {
    std::fs::read_to_string(local.join(".wsd").join("agent.log")).unwrap_or_default()
}

#[test]
fn a_push_starts_an_agent_that_makes_the_next_pushes_and_sees_every_write_before_them() {
    let e = Env::start();
    make_tree(&e.local, 30, 3);
    let first = push_on_demand(&e, &[]);
    assert!(first.get("agent").is_none(), "{first}");
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);

    for round in 0..5u64 {
        // Written right before the push: the agent's watcher barrier must
        // see them.
        write(
            &e.local,
            &format!("new/r{round}.txt"),
            &bytes(1500, round),
            0o644,
        );
        std::fs::write(e.local.join("d1/e1/f1.txt"), bytes(200, 90 + round)).unwrap();
        let summary = push_on_demand(&e, &[]);
        assert_eq!(summary["agent"], true, "round {round}: {summary}");
        assert_same(&e.local, &e.served, &format!("round {round}"));
    }
    std::fs::remove_file(e.local.join("new/r0.txt")).unwrap();
    let deleted = push_on_demand(&e, &[]);
    assert_eq!(deleted["agent"], true, "{deleted}");
    assert!(!e.served.join("new/r0.txt").exists());
    let noop = push_on_demand(&e, &[]);
    assert_eq!(
        (noop["agent"].clone(), noop["entries"].clone()),
        (true.into(), 0.into())
    );
    let out = agent_cli(&e.local, "status", &["--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (status["pid"].clone(), status["pushes"].clone()),
        (pid.into(), 7.into()),
        "one agent made them all: {status}"
    );

    let out = agent_cli(&e.local, "stop", &[]);
    assert!(
        text(&out.stderr).contains(&format!("pid {pid}")),
        "{}",
        show(&out)
    );
    assert!(!alive(pid));
    assert!(!e.local.join(".wsd/agent.sock").exists());
    assert!(agent_log(&e.local).contains("asked to stop"));
}

#[test]
fn an_agent_whose_excludes_changed_refuses_exits_and_the_next_one_has_them() {
    let e = Env::start();
    make_tree(&e.local, 10, 4);
    push_on_demand(&e, &[]);
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);

    write(&e.local, ".wsdignore", b"*.tmp\n", 0o644);
    write(&e.local, "scratch.tmp", b"not to be sent", 0o644);
    let walked = push_on_demand(&e, &[]);
    assert!(walked.get("agent").is_none(), "{walked}");
    wait_until("the stale agent to exit", || !alive(pid));
    let next = wait_for_agent(&e.local, Some(pid));
    let _reap_next = Reap(next);
    write(&e.local, "more.tmp", b"nor this", 0o644);
    write(&e.local, "kept.txt", b"but this", 0o644);
    let served = push_on_demand(&e, &[]);
    assert_eq!(served["agent"], true, "{served}");
    assert_eq!(
        std::fs::read(e.served.join("kept.txt")).unwrap(),
        b"but this"
    );
    assert!(!e.served.join("scratch.tmp").exists());
    assert!(!e.served.join("more.tmp").exists());
}

#[test]
fn an_agent_exits_when_its_directory_or_its_state_directory_is_removed() {
    for remove_state in [false, true] {
        let e = Env::start();
        make_tree(&e.local, 10, 5);
        push_on_demand(&e, &[]);
        let pid = wait_for_agent(&e.local, None);
        let _reap = Reap(pid);
        let gone = if remove_state {
            e.local.join(".wsd")
        } else {
            e.local.clone()
        };
        std::fs::remove_dir_all(&gone).unwrap();
        wait_until(
            &format!("the agent to exit after {} went", gone.display()),
            || !alive(pid),
        );
    }
}

#[test]
fn the_switch_off_starts_no_agent_and_no_agent_neither_asks_nor_starts_one() {
    let e = Env::start();
    make_tree(&e.local, 10, 6);
    // WSD_AGENT=off: as every other test's pushes run (`wsd_command`).
    for _ in 0..2 {
        let s = e.daemon.transfer("push", &e.local);
        assert!(s.get("agent").is_none(), "{s}");
    }
    push_on_demand(&e, &["--no-agent"]);
    // The log is opened by the push that starts an agent, before it does.
    assert!(!e.local.join(".wsd/agent.log").exists());
    assert_eq!(agent_pid(&e.local), None);

    // With one running, --no-agent still walks by itself.
    push_on_demand(&e, &[]);
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);
    write(&e.local, "direct.txt", b"walked", 0o644);
    let direct = push_on_demand(&e, &["--no-agent"]);
    assert!(direct.get("agent").is_none(), "{direct}");
    assert_eq!(
        std::fs::read(e.served.join("direct.txt")).unwrap(),
        b"walked"
    );
    agent_cli(&e.local, "stop", &[]);
    assert!(!alive(pid));
}

#[test]
fn a_killed_agent_makes_the_next_push_walk_and_start_another_which_sigterm_ends() {
    let e = Env::start();
    make_tree(&e.local, 10, 7);
    push_on_demand(&e, &[]);
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);
    assert!(
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    wait_until("the killed agent to go", || !alive(pid));

    write(
        &e.local,
        "after/kill.txt",
        b"walked past a dead agent",
        0o644,
    );
    let walked = push_on_demand(&e, &[]);
    assert!(walked.get("agent").is_none(), "{walked}");
    assert_eq!(
        std::fs::read(e.served.join("after/kill.txt")).unwrap(),
        b"walked past a dead agent"
    );
    let next = wait_for_agent(&e.local, Some(pid));
    let _reap_next = Reap(next);
    write(&e.local, "after/next.txt", b"by the new agent", 0o644);
    let served = push_on_demand(&e, &[]);
    assert_eq!(served["agent"], true, "{served}");
    assert_same(&e.local, &e.served, "after the new agent's push");

    assert!(
        Command::new("kill")
            .args(["-TERM", &next.to_string()])
            .status()
            .unwrap()
            .success()
    );
    wait_until("the agent to exit on SIGTERM", || !alive(next));
    assert!(!e.local.join(".wsd/agent.sock").exists());
    assert!(agent_log(&e.local).contains("SIGTERM"));
}

#[test]
fn an_idle_agent_exits_after_its_timeout() {
    let e = Env::start();
    make_tree(&e.local, 10, 8);
    let mut cmd = e.daemon.command(&["push", e.local.to_str().unwrap(), "-q"]);
    cmd.env_remove("WSD_AGENT")
        .env("WSD_AGENT_IDLE_TIMEOUT", "1");
    let out = run_bounded(&mut cmd, None, STEP);
    assert!(out.status.success(), "{}", show(&out));
    // It may already have gone: then the log says so.
    wait_until("the idle agent to exit", || {
        agent_log(&e.local).contains("no transfer asked for 1s")
    });
    assert_eq!(agent_pid(&e.local), None);
}

#[test]
fn sync_watch_takes_over_from_an_on_demand_agent_which_agent_stop_leaves_running() {
    let e = Env::start();
    make_tree(&e.local, 10, 9);
    push_on_demand(&e, &[]);
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);

    let _watching = watch(&e);
    wait_until("`sync --watch` to serve the pushes", || {
        let out = agent_cli(&e.local, "status", &["--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["kind"] == "sync_watch"
    });
    assert!(!alive(pid), "the on-demand agent stepped aside");
    write(&e.local, "watched.txt", b"by sync --watch", 0o644);
    let served = push_on_demand(&e, &[]);
    assert_eq!(served["agent"], true, "{served}");
    assert_eq!(
        std::fs::read(e.served.join("watched.txt")).unwrap(),
        b"by sync --watch"
    );

    let mut cmd = wsd_command();
    cmd.args(["agent", "stop"]).arg(&e.local);
    let out = run_bounded(&mut cmd, None, STEP);
    assert!(!out.status.success(), "{}", show(&out));
    assert!(text(&out.stderr).contains("sync --watch"), "{}", show(&out));
}

#[test]
fn an_agent_whose_index_was_removed_refuses_exits_and_the_push_walks() {
    let e = Env::start();
    make_tree(&e.local, 10, 10);
    push_on_demand(&e, &[]);
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);
    let index = e.local.join(".wsd/index.sqlite3");
    assert!(index.exists());
    for suffix in ["", "-wal", "-shm", ".clean"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", index.display()));
    }
    write(&e.local, "after/index.txt", b"seen by a walk", 0o644);
    let walked = push_on_demand(&e, &[]);
    assert!(walked.get("agent").is_none(), "{walked}");
    assert_same(&e.local, &e.served, "after the index went");
    wait_until("the agent to exit", || !alive(pid));
    let next = wait_for_agent(&e.local, Some(pid));
    let _reap_next = Reap(next);
    let served = push_on_demand(&e, &[]);
    assert_eq!(
        (served["agent"].clone(), served["entries"].clone()),
        (true.into(), 0.into())
    );
}

#[test]
fn an_agent_whose_daemon_restarted_retires_and_the_push_walks_and_starts_another() {
    let mut e = Env::start();
    make_tree(&e.local, 10, 11);
    push_on_demand(&e, &[]);
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);
    // The agent's connection dies with the daemon.
    e.daemon.restart();
    write(&e.local, "after/restart.txt", b"pushed all the same", 0o644);
    let walked = push_on_demand(&e, &[]);
    assert!(walked.get("agent").is_none(), "{walked}");
    assert_eq!(
        std::fs::read(e.served.join("after/restart.txt")).unwrap(),
        b"pushed all the same"
    );
    wait_until("the agent to exit", || !alive(pid));
    let next = wait_for_agent(&e.local, Some(pid));
    let _reap_next = Reap(next);
    write(&e.local, "after/next.txt", b"by the new agent", 0o644);
    let served = push_on_demand(&e, &[]);
    assert_eq!(served["agent"], true, "{served}");
    assert_same(&e.local, &e.served, "after the daemon's restart");
}

#[test]
fn pulls_and_syncs_are_made_by_the_agent_a_pull_started_and_keep_local_edits_as_copies() {
    let e = Env::start();
    make_tree(&e.local, 20, 12);
    write(&e.local, "shared.txt", b"as first pushed", 0o644);
    e.daemon.transfer("push", &e.local);

    // A pull no agent answers walks, then starts one.
    write(
        &e.served,
        "from/daemon.txt",
        b"written on the daemon",
        0o644,
    );
    let (walked, _) = on_demand(&e, "pull", &[]);
    assert!(walked[0].get("agent").is_none(), "{walked:?}");
    assert_same(&e.local, &e.served, "after the walking pull");
    let pid = wait_for_agent(&e.local, None);
    let _reap = Reap(pid);

    write(&e.served, "from/second.txt", b"the daemon's second", 0o644);
    let (pulled, _) = on_demand(&e, "pull", &[]);
    assert_eq!(
        (pulled[0]["op"].clone(), pulled[0]["agent"].clone()),
        ("pull".into(), true.into()),
        "{pulled:?}"
    );
    assert_same(&e.local, &e.served, "after the agent's pull");

    // Edited on both sides, the local edit right before the pull: the
    // agent's barrier sees it, so the pull keeps it as a conflict copy.
    write(&e.served, "shared.txt", b"the daemon's version", 0o644);
    std::fs::write(e.local.join("shared.txt"), b"the local version").unwrap();
    let (pulled, stderr) = on_demand(&e, "pull", &[]);
    assert_eq!(pulled[0]["agent"], true, "{pulled:?}");
    let copies = pulled[0]["conflicts"].as_array().unwrap();
    assert_eq!(copies.len(), 1, "{pulled:?}");
    assert_eq!(copies[0]["path"], "shared.txt");
    let copy = e.local.join(copies[0]["copy"].as_str().unwrap());
    assert_eq!(std::fs::read(&copy).unwrap(), b"the local version");
    assert_eq!(
        std::fs::read(e.local.join("shared.txt")).unwrap(),
        b"the daemon's version"
    );
    assert!(
        stderr.contains("conflict: shared.txt changed on both sides"),
        "{stderr}"
    );
    std::fs::remove_file(&copy).unwrap();

    // A sync: both ways, by the agent, one summary each.
    write(&e.served, "from/third.txt", b"the daemon's third", 0o644);
    write(&e.local, "to/daemon.txt", b"written here", 0o644);
    let (synced, _) = on_demand(&e, "sync", &[]);
    let ops: Vec<_> = synced
        .iter()
        .map(|s| (s["op"].clone(), s["agent"].clone()))
        .collect();
    assert_eq!(
        ops,
        [("pull".into(), true.into()), ("push".into(), true.into())],
        "{synced:?}"
    );
    assert_same(&e.local, &e.served, "after the agent's sync");

    let out = agent_cli(&e.local, "status", &["--json"]);
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (
            status["pid"].clone(),
            status["pulls"].clone(),
            status["pushes"].clone()
        ),
        (pid.into(), 3.into(), 1.into()),
        "{status}"
    );

    // --no-agent walks by itself, and so does a sync with an exclude.
    write(&e.served, "from/fourth.txt", b"the daemon's fourth", 0o644);
    let (direct, _) = on_demand(&e, "pull", &["--no-agent"]);
    assert!(direct[0].get("agent").is_none(), "{direct:?}");
    let (direct, _) = on_demand(&e, "sync", &["--exclude", "*.tmp"]);
    assert!(
        direct.iter().all(|s| s.get("agent").is_none()),
        "{direct:?}"
    );
    assert_same(&e.local, &e.served, "after the direct transfers");
    agent_cli(&e.local, "stop", &[]);
}
