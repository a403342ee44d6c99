//! `proc.conversation.*` (seed 000): named conversations inside a process,
//! their overflow policy, compaction into gzip JSONL archives recorded as
//! segments, forks and segment reads. Compaction itself is
//! [`super::compact`], which the run preflight's `auto-compact` uses too.

use std::sync::Arc;

use gsv_protocol::OpResult;
use gsv_protocol::proc::{
    CompactArgs, CompactResult, ContextPolicy, ConversationArgs, ConversationCloseArgs,
    ConversationCloseResult, ConversationGetResult, ConversationListArgs, ConversationListResult,
    ConversationOpenArgs, ConversationOpenResult, ConversationResetArgs, ConversationResetResult,
    ForkArgs, ForkResult, PolicyResult, PolicySetArgs, SegmentReadArgs, SegmentReadResult,
    SegmentsResult,
};
use serde_json::{Value, json};

use super::archive::{read_archive, sessions_dir, write_archive};
use super::compact::{Selector, SummaryKind, compact_now};
use super::signal::emit;
use super::target;
use crate::db::now_ms;
use crate::domains::accounts;
use crate::domains::proc::conversations::{
    self, DEFAULT, SegmentRow, conversation_arg, page_limit,
};
use crate::domains::proc::store::{self, ProcRow};
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// Refuses changes to a conversation with an active run.
fn ensure_idle(k: &Kernel, row: &ProcRow, conv: &str) -> Result<(), KernelError> {
    if k.procs.active_conversation(&row.pid).as_deref() == Some(conv) {
        return Err(KernelError::Conflict(format!(
            "Conversation is active: {conv} (abort its run first)"
        )));
    }
    Ok(())
}

pub async fn open(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConversationOpenArgs,
) -> Result<OpResult<ConversationOpenResult>, KernelError> {
    let conv = match a.conversation_id.as_deref() {
        Some(id) => conversation_arg("proc.conversation.open", Some(id))?,
        None => format!("conv_{}", accounts::random_hex(8)),
    };
    let title = a
        .title
        .map(|t| t.trim().chars().take(200).collect::<String>())
        .filter(|t| !t.is_empty());
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let (p, cv) = (row.pid.clone(), conv.clone());
    let (created, conversation) =
        k.db.call(move |c| {
            let created = conversations::open(c, &p, &cv, title.as_deref())?;
            let got = conversations::get(c, &p, &cv)?
                .ok_or_else(|| KernelError::Internal("opened conversation vanished".into()))?;
            Ok((created, got))
        })
        .await?;
    Ok(OpResult::done(ConversationOpenResult {
        pid: row.pid,
        conversation,
        created,
    }))
}

pub async fn list(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConversationListArgs,
) -> Result<OpResult<ConversationListResult>, KernelError> {
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let p = row.pid.clone();
    let conversations =
        k.db.call(move |c| {
            conversations::ensure(c, &p, DEFAULT)?;
            conversations::list(c, &p, a.include_closed)
        })
        .await?;
    Ok(OpResult::done(ConversationListResult {
        pid: row.pid,
        conversations,
    }))
}

pub async fn get(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConversationArgs,
) -> Result<OpResult<ConversationGetResult>, KernelError> {
    let conv = conversation_arg("proc.conversation.get", a.conversation_id.as_deref())?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let p = row.pid.clone();
    let conversation =
        k.db.call(move |c| {
            if conv == DEFAULT {
                conversations::ensure(c, &p, DEFAULT)?;
            }
            conversations::get(c, &p, &conv)
        })
        .await?;
    Ok(OpResult::done(ConversationGetResult {
        pid: row.pid,
        conversation,
    }))
}

pub async fn close(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConversationCloseArgs,
) -> Result<OpResult<ConversationCloseResult>, KernelError> {
    let conv = conversation_arg("proc.conversation.close", Some(&a.conversation_id))?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let (p, cv) = (row.pid.clone(), conv.clone());
    let closed = k.db.call(move |c| conversations::close(c, &p, &cv)).await?;
    Ok(OpResult::done(ConversationCloseResult {
        pid: row.pid,
        conversation_id: conv,
        closed,
    }))
}

