//! `gsv proc conversations|compact|fork`: thin clients of
//! `proc.conversation.*`. Without `--pid` they act on your home process
//! (`init:{uid}`). Tables are tab-separated lines; `--json` prints the
//! call's data instead.

use anyhow::{Result, bail};
use clap::Subcommand;
use gsv_kernel::client::GsvClient;
use serde_json::{Map, Value, json};

#[derive(Debug, Subcommand)]
pub enum ProcAction {
    /// List a process's conversations: id, status, generation, messages,
    /// title (tab-separated).
    Conversations {
        #[arg(long)]
        pid: Option<String>,
        /// Closed ones too.
        #[arg(long)]
        all: bool,
        #[arg(long)]
        json: bool,
    },
    /// Compact a conversation: archive its older messages behind a summary
    /// (yours with --summary, else written by the model). Prints the
    /// segment id, archived messages and the archive's path.
    Compact {
        #[arg(long)]
        pid: Option<String>,
        /// The conversation (default `default`).
        #[arg(long)]
        conversation: Option<String>,
        /// Keep the last N messages live (default 20 unless --through).
        #[arg(long, conflicts_with = "through")]
        keep_last: Option<u64>,
        /// Archive every message up to this id.
        #[arg(long)]
        through: Option<i64>,
        #[arg(long)]
        summary: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Fork a conversation into a new one: up to message --through, or a
    /// compacted --segment restored. Prints the new conversation's id.
    Fork {
        #[arg(long)]
        pid: Option<String>,
        #[arg(long)]
        conversation: Option<String>,
        #[arg(long, conflicts_with = "through")]
        segment: Option<String>,
        #[arg(long)]
        through: Option<i64>,
        /// The new conversation's id (generated when absent).
        #[arg(long)]
        to: Option<String>,
        #[arg(long)]
        title: Option<String>,
        /// With --segment: leave out what was live after it.
        #[arg(long, requires = "segment")]
        no_live_suffix: bool,
        #[arg(long)]
        json: bool,
    },
}

/// The default `--keep-last` of `gsv proc compact`.
const DEFAULT_KEEP_LAST: u64 = 20;

fn args(pairs: &[(&str, Value)]) -> Value {
    let mut m = Map::new();
    for (k, v) in pairs {
        if !v.is_null() {
            m.insert((*k).to_owned(), v.clone());
        }
    }
    Value::Object(m)
}

fn print_json(v: &Value) -> Result<()> {
    super::out(&format!("{}\n", serde_json::to_string_pretty(v)?))
}

pub async fn proc(c: &mut GsvClient, action: ProcAction) -> Result<bool> {
    match action {
        ProcAction::Conversations { pid, all, json } => {
            let d = c
                .call(
                    "proc.conversation.list",
                    args(&[("pid", json!(pid)), ("includeClosed", json!(all))]),
                )
                .await?;
            if json {
                return print_json(&d).map(|()| true);
            }
            let mut text = String::new();
            for v in d["conversations"].as_array().into_iter().flatten() {
                text.push_str(&format!(
                    "{}\t{}\t{}\t{}\t{}\n",
                    v["id"].as_str().unwrap_or(""),
                    v["status"].as_str().unwrap_or(""),
                    v["generation"],
                    v["messageCount"],
                    v["title"].as_str().unwrap_or("")
                ));
            }
            super::out(&text)?;
            Ok(true)
        }
        ProcAction::Compact {
            pid,
            conversation,
            keep_last,
            through,
            summary,
            json,
        } => {
            let keep_last = match (keep_last, through) {
                (None, None) => Some(DEFAULT_KEEP_LAST),
                (k, _) => k,
            };
            let d = c
                .call(
                    "proc.conversation.compact",
                    args(&[
                        ("pid", json!(pid)),
                        ("conversationId", json!(conversation)),
                        ("keepLast", json!(keep_last)),
                        ("throughMessageId", json!(through)),
                        ("generateSummary", json!(summary.is_none().then_some(true))),
                        ("summary", json!(summary)),
                    ]),
                )
                .await?;
            if json {
                return print_json(&d).map(|()| true);
            }
            super::out(&format!(
                "{}\t{}\t{}\n",
                d["segment"]["id"].as_str().unwrap_or(""),
                d["archivedMessages"],
                d["archivedTo"].as_str().unwrap_or("")
            ))?;
            Ok(true)
        }
        ProcAction::Fork {
            pid,
            conversation,
            segment,
            through,
            to,
            title,
            no_live_suffix,
            json,
        } => {
            if segment.is_none() && through.is_none() {
                bail!("say what to fork: --segment ID or --through MESSAGE_ID");
            }
            let d = c
                .call(
                    "proc.conversation.fork",
                    args(&[
                        ("pid", json!(pid)),
                        ("conversationId", json!(conversation)),
                        ("segmentId", json!(segment)),
                        ("throughMessageId", json!(through)),
                        ("targetConversationId", json!(to)),
                        ("title", json!(title)),
                        ("includeLiveSuffix", json!(no_live_suffix.then_some(false))),
                    ]),
                )
                .await?;
            if json {
                return print_json(&d).map(|()| true);
            }
            super::out(&format!(
                "{}\t{}\n",
                d["targetConversation"]["id"].as_str().unwrap_or(""),
                d["restoredMessages"]
            ))?;
            Ok(true)
        }
    }
}
