//! `adapter.*` and `sys.link*`, and the delivery of a run's answer to the
//! chat surface that asked.
//!
//! - A user's `adapter.connect|disconnect|send|status` is forwarded to the
//!   adapter's live service connection as a request frame of the same
//!   call, through the device-routing machinery (`routing::
//!   route_to_adapter`): 503 when no adapter of that name is connected or
//!   it goes away, 504 at `gsv serve --adapter-timeout`. `adapter.status`
//!   answers from the last known state when the adapter is unavailable
//!   (seed 000).
//! - The adapter calls `adapter.inbound` per message and
//!   `adapter.state.update` per state change (service role only, and only
//!   for the adapter its `client.channel` names). An unlinked DM gets a
//!   link challenge; an unlinked group message is dropped with its
//!   reason; a linked actor's message goes to the surface's routed
//!   process (`sys.link.route.*`) or the user's home process
//!   `init:<uid>`, where "approve" / "deny" in a DM answers a pending
//!   approval. Each message is handled once: a redelivery gets the first
//!   result back (the ingress-receipt ledger).
//! - A run a message started answers along its [`SurfaceRoute`]: the final
//!   text and each approval request are posted with `adapter.send`
//!   ([`on_run_signal`]), kept in the outbox until posted, so an answer
//!   made while the adapter is away (or the kernel restarts) reaches it
//!   when it reports its account connected.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use gsv_protocol::adapter::{
    self as wire, AccountStatus, ConnectArgs, ConnectResult, Delivered, DisconnectArgs,
    DisconnectResult, InboundArgs, InboundMessage, InboundReply, InboundResult, LinkChallenge,
    Replayed, SendArgs, SendResult, StateUpdateArgs, StateUpdateResult, StatusArgs, StatusResult,
    Surface, SurfaceKind,
};
use gsv_protocol::link::{
    self as links, ConsumeArgs, LinkArgs, LinkResult, ListArgs, ListResult, RouteDeleteArgs,
    RouteDeleteResult, RouteListArgs, RouteListResult, RouteSetArgs, RouteSetResult, UnlinkArgs,
    UnlinkResult,
};
use gsv_protocol::proc::{HilArgs, SendArgs as ProcSendArgs};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::store::{self, ActorKey, Claim, ConsumeError, ReceiptKey, SurfaceKey};
use super::{MAX_ID_BYTES, MAX_MESSAGE_BYTES, SurfaceRoute, valid_adapter_name};
use crate::db::Db;
use crate::domains::accounts;
use crate::domains::proc::store::{self as proc_store, ProcRow};
use crate::domains::proc::{RunRoute, calls as proc_calls};
use crate::domains::timers::Timer;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::routing::{self, Origin, Router};
use crate::session::{Role, Session};

/// The signal service sockets get when an adapter account's state changes.
pub const STATUS_SIGNAL: &str = "adapter.status";
/// How many times a run's answer is posted while the adapter says a retry
/// is safe, before it waits in the outbox for the adapter's next report.
const DELIVERY_ATTEMPTS: usize = 5;

// ---- the plane: calls forwarded to the adapter -------------------------

pub async fn connect(
    k: Arc<Kernel>,
    s: Arc<Session>,
    mut a: ConnectArgs,
) -> Result<ConnectResult, KernelError> {
    a.adapter = adapter_arg(wire::CONNECT, &a.adapter)?;
    id_arg(wire::CONNECT, "accountId", &a.account_id)?;
    let origin = Origin::Connection(&s.connection_id);
    let result: ConnectResult = forward(&k.router, origin, wire::CONNECT, &a.adapter, &a).await?;
    if let ConnectResult::Connected(done) = &result {
        let status = bare_status(
            &a.account_id,
            done.result.connected,
            done.result.authenticated,
        );
        record_status(&k, &a.adapter, status, s.identity.uid).await?;
    }
    Ok(result)
}

pub async fn disconnect(
    k: Arc<Kernel>,
    s: Arc<Session>,
    mut a: DisconnectArgs,
) -> Result<DisconnectResult, KernelError> {
    a.adapter = adapter_arg(wire::DISCONNECT, &a.adapter)?;
    id_arg(wire::DISCONNECT, "accountId", &a.account_id)?;
    let origin = Origin::Connection(&s.connection_id);
    let result: DisconnectResult =
        forward(&k.router, origin, wire::DISCONNECT, &a.adapter, &a).await?;
    if matches!(result, DisconnectResult::Done(_)) {
        let status = bare_status(&a.account_id, false, false);
        record_status(&k, &a.adapter, status, s.identity.uid).await?;
    }
    Ok(result)
}