pub async fn reset(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConversationResetArgs,
) -> Result<OpResult<ConversationResetResult>, KernelError> {
    let conv = conversation_arg("proc.conversation.reset", a.conversation_id.as_deref())?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    if k.procs.active_conversation(&row.pid).as_deref() == Some(conv.as_str()) {
        k.procs.abort(&row.pid);
    }
    super::ipc::fail_pending_to(
        &k,
        &row.pid,
        Some(&conv),
        &format!("Conversation {conv} of {} was reset", row.pid),
    )
    .await;
    let (p, cv) = (row.pid.clone(), conv.clone());
    let messages = k.db.call(move |c| store::messages(c, &p, &cv)).await?;
    let archived_to = if a.archive.unwrap_or(true) && !messages.is_empty() {
        let dir = format!("{}/conversations/{conv}", sessions_dir(&row));
        let name = format!("{}.jsonl.gz", accounts::random_hex(8));
        Some(write_archive(&k, &dir, &name, &messages).await?)
    } else {
        None
    };
    let (p, cv) = (row.pid.clone(), conv.clone());
    let generation =
        k.db.call(move |c| {
            let tx = c.transaction()?;
            store::clear_conversation(&tx, &p, &cv)?;
            let g = conversations::next_generation(&tx, &p, &cv)?;
            tx.commit()?;
            Ok(g)
        })
        .await?;
    emit(
        &k,
        row.owner_uid,
        &row.pid,
        "proc.changed",
        json!({"conversationId": conv, "changes": ["messages", "reset"]}),
    )
    .await;
    Ok(OpResult::done(ConversationResetResult {
        pid: row.pid,
        conversation_id: conv,
        generation,
        archived_messages: if archived_to.is_some() {
            messages.len()
        } else {
            0
        },
        archived_to,
    }))
}

pub async fn policy_get(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConversationArgs,
) -> Result<OpResult<PolicyResult>, KernelError> {
    let conv = conversation_arg("proc.conversation.policy.get", a.conversation_id.as_deref())?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let p = row.pid.clone();
    let policy =
        k.db.call(move |c| conversations::policy(c, &p, &conv))
            .await?;
    Ok(OpResult::done(PolicyResult {
        pid: row.pid,
        policy,
    }))
}

pub async fn policy_set(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: PolicySetArgs,
) -> Result<OpResult<PolicyResult>, KernelError> {
    const CALL: &str = "proc.conversation.policy.set";
    let conv = conversation_arg(CALL, a.conversation_id.as_deref())?;
    if let Some(p) = a.compact_at_pressure
        && !(p.is_finite() && p > 0.0 && p <= 1.0)
    {
        return Err(KernelError::invalid_args(
            CALL,
            format!("compactAtPressure: must be > 0 and <= 1, not {p}"),
        ));
    }
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let p = row.pid.clone();
    let policy =
        k.db.call(move |c| {
            let old = conversations::policy(c, &p, &conv)?;
            let new = ContextPolicy {
                conversation_id: conv,
                overflow: a.overflow.unwrap_or(old.overflow),
                compact_at_pressure: a.compact_at_pressure.unwrap_or(old.compact_at_pressure),
                keep_last: a.keep_last.unwrap_or(old.keep_last),
                updated_at: now_ms(),
            };
            conversations::set_policy(c, &p, &new)?;
            Ok(new)
        })
        .await?;
    emit(
        &k,
        row.owner_uid,
        &row.pid,
        "proc.changed",
        json!({"conversationId": policy.conversation_id, "changes": ["policy"]}),
    )
    .await;
    Ok(OpResult::done(PolicyResult {
        pid: row.pid,
        policy,
    }))
}

