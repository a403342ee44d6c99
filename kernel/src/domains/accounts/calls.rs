//! `account.create` and `account.list`.

use gsv_protocol::account::{CreateArgs, CreateResult, ListArgs, ListResult};
use std::sync::Arc;

use crate::domains::accounts;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// Creates a human (gid 100 member with a private group and a home).
pub async fn create(
    k: Arc<Kernel>,
    _s: Arc<Session>,
    a: CreateArgs,
) -> Result<CreateResult, KernelError> {
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
    Ok(CreateResult { user })
}

pub async fn list(
    k: Arc<Kernel>,
    _s: Arc<Session>,
    _a: ListArgs,
) -> Result<ListResult, KernelError> {
    let accounts = k.db.call(|c| accounts::list_accounts(c)).await?;
    Ok(ListResult { accounts })
}
