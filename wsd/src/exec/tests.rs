//! Behaviour of the exec manager against real `/bin/sh` processes and real
//! SQLite files in temp dirs. Every wait is bounded (`STEP`), and ordering
//! is forced with FIFOs ("gates") rather than sleeps.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use wsd_sync::ErrorCode;

use super::*;

/// Longest wait for any single event.
const STEP: Duration = Duration::from_secs(20);

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    db: PathBuf,
    manager: ExecManager,
}

fn test_config(dir: &Path) -> ExecConfig {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).unwrap();
    let mut config = ExecConfig::new(&root, dir.join("exec.db"));
    config.kill_grace = Duration::from_millis(300);
    // An explicit daemon environment, so the allowlist is tested without
    // touching the test process's own.
    config.daemon_env = vec![
        (
            "PATH".into(),
            std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin")),
        ),
        ("LC_ALL".into(), "C".into()),
        ("TERM".into(), "dumb".into()),
        ("WSD_TEST_SECRET".into(), "hunter2".into()),
    ];
    config
}

fn noop_settle() -> SettleHook {
    Arc::new(|| Box::pin(async { Ok(0) }))
}

fn fixture_with(adjust: impl FnOnce(&mut ExecConfig), settle: SettleHook) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    adjust(&mut config);
    let (root, db) = (
        std::fs::canonicalize(&config.root).unwrap(),
        config.db_path.clone(),
    );
    let manager = ExecManager::open(config, settle).unwrap();
    Fixture {
        _dir: dir,
        root,
        db,
        manager,
    }
}

fn fixture() -> Fixture {
    fixture_with(|_| {}, noop_settle())
}

fn req(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        ..ExecRequest::default()
    }
}

fn req_id(command: &str, id: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        id: Some(id.into()),
        ..ExecRequest::default()
    }
}

async fn next(sub: &mut Subscription) -> Option<Result<ExecEvent, ExecError>> {
    tokio::time::timeout(STEP, sub.next())
        .await
        .expect("no event within the step timeout")
}

async fn next_event(sub: &mut Subscription) -> ExecEvent {
    next(sub)
        .await
        .expect("stream ended")
        .expect("stream error")
}

/// Every remaining event up to the end of the stream; panics on an error.
async fn collect(sub: &mut Subscription) -> Vec<ExecEvent> {
    let mut out = Vec::new();
    while let Some(ev) = next(sub).await {
        out.push(ev.unwrap_or_else(|e| panic!("stream error after {} events: {e}", out.len())));
    }
    out
}

fn stdout_of(events: &[ExecEvent]) -> Vec<u8> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Stdout(d) => Some(d.as_slice()),
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
            EventKind::Stderr(d) => Some(d.as_slice()),
            _ => None,
        })
        .flatten()
        .copied()
        .collect()
}

/// The exit code, asserting that the exit is the last event and that seqs
/// run by one from `first_seq`.
fn exit_of(events: &[ExecEvent], first_seq: u64) -> i32 {
    for (i, e) in events.iter().enumerate() {
        assert_eq!(
            e.seq,
            first_seq + i as u64,
            "seqs must run by one: {events:?}"
        );
    }
    match events.last().map(|e| &e.kind) {
        Some(EventKind::Exit(code)) => *code,
        other => panic!("last event is not an exit: {other:?}"),
    }
}

fn assert_code<T: std::fmt::Debug>(r: Result<T, ExecError>, code: ErrorCode) {
    match r {
        Err(e) => assert_eq!(e.code(), code, "{e}"),
        Ok(v) => panic!("expected {code}, got Ok({v:?})"),
    }
}

fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

/// Opens a gate FIFO for writing (which waits for the command's reader) and
/// writes `line`.
async fn open_gate(path: &Path, line: &str) {
    let (path, line) = (path.to_owned(), line.to_owned());
    tokio::time::timeout(
        STEP,
        tokio::task::spawn_blocking(move || std::fs::write(path, line)),
    )
    .await
    .expect("the command never opened its gate")
    .unwrap()
    .unwrap();
}

/// Reads events until the accumulated stdout contains `needle`.
async fn read_until(sub: &mut Subscription, needle: &str) -> Vec<ExecEvent> {
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&stdout_of(&seen)).contains(needle) {
        seen.push(next_event(sub).await);
    }
    seen
}

