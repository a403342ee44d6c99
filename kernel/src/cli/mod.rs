//! The `gsv` command line: `serve` runs the kernel; `node` runs a device
//! driver; `setup`, `login`, `config` and `token` are the first run;
//! `call`, `workspace`, `exec`, `attach`, `chat` and `watch` drive a kernel over
//! its WebSocket like any other user client; `sched`, `notify` and
//! `notifications` are in [`sched`], `codemode` and `mcp` in [`codemode`];
//! `proc` (conversations) in [`proc`]; `oauth` in [`oauth`].

mod account;
mod chat;
mod codemode;
mod conn;
mod exec;
mod oauth;
mod proc;
mod repo;
mod sched;
mod serve;
mod watch;
mod workspace;

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use serde_json::{Value, json};

use conn::{CONFIG_HELP, ConnArgs};

#[derive(Debug, Parser)]
#[command(
    name = "gsv",
    version,
    about = "The gsv gateway kernel and its user CLI",
    after_help = "First run: `gsv serve` in one terminal, then `gsv setup` in another."
)]
struct Cli {
    #[command(flatten)]
    conn: ConnArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the kernel until SIGTERM or Ctrl-C.
    Serve(serve::ServeArgs),
    /// Run a device driver: answer `fs.*` and `shell.exec` routed to this
    /// device, inside `--root`, until SIGTERM or Ctrl-C.
    Node(serve::NodeArgs),
    /// Set up a new kernel: its first user (and optionally root's password
    /// and the model), then log in as that user. Asks for what no flag
    /// gives when run at a terminal.
    #[command(after_help = CONFIG_HELP)]
    Setup(account::SetupArgs),
    /// Log in and remember it: writes the client config file (URL, user
    /// and a token; never the password) that every other command reads.
    #[command(after_help = CONFIG_HELP)]
    Login(account::LoginArgs),
    /// Read or write kernel configuration (e.g. `ai.model`).
    #[command(after_help = CONFIG_HELP)]
    Config {
        #[command(subcommand)]
        action: account::ConfigAction,
    },
    /// Create tokens (e.g. for `gsv node`).
    #[command(after_help = CONFIG_HELP)]
    Token {
        #[command(subcommand)]
        action: account::TokenAction,
    },
    /// Send one syscall and print the response frame as JSON. Exits 1 when
    /// the call fails, or when its operation does (`data.ok: false`).
    #[command(after_help = CONFIG_HELP)]
    Call {
        /// The syscall, e.g. `fs.read`.
        call: String,
        /// Its arguments as a JSON object (default `{}`).
        args: Option<String>,
    },
    /// Create, list or remove workspaces.
    #[command(after_help = CONFIG_HELP)]
    Workspace {
        #[command(subcommand)]
        action: workspace::WorkspaceAction,
    },
    /// Versioned repositories (`repo.*`): list, create, log, show, diff, import.
    #[command(after_help = CONFIG_HELP)]
    Repo {
        #[command(subcommand)]
        action: repo::RepoAction,
    },
    /// Run a command in a workspace, printing its output as it comes; its
    /// exit code is ours.
    #[command(after_help = CONFIG_HELP)]
    Exec(exec::ExecArgs),
    /// Follow a command `gsv exec --detach` started: its output from where
    /// no one has read it, then its exit code. Ctrl-C detaches.
    #[command(after_help = CONFIG_HELP)]
    Attach(exec::AttachArgs),
    /// Print a workspace's changes as they happen (`fs.watch`): one line
    /// per changed path (`TYPE<TAB>PATH[<TAB>SIZE]`), then, on exit, the
    /// cursor to resume from with `--after` (`cursor<TAB>C`).
    #[command(after_help = CONFIG_HELP)]
    Watch(watch::WatchArgs),
    /// Talk to an agent process: send messages (from `-m` or stdin lines),
    /// print its streamed answer, and ask on the terminal when it wants
    /// approval. Without PID a new process is spawned.
    #[command(after_help = CONFIG_HELP)]
    Chat(chat::ChatArgs),
    /// A process's conversations: list, compact, fork
    /// (`proc.conversation.*`; your home process without `--pid`).
    #[command(after_help = CONFIG_HELP)]
    Proc {
        #[command(subcommand)]
        action: proc::ProcAction,
    },
    /// Run a JavaScript block (`codemode.run`).
    #[command(after_help = CONFIG_HELP)]
    Codemode {
        #[command(subcommand)]
        action: Box<codemode::CodemodeAction>,
    },
    /// Add, list, remove or call your MCP servers (`sys.mcp.*`).
    #[command(after_help = CONFIG_HELP)]
    Mcp {
        #[command(subcommand)]
        action: Box<codemode::McpAction>,
    },
    /// List or forget your OAuth accounts (`sys.oauth.*`).
    #[command(after_help = CONFIG_HELP)]
    Oauth {
        #[command(subcommand)]
        action: oauth::OAuthAction,
    },
    /// List, add, remove or run schedules (`sched.*`).
    #[command(after_help = CONFIG_HELP)]
    Sched {
        #[command(subcommand)]
        action: Box<sched::SchedAction>,
    },
    /// Notify yourself (every socket of yours gets `notification.created`);
    /// prints the notification's id.
    #[command(after_help = CONFIG_HELP)]
    Notify(Box<sched::NotifyArgs>),
    /// List your notifications (id, created, level, state, title), or mark
    /// one read or dismissed.
    #[command(after_help = CONFIG_HELP)]
    Notifications(Box<sched::NotificationsArgs>),
}

