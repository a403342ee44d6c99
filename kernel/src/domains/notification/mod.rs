//! Notifications (`notification.*`): the wire types ([`types`]), the
//! table and its expiry timers ([`store`]), the seed's TTLs and clamps
//! (here); the calls are [`calls`].

pub mod calls;
pub mod store;
pub mod types;

pub use store::TIMER_KIND;

use crate::db::Migration;
use types::NotificationAction;

/// This domain's table, listed in `domains::MIGRATIONS`; never edit a
/// released migration, add one.
pub const MIGRATIONS: &[Migration] = &[Migration {
    version: 21,
    name: "notifications",
    sql: store::MIGRATION,
}];

const SECOND_MS: i64 = 1000;
const DAY_MS: i64 = 24 * 60 * 60 * SECOND_MS;
/// An unread notification lives this long unless `ttlMs` says otherwise.
pub const DEFAULT_UNREAD_TTL_MS: i64 = 30 * DAY_MS;
/// `ttlMs` is clamped to `MIN_TTL_MS ..= MAX_TTL_MS`.
pub const MIN_TTL_MS: i64 = SECOND_MS;
pub const MAX_TTL_MS: i64 = 90 * DAY_MS;
/// Reading one resets its expiry to this from now.
pub const READ_TTL_MS: i64 = 7 * DAY_MS;
/// Dismissing one resets its expiry to this from now.
pub const DISMISSED_TTL_MS: i64 = 3 * DAY_MS;
/// `notification.list` `limit`: default, and clamped to `1 ..= MAX_LIST_LIMIT`.
pub const DEFAULT_LIST_LIMIT: usize = 100;
pub const MAX_LIST_LIMIT: usize = 500;

/// The TTL `ttlMs` asks for, clamped.
pub fn clamp_ttl(ttl_ms: Option<f64>) -> i64 {
    ttl_ms
        .map_or(DEFAULT_UNREAD_TTL_MS, |t| t.trunc() as i64)
        .clamp(MIN_TTL_MS, MAX_TTL_MS)
}

/// The list size `limit` asks for, clamped.
pub fn clamp_limit(limit: Option<f64>) -> usize {
    limit.map_or(DEFAULT_LIST_LIMIT, |l| {
        (l.trunc().max(1.0) as usize).min(MAX_LIST_LIMIT)
    })
}

/// Trimmed actions; ones with an empty kind or label are dropped.
pub fn normalize_actions(actions: Vec<NotificationAction>) -> Vec<NotificationAction> {
    actions
        .into_iter()
        .map(|a| NotificationAction {
            kind: a.kind.trim().to_owned(),
            label: a.label.trim().to_owned(),
            target: a.target.filter(|t| !t.is_empty()),
            args: a.args,
        })
        .filter(|a| !a.kind.is_empty() && !a.label.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_and_limit_clamp_at_their_edges() {
        assert_eq!(clamp_ttl(None), DEFAULT_UNREAD_TTL_MS);
        assert_eq!(clamp_ttl(Some(10.0)), 1000);
        assert_eq!(clamp_ttl(Some(-5.0)), 1000);
        assert_eq!(clamp_ttl(Some(1000.0)), 1000);
        assert_eq!(clamp_ttl(Some(1001.9)), 1001);
        assert_eq!(clamp_ttl(Some(1e15)), MAX_TTL_MS);
        assert_eq!(clamp_limit(None), 100);
        assert_eq!(clamp_limit(Some(0.0)), 1);
        assert_eq!(clamp_limit(Some(-3.0)), 1);
        assert_eq!(clamp_limit(Some(500.0)), 500);
        assert_eq!(clamp_limit(Some(1000.0)), 500);
    }

    #[test]
    fn actions_are_trimmed_and_empty_ones_dropped() {
        let a = |kind: &str, label: &str| NotificationAction {
            kind: kind.into(),
            label: label.into(),
            target: None,
            args: None,
        };
        let out = normalize_actions(vec![a(" open ", " Open "), a("", "x"), a("y", "  ")]);
        assert_eq!(out, vec![a("open", "Open")]);
    }
}