/// Gone or a zombie: either way it runs no more code.
fn process_is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn wait_gone(pid: i32) {
    for _ in 0..200 {
        if process_is_gone(pid) {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("process {pid} survived");
}

fn wait_for_comm(pid: i32, comm: &str) {
    for _ in 0..400 {
        if std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm) {
            return;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("process {pid} never became {comm:?}");
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap()
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect()
}

async fn last_logged_seq(m: &ExecManager, id: &str) -> u64 {
    read_meta(&m.shared.reader, id)
        .await
        .unwrap()
        .unwrap()
        .last_seq
}

#[tokio::test]
async fn output_and_exit_code_arrive_in_order() {
    let f = fixture();
    let (id, mut sub) = f
        .manager
        .exec(req("echo hello; echo oops >&2; echo bye; exit 7"))
        .await
        .unwrap();
    assert_eq!(id.len(), 32, "generated ids are 128-bit hex");
    let events = collect(&mut sub).await;
    assert_eq!(exit_of(&events, 1), 7);
    assert_eq!(stdout_of(&events), b"hello\nbye\n");
    assert_eq!(stderr_of(&events), b"oops\n");
    assert!(events.iter().all(|e| e.id == id));
    // The log holds the same events.
    let replay = collect(&mut f.manager.get(&id, After::All).await.unwrap()).await;
    assert_eq!(replay, events);
}

#[tokio::test]
async fn output_arrives_exactly_once_across_a_disconnect() {
    let f = fixture();
    mkfifo(&f.root.join("gate"));
    let (id, mut sub) = f
        .manager
        .exec(req(
            r#"echo one; read line < gate; echo "$line"; echo three"#,
        ))
        .await
        .unwrap();
    let first = next_event(&mut sub).await;
    assert_eq!(
        (first.seq, first.kind.clone()),
        (1, EventKind::Stdout(b"one\n".to_vec()))
    );
    drop(sub); // the client's connection drops mid-stream
    open_gate(&f.root.join("gate"), "two\n").await;

    let rest = collect(&mut f.manager.get(&id, After::Seq(first.seq)).await.unwrap()).await;
    assert_eq!(exit_of(&rest, 2), 0);
    assert_eq!(stdout_of(&rest), b"two\nthree\n");
    let all = collect(&mut f.manager.get(&id, After::All).await.unwrap()).await;
    assert_eq!(all[0], first);
    assert_eq!(all[1..], rest[..]);
}

#[tokio::test]
async fn after_all_replays_everything_and_tail_sees_only_future_events() {
    let f = fixture();
    mkfifo(&f.root.join("gate"));
    let (id, mut sub) = f
        .manager
        .exec(req("echo one; read l < gate; echo two"))
        .await
        .unwrap();
    assert_eq!(stdout_of(&[next_event(&mut sub).await]), b"one\n");
    let mut tail = f.manager.get(&id, After::Tail).await.unwrap();
    let mut all = f.manager.get(&id, After::All).await.unwrap();
    open_gate(&f.root.join("gate"), "\n").await;

    let original = collect(&mut sub).await;
    let tail = collect(&mut tail).await;
    let all = collect(&mut all).await;
    assert_eq!(stdout_of(&original), b"two\n");
    assert_eq!(
        tail, original,
        "tail starts after the events delivered before it attached"
    );
    assert_eq!(stdout_of(&all), b"one\ntwo\n");
    assert_eq!(exit_of(&all, 1), 0);

    // On a finished exec, tail is an ended stream and All is a full replay.
    assert!(
        next(&mut f.manager.get(&id, After::Tail).await.unwrap())
            .await
            .is_none()
    );
    assert_eq!(
        collect(&mut f.manager.get(&id, After::All).await.unwrap()).await,
        all
    );
    // Resuming at or past the exit also ends at once.
    let exit_seq = all.last().unwrap().seq;
    assert!(
        next(&mut f.manager.get(&id, After::Seq(exit_seq)).await.unwrap())
            .await
            .is_none()
    );
}

#[tokio::test]
async fn a_live_id_is_busy_and_a_finished_id_can_be_reused() {
    let f = fixture();
    let (_, mut sub) = f
        .manager
        .exec(req_id("echo ready; sleep 30", "job"))
        .await
        .unwrap();
    read_until(&mut sub, "ready").await;
    assert_code(
        f.manager.exec(req_id("echo again", "job")).await,
        ErrorCode::ExecBusy,
    );
    f.manager.kill("job", None).await.unwrap();
    assert_eq!(exit_of(&collect(&mut sub).await, 2), 143);
    // Killing a finished exec is an error: nothing was signalled.
    assert_code(
        f.manager.kill("job", Some("KILL")).await,
        ErrorCode::NotFound,
    );

    let (id, mut sub) = f.manager.exec(req_id("echo again", "job")).await.unwrap();
    assert_eq!(id, "job");
    assert_eq!(stdout_of(&collect(&mut sub).await), b"again\n");
    let replay = collect(&mut f.manager.get("job", After::All).await.unwrap()).await;
    assert_eq!(
        stdout_of(&replay),
        b"again\n",
        "the reused id's log replaced the old one"
    );
}

#[tokio::test]
async fn unknown_ids_are_not_found() {
    let f = fixture();
    assert_code(f.manager.get("nope", After::All).await, ErrorCode::NotFound);
    assert_code(f.manager.kill("nope", None).await, ErrorCode::NotFound);
    assert_code(f.manager.dispose("nope").await, ErrorCode::NotFound);
}

#[tokio::test]
async fn kill_ends_the_whole_process_group() {
    let f = fixture();
    let cmd = "sleep 100 & echo $! > pids; sleep 100 & echo $! >> pids; echo ready; wait";
    let (id, mut sub) = f.manager.exec(req(cmd)).await.unwrap();
    read_until(&mut sub, "ready").await;
    let pids = read_pids(&f.root.join("pids"));
    assert_eq!(pids.len(), 2);
    assert!(
        pids.iter().all(|&p| !process_is_gone(p)),
        "the children run before the kill"
    );
    f.manager.kill(&id, None).await.unwrap();
    assert_eq!(
        exit_of(&collect(&mut sub).await, 2),
        128 + nix::sys::signal::Signal::SIGTERM as i32
    );
    for pid in pids {
        wait_gone(pid);
    }
}

#[tokio::test]
async fn kill_takes_signal_names_and_numbers_and_escalates_to_sigkill() {
    let f = fixture();
    assert_code(f.manager.kill("x", Some("BOGUS")).await, ErrorCode::Invalid);
    for (signal, code) in [("KILL", 137), ("9", 137), ("SIGINT", 130), ("hup", 129)] {
        let (id, mut sub) = f
            .manager
            .exec(req("echo $$ > pid; echo ready; exec sleep 100"))
            .await
            .unwrap();
        read_until(&mut sub, "ready").await;
        // dash catches SIGINT and would lose one that lands just before the
        // exec; signal the sleep itself, once it runs.
        wait_for_comm(read_pids(&f.root.join("pid"))[0], "sleep");
        f.manager.kill(&id, Some(signal)).await.unwrap();
        assert_eq!(exit_of(&collect(&mut sub).await, 2), code, "{signal}");
    }
    // A group that ignores SIGTERM gets SIGKILL after the grace period.
    let (id, mut sub) = f
        .manager
        .exec(req("trap '' TERM; echo ready; sleep 100"))
        .await
        .unwrap();
    read_until(&mut sub, "ready").await;
    f.manager.kill(&id, None).await.unwrap();
    assert_eq!(exit_of(&collect(&mut sub).await, 2), 137);
}

#[tokio::test]
async fn a_command_killed_by_a_signal_exits_with_128_plus_the_signal() {
    let f = fixture();
    let (_, mut sub) = f.manager.exec(req("kill -USR1 $$")).await.unwrap();
    assert_eq!(
        exit_of(&collect(&mut sub).await, 1),
        128 + nix::sys::signal::Signal::SIGUSR1 as i32
    );
}

#[tokio::test]
async fn timeout_terms_the_group_then_kills_it_after_the_grace() {
    let f = fixture_with(
        |c| c.default_timeout = Some(Duration::from_millis(200)),
        noop_settle(),
    );
    let started = std::time::Instant::now();
    let (_, mut sub) = f.manager.exec(req("sleep 100")).await.unwrap();
    assert_eq!(
        exit_of(&collect(&mut sub).await, 1),
        143,
        "the default timeout applies"
    );

    let timed = ExecRequest {
        timeout_ms: Some(100),
        ..req("trap '' TERM; sleep 100")
    };
    let (_, mut sub) = f.manager.exec(timed).await.unwrap();
    assert_eq!(
        exit_of(&collect(&mut sub).await, 1),
        137,
        "SIGKILL follows an ignored SIGTERM"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    let untimed = ExecRequest {
        timeout_ms: Some(0),
        ..req("sleep 0.4; echo done")
    };
    let (_, mut sub) = f.manager.exec(untimed).await.unwrap();
    let events = collect(&mut sub).await;
    assert_eq!(
        (stdout_of(&events), exit_of(&events, 1)),
        (b"done\n".to_vec(), 0),
        "0 disables it"
    );
}

#[tokio::test]
async fn the_daemon_environment_is_filtered_by_the_allowlist() {
    let f = fixture();
    let call = ExecRequest {
        env: vec![
            ("FOO".into(), "bar".into()),
            ("TERM".into(), "xterm".into()),
        ],
        ..req("env")
    };
    let (_, mut sub) = f.manager.exec(call).await.unwrap();
    let events = collect(&mut sub).await;
    let env = String::from_utf8(stdout_of(&events)).unwrap();
    let lines: Vec<&str> = env.lines().collect();
    assert!(lines.iter().any(|l| l.starts_with("PATH=")), "{env}");
    assert!(lines.contains(&"LC_ALL=C"), "{env}");
    assert!(lines.contains(&"FOO=bar"), "{env}");
    assert!(lines.contains(&"TERM=xterm"), "the call's env wins: {env}");
    assert!(
        !env.contains("WSD_TEST_SECRET") && !env.contains("hunter2"),
        "{env}"
    );
}

#[tokio::test]
async fn stdin_bytes_are_written_then_closed() {
    let f = fixture();
    let call = ExecRequest {
        stdin: Some(b"hello\nworld".to_vec()),
        ..req("cat")
    };
    let (_, mut sub) = f.manager.exec(call).await.unwrap();
    assert_eq!(stdout_of(&collect(&mut sub).await), b"hello\nworld");

    // More than a pipe buffer, to a reader that counts it all.
    let call = ExecRequest {
        stdin: Some(vec![b'z'; 1 << 20]),
        ..req("wc -c")
    };
    let (_, mut sub) = f.manager.exec(call).await.unwrap();
    assert_eq!(
        String::from_utf8(stdout_of(&collect(&mut sub).await))
            .unwrap()
            .trim(),
        "1048576"
    );

    // Without stdin the command reads /dev/null rather than hanging.
    let (_, mut sub) = f.manager.exec(req("cat")).await.unwrap();
    let events = collect(&mut sub).await;
    assert_eq!((stdout_of(&events).len(), exit_of(&events, 1)), (0, 0));
}

#[tokio::test]
async fn binary_output_round_trips_through_the_log() {
    let f = fixture();
    let bytes: Vec<u8> = (0..=255u8).cycle().take(256 * 4).collect();
    let call = ExecRequest {
        stdin: Some(bytes.clone()),
        ..req("cat; cat /dev/null >&2")
    };
    let (id, mut sub) = f.manager.exec(call).await.unwrap();
    assert_eq!(stdout_of(&collect(&mut sub).await), bytes);
    assert_eq!(
        stdout_of(&collect(&mut f.manager.get(&id, After::All).await.unwrap()).await),
        bytes
    );
}

#[tokio::test]
async fn eviction_keeps_a_window_and_resuming_below_it_is_truncated() {
    const CAP: u64 = 100 * 1024;
    const OUT: usize = 200 * 1024;
    let f = fixture_with(|c| c.per_exec_cap = CAP, noop_settle());
    mkfifo(&f.root.join("gate"));
    // More than the cap, in pipe reads of at most 64 KiB: several events,
    // and the oldest must go.
    let cmd = format!("head -c {OUT} /dev/zero; read l < gate; echo done");
    let (id, mut sub) = f.manager.exec(req(&cmd)).await.unwrap();
    let mut live = Vec::new();
    while stdout_of(&live).len() < OUT {
        live.push(next_event(&mut sub).await);
    }
    assert!(live.len() >= 4, "pipe reads are at most 64 KiB");

    // The window is the longest suffix of events that fits in the cap.
    let mut first = live.len();
    let mut bytes = 0u64;
    while first > 0 && bytes + live[first - 1].kind.payload_len() as u64 <= CAP {
        first -= 1;
        bytes += live[first].kind.payload_len() as u64;
    }
    let first_seq = live[first].seq;
    assert!(first_seq > 1);
    let mut window = f.manager.get(&id, After::Seq(first_seq - 1)).await.unwrap();
    for expected in &live[first..] {
        assert_eq!(&next_event(&mut window).await, expected);
    }
    assert_code(
        f.manager.get(&id, After::Seq(first_seq - 2)).await,
        ErrorCode::LogTruncated,
    );
    // A refused resume holds no subscriber slot (more than the limit).
    for _ in 0..MAX_SUBSCRIBERS_PER_EXEC + 2 {
        assert_code(
            f.manager.get(&id, After::All).await,
            ErrorCode::LogTruncated,
        );
    }
    let mut later = f.manager.get(&id, After::Tail).await.unwrap();

    // The live streams carry on.
    open_gate(&f.root.join("gate"), "\n").await;
    let rest = collect(&mut sub).await;
    assert_eq!(stdout_of(&rest), b"done\n");
    assert_eq!(exit_of(&rest, live.last().unwrap().seq + 1), 0);
    assert_eq!(collect(&mut later).await, rest);
    assert_eq!(collect(&mut window).await, rest);
    assert_code(
        f.manager.get(&id, After::All).await,
        ErrorCode::LogTruncated,
    );
}

#[tokio::test]
async fn the_global_cap_evicts_finished_execs_first_and_keeps_their_exit() {
    let f = fixture_with(|c| c.global_cap = 150 * 1024, noop_settle());
    let (a, mut sub) = f
        .manager
        .exec(req("head -c 102400 /dev/zero"))
        .await
        .unwrap();
    let a_events = collect(&mut sub).await;
    let (b, mut sub) = f
        .manager
        .exec(req("head -c 102400 /dev/zero"))
        .await
        .unwrap();
    let b_events = collect(&mut sub).await;

    assert_code(f.manager.get(&a, After::All).await, ErrorCode::LogTruncated);
    assert_eq!(
        collect(&mut f.manager.get(&b, After::All).await.unwrap()).await,
        b_events
    );
    let a_exit = a_events.last().unwrap();
    let tail = collect(&mut f.manager.get(&a, After::Seq(a_exit.seq - 1)).await.unwrap()).await;
    assert_eq!(tail, std::slice::from_ref(a_exit));
}

#[test]
fn a_restart_keeps_finished_logs_and_marks_running_execs_lost() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path());
    let root = config.root.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (manager, kept) = rt.block_on(async {
        let m = ExecManager::open(config.clone(), noop_settle()).unwrap();
        let (_, mut sub) = m.exec(req_id("echo kept", "done")).await.unwrap();
        let kept = collect(&mut sub).await;
        let (_, mut sub) = m
            .exec(req_id(
                "echo $$ > pid; echo started; exec sleep 100",
                "running",
            ))
            .await
            .unwrap();
        read_until(&mut sub, "started").await;
        (m, kept)
    });
    let pid = read_pids(&root.join("pid"))[0];
    // The runtime dies with the runner mid-flight: as far as the log is
    // concerned, the daemon crashed. The runner's guard still kills the group.
    drop(rt);
    drop(manager);
    wait_gone(pid);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let m = ExecManager::open(config, noop_settle()).unwrap();
        let lost = collect(&mut m.get("running", After::All).await.unwrap()).await;
        assert_eq!(stdout_of(&lost), b"started\n");
        assert_eq!(exit_of(&lost, 1), EXIT_LOST);
        assert_eq!(
            collect(&mut m.get("done", After::All).await.unwrap()).await,
            kept
        );
        // Both are finished now: their ids can be reused.
        let (_, mut sub) = m.exec(req_id("true", "running")).await.unwrap();
        assert_eq!(exit_of(&collect(&mut sub).await, 1), 0);
    });
}

