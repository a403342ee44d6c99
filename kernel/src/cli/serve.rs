//! `gsv serve` (the kernel) and `gsv node` (a device driver).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Args;
use gsv_kernel::boot::DataDirLock;
use gsv_kernel::{Kernel, KernelConfig};
use gsv_node::driver::{self, DriverConfig};
use gsv_node::{NodeRoot, NodeTools};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: String,
    /// Data directory (default: the per-user data dir, e.g.
    /// ~/.local/share/gsv). One kernel at a time serves it: a second
    /// `gsv serve` on it refuses to start.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// The `wsd` binary for local workspaces (default: beside `gsv`, else PATH).
    #[arg(long, value_name = "FILE", env = "GSV_WSD_BIN")]
    wsd_bin: Option<PathBuf>,
    /// Run local workspaces' commands on the host instead of in `wsd serve
    /// --sandbox` (bubblewrap: only the workspace and a read-only system
    /// are visible; needs `bwrap`, Debian package bubblewrap).
    #[arg(long)]
    no_sandbox: bool,
    /// Seconds a socket may take to complete `sys.connect`.
    #[arg(long, default_value_t = 10)]
    handshake_timeout: u64,
    /// Largest text frame in bytes.
    #[arg(long, default_value_t = 16 << 20)]
    max_frame_bytes: usize,
    /// Milliseconds `shell.exec` waits before answering `running`.
    #[arg(long, default_value_t = 5000)]
    exec_wait_ms: u64,
    /// Seconds a call forwarded to an adapter (`adapter.send`, …) waits for
    /// its answer before failing with 504.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    adapter_timeout: f64,
    /// Seconds after which an unused local wsd (running nothing) is stopped.
    #[arg(long, default_value_t = 600)]
    wsd_idle_secs: u64,
    /// The deadline of every call to a workspace's wsd, e.g. `60s`, `5s`:
    /// a wsd that does not answer within it (a frozen or cut-off host)
    /// fails the call, and a running command's session once its output
    /// stays quiet that long and the wsd does not answer a status call
    /// either. Dialling and the handshake get at most 10 s each.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = positive_duration)]
    wsd_timeout: std::time::Duration,
    /// Keep workspaces' file content (chunks) and snapshot manifests in an
    /// S3-compatible object store, so workspaces outlive this machine
    /// (`gsv workspace recover`): `s3://BUCKET[/PREFIX]?endpoint=URL`
    /// (options: `region=R`, default us-east-1; `deadline=30s`, the longest
    /// any one request may take). Each workspace's own store keeps the
    /// index of what the bucket holds for it, and a cache of hot chunks
    /// lives in memory. Credentials come from the usual AWS environment
    /// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN). The
    /// store is checked at start: unreachable or refusing, the kernel does
    /// not start. Without it, chunks live in each workspace's own store
    /// (the embedded SQLite default). One kernel per bucket prefix.
    #[arg(long, value_name = "URL", env = "GSV_CHUNK_STORE")]
    chunk_store: Option<String>,
    /// Garbage collection never frees a chunk stored more recently than
    /// this (a push or snapshot in flight may still need it), e.g. `1h`,
    /// `30m`.
    #[arg(long, value_name = "DURATION", default_value = "1h", value_parser = humantime::parse_duration)]
    gc_grace: std::time::Duration,
    /// The origin browsers reach this kernel at (e.g. https://gsv.example),
    /// for OAuth redirects (`/oauth/callback`); the listen address when
    /// absent.
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// The kernel's WebSocket address, e.g. ws://127.0.0.1:8787/ws.
    #[arg(long, value_name = "URL")]
    kernel: String,
    /// This device's id (the node token must be bound to it).
    #[arg(long)]
    device_id: String,
    /// A file holding the node token (`gsv token create --node DEVICE`
    /// writes one).
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// Every path the node touches resolves inside this directory.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
}

pub async fn serve(a: ServeArgs) -> Result<ExitCode> {
    let data = match a.data {
        Some(d) => d,
        None => dirs::data_dir()
            .context("no per-user data directory on this platform: pass --data")?
            .join("gsv"),
    };
    // Before anything is opened: a second kernel must not touch the
    // database or the workspaces' wsd children of the first.
    let _lock = DataDirLock::acquire(&data)?;
    let mut config = KernelConfig::new(data.clone());
    if let Some(b) = a.wsd_bin {
        config.wsd_bin = b;
    }
    config.wsd_sandbox = !a.no_sandbox;
    config.handshake_timeout = std::time::Duration::from_secs(a.handshake_timeout);
    config.max_frame_bytes = a.max_frame_bytes;
    config.exec_wait = std::time::Duration::from_millis(a.exec_wait_ms);
    config.wsd_idle_stop = std::time::Duration::from_secs(a.wsd_idle_secs);
    config.wsd_timeout = a.wsd_timeout;
    config.adapter_timeout = std::time::Duration::try_from_secs_f64(a.adapter_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| {
            format!(
                "--adapter-timeout must be a positive number of seconds, not {}",
                a.adapter_timeout
            )
        })?;
    config.gc_grace = a.gc_grace;
    config.chunk_store = a.chunk_store.map(|url| gsv_kernel::ChunkStoreConfig {
        url,
        credentials: None,
    });
    config.public_url = a.public_url;
    let kernel: Arc<Kernel> = Kernel::open(config)
        .await
        .with_context(|| format!("opening {}", data.display()))?;
    let listener = tokio::net::TcpListener::bind(&a.listen)
        .await
        .with_context(|| format!("listening on {}", a.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, data = %data.display(), "gsv listening");
    // Scripts and tests read the bound address from this line.
    println!("listening on {addr}");
    gsv_kernel::server::serve(listener, kernel.clone(), shutdown_signal()).await?;
    kernel.shutdown().await;
    Ok(ExitCode::SUCCESS)
}

/// A duration above zero (`humantime`: `60s`, `1m30s`, `500ms`).
fn positive_duration(text: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be above zero".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// `user`: the account the node token belongs to (the global `--user`;
/// default: the token's own account, as the kernel knows it).
pub async fn node(a: NodeArgs, user: Option<String>) -> Result<ExitCode> {
    let token = std::fs::read_to_string(&a.token_file)
        .with_context(|| format!("reading the token file {}", a.token_file.display()))?
        .trim()
        .to_owned();
    if token.is_empty() {
        bail!("the token file {} is empty", a.token_file.display());
    }
    let root = NodeRoot::new(&a.root)
        .with_context(|| format!("opening the node root {}", a.root.display()))?;
    let tools = NodeTools::new(root);
    let config = DriverConfig::new(a.kernel, a.device_id, user.unwrap_or_default(), token);
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        s.cancel();
    });
    driver::run(config, tools, stop).await?;
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hangup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    // A hang-up (its terminal closed) too: local wsd children run in a
    // process group of their own, so only an orderly shutdown stops them.
    tokio::select! {
        _ = term.recv() => {}
        _ = hangup.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
