//! Argument parsing and dispatch of the `wsd` subcommands.

mod agent;
mod excludes;
mod exec;
mod status;
mod sync;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, CommandFactory, Parser, Subcommand};
use wsd::rpc::{DEFAULT_PORT, Token};

/// A content-addressed sync and workspace daemon.
///
/// `wsd serve` owns one workspace directory and serves it over Cap'n Proto
/// RPC. The other subcommands are its clients: they keep a local directory
/// in sync with it and run commands in it.
#[derive(Debug, Parser)]
#[command(version, propagate_version = true, max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More log output (repeat for more); `RUST_LOG` overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// How log lines on stderr look: `text` (colored only on a terminal,
    /// never with `NO_COLOR` set) or `json` (one object per line).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true, env = "WSD_LOG_FORMAT")]
    log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a workspace directory until SIGTERM or Ctrl-C.
    ///
    /// Without a token only loopback and unix-socket peers are admitted.
    Serve(ServeArgs),
    /// Send LOCAL_DIR's changes to the remote workspace.
    ///
    /// LOCAL_DIR is indexed in LOCAL_DIR/.wsd (never synced); only changed
    /// chunks cross the wire. Prints a one-line summary.
    ///
    /// A local agent (see `wsd agent`) makes the push when one serves
    /// LOCAL_DIR; otherwise the push walks LOCAL_DIR and then starts one in
    /// the background, so that the next pushes need no walk.
    Push(sync::PushArgs),
    /// Bring the remote workspace's changes into LOCAL_DIR.
    ///
    /// Made by the local agent when one serves LOCAL_DIR, as a push is.
    Pull(sync::PullArgs),
    /// Pull then push; with --watch, keep both sides converged until Ctrl-C.
    ///
    /// Without --watch made by the local agent when one serves LOCAL_DIR,
    /// as a push is.
    Sync(sync::SyncArgs),
    /// Print the remote's watermarks as JSON (currentRev, pushRev,
    /// fetchCursor), as kept for one peer.
    Watermarks(sync::WatermarksArgs),
    /// Print a daemon's version, root, current rev, uptime, live execs and
    /// how far each syncing peer has pushed; exit 1 if it is unreachable
    /// or unhealthy.
    ///
    /// With LOCAL_DIR, that directory's side too: its peer name, how far
    /// it has pulled the daemon's revs and pushed its own (from its index),
    /// and its excludes. Made for container health probes: it gives up
    /// after --timeout.
    Status(status::StatusArgs),
    /// Run a command in the remote workspace and stream its output.
    ///
    /// `wsd exec -- CMD ARG...` runs exactly that argv; `wsd exec -- 'a && b'`
    /// (one word) runs a shell command line. With -i our stdin is streamed to
    /// it; without, its stdin is closed. Its stdout and stderr go to ours; we exit with its exit code (128+N
    /// if signal N killed it, 255 if the daemon died while it ran). Ctrl-C
    /// sends it TERM (the daemon KILLs it 5 s later if needed); a second
    /// Ctrl-C detaches (exit 130). If our stdout closes it gets TERM (exit
    /// 141). A lost connection re-attaches, for up to 30 s.
    Exec(exec::ExecArgs),
    /// Re-attach to a command's output and exit with its exit code.
    ///
    /// By default every retained event is replayed (ELOG_TRUNCATED if the
    /// oldest were evicted: use --after or --tail). Ctrl-C detaches.
    Attach(exec::AttachArgs),
    /// Signal a running command's process group.
    Kill(exec::KillArgs),
    /// List, add or drop LOCAL_DIR's remembered excludes (no daemon needed).
    ///
    /// `--exclude PATTERN` on push, pull or sync remembers PATTERN with
    /// LOCAL_DIR's sync state: later transfers leave it out without the
    /// flag. `rm` (or `--no-exclude PATTERN` on a transfer) drops one; the
    /// next push then sends what it hid locally.
    #[command(subcommand)]
    Exclude(sync::ExcludeCommand),
    /// The local agent that makes LOCAL_DIR's one-shot pushes, pulls and
    /// syncs without a walk: its status, stopping it, or running one in the
    /// foreground.
    ///
    /// `wsd push`, `pull` and `sync` start one in the background (its log
    /// in STATE/agent.log) when none answers; it watches LOCAL_DIR with
    /// inotify and exits after --idle-timeout (default 600 s, also
    /// WSD_AGENT_IDLE_TIMEOUT) without a transfer, when LOCAL_DIR or its
    /// state directory is removed, on SIGTERM, or on `wsd agent stop`.
    /// `WSD_AGENT=off` or `--no-agent` starts none.
    #[command(subcommand)]
    Agent(sync::AgentCommand),
    /// Print a shell completion script for SHELL on stdout.
    ///
    /// For example: `wsd completions bash > /etc/bash_completion.d/wsd`.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the wsd(1) man page (roff) on stdout.
    ///
    /// For example: `wsd man > /usr/local/share/man/man1/wsd.1`.
    Man,
    /// Internal: the runner `wsd serve --sandbox` starts inside its sandbox
    /// (it forks the commands there); not for use by hand.
    #[command(name = "sandbox-runner", hide = true)]
    SandboxRunner {
        /// The control socket the daemon left open.
        #[arg(long, value_name = "FD")]
        control_fd: i32,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The workspace directory (created if missing).
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
    /// Where to listen: `host:port` or `unix:/path`; repeat for several.
    #[arg(long, value_name = "ADDR", default_values_t = [format!("127.0.0.1:{DEFAULT_PORT}")])]
    listen: Vec<String>,
    /// The index and exec log directory. Default: ROOT/.wsd, which is never
    /// synced and which `apply` refuses to write into.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    /// A file holding the token peers must present (also `WSD_TOKEN`).
    #[arg(long, value_name = "FILE", env = "WSD_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Do not watch the tree with inotify: every settle walks it.
    #[arg(long)]
    no_watch: bool,
    /// Output bytes kept per exec log (default 16 MiB); the oldest events
    /// are evicted first, and resuming below the kept window is
    /// ELOG_TRUNCATED.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    exec_log_cap: Option<u64>,
    /// Seconds a new connection has to complete its handshake (token and
    /// version check) before it is dropped.
    #[arg(long, value_name = "SECS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    handshake_timeout: u64,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// `wsd serve --sandbox` and its settings.
#[derive(Debug, Args)]
#[command(next_help_heading = "Sandbox")]
struct SandboxArgs {
    /// Run every command under bubblewrap (`bwrap`, Debian package
    /// bubblewrap): in its own mount, pid, IPC and (see --sandbox-net)
    /// network namespace, seeing only the workspace (read-write, at its own
    /// path), a read-only /usr, /bin, /lib* and a few /etc files, and fresh
    /// /proc, /dev and /tmp (HOME=/tmp). Not the state directory, the token
    /// file, the host's other files or its processes. Refused at start if
    /// bwrap is missing or cannot create namespaces here.
    #[arg(long)]
    sandbox: bool,
    /// Network of sandboxed commands: `none` (a namespace of their own with
    /// only loopback) or `host` (the host's network).
    #[arg(long, value_enum, value_name = "NET", default_value_t = SandboxNet::None, requires = "sandbox")]
    sandbox_net: SandboxNet,
    /// Address space of each sandboxed process (RLIMIT_AS), e.g. 4GiB or
    /// 512MiB; 0 for no limit.
    #[arg(
        long,
        value_name = "SIZE",
        default_value = "4GiB",
        requires = "sandbox"
    )]
    sandbox_mem: bytesize::ByteSize,
    /// Processes of the daemon's user while a sandboxed command forks
    /// (RLIMIT_NPROC; the kernel counts all of that user's processes and
    /// exempts root); 0 for no limit.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "sandbox")]
    sandbox_pids: u64,
    /// Open files of each sandboxed process (RLIMIT_NOFILE).
    #[arg(long, value_name = "N", default_value_t = wsd::exec::sandbox::DEFAULT_SANDBOX_OPEN_FILES, value_parser = clap::value_parser!(u64).range(1..), requires = "sandbox")]
    sandbox_nofile: u64,
    /// Largest file a sandboxed process may write (RLIMIT_FSIZE), e.g.
    /// 10GiB; 0 for no limit.
    #[arg(long, value_name = "SIZE", default_value = "0", requires = "sandbox")]
    sandbox_file_size: bytesize::ByteSize,
    /// A host directory to show read-only at its own path inside the
    /// sandbox (a toolchain outside /usr, say); repeat for several.
    #[arg(long, value_name = "DIR", requires = "sandbox")]
    sandbox_ro: Vec<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SandboxNet {
    None,
    Host,
}

