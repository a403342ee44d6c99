//! The `gsv` command line: `serve` runs the kernel; `node` runs a device
//! driver; `call`, `workspace`, `exec` and `chat` drive a kernel over its
//! WebSocket like any other user client; `sched`, `notify` and
//! `notifications` are in [`sched`].

mod proc;
mod sched;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use gsv_kernel::client::{Credentials, GsvClient};
use gsv_kernel::{Kernel, KernelConfig};
use gsv_node::driver::{self, DriverConfig};
use gsv_node::{NodeRoot, NodeTools};
use serde_json::{Value, json};

#[derive(Debug, Parser)]
#[command(
    name = "gsv",
    version,
    about = "The gsv gateway kernel and its user CLI"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the kernel until SIGTERM or Ctrl-C.
    Serve(ServeArgs),
    /// Run a device driver: answer `fs.*` and `shell.exec` routed to this
    /// device, inside `--root`, until SIGTERM or Ctrl-C.
    Node(NodeArgs),
    /// Send one syscall and print the response frame as JSON.
    #[command(after_help = CONFIG_HELP)]
    Call {
        #[command(flatten)]
        conn: ConnArgs,
        /// The syscall, e.g. `fs.read`.
        call: String,
        /// Its arguments as a JSON object (default `{}`).
        args: Option<String>,
    },
    /// Create or list workspaces.
    #[command(after_help = CONFIG_HELP)]
    Workspace {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        action: WorkspaceAction,
    },
    /// Run a command in a workspace and print its output.
    #[command(after_help = CONFIG_HELP)]
    Exec {
        #[command(flatten)]
        conn: ConnArgs,
        /// The workspace id.
        workspace: String,
        /// Working directory inside the workspace (default: its root).
        #[arg(long)]
        cwd: Option<String>,
        /// The command after `--`: one word is a shell line (`'a | b'`);
        /// two or more are a program and its arguments, each quoted for
        /// the shell, as `wsd exec` does.
        #[arg(last = true, required = true, value_name = "CMD")]
        command: Vec<String>,
    },
    /// Talk to an agent process: send messages (from `-m` or stdin lines),
    /// print its streamed answer, and ask on the terminal when it wants
    /// approval. Without PID a new process is spawned.
    #[command(after_help = CONFIG_HELP)]
    Chat {
        #[command(flatten)]
        conn: ConnArgs,
        /// The process (`proc:<uuid>`).
        pid: Option<String>,
        /// Send this one message and exit when its run finishes.
        #[arg(short, long)]
        message: Option<String>,
        /// Spawn the new process in a new workspace.
        #[arg(long)]
        workspace: bool,
    },
    /// A process's conversations: list, compact, fork
    /// (`proc.conversation.*`; your home process without `--pid`).
    #[command(after_help = CONFIG_HELP)]
    Proc {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        action: proc::ProcAction,
    },
    /// List, add, remove or run schedules (`sched.*`).
    #[command(after_help = CONFIG_HELP)]
    Sched {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(subcommand)]
        action: Box<sched::SchedAction>,
    },
    /// Notify yourself (every socket of yours gets `notification.created`);
    /// prints the notification's id.
    #[command(after_help = CONFIG_HELP)]
    Notify {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(flatten)]
        args: Box<sched::NotifyArgs>,
    },
    /// List your notifications (id, created, level, state, title), or mark
    /// one read or dismissed.
    #[command(after_help = CONFIG_HELP)]
    Notifications {
        #[command(flatten)]
        conn: ConnArgs,
        #[command(flatten)]
        args: Box<sched::NotificationsArgs>,
    },
}

/// The largest page a list call returns (`sched.list`, `notification.list`).
const MAX_PAGE: u32 = 500;

#[derive(Debug, Subcommand)]
enum WorkspaceAction {
    /// Create a workspace and print its id (`ws_…`).
    Create {
        /// A name to show in `gsv workspace list`.
        #[arg(long)]
        label: Option<String>,
    },
    /// Print your workspaces, one a line: id, state, label (tab-separated).
    List,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8787")]
    listen: String,
    /// Data directory (default: the per-user data dir, e.g. ~/.local/share/gsv).
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
    /// Seconds after which an unused local wsd (running nothing) is stopped.
    #[arg(long, default_value_t = 600)]
    wsd_idle_secs: u64,
}

