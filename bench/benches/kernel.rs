//! The gateway's numbers (issue 12, item 9), against an in-process kernel
//! on loopback with real `wsd` children (the release `wsd` beside this
//! bench's target dir; build it first: `cargo build --release -p wsd`):
//!
//! * `fs.read` of a small file over the WebSocket: p50/p99 of 1000
//!   sequential round trips (target p50 ≤ 1 ms);
//! * `shell.exec "true"` on a workspace with no pending changes, including
//!   the push → exec → pull bracket: p50/p99 of 200, with the local wsd
//!   child not sandboxed and sandboxed (`wsd serve --sandbox`, bwrap, the
//!   kernel's default), each in a kernel of its own (targets: issue 12
//!   p50 ≤ 10 ms, issue 32 p50 ≤ 2 ms); then the same once the workspace
//!   holds a file (an empty one's wsd rev is 0, which the exit event
//!   cannot tell from "not said", so every call there pulls);
//! * 100 workspaces open at once: kernel RSS with 100 open stores, then
//!   with 100 running local wsd children (their RSS summed separately).
//!
//! `cargo bench -p wsd-bench --bench kernel` prints them; results go in
//! `bench/RESULTS.md` by hand. `WSD_BIN=PATH` runs another `wsd` build;
//! `KERNEL_BENCH=exec` runs only the `shell.exec` figures.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gsv_kernel::client::{Credentials, GsvClient};
use gsv_kernel::{Kernel, KernelConfig};
use serde_json::json;
use wsd_bench::gateway::{percentile, serve_set_up, status_kib};

fn rss_kib(pid: u32) -> u64 {
    status_kib(&pid.to_string(), "VmRSS:")
}

fn main() {
    // `cargo bench` passes `--bench`; there is nothing to filter here.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

/// A kernel with local wsd children (`sandbox`: under bwrap) serving on
/// loopback, and alice logged in over a real WebSocket.
async fn start(wsd: &Path, sandbox: bool) -> (Arc<Kernel>, GsvClient, tempfile::TempDir) {
    let tmp = tempfile::tempdir().unwrap();
    let mut config = KernelConfig::new(tmp.path().join("data"));
    config.wsd_bin = wsd.to_path_buf();
    config.wsd_sandbox = sandbox;
    let (kernel, url) = serve_set_up(config).await;
    let mut c = GsvClient::connect(&url).await.unwrap();
    c.login("alice", &Credentials::Password("alice-password".into()))
        .await
        .unwrap();
    (kernel, c, tmp)
}

/// p50/p99 of 200 `shell.exec "true"` in a new workspace of a kernel whose
/// local wsd children run `sandbox`ed or not.
/// 20 warm-up calls of `run`, then the wall time of 200 more, each
/// checked to have completed.
async fn time_execs(c: &mut GsvClient, run: &serde_json::Value) -> Vec<Duration> {
    for _ in 0..20 {
        let d = c.call("shell.exec", run.clone()).await.unwrap();
        assert_eq!(d["status"], "completed", "{d}");
    }
    let mut execs = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let d = c.call("shell.exec", run.clone()).await.unwrap();
        execs.push(t.elapsed());
        assert_eq!(d["status"], "completed", "{d}");
    }
    execs
}

