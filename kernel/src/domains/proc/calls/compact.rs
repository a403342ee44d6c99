//! Compaction: a conversation's prefix archived as gzip JSONL, replaced
//! by a visible summary marker and recorded as a segment. Both
//! `proc.conversation.compact` and the run preflight's `auto-compact`
//! come here.

use std::sync::Arc;

use gsv_protocol::proc::{CompactResult, ConversationSegment};
use serde_json::{Value, json};

use super::archive::{sessions_dir, write_archive};
use crate::db::now_ms;
use crate::domains::proc::conversations::{self, SegmentRow};
use crate::domains::proc::provider;
use crate::domains::proc::store::{self, ProcRow};
use crate::domains::{accounts, ai};
use crate::error::KernelError;
use crate::kernel::Kernel;

/// Which prefix a compaction archives.
#[derive(Debug, Clone, Copy)]
pub enum Selector {
    /// All but the last n messages.
    KeepLast(usize),
    /// Every message with an id up to this one.
    Through(i64),
}

/// Where a compaction's summary comes from.
#[derive(Debug, Clone)]
pub enum SummaryKind {
    Given(String),
    /// A model call writes it.
    Generate,
}

/// Compacts the prefix `selector` names: archives it as gzip JSONL, puts
/// a visible system summary marker at the boundary (it takes the id of
/// the last archived message, so it sorts there) and records a segment.
/// `None` when the prefix is empty. A kept part never starts with tool
/// results: the boundary moves past them, so no result loses its call.
pub async fn compact_now(
    k: &Arc<Kernel>,
    row: &ProcRow,
    conv: &str,
    selector: Selector,
    kind: SummaryKind,
) -> Result<Option<CompactResult>, KernelError> {
    let (p, cv) = (row.pid.clone(), conv.to_owned());
    let all = k.db.call(move |c| store::messages(c, &p, &cv)).await?;
    let id_of = |m: &Value| m["id"].as_i64().unwrap_or_default();
    let mut cut = match selector {
        Selector::KeepLast(n) => all.len().saturating_sub(n),
        Selector::Through(id) => {
            if !all.iter().any(|m| id_of(m) == id) {
                return Err(KernelError::invalid_args(
                    "proc.conversation.compact",
                    format!("throughMessageId: no message {id} in conversation {conv}"),
                ));
            }
            all.iter().take_while(|m| id_of(m) <= id).count()
        }
    };
    while cut < all.len() && all[cut]["role"] == "toolResult" {
        cut += 1;
    }
    if cut == 0 {
        return Ok(None);
    }
    let prefix = &all[..cut];
    let summary = match kind {
        SummaryKind::Given(t) => t,
        SummaryKind::Generate => generate_summary(k, row, prefix).await?,
    };
    let (from, to) = (id_of(&prefix[0]), id_of(&prefix[cut - 1]));
    let live_through = all.last().map_or(to, id_of);
    let segment_id = format!("seg_{}", accounts::random_hex(8));
    let dir = format!("{}/conversations/{conv}", sessions_dir(row));
    let archived: Vec<Value> = prefix.to_vec();
    let path = write_archive(k, &dir, &format!("{segment_id}.jsonl.gz"), &archived).await?;
    let (p, cv, seg_path) = (row.pid.clone(), conv.to_owned(), path.clone());
    let marker = json!({
        "role": "system",
        "content": format!(
            "[Conversation summary: messages {from}..{to} were compacted and archived at {path}]\n{summary}"
        ),
        "kind": "compaction.summary",
        "segmentId": segment_id,
    });
    let segment =
        k.db.call(move |c| {
            let tx = c.transaction()?;
            let generation = conversations::get(&tx, &p, &cv)?.map_or(0, |c| c.generation);
            store::delete_messages_through(&tx, &p, &cv, to)?;
            store::insert_message_at(&tx, to, &p, &cv, &marker)?;
            let seg = SegmentRow {
                segment: ConversationSegment {
                    id: segment_id,
                    conversation_id: cv.clone(),
                    generation,
                    kind: "compaction".into(),
                    from_message_id: from,
                    to_message_id: to,
                    archive_path: seg_path,
                    summary_message_id: Some(to),
                    created_at: now_ms(),
                },
                live_through_id: live_through,
            };
            conversations::insert_segment(&tx, &p, &seg)?;
            conversations::clear_context(&tx, &p, &cv)?;
            tx.commit()?;
            Ok(seg.segment)
        })
        .await?;
    Ok(Some(CompactResult {
        pid: row.pid.clone(),
        conversation_id: conv.to_owned(),
        summary_message_id: to,
        archived_messages: cut,
        archived_to: path,
        segment,
    }))
}

/// Asks the process's model for a summary of `prefix` (no tools).
async fn generate_summary(
    k: &Arc<Kernel>,
    row: &ProcRow,
    prefix: &[Value],
) -> Result<String, KernelError> {
    let cfg = ai::calls::provider_config(k, row)
        .await
        .map_err(KernelError::Unavailable)?;
    let transcript: Vec<String> = prefix
        .iter()
        .map(|m| {
            let content = m["content"]
                .as_str()
                .map_or_else(|| m["content"].to_string(), str::to_owned);
            format!("{}: {content}", m["role"].as_str().unwrap_or("?"))
        })
        .collect();
    let messages = [
        json!({"role": "system", "content": SUMMARY_PROMPT}),
        json!({"role": "user", "content": transcript.join("\n\n")}),
    ];
    let done = provider::complete(k.procs.http(), &cfg, &messages, &[], |_| {})
        .await
        .map_err(|e| KernelError::Unavailable(format!("writing the summary: {e}")))?;
    let text = done.text.trim().to_owned();
    if text.is_empty() {
        return Err(KernelError::Unavailable(
            "writing the summary: the model answered with no text".into(),
        ));
    }
    Ok(text)
}

/// The instruction of a compaction's summary call.
pub const SUMMARY_PROMPT: &str = "You compact an agent's conversation. Summarize the \
transcript that follows so the agent can continue without it: the user's goals, decisions \
made, facts learned, files and commands involved, and open tasks. Answer with the summary only.";
