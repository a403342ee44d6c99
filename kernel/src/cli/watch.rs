//! `gsv watch`: a workspace's changes as they happen (`fs.watch`), one line
//! per changed path, and on exit the cursor to resume from.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::Args;
use gsv_kernel::client::ClientError;
use serde_json::json;
use tokio::signal::unix::{SignalKind, signal};

use super::conn::{self, ConnArgs};
use super::out;

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// The workspace id.
    workspace: String,
    /// A directory or file inside it (default: its root), relative to the
    /// workspace root or an absolute `/workspaces/<id>/…` path.
    path: Option<String>,
    /// Replay every change after this cursor first (default: from now).
    #[arg(long)]
    after: Option<String>,
    /// Print each `fs.changed` batch as one JSON line instead.
    #[arg(long)]
    json: bool,
    /// Exit after this many changes.
    #[arg(long)]
    count: Option<usize>,
}

/// Follows `fs.changed` until `--count` changes or Ctrl-C / SIGTERM,
/// resuming by itself after `fs.watch.lagged`; prints the cursor to resume
/// from last. An expired cursor exits 2.
pub async fn watch(conn: &ConnArgs, a: WatchArgs) -> Result<ExitCode> {
    let path = match a.path {
        Some(p) if p.starts_with('/') => p,
        Some(p) => format!("/workspaces/{}/{p}", a.workspace),
        None => format!("/workspaces/{}", a.workspace),
    };
    let mut c = conn::connect(conn).await?;
    let mut term = signal(SignalKind::terminate())?;
    let mut after = a.after;
    let mut seen = 0usize;
    loop {
        let d = c
            .call("fs.watch", json!({"path": path, "after": after}))
            .await?;
        if d["ok"] != true {
            if d["resync"] == true {
                eprintln!(
                    "gsv watch: {}",
                    d["error"]["message"].as_str().unwrap_or("cursor expired")
                );
                return Ok(ExitCode::from(2));
            }
            bail!(
                "fs.watch {path}: {}",
                d["error"].as_str().unwrap_or("failed")
            );
        }
        let watch_id = d["watchId"].clone();
        let mut cursor = d["cursor"].as_str().unwrap_or_default().to_owned();
        let lagged = loop {
            if a.count.is_some_and(|n| seen >= n) {
                break false;
            }
            let f = tokio::select! {
                _ = tokio::signal::ctrl_c() => break false,
                _ = term.recv() => break false,
                f = c.recv() => match f {
                    // A quiet workspace is not an error.
                    Err(ClientError::Timeout(_)) => continue,
                    other => other?,
                },
            };
            let p = &f["payload"];
            if f["type"] != "sig" || p["watchId"] != watch_id {
                continue;
            }
            cursor = p["cursor"].as_str().unwrap_or_default().to_owned();
            match f["signal"].as_str() {
                Some("fs.changed") => {
                    let changes = p["changes"].as_array().cloned().unwrap_or_default();
                    seen += changes.len();
                    if a.json {
                        out(&format!("{p}\n"))?;
                    } else {
                        for ch in changes {
                            let size = ch["size"]
                                .as_u64()
                                .map(|s| format!("\t{s}"))
                                .unwrap_or_default();
                            out(&format!(
                                "{}\t{}{size}\n",
                                ch["type"].as_str().unwrap_or(""),
                                ch["path"].as_str().unwrap_or("")
                            ))?;
                        }
                    }
                }
                Some("fs.watch.lagged") => break true,
                _ => {}
            }
        };
        if lagged {
            after = Some(cursor);
            continue;
        }
        if a.json {
            out(&format!("{}\n", json!({"cursor": cursor})))?;
        } else {
            out(&format!("cursor\t{cursor}\n"))?;
        }
        c.close().await;
        return Ok(ExitCode::SUCCESS);
    }
}
