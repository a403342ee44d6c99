//! `account.create` and `account.list`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct CreateArgs {
    /// Only `human`.
    pub kind: String,
    pub username: String,
    pub password: String,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
pub struct ListArgs {}

/// Who a connection or process acts as (the seed's `ProcessIdentity`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub struct ProcessIdentity {
    pub uid: i64,
    pub gid: i64,
    pub gids: Vec<i64>,
    pub username: String,
    pub home: String,
    pub cwd: String,
}

impl ProcessIdentity {
    /// Root: uid 0.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct CreateResult {
    pub user: ProcessIdentity,
}

/// One account as `account.list` shows it.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct Account {
    pub uid: i64,
    pub username: String,
    pub gid: i64,
    pub home: String,
    /// `human` or `system`.
    pub kind: String,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
pub struct ListResult {
    pub accounts: Vec<Account>,
}
