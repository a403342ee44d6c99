//! What the benches that drive a kernel over its WebSocket share: a
//! served and set-up kernel, a logged-in client, the latency summary they
//! print and the memory figures they read.

use std::sync::Arc;
use std::time::Duration;

use gsv_kernel::client::{Credentials, GsvClient};
use gsv_kernel::{Kernel, KernelConfig};

/// The `p`-quantile (0.0–1.0) of `v`, which it sorts.
pub fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Prints `name: p50 … p99 … (n=…)`.
pub fn report(name: &str, mut v: Vec<Duration>) {
    let (p50, p99) = (percentile(&mut v, 0.5), percentile(&mut v, 0.99));
    println!("{name}: p50 {p50:?}  p99 {p99:?}  (n={})", v.len());
}

/// A client of the kernel at `url`, logged in as `user` with password
/// `pw`, whose calls wait up to a minute (a loaded machine).
pub async fn login(url: &str, user: &str, pw: &str) -> GsvClient {
    let mut c = GsvClient::connect(url)
        .await
        .expect("connect to the kernel");
    c.timeout = Duration::from_secs(60);
    c.login(user, &Credentials::Password(pw.into()))
        .await
        .expect("log in");
    c
}

/// A kernel opened with `config`, served on a loopback port and set up
/// with the users `alice` (password `alice-password`) and `root`
/// (`root-password`); its WebSocket URL.
pub async fn serve_set_up(config: KernelConfig) -> (Arc<Kernel>, String) {
    let kernel = Kernel::open(config).await.expect("open the kernel");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a loopback port");
    let url = format!("ws://{}/ws", listener.local_addr().expect("its address"));
    let k = kernel.clone();
    tokio::spawn(
        async move { gsv_kernel::server::serve(listener, k, std::future::pending()).await },
    );
    let mut c = GsvClient::connect(&url)
        .await
        .expect("connect to the kernel");
    c.call(
        "sys.setup",
        serde_json::json!({"username": "alice", "password": "alice-password",
                           "rootPassword": "root-password"}),
    )
    .await
    .expect("sys.setup");
    c.close().await;
    (kernel, url)
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`); 0 if absent.
pub fn status_kib(pid: &str, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}
