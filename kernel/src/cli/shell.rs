//! `gsv shell` (and `gsv exec -t`): an interactive terminal in a workspace
//! (`shell.pty.*`), like `docker exec -it`. With a terminal on stdin it is
//! put in raw mode (restored on every way out), the window size follows
//! SIGWINCH, and Ctrl-] detaches (the terminal keeps running; the line
//! printed says how to come back). A lost connection or a
//! `shell.pty.lagged` re-attaches from the last output offset, so nothing
//! is printed twice or missed. The program's exit code is ours.

use std::io::{Read as _, Write as _};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use clap::Args;
use gsv_kernel::client::{ClientError, GsvClient};
use serde_json::{Value, json};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use super::conn::{ConnArgs, connect_resolved, explain};

/// The detach key: Ctrl-] (as telnet's escape).
const DETACH_KEY: u8 = 0x1d;
/// Re-attaches in a row after lost connections before giving up.
const MAX_RECONNECTS: u32 = 10;
/// Our exit code when the program's end is unknown.
const EXIT_LOST: u8 = 255;
/// Most stdin bytes one `shell.pty.input` carries (the kernel's limit).
const INPUT_CHUNK: usize = gsv_protocol::pty::MAX_INPUT_BYTES;

#[derive(Debug, Args)]
pub struct ShellArgs {
    /// The workspace id (`ws_…`); not needed with `--attach`.
    #[arg(required_unless_present = "attach")]
    workspace: Option<String>,
    /// Working directory, relative to the workspace root (or an absolute
    /// `/workspaces/<id>/…` path).
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,
    /// Extra environment for the program (repeatable).
    #[arg(short = 'e', long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Re-attach to a running terminal (the id a detach printed).
    #[arg(long, value_name = "PTY_ID", conflicts_with_all = ["workspace", "cwd", "env", "command"])]
    attach: Option<String>,
    /// With `--attach`: the output offset to resume after (a detach
    /// prints it; default 0, the whole retained output).
    #[arg(long, requires = "attach", value_name = "OFFSET")]
    after: Option<u64>,
    /// The program and its arguments after `--` (default: `/bin/sh`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not K=V")),
    }
}

/// What `gsv exec -t` hands over: the same as `gsv shell` with a command.
pub struct TerminalCommand {
    pub workspace: String,
    pub cwd: Option<String>,
    pub env: Vec<(String, String)>,
    pub argv: Vec<String>,
}

pub async fn shell(conn: &ConnArgs, a: ShellArgs) -> Result<ExitCode> {
    let target = match (a.attach, a.workspace) {
        (Some(pty_id), _) => Target::Attach {
            pty_id,
            after: a.after.unwrap_or(0),
        },
        (None, Some(workspace)) => Target::Open(TerminalCommand {
            workspace,
            cwd: a.cwd,
            env: a.env,
            argv: a.command,
        }),
        (None, None) => bail!("give a workspace id or --attach PTY_ID"),
    };
    run(conn, target).await
}

/// `gsv exec -t`: the command on a terminal.
pub async fn exec_tty(conn: &ConnArgs, cmd: TerminalCommand) -> Result<ExitCode> {
    run(conn, Target::Open(cmd)).await
}

enum Target {
    Open(TerminalCommand),
    Attach { pty_id: String, after: u64 },
}

/// Raw mode while it lives, when stdin is a terminal.
struct RawMode(bool);

impl RawMode {
    fn enter() -> Result<RawMode> {
        if !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            return Ok(RawMode(false));
        }
        crossterm::terminal::enable_raw_mode().context("putting the terminal in raw mode")?;
        Ok(RawMode(true))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if self.0 {
            let _ = crossterm::terminal::disable_raw_mode();
        }
    }
}

/// Our window size, or 80x24 without a terminal.
fn window_size() -> (u16, u16) {
    crossterm::terminal::size().unwrap_or((
        gsv_protocol::pty::DEFAULT_COLS,
        gsv_protocol::pty::DEFAULT_ROWS,
    ))
}

/// Stdin read on a thread of its own (reads block), in chunks as they
/// come; the channel closes at end of file.
fn forward_stdin() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; INPUT_CHUNK];
        let mut stdin = std::io::stdin().lock();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