#[tokio::test]
async fn the_settle_hook_runs_before_exit_is_logged_and_its_rev_goes_with_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("exec.db");
    let seen: Arc<Mutex<Vec<i64>>> = Arc::default();
    let hook: SettleHook = {
        let (seen, db) = (seen.clone(), db.clone());
        Arc::new(move || {
            let (seen, db) = (seen.clone(), db.clone());
            Box::pin(async move {
                // A store's settle runs on a thread of its own; the hook's
                // future waits for it.
                tokio::task::spawn_blocking(move || {
                    let conn = rusqlite::Connection::open(&db).unwrap();
                    let exits: i64 = conn
                        .query_row("SELECT count(*) FROM exec_event WHERE kind = 2", [], |r| {
                            r.get(0)
                        })
                        .unwrap();
                    seen.lock().unwrap().push(exits);
                })
                .await
                .unwrap();
                Ok(41)
            })
        })
    };
    let mut config = test_config(dir.path());
    config.db_path = db;
    let m = ExecManager::open(config, hook).unwrap();
    let (id, mut sub) = m
        .exec(req("echo written > out.txt; echo hi"))
        .await
        .unwrap();
    let exit = loop {
        let ev = next_event(&mut sub).await;
        if ev.is_exit() {
            break ev;
        }
    };
    assert_eq!(
        seen.lock().unwrap().clone(),
        vec![0],
        "the hook ran once, before the exit row was logged"
    );
    assert_eq!(exit.rev, 41, "the live exit carries the settle's rev");
    // Replayed from the log, the exit says nothing (the server fills in
    // the rev as of its sending).
    let mut replay = m.get(&id, After::All).await.unwrap();
    let replayed = collect(&mut replay).await;
    let last = replayed.last().expect("events");
    assert!(last.is_exit());
    assert_eq!(last.rev, 0);
}