pub async fn send(
    k: Arc<Kernel>,
    s: Arc<Session>,
    mut a: SendArgs,
) -> Result<SendResult, KernelError> {
    a.adapter = adapter_arg(wire::SEND, &a.adapter)?;
    id_arg(wire::SEND, "accountId", &a.account_id)?;
    surface_arg(wire::SEND, "surface", &a.surface)?;
    text_arg(wire::SEND, "text", &a.text)?;
    if a.text.trim().is_empty() && a.media.is_empty() {
        return Err(KernelError::InvalidArgs {
            call: wire::SEND.into(),
            reason: "text: must not be empty without media".into(),
        });
    }
    forward_send(&k.router, Origin::Connection(&s.connection_id), a).await
}

/// Forwards an `adapter.send` with a `deliveryId` (made here when absent)
/// and gives the answer that id too.
async fn forward_send(
    router: &Arc<Router>,
    origin: Origin<'_>,
    mut a: SendArgs,
) -> Result<SendResult, KernelError> {
    let delivery_id = a
        .delivery_id
        .get_or_insert_with(|| format!("dlv_{}", accounts::random_hex(12)))
        .clone();
    let mut result: SendResult = forward(router, origin, wire::SEND, &a.adapter, &a).await?;
    match &mut result {
        SendResult::Sent(done) if done.result.delivery_id.is_empty() => {
            done.result.delivery_id = delivery_id;
        }
        SendResult::Failed(f) => {
            f.delivery_id.get_or_insert(delivery_id);
        }
        SendResult::Sent(_) => {}
    }
    Ok(result)
}

/// `adapter.status`: the adapter's live answer when it gives one (recorded),
/// else the last known state; never 503 (seed 000: stale state may be
/// returned).
pub async fn status(
    k: Arc<Kernel>,
    s: Arc<Session>,
    mut a: StatusArgs,
) -> Result<StatusResult, KernelError> {
    a.adapter = adapter_arg(wire::STATUS, &a.adapter)?;
    if let Some(acc) = &a.account_id {
        id_arg(wire::STATUS, "accountId", acc)?;
    }
    if k.router.adapter(&a.adapter).is_some() {
        let origin = Origin::Connection(&s.connection_id);
        let live: Result<StatusResult, _> =
            forward(&k.router, origin, wire::STATUS, &a.adapter, &a).await;
        match live {
            Ok(live) => {
                for acc in live.accounts {
                    record_status(&k, &a.adapter, acc, s.identity.uid).await?;
                }
            }
            Err(e) => {
                tracing::debug!(adapter = %a.adapter, error = %e, "live adapter status unavailable")
            }
        }
    }
    let (adapter, account) = (a.adapter.clone(), a.account_id.clone());
    let accounts =
        k.db.call(move |c| store::statuses(c, &adapter, account.as_deref()))
            .await?;
    Ok(StatusResult {
        adapter: a.adapter,
        accounts,
    })
}

// ---- the adapter's calls ----------------------------------------------

/// `adapter.state.update` (service role only): records the account's
/// state and tells every service socket (`adapter.status`).
pub async fn state_update(
    k: Arc<Kernel>,
    s: Arc<Session>,
    mut a: StateUpdateArgs,
) -> Result<StateUpdateResult, KernelError> {
    a.adapter = service_adapter(&s, wire::STATE_UPDATE, &a.adapter)?;
    id_arg(wire::STATE_UPDATE, "accountId", &a.account_id)?;
    // The account the call names is the one the row is about.
    a.status.account_id = a.account_id.clone();
    record_status(&k, &a.adapter, a.status.clone(), s.identity.uid).await?;
    let payload = serde_json::to_value(&a)
        .map_err(|e| KernelError::internal("encoding adapter.status", e))?;
    k.pool.signal_role(Role::Service, STATUS_SIGNAL, payload);
    if a.status.connected {
        tokio::spawn(flush_outbox(
            k.db.clone(),
            k.router.clone(),
            a.adapter,
            a.account_id,
        ));
    }
    Ok(StateUpdateResult { ok: true })
}

