//! `sys.link`, `sys.unlink`, `sys.link.list`, `sys.link.consume`: identity
//! links between a chat platform's actor (an adapter account's view of a
//! person) and a kernel account (seed 000); `sys.link.route.set|list|
//! delete`: which of the account's processes a linked actor's messages on
//! one surface go to (seed 001 `surface_routes`). User role only.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::adapter::Surface;

pub const LINK: &str = "sys.link";
pub const UNLINK: &str = "sys.unlink";
pub const LIST: &str = "sys.link.list";
pub const CONSUME: &str = "sys.link.consume";
pub const ROUTE_SET: &str = "sys.link.route.set";
pub const ROUTE_LIST: &str = "sys.link.route.list";
pub const ROUTE_DELETE: &str = "sys.link.route.delete";

/// `sys.link`: links `actorId` of `adapter`/`accountId` to `uid` (root
/// only for another uid; the caller's own without it).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkArgs {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<i64>,
}

/// One identity link.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
    pub uid: i64,
    /// Milliseconds since the Unix epoch.
    pub created_at: i64,
}

/// The result of `sys.link` and `sys.link.consume`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct LinkResult {
    pub linked: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
}

/// `sys.unlink`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnlinkArgs {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct UnlinkResult {
    pub removed: bool,
}

/// `sys.link.list`: the caller's links, or (root) all or one uid's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ListArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<i64>,
}

/// A listed link: who made it, too.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkEntry {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
    pub uid: i64,
    pub created_at: i64,
    pub linked_by_uid: i64,
}

/// The result of `sys.link.list`, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ListResult {
    pub links: Vec<LinkEntry>,
}

/// `sys.link.consume`: a code an adapter posted (`XXXX-XXXX`; case and
/// surrounding blanks do not matter).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ConsumeArgs {
    pub code: String,
}

/// `sys.link.route.set`: a linked actor's messages on `surface` (its
/// `threadId` included; `name` and `handle` are not kept) go to `pid`, an
/// interactive process of the account the actor is linked to, instead of
/// its home process `init:<uid>`. Replaces the surface's route.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteSetArgs {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
    pub surface: Surface,
    pub pid: String,
}

/// One surface route.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
    pub surface: Surface,
    pub uid: i64,
    pub pid: String,
    /// Milliseconds since the Unix epoch.
    pub updated_at: i64,
    pub updated_by_uid: i64,
}

/// The result of `sys.link.route.set`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct RouteSetResult {
    pub route: Route,
}

/// `sys.link.route.list`: the caller's routes, or (root) all or one uid's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct RouteListArgs {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<i64>,
}

/// The result of `sys.link.route.list`, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct RouteListResult {
    pub routes: Vec<Route>,
}

/// `sys.link.route.delete`: the surface's messages go to `init:<uid>`
/// again.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteDeleteArgs {
    pub adapter: String,
    pub account_id: String,
    pub actor_id: String,
    pub surface: Surface,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct RouteDeleteResult {
    pub removed: bool,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_link_result_reads_as_the_reference_cli_parses_it() {
        let r = LinkResult {
            linked: true,
            link: Some(Link {
                adapter: "matrix".into(),
                account_id: "@bot:x".into(),
                actor_id: "@alice:x".into(),
                uid: 1000,
                created_at: 5,
            }),
        };
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"linked": true, "link": {"adapter": "matrix", "accountId": "@bot:x",
                   "actorId": "@alice:x", "uid": 1000, "createdAt": 5}})
        );
    }
}
