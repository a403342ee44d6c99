//! `adapter.*`: the plane between the kernel and chat adapters (seed 000,
//! the reference's `packages/gsv/src/protocol/adapters.ts` and
//! `syscalls/adapter.ts`).
//!
//! An adapter is a process connected as `role:"service"` with
//! `client.channel` naming its platform (`matrix`, …). Both directions use
//! these types:
//!
//! - a user calls `adapter.connect|disconnect|send|status`; the kernel
//!   forwards the same arguments to the adapter's connection as a request
//!   frame of the same call, and the adapter answers with the call's result
//!   type (the kernel fills in what the adapter left out, such as
//!   `deliveryId`);
//! - the adapter calls `adapter.inbound` for each message it receives and
//!   `adapter.state.update` when its account's state changes.
//!
//! A link challenge or an immediate reply in an [`InboundResult`] is posted
//! back to the message's surface by the adapter itself.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Done, OpResult};

pub const CONNECT: &str = "adapter.connect";
pub const DISCONNECT: &str = "adapter.disconnect";
pub const SEND: &str = "adapter.send";
pub const STATUS: &str = "adapter.status";
pub const INBOUND: &str = "adapter.inbound";
pub const STATE_UPDATE: &str = "adapter.state.update";

/// Where a message was said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SurfaceKind {
    /// A direct conversation between the actor and the adapter's account.
    Dm,
    /// A room with several members.
    Group,
    /// A broadcast channel.
    Channel,
    /// A thread inside a group or channel.
    Thread,
}

impl SurfaceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SurfaceKind::Dm => "dm",
            SurfaceKind::Group => "group",
            SurfaceKind::Channel => "channel",
            SurfaceKind::Thread => "thread",
        }
    }
}

/// A chat surface: a DM, a group, a channel or a thread.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Surface {
    pub kind: SurfaceKind,
    /// The platform's id of the conversation (a Matrix room id).
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
    /// The thread inside the conversation (a Matrix thread root event id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<String>,
}

/// Who said it, as the platform names them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct Actor {
    /// Stable platform id (a Matrix user id, `@alice:server`).
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handle: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum MediaKind {
    Image,
    Audio,
    Video,
    Document,
}

/// Where a media item's bytes sit in the frame's binary body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct MediaBody {
    pub offset: u64,
    pub length: u64,
}

/// A media attachment of a message.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Media {
    #[serde(rename = "type")]
    pub kind: MediaKind,
    pub mime_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<MediaBody>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcription: Option<String>,
}

/// One message an adapter received.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundMessage {
    /// The platform's id of the message (a Matrix event id).
    pub message_id: String,
    pub surface: Surface,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<Actor>,
    pub text: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<Media>,
    /// The message this one replies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_text: Option<String>,
    /// Milliseconds since the Unix epoch, by the platform's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was_mentioned: Option<bool>,
}

/// `adapter.inbound` (service role only).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundArgs {
    pub adapter: String,
    pub account_id: String,
    /// Stable account-scoped id of the platform event, for idempotency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    pub message: InboundMessage,
}

/// The process a message was delivered to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Delivered {
    pub uid: i64,
    pub pid: String,
    pub run_id: String,
    /// Whether the message waits behind a running turn.
    pub queued: bool,
}

/// Text the adapter posts back at once (e.g. "approved").
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundReply {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
}

/// A link challenge for an unlinked DM: the adapter posts `prompt`; the
/// person runs `gsv auth link CODE` as a kernel user.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkChallenge {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    pub code: String,
    pub prompt: String,
    /// Milliseconds since the Unix epoch.
    pub expires_at: i64,
}

/// Set when this platform event was already claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Replayed {
    InProgress,
    Completed,
}

/// The result of `adapter.inbound`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundResult {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered: Option<Delivered>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<InboundReply>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<LinkChallenge>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed: Option<Replayed>,
    /// Why the message reached no process (e.g. an unlinked group actor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One adapter account's live state.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccountStatus {
    pub account_id: String,
    pub connected: bool,
    pub authenticated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Map<String, Value>>,
}

/// `adapter.state.update` (service role only).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateUpdateArgs {
    pub adapter: String,
    pub account_id: String,
    pub status: AccountStatus,
}

/// The result of `adapter.state.update`: always `{ok:true}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct StateUpdateResult {
    pub ok: bool,
}

/// `adapter.connect`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectArgs {
    pub adapter: String,
    pub account_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ChallengeFormat {
    Raw,
    DataUrl,
}

/// What the platform wants before the account is authenticated (a QR
/// code to scan, …). Never logged: `data` may be a credential.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConnectChallenge {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<ChallengeFormat>,
    /// Milliseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Connected {
    pub adapter: String,
    pub account_id: String,
    pub connected: bool,
    pub authenticated: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<ConnectChallenge>,
}

/// A failed connect, which may still carry a challenge.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct ConnectFailure {
    pub ok: bool,
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<ConnectChallenge>,
}

/// The result of `adapter.connect`: `{ok:true, ...Connected}` or
/// `{ok:false, error, challenge?}`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ConnectResult {
    Connected(Done<Connected>),
    Failed(ConnectFailure),
}

