//! `gsv workspace create|list|rm`, its snapshots (`snapshot`,
//! `snapshots`, `snapshot-rm`, `restore`, `fork`), `recover` from the
//! object store, and `gsv gc`.

use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::conn::{ConnArgs, connect, explain};

#[derive(Debug, Subcommand)]
pub enum WorkspaceAction {
    /// Create a workspace and print its id (`ws_…`).
    Create {
        /// A name to show in `gsv workspace list`.
        #[arg(long)]
        label: Option<String>,
    },
    /// Print your workspaces, one a line: id, state, label (tab-separated).
    List,
    /// Remove a workspace: it is archived (`sys.workspace.archive`), runs
    /// nothing more and its wsd is stopped; `list` shows it `archived`.
    Rm {
        /// The workspace id (`ws_…`).
        workspace: String,
    },
    /// Snapshot a workspace's files and print the snapshot's id (`snap_…`).
    ///
    /// A snapshot is the tree as it stands between commands (one that is
    /// still running is not waited for: what it wrote so far and was
    /// pulled is in). It shares content with the workspace and with the
    /// other snapshots, so a snapshot of an unchanged tree costs next to
    /// nothing: `--json` shows `newBytes`, the bytes no other snapshot
    /// held. A workspace holds 64 snapshots at most.
    #[command(verbatim_doc_comment)]
    Snapshot {
        /// The workspace id (`ws_…`).
        workspace: String,
        /// A name to show in `gsv workspace snapshots`.
        #[arg(long)]
        label: Option<String>,
        /// Print the whole snapshot record as JSON.
        #[arg(long)]
        json: bool,
    },
    /// List a workspace's snapshots, oldest first, one a line: id,
    /// created (UTC), files, bytes, new bytes, label (tab-separated).
    Snapshots {
        /// The workspace id (`ws_…`).
        workspace: String,
        /// Print them as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a snapshot. The content only it held is freed by the next
    /// garbage collection (`gsv gc`, or the kernel's own every 6 hours).
    SnapshotRm {
        /// The snapshot id (`snap_…`).
        snapshot: String,
    },
    /// Put a workspace's files back as they were in a snapshot, and print
    /// what changed.
    ///
    /// Files changed since are rewritten, files made since are deleted,
    /// the rest stays as it is. The next command in the workspace sees
    /// the restored files. Refused while a command runs in the workspace
    /// (wait for it or kill it, then restore again).
    #[command(verbatim_doc_comment)]
    Restore {
        /// The snapshot id (`snap_…`).
        snapshot: String,
    },
    /// Make a new workspace holding a snapshot's files and print its id.
    /// The new workspace and the snapshot's own one are independent from
    /// then on: a change in one is not seen in the other.
    Fork(ForkArgs),
    /// Bring back a workspace this kernel lost (its data directory was
    /// wiped or the machine replaced) from the snapshots kept in the
    /// kernel's object store (`gsv serve --chunk-store s3://...`): the
    /// workspace gets its id, its snapshots, and the files of the newest
    /// one. Its owner (or root) runs it.
    #[command(verbatim_doc_comment)]
    Recover {
        /// The workspace id (`ws_…`).
        workspace: String,
    },
}

#[derive(Debug, Args)]
pub struct ForkArgs {
    /// The snapshot id (`snap_…`).
    snapshot: String,
    /// A name for the new workspace.
    #[arg(long)]
    label: Option<String>,
}

/// An operation the kernel refused inside an ok frame (`{ok:false, code,
/// error}`), as this command's error.
fn refused(d: &Value) -> Result<()> {
    if d["ok"] == false {
        bail!("{}", d["error"].as_str().unwrap_or("refused"));
    }
    Ok(())
}

fn print_json(d: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(d)?);
    Ok(())
}

/// Milliseconds since the epoch as `2026-11-27 14:05:09` (UTC).
fn utc(ms: &Value) -> String {
    ms.as_i64()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_default()
}

