//! The Matrix side: logging in as the bot, the sync loop that turns room
//! messages into `adapter.inbound` arguments, and posting what the kernel
//! sends.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};
use matrix_sdk::config::{RequestConfig, SyncSettings};
use matrix_sdk::deserialized_responses::TimelineEvent;
use matrix_sdk::ruma::api::error::ErrorKind;
use matrix_sdk::ruma::events::relation::{InReplyTo, Thread};
use matrix_sdk::ruma::events::room::message::sanitize::remove_plain_reply_fallback;
use matrix_sdk::ruma::events::room::message::{
    MessageType, OriginalSyncRoomMessageEvent, Relation, RoomMessageEventContent,
    SyncRoomMessageEvent,
};
use matrix_sdk::ruma::events::{AnySyncMessageLikeEvent, AnySyncTimelineEvent};
use matrix_sdk::ruma::{EventId, OwnedTransactionId, OwnedUserId, RoomId};
use matrix_sdk::sync::SyncResponse;
use matrix_sdk::{Client, Room, RoomMemberships, RoomState};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use gsv_protocol::adapter::{
    AccountStatus, Actor, DeliveryState, InboundArgs, InboundMessage, InboundResult, SendArgs,
    SendResult, Sent, Surface, SurfaceKind,
};

use crate::state::{Saved, StateDir};
use crate::{ADAPTER, AdapterError, Config};

/// The deadline of every Matrix request but the sync long-poll (which
/// gets this on top of its own wait).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The device name the bot's logins show in other clients.
const DEVICE_NAME: &str = "gsv matrix adapter";

/// The logged-in bot. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MatrixBot {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    user_id: OwnedUserId,
    homeserver: String,
    state: Option<StateDir>,
    /// The saved sync position: where the catch-up sync starts.
    saved: Mutex<Option<Saved>>,
}

/// A failed Matrix call: worth retrying, or not until someone acts.
#[derive(Debug, thiserror::Error)]
enum MatrixFailure {
    #[error("{0}")]
    Transient(String),
    #[error("{0}")]
    Refused(String),
}

impl MatrixFailure {
    fn from_sdk(e: &matrix_sdk::Error) -> Self {
        match e.client_api_error_kind() {
            Some(ErrorKind::LimitExceeded { .. }) | None => MatrixFailure::Transient(e.to_string()),
            Some(_) => MatrixFailure::Refused(e.to_string()),
        }
    }

    fn from_http(e: &matrix_sdk::HttpError) -> Self {
        match e.client_api_error_kind() {
            Some(ErrorKind::LimitExceeded { .. }) | None => MatrixFailure::Transient(e.to_string()),
            Some(_) => MatrixFailure::Refused(e.to_string()),
        }
    }
}

