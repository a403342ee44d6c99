//! Long-lived agents' numbers (issue 26, "Speed and scale"), against an
//! in-process kernel on loopback, driven by a real WebSocket client:
//!
//! * `proc.history` of a 10,000-message conversation: p50/p99 of the
//!   default page (500 messages) and of 50-message pages at the start, the
//!   middle and the end, beside the same pages of a 500-message
//!   conversation, so a page's cost shows it does not grow with the
//!   conversation (target p50 ≤ 20 ms);
//! * 1,000 armed schedules: the process's CPU time and context switches
//!   over an idle stretch (`getrusage(RUSAGE_SELF)`, which sums every
//!   thread, also those that ended during the stretch; target: about none,
//!   one sleeping timer task), then the lateness of 100 `at` schedules
//!   armed beside them, from `atMs` to the spawned process's `createdAt`
//!   (target ≤ 100 ms);
//! * kernel RSS with 1,000 processes registered and 10 of them running
//!   (each run waiting on a model server that accepts and never answers).
//!
//! `cargo bench -p wsd-bench --bench agents [-- IDLE_SECS]` prints them;
//! results go in `bench/RESULTS.md` by hand. The bench process is the
//! kernel (plus an idle client), so its RSS and CPU are the kernel's.

use std::time::{Duration, Instant};

use gsv_kernel::client::GsvClient;
use gsv_kernel::db::now_ms;
use gsv_kernel::domains::proc::store;
use gsv_kernel::{Kernel, KernelConfig};
use serde_json::json;
use wsd_bench::gateway::{login, report, serve_set_up, status_kib};

fn rss_mib() -> f64 {
    status_kib("self", "VmRSS:") as f64 / 1024.0
}

/// This process's CPU time (user + system) and context switches
/// (voluntary + involuntary), summed over all its threads, ended ones
/// included.
fn usage() -> (Duration, i64) {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    (
        Duration::from_micros(micros(u.user_time()) + micros(u.system_time())),
        u.voluntary_context_switches() + u.involuntary_context_switches(),
    )
}

fn main() {
    // `cargo bench` passes `--bench`; the one other argument is the idle
    // stretch in seconds.
    let idle_secs: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(10);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(idle_secs));
}

