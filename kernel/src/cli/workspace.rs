//! `gsv workspace create|list|rm`.

use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use serde_json::json;

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
    }
    c.close().await;
    Ok(ExitCode::SUCCESS)
}