async fn exec_true(wsd: &Path, sandbox: bool) {
    let (kernel, mut c, _tmp) = start(wsd, sandbox).await;
    let d = c.call("sys.workspace.create", json!({})).await.unwrap();
    let ws = d["workspace"]["workspaceId"].as_str().unwrap().to_owned();
    let run = json!({"cwd": format!("/workspaces/{ws}"), "input": "true", "yieldMs": 10000});
    let mut execs = time_execs(&mut c, &run).await;
    let mode = if sandbox {
        "sandboxed (wsd serve --sandbox)"
    } else {
        "not sandboxed"
    };
    println!(
        "shell.exec \"true\", {mode}, no pending changes, with push/pull: p50 {:?}, p99 {:?} (n=200)",
        percentile(&mut execs, 0.5),
        percentile(&mut execs, 0.99)
    );
    // The same workspace holding one file: its wsd's rev is no longer 0
    // (which an exit event cannot tell from "not said"), so a command that
    // changed nothing needs no pull.
    c.call(
        "fs.write",
        json!({"path": format!("/workspaces/{ws}/one.txt"), "content": "one\n"}),
    )
    .await
    .unwrap();
    let mut execs = time_execs(&mut c, &run).await;
    println!(
        "shell.exec \"true\" in a workspace holding one file, {mode}: p50 {:?}, p99 {:?} (n=200)",
        percentile(&mut execs, 0.5),
        percentile(&mut execs, 0.99)
    );
    c.close().await;
    kernel.shutdown().await;
}

async fn run() {
    // `WSD_BIN` picks another `wsd` (an older build, for an A/B run).
    let wsd = match std::env::var_os("WSD_BIN") {
        Some(p) => std::path::PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().unwrap();
            exe.parent().and_then(|d| d.parent()).unwrap().join("wsd")
        }
    };
    assert!(
        wsd.exists(),
        "{} missing: cargo build --release -p wsd",
        wsd.display()
    );
    if std::env::var_os("KERNEL_BENCH").is_some_and(|v| v == "exec") {
        exec_true(&wsd, false).await;
        exec_true(&wsd, true).await;
        return;
    }
    // Reads and memory on a kernel whose children are not sandboxed; the
    // exec figures after it, each on a fresh kernel.
    let (kernel, mut c, _tmp) = start(&wsd, false).await;

    let ten_lines: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    c.call(
        "fs.write",
        json!({"path": "small.txt", "content": ten_lines}),
    )
    .await
    .unwrap();
    for _ in 0..100 {
        c.call("fs.read", json!({"path": "small.txt"}))
            .await
            .unwrap();
    }
    let mut reads = Vec::new();
    for _ in 0..1000 {
        let t = Instant::now();
        let d = c
            .call("fs.read", json!({"path": "small.txt"}))
            .await
            .unwrap();
        reads.push(t.elapsed());
        assert_eq!(d["lines"], 10);
    }
    println!(
        "fs.read small file over WebSocket: p50 {:?}, p99 {:?} (n=1000)",
        percentile(&mut reads, 0.5),
        percentile(&mut reads, 0.99)
    );

    let me = std::process::id();
    let before = rss_kib(me);
    let mut ids = Vec::new();
    for i in 0..100 {
        let d = c.call("sys.workspace.create", json!({})).await.unwrap();
        let id = d["workspace"]["workspaceId"].as_str().unwrap().to_owned();
        c.call(
            "fs.write",
            json!({"path": format!("/workspaces/{id}/f{i}.txt"), "content": "x"}),
        )
        .await
        .unwrap();
        ids.push(id);
    }
    println!(
        "100 workspaces open (stores only): kernel RSS {} MiB (was {} MiB)",
        rss_kib(me) / 1024,
        before / 1024
    );
    for id in &ids {
        let d = c
            .call(
                "shell.exec",
                json!({"cwd": format!("/workspaces/{id}"), "input": "true", "yieldMs": 10000}),
            )
            .await
            .unwrap();
        assert_eq!(d["status"], "completed", "{d}");
    }
    let mut children = 0u64;
    let mut n = 0;
    for id in &ids {
        if let Some(pid) = kernel.workspaces().local_pid(id).await {
            children += rss_kib(pid);
            n += 1;
        }
    }
    println!(
        "100 workspaces with running wsd children ({n} alive): kernel RSS {} MiB, children RSS sum {} MiB",
        rss_kib(me) / 1024,
        children / 1024
    );
    c.close().await;
    kernel.shutdown().await;
    exec_true(&wsd, false).await;
    exec_true(&wsd, true).await;
}
