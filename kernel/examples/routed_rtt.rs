//! Routed round trips on loopback (issue 13 item 6): a user client →
//! kernel → `gsv node` driver (in-process, same machine) → back, for
//! `fs.read` of a small file and `shell.exec "true"`, next to a native
//! `fs.read` for scale. Prints p50/p99 in milliseconds.
//!
//! `cargo run --release -p gsv-kernel --example routed_rtt [N]`

use std::time::{Duration, Instant};

use gsv_kernel::client::{Credentials, GsvClient};
use gsv_kernel::{Kernel, KernelConfig};
use gsv_node::driver::{self, DriverConfig};
use gsv_node::{NodeRoot, NodeTools, ShellConfig};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn pct(v: &mut [Duration], p: f64) -> f64 {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
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
    let t = alice
        .call(
            "sys.token.create",
            json!({"kind": "node", "allowedRole": "driver", "allowedDeviceId": "bench"}),
        )
        .await?;
    let token = t["token"]["token"].as_str().unwrap_or_default().to_owned();

    let root = dir.path().join("node");
    std::fs::create_dir(&root)?;
    std::fs::write(root.join("small.txt"), "one line\n".repeat(20))?;
    let tools = NodeTools::with_config(
        NodeRoot::new(&root)?,
        ShellConfig {
            shell: Some("/bin/sh".into()),
            login: false,
            ..ShellConfig::default()
        },
    );
    let stop = CancellationToken::new();
    tokio::spawn(driver::run(
        DriverConfig::new(url.clone(), "bench".into(), "alice".into(), token),
        tools,
        stop.clone(),
    ));
    loop {
        let d = alice
            .call("sys.device.get", json!({"deviceId": "bench"}))
            .await?;
        if d["device"]["online"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    alice
        .call(
            "fs.write",
            json!({"path": "small.txt", "content": "one line\n".repeat(20)}),
        )
        .await?;

    let runs: [(&str, &str, serde_json::Value, usize); 3] = [
        ("native fs.read", "fs.read", json!({"path": "small.txt"}), n),
        (
            "routed fs.read",
            "fs.read",
            json!({"target": "bench", "path": "small.txt"}),
            n,
        ),
        (
            "routed shell.exec true",
            "shell.exec",
            json!({"target": "bench", "input": "true"}),
            n / 4,
        ),
    ];
    for (name, call, args, count) in runs {
        for _ in 0..50 {
            alice.call(call, args.clone()).await?;
        }
        let mut v = Vec::with_capacity(count);
        for _ in 0..count {
            let t0 = Instant::now();
            let d = alice.call(call, args.clone()).await?;
            v.push(t0.elapsed());
            anyhow::ensure!(d["ok"] != false, "{name}: {d}");
        }
        println!(
            "{name}: n={count} p50={:.3} ms p99={:.3} ms",
            pct(&mut v, 0.5),
            pct(&mut v, 0.99)
        );
    }
    stop.cancel();
    Ok(())
}