impl MatrixBot {
    /// Logs in: with the saved session when `--state` has one for this
    /// homeserver and user and it is still valid, else with the password.
    /// Unreachable homeservers are retried with backoff; a refused login
    /// is an error.
    pub async fn login(config: &Config) -> Result<MatrixBot, AdapterError> {
        let user_id =
            OwnedUserId::try_from(config.user.as_str()).map_err(|e| AdapterError::BadUser {
                user: config.user.clone(),
                reason: e.to_string(),
            })?;
        let homeserver =
            url::Url::parse(&config.homeserver).map_err(|e| AdapterError::BadHomeserver {
                url: config.homeserver.clone(),
                reason: e.to_string(),
            })?;
        let state = match &config.state_dir {
            Some(dir) => Some(StateDir::open(dir).map_err(|source| AdapterError::State {
                path: dir.clone(),
                source,
            })?),
            None => None,
        };
        let saved = state
            .as_ref()
            .and_then(StateDir::load)
            .filter(|s| s.homeserver == config.homeserver && s.user == user_id.as_str());
        let mut delays = backoff(config);
        loop {
            match Self::try_login(config, &homeserver, &user_id, saved.clone()).await {
                Ok((client, session)) => {
                    let sync_token = saved.as_ref().and_then(|s| s.sync_token.clone());
                    let saved = Saved {
                        homeserver: config.homeserver.clone(),
                        user: user_id.to_string(),
                        session,
                        sync_token,
                    };
                    let bot = MatrixBot {
                        inner: Arc::new(Inner {
                            client,
                            user_id,
                            homeserver: config.homeserver.clone(),
                            state,
                            saved: Mutex::new(Some(saved)),
                        }),
                    };
                    bot.persist();
                    tracing::info!(user = %bot.inner.user_id, homeserver = %bot.inner.homeserver, "logged in to Matrix");
                    return Ok(bot);
                }
                Err(MatrixFailure::Refused(reason)) => {
                    return Err(AdapterError::LoginRefused {
                        user: config.user.clone(),
                        reason,
                    });
                }
                Err(MatrixFailure::Transient(e)) => {
                    let wait = delays.next().unwrap_or(config.max_backoff);
                    tracing::warn!(error = %e, ?wait, homeserver = %config.homeserver, "Matrix login failed; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    async fn try_login(
        config: &Config,
        homeserver: &url::Url,
        user_id: &OwnedUserId,
        saved: Option<Saved>,
    ) -> Result<(Client, matrix_sdk::authentication::matrix::MatrixSession), MatrixFailure> {
        let build = || async {
            Client::builder()
                .homeserver_url(homeserver.as_str())
                .request_config(RequestConfig::new().timeout(REQUEST_TIMEOUT).retry_limit(2))
                .build()
                .await
                .map_err(|e| MatrixFailure::Transient(e.to_string()))
        };
        if let Some(saved) = saved {
            let client = build().await?;
            let session = saved.session.clone();
            if client.restore_session(session.clone()).await.is_ok() {
                match deadline(client.whoami()).await {
                    Ok(Ok(_)) => return Ok((client, session)),
                    Ok(Err(e)) => match MatrixFailure::from_http(&e) {
                        // A revoked or expired token: log in afresh.
                        MatrixFailure::Refused(reason) => {
                            tracing::info!(%reason, "the saved Matrix session is no longer valid");
                        }
                        t => return Err(t),
                    },
                    Err(e) => return Err(e),
                }
            }
        }
        let client = build().await?;
        let login = client
            .matrix_auth()
            .login_username(user_id, &config.password)
            .initial_device_display_name(DEVICE_NAME)
            .send();
        let response = deadline(login)
            .await?
            .map_err(|e| MatrixFailure::from_sdk(&e))?;
        Ok((client, (&response).into()))
    }

    /// The bot's Matrix id, which is also its adapter account id.
    pub fn account_id(&self) -> &str {
        self.inner.user_id.as_str()
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    pub fn status(&self, connected: bool, error: Option<String>) -> AccountStatus {
        crate::status(self.account_id(), connected, error)
    }

    /// Writes the session and sync position to `--state`, if given.
    fn persist(&self) {
        let Some(state) = &self.inner.state else {
            return;
        };
        let saved = self.inner.saved.lock().unwrap().clone();
        if let Some(saved) = saved
            && let Err(e) = state.save(&saved)
        {
            tracing::warn!(path = %state.path().display(), error = %e, "cannot save the Matrix session");
        }
    }

    fn save_sync_token(&self, token: &str) {
        if let Some(s) = self.inner.saved.lock().unwrap().as_mut() {
            s.sync_token = Some(token.to_owned());
        }
        self.persist();
    }

    /// Syncs until `stop`: joins every room the bot is invited to and
    /// queues each new text message for the kernel. The first sync only
    /// learns the rooms; the next one starts from the saved position (so
    /// what arrived while the adapter was down is relayed), then each from
    /// the last. While `enabled` is false (`adapter.disconnect`) it waits.
    pub(crate) async fn sync_loop(
        &self,
        config: &Config,
        inbound: mpsc::Sender<InboundArgs>,
        status: watch::Sender<AccountStatus>,
        mut enabled: watch::Receiver<bool>,
        stop: CancellationToken,
    ) {
        let mut catch_up = self
            .inner
            .saved
            .lock()
            .unwrap()
            .as_ref()
            .and_then(|s| s.sync_token.clone());
        let mut next: Option<String> = None;
        let mut delays = backoff(config);
        let mut healthy = false;
        loop {
            if !*enabled.borrow() {
                status.send_replace(self.status(false, None));
                healthy = false;
                tokio::select! {
                    () = stop.cancelled() => return,
                    r = enabled.wait_for(|on| *on) => if r.is_err() { return },
                }
            }
            let primed = next.is_some();
            let catching_up = primed && catch_up.is_some();
            let (since, wait) = match (&next, &catch_up) {
                (None, _) => (None, Duration::ZERO),
                (Some(_), Some(saved)) => (Some(saved.clone()), Duration::ZERO),
                (Some(n), None) => (Some(n.clone()), config.sync_timeout),
            };
            let relay = since.is_some();
            let mut settings = SyncSettings::new().timeout(wait);
            if let Some(t) = since {
                settings = settings.token(t);
            }
            let r = tokio::select! {
                () = stop.cancelled() => return,
                r = tokio::time::timeout(wait + REQUEST_TIMEOUT, self.inner.client.sync_once(settings)) => r,
            };
            let response = match r {
                Ok(Ok(resp)) => resp,
                Ok(Err(e)) => {
                    self.sync_failed(config, &status, &mut delays, &stop, e.to_string())
                        .await;
                    healthy = false;
                    continue;
                }
                Err(_) => {
                    self.sync_failed(config, &status, &mut delays, &stop, "sync timed out".into())
                        .await;
                    healthy = false;
                    continue;
                }
            };
            tracing::debug!(
                joined = response.rooms.joined.len(),
                invited = response.rooms.invited.len(),
                relay,
                "synced"
            );
            self.join_invites(&response).await;
            if relay && !self.relay(&response, &inbound, &stop).await {
                return;
            }
            if catching_up {
                catch_up = None;
            }
            // The first, unrelayed sync's position is saved only when there
            // is no catch-up left to do from the older one.
            if relay || catch_up.is_none() {
                self.save_sync_token(&response.next_batch);
            }
            next = Some(response.next_batch);
            if !healthy && (primed || catch_up.is_none()) {
                healthy = true;
                delays = backoff(config);
                status.send_replace(self.status(true, None));
                tracing::info!(user = %self.inner.user_id, "Matrix sync running");
            }
        }
    }

    async fn sync_failed(
        &self,
        config: &Config,
        status: &watch::Sender<AccountStatus>,
        delays: &mut impl Iterator<Item = Duration>,
        stop: &CancellationToken,
        error: String,
    ) {
        let wait = delays.next().unwrap_or(config.max_backoff);
        tracing::warn!(%error, ?wait, "Matrix sync failed; retrying");
        status.send_replace(self.status(false, Some(error)));
        tokio::select! {
            () = stop.cancelled() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }

    /// Anyone may DM the bot: the kernel decides what their messages reach
    /// (a link challenge for strangers).
    async fn join_invites(&self, response: &SyncResponse) {
        for room_id in response.rooms.invited.keys() {
            let Some(room) = self.inner.client.get_room(room_id) else {
                continue;
            };
            match deadline(room.join()).await {
                Ok(Ok(())) => tracing::info!(room = %room_id, "joined on invite"),
                Ok(Err(e)) => tracing::warn!(room = %room_id, error = %e, "cannot join"),
                Err(e) => tracing::warn!(room = %room_id, error = %e, "cannot join"),
            }
        }
    }

    /// Queues the text messages of others; false when stopped meanwhile.
    async fn relay(
        &self,
        response: &SyncResponse,
        inbound: &mpsc::Sender<InboundArgs>,
        stop: &CancellationToken,
    ) -> bool {
        for (room_id, update) in &response.rooms.joined {
            let Some(room) = self.inner.client.get_room(room_id) else {
                continue;
            };
            for event in &update.timeline.events {
                let Some(message) = self.to_inbound(&room, event).await else {
                    continue;
                };
                let args = InboundArgs {
                    adapter: ADAPTER.into(),
                    account_id: self.account_id().into(),
                    delivery_id: Some(message.message_id.clone()),
                    message,
                };
                tokio::select! {
                    () = stop.cancelled() => return false,
                    r = inbound.send(args) => if r.is_err() { return false },
                }
            }
        }
        true
    }

    async fn to_inbound(&self, room: &Room, event: &TimelineEvent) -> Option<InboundMessage> {
        let Ok(AnySyncTimelineEvent::MessageLike(AnySyncMessageLikeEvent::RoomMessage(
            SyncRoomMessageEvent::Original(msg),
        ))) = event.raw().deserialize()
        else {
            return None;
        };
        if msg.sender == self.inner.user_id {
            return None;
        }
        let is_dm = room.is_direct().await.unwrap_or(false) || active_members(room).await <= 2;
        let name = match room.get_member_no_sync(&msg.sender).await {
            Ok(Some(m)) => m.display_name().map(str::to_owned),
            _ => None,
        };
        message_to_inbound(&msg, room.room_id(), is_dm, name, &self.inner.user_id)
    }

    /// Posts `args.text` to the room `args.surface.id`: inside the thread
    /// `surface.threadId` and as a reply to `replyToId` when given. The
    /// delivery id is the Matrix transaction id, so a retried delivery
    /// posts once.
    pub async fn send(&self, args: &SendArgs) -> SendResult {
        let delivery_id = args.delivery_id.clone().unwrap_or_default();
        let fail = |error: String, retryable: bool| {
            let mut r = SendResult::failed(error, retryable);
            if let SendResult::Failed(f) = &mut r {
                f.delivery_id = args.delivery_id.clone();
            }
            r
        };
        let room_id = match <&RoomId>::try_from(args.surface.id.as_str()) {
            Ok(r) => r,
            Err(e) => return fail(format!("surface.id {}: {e}", args.surface.id), false),
        };
        let Some(room) = self.inner.client.get_room(room_id) else {
            return fail(format!("the bot is not in room {room_id}"), false);
        };
        if room.state() != RoomState::Joined {
            return fail(format!("the bot is not in room {room_id}"), false);
        }
        let content = match outbound_content(args) {
            Ok(c) => c,
            Err(e) => return fail(e, false),
        };
        let mut send = room.send(content);
        if !delivery_id.is_empty() {
            send = send.with_transaction_id(OwnedTransactionId::from(delivery_id.as_str()));
        }
        match deadline(send.into_future()).await {
            Ok(Ok(r)) => SendResult::sent(Sent {
                adapter: ADAPTER.into(),
                account_id: self.account_id().into(),
                surface_id: args.surface.id.clone(),
                delivery_id,
                message_id: Some(r.response.event_id.to_string()),
                delivery_state: Some(DeliveryState::Sent),
            }),
            // The transaction id makes a retry safe.
            Ok(Err(e)) => fail(
                e.to_string(),
                matches!(MatrixFailure::from_sdk(&e), MatrixFailure::Transient(_)),
            ),
            Err(e) => fail(e.to_string(), true),
        }
    }

    /// Posts what the kernel answered an inbound message with at once (a
    /// link challenge, an "approved"), as a reply to it on its surface.
    pub async fn post_inbound_result(&self, inbound: &InboundArgs, result: &InboundResult) {
        let message = &inbound.message;
        let mut posts = Vec::new();
        if let Some(c) = &result.challenge {
            let id = c
                .delivery_id
                .clone()
                .unwrap_or_else(|| format!("challenge-{}", message.message_id));
            posts.push((id, c.prompt.clone(), None));
        }
        if let Some(r) = &result.reply {
            let id = r
                .delivery_id
                .clone()
                .unwrap_or_else(|| format!("reply-{}", message.message_id));
            posts.push((id, r.text.clone(), r.reply_to_id.clone()));
        }
        for (delivery_id, text, reply_to) in posts {
            let args = SendArgs {
                adapter: ADAPTER.into(),
                account_id: self.account_id().into(),
                delivery_id: Some(delivery_id),
                surface: message.surface.clone(),
                actor_id: message.actor.as_ref().map(|a| a.id.clone()),
                text,
                reply_to_id: reply_to.or_else(|| Some(message.message_id.clone())),
                media: Vec::new(),
                also: None,
            };
            if let SendResult::Failed(f) = self.send(&args).await {
                tracing::warn!(room = %message.surface.id, error = %f.error, "cannot post the kernel's answer");
            }
        }
    }
}

/// Joined and invited members. The sync summary has the counts only
/// with lazy-loaded members; without it the members are all in the store.
async fn active_members(room: &Room) -> u64 {
    match room.active_members_count() {
        0 => room
            .members_no_sync(RoomMemberships::ACTIVE)
            .await
            .map_or(0, |m| m.len() as u64),
        n => n,
    }
}

/// A Matrix text message as the kernel sees it; `None` for what is not
/// relayed (notices, which bots send; edits; media for now).
fn message_to_inbound(
    msg: &OriginalSyncRoomMessageEvent,
    room_id: &RoomId,
    is_dm: bool,
    sender_name: Option<String>,
    bot: &OwnedUserId,
) -> Option<InboundMessage> {
    let body = match &msg.content.msgtype {
        MessageType::Text(t) => t.body.as_str(),
        MessageType::Emote(e) => e.body.as_str(),
        _ => return None,
    };
    let (thread_id, reply_to_id) = match &msg.content.relates_to {
        Some(Relation::Thread(t)) => (
            Some(t.event_id.to_string()),
            // Outside a reply, `m.in_reply_to` in a thread is only the
            // fallback for clients without threads.
            t.in_reply_to
                .as_ref()
                .filter(|_| !t.is_falling_back)
                .map(|r| r.event_id.to_string()),
        ),
        Some(Relation::Reply(r)) => (None, Some(r.in_reply_to.event_id.to_string())),
        Some(Relation::Replacement(_)) => return None,
        _ => (None, None),
    };
    let text = if reply_to_id.is_some() {
        remove_plain_reply_fallback(body)
    } else {
        body
    };
    let kind = match (is_dm, &thread_id) {
        (true, _) => SurfaceKind::Dm,
        (false, Some(_)) => SurfaceKind::Thread,
        (false, None) => SurfaceKind::Group,
    };
    let was_mentioned = msg
        .content
        .mentions
        .as_ref()
        .map(|m| m.user_ids.contains(bot));
    Some(InboundMessage {
        message_id: msg.event_id.to_string(),
        surface: Surface {
            kind,
            id: room_id.to_string(),
            name: None,
            handle: None,
            thread_id,
        },
        actor: Some(Actor {
            id: msg.sender.to_string(),
            name: sender_name,
            handle: None,
        }),
        text: text.to_owned(),
        media: Vec::new(),
        reply_to_id,
        reply_to_text: None,
        timestamp: Some(i64::from(msg.origin_server_ts.0)),
        was_mentioned,
    })
}

/// The event content for an `adapter.send`: plain text, with the thread
/// and reply relations it asks for.
fn outbound_content(args: &SendArgs) -> Result<RoomMessageEventContent, String> {
    let event_id = |what: &str, id: &str| {
        EventId::parse(id).map_err(|e| format!("{what} {id}: not a Matrix event id: {e}"))
    };
    let mut content = RoomMessageEventContent::text_plain(args.text.clone());
    let reply_to = args
        .reply_to_id
        .as_deref()
        .map(|id| event_id("replyToId", id))
        .transpose()?;
    let thread = args
        .surface
        .thread_id
        .as_deref()
        .map(|id| event_id("surface.threadId", id))
        .transpose()?;
    content.relates_to = match (thread, reply_to) {
        (Some(root), Some(reply)) => Some(Relation::Thread(Thread::reply(root, reply))),
        (Some(root), None) => Some(Relation::Thread(Thread::plain(root.clone(), root))),
        (None, Some(reply)) => Some(Relation::Reply(
            matrix_sdk::ruma::events::relation::Reply::new(InReplyTo::new(reply)),
        )),
        (None, None) => None,
    };
    Ok(content)
}

/// `f` within [`REQUEST_TIMEOUT`].
async fn deadline<F: std::future::IntoFuture>(f: F) -> Result<F::Output, MatrixFailure> {
    tokio::time::timeout(REQUEST_TIMEOUT, f.into_future())
        .await
        .map_err(|_| MatrixFailure::Transient(format!("no answer within {REQUEST_TIMEOUT:?}")))
}

fn backoff(config: &Config) -> impl Iterator<Item = Duration> {
    ExponentialBuilder::default()
        .with_min_delay(config.min_backoff)
        .with_max_delay(config.max_backoff)
        .with_jitter()
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use matrix_sdk::ruma::serde::Raw;
    use serde_json::json;

    use super::*;

    fn event(content: serde_json::Value) -> OriginalSyncRoomMessageEvent {
        let raw = json!({
            "type": "m.room.message",
            "event_id": "$ev:x",
            "sender": "@alice:x",
            "origin_server_ts": 1_700_000_000_000_u64,
            "content": content,
        });
        let ev: SyncRoomMessageEvent = Raw::new(&raw)
            .unwrap()
            .cast_unchecked()
            .deserialize()
            .unwrap();
        ev.as_original().unwrap().clone()
    }

    fn inbound(content: serde_json::Value, is_dm: bool) -> Option<InboundMessage> {
        let bot = OwnedUserId::try_from("@bot:x").unwrap();
        let room = <&RoomId>::try_from("!r:x").unwrap();
        message_to_inbound(&event(content), room, is_dm, None, &bot)
    }

    #[test]
    fn a_thread_reply_keeps_its_root_and_the_replied_message() {
        let m = inbound(
            json!({"msgtype": "m.text", "body": "hi",
                   "m.relates_to": {"rel_type": "m.thread", "event_id": "$root:x",
                                    "m.in_reply_to": {"event_id": "$prev:x"}}}),
            false,
        )
        .unwrap();
        assert_eq!(m.surface.kind, SurfaceKind::Thread);
        assert_eq!(m.surface.thread_id.as_deref(), Some("$root:x"));
        assert_eq!(m.reply_to_id.as_deref(), Some("$prev:x"));
        let fallback = inbound(
            json!({"msgtype": "m.text", "body": "hi",
                   "m.relates_to": {"rel_type": "m.thread", "event_id": "$root:x",
                                    "is_falling_back": true,
                                    "m.in_reply_to": {"event_id": "$prev:x"}}}),
            true,
        )
        .unwrap();
        assert_eq!(fallback.surface.kind, SurfaceKind::Dm);
        assert_eq!(fallback.reply_to_id, None);
    }

    #[test]
    fn notices_and_edits_are_not_relayed() {
        assert!(inbound(json!({"msgtype": "m.notice", "body": "bot"}), true).is_none());
        assert!(
            inbound(
                json!({"msgtype": "m.text", "body": "* x",
                       "m.new_content": {"msgtype": "m.text", "body": "x"},
                       "m.relates_to": {"rel_type": "m.replace", "event_id": "$e:x"}}),
                true
            )
            .is_none()
        );
    }

    #[test]
    fn an_outbound_message_in_a_thread_replies_inside_it() {
        let args = SendArgs {
            adapter: ADAPTER.into(),
            account_id: "@bot:x".into(),
            delivery_id: Some("d".into()),
            surface: Surface {
                kind: SurfaceKind::Dm,
                id: "!r:x".into(),
                name: None,
                handle: None,
                thread_id: Some("$root:x".into()),
            },
            actor_id: None,
            text: "answer".into(),
            reply_to_id: Some("$q:x".into()),
            media: Vec::new(),
            also: None,
        };
        let v = serde_json::to_value(outbound_content(&args).unwrap()).unwrap();
        assert_eq!(v["m.relates_to"]["rel_type"], "m.thread");
        assert_eq!(v["m.relates_to"]["event_id"], "$root:x");
        assert_eq!(v["m.relates_to"]["m.in_reply_to"]["event_id"], "$q:x");
        let bad = SendArgs {
            reply_to_id: Some("nope".into()),
            ..args
        };
        assert!(
            outbound_content(&bad)
                .unwrap_err()
                .contains("replyToId nope")
        );
    }
}