pub async fn compact(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: CompactArgs,
) -> Result<OpResult<CompactResult>, KernelError> {
    const CALL: &str = "proc.conversation.compact";
    let conv = conversation_arg(CALL, a.conversation_id.as_deref())?;
    let kind = match (a.summary, a.generate_summary.unwrap_or(false)) {
        (Some(_), true) | (None, false) => {
            return Err(KernelError::invalid_args(
                CALL,
                "summary, generateSummary: give exactly one of summary and generateSummary: true",
            ));
        }
        (Some(t), false) if t.trim().is_empty() => {
            return Err(KernelError::invalid_args(
                CALL,
                "summary: must not be empty",
            ));
        }
        (Some(t), false) => SummaryKind::Given(t),
        (None, true) => SummaryKind::Generate,
    };
    let selector = match (a.keep_last, a.through_message_id) {
        (Some(n), None) => Selector::KeepLast(n as usize),
        (None, Some(id)) => Selector::Through(id),
        _ => {
            return Err(KernelError::invalid_args(
                CALL,
                "keepLast, throughMessageId: give exactly one of keepLast and throughMessageId",
            ));
        }
    };
    let row = target(&k, &s, a.pid.as_deref()).await?;
    ensure_idle(&k, &row, &conv)?;
    let out = compact_now(&k, &row, &conv, selector, kind)
        .await?
        .ok_or_else(|| {
            KernelError::Conflict(format!("Nothing to compact in conversation {conv}"))
        })?;
    emit(
        &k,
        row.owner_uid,
        &row.pid,
        "proc.changed",
        json!({"conversationId": conv, "changes": ["messages", "compacted"],
               "segmentId": out.segment.id}),
    )
    .await;
    Ok(OpResult::done(out))
}

pub async fn fork(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ForkArgs,
) -> Result<OpResult<ForkResult>, KernelError> {
    const CALL: &str = "proc.conversation.fork";
    let source = conversation_arg(CALL, a.conversation_id.as_deref())?;
    let target_id = match a.target_conversation_id.as_deref() {
        Some(id) => conversation_arg(CALL, Some(id)).map_err(|_| {
            KernelError::invalid_args(
                CALL,
                "targetConversationId: must be 1 to 128 characters without '/'",
            )
        })?,
        None => format!("conv_{}", accounts::random_hex(8)),
    };
    if a.segment_id.is_some() == a.through_message_id.is_some() {
        return Err(KernelError::invalid_args(
            CALL,
            "segmentId, throughMessageId: give exactly one of segmentId and throughMessageId",
        ));
    }
    if target_id == source {
        return Err(KernelError::invalid_args(
            CALL,
            "targetConversationId: must differ from the source conversation",
        ));
    }
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let include_suffix = a.include_live_suffix.unwrap_or(true);
    let (p, t) = (row.pid.clone(), target_id.clone());
    if let Some(existing) = k.db.call(move |c| conversations::get(c, &p, &t)).await?
        && existing.message_count > 0
    {
        return Err(KernelError::Conflict(format!(
            "Conversation {target_id} already has messages"
        )));
    }
    let (messages, segment) = match (&a.segment_id, a.through_message_id) {
        (Some(seg_id), _) => {
            let seg = segment_of(&k, &row, &source, seg_id, CALL).await?;
            let mut msgs = read_archive(&k, &seg.segment.archive_path).await?;
            if include_suffix {
                msgs.extend(live_suffix(&k, &row, &source, &seg).await?);
            }
            (msgs, Some(seg.segment))
        }
        (None, Some(through)) => {
            let (p, cv) = (row.pid.clone(), source.clone());
            let msgs =
                k.db.call(move |c| store::messages_between(c, &p, &cv, i64::MIN, through))
                    .await?;
            if !msgs.iter().any(|m| m["id"].as_i64() == Some(through)) {
                return Err(KernelError::invalid_args(
                    CALL,
                    format!("throughMessageId: no message {through} in conversation {source}"),
                ));
            }
            (msgs, None)
        }
        (None, None) => unreachable!("checked above"),
    };
    let title = a
        .title
        .map(|t| t.trim().chars().take(200).collect::<String>())
        .filter(|t| !t.is_empty());
    let (p, t, n) = (row.pid.clone(), target_id.clone(), messages.len());
    let target_conversation =
        k.db.call(move |c| {
            let tx = c.transaction()?;
            conversations::open(&tx, &p, &t, title.as_deref())?;
            for mut m in messages {
                if let Some(o) = m.as_object_mut() {
                    o.remove("id");
                    o.remove("timestamp");
                }
                store::append_message(&tx, &p, &t, None, &m)?;
            }
            let got = conversations::get(&tx, &p, &t)?
                .ok_or_else(|| KernelError::Internal("forked conversation vanished".into()))?;
            tx.commit()?;
            Ok(got)
        })
        .await?;
    Ok(OpResult::done(ForkResult {
        pid: row.pid,
        source_conversation_id: source,
        target_conversation,
        included_live_suffix: segment.is_some() && include_suffix,
        segment,
        through_message_id: a.through_message_id,
        restored_messages: n,
    }))
}

