//! `account.create` and `account.list`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::domains::accounts;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

#[derive(Debug, Deserialize)]
pub struct CreateArgs {
    kind: String,
    username: String,
    password: String,
}

/// Creates a human (gid 100 member with a private group and a home).
pub async fn create(k: Arc<Kernel>, _s: Arc<Session>, a: CreateArgs) -> Result<Value, KernelError> {
    if a.kind != "human" {
        return Err(KernelError::BadRequest(format!(
            "Unsupported account kind: {} (only human)",
            a.kind
        )));
    }
    accounts::validate_username(&a.username).map_err(KernelError::BadRequest)?;
    accounts::validate_password(&a.password).map_err(KernelError::BadRequest)?;
    let pw = a.password;
    let hash = tokio::task::spawn_blocking(move || accounts::hash_password(&pw))
        .await
        .map_err(|e| KernelError::internal("hashing a password", e))??;
    let name = a.username;
    let user =
        k.db.call(move |c| accounts::create_human(c, &name, &hash))
            .await?;
    crate::domains::fs::calls::ensure_dir(&k.system, user.home.trim_start_matches('/')).await?;
    Ok(json!({ "user": user }))
}

#[derive(Debug, Deserialize)]
pub struct ListArgs {}

pub async fn list(k: Arc<Kernel>, _s: Arc<Session>, _a: ListArgs) -> Result<Value, KernelError> {
    let accounts = k.db.call(|c| accounts::list_accounts(c)).await?;
    Ok(json!({ "accounts": accounts }))
}
