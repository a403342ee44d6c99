//! Measures what a `WsdHandle` costs: the threads and resident memory of N
//! open handles to one daemon, and the wall time of N concurrent
//! `watermarks` calls through them. The numbers in client/DESIGN.md
//! ("Threading model") come from this.
//!
//! ```text
//! wsd serve --root /tmp/ws --state /tmp/ws-state &
//! cargo run --release -p wsd-client --example handle_cost -- 127.0.0.1:45678 60
//! ```
//! (`wsd serve` admits 64 connections by default.)

use std::error::Error;
use std::time::Instant;

use wsd_client::{ClientOptions, WsdHandle};

type Result<T> = std::result::Result<T, Box<dyn Error + Send + Sync>>;

/// `Threads` and `VmRSS` (KiB) of this process.
fn threads_and_rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [addr, n] = args.as_slice() else {
        return Err("usage: handle_cost HOST:PORT N".into());
    };
    let n: usize = n.parse()?;
    let (threads0, rss0) = threads_and_rss();

    let start = Instant::now();
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let opts = ClientOptions {
            peer: format!("cost-{i}"),
            ..ClientOptions::default()
        };
        handles.push(WsdHandle::connect(addr.parse()?, opts).await?);
    }
    let connect = start.elapsed();
    let (threads1, rss1) = threads_and_rss();

    let start = Instant::now();
    let calls: Vec<_> = handles
        .iter()
        .map(|h| {
            let h = h.clone();
            tokio::spawn(async move { h.watermarks().await })
        })
        .collect();
    for c in calls {
        c.await??;
    }
    let concurrent = start.elapsed();

    let start = Instant::now();
    for _ in 0..100 {
        handles[0].watermarks().await?;
    }
    let one = start.elapsed() / 100;

    // The same round trip on a bare `Client` inside a `LocalSet`: the
    // difference is the handle's channel hop between threads.
    let addr_owned = addr.clone();
    let bare = std::thread::spawn(move || -> Result<std::time::Duration> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        tokio::task::LocalSet::new().block_on(&rt, async {
            let c = wsd_client::client::connect(&addr_owned, None, "cost-bare").await?;
            let start = Instant::now();
            for _ in 0..100 {
                c.watermarks().await?;
            }
            Ok(start.elapsed() / 100)
        })
    })
    .join()
    .map_err(|_| "the bare-client thread panicked")??;

    println!("handles: {n}");
    println!(
        "threads: {threads0} -> {threads1} ({:+})",
        threads1 as i64 - threads0 as i64
    );
    println!(
        "rss: {rss0} KiB -> {rss1} KiB ({:.0} KiB per handle)",
        (rss1 as f64 - rss0 as f64) / n as f64
    );
    println!("connect {n} handles one after another: {connect:?}");
    println!("{n} concurrent watermarks calls: {concurrent:?}");
    println!("one watermarks round trip through a handle: {one:?}");
    println!("one watermarks round trip on a bare Client in a LocalSet: {bare:?}");
    drop(handles);
    Ok(())
}