/// How following the terminal ended.
enum End {
    Exited(i32),
    Detached,
    /// The attachment lagged: attach again on the same connection.
    Lagged,
    /// The connection broke: dial again, then attach.
    Lost,
}

async fn run(conn: &ConnArgs, target: Target) -> Result<ExitCode> {
    let login = conn.resolve()?;
    let mut c = connect_resolved(&login).await?;
    let (cols, rows) = window_size();
    let (pty_id, mut offset, mut attached) = match target {
        Target::Attach { pty_id, after } => (pty_id, after, false),
        Target::Open(cmd) => {
            let env: serde_json::Map<String, Value> =
                cmd.env.into_iter().map(|(k, v)| (k, json!(v))).collect();
            let mut args = json!({"cols": cols, "rows": rows, "env": env});
            match cmd.cwd {
                Some(d) if d.starts_with('/') => args["cwd"] = json!(d),
                Some(d) => args["cwd"] = json!(format!("/workspaces/{}/{d}", cmd.workspace)),
                None => args["workspaceId"] = json!(cmd.workspace),
            }
            if !cmd.argv.is_empty() {
                args["command"] = json!(cmd.argv);
            }
            let d = c.call("shell.pty.open", args).await.map_err(explain)?;
            if d["ok"] != true {
                bail!(
                    "shell.pty.open: {}",
                    d["error"].as_str().unwrap_or("failed")
                );
            }
            // Opening attached this connection from offset 0.
            let id = d["ptyId"].as_str().unwrap_or_default().to_owned();
            (id, 0, true)
        }
    };
    let raw = RawMode::enter()?;
    let mut stdin = Some(forward_stdin());
    let mut winch = signal(SignalKind::window_change()).context("listening for SIGWINCH")?;
    let mut reconnects = 0u32;
    let mut typing = Typing::default();
    let end = loop {
        if !attached {
            match attach(&mut c, &pty_id, offset).await {
                Ok(()) => reconnects = 0,
                Err(e) => break Err(e),
            }
        }
        match follow(
            &mut c,
            &pty_id,
            &mut offset,
            &mut stdin,
            &mut winch,
            &mut typing,
        )
        .await
        {
            Ok(End::Lagged) => attached = false,
            Ok(End::Lost) => {
                attached = false;
                loop {
                    reconnects += 1;
                    if reconnects > MAX_RECONNECTS {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200 * u64::from(reconnects))).await;
                    if let Ok(fresh) = connect_resolved(&login).await {
                        c = fresh;
                        break;
                    }
                }
                if reconnects > MAX_RECONNECTS {
                    break Err(anyhow::anyhow!(
                        "lost the kernel; resume with gsv shell --attach {pty_id} --after {offset}"
                    ));
                }
            }
            other => break other,
        }
    };
    drop(raw);
    match end {
        Ok(End::Exited(code)) => {
            c.close().await;
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(EXIT_LOST)))
        }
        Ok(End::Detached) => {
            c.close().await;
            eprintln!("\r\n[detached: gsv shell --attach {pty_id} --after {offset}]");
            Ok(ExitCode::SUCCESS)
        }
        Ok(End::Lagged | End::Lost) => unreachable!("re-attaching is handled in the loop"),
        Err(e) => Err(e),
    }
}

async fn attach(c: &mut GsvClient, pty_id: &str, after: u64) -> Result<()> {
    let d = c
        .call("shell.pty.attach", json!({"ptyId": pty_id, "after": after}))
        .await
        .map_err(explain)?;
    if d["ok"] != true {
        bail!(
            "shell.pty.attach {pty_id}: {}",
            d["error"].as_str().unwrap_or("failed")
        );
    }
    Ok(())
}

/// Typed input on its way: one `shell.pty.input` at a time, since the
/// kernel runs a connection's requests concurrently and only waiting for
/// each answer keeps keystrokes in order. What is typed meanwhile queues.
#[derive(Default)]
struct Typing {
    in_flight: Option<String>,
    queued: Vec<u8>,
    /// The detach key came: leave once everything before it is delivered.
    detaching: bool,
}