/// `adapter.inbound` (service role only): one message an adapter received,
/// handled once: a redelivery (the same message id on the same surface)
/// gets the first result back, `replayed:"completed"`, or
/// `replayed:"in_progress"` while the first is being handled.
pub async fn inbound(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: InboundArgs,
) -> Result<InboundResult, KernelError> {
    let call = wire::INBOUND;
    let adapter = service_adapter(&s, call, &a.adapter)?;
    id_arg(call, "accountId", &a.account_id)?;
    let m = &a.message;
    id_arg(call, "message.messageId", &m.message_id)?;
    surface_arg(call, "message.surface", &m.surface)?;
    text_arg(call, "message.text", &m.text)?;
    let key = ReceiptKey {
        adapter: adapter.clone(),
        account_id: a.account_id.clone(),
        surface_id: m.surface.id.clone(),
        message_id: m.message_id.clone(),
    };
    let (k2, delivery) = (key.clone(), a.delivery_id.clone());
    let claim =
        k.db.call(move |c| store::claim_receipt(c, &k2, delivery.as_deref()))
            .await?;
    match claim {
        Claim::Fresh => {}
        Claim::InProgress => {
            return Ok(InboundResult {
                ok: true,
                replayed: Some(Replayed::InProgress),
                ..InboundResult::default()
            });
        }
        Claim::Completed(first) => {
            let mut r: InboundResult = serde_json::from_str(&first)
                .map_err(|e| KernelError::internal("reading an ingress receipt", e))?;
            r.replayed = Some(Replayed::Completed);
            return Ok(r);
        }
    }
    // Released unless completed, also when this call is dropped midway,
    // so a redelivery is handled again.
    let mut claimed = ClaimGuard {
        db: k.db.clone(),
        key: Some(key),
    };
    let result = handle_inbound(&k, &s, adapter, &a).await?;
    let json = serde_json::to_string(&result)
        .map_err(|e| KernelError::internal("encoding an inbound result", e))?;
    if let Some(key) = claimed.key.take() {
        k.db.call(move |c| store::complete_receipt(c, &key, &json))
            .await?;
    }
    Ok(result)
}

/// A claimed receipt not completed yet: released when dropped.
struct ClaimGuard {
    db: Db,
    key: Option<ReceiptKey>,
}

impl Drop for ClaimGuard {
    fn drop(&mut self) {
        let Some(key) = self.key.take() else { return };
        // Without a runtime (the kernel is going away) the claim stays,
        // and the next start drops it.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let db = self.db.clone();
        rt.spawn(async move {
            if let Err(e) = db.call(move |c| store::release_receipt(c, &key)).await {
                tracing::error!(error = %e, "releasing an ingress receipt");
            }
        });
    }
}

/// One new inbound message: a challenge, a drop, an approval answer or a
/// delivery.
async fn handle_inbound(
    k: &Arc<Kernel>,
    s: &Session,
    adapter: String,
    a: &InboundArgs,
) -> Result<InboundResult, KernelError> {
    let call = wire::INBOUND;
    let m = &a.message;
    let Some(actor) = &m.actor else {
        return Ok(dropped("missing_actor"));
    };
    id_arg(call, "message.actor.id", &actor.id)?;
    let key = ActorKey {
        adapter: adapter.clone(),
        account_id: a.account_id.clone(),
        actor_id: actor.id.clone(),
    };
    let dm = m.surface.kind == SurfaceKind::Dm;
    let k2 = key.clone();
    let link = k.db.call(move |c| store::link_of(c, &k2)).await?;
    let Some(link) = link else {
        if !dm {
            return Ok(dropped("unlinked_actor"));
        }
        let (k2, kind, sid) = (key.clone(), m.surface.kind.as_str(), m.surface.id.clone());
        let (code, expires_at) =
            k.db.call(move |c| store::challenge(c, &k2, kind, &sid))
                .await?;
        k.timers.poke();
        tracing::info!(%adapter, account = %a.account_id, actor = %actor.id, "link challenge issued");
        return Ok(InboundResult {
            ok: true,
            challenge: Some(LinkChallenge {
                delivery_id: a.delivery_id.clone(),
                prompt: format!(
                    "This chat is not linked to a gsv account yet. To link it, run \
                     `gsv auth link {code}` as your gsv user within 10 minutes."
                ),
                code,
                expires_at,
            }),
            ..InboundResult::default()
        });
    };
    // A service running under a user's own token speaks for that user's
    // links only; root's speaks for everyone's.
    if !s.identity.is_root() && link.uid != s.identity.uid {
        return Ok(dropped("linked_to_another_account"));
    }
    let Some(user) = user_session(k, link.uid, &adapter).await? else {
        return Ok(dropped("linked_account_gone"));
    };
    k.dispatch.authorize(&user, "proc.send")?;
    let row = target_process(k, &user, &key, &m.surface).await?;
    if dm && let Some(approve) = approval_word(&m.text) {
        let p = row.pid.clone();
        let pending =
            k.db.call(move |c| proc_store::pending_hil_of(c, &p))
                .await?;
        if let Some(h) = pending {
            let decision = if approve { "approve" } else { "deny" };
            let args = HilArgs {
                request_id: h.request_id.clone(),
                decision: decision.into(),
                remember: false,
                pid: Some(row.pid.clone()),
            };
            proc_calls::hil(k.clone(), user, args).await?;
            let verb = if approve { "Approved" } else { "Denied" };
            return Ok(InboundResult {
                ok: true,
                reply: Some(InboundReply {
                    delivery_id: a.delivery_id.clone(),
                    text: format!("{verb}: {} ({})", h.tool_name, summarize(&h.args)),
                    reply_to_id: Some(m.message_id.clone()),
                }),
                ..InboundResult::default()
            });
        }
    }
    let text = render(m);
    if text.trim().is_empty() {
        return Ok(dropped("empty_message"));
    }
    let route = SurfaceRoute {
        adapter,
        account_id: a.account_id.clone(),
        surface: m.surface.clone(),
        actor_id: Some(actor.id.clone()),
        reply_to_id: Some(m.message_id.clone()),
    };
    let args = ProcSendArgs {
        pid: Some(row.pid.clone()),
        message: text,
        conversation_id: None,
    };
    let sent =
        proc_calls::send_routed(k.clone(), user, args, Some(RunRoute::Surface(route))).await?;
    Ok(InboundResult {
        ok: true,
        delivered: Some(Delivered {
            uid: link.uid,
            pid: row.pid,
            run_id: sent.run_id.unwrap_or_default(),
            queued: sent.queued.unwrap_or(false),
        }),
        ..InboundResult::default()
    })
}