#[tokio::test]
async fn a_failing_settle_hook_is_noted_on_stderr_and_the_exit_still_follows() {
    let f = fixture_with(
        |_| {},
        Arc::new(|| Box::pin(async { Err("disk on fire".into()) })),
    );
    let (_, mut sub) = f.manager.exec(req("exit 3")).await.unwrap();
    let events = collect(&mut sub).await;
    assert_eq!(exit_of(&events, 1), 3);
    assert_eq!(
        stderr_of(&events),
        b"wsd: settling the workspace failed: disk on fire\n"
    );
}

#[tokio::test]
async fn a_slow_subscriber_throttles_a_64_mib_command_with_bounded_memory() {
    const TOTAL: usize = 64 << 20;
    let f = fixture_with(|c| c.per_exec_cap = 1 << 20, noop_settle());
    let (id, mut sub) = f
        .manager
        .exec(req(&format!("head -c {TOTAL} /dev/zero")))
        .await
        .unwrap();
    let first = next_event(&mut sub).await;
    // Stop reading. The runner may fill this subscriber's channel and its
    // own pipeline, and must then stop reading the pipe.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let logged = last_logged_seq(&f.manager, &id).await;
    let bound = first.seq + (SUBSCRIBER_WINDOW + PIPELINE_DEPTH) as u64;
    assert!(
        logged <= bound,
        "{logged} events logged while the subscriber stalled (bound {bound})"
    );
    assert!(
        f.manager.shared.live.lock().unwrap().contains_key(&id),
        "the command is blocked, not done"
    );

    let mut bytes = first.kind.payload_len();
    let mut last = first.seq;
    loop {
        let ev = next_event(&mut sub).await;
        assert_eq!(ev.seq, last + 1);
        last = ev.seq;
        match ev.kind {
            EventKind::Stdout(d) => {
                assert!(d.len() <= READ_CHUNK_BYTES);
                bytes += d.len();
            }
            EventKind::Exit(code) => {
                assert_eq!(code, 0);
                break;
            }
            EventKind::Stderr(d) => panic!("unexpected stderr {d:?}"),
        }
    }
    assert_eq!(bytes, TOTAL);
    assert!(next(&mut sub).await.is_none());
}