impl ConnectResult {
    pub fn connected(result: Connected) -> Self {
        ConnectResult::Connected(Done { ok: true, result })
    }

    pub fn failed(error: impl Into<String>) -> Self {
        ConnectResult::Failed(ConnectFailure {
            ok: false,
            error: error.into(),
            challenge: None,
        })
    }
}

/// `adapter.disconnect`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisconnectArgs {
    pub adapter: String,
    pub account_id: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disconnected {
    pub adapter: String,
    pub account_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The result of `adapter.disconnect`.
pub type DisconnectResult = OpResult<Disconnected>;

/// `adapter.send`: from a user to the kernel, and forwarded as is (with
/// `deliveryId` always set) from the kernel to the adapter.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendArgs {
    pub adapter: String,
    pub account_id: String,
    /// Stable idempotency key of one logical delivery; the kernel makes one
    /// when the caller gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    /// Where to post; `surface.threadId` posts inside that thread.
    pub surface: Surface,
    /// The platform actor the answer is for (reply addressing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<String>,
    pub text: String,
    /// Post as a reply to this message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub media: Vec<Media>,
    /// The caller means to duplicate the running turn's automatic reply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub also: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    Sent,
    Deduplicated,
    /// The platform may have accepted it; retrying could duplicate it.
    Ambiguous,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Sent {
    pub adapter: String,
    pub account_id: String,
    pub surface_id: String,
    /// Empty only in an adapter's answer; the kernel's result always has it.
    #[serde(default)]
    pub delivery_id: String,
    /// The platform's id of the posted message (a Matrix event id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_state: Option<DeliveryState>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendFailure {
    pub ok: bool,
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivery_id: Option<String>,
    /// True only when retrying the same `deliveryId` is safe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
}

/// The result of `adapter.send`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum SendResult {
    Sent(Done<Sent>),
    Failed(SendFailure),
}

impl SendResult {
    pub fn sent(result: Sent) -> Self {
        SendResult::Sent(Done { ok: true, result })
    }

    pub fn failed(error: impl Into<String>, retryable: bool) -> Self {
        SendResult::Failed(SendFailure {
            ok: false,
            error: error.into(),
            delivery_id: None,
            retryable: Some(retryable),
        })
    }
}

/// `adapter.status`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatusArgs {
    pub adapter: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
}

/// The result of `adapter.status`, and the payload of the `adapter.status`
/// signal.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize, JsonSchema)]
pub struct StatusResult {
    pub adapter: String,
    pub accounts: Vec<AccountStatus>,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_inbound_dm_in_a_thread_reads_as_the_reference_writes_it() {
        let wire = json!({
            "adapter": "matrix",
            "accountId": "@bot:example.org",
            "deliveryId": "$ev1",
            "message": {
                "messageId": "$ev1",
                "surface": {"kind": "dm", "id": "!room:example.org", "threadId": "$root"},
                "actor": {"id": "@alice:example.org", "name": "Alice"},
                "text": "hello",
                "replyToId": "$ev0",
                "timestamp": 1_700_000_000_000_i64
            }
        });
        let args: InboundArgs = serde_json::from_value(wire.clone()).unwrap();
        assert_eq!(args.message.surface.kind, SurfaceKind::Dm);
        assert_eq!(args.message.surface.thread_id.as_deref(), Some("$root"));
        assert_eq!(args.message.reply_to_id.as_deref(), Some("$ev0"));
        assert_eq!(serde_json::to_value(&args).unwrap(), wire);
    }

    #[test]
    fn an_unknown_surface_kind_is_refused() {
        let bad = json!({"kind": "forum", "id": "x"});
        let e = serde_json::from_value::<Surface>(bad).unwrap_err();
        assert!(e.to_string().contains("forum"), "{e}");
    }

    #[test]
    fn send_and_connect_results_are_ok_beside_their_fields_or_ok_false() {
        let sent = SendResult::sent(Sent {
            adapter: "matrix".into(),
            account_id: "@bot:x".into(),
            surface_id: "!r:x".into(),
            delivery_id: "d1".into(),
            message_id: Some("$e".into()),
            delivery_state: Some(DeliveryState::Sent),
        });
        let v = serde_json::to_value(&sent).unwrap();
        assert_eq!(
            v,
            json!({"ok": true, "adapter": "matrix", "accountId": "@bot:x",
                   "surfaceId": "!r:x", "deliveryId": "d1", "messageId": "$e",
                   "deliveryState": "sent"})
        );
        assert_eq!(serde_json::from_value::<SendResult>(v).unwrap(), sent);
        let failed: SendResult =
            serde_json::from_value(json!({"ok": false, "error": "gone", "retryable": true}))
                .unwrap();
        assert!(matches!(failed, SendResult::Failed(f) if f.retryable == Some(true)));
        let refused: ConnectResult =
            serde_json::from_value(json!({"ok": false, "error": "bad password"})).unwrap();
        assert_eq!(refused, ConnectResult::failed("bad password"));
    }
}