fn dropped(reason: &str) -> InboundResult {
    InboundResult {
        ok: true,
        dropped_reason: Some(reason.to_owned()),
        ..InboundResult::default()
    }
}

/// The session a linked actor's messages act as: the linked account, its
/// capabilities, no socket of its own; `None` when the account is gone.
async fn user_session(
    k: &Arc<Kernel>,
    uid: i64,
    adapter: &str,
) -> Result<Option<Arc<Session>>, KernelError> {
    let found =
        k.db.call(move |c| {
            let Some(id) = accounts::identity_by_uid(c, uid)? else {
                return Ok(None);
            };
            let caps = accounts::capabilities(c, &id.gids)?;
            Ok(Some((id, caps)))
        })
        .await?;
    Ok(found.map(|(identity, capabilities)| {
        Arc::new(Session {
            connection_id: format!("adapter:{adapter}"),
            role: Role::Service,
            identity,
            capabilities,
            client_id: format!("adapter:{adapter}"),
            peer: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            device: None,
            channel: Some(adapter.to_owned()),
        })
    }))
}

/// The surface's routed process when its route still holds (the process
/// exists, is the user's and interactive; a stale route is cleared), else
/// the user's home process.
async fn target_process(
    k: &Arc<Kernel>,
    user: &Session,
    key: &ActorKey,
    surface: &Surface,
) -> Result<ProcRow, KernelError> {
    let uid = user.identity.uid;
    let (key, kind, sid, thread) = (
        key.clone(),
        surface.kind.as_str(),
        surface.id.clone(),
        surface.thread_id.clone().unwrap_or_default(),
    );
    let routed =
        k.db.call(move |c| {
            let Some(pid) = store::surface_route(c, &key, kind, &sid, &thread, uid)? else {
                return Ok(None);
            };
            match proc_store::get(c, &pid)? {
                Some(row) if row.owner_uid == uid && row.interactive => Ok(Some(row)),
                _ => {
                    store::clear_surface_routes_to(c, uid, &pid)?;
                    Ok(None)
                }
            }
        })
        .await?;
    match routed {
        Some(row) => Ok(row),
        None => proc_calls::ensure_init(k, &user.identity).await,
    }
}

/// "approve" / "deny" (and "allow", "approved", "denied"), whole message,
/// any case, a trailing `.` or `!` allowed.
fn approval_word(text: &str) -> Option<bool> {
    let w = text.trim().trim_end_matches(['.', '!']).to_lowercase();
    match w.as_str() {
        "approve" | "approved" | "allow" => Some(true),
        "deny" | "denied" => Some(false),
        _ => None,
    }
}