#[tokio::test]
async fn the_pipeline_never_holds_more_than_its_depth() {
    let f = fixture();
    let (id, mut sub) = f
        .manager
        .exec(req("head -c 8388608 /dev/zero"))
        .await
        .unwrap();
    let live = f
        .manager
        .shared
        .live
        .lock()
        .unwrap()
        .get(&id)
        .cloned()
        .unwrap();
    let events = collect(&mut sub).await;
    assert_eq!(stdout_of(&events).len(), 8 << 20);
    let max = live.max_in_flight.load(Ordering::Relaxed);
    assert!((1..=PIPELINE_DEPTH).contains(&max), "max in flight {max}");
}

#[tokio::test]
async fn cwd_is_resolved_inside_the_root() {
    let f = fixture();
    std::fs::create_dir_all(f.root.join("sub/dir")).unwrap();
    std::os::unix::fs::symlink("/", f.root.join("escape")).unwrap();
    let call = ExecRequest {
        cwd: Some("sub/./dir/".into()),
        ..req("pwd -P")
    };
    let (_, mut sub) = f.manager.exec(call).await.unwrap();
    let pwd = String::from_utf8(stdout_of(&collect(&mut sub).await)).unwrap();
    assert_eq!(Path::new(pwd.trim()), f.root.join("sub/dir"));
    for bad in ["../", "/etc", "missing", "escape", "escape/tmp"] {
        let call = ExecRequest {
            cwd: Some(bad.into()),
            ..req("true")
        };
        assert_code(f.manager.exec(call).await, ErrorCode::Invalid);
    }
}

