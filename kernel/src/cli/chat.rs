//! `gsv chat`: messages to an agent process and its streamed answers.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;
use gsv_kernel::client::GsvClient;
use serde_json::json;

use super::conn::{ConnArgs, connect, explain};

#[derive(Debug, Args)]
pub struct ChatArgs {
    /// The process (`proc:<uuid>`).
    pid: Option<String>,
    /// Send this one message and exit when its run finishes.
    #[arg(short, long)]
    message: Option<String>,
    /// Spawn the new process in a new workspace.
    #[arg(long)]
    workspace: bool,
}

type StdinLines = tokio::io::Lines<tokio::io::BufReader<tokio::io::Stdin>>;

/// What this chat created, removed again if no turn of it succeeded (a
/// chat that never worked leaves nothing behind).
struct Created {
    pid: String,
    workspace: Option<String>,
}

pub async fn chat(conn: &ConnArgs, a: ChatArgs) -> Result<ExitCode> {
    use tokio::io::AsyncBufReadExt;
    let mut c = connect(conn).await?;
    // A model may think for minutes; each frame still has a deadline.
    c.timeout = std::time::Duration::from_secs(600);
    let (pid, mut created) = match a.pid {
        Some(p) => (p, None),
        None => {
            let args = if a.workspace {
                json!({"workspace": {"mode": "new"}})
            } else {
                json!({})
            };
            let d = c.call("proc.spawn", args).await.map_err(explain)?;
            let pid = d["pid"].as_str().unwrap_or_default().to_owned();
            eprintln!("pid {pid} (cwd {})", d["cwd"].as_str().unwrap_or(""));
            let workspace = d["workspaceId"].as_str().map(str::to_owned);
            (pid.clone(), Some(Created { pid, workspace }))
        }
    };
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut ok = true;
    let mut outcome: Result<()> = Ok(());
    if let Some(m) = a.message {
        match chat_turn(&mut c, &pid, &m, &mut stdin).await {
            Ok(turn_ok) => ok = turn_ok,
            Err(e) => outcome = Err(e),
        }
        if ok && outcome.is_ok() {
            created = None;
        }
    } else {
        loop {
            let line = match stdin.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) => {
                    outcome = Err(e.into());
                    break;
                }
            };
            if line.trim().is_empty() {
                continue;
            }
            match chat_turn(&mut c, &pid, &line, &mut stdin).await {
                Ok(true) => {
                    ok = true;
                    created = None;
                }
                Ok(false) => ok = false,
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
    }
    if let Some(created) = created
        && (!ok || outcome.is_err())
    {
        clean_up(&mut c, &created).await;
    }
    c.close().await;
    outcome?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Kills the process and archives the workspace this chat made; says so,
/// and what is left when that fails.
async fn clean_up(c: &mut GsvClient, created: &Created) {
    match c
        .call(
            "proc.kill",
            json!({"pid": created.pid, "archive": false, "remove": true}),
        )
        .await
    {
        Ok(_) => eprintln!("gsv: removed the process {} this chat made", created.pid),
        Err(e) => eprintln!("gsv: could not remove the process {}: {e}", created.pid),
    }
    if let Some(ws) = &created.workspace {
        match c
            .call("sys.workspace.archive", json!({"workspaceId": ws}))
            .await
        {
            Ok(_) => eprintln!("gsv: removed the workspace {ws} this chat made"),
            Err(e) => eprintln!("gsv: could not remove the workspace {ws}: {e}"),
        }
    }
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
