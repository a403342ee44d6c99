//! Exec over loopback RPC against an in-process daemon (`wsd::daemon::run`
//! on its own thread, a temp workspace with the inotify watcher, the exec
//! log in SQLite, exactly as `wsd serve` wires them):
//!
//! * `exec/round_trip/true_over_rpc`: `exec("true")` from the call to its
//!   exit event (spawn, log begin, settle, exit commit, stream), next to
//!   `exec/round_trip/bare_spawn_sh_c_true` (`/bin/sh -c true` spawned and
//!   waited for by this process) in the same run.
//! * `exec/output/N MiB`: a command writing N MiB to stdout, read by a live
//!   client, in bytes per second.
//!
//! `WSD_EXEC_NUMBERS=1 cargo bench -p wsd-bench --bench exec` skips
//! criterion and prints the numbers instead: p50/p99 of 1000
//! `exec("true")` round trips next to 1000 bare spawns (interleaved), the
//! cost of one settle of an idle workspace, and the throughput of a command
//! writing 1 GiB with a live reader and detached (`WSD_EXEC_GIB=N` for
//! another size).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group};
use tokio::runtime::Runtime;
use tokio::task::LocalSet;
use wsd::rpc::{ExecEventKind, ExecRequest, ResumeFrom};
use wsd_client::client::{self, Client};

/// A daemon serving a temp workspace on a loopback port, on its own thread.
struct Daemon {
    root: PathBuf,
    addr: String,
    _daemon: wsd::daemon::Background,
    _tmp: tempfile::TempDir,
}

impl Daemon {
    fn start() -> Daemon {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(&root).unwrap();
        let root = root.canonicalize().unwrap();
        let config = wsd::daemon::DaemonConfig::local(root.clone(), tmp.path().join("state"));
        let daemon = wsd::daemon::Background::start(config).expect("the daemon did not listen");
        Daemon {
            root,
            addr: daemon.addr().to_owned(),
            _daemon: daemon,
            _tmp: tmp,
        }
    }
}

/// The client side: a current-thread runtime and a `LocalSet` kept for the
/// whole run (the connection is a local task).
struct Side {
    rt: Runtime,
    local: LocalSet,
    client: Client,
}

impl Side {
    fn connect(addr: &str) -> Side {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let local = LocalSet::new();
        let client = local
            .block_on(&rt, client::connect(addr, None, "bench"))
            .unwrap();
        Side { rt, local, client }
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.local.block_on(&self.rt, f)
    }
}

fn request(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.into(),
        ..ExecRequest::default()
    }
}

/// Runs `command` and reads its events to the exit; returns the stdout
/// bytes and the exit code.
async fn run_exec(client: &Client, command: &str) -> (u64, i32) {
    let mut s = client.exec(&request(command)).await.unwrap();
    let mut bytes = 0u64;
    loop {
        match s.next().await.unwrap().expect("ended without an exit").kind {
            ExecEventKind::Stdout(b) => bytes += b.len() as u64,
            ExecEventKind::Stderr(b) => panic!("stderr: {}", String::from_utf8_lossy(&b)),
            ExecEventKind::Exit(code) => return (bytes, code),
        }
    }
}

fn bare_spawn() {
    let status = Command::new("/bin/sh")
        .args(["-c", "true"])
        .status()
        .unwrap();
    assert!(status.success());
}

fn round_trip(c: &mut Criterion) {
    let daemon = Daemon::start();
    let side = Side::connect(&daemon.addr);
    let mut g = c.benchmark_group("exec/round_trip");
    g.bench_function("true_over_rpc", |b| {
        b.iter_custom(|iters| {
            side.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    assert_eq!(run_exec(&side.client, "true").await, (0, 0));
                }
                start.elapsed()
            })
        })
    });
    g.bench_function("bare_spawn_sh_c_true", |b| b.iter(bare_spawn));
    g.finish();
}

fn output(c: &mut Criterion) {
    let daemon = Daemon::start();
    let side = Side::connect(&daemon.addr);
    let mut g = c.benchmark_group("exec/output");
    g.sample_size(10);
    for mib in [16u64, 64] {
        let bytes = mib * 1024 * 1024;
        g.throughput(Throughput::Bytes(bytes));
        let command = format!("head -c {bytes} /dev/zero");
        g.bench_with_input(
            BenchmarkId::from_parameter(format!("{mib} MiB")),
            &command,
            |b, cmd| {
                b.iter_custom(|iters| {
                    side.block_on(async {
                        let start = Instant::now();
                        for _ in 0..iters {
                            assert_eq!(run_exec(&side.client, cmd).await, (bytes, 0));
                        }
                        start.elapsed()
                    })
                })
            },
        );
    }
    g.finish();
}

criterion_group!(benches, round_trip, output);

// ---------------------------------------------------------------------------
// WSD_EXEC_NUMBERS=1: the numbers.

/// The lines printed by the numbers run, also written to
/// `target/criterion/exec_numbers.txt` for `bench/compare`'s results file.
static REPORT: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn report(line: String) {
    println!("{line}");
    REPORT.lock().unwrap().push(line);
}

