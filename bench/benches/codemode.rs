//! CodeMode's and MCP's numbers (issue 28, "Speed"), against an in-process
//! kernel on loopback, driven by a real WebSocket client:
//!
//! * `codemode.run {code:"return 1+1"}`: p50/p99 of 1000 (target p50
//!   ≤ 5 ms);
//! * one CodeMode block making 100 sequential `fs.read` calls: p50/p99 of
//!   50 (target ≤ 100 ms), beside 100 `fs.read` round trips over the
//!   WebSocket for scale;
//! * `sys.mcp.call` of the `echo` tool of the official Python SDK's
//!   server (`kernel/tests/mcp/server.py`, `pip install mcp==2.3.0`) on
//!   loopback: p50/p99 of 500 (target p50 ≤ 10 ms). Without the SDK this
//!   part is skipped with a note.
//!
//! `cargo bench -p wsd-bench --bench codemode` prints them; results go in
//! `bench/RESULTS.md` by hand.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use gsv_kernel::KernelConfig;
use gsv_kernel::client::GsvClient;
use serde_json::{Value, json};
use wsd_bench::gateway::{login, report, serve_set_up};

/// `n` timed calls after `n / 10` untimed ones; each answer checked.
async fn timed(
    c: &mut GsvClient,
    n: usize,
    call: &str,
    args: &Value,
    check: impl Fn(&Value),
) -> Vec<Duration> {
    for _ in 0..n / 10 {
        check(&c.call(call, args.clone()).await.unwrap());
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let d = c.call(call, args.clone()).await.unwrap();
        times.push(t.elapsed());
        check(&d);
    }
    times
}

/// The Python MCP server of the kernel's tests; killed on drop.
struct McpServer {
    url: String,
    child: Child,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mcp_server() -> Option<McpServer> {
    let has_sdk = Command::new("python3")
        .args(["-c", "import mcp.server.mcpserver, uvicorn"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_sdk {
        println!("sys.mcp.call: skipped, python3 has no MCP SDK (pip install mcp==2.3.0)");
        return None;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../kernel/tests/mcp/server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut port = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut port)
        .unwrap();
    Some(McpServer {
        url: format!("http://127.0.0.1:{}/mcp", port.trim()),
        child,
    })
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

async fn run() {
    let tmp = tempfile::tempdir().unwrap();
    let (kernel, url) = serve_set_up(KernelConfig::new(tmp.path().join("data"))).await;
    let mut c = login(&url, "alice", "alice-password").await;

    let trivial = json!({"code": "return 1+1"});
    let times = timed(&mut c, 1000, "codemode.run", &trivial, |d| {
        assert_eq!(d["result"], 2, "{d}");
    })
    .await;
    report("codemode.run {code:\"return 1+1\"}", times);

    let ten_lines: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    c.call(
        "fs.write",
        json!({"path": "small.txt", "content": ten_lines}),
    )
    .await
    .unwrap();
    let reads = json!({"code": "let n = 0; \
        for (let i = 0; i < 100; i++) { n += (await fs.read('small.txt')).lines; } \
        return n;"});
    let times = timed(&mut c, 50, "codemode.run", &reads, |d| {
        assert_eq!(d["result"], 1000, "{d}");
    })
    .await;
    report("codemode.run, one block of 100 fs.read calls", times);
    let one = json!({"path": "small.txt"});
    let mut hundreds = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        for _ in 0..100 {
            c.call("fs.read", one.clone()).await.unwrap();
        }
        hundreds.push(t.elapsed());
    }
    report(
        "(for scale) 100 fs.read round trips over the WebSocket",
        hundreds,
    );

    if let Some(mcp) = mcp_server() {
        let added = c
            .call("sys.mcp.add", json!({"name": "Bench", "url": mcp.url}))
            .await
            .unwrap();
        assert_eq!(added["server"]["state"], "ready", "{added}");
        let id = added["server"]["serverId"].clone();
        let echo = json!({"serverId": id, "name": "echo", "arguments": {"message": "hi"}});
        let times = timed(&mut c, 500, "sys.mcp.call", &echo, |d| {
            assert_eq!(d["content"][0]["text"], "hi", "{d}");
        })
        .await;
        report("sys.mcp.call echo, loopback Python SDK server", times);
    }
    kernel.shutdown().await;
}
