//! 1,000 armed schedules (issue 26, "Speed and scale"): the kernel's CPU
//! time while they wait (one sleeping timer task, so about none), then
//! the fire latency of `at` schedules added beside them: from `atMs` to
//! the `createdAt` of the process the schedule spawned. Prints both.
//!
//! `cargo run --release -p gsv-kernel --example sched_idle [IDLE_SECS] [FIRES]`

use std::time::Duration;

use gsv_kernel::client::{Credentials, GsvClient};
use gsv_kernel::db::now_ms;
use gsv_kernel::{Kernel, KernelConfig};
use serde_json::json;

/// This process's user + system CPU time, in clock ticks (Linux).
fn cpu_ticks() -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the `(comm)`; utime and stime are the 14th and 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    Ok(f[11].parse::<u64>()? + f[12].parse::<u64>()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let idle_secs: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(10);
    let fires: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20);
    let dir = tempfile::tempdir()?;
    let kernel = Kernel::open(KernelConfig::new(dir.path().join("data"))).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("ws://{}/ws", listener.local_addr()?);
    let k = kernel.clone();
    tokio::spawn(
        async move { gsv_kernel::server::serve(listener, k, std::future::pending()).await },
    );
    let mut c = GsvClient::connect(&url).await?;
    c.call(
        "sys.setup",
        json!({"username": "alice", "password": "alice-password"}),
    )
    .await?;
    c.close().await;
    let mut alice = GsvClient::connect(&url).await?;
    alice
        .login("alice", &Credentials::Password("alice-password".into()))
        .await?;

    for i in 0..1000 {
        alice
            .call(
                "sched.add",
                json!({"name": format!("armed-{i}"),
                       "expression": {"kind": "every", "everyMs": 3_600_000},
                       "target": {"kind": "process.spawn", "prompt": "p"}}),
            )
            .await?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_ticks()?;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let ticks = cpu_ticks()? - before;
    println!(
        "1000 armed schedules, {idle_secs} s idle: {ticks} clock ticks of CPU ({:.2} % of one core at 100 Hz)",
        ticks as f64 / (idle_secs as f64 * 100.0) * 100.0
    );

    let mut lat = Vec::with_capacity(fires);
    for i in 0..fires {
        let at = now_ms() + 300;
        let name = format!("fire-{i}");
        alice
            .call(
                "sched.add",
                json!({"name": name, "expression": {"kind": "at", "atMs": at},
                       "target": {"kind": "process.spawn", "prompt": "p"}}),
            )
            .await?;
        let created = loop {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let l = alice.call("proc.list", json!({})).await?;
            let found = l["processes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["label"] == name.as_str())
                .and_then(|p| p["createdAt"].as_i64());
            if let Some(t) = found {
                break t;
            }
        };
        lat.push(created - at);
    }
    lat.sort();
    println!(
        "fire latency (atMs → spawned process), {fires} fires beside them: p50 {} ms, max {} ms",
        lat[lat.len() / 2],
        lat[lat.len() - 1]
    );
    Ok(())
}
