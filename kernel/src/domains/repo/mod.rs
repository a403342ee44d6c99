//! `repo.*`: versioned trees on real git repositories (seed 000,
//! "Repositories"; `shared/design/kernel-domains.md`).
//!
//! Repositories are bare git repositories at
//! `<data>/repos/<owner>/<name>.git` ([`store`]); who may do what is
//! decided here, and [`calls`] runs the git work on blocking threads.
//!
//! Access: writing needs root (or `*`) or being the owner (the owner is a
//! username). Reading also allows public repositories, which root marks
//! with the config key `repos/<owner>/<name>/visibility` = `public` (the
//! reference's key). A private repository of someone else answers exactly
//! as one that does not exist would (403), so names cannot be probed.

pub mod calls;
pub mod diff;
pub mod error;
pub mod log_index;
pub mod names;
pub mod pack;
pub mod store;

use std::collections::BTreeSet;
use std::path::Path;

use crate::db::Db;
use crate::domains::accounts::{self, ProcessIdentity};
use crate::error::KernelError;
use crate::session::Session;

use names::Slug;
use store::RepoStore;

/// The store under the kernel's data directory.
pub fn store_in(data_dir: &Path) -> RepoStore {
    RepoStore::new(data_dir.join("repos"))
}

/// Who is asking: a connection's identity and capabilities (or an HTTP
/// clone's, from its token).
#[derive(Debug, Clone)]
pub struct Caller {
    pub identity: ProcessIdentity,
    pub capabilities: Vec<String>,
}

impl Caller {
    pub fn of(s: &Session) -> Caller {
        Caller {
            identity: s.identity.clone(),
            capabilities: s.capabilities.clone(),
        }
    }
}

pub fn can_write(c: &Caller, slug: &Slug) -> bool {
    c.identity.is_root()
        || c.capabilities.iter().any(|cap| cap == "*")
        || slug.owner == c.identity.username
}

fn visibility_key(slug: &Slug) -> String {
    format!("repos/{}/{}/visibility", slug.owner, slug.name)
}

/// Repositories root has marked public.
pub async fn public_repos(db: &Db) -> Result<BTreeSet<String>, KernelError> {
    let rows = db
        .call(|c| accounts::config_get(c, accounts::ROOT_UID, Some("repos")))
        .await?;
    Ok(rows
        .into_iter()
        .filter(|(key, value)| key.ends_with("/visibility") && value == "public")
        .filter_map(|(key, _)| {
            let mut p = key.split('/');
            let (_, owner, name) = (p.next()?, p.next()?, p.next()?);
            Some(format!("{owner}/{name}"))
        })
        .collect())
}

pub async fn can_read(db: &Db, c: &Caller, slug: &Slug) -> Result<bool, KernelError> {
    if can_write(c, slug) {
        return Ok(true);
    }
    let key = visibility_key(slug);
    let rows = db
        .call(move |c| accounts::config_get(c, accounts::ROOT_UID, Some(&key)))
        .await?;
    Ok(rows.iter().any(|(_, v)| v == "public"))
}
