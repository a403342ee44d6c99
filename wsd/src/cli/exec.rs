//! `wsd exec`, `attach` and `kill`: the shell half from the command line.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::Args;
use wsd::rpc::client::{self, Client, ExecStream};
use wsd::rpc::{ExecEventKind, ExecRequest, ExecSignal, ResumeFrom};

use super::RemoteArgs;

/// The peer name exec clients present (exec state is not per peer).
const EXEC_PEER: &str = "wsd-cli";

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// Working directory, relative to the workspace root.
    #[arg(long, value_name = "PATH")]
    cwd: Option<String>,
    /// Extra environment for the command (repeatable).
    #[arg(long = "env", value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// The exec id (default: a fresh one). A live id is refused.
    #[arg(long)]
    id: Option<String>,
    /// Kill the command after this many milliseconds.
    #[arg(long, value_name = "MS")]
    timeout: Option<u64>,
    /// Print the id and return; the command keeps running (`wsd attach`).
    #[arg(long)]
    detach: bool,
    /// The command; its words are joined with spaces and run by `/bin/sh -c`.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The exec id.
    id: String,
    /// Only events after this seq.
    #[arg(long, value_name = "N", conflicts_with = "tail")]
    after: Option<u64>,
    /// Only events from now on.
    #[arg(long)]
    tail: bool,
}

#[derive(Debug, Args)]
pub struct KillArgs {
    #[command(flatten)]
    remote: RemoteArgs,
    /// The exec id.
    id: String,
    /// TERM, KILL, INT or HUP.
    #[arg(long, default_value = "TERM", value_parser = parse_signal)]
    signal: ExecSignal,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("{s:?} is not K=V")),
    }
}

fn parse_signal(s: &str) -> Result<ExecSignal, String> {
    match s.trim_start_matches("SIG").to_ascii_uppercase().as_str() {
        "TERM" | "15" => Ok(ExecSignal::Term),
        "KILL" | "9" => Ok(ExecSignal::Kill),
        "INT" | "2" => Ok(ExecSignal::Int),
        "HUP" | "1" => Ok(ExecSignal::Hup),
        _ => Err(format!("unsupported signal {s:?} (TERM, KILL, INT or HUP)")),
    }
}

async fn connect(r: &RemoteArgs) -> Result<Client> {
    client::connect(&r.remote, r.token()?, EXEC_PEER)
        .await
        .with_context(|| format!("connecting to {}", r.remote))
}

/// The process exit code for a command's exit status: 0–255 as is, anything
/// else (a lost exec, a negative status) as 255.
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(255))
}

/// Copies events to stdout/stderr until the exit event. Ctrl-C sends TERM
/// to the remote command once and keeps streaming until it exits. A lost
/// connection re-attaches after the last seq seen.
async fn stream(
    remote: &RemoteArgs,
    mut client: Client,
    mut events: ExecStream,
) -> Result<ExitCode> {
    let id = events.id().to_owned();
    let mut last_seq = 0u64;
    let mut interrupted = false;
    let mut reattached = false;
    loop {
        let next = tokio::select! {
            n = events.next() => n,
            _ = tokio::signal::ctrl_c(), if !interrupted => {
                interrupted = true;
                eprintln!("wsd: interrupted; sending TERM to {id}");
                client.kill_exec(&id, ExecSignal::Term).await.with_context(|| format!("killing {id}"))?;
                continue;
            }
        };
        match next {
            Ok(Some(e)) => {
                last_seq = e.seq;
                match e.kind {
                    ExecEventKind::Stdout(b) => {
                        let mut out = std::io::stdout().lock();
                        out.write_all(&b)?;
                        out.flush()?;
                    }
                    ExecEventKind::Stderr(b) => std::io::stderr().lock().write_all(&b)?,
                    ExecEventKind::Exit(code) => return Ok(exit_code(code)),
                }
            }
            Ok(None) => bail!("{id}: the event stream ended without an exit event"),
            Err(e) if e.is_retryable() && !reattached => {
                tracing::warn!(error = %e, "connection lost; re-attaching to {id} after seq {last_seq}");
                reattached = true;
                client = connect(remote).await?;
                events = client.get_exec(&id, ResumeFrom::After(last_seq)).await?;
            }
            Err(e) => return Err(e).with_context(|| format!("{id}: streaming events")),
        }
    }
}

pub async fn exec(a: ExecArgs) -> Result<ExitCode> {
    let client = connect(&a.remote).await?;
    let request = ExecRequest {
        command: a.command.join(" "),
        cwd: a.cwd,
        id: a.id,
        env: a.env,
        stdin: None,
        timeout_ms: a.timeout,
    };
    let events = client.exec(&request).await.context("exec")?;
    if a.detach {
        println!("{}", events.id());
        return Ok(ExitCode::SUCCESS);
    }
    stream(&a.remote, client, events).await
}

pub async fn attach(a: AttachArgs) -> Result<ExitCode> {
    let client = connect(&a.remote).await?;
    let from = match (a.after, a.tail) {
        (_, true) => ResumeFrom::Tail,
        (Some(n), false) => ResumeFrom::After(n),
        (None, false) => ResumeFrom::Start,
    };
    let events = client
        .get_exec(&a.id, from)
        .await
        .with_context(|| format!("attaching to {}", a.id))?;
    stream(&a.remote, client, events).await
}

pub async fn kill(a: KillArgs) -> Result<ExitCode> {
    let client = connect(&a.remote).await?;
    client
        .kill_exec(&a.id, a.signal)
        .await
        .with_context(|| format!("killing {}", a.id))?;
    Ok(ExitCode::SUCCESS)
}