pub async fn run(conn: &ConnArgs, action: WorkspaceAction) -> Result<ExitCode> {
    let mut c = connect(conn).await?;
    match action {
        WorkspaceAction::Create { label } => {
            let d = c
                .call("sys.workspace.create", json!({"label": label}))
                .await
                .map_err(explain)?;
            println!("{}", d["workspace"]["workspaceId"].as_str().unwrap_or(""));
        }
        WorkspaceAction::List => {
            let d = c
                .call("sys.workspace.list", json!({}))
                .await
                .map_err(explain)?;
            for w in d["workspaces"].as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}",
                    w["workspaceId"].as_str().unwrap_or(""),
                    w["state"].as_str().unwrap_or(""),
                    w["label"].as_str().unwrap_or("")
                );
            }
        }
        WorkspaceAction::Rm { workspace } => {
            c.call("sys.workspace.archive", json!({"workspaceId": workspace}))
                .await
                .map_err(explain)?;
        }
        WorkspaceAction::Snapshot {
            workspace,
            label,
            json,
        } => {
            let d = c
                .call(
                    "workspace.snapshot.create",
                    json!({"workspaceId": workspace, "label": label}),
                )
                .await
                .map_err(explain)?;
            refused(&d)?;
            if json {
                print_json(&d)?;
            } else {
                println!("{}", d["snapshotId"].as_str().unwrap_or(""));
            }
        }
        WorkspaceAction::Snapshots { workspace, json } => {
            let d = c
                .call("workspace.snapshot.list", json!({"workspaceId": workspace}))
                .await
                .map_err(explain)?;
            if json {
                print_json(&d["snapshots"])?;
            } else {
                let mut text = String::new();
                for s in d["snapshots"].as_array().into_iter().flatten() {
                    text.push_str(&format!(
                        "{}\t{}\t{}\t{}\t{}\t{}\n",
                        s["snapshotId"].as_str().unwrap_or(""),
                        utc(&s["createdAt"]),
                        s["files"],
                        s["bytes"],
                        s["newBytes"],
                        s["label"].as_str().unwrap_or("")
                    ));
                }
                super::out(&text)?;
            }
        }
        WorkspaceAction::SnapshotRm { snapshot } => {
            let d = c
                .call("workspace.snapshot.delete", json!({"snapshotId": snapshot}))
                .await
                .map_err(explain)?;
            refused(&d)?;
        }
        WorkspaceAction::Restore { snapshot } => {
            let d = c
                .call(
                    "workspace.snapshot.restore",
                    json!({"snapshotId": snapshot}),
                )
                .await
                .map_err(explain)?;
            refused(&d)?;
            println!(
                "restored {snapshot}: {} changed, {} removed (rev {})",
                d["changed"], d["removed"], d["rev"]
            );
        }
        WorkspaceAction::Recover { workspace } => {
            let d = c
                .call("workspace.recover", json!({"workspaceId": workspace}))
                .await
                .map_err(explain)?;
            refused(&d)?;
            println!(
                "recovered {workspace}: {} snapshots, files from {} (rev {})",
                d["snapshots"], d["restoredFrom"], d["rev"]
            );
        }
        WorkspaceAction::Fork(a) => {
            let d = c
                .call(
                    "sys.workspace.create",
                    json!({"label": a.label, "fromSnapshot": a.snapshot}),
                )
                .await
                .map_err(explain)?;
            println!("{}", d["workspace"]["workspaceId"].as_str().unwrap_or(""));
        }
    }
    c.close().await;
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

/// `gsv gc` (`sys.gc`, root only).
pub async fn gc(conn: &ConnArgs, a: GcArgs) -> Result<ExitCode> {
    let mut c = connect(conn).await?;
    let d = c.call("sys.gc", json!({})).await.map_err(explain)?;
    c.close().await;
    if a.json {
        print_json(&d)?;
    } else {
        println!(
            "freed {} chunks and {} file lists in {} workspaces",
            d["chunks"], d["manifests"], d["workspaces"]
        );
        if d["storeChunks"].as_u64().unwrap_or(0) > 0 {
            println!(
                "freed {} chunks ({} bytes) in the object store, rewriting {} packs",
                d["storeChunks"], d["storeBytes"], d["storeRepacked"]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
