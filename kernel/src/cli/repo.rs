//! `gsv repo list|create|log|show|diff|import`: thin clients of `repo.*`,
//! printed for a person.

use anyhow::{Result, bail};
use clap::Subcommand;
use gsv_kernel::client::GsvClient;
use serde_json::json;

#[derive(Debug, Subcommand)]
pub enum RepoAction {
    /// Print the repositories you can read: repo, kind, rw|ro, public|private.
    List {
        /// Only this owner's.
        #[arg(long)]
        owner: Option<String>,
    },
    /// Create OWNER/NAME with an empty first commit on --ref (default main).
    Create {
        repo: String,
        #[arg(long = "ref")]
        branch: Option<String>,
        #[arg(long)]
        description: Option<String>,
    },
    /// First-parent history, newest first: hash, date, author, subject.
    Log {
        repo: String,
        #[arg(long = "ref")]
        rev: Option<String>,
        /// At most this many (1–100, default 30).
        #[arg(long)]
        limit: Option<u32>,
        #[arg(long)]
        offset: Option<u64>,
    },
    /// Print a file's content, or a directory's entries.
    Show {
        repo: String,
        /// A path inside the repository (default: its root).
        path: Option<String>,
        #[arg(long = "ref")]
        rev: Option<String>,
    },
    /// One commit's changes as a unified diff.
    Diff {
        repo: String,
        commit: String,
        /// Context lines (0–20, default 3).
        #[arg(long)]
        context: Option<u32>,
    },
    /// Fetch an upstream (file:// or git://) into OWNER/NAME's --ref.
    Import {
        repo: String,
        /// `file://…` or `git://…`. (Its own id: the global `--url` is the
        /// kernel's, and clap would merge the two.)
        #[arg(id = "upstream_url", value_name = "URL")]
        url: String,
        #[arg(long = "ref")]
        branch: Option<String>,
        /// The upstream's branch or tag (default: the same as --ref).
        #[arg(long)]
        remote_ref: Option<String>,
    },
}

/// `gsv repo …`: one `repo.*` call, printed for a person.
pub async fn run(c: &mut GsvClient, action: RepoAction) -> Result<()> {
    match action {
        RepoAction::List { owner } => {
            let d = c.call("repo.list", json!({"owner": owner})).await?;
            for r in d["repos"].as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}",
                    r["repo"].as_str().unwrap_or(""),
                    r["kind"].as_str().unwrap_or(""),
                    if r["writable"] == true { "rw" } else { "ro" },
                    if r["public"] == true {
                        "public"
                    } else {
                        "private"
                    },
                );
            }
        }
        RepoAction::Create {
            repo,
            branch,
            description,
        } => {
            let d = c
                .call(
                    "repo.create",
                    json!({"repo": repo, "ref": branch, "description": description}),
                )
                .await?;
            let what = if d["created"] == true {
                "created"
            } else {
                "exists"
            };
            println!(
                "{} {} {what}",
                d["ref"].as_str().unwrap_or(""),
                d["head"].as_str().unwrap_or("")
            );
        }
        RepoAction::Log {
            repo,
            rev,
            limit,
            offset,
        } => {
            let d = c
                .call(
                    "repo.log",
                    json!({"repo": repo, "ref": rev, "limit": limit, "offset": offset}),
                )
                .await?;
            for e in d["entries"].as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}",
                    e["hash"].as_str().unwrap_or(""),
                    e["commitTime"].as_i64().unwrap_or(0),
                    e["author"].as_str().unwrap_or(""),
                    e["message"]
                        .as_str()
                        .unwrap_or("")
                        .lines()
                        .next()
                        .unwrap_or("")
                );
            }
        }
        RepoAction::Show { repo, path, rev } => {
            let d = c
                .call("repo.read", json!({"repo": repo, "path": path, "ref": rev}))
                .await?;
            if d["kind"] == "tree" {
                for e in d["entries"].as_array().into_iter().flatten() {
                    let slash = if e["type"] == "tree" { "/" } else { "" };
                    println!(
                        "{} {}\t{}{slash}",
                        e["mode"].as_str().unwrap_or(""),
                        e["hash"].as_str().unwrap_or(""),
                        e["name"].as_str().unwrap_or("")
                    );
                }
            } else if let Some(text) = d["content"].as_str() {
                print!("{text}");
            } else {
                bail!(
                    "{} is binary ({} bytes)",
                    d["path"].as_str().unwrap_or(""),
                    d["size"]
                );
            }
        }
        RepoAction::Diff {
            repo,
            commit,
            context,
        } => {
            let d = c
                .call(
                    "repo.diff",
                    json!({"repo": repo, "commit": commit, "context": context}),
                )
                .await?;
            for f in d["files"].as_array().into_iter().flatten() {
                let path = f["path"].as_str().unwrap_or("");
                let (old, new) = match f["status"].as_str() {
                    Some("added") => ("/dev/null".to_owned(), format!("b/{path}")),
                    Some("deleted") => (format!("a/{path}"), "/dev/null".to_owned()),
                    _ => (format!("a/{path}"), format!("b/{path}")),
                };
                println!("--- {old}\n+++ {new}");
                for h in f["hunks"].as_array().into_iter().flatten() {
                    println!(
                        "@@ -{},{} +{},{} @@",
                        h["oldStart"], h["oldCount"], h["newStart"], h["newCount"]
                    );
                    for l in h["lines"].as_array().into_iter().flatten() {
                        let mark = match l["tag"].as_str() {
                            Some("add") => "+",
                            Some("delete") => "-",
                            Some("context") => " ",
                            _ => "",
                        };
                        println!("{mark}{}", l["content"].as_str().unwrap_or(""));
                    }
                }
            }
        }
        RepoAction::Import {
            repo,
            url,
            branch,
            remote_ref,
        } => {
            let d = c
                .call(
                    "repo.import",
                    json!({"repo": repo, "remoteUrl": url, "ref": branch, "remoteRef": remote_ref}),
                )
                .await?;
            let what = if d["changed"] == true {
                "updated"
            } else {
                "unchanged"
            };
            println!(
                "{} {} {what}",
                d["ref"].as_str().unwrap_or(""),
                d["head"].as_str().unwrap_or("")
            );
        }
    }
    Ok(())
}