/// `n` messages in `pid`'s default conversation, written straight to the
/// table (a user prompt, an assistant tool call, its result, in turn).
async fn fill(kernel: &Kernel, pid: &str, n: usize) {
    let pid = pid.to_owned();
    kernel
        .db()
        .call(move |c| {
            let tx = c.transaction()?;
            for i in 0..n {
                let body = match i % 3 {
                    0 => json!({"role": "user", "content": format!("message {i}: {}", "words ".repeat(40))}),
                    1 => json!({"role": "assistant", "content": "Reading it.",
                        "toolCalls": [{"id": format!("c{i}"), "name": "Read",
                                       "arguments": "{\"path\":\"notes.txt\"}"}]}),
                    _ => json!({"role": "toolResult", "toolCallId": format!("c{}", i - 1),
                        "toolName": "Read", "isError": false,
                        "content": "1\tsome line of a file\n".repeat(10)}),
                };
                store::append_message(&tx, &pid, "default", None, &body)?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
        .unwrap();
}

async fn history_pages(c: &mut GsvClient, kernel: &Kernel, total: usize) {
    let pid = c
        .call("proc.spawn", json!({"label": format!("h{total}")}))
        .await
        .unwrap()["pid"]
        .as_str()
        .unwrap()
        .to_owned();
    fill(kernel, &pid, total).await;
    let pages = [
        ("default page (500)", json!({"pid": pid})),
        ("50 at offset 0", json!({"pid": pid, "limit": 50})),
        (
            "50 at the middle",
            json!({"pid": pid, "limit": 50, "offset": total / 2}),
        ),
        (
            "last 50",
            json!({"pid": pid, "limit": 50, "offset": total - 50}),
        ),
    ];
    for (name, args) in pages {
        for _ in 0..20 {
            c.call("proc.history", args.clone()).await.unwrap();
        }
        let mut times = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            let h = c.call("proc.history", args.clone()).await.unwrap();
            times.push(t.elapsed());
            assert_eq!(h["messageCount"], total, "{}", h["messageCount"]);
        }
        report(&format!("proc.history of {total} messages, {name}"), times);
    }
}

/// Arms `FIRES` `at` schedules (spawning a process labelled with the
/// schedule's name) a little apart, then waits for all of them and
/// prints the lateness of each spawn (`createdAt` − `atMs`).
async fn schedule_lateness(alice: &mut GsvClient) {
    const FIRES: i64 = 100;
    const APART_MS: i64 = 37;
    let first = now_ms() + 2_000;
    let mut due = std::collections::HashMap::new();
    for i in 0..FIRES {
        let at = first + i * APART_MS;
        let name = format!("fire-{i}");
        alice
            .call(
                "sched.add",
                json!({"name": name, "expression": {"kind": "at", "atMs": at},
                       "target": {"kind": "process.spawn", "prompt": "p"}}),
            )
            .await
            .unwrap();
        due.insert(name, at);
    }
    let deadline =
        Instant::now() + Duration::from_secs(60) + Duration::from_millis((FIRES * APART_MS) as u64);
    let mut late = Vec::new();
    while !due.is_empty() {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let l = alice.call("proc.list", json!({})).await.unwrap();
        for p in l["processes"].as_array().into_iter().flatten() {
            let (Some(label), Some(created)) = (p["label"].as_str(), p["createdAt"].as_i64())
            else {
                continue;
            };
            if let Some(at) = due.remove(label) {
                late.push(Duration::from_millis((created - at).max(0) as u64));
            }
        }
        if Instant::now() > deadline {
            let s = alice
                .call("sched.list", json!({"limit": 500, "includeDisabled": true}))
                .await
                .unwrap();
            panic!(
                "{} of {FIRES} schedules never spawned their process; schedules: {s}",
                due.len()
            );
        }
    }
    report(
        &format!(
            "schedule lateness (atMs -> spawned process's createdAt), {FIRES} fires {APART_MS} ms apart beside 1000 armed"
        ),
        late,
    );
}

async fn run(idle_secs: u64) {
    let tmp = tempfile::tempdir().unwrap();
    let (kernel, url) = serve_set_up(KernelConfig::new(tmp.path().join("data"))).await;
    let mut alice = login(&url, "alice", "alice-password").await;
    println!("kernel RSS after setup: {:.1} MiB", rss_mib());

    history_pages(&mut alice, &kernel, 500).await;
    history_pages(&mut alice, &kernel, 10_000).await;
    // The page query's plan: an index range of the conversation, no sort.
    let plan = kernel
        .db()
        .call(|c| {
            let mut stmt = c.prepare(
                "EXPLAIN QUERY PLAN SELECT body, id, created_at FROM proc_messages
                 WHERE pid = ?1 AND conversation_id = ?2 ORDER BY id LIMIT ?3 OFFSET ?4",
            )?;
            let steps = stmt
                .query_map(["p", "default", "50", "0"], |r| r.get::<_, String>(3))?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(steps.join("; "))
        })
        .await
        .unwrap();
    println!("proc.history page query plan: {plan}");

    // Armed schedules: an hour away, so none fires while idle.
    for i in 0..1000 {
        alice
            .call(
                "sched.add",
                json!({"name": format!("armed-{i}"),
                       "expression": {"kind": "every", "everyMs": 3_600_000},
                       "target": {"kind": "process.spawn", "prompt": "p"}}),
            )
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (cpu, switches) = usage();
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let (cpu_after, switches_after) = usage();
    let cpu = cpu_after - cpu;
    println!(
        "1000 armed schedules, {idle_secs} s idle: {cpu:?} of CPU ({:.3} % of one core), \
         {} context switches over all threads",
        cpu.as_secs_f64() / idle_secs as f64 * 100.0,
        switches_after - switches
    );
    schedule_lateness(&mut alice).await;

    // A model server that accepts and never answers: a run waits on it.
    let model = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base_url = format!("http://{}/v1", model.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = model.accept().await {
            held.push(sock);
        }
    });
    let mut root = login(&url, "root", "root-password").await;
    for (key, value) in [
        ("config/ai/provider", "openai"),
        ("config/ai/model", "bench"),
        ("config/ai/base_url", base_url.as_str()),
        ("config/ai/api_key", "sk-bench"),
        ("config/ai/timeout_ms", "600000"),
    ] {
        root.call("sys.config.set", json!({"key": key, "value": value}))
            .await
            .unwrap();
    }
    let before = alice.call("proc.list", json!({})).await.unwrap()["processes"]
        .as_array()
        .map_or(0, Vec::len);
    let rss_before = rss_mib();
    let mut pids = Vec::new();
    for i in before..1000 {
        let p = alice
            .call("proc.spawn", json!({"label": format!("p{i}")}))
            .await
            .unwrap();
        pids.push(p["pid"].as_str().unwrap().to_owned());
    }
    let registered = alice.call("proc.list", json!({})).await.unwrap()["processes"]
        .as_array()
        .map_or(0, Vec::len);
    println!(
        "kernel RSS with {registered} processes registered: {:.1} MiB (was {rss_before:.1} MiB with {before})",
        rss_mib()
    );
    for pid in pids.iter().take(10) {
        alice
            .call(
                "proc.send",
                json!({"pid": pid, "message": "hello, are you there?"}),
            )
            .await
            .unwrap();
    }
    let running = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let l = alice.call("proc.list", json!({})).await.unwrap();
        let n = l["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["state"] == "running")
            .count();
        if n >= 10 {
            break n;
        }
    };
    // Let each run reach its model call.
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "kernel RSS with {registered} processes registered and {running} running: {:.1} MiB",
        rss_mib()
    );
    for pid in pids.iter().take(10) {
        alice.call("proc.abort", json!({"pid": pid})).await.unwrap();
    }
    kernel.shutdown().await;
}