/// The message as the agent reads it: in a room, who said it; media as
/// one bracketed line each (their bytes are not relayed yet).
fn render(m: &InboundMessage) -> String {
    let mut out = String::new();
    if m.surface.kind != SurfaceKind::Dm
        && let Some(actor) = &m.actor
    {
        let who = actor.name.as_deref().unwrap_or(&actor.id);
        out.push_str(&format!("[{who}] "));
    }
    out.push_str(&m.text);
    for media in &m.media {
        let kind = serde_json::to_value(media.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let name = media.filename.as_deref().unwrap_or("");
        out.push_str(&format!("\n[{kind} {} {name}]", media.mime_type));
    }
    out
}

// ---- identity links -----------------------------------------------------

pub async fn link(k: Arc<Kernel>, s: Arc<Session>, a: LinkArgs) -> Result<LinkResult, KernelError> {
    user_only(&s, links::LINK)?;
    let key = actor_key(links::LINK, &a.adapter, &a.account_id, &a.actor_id)?;
    let me = s.identity.uid;
    let root = s.identity.is_root();
    let uid = a.uid.unwrap_or(me);
    if uid != me && !root {
        return Err(KernelError::PermissionDenied(format!(
            "sys.link for uid {uid} (only your own)"
        )));
    }
    let link =
        k.db.call(move |c| {
            if accounts::identity_by_uid(c, uid)?.is_none() {
                return Err(KernelError::NotFound {
                    kind: "account",
                    id: uid.to_string(),
                });
            }
            // Taking over another user's link is root's business.
            if let Some(old) = store::link_of(c, &key)?
                && old.uid != uid
                && !root
            {
                return Err(KernelError::Conflict(format!(
                    "{}:{}:{} is linked to another account",
                    key.adapter, key.account_id, key.actor_id
                )));
            }
            store::put_link(c, &key, uid, me)
        })
        .await?;
    tracing::info!(adapter = %link.adapter, actor = %link.actor_id, uid = link.uid, "identity linked");
    Ok(LinkResult {
        linked: true,
        link: Some(link),
    })
}

pub async fn unlink(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: UnlinkArgs,
) -> Result<UnlinkResult, KernelError> {
    user_only(&s, links::UNLINK)?;
    let key = actor_key(links::UNLINK, &a.adapter, &a.account_id, &a.actor_id)?;
    let owner = (!s.identity.is_root()).then_some(s.identity.uid);
    let removed =
        k.db.call(move |c| store::delete_link(c, &key, owner))
            .await?;
    Ok(UnlinkResult { removed })
}

pub async fn link_list(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ListArgs,
) -> Result<ListResult, KernelError> {
    user_only(&s, links::LIST)?;
    let filter = own_or_root(&s, links::LIST, a.uid)?;
    let links = k.db.call(move |c| store::list_links(c, filter)).await?;
    Ok(ListResult { links })
}

pub async fn link_consume(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ConsumeArgs,
) -> Result<LinkResult, KernelError> {
    user_only(&s, links::CONSUME)?;
    let code = store::normalize_code(&a.code).map_err(|reason| KernelError::InvalidArgs {
        call: links::CONSUME.into(),
        reason: format!("code: {reason}"),
    })?;
    let uid = s.identity.uid;
    let consumed = k.db.call(move |c| store::consume(c, &code, uid)).await?;
    let link = consumed.map_err(|e| match e {
        ConsumeError::Unknown(code) => KernelError::NotFound {
            kind: "link code",
            id: code,
        },
        e @ ConsumeError::Used(_) => KernelError::Conflict(e.to_string()),
        e @ ConsumeError::Expired(_) => KernelError::BadRequest(e.to_string()),
    })?;
    tracing::info!(adapter = %link.adapter, actor = %link.actor_id, uid, "identity linked by code");
    Ok(LinkResult {
        linked: true,
        link: Some(link),
    })
}

// ---- surface routes -----------------------------------------------------

/// `sys.link.route.set`: a linked actor's messages on one surface go to
/// one of its account's interactive processes. Your own actors' routes
/// only unless root; the process must be the linked account's.
pub async fn route_set(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: RouteSetArgs,
) -> Result<RouteSetResult, KernelError> {
    let call = links::ROUTE_SET;
    user_only(&s, call)?;
    let key = surface_key(call, &a.adapter, &a.account_id, &a.actor_id, &a.surface)?;
    id_arg(call, "pid", &a.pid)?;
    let (me, root, pid) = (s.identity.uid, s.identity.is_root(), a.pid);
    let route =
        k.db.call(move |c| {
            let actor = &key.actor;
            let link = store::link_of(c, actor)?.ok_or_else(|| KernelError::NotFound {
                kind: "identity link",
                id: format!("{}:{}:{}", actor.adapter, actor.account_id, actor.actor_id),
            })?;
            if link.uid != me && !root {
                return Err(KernelError::PermissionDenied(format!(
                    "{call} for an actor linked to another account"
                )));
            }
            match proc_store::get(c, &pid)? {
                Some(p) if p.owner_uid == link.uid && p.interactive => {}
                Some(p) if p.owner_uid == link.uid => {
                    return Err(KernelError::InvalidArgs {
                        call: call.into(),
                        reason: format!("pid: {pid} is not an interactive process"),
                    });
                }
                // Another account's process is not told apart from none.
                _ => {
                    return Err(KernelError::NotFound {
                        kind: "process",
                        id: pid,
                    });
                }
            }
            store::put_surface_route(c, &key, link.uid, &pid, me)
        })
        .await?;
    tracing::info!(adapter = %route.adapter, actor = %route.actor_id, pid = %route.pid, "surface routed");
    Ok(RouteSetResult { route })
}

/// `sys.link.route.list`: your routes; root's: all or one uid's.
pub async fn route_list(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: RouteListArgs,
) -> Result<RouteListResult, KernelError> {
    user_only(&s, links::ROUTE_LIST)?;
    let filter = own_or_root(&s, links::ROUTE_LIST, a.uid)?;
    let routes =
        k.db.call(move |c| store::list_surface_routes(c, filter))
            .await?;
    Ok(RouteListResult { routes })
}

/// `sys.link.route.delete`: the surface's messages go to `init:<uid>`
/// again (your own routes only unless root).
pub async fn route_delete(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: RouteDeleteArgs,
) -> Result<RouteDeleteResult, KernelError> {
    let call = links::ROUTE_DELETE;
    user_only(&s, call)?;
    let key = surface_key(call, &a.adapter, &a.account_id, &a.actor_id, &a.surface)?;
    let owner = (!s.identity.is_root()).then_some(s.identity.uid);
    let removed =
        k.db.call(move |c| store::delete_surface_route(c, &key, owner))
            .await?;
    Ok(RouteDeleteResult { removed })
}

/// A link code's expiry timer fired: the code is gone.
pub async fn on_timer(k: Arc<Kernel>, timer: Timer) {
    let Some(code) = timer.id.strip_prefix("link:").map(str::to_owned) else {
        tracing::warn!(timer = %timer.id, "link timer without a code");
        return;
    };
    if let Err(e) = k.db.call(move |c| store::drop_challenge(c, &code)).await {
        tracing::error!(timer = %timer.id, error = %e, "dropping an expired link code");
    }
}

// ---- answers back to the surface ------------------------------------

/// A signal of a run a chat message started: its final text (or failure)
/// and each approval request are posted to that surface through
/// `adapter.send`, by way of the outbox; everything else of the run stays
/// in the kernel.
pub fn on_run_signal(k: &Kernel, surface: &SurfaceRoute, signal: &str, payload: &Value) {
    let run_id = payload["runId"].as_str().unwrap_or_default().to_owned();
    let (text, delivery) = match signal {
        "proc.run.finished" => {
            let text = match payload["status"].as_str() {
                Some("completed") => payload["text"]
                    .as_str()
                    .filter(|t| !t.trim().is_empty())
                    .map(str::to_owned),
                Some("error") => Some(format!(
                    "The run failed: {}",
                    payload["error"].as_str().unwrap_or("unknown error")
                )),
                _ => None,
            };
            (text, format!("{run_id}:final"))
        }
        "proc.run.hil.requested" => {
            let request = payload["requestId"].as_str().unwrap_or_default();
            (
                Some(approval_prompt(payload)),
                format!("{run_id}:{request}"),
            )
        }
        _ => (None, String::new()),
    };
    let Some(text) = text else {
        return;
    };
    let args = SendArgs {
        adapter: surface.adapter.clone(),
        account_id: surface.account_id.clone(),
        delivery_id: Some(delivery),
        surface: surface.surface.clone(),
        actor_id: surface.actor_id.clone(),
        text,
        reply_to_id: surface.reply_to_id.clone(),
        media: Vec::new(),
        also: None,
    };
    tokio::spawn(deliver(k.db.clone(), k.router.clone(), run_id, args));
}

/// Keeps an answer in the outbox, then posts it.
async fn deliver(db: Db, router: Arc<Router>, run_id: String, args: SendArgs) {
    let (r, a) = (run_id.clone(), args.clone());
    if let Err(e) = db.call(move |c| store::outbox_put(c, &r, &a)).await {
        tracing::error!(run = %run_id, error = %e, "keeping an answer in the outbox");
    }
    post(&db, &router, &run_id, args).await;
}

/// The answers waiting for an adapter account that reports itself
/// connected, posted oldest first.
async fn flush_outbox(db: Db, router: Arc<Router>, adapter: String, account_id: String) {
    let (ad, ac) = (adapter.clone(), account_id.clone());
    let waiting = match db.call(move |c| store::outbox_of(c, &ad, &ac)).await {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(%adapter, error = %e, "reading the outbox");
            return;
        }
    };
    if !waiting.is_empty() {
        tracing::info!(%adapter, account = %account_id, answers = waiting.len(), "posting the answers kept while the adapter was away");
    }
    for (run_id, args) in waiting {
        post(&db, &router, &run_id, args).await;
    }
}