/// The largest page a list call returns (`sched.list`, `notification.list`).
const MAX_PAGE: u32 = 500;

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
    let conn = cli.conn;
    match cli.command {
        Command::Serve(a) => serve::serve(a).await,
        Command::Node(a) => serve::node(a, conn.user).await,
        Command::Setup(a) => account::setup(&conn, a).await,
        Command::Login(a) => account::login(&conn, a).await,
        Command::Config { action } => account::config(&conn, action).await,
        Command::Token { action } => account::token(&conn, action).await,
        Command::Call { call, args } => call_once(&conn, &call, args).await,
        Command::Workspace { action } => workspace::run(&conn, action).await,
        Command::Repo { action } => {
            let mut c = conn::connect(&conn).await?;
            let out = repo::run(&mut c, action).await;
            c.close().await;
            out.map(|()| ExitCode::SUCCESS)
        }
        Command::Exec(a) => exec::exec(&conn, a).await,
        Command::Attach(a) => exec::attach(&conn, a).await,
        Command::Chat(a) => chat::chat(&conn, a).await,
        Command::Proc { action } => {
            let mut c = conn::connect(&conn).await?;
            let ok = proc::proc(&mut c, action).await?;
            c.close().await;
            Ok(exit_code(ok))
        }
        Command::Codemode { action } => {
            let mut c = conn::connect(&conn).await?;
            let ok = codemode::codemode(&mut c, *action).await?;
            c.close().await;
            Ok(exit_code(ok))
        }
        Command::Mcp { action } => {
            let mut c = conn::connect(&conn).await?;
            let ok = codemode::mcp(&mut c, *action).await?;
            c.close().await;
            Ok(exit_code(ok))
        }
        Command::Oauth { action } => {
            let mut c = conn::connect(&conn).await?;
            let ok = oauth::oauth(&mut c, action).await?;
            c.close().await;
            Ok(exit_code(ok))
        }
        Command::Watch(a) => watch::watch(&conn, a).await,
        Command::Sched { action } => {
            let mut c = conn::connect(&conn).await?;
            let ok = sched::sched(&mut c, *action).await?;
            c.close().await;
            Ok(exit_code(ok))
        }
        Command::Notify(a) => {
            let mut c = conn::connect(&conn).await?;
            let ok = sched::notify(&mut c, *a).await?;
            c.close().await;
            Ok(exit_code(ok))
        }
        Command::Notifications(a) => {
            let mut c = conn::connect(&conn).await?;
            let ok = sched::notifications(&mut c, *a).await?;
            c.close().await;
            Ok(exit_code(ok))
        }
    }
}

fn exit_code(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `gsv call`: the whole response frame on stdout; success only when both
/// the call and its operation succeeded.
async fn call_once(conn: &ConnArgs, call: &str, args: Option<String>) -> Result<ExitCode> {
    let args: Value = match args {
        Some(s) => serde_json::from_str(&s).context("ARGS must be a JSON object")?,
        None => json!({}),
    };
    // Setup happens before anyone can log in.
    let mut c = if call == "sys.setup" {
        conn::dial(&conn.resolve()?.url).await?
    } else {
        conn::connect(conn).await?
    };
    let res = c.request(call, args).await?;
    out(&format!("{}\n", serde_json::to_string_pretty(&res)?))?;
    c.close().await;
    Ok(if call_succeeded(&res) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// A response frame is a success when the frame is (`ok: true`) and its
/// operation did not fail (`data.ok` is not `false`).
fn call_succeeded(res: &Value) -> bool {
    res["ok"] == true && res["data"]["ok"] != false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_error_inside_an_ok_frame_is_a_failure() {
        assert!(call_succeeded(&json!({"ok": true, "data": {"x": 1}})));
        assert!(call_succeeded(&json!({"ok": true, "data": {"ok": true}})));
        assert!(!call_succeeded(
            &json!({"ok": true, "data": {"ok": false, "error": "no"}})
        ));
        assert!(!call_succeeded(&json!({"ok": false, "error": {}})));
    }

    #[test]
    fn the_connection_flags_are_taken_after_the_subcommand_too() {
        let cli = Cli::try_parse_from(["gsv", "workspace", "list", "--user", "bob"]).unwrap();
        assert_eq!(cli.conn.user.as_deref(), Some("bob"));
        let cli = Cli::try_parse_from(["gsv", "--user", "bob", "workspace", "list"]).unwrap();
        assert_eq!(cli.conn.user.as_deref(), Some("bob"));
    }
}
