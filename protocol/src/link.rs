//! `sys.link`, `sys.unlink`, `sys.link.list`, `sys.link.consume`: identity
//! links between a chat platform's actor (an adapter account's view of a
//! person) and a kernel account (seed 000). User role only.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const LINK: &str = "sys.link";
pub const UNLINK: &str = "sys.unlink";
pub const LIST: &str = "sys.link.list";
pub const CONSUME: &str = "sys.link.consume";

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