impl Typing {
    /// Sends the queue if nothing is in flight; false if the socket broke.
    async fn flush(&mut self, c: &mut GsvClient, pty_id: &str) -> bool {
        if self.in_flight.is_some() || self.queued.is_empty() {
            return true;
        }
        let bytes = std::mem::take(&mut self.queued);
        let mut sent = 0;
        // The first chunk now; the rest stays queued.
        let chunk = &bytes[..bytes.len().min(INPUT_CHUNK)];
        let id = c.fresh_id();
        let args = json!({"ptyId": pty_id, "dataBase64": STANDARD.encode(chunk)});
        if c.send_request(&id, "shell.pty.input", args).await.is_err() {
            return false;
        }
        sent += chunk.len();
        self.queued = bytes[sent..].to_vec();
        self.in_flight = Some(id);
        true
    }

    fn done(&self) -> bool {
        self.detaching && self.in_flight.is_none() && self.queued.is_empty()
    }
}

/// Prints the terminal's output and forwards stdin and window changes
/// until it exits, we detach, or the attachment must be made again.
async fn follow(
    c: &mut GsvClient,
    pty_id: &str,
    offset: &mut u64,
    stdin: &mut Option<mpsc::Receiver<Vec<u8>>>,
    winch: &mut tokio::signal::unix::Signal,
    typing: &mut Typing,
) -> Result<End> {
    // After a lost connection an input's fate is unknown: not sent again.
    typing.in_flight = None;
    loop {
        if !typing.flush(c, pty_id).await {
            return Ok(End::Lost);
        }
        if typing.done() {
            return Ok(End::Detached);
        }
        tokio::select! {
            bytes = recv_opt(stdin), if !typing.detaching => match bytes {
                None => *stdin = None,
                Some(bytes) => match bytes.iter().position(|b| *b == DETACH_KEY) {
                    Some(i) => {
                        typing.queued.extend_from_slice(&bytes[..i]);
                        typing.detaching = true;
                    }
                    None => typing.queued.extend_from_slice(&bytes),
                },
            },
            _ = winch.recv() => {
                let (cols, rows) = window_size();
                let id = c.fresh_id();
                let args = json!({"ptyId": pty_id, "cols": cols, "rows": rows});
                if c.send_request(&id, "shell.pty.resize", args).await.is_err() {
                    return Ok(End::Lost);
                }
            }
            f = c.recv() => {
                let f = match f {
                    Ok(f) => f,
                    // A quiet terminal is not an error.
                    Err(ClientError::Timeout(_)) => continue,
                    Err(_) => return Ok(End::Lost),
                };
                if f["type"] == "res" {
                    if typing.in_flight.as_deref() == f["id"].as_str() {
                        typing.in_flight = None;
                    }
                    // Say why an input or a resize failed.
                    if f["ok"] == true && f["data"]["ok"] == false {
                        eprint!("\r\ngsv shell: {}\r\n", f["data"]["error"].as_str().unwrap_or("a call failed"));
                    }
                    continue;
                }
                let p = &f["payload"];
                if f["type"] != "sig" || p["ptyId"] != pty_id {
                    continue;
                }
                match f["signal"].as_str() {
                    Some("shell.pty.output") => {
                        let at = p["offset"].as_u64().unwrap_or(*offset);
                        let bytes = STANDARD
                            .decode(p["dataBase64"].as_str().unwrap_or_default())
                            .context("shell.pty.output carried bad base64")?;
                        // Output we already printed (before a re-attach) is skipped.
                        let skip = offset.saturating_sub(at).min(bytes.len() as u64) as usize;
                        let mut o = std::io::stdout().lock();
                        o.write_all(&bytes[skip..]).and_then(|()| o.flush()).context("writing to stdout")?;
                        *offset = (*offset).max(at + bytes.len() as u64);
                    }
                    Some("shell.pty.exit") => {
                        return Ok(End::Exited(p["exitCode"].as_i64().unwrap_or(-1) as i32));
                    }
                    Some("shell.pty.lagged") => return Ok(End::Lagged),
                    _ => {}
                }
            }
        }
    }
}

async fn recv_opt(rx: &mut Option<mpsc::Receiver<Vec<u8>>>) -> Option<Vec<u8>> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
