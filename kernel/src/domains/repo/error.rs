//! `repo.*` failures and the one place they become wire codes.

use crate::error::KernelError;

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    /// A malformed argument (400), naming it.
    #[error("{0}")]
    BadArgument(String),
    /// No such repository, ref, commit or path (404).
    #[error("{0}")]
    NotFound(String),
    /// The caller may not do this to this repository (403). Unknown and
    /// private repositories look alike, so names cannot be probed.
    #[error("Forbidden: cannot {action} repo {repo}")]
    Forbidden { action: &'static str, repo: String },
    /// A stale `expectedHead`, a concurrent write, a diverged import (409).
    #[error("{0}")]
    Conflict(String),
    /// The upstream of an import did not answer as a git repository (502).
    #[error("{0}")]
    Upstream(String),
    /// The object store failed under us (500).
    #[error("git: {0}")]
    Git(String),
}

impl RepoError {
    pub fn git(e: impl std::fmt::Display) -> RepoError {
        RepoError::Git(e.to_string())
    }
}

impl From<RepoError> for KernelError {
    fn from(e: RepoError) -> KernelError {
        match e {
            RepoError::BadArgument(m) => KernelError::BadRequest(m),
            RepoError::NotFound(m) => KernelError::Missing(m),
            RepoError::Forbidden { repo, .. } => KernelError::AccessDenied {
                kind: "repo",
                id: repo,
            },
            RepoError::Conflict(m) => KernelError::Conflict(m),
            RepoError::Upstream(m) => KernelError::Upstream(m),
            RepoError::Git(m) => KernelError::internal("repo", m),
        }
    }
}