/// Why an answer was not posted.
#[derive(Debug)]
enum PostFailure {
    /// No adapter is connected (or it went away): kept for its return.
    Away(String),
    /// The adapter says a retry of the same delivery is safe.
    Retry(String),
    /// Refused, or timed out (the platform may have taken it): not again.
    Final(String),
}

/// Posts an outbox answer: again after a backoff while the adapter says a
/// retry is safe; it leaves the outbox once posted or refused for good and
/// stays while the adapter is away (or still failing), for
/// [`flush_outbox`]. A repeat is harmless: the adapter posts one
/// `deliveryId` once.
async fn post(db: &Db, router: &Arc<Router>, run_id: &str, args: SendArgs) {
    let delivery_id = args.delivery_id.clone().unwrap_or_default();
    let attempt = || {
        let (router, args) = (router.clone(), args.clone());
        async move {
            match forward_send(&router, Origin::Kernel(run_id), args).await {
                Ok(SendResult::Sent(_)) => Ok(()),
                Ok(SendResult::Failed(f)) if f.retryable == Some(true) => {
                    Err(PostFailure::Retry(f.error))
                }
                Ok(SendResult::Failed(f)) => Err(PostFailure::Final(f.error)),
                Err(KernelError::Unavailable(why)) => Err(PostFailure::Away(why)),
                Err(e) => Err(PostFailure::Final(e.to_string())),
            }
        }
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(10))
        .with_max_times(DELIVERY_ATTEMPTS - 1);
    let sent = attempt
        .retry(backoff)
        .when(|e| matches!(e, PostFailure::Retry(_)))
        .await;
    let keep = match sent {
        Ok(()) => {
            tracing::debug!(run = %run_id, adapter = %args.adapter, "answer posted");
            None
        }
        Err(PostFailure::Away(why) | PostFailure::Retry(why)) => {
            tracing::info!(run = %run_id, adapter = %args.adapter, reason = %why,
                           "an answer waits in the outbox for its adapter");
            Some(why)
        }
        Err(PostFailure::Final(why)) => {
            tracing::warn!(run = %run_id, adapter = %args.adapter, surface = %args.surface.id,
                           error = %why, "an answer could not be posted to its chat surface");
            None
        }
    };
    let settled = db
        .call(move |c| match keep {
            Some(why) => store::outbox_failed(c, &delivery_id, &why),
            None => store::outbox_remove(c, &delivery_id),
        })
        .await;
    if let Err(e) = settled {
        tracing::error!(run = %run_id, error = %e, "updating the outbox");
    }
}