#[tokio::test]
async fn limits_are_enforced_and_bad_arguments_are_invalid() {
    let f = fixture_with(|c| c.max_concurrent = 1, noop_settle());
    let long = "x".repeat(MAX_COMMAND_BYTES + 1);
    assert_code(f.manager.exec(req(&long)).await, ErrorCode::Limit);
    let big_stdin = ExecRequest {
        stdin: Some(vec![0; MAX_STDIN_BYTES + 1]),
        ..req("cat")
    };
    assert_code(f.manager.exec(big_stdin).await, ErrorCode::Limit);
    let many_env = ExecRequest {
        env: (0..=MAX_ENV_VARS)
            .map(|i| (format!("V{i}"), String::new()))
            .collect(),
        ..req("true")
    };
    assert_code(f.manager.exec(many_env).await, ErrorCode::Limit);
    let big_env = ExecRequest {
        env: vec![("V".into(), "x".repeat(MAX_ENV_BYTES))],
        ..req("true")
    };
    assert_code(f.manager.exec(big_env).await, ErrorCode::Limit);

    assert_code(f.manager.exec(req("  ")).await, ErrorCode::Invalid);
    assert_code(
        f.manager.exec(req_id("true", "has space")).await,
        ErrorCode::Invalid,
    );
    assert_code(f.manager.exec(req_id("true", "")).await, ErrorCode::Invalid);
    let bad_env = ExecRequest {
        env: vec![("A=B".into(), "c".into())],
        ..req("true")
    };
    assert_code(f.manager.exec(bad_env).await, ErrorCode::Invalid);

    let (id, mut sub) = f.manager.exec(req("echo ready; sleep 100")).await.unwrap();
    read_until(&mut sub, "ready").await;
    assert_code(f.manager.exec(req("true")).await, ErrorCode::Limit);
    f.manager.kill(&id, Some("KILL")).await.unwrap();
    collect(&mut sub).await;
    let (_, mut sub) = f.manager.exec(req("true")).await.unwrap();
    assert_eq!(
        exit_of(&collect(&mut sub).await, 1),
        0,
        "the slot is free again"
    );
}

#[tokio::test]
async fn dispose_drops_a_finished_log_and_kills_a_live_exec() {
    let f = fixture();
    let (id, mut sub) = f.manager.exec(req("echo x")).await.unwrap();
    collect(&mut sub).await;
    f.manager.dispose(&id).await.unwrap();
    assert_code(f.manager.get(&id, After::All).await, ErrorCode::NotFound);
    assert_code(f.manager.dispose(&id).await, ErrorCode::NotFound);

    let (id, mut sub) = f
        .manager
        .exec(req("echo $$ > pid; echo ready; exec sleep 100"))
        .await
        .unwrap();
    read_until(&mut sub, "ready").await;
    let pid = read_pids(&f.root.join("pid"))[0];
    let mut other = f.manager.get(&id, After::Tail).await.unwrap();
    f.manager.dispose(&id).await.unwrap();
    assert_code(next(&mut sub).await.unwrap(), ErrorCode::NotFound);
    assert_code(next(&mut other).await.unwrap(), ErrorCode::NotFound);
    assert!(next(&mut sub).await.is_none());
    assert_code(f.manager.get(&id, After::All).await, ErrorCode::NotFound);
    wait_gone(pid);
    let (_, mut sub) = f.manager.exec(req_id("echo reused", &id)).await.unwrap();
    assert_eq!(stdout_of(&collect(&mut sub).await), b"reused\n");
}

/// The exec's rows in the log file (meta and events), and its recorded
/// process group, read beside the daemon's own connections.
fn logged(db: &Path, id: &str) -> (i64, Option<i32>) {
    let c = rusqlite::Connection::open(db).unwrap();
    let rows: i64 = c
        .query_row(
            "SELECT (SELECT count(*) FROM exec_meta WHERE exec_id = ?1)
                  + (SELECT count(*) FROM exec_event WHERE exec_id = ?1)",
            [id],
            |r| r.get(0),
        )
        .unwrap();
    let pgid: Option<i32> = c
        .query_row("SELECT pgid FROM exec_meta WHERE exec_id = ?1", [id], |r| {
            r.get(0)
        })
        .unwrap_or(None);
    (rows, pgid)
}

#[tokio::test]
async fn a_short_silent_command_and_its_dispose_commit_only_begin_and_exit() {
    // No group record within the test's patience: only begin and exit.
    let f = fixture_with(
        |c| c.group_record_after = Duration::from_secs(3600),
        noop_settle(),
    );
    let writer = f.manager.shared.writer.clone();
    let before = writer.groups_committed();
    let (id, mut sub) = f.manager.exec(req("true")).await.unwrap();
    assert_eq!(exit_of(&collect(&mut sub).await, 1), 0);
    f.manager.dispose(&id).await.unwrap();
    assert_eq!(writer.groups_committed() - before, 2, "begin and exit only");
    // Gone for every reader at once, though its rows wait for a commit.
    assert_code(f.manager.get(&id, After::All).await, ErrorCode::NotFound);
    assert_code(f.manager.dispose(&id).await, ErrorCode::NotFound);
    assert_code(f.manager.kill(&id, None).await, ErrorCode::NotFound);
    assert_eq!(logged(&f.db, &id), (2, None), "meta and exit, no group");
    // The next command's begin deletes them.
    let (next, mut sub) = f.manager.exec(req("true")).await.unwrap();
    collect(&mut sub).await;
    assert_eq!(logged(&f.db, &id).0, 0);
    assert!(f.manager.get(&next, After::All).await.is_ok());
}