impl SandboxArgs {
    /// The exec sandbox configuration, `None` without `--sandbox`. The
    /// token file is hidden inside it (the daemon adds its state directory
    /// and sockets).
    fn config(self, token_file: Option<&Path>) -> Option<wsd::exec::SandboxConfig> {
        if !self.sandbox {
            return None;
        }
        let limit = |n: u64| (n > 0).then_some(n);
        let mut config = wsd::exec::SandboxConfig::new();
        config.network = match self.sandbox_net {
            SandboxNet::None => wsd::exec::SandboxNetwork::None,
            SandboxNet::Host => wsd::exec::SandboxNetwork::Host,
        };
        config.limits = wsd::exec::SandboxLimits {
            memory_bytes: limit(self.sandbox_mem.as_u64()),
            processes: limit(self.sandbox_pids),
            open_files: Some(self.sandbox_nofile),
            file_size_bytes: limit(self.sandbox_file_size.as_u64()),
        };
        config.hidden.extend(token_file.map(Path::to_path_buf));
        config.read_only = self.sandbox_ro;
        Some(config)
    }
}

/// How to reach a remote daemon.
#[derive(Debug, Args, Clone)]
pub struct RemoteArgs {
    /// The daemon's address: `host:port` or `unix:/path`.
    #[arg(long, value_name = "ADDR", env = "WSD_REMOTE")]
    remote: String,
    /// A file holding the daemon's token (else the token in `WSD_TOKEN`).
    #[arg(long, value_name = "FILE", env = "WSD_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

impl RemoteArgs {
    /// The token to present: `--token-file`/`WSD_TOKEN_FILE`, else
    /// `WSD_TOKEN`, as `wsd serve` reads them.
    fn token(&self) -> Result<Option<Vec<u8>>> {
        match self.token_file.as_deref() {
            Some(f) => read_token(f).map(Some),
            None => Ok(Token::from_env().map(|t| t.as_bytes().to_vec())),
        }
    }