#[derive(Debug, Args)]
struct NodeArgs {
    /// The kernel's WebSocket address, e.g. ws://127.0.0.1:8787/ws.
    #[arg(long, value_name = "URL")]
    kernel: String,
    /// This device's id (the node token must be bound to it).
    #[arg(long)]
    device_id: String,
    /// The account the node token belongs to (default: the token's own
    /// account, as the kernel knows it).
    #[arg(long, env = "GSV_USER")]
    user: Option<String>,
    /// A file holding the node token (`sys.token.create {kind:"node",
    /// allowedRole:"driver", allowedDeviceId}`).
    #[arg(long, value_name = "FILE")]
    token_file: PathBuf,
    /// Every path the node touches resolves inside this directory.
    #[arg(long, value_name = "DIR")]
    root: PathBuf,
}

/// Where the kernel is and who we are: flags, else env, else the config
/// file (`~/.config/gsv/config.json`: `{url, username, token|password}`).
#[derive(Debug, Args)]
struct ConnArgs {
    /// The kernel's WebSocket address [default: ws://127.0.0.1:8787/ws].
    #[arg(long, env = "GSV_URL", value_name = "URL")]
    url: Option<String>,
    /// The account to log in as.
    #[arg(long, env = "GSV_USER", value_name = "NAME")]
    user: Option<String>,
    /// A user token (`sys.token.create`); wins over a password.
    #[arg(long, env = "GSV_TOKEN", hide_env_values = true, value_name = "TOKEN")]
    token: Option<String>,
    /// The account's password.
    #[arg(
        long,
        env = "GSV_PASSWORD",
        hide_env_values = true,
        value_name = "PASSWORD"
    )]
    password: Option<String>,
}

/// Shown under every command that connects, so the file is discoverable.
const CONFIG_HELP: &str = "Each of --url, --user and --token/--password \
falls back to its environment variable, then to the config file \
~/.config/gsv/config.json (under $XDG_CONFIG_HOME if set): \
{\"url\": …, \"username\": …, \"token\": … or \"password\": …}.";

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal, never with NO_COLOR set.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gsv: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gsv: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Writes to stdout. A reader that went away (`gsv call … | head`) is
/// not an error of ours: `print!` would panic on the broken pipe, this
/// drops the rest quietly.
fn out(s: &str) -> Result<()> {
    use std::io::Write as _;
    let mut o = std::io::stdout().lock();
    match o.write_all(s.as_bytes()).and_then(|()| o.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("writing to stdout"),
        _ => Ok(()),
    }
}

async fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Serve(a) => serve(a).await,
        Command::Node(a) => node(a).await,
        Command::Call { conn, call, args } => {
            let args: Value = match args {
                Some(s) => serde_json::from_str(&s).context("ARGS must be a JSON object")?,
                None => json!({}),
            };
            // Setup happens before anyone can log in.
            let mut c = if call == "sys.setup" {
                GsvClient::connect(&conn.resolve()?.0).await?
            } else {
                connect(&conn).await?
            };
            let res = c.request(&call, args).await?;
            out(&format!("{}\n", serde_json::to_string_pretty(&res)?))?;
            c.close().await;
            Ok(if res["ok"] == true {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Workspace { conn, action } => {
            let mut c = connect(&conn).await?;
            match action {
                WorkspaceAction::Create { label } => {
                    let d = c
                        .call("sys.workspace.create", json!({"label": label}))
                        .await?;
                    println!("{}", d["workspace"]["workspaceId"].as_str().unwrap_or(""));
                }
                WorkspaceAction::List => {
                    let d = c.call("sys.workspace.list", json!({})).await?;
                    for w in d["workspaces"].as_array().into_iter().flatten() {
                        println!(
                            "{}\t{}\t{}",
                            w["workspaceId"].as_str().unwrap_or(""),
                            w["state"].as_str().unwrap_or(""),
                            w["label"].as_str().unwrap_or("")
                        );
                    }
                }
            }
            c.close().await;
            Ok(ExitCode::SUCCESS)
        }
        Command::Exec {
            conn,
            workspace,
            cwd,
            command,
        } => exec(&conn, &workspace, cwd, command_line(&command)?).await,
        Command::Chat {
            conn,
            pid,
            message,
            workspace,
        } => chat(&conn, pid, message, workspace).await,
        Command::Proc { conn, action } => {
            let mut c = connect(&conn).await?;
            let ok = proc::proc(&mut c, action).await?;
            c.close().await;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Sched { conn, action } => {
            let mut c = connect(&conn).await?;
            let ok = sched::sched(&mut c, *action).await?;
            c.close().await;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Notify { conn, args } => {
            let mut c = connect(&conn).await?;
            let ok = sched::notify(&mut c, *args).await?;
            c.close().await;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Notifications { conn, args } => {
            let mut c = connect(&conn).await?;
            let ok = sched::notifications(&mut c, *args).await?;
            c.close().await;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

type StdinLines = tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>;

async fn chat(
    conn: &ConnArgs,
    pid: Option<String>,
    message: Option<String>,
    workspace: bool,
) -> Result<ExitCode> {
    use tokio::io::AsyncBufReadExt;
    let mut c = connect(conn).await?;
    // A model may think for minutes; each frame still has a deadline.
    c.timeout = std::time::Duration::from_secs(600);
    let pid = match pid {
        Some(p) => p,
        None => {
            let args = if workspace {
                json!({"workspace": {"mode": "new"}})
            } else {
                json!({})
            };
            let d = c.call("proc.spawn", args).await?;
            let pid = d["pid"].as_str().unwrap_or_default().to_owned();
            eprintln!("pid {pid} (cwd {})", d["cwd"].as_str().unwrap_or(""));
            pid
        }
    };
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut ok = true;
    if let Some(m) = message {
        ok = chat_turn(&mut c, &pid, &m, &mut stdin).await?;
    } else {
        while let Some(line) = stdin.next_line().await? {
            if !line.trim().is_empty() {
                ok = chat_turn(&mut c, &pid, &line, &mut stdin).await?;
            }
        }
    }
    c.close().await;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One message and its run; false when the run ended with an error.
async fn chat_turn(
    c: &mut GsvClient,
    pid: &str,
    message: &str,
    stdin: &mut StdinLines,
) -> Result<bool> {
    use std::io::Write as _;
    let id = c.fresh_id();
    c.send_request(&id, "proc.send", json!({"pid": pid, "message": message}))
        .await?;
    let mut run_id: Option<String> = None;
    loop {
        let f = c.recv().await?;
        if f["type"] == "res" && f["id"] == id {
            if f["ok"] != true {
                bail!(
                    "proc.send: {}",
                    f["error"]["message"].as_str().unwrap_or("failed")
                );
            }
            run_id = f["data"]["runId"].as_str().map(str::to_owned);
            if f["data"]["queued"] == true {
                eprintln!("(queued behind the running turn)");
            }
            continue;
        }
        if f["type"] != "sig" || f["payload"]["pid"] != pid {
            continue;
        }
        let p = &f["payload"];
        match f["signal"].as_str().unwrap_or("") {
            "proc.run.stream" if p["event"]["type"] == "text_delta" => {
                print!("{}", p["event"]["delta"].as_str().unwrap_or(""));
                std::io::stdout().flush()?;
            }
            "proc.run.tool.started" => {
                eprintln!("\n[{} {}]", p["toolName"].as_str().unwrap_or(""), p["args"]);
            }
            "proc.run.tool.finished" if p["isError"] == true => {
                eprintln!(
                    "[{} failed: {}]",
                    p["toolName"].as_str().unwrap_or(""),
                    p["error"]
                );
            }
            "proc.run.retrying" => {
                eprintln!("[retrying: {}]", p["error"].as_str().unwrap_or(""));
            }
            "proc.run.hil.requested" => {
                eprint!(
                    "\nallow {} {}? [y/N/a(lways)] ",
                    p["syscall"].as_str().unwrap_or(""),
                    p["args"]
                );
                let answer = stdin.next_line().await?.unwrap_or_default();
                let a = answer.trim().to_ascii_lowercase();
                let decision = if a == "y" || a == "a" {
                    "approve"
                } else {
                    "deny"
                };
                let hid = c.fresh_id();
                c.send_request(
                    &hid,
                    "proc.hil",
                    json!({"requestId": p["requestId"], "decision": decision, "remember": a == "a"}),
                )
                .await?;
            }
            "proc.run.finished" if run_id.is_none() || p["runId"].as_str() == run_id.as_deref() => {
                println!();
                if let Some(e) = p["error"].as_str() {
                    eprintln!("error: {e}");
                    return Ok(false);
                }
                if p["aborted"] == true {
                    eprintln!("(aborted)");
                }
                return Ok(true);
            }
            _ => {}
        }
    }
}

/// The protocol's command line (a shell string) for the words after
/// `--`, as `wsd exec` builds it: one word is already a command line;
/// several are an argv, quoted word by word so the shell hands the program
/// exactly those words.
fn command_line(words: &[String]) -> Result<String> {
    match words {
        [one] => Ok(one.clone()),
        many => shlex::try_join(many.iter().map(String::as_str))
            .map_err(|e| anyhow::anyhow!("the command cannot be quoted for the shell: {e}")),
    }
}

async fn exec(
    conn: &ConnArgs,
    workspace: &str,
    cwd: Option<String>,
    input: String,
) -> Result<ExitCode> {
    let mut c = connect(conn).await?;
    let cwd = match cwd {
        Some(d) if d.starts_with('/') => d,
        Some(d) => format!("/workspaces/{workspace}/{d}"),
        None => format!("/workspaces/{workspace}"),
    };
    let mut d = c
        .call("shell.exec", json!({"cwd": cwd, "input": input}))
        .await?;
    // A workspace answer's `stdout`/`stderr` carry only what no earlier
    // answer returned, so each is printed as it comes, stderr to ours. An
    // answer without them (a failure before the command ran) has its
    // `output` printed, once.
    let mut polled = false;
    loop {
        let (o, e) = match (d["stdout"].as_str(), d["stderr"].as_str()) {
            (Some(o), Some(e)) => (o, e),
            _ if polled => ("", ""),
            _ => (d["output"].as_str().unwrap_or(""), ""),
        };
        if d["truncated"] == true {
            eprintln!("gsv: (output over the kernel's cap: some was dropped)");
        }
        out(o)?;
        eprint!("{e}");
        match d["status"].as_str() {
            Some("running") => {
                polled = true;
                let sid = d["sessionId"].as_str().unwrap_or_default().to_owned();
                d = c
                    .call("shell.exec", json!({"sessionId": sid, "input": ""}))
                    .await?;
            }
            status => {
                c.close().await;
                if status == Some("completed") {
                    let code = d["exitCode"].as_i64().unwrap_or(1);
                    return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
                }
                let error = d["error"].as_str().unwrap_or("the command failed");
                if error == e.trim_end() {
                    // Already printed as the answer's stderr.
                    return Ok(ExitCode::FAILURE);
                }
                bail!("{error}");
            }
        }
    }
}

impl ConnArgs {
    /// `(url, username, credentials)`.
    fn resolve(&self) -> Result<(String, Option<String>, Option<Credentials>)> {
        let file: Value = dirs::config_dir()
            .map(|d| d.join("gsv").join("config.json"))
            .and_then(|p| std::fs::read_to_string(p).ok())
            .and_then(|s| serde_json::from_str(&s).ok())
            .unwrap_or(Value::Null);
        let from_file = |k: &str| file[k].as_str().map(str::to_owned);
        let url = self
            .url
            .clone()
            .or_else(|| from_file("url"))
            .unwrap_or_else(|| "ws://127.0.0.1:8787/ws".into());
        let user = self.user.clone().or_else(|| from_file("username"));
        let creds = match (&self.token, &self.password) {
            (Some(t), _) => Some(Credentials::Token(t.clone())),
            (None, Some(p)) => Some(Credentials::Password(p.clone())),
            (None, None) => from_file("token")
                .map(Credentials::Token)
                .or_else(|| from_file("password").map(Credentials::Password)),
        };
        Ok((url, user, creds))
    }
}

async fn connect(conn: &ConnArgs) -> Result<GsvClient> {
    let (url, user, creds) = conn.resolve()?;
    let user =
        user.context("no username: pass --user, set GSV_USER or write it in the config file")?;
    let creds =
        creds.context("no credentials: pass --token/--password or set GSV_TOKEN/GSV_PASSWORD")?;
    let mut c = GsvClient::connect(&url).await?;
    c.login(&user, &creds).await?;
    Ok(c)
}

async fn serve(a: ServeArgs) -> Result<ExitCode> {
    let data = match a.data {
        Some(d) => d,
        None => dirs::data_dir()
            .context("no per-user data directory on this platform: pass --data")?
            .join("gsv"),
    };
    let mut config = KernelConfig::new(data.clone());
    if let Some(b) = a.wsd_bin {
        config.wsd_bin = b;
    }
    config.wsd_sandbox = !a.no_sandbox;
    config.handshake_timeout = std::time::Duration::from_secs(a.handshake_timeout);
    config.max_frame_bytes = a.max_frame_bytes;
    config.exec_wait = std::time::Duration::from_millis(a.exec_wait_ms);
    config.wsd_idle_stop = std::time::Duration::from_secs(a.wsd_idle_secs);
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

async fn node(a: NodeArgs) -> Result<ExitCode> {
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
    let config = DriverConfig::new(a.kernel, a.device_id, a.user.unwrap_or_default(), token);
    let stop = tokio_util::sync::CancellationToken::new();
    let s = stop.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        s.cancel();
    });
    driver::run(config, tools, stop).await?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