#[tokio::test]
async fn a_commands_group_is_recorded_with_its_first_output_or_after_a_while_without() {
    let f = fixture_with(
        |c| c.group_record_after = Duration::from_secs(3600),
        noop_settle(),
    );
    mkfifo(&f.root.join("gate"));
    // Recorded with the output: committed before the output is delivered.
    let (id, mut sub) = f.manager.exec(req("echo $$; read x < gate")).await.unwrap();
    let seen = read_until(&mut sub, "\n").await;
    let pid: i32 = String::from_utf8(stdout_of(&seen))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(logged(&f.db, &id).1, Some(pid));
    open_gate(&f.root.join("gate"), "x\n").await;
    collect(&mut sub).await;

    // A silent command's goes on its own once it has run a while.
    let f = fixture_with(|c| c.group_record_after = Duration::ZERO, noop_settle());
    mkfifo(&f.root.join("gate"));
    let (id, mut sub) = f
        .manager
        .exec(req("echo $$ > pid; read x < gate"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + STEP;
    while logged(&f.db, &id).1.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the group was never recorded"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    open_gate(&f.root.join("gate"), "x\n").await;
    collect(&mut sub).await;
    assert_eq!(
        logged(&f.db, &id).1,
        Some(read_pids(&f.root.join("pid"))[0])
    );
}

#[tokio::test]
async fn the_retention_sweep_drops_finished_logs_past_their_ttl() {
    let f = fixture_with(|c| c.ttl = Duration::ZERO, noop_settle());
    let (done, mut sub) = f.manager.exec(req("true")).await.unwrap();
    collect(&mut sub).await;
    let (running, mut live) = f.manager.exec(req("echo ready; sleep 100")).await.unwrap();
    read_until(&mut live, "ready").await;
    assert_eq!(f.manager.sweep().await.unwrap(), 1);
    assert_code(f.manager.get(&done, After::All).await, ErrorCode::NotFound);
    assert!(
        f.manager.get(&running, After::All).await.is_ok(),
        "a live exec has no TTL"
    );
    f.manager.kill(&running, None).await.unwrap();
    collect(&mut live).await;

    let kept = fixture();
    let (id, mut sub) = kept.manager.exec(req("true")).await.unwrap();
    collect(&mut sub).await;
    assert_eq!(kept.manager.sweep().await.unwrap(), 0);
    assert!(kept.manager.get(&id, After::All).await.is_ok());
    drop(kept.db);
}

#[tokio::test]
async fn shutdown_kills_live_execs_and_refuses_new_ones() {
    let f = fixture();
    let (_, mut sub) = f.manager.exec(req("echo ready; sleep 100")).await.unwrap();
    read_until(&mut sub, "ready").await;
    tokio::time::timeout(STEP, f.manager.shutdown())
        .await
        .unwrap();
    assert_eq!(exit_of(&collect(&mut sub).await, 2), 137);
    assert_code(f.manager.exec(req("true")).await, ErrorCode::Shutdown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_multi_thread_runtime() {
    let f = fixture();
    let (id, mut sub) = f
        .manager
        .exec(req("for i in 1 2 3; do echo $i; done"))
        .await
        .unwrap();
    let events = collect(&mut sub).await;
    assert_eq!(stdout_of(&events), b"1\n2\n3\n");
    assert_eq!(
        collect(&mut f.manager.get(&id, After::All).await.unwrap()).await,
        events
    );
}

#[test]
fn works_inside_a_local_set_on_a_current_thread_runtime() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let f = fixture();
        // A `!Send` caller, as the capnp server is.
        let caller = std::rc::Rc::new(f.manager.clone());
        let task = tokio::task::spawn_local(async move {
            let (_, mut sub) = caller.exec(req("echo local")).await.unwrap();
            collect(&mut sub).await
        });
        let events = task.await.unwrap();
        assert_eq!(stdout_of(&events), b"local\n");
    });
}

/// Compile-time check: the API's futures are `Send`, so the manager also
/// serves a multi-thread runtime (never called).
#[allow(dead_code)]
fn the_public_futures_are_send(m: &ExecManager, sub: &mut Subscription) {
    fn send<T: Send>(_: T) {}
    send(m.exec(ExecRequest::default()));
    send(m.get("x", After::All));
    send(m.kill("x", None));
    send(m.dispose("x"));
    send(m.shutdown());
    send(sub.next());
}

// ---------------------------------------------------------------------------
// Terminals (`start_pty`)

fn pty_req(argv: &[&str], cols: u16, rows: u16) -> PtyRequest {
    PtyRequest {
        argv: argv.iter().map(|a| a.to_string()).collect(),
        cols,
        rows,
        ..PtyRequest::default()
    }
}

/// Reads a terminal's output until it holds `needle`; returns all of it.
async fn read_terminal_until(sub: &mut Subscription, seen: &mut Vec<u8>, needle: &str) {
    while !String::from_utf8_lossy(seen).contains(needle) {
        match next_event(sub).await.kind {
            EventKind::Stdout(d) => seen.extend_from_slice(&d),
            other => panic!(
                "expected {needle:?} before {other:?}; output: {}",
                String::from_utf8_lossy(seen)
            ),
        }
    }
}

#[tokio::test]
async fn a_terminal_runs_a_shell_that_reads_typed_input_and_names_its_pts() {
    let f = fixture();
    let (id, mut sub) = f
        .manager
        .start_pty(pty_req(&["/bin/sh"], 80, 24))
        .await
        .unwrap();
    let mut out = Vec::new();
    // The sum appears only in the shell's answer, not in the echo of the line.
    f.manager
        .pty_write(&id, b"echo hi-$((40+2)); tty\n".to_vec())
        .await
        .unwrap();
    read_terminal_until(&mut sub, &mut out, "hi-42").await;
    read_terminal_until(&mut sub, &mut out, "/dev/pts/").await;
    f.manager
        .pty_write(&id, b"echo $TERM; exit 3\n".to_vec())
        .await
        .unwrap();
    read_terminal_until(&mut sub, &mut out, DEFAULT_PTY_TERM).await;
    let rest = collect(&mut sub).await;
    assert_eq!(rest.last().unwrap().kind, EventKind::Exit(3));
    // The log replays the same bytes, in one stream.
    let mut replay = f.manager.get(&id, After::All).await.unwrap();
    let all = collect(&mut replay).await;
    let text = String::from_utf8_lossy(&stdout_of(&all)).into_owned();
    assert!(
        text.contains("hi-42") && text.contains("/dev/pts/"),
        "{text}"
    );
    assert!(stderr_of(&all).is_empty());
}

#[tokio::test]
async fn a_resize_reaches_the_program_in_order_with_its_input() {
    let f = fixture();
    let (id, mut sub) = f
        .manager
        .start_pty(pty_req(&["/bin/sh"], 80, 24))
        .await
        .unwrap();
    let mut out = Vec::new();
    f.manager
        .pty_write(&id, b"stty size\n".to_vec())
        .await
        .unwrap();
    read_terminal_until(&mut sub, &mut out, "24 80").await;
    f.manager.pty_resize(&id, 132, 43).await.unwrap();
    f.manager
        .pty_write(&id, b"stty size\n".to_vec())
        .await
        .unwrap();
    read_terminal_until(&mut sub, &mut out, "43 132").await;
    f.manager.kill(&id, Some("HUP")).await.unwrap();
    let rest = collect(&mut sub).await;
    assert!(rest.last().unwrap().is_exit());
}

#[tokio::test]
async fn closing_a_terminal_ends_its_whole_session_background_jobs_included() {
    let f = fixture();
    let (id, mut sub) = f
        .manager
        .start_pty(pty_req(&["/bin/sh"], 80, 24))
        .await
        .unwrap();
    let mut out = Vec::new();
    // `set -m`: the job gets a process group of its own, as in an
    // interactive shell; it holds the terminal open while it lives.
    f.manager
        .pty_write(
            &id,
            b"set -m; sleep 1000 & echo \"job-\"$!\"-x\"\n".to_vec(),
        )
        .await
        .unwrap();
    // The echoed line has a quote before the line end; the answer not.
    read_terminal_until(&mut sub, &mut out, "-x\r\n").await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let pid: i32 = text
        .split("job-")
        .last()
        .unwrap()
        .split(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .unwrap_or_else(|| panic!("no job pid in {text:?}"))
        .parse()
        .unwrap();
    f.manager.kill(&id, Some("HUP")).await.unwrap();
    // The exit comes only once nothing holds the terminal: the job is gone.
    let rest = collect(&mut sub).await;
    assert!(rest.last().unwrap().is_exit());
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(
        stat.is_empty() || stat.contains(") Z "),
        "the background job {pid} outlived its terminal: {stat}"
    );
}

#[tokio::test]
async fn bad_terminal_input_is_refused_with_its_code_and_changes_nothing() {
    let f = fixture();
    let code = |r: Result<(String, Subscription), ExecError>| r.err().map(|e| e.code());
    assert_eq!(
        code(f.manager.start_pty(pty_req(&["/bin/sh"], 0, 0)).await),
        Some(ErrorCode::Invalid)
    );
    assert_eq!(
        code(f.manager.start_pty(pty_req(&["/bin/sh"], 10_000, 24)).await),
        Some(ErrorCode::Limit)
    );
    assert_eq!(
        code(f.manager.start_pty(pty_req(&["sh\0x"], 80, 24)).await),
        Some(ErrorCode::Invalid)
    );
    assert_eq!(
        f.manager
            .pty_write("nope", b"x".to_vec())
            .await
            .unwrap_err()
            .code(),
        ErrorCode::NotFound
    );
    // A command on pipes is not a terminal.
    let (plain, _sub) = f
        .manager
        .exec(ExecRequest {
            command: "sleep 1000".into(),
            stdin_open: true,
            ..ExecRequest::default()
        })
        .await
        .unwrap();
    let e = f.manager.pty_resize(&plain, 80, 24).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    f.manager.kill(&plain, Some("KILL")).await.unwrap();

    let (id, mut sub) = f
        .manager
        .start_pty(pty_req(&["/bin/sh"], 80, 24))
        .await
        .unwrap();
    let big = vec![b'x'; MAX_PTY_WRITE_BYTES + 1];
    let e = f.manager.pty_write(&id, big).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Limit, "{e}");
    let e = f.manager.pty_resize(&id, 0, 24).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid, "{e}");
    let e = f.manager.pty_resize(&id, 80, 10_000).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Limit, "{e}");
    // Still serving: the terminal works after every refusal.
    let mut out = Vec::new();
    f.manager
        .pty_write(&id, b"echo still-$((1+1)); exit 0\n".to_vec())
        .await
        .unwrap();
    read_terminal_until(&mut sub, &mut out, "still-2").await;
    assert_eq!(
        collect(&mut sub).await.last().unwrap().kind,
        EventKind::Exit(0)
    );
    let e = f.manager.pty_write(&id, b"x".to_vec()).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Invalid, "input after the exit: {e}");
}