/// What a chat shows for an approval request.
fn approval_prompt(payload: &Value) -> String {
    let tool = payload["toolName"].as_str().unwrap_or("a tool");
    let call = payload["syscall"].as_str().unwrap_or("a call");
    format!(
        "Approval needed: {tool} ({call}) {}\nReply \"approve\" or \"deny\".",
        summarize(&payload["args"])
    )
}

/// A call's arguments in a line: its path or command, else its JSON, cut.
fn summarize(args: &Value) -> String {
    for key in ["path", "input", "command", "code"] {
        if let Some(v) = args[key].as_str() {
            return cut(v, 200);
        }
    }
    cut(&args.to_string(), 200)
}

fn cut(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_owned(),
    }
}

// ---- arguments and answers --------------------------------------------

async fn record_status(
    k: &Arc<Kernel>,
    adapter: &str,
    status: AccountStatus,
    owner_uid: i64,
) -> Result<(), KernelError> {
    let adapter = adapter.to_owned();
    k.db.call(move |c| store::put_status(c, &adapter, &status, owner_uid))
        .await
}

/// Refuses everyone but a service socket, and a service speaking for
/// another adapter than its `client.channel`; the adapter's name.
fn service_adapter(s: &Session, call: &str, raw: &str) -> Result<String, KernelError> {
    if s.role != Role::Service {
        return Err(KernelError::PermissionDenied(format!(
            "{call} (service role only)"
        )));
    }
    let name = adapter_arg(call, raw)?;
    match &s.channel {
        Some(c) if *c == name => Ok(name),
        c => Err(KernelError::PermissionDenied(format!(
            "{call} for adapter {name}: this connection is adapter {}",
            c.as_deref().unwrap_or("(none)")
        ))),
    }
}

/// `sys.link*` are a person's acts: user sockets only, not services or
/// agents.
fn user_only(s: &Session, call: &str) -> Result<(), KernelError> {
    if s.role != Role::User || s.is_process() {
        return Err(KernelError::PermissionDenied(format!(
            "{call} (user role only)"
        )));
    }
    Ok(())
}

/// Whose rows a listing shows: the caller's own (another uid: root
/// only); root without a uid: everyone's (`None`).
fn own_or_root(s: &Session, call: &str, uid: Option<i64>) -> Result<Option<i64>, KernelError> {
    let me = s.identity.uid;
    match uid {
        Some(u) if u != me && !s.identity.is_root() => Err(KernelError::PermissionDenied(format!(
            "{call} of uid {u} (only your own)"
        ))),
        Some(u) => Ok(Some(u)),
        None if s.identity.is_root() => Ok(None),
        None => Ok(Some(me)),
    }
}