fn save_report() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/criterion");
    let lines = REPORT.lock().unwrap().join("\n");
    if std::fs::create_dir_all(&dir).is_ok() {
        let _ = std::fs::write(dir.join("exec_numbers.txt"), lines + "\n");
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn summary(name: &str, mut d: Vec<Duration>) {
    d.sort();
    let ms = |x: Duration| x.as_secs_f64() * 1000.0;
    report(format!(
        "{name:<28} n={:<5} p50 {:>7.3} ms  p90 {:>7.3} ms  p99 {:>7.3} ms  max {:>7.3} ms",
        d.len(),
        ms(percentile(&d, 0.50)),
        ms(percentile(&d, 0.90)),
        ms(percentile(&d, 0.99)),
        ms(*d.last().unwrap()),
    ));
}

/// Peak resident set of this process (`VmHWM`), in MiB.
fn peak_rss_mib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

/// Where an `exec("true")` round trip goes: an RPC round trip alone, the
/// exec manager alone (no RPC, no settle), and one settle of an idle
/// workspace alone.
fn breakdown(side: &Side, runs: usize) {
    use wsd::exec::{ExecConfig, ExecManager, ExecRequest as Req};

    let mut rpc = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let r = side.block_on(
            side.client
                .kill_exec("no-such-exec", wsd::rpc::ExecSignal::Term),
        );
        assert!(r.is_err());
        rpc.push(t.elapsed());
    }
    summary("RPC round trip (killExec)", rpc);

    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    let state = tmp.path().join("state");
    let mut store =
        wsd::store::WorkspaceStore::open(&root, &state, wsd::store::StoreOptions::default())
            .unwrap();
    store.settle().unwrap();
    let mut settle = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        store.settle().unwrap();
        settle.push(t.elapsed());
    }
    summary("settle, idle workspace", settle);
    let mut settle = Vec::with_capacity(runs);
    for i in 0..runs {
        std::fs::write(root.join(format!("f{}", i % 10)), format!("{i}\n")).unwrap();
        let t = Instant::now();
        store.settle().unwrap();
        settle.push(t.elapsed());
    }
    summary("settle, one file rewritten", settle);
    drop(store);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut manager = Vec::with_capacity(runs);
    rt.block_on(async {
        let m = ExecManager::open(
            ExecConfig::new(&root, state.join("bench-exec.sqlite3")),
            std::sync::Arc::new(|| Box::pin(async { Ok(0) })),
        )
        .unwrap();
        for i in 0..runs + 20 {
            let t = Instant::now();
            let (_, mut sub) = m
                .exec(Req {
                    command: "true".into(),
                    ..Req::default()
                })
                .await
                .unwrap();
            while let Some(e) = sub.next().await {
                e.unwrap();
            }
            if i >= 20 {
                manager.push(t.elapsed());
            }
        }
    });
    summary("ExecManager, no RPC/settle", manager);
}

fn numbers() {
    let runs: usize = std::env::var("WSD_EXEC_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let gib: u64 = std::env::var("WSD_EXEC_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let daemon = Daemon::start();
    let side = Side::connect(&daemon.addr);

    // Warm up both paths (page cache, SQLite, the watcher).
    for _ in 0..50 {
        side.block_on(run_exec(&side.client, "true"));
        bare_spawn();
    }
    let (mut rpc, mut bare) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
    for _ in 0..runs {
        let t = Instant::now();
        assert_eq!(side.block_on(run_exec(&side.client, "true")), (0, 0));
        rpc.push(t.elapsed());
        let t = Instant::now();
        bare_spawn();
        bare.push(t.elapsed());
    }
    report(format!(
        "exec(\"true\") round trip vs bare spawn, {runs} runs each, interleaved:"
    ));
    summary("exec(\"true\") over RPC", rpc);
    summary("bare sh -c true", bare);

    // The settle an exit waits for, alone: an idle workspace, and one with a
    // file just written.
    let mut idle = Vec::with_capacity(runs);
    let store_probe = |cmd: &str| {
        let t = Instant::now();
        assert_eq!(side.block_on(run_exec(&side.client, cmd)).1, 0);
        t.elapsed()
    };
    for _ in 0..runs.min(200) {
        idle.push(store_probe("true"));
    }
    let mut writing = Vec::with_capacity(runs);
    for i in 0..runs.min(200) {
        writing.push(store_probe(&format!("echo {i} > f{}", i % 10)));
    }
    summary("exec(\"true\") again", idle);
    summary("exec(\"echo > file\")", writing);
    breakdown(&side, runs.min(300));

    // Output throughput with a live reader.
    let bytes = gib * 1024 * 1024 * 1024;
    let command = format!("head -c {bytes} /dev/zero");
    let t = Instant::now();
    assert_eq!(side.block_on(run_exec(&side.client, &command)), (bytes, 0));
    let secs = t.elapsed().as_secs_f64();
    report(format!(
        "{gib} GiB to stdout, live reader: {:.2} s, {:.0} MiB/s (process peak RSS so far {} MiB)",
        secs,
        bytes as f64 / secs / 1048576.0,
        peak_rss_mib()
    ));

    // Detached: nobody reads while it runs (the log evicts down to its
    // cap); the command marks its end in the workspace.
    let marker = daemon.root.join("gib-done");
    let command = format!("head -c {bytes} /dev/zero; echo $? > gib-done");
    let t = Instant::now();
    let secs = side.block_on(async {
        let s = side.client.exec(&request(&command)).await.unwrap();
        let id = s.id().to_owned();
        // Detach. The connection keeps being driven while we wait (a client
        // that stops reading its socket would hold the command back).
        drop(s);
        while !marker.exists() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let secs = t.elapsed().as_secs_f64();
        // Its exit follows the settle.
        let mut s = side.client.get_exec(&id, ResumeFrom::Tail).await.unwrap();
        while s.next().await.unwrap().is_some() {}
        secs
    });
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "0\n");
    report(format!(
        "{gib} GiB to stdout, detached: {:.2} s, {:.0} MiB/s (process peak RSS {} MiB)",
        secs,
        bytes as f64 / secs / 1048576.0,
        peak_rss_mib()
    ));
}

fn main() {
    if std::env::var_os("WSD_EXEC_NUMBERS").is_some() {
        numbers();
        save_report();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