    /// Connects as `peer`, the error naming the address; a refusal for a
    /// missing token says how to give one.
    async fn connect(&self, peer: &str) -> Result<wsd_client::client::Client> {
        let token = self.token()?;
        let given = token.is_some();
        match wsd_client::client::connect(&self.remote, token, peer).await {
            Ok(c) => Ok(c),
            Err(e) if !given && e.code == wsd_sync::ErrorCode::Auth => Err(anyhow::Error::new(e)
                .context(format!(
                    "connecting to {} (give its token with --token-file FILE, \
                     WSD_TOKEN_FILE or WSD_TOKEN)",
                    self.remote
                ))),
            Err(e) => Err(e).with_context(|| format!("connecting to {}", self.remote)),
        }
    }
}

fn read_token(path: &Path) -> Result<Vec<u8>> {
    let token = Token::from_file(path).with_context(|| format!("token file {}", path.display()))?;
    Ok(token.as_bytes().to_vec())
}

pub fn init_tracing(args: &Cli) {
    // The daemon and the agent report their lifecycle; clients print only
    // their summary.
    let quiet = if matches!(
        args.command,
        Command::Serve(_) | Command::Agent(sync::AgentCommand::Run(_))
    ) {
        "wsd=info,warn"
    } else {
        "warn"
    };
    let default = match args.verbose {
        0 => quiet,
        1 => "wsd=debug,info",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(use_color()).init(),
    }
}

/// Color only for a person at a terminal: not when stderr is a pipe or
/// file (logs, CI), and never when `NO_COLOR` is set (no-color.org).
fn use_color() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// An error and its causes on one line, each cause once. Many I/O-level
/// errors already include their source in their own message; `{:#}` would
/// then repeat it ("Address already in use: Address already in use").
pub fn render_error(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Runs `fut` on a current-thread runtime inside a `LocalSet` (capnp-rpc is
/// `!Send`).
fn block_on_local<F: std::future::Future>(fut: F) -> Result<F::Output> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    Ok(tokio::task::LocalSet::new().block_on(&rt, fut))
}

pub fn run(args: Cli) -> Result<ExitCode> {
    match args.command {
        Command::Serve(a) => serve(a),
        Command::Push(a) => block_on_local(sync::push(a))?,
        Command::Pull(a) => block_on_local(sync::pull(a))?,
        Command::Sync(a) => block_on_local(sync::sync(a))?,
        Command::Watermarks(a) => block_on_local(sync::watermarks(a))?,
        Command::Status(a) => block_on_local(status::status(a))?,
        Command::Exec(a) => block_on_local(exec::exec(a))?,
        Command::Attach(a) => block_on_local(exec::attach(a))?,
        Command::Kill(a) => block_on_local(exec::kill(a))?,
        Command::Exclude(c) => sync::exclude(c),
        Command::Agent(c) => block_on_local(sync::agent_command(c))?,
        Command::Completions { shell } => {
            let mut cmd = Cli::command();
            clap_complete::generate(shell, &mut cmd, "wsd", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command())
                .render(&mut std::io::stdout())
                .context("writing the man page")?;
            Ok(ExitCode::SUCCESS)
        }
        Command::SandboxRunner { control_fd } => {
            wsd::exec::sandbox_runner::run_runner(control_fd)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn serve(a: ServeArgs) -> Result<ExitCode> {
    std::fs::create_dir_all(&a.root)
        .with_context(|| format!("creating the workspace root {}", a.root.display()))?;
    let root = a
        .root
        .canonicalize()
        .with_context(|| format!("{}", a.root.display()))?;
    let state_dir = a.state.unwrap_or_else(|| root.join(".wsd"));
    let token = match &a.token_file {
        Some(f) => {
            Some(Token::from_file(f).with_context(|| format!("token file {}", f.display()))?)
        }
        None => Token::from_env(),
    };
    let config = wsd::daemon::DaemonConfig {
        root,
        state_dir,
        listen: a.listen,
        token,
        store: wsd::store::StoreOptions {
            watch: !a.no_watch,
            ..Default::default()
        },
        exec_log_cap: a.exec_log_cap,
        handshake_timeout: Some(std::time::Duration::from_secs(a.handshake_timeout)),
        sandbox: a.sandbox.config(a.token_file.as_deref()),
        prune_every: None,
    };
    block_on_local(wsd::daemon::run(config, |_| {}, shutdown_signal()))??;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the daemon");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupt received"),
    }
}