fn surface_key(
    call: &str,
    adapter: &str,
    account_id: &str,
    actor_id: &str,
    surface: &Surface,
) -> Result<SurfaceKey, KernelError> {
    let actor = actor_key(call, adapter, account_id, actor_id)?;
    surface_arg(call, "surface", surface)?;
    Ok(SurfaceKey {
        actor,
        kind: surface.kind,
        surface_id: surface.id.clone(),
        thread_id: surface.thread_id.clone().unwrap_or_default(),
    })
}

fn adapter_arg(call: &str, raw: &str) -> Result<String, KernelError> {
    let name = raw.trim().to_lowercase();
    if !valid_adapter_name(&name) {
        return Err(KernelError::InvalidArgs {
            call: call.to_owned(),
            reason: format!(
                "adapter: '{}' is not an adapter name (letters, digits, '-' and '_', at most 64)",
                cut(raw, 80)
            ),
        });
    }
    Ok(name)
}

fn id_arg(call: &str, field: &str, v: &str) -> Result<(), KernelError> {
    let reason = if v.trim().is_empty() {
        "must not be empty".to_owned()
    } else if v.len() > MAX_ID_BYTES {
        format!("{} bytes, at most {MAX_ID_BYTES}", v.len())
    } else {
        return Ok(());
    };
    Err(KernelError::InvalidArgs {
        call: call.to_owned(),
        reason: format!("{field}: {reason}"),
    })
}

fn surface_arg(call: &str, field: &str, s: &Surface) -> Result<(), KernelError> {
    id_arg(call, &format!("{field}.id"), &s.id)?;
    if let Some(t) = &s.thread_id {
        id_arg(call, &format!("{field}.threadId"), t)?;
    }
    Ok(())
}

fn text_arg(call: &str, field: &str, text: &str) -> Result<(), KernelError> {
    if text.len() > MAX_MESSAGE_BYTES {
        return Err(KernelError::InvalidArgs {
            call: call.to_owned(),
            reason: format!(
                "{field}: {} bytes, the limit is {MAX_MESSAGE_BYTES}",
                text.len()
            ),
        });
    }
    Ok(())
}

fn actor_key(
    call: &str,
    adapter: &str,
    account_id: &str,
    actor_id: &str,
) -> Result<ActorKey, KernelError> {
    let adapter = adapter_arg(call, adapter)?;
    id_arg(call, "accountId", account_id)?;
    id_arg(call, "actorId", actor_id)?;
    Ok(ActorKey {
        adapter,
        account_id: account_id.to_owned(),
        actor_id: actor_id.to_owned(),
    })
}

fn to_args<T: Serialize>(a: &T) -> Result<Map<String, Value>, KernelError> {
    match serde_json::to_value(a) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Ok(Map::new()),
        Err(e) => Err(KernelError::internal("encoding adapter arguments", e)),
    }
}

/// Forwards `call` with `args` to adapter `adapter`'s service connection
/// and reads its answer as the call's result type.
async fn forward<A: Serialize, R: DeserializeOwned>(
    router: &Arc<Router>,
    origin: Origin<'_>,
    call: &str,
    adapter: &str,
    args: &A,
) -> Result<R, KernelError> {
    let answer = routing::route_to_adapter(router, origin, call, adapter, to_args(args)?).await?;
    parse_answer(adapter, call, answer)
}

/// An account's state as a connect or disconnect answer leaves it: only
/// the flags, the rest unknown.
fn bare_status(account_id: &str, connected: bool, authenticated: bool) -> AccountStatus {
    AccountStatus {
        account_id: account_id.to_owned(),
        connected,
        authenticated,
        mode: None,
        last_activity: None,
        error: None,
        extra: None,
    }
}

/// The adapter's answer as the call's result type, or 502 naming it.
fn parse_answer<T: DeserializeOwned>(
    adapter: &str,
    call: &str,
    answer: Value,
) -> Result<T, KernelError> {
    serde_json::from_value(answer.clone()).map_err(|e| KernelError::BadDeviceResponse {
        device: format!("adapter:{adapter}"),
        reason: format!("{call} answer {}: {e}", cut(&answer.to_string(), 200)),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn only_the_whole_word_approves_or_denies() {
        assert_eq!(approval_word(" Approve! "), Some(true));
        assert_eq!(approval_word("deny."), Some(false));
        assert_eq!(approval_word("please approve"), None);
        assert_eq!(approval_word(""), None);
    }

    #[test]
    fn a_room_message_names_its_speaker_and_media_become_lines() {
        let m: InboundMessage = serde_json::from_value(json!({
            "messageId": "$1", "surface": {"kind": "group", "id": "!r"},
            "actor": {"id": "@a:x", "name": "Ann"}, "text": "hi",
            "media": [{"type": "image", "mimeType": "image/png", "filename": "p.png"}]
        }))
        .unwrap();
        assert_eq!(render(&m), "[Ann] hi\n[image image/png p.png]");
    }
}
