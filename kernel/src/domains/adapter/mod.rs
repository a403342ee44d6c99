//! Adapters and identity links (seed 000 `adapter.*`, `sys.link*`; seed
//! 001 "Adapter Routing"): chat platforms reach users' agents through an
//! adapter process connected as `role:"service"` with `client.channel`
//! naming the platform. This half is the state: the tables
//! (`identity_links`, `link_challenges`, `surface_routes`,
//! `adapter_status`, the ingress-receipt ledger
//! `adapter_ingress_receipts` and the answers waiting for their adapter,
//! `adapter_outbox`; [`store`]) and the route a run started from a chat
//! surface answers along ([`SurfaceRoute`]). The calls, the forwarding to
//! the adapter's connection and the delivery of answers are [`calls`].

pub mod calls;
pub mod store;

use std::time::Duration;

use gsv_protocol::adapter::Surface;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::db::Migration;

/// How long a link code may be consumed (seed: 10 minutes).
pub const LINK_CODE_TTL: Duration = Duration::from_secs(10 * 60);
/// The timer kind that removes an expired link code.
pub const TIMER_KIND: &str = "link_challenge";
/// The largest text of one inbound message, in bytes (a Matrix event is
/// at most 64 KiB in all).
pub const MAX_MESSAGE_BYTES: usize = 64 * 1024;
/// The longest account, actor, surface or message id, in bytes.
pub const MAX_ID_BYTES: usize = 512;
/// The longest adapter name.
pub const MAX_ADAPTER_NAME: usize = 64;
/// How long an inbound message's receipt is kept: a platform redelivers
/// within minutes or hours, never after a week.
pub const RECEIPT_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Answers kept for an adapter that is away, per adapter account, at most;
/// the oldest give way.
pub const OUTBOX_LIMIT: i64 = 1000;

/// Whether `name` is a well-formed adapter name (already lowercased):
/// `[a-z0-9][a-z0-9_-]*`, at most [`MAX_ADAPTER_NAME`].
pub fn valid_adapter_name(name: &str) -> bool {
    let mut cs = name.chars();
    name.len() <= MAX_ADAPTER_NAME
        && cs
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && cs.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

/// Where a run started by a chat message answers: the adapter account,
/// the surface (thread included), the actor and the message to reply to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SurfaceRoute {
    pub adapter: String,
    pub account_id: String,
    pub surface: Surface,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to_id: Option<String>,
}

impl SurfaceRoute {
    /// The `origin` a stored message carries (so a queued message's run
    /// answers where it came from).
    pub fn to_origin(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The route a stored message's `origin` names, if it names one.
    pub fn from_origin(origin: &Value) -> Option<SurfaceRoute> {
        origin.get("adapter")?;
        serde_json::from_value(origin.clone()).ok()
    }
}

/// This domain's tables, listed in `domains::MIGRATIONS`; never edit a
/// released migration, add one. Shapes as the reference's (reference
/// gsv-kernel.md §2.3); the ingress-receipt ledger is keyed by the
/// message (the reference's key less the actor, which a platform's message
/// id already implies).
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 80,
        name: "adapters",
        sql: "CREATE TABLE identity_links(
            adapter TEXT NOT NULL,
            account_id TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            uid INTEGER NOT NULL,
            created_at INTEGER NOT NULL,
            linked_by_uid INTEGER NOT NULL,
            metadata_json TEXT,
            PRIMARY KEY(adapter, account_id, actor_id));
         CREATE INDEX identity_links_uid ON identity_links(uid);
         CREATE TABLE link_challenges(
            code TEXT PRIMARY KEY,
            adapter TEXT NOT NULL,
            account_id TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            surface_kind TEXT NOT NULL,
            surface_id TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            expires_at INTEGER NOT NULL,
            used_at INTEGER,
            used_by_uid INTEGER);
         CREATE INDEX link_challenges_actor ON link_challenges(adapter, account_id, actor_id);
         CREATE TABLE surface_routes(
            adapter TEXT NOT NULL,
            account_id TEXT NOT NULL,
            actor_id TEXT NOT NULL,
            surface_kind TEXT NOT NULL,
            surface_id TEXT NOT NULL,
            thread_id TEXT NOT NULL DEFAULT '',
            uid INTEGER NOT NULL,
            pid TEXT NOT NULL,
            updated_at INTEGER NOT NULL,
            updated_by_uid INTEGER NOT NULL,
            PRIMARY KEY(adapter, account_id, actor_id, surface_kind, surface_id, thread_id));
         CREATE INDEX surface_routes_uid ON surface_routes(uid);
         CREATE TABLE adapter_status(
            adapter TEXT NOT NULL,
            account_id TEXT NOT NULL,
            connected INTEGER NOT NULL,
            authenticated INTEGER NOT NULL,
            mode TEXT,
            last_activity INTEGER,
            error TEXT,
            extra_json TEXT,
            updated_at INTEGER NOT NULL,
            owner_uid INTEGER NOT NULL,
            PRIMARY KEY(adapter, account_id));",
    },
    Migration {
        version: 81,
        name: "adapter_receipts_outbox",
        sql: "CREATE TABLE adapter_ingress_receipts(
            adapter TEXT NOT NULL,
            account_id TEXT NOT NULL,
            surface_id TEXT NOT NULL,
            message_id TEXT NOT NULL,
            delivery_id TEXT,
            state TEXT NOT NULL CHECK (state IN ('in_progress', 'completed')),
            created_at INTEGER NOT NULL,
            completed_at INTEGER,
            result_json TEXT,
            PRIMARY KEY(adapter, account_id, surface_id, message_id));
         CREATE INDEX adapter_ingress_receipts_created ON adapter_ingress_receipts(created_at);
         CREATE TABLE adapter_outbox(
            delivery_id TEXT PRIMARY KEY,
            adapter TEXT NOT NULL,
            account_id TEXT NOT NULL,
            run_id TEXT NOT NULL,
            args_json TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 0,
            last_error TEXT);
         CREATE INDEX adapter_outbox_account ON adapter_outbox(adapter, account_id, created_at);",
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapter_names_are_lowercase_words() {
        for ok in ["matrix", "test-adapter", "a_1", "9"] {
            assert!(valid_adapter_name(ok), "{ok}");
        }
        for bad in ["", "Matrix", "-x", "a b", "a.b", &"x".repeat(65)] {
            assert!(!valid_adapter_name(bad), "{bad}");
        }
    }

    #[test]
    fn a_surface_route_round_trips_through_a_messages_origin() {
        let r = SurfaceRoute {
            adapter: "matrix".into(),
            account_id: "@bot:x".into(),
            surface: Surface {
                kind: gsv_protocol::adapter::SurfaceKind::Dm,
                id: "!r:x".into(),
                name: None,
                handle: None,
                thread_id: Some("$t".into()),
            },
            actor_id: Some("@alice:x".into()),
            reply_to_id: Some("$m".into()),
        };
        assert_eq!(SurfaceRoute::from_origin(&r.to_origin()), Some(r));
        assert_eq!(SurfaceRoute::from_origin(&Value::Null), None);
    }
}
