//! `notification.*`: per-user notifications with the seed's TTLs and
//! clamps, expired by the timer table, and signalled
//! (`notification.created|updated|dismissed`) to every socket of the
//! owner and no one else. Another user's id answers `notification: null`,
//! the same as a missing one.

use std::sync::Arc;

use super::store::{self, Mark};
use super::types::{
    CreateArgs, CreateResult, IdArgs, ListArgs, ListResult, MaybeResult, NotificationRecord,
    NotificationSource,
};
use super::{DISMISSED_TTL_MS, READ_TTL_MS, clamp_limit, clamp_ttl, normalize_actions};
use crate::db::now_ms;
use crate::domains::timers::Timer;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::{Role, Session};

/// A process's tool call raises a process notification; a socket, a user one.
fn source_of(s: &Session) -> NotificationSource {
    match s.connection_id.strip_prefix("process:") {
        Some(pid) => NotificationSource::Process {
            process_id: pid.to_owned(),
        },
        None => NotificationSource::User,
    }
}

/// Sends `signal` with the notification to every socket of `uid` except
/// services (adapter traffic is explicit, as in the reference).
fn broadcast(k: &Kernel, uid: i64, signal: &str, n: &NotificationRecord) {
    let payload = serde_json::json!({ "notification": n });
    for role in [Role::User, Role::Driver] {
        k.pool.signal_user(uid, role, signal, payload.clone());
    }
}

pub async fn create(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: CreateArgs,
) -> Result<CreateResult, KernelError> {
    let title = a.title.trim().to_owned();
    if title.is_empty() {
        return Err(KernelError::InvalidArgs {
            call: "notification.create".into(),
            reason: "title is required".into(),
        });
    }
    let now = now_ms();
    let n = NotificationRecord {
        notification_id: uuid::Uuid::new_v4().to_string(),
        title,
        body: a
            .body
            .map(|b| b.trim().to_owned())
            .filter(|b| !b.is_empty()),
        level: a.level.unwrap_or_default(),
        created_at: now,
        read_at: None,
        dismissed_at: None,
        expires_at: Some(now + clamp_ttl(a.ttl_ms)),
        actions: normalize_actions(a.actions.unwrap_or_default()),
        source: source_of(&s),
    };
    let uid = s.identity.uid;
    let stored = n.clone();
    k.db.call(move |c| {
        store::prune_expired(c, now)?;
        store::insert(c, uid, &stored)
    })
    .await?;
    k.timers.poke();
    broadcast(&k, uid, "notification.created", &n);
    Ok(CreateResult { notification: n })
}

pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let uid = s.identity.uid;
    let limit = clamp_limit(a.limit);
    let notifications =
        k.db.call(move |c| {
            store::prune_expired(c, now_ms())?;
            store::list(
                c,
                uid,
                a.include_read.unwrap_or(true),
                a.include_dismissed.unwrap_or(false),
                limit,
            )
        })
        .await?;
    Ok(ListResult { notifications })
}

async fn mark(
    k: Arc<Kernel>,
    s: Arc<Session>,
    id: String,
    how: Mark,
) -> Result<MaybeResult, KernelError> {
    let uid = s.identity.uid;
    let now = now_ms();
    let ttl = match how {
        Mark::Read => READ_TTL_MS,
        Mark::Dismissed => DISMISSED_TTL_MS,
    };
    let notification =
        k.db.call(move |c| {
            store::prune_expired(c, now)?;
            store::mark(c, uid, &id, how, now, now + ttl)
        })
        .await?;
    if let Some(n) = &notification {
        k.timers.poke();
        let signal = match how {
            Mark::Read => "notification.updated",
            Mark::Dismissed => "notification.dismissed",
        };
        broadcast(&k, uid, signal, n);
    }
    Ok(MaybeResult { notification })
}

pub async fn mark_read(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: IdArgs,
) -> Result<MaybeResult, KernelError> {
    mark(k, s, a.notification_id, Mark::Read).await
}

pub async fn dismiss(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: IdArgs,
) -> Result<MaybeResult, KernelError> {
    mark(k, s, a.notification_id, Mark::Dismissed).await
}

/// An expiry timer fired: the notification goes, if it is still expired
/// (a later mark re-armed the same timer id, so a stale fire finds it
/// live and leaves it).
pub async fn on_timer(k: Arc<Kernel>, timer: Timer) {
    let Some(id) = store::id_of_timer(&timer.id).map(str::to_owned) else {
        tracing::warn!(timer = %timer.id, "notification timer without an id");
        return;
    };
    match k.db.call(move |c| store::expire(c, &id, now_ms())).await {
        Ok(expired) => tracing::debug!(timer = %timer.id, expired, "notification expiry"),
        Err(e) => tracing::error!(timer = %timer.id, error = %e, "notification expiry"),
    }
}