/// The messages that were live after segment `seg`'s prefix when it was
/// compacted: those still live, and those later compactions archived
/// (ids are unique, so the union sorted by id is that suffix). Summary
/// markers are not part of it.
async fn live_suffix(
    k: &Arc<Kernel>,
    row: &ProcRow,
    conv: &str,
    seg: &SegmentRow,
) -> Result<Vec<Value>, KernelError> {
    let (from, through) = (seg.segment.to_message_id, seg.live_through_id);
    let (p, cv) = (row.pid.clone(), conv.to_owned());
    let (mut out, later) =
        k.db.call(move |c| {
            let live = store::messages_between(c, &p, &cv, from, through)?;
            Ok((live, conversations::segments(c, &p, &cv)?))
        })
        .await?;
    for other in later.iter().filter(|o| {
        o.segment.id != seg.segment.id
            && o.segment.generation == seg.segment.generation
            && o.segment.to_message_id > from
            && o.segment.from_message_id <= through
    }) {
        out.extend(read_archive(k, &other.segment.archive_path).await?);
    }
    let id_of = |m: &Value| m["id"].as_i64().unwrap_or_default();
    out.retain(|m| m["kind"] != "compaction.summary" && id_of(m) > from && id_of(m) <= through);
    out.sort_by_key(id_of);
    out.dedup_by_key(|m| id_of(m));
    Ok(out)
}

/// Segment `id` of `conv` of this process, or a 400 naming `segmentId`.
async fn segment_of(
    k: &Arc<Kernel>,
    row: &ProcRow,
    conv: &str,
    id: &str,
    call: &str,
) -> Result<SegmentRow, KernelError> {
    let (p, i) = (row.pid.clone(), id.to_owned());
    match k
        .db
        .call(move |c| conversations::get_segment(c, &p, &i))
        .await?
    {
        Some(s) if s.segment.conversation_id == conv => Ok(s),
        _ => Err(KernelError::invalid_args(
            call,
            format!("segmentId: no segment {id} in conversation {conv}"),
        )),
    }
}

pub async fn segments(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConversationArgs,
) -> Result<OpResult<SegmentsResult>, KernelError> {
    let conv = conversation_arg("proc.conversation.segments", a.conversation_id.as_deref())?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let (p, cv) = (row.pid.clone(), conv.clone());
    let segments =
        k.db.call(move |c| conversations::segments(c, &p, &cv))
            .await?;
    Ok(OpResult::done(SegmentsResult {
        pid: row.pid,
        conversation_id: conv,
        segments: segments.into_iter().map(|s| s.segment).collect(),
    }))
}

pub async fn segment_read(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SegmentReadArgs,
) -> Result<OpResult<SegmentReadResult>, KernelError> {
    const CALL: &str = "proc.conversation.segment.read";
    let conv = conversation_arg(CALL, a.conversation_id.as_deref())?;
    let row = target(&k, &s, a.pid.as_deref()).await?;
    let seg = segment_of(&k, &row, &conv, &a.segment_id, CALL).await?;
    let all = read_archive(&k, &seg.segment.archive_path).await?;
    let total = all.len();
    let offset = a.offset.unwrap_or(0);
    let messages: Vec<Value> = all
        .into_iter()
        .skip(offset)
        .take(page_limit(a.limit))
        .collect();
    Ok(OpResult::done(SegmentReadResult {
        pid: row.pid,
        conversation_id: conv,
        segment: seg.segment,
        truncated: offset + messages.len() < total,
        messages,
        message_count: total,
    }))
}
