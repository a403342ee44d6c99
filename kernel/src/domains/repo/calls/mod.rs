//! `repo.*` handlers: check the caller, then run the git work on a
//! blocking thread; and the HTTP clone endpoint ([`http`]).

pub mod http;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gix::ObjectId;
use gsv_protocol::repo::*;

use super::diff;
use super::error::RepoError;
use super::names::{self, Slug};
use super::store::{self, Author, Op, RepoStore};
use super::{Caller, can_read, can_write, public_repos, store_in};
use crate::domains::workspace;
use crate::error::KernelError;
use crate::kernel::Kernel;
use crate::session::Session;

/// How long an import may take before it is abandoned (nothing written).
pub const IMPORT_DEADLINE: Duration = Duration::from_secs(120);

/// The store under the kernel's data directory.
pub fn store_of(k: &Kernel) -> RepoStore {
    store_in(&k.config().data_dir)
}

/// Runs git work off the async threads.
async fn blocking<R, F>(f: F) -> Result<R, KernelError>
where
    R: Send + 'static,
    F: FnOnce() -> Result<R, RepoError> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| KernelError::internal("repo task", e))?
        .map_err(KernelError::from)
}

async fn readable(k: &Kernel, s: &Session, raw: &str) -> Result<Slug, KernelError> {
    let slug = Slug::parse(raw)?;
    if !can_read(k.db(), &Caller::of(s), &slug).await? {
        return Err(RepoError::Forbidden {
            action: "read",
            repo: slug.to_string(),
        }
        .into());
    }
    Ok(slug)
}

fn writable(s: &Session, raw: &str) -> Result<Slug, KernelError> {
    let slug = Slug::parse(raw)?;
    if !can_write(&Caller::of(s), &slug) {
        return Err(RepoError::Forbidden {
            action: "write",
            repo: slug.to_string(),
        }
        .into());
    }
    Ok(slug)
}

fn author_of(s: &Session) -> Author {
    Author {
        name: s.identity.username.clone(),
        email: format!("{}@gsv.local", s.identity.username),
    }
}

fn parse_id(raw: &str, label: &str) -> Result<ObjectId, RepoError> {
    ObjectId::from_hex(raw.trim().to_ascii_lowercase().as_bytes())
        .map_err(|_| RepoError::BadArgument(format!("{label} {raw:?} is not a full commit hash")))
}

/// Lists the caller's home and workspaces (whether or not their
/// repositories exist yet) and every repository on disk the caller may
/// read, optionally of one owner.
pub async fn list(k: Arc<Kernel>, s: Arc<Session>, a: ListArgs) -> Result<ListResult, KernelError> {
    let owner = match a.owner.as_deref().map(str::trim).filter(|o| !o.is_empty()) {
        Some(o) => Some(names::segment(o, "owner")?),
        None => None,
    };
    let public = public_repos(k.db()).await?;
    let uid = s.identity.uid;
    let workspaces = k
        .db()
        .call(move |c| workspace::list_rows(c, Some(uid), Some("active"), 1000))
        .await?;
    let me = s.identity.username.clone();
    let mut named: Vec<(Slug, RepoKind)> = vec![(
        Slug {
            owner: me.clone(),
            name: "home".into(),
        },
        RepoKind::Home,
    )];
    named.extend(workspaces.into_iter().map(|w| {
        (
            Slug {
                owner: me.clone(),
                name: w.id,
            },
            RepoKind::Workspace,
        )
    }));
    let store = store_of(&k);
    let caller = Caller::of(&s);
    let repos = blocking(move || {
        let mut out: BTreeMap<String, RepoSummary> = BTreeMap::new();
        let on_disk = store.all();
        let candidates = named
            .into_iter()
            .chain(on_disk.into_iter().map(|slug| (slug, RepoKind::User)));
        for (slug, kind) in candidates {
            if owner.as_ref().is_some_and(|o| *o != slug.owner) {
                continue;
            }
            let key = slug.to_string();
            let is_public = public.contains(&key);
            if out.contains_key(&key) || !(can_write(&caller, &slug) || is_public) {
                continue;
            }
            let updated_at = store.open(&slug).ok().and_then(|r| store::updated_at(&r));
            out.insert(
                key.clone(),
                RepoSummary {
                    repo: key,
                    owner: slug.owner.clone(),
                    name: slug.name.clone(),
                    kind,
                    writable: can_write(&caller, &slug),
                    public: is_public,
                    description: store.description(&slug),
                    updated_at,
                },
            );
        }
        Ok(out.into_values().collect())
    })
    .await?;
    Ok(ListResult { repos })
}

/// Creates the repository (if needed) and an empty first commit on `ref`;
/// an existing ref is `created: false`.
pub async fn create(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: CreateArgs,
) -> Result<CreateResult, KernelError> {
    let slug = writable(&s, &a.repo)?;
    let branch = names::branch(a.r#ref.as_deref())?;
    let description = a
        .description
        .map(|d| d.trim().to_owned())
        .filter(|d| !d.is_empty());
    let author = author_of(&s);
    let store = store_of(&k);
    blocking(move || {
        let (repo, fresh) = store.open_or_init(&slug, &branch)?;
        let message = format!("repo: create {slug}");
        let made = store::create_branch(&repo, &branch, &message, &author);
        let (head, created) = match made {
            Ok(v) => v,
            Err(e) => {
                if fresh {
                    store.discard(&slug);
                }
                return Err(e);
            }
        };
        if let Some(d) = description {
            store.set_description(&slug, &d)?;
        }
        Ok(CreateResult {
            repo: slug.to_string(),
            r#ref: branch,
            head: Some(head.to_string()),
            created,
        })
    })
    .await
}

pub async fn refs(k: Arc<Kernel>, s: Arc<Session>, a: RefsArgs) -> Result<RefsResult, KernelError> {
    let slug = readable(&k, &s, &a.repo).await?;
    let store = store_of(&k);
    blocking(move || {
        let repo = store.open(&slug)?;
        let (heads, tags) = store::refs(&repo)?;
        Ok(RefsResult {
            repo: slug.to_string(),
            heads,
            tags,
        })
    })
    .await
}

pub async fn read(k: Arc<Kernel>, s: Arc<Session>, a: ReadArgs) -> Result<ReadResult, KernelError> {
    let slug = readable(&k, &s, &a.repo).await?;
    let rev = names::revision(a.r#ref.as_deref())?;
    let path = names::read_path(a.path.as_deref(), "path")?;
    let store = store_of(&k);
    blocking(move || {
        let repo = store.open(&slug)?;
        let commit = store::resolve_commit(&repo, &rev)?;
        Ok(match store::read(&repo, commit, &path)? {
            store::Found::Tree(entries) => ReadResult::Tree {
                repo: slug.to_string(),
                r#ref: rev,
                path,
                entries,
            },
            store::Found::File { size, bytes } => {
                let binary = diff::is_binary(&bytes);
                ReadResult::File {
                    repo: slug.to_string(),
                    r#ref: rev,
                    path,
                    size,
                    is_binary: binary,
                    content: (!binary).then(|| String::from_utf8_lossy(&bytes).into_owned()),
                }
            }
        })
    })
    .await
}

pub async fn search(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: SearchArgs,
) -> Result<SearchResult, KernelError> {
    let slug = readable(&k, &s, &a.repo).await?;
    let rev = names::revision(a.r#ref.as_deref())?;
    let query = a.query.trim().to_owned();
    if query.is_empty() {
        return Err(RepoError::BadArgument("query is required".into()).into());
    }
    let prefix = names::read_path(a.prefix.as_deref(), "prefix")?;
    let store = store_of(&k);
    blocking(move || {
        let repo = store.open(&slug)?;
        let commit = store::resolve_commit(&repo, &rev)?;
        let (matches, truncated) = store::search(&repo, commit, &query, &prefix)?;
        Ok(SearchResult {
            repo: slug.to_string(),
            r#ref: rev,
            query,
            prefix: (!prefix.is_empty()).then_some(prefix),
            truncated: Some(truncated),
            matches,
        })
    })
    .await
}

/// `limit` defaults to 30 and clamps to 1–100; `offset` defaults to 0.
fn clamp_limit(limit: Option<f64>) -> u32 {
    match limit {
        Some(l) if l.is_finite() => l.trunc().clamp(1.0, 100.0) as u32,
        _ => 30,
    }
}

fn clamp_offset(offset: Option<f64>) -> u64 {
    match offset {
        Some(o) if o.is_finite() => o.trunc().max(0.0) as u64,
        _ => 0,
    }
}

/// `context` defaults to 3 and clamps to 0–20.
fn clamp_context(context: Option<f64>) -> u32 {
    match context {
        Some(c) if c.is_finite() => c.trunc().clamp(0.0, 20.0) as u32,
        _ => 3,
    }
}

pub async fn log(k: Arc<Kernel>, s: Arc<Session>, a: LogArgs) -> Result<LogResult, KernelError> {
    let slug = readable(&k, &s, &a.repo).await?;
    let rev = names::revision(a.r#ref.as_deref())?;
    let limit = clamp_limit(a.limit);
    let offset = clamp_offset(a.offset);
    let store = store_of(&k);
    blocking(move || {
        let repo = store.open(&slug)?;
        let commit = store::resolve_commit(&repo, &rev)?;
        let entries = store::log(&repo, commit, offset, limit)?;
        Ok(LogResult {
            repo: slug.to_string(),
            r#ref: rev,
            limit,
            offset,
            entries,
        })
    })
    .await
}

pub async fn diff(k: Arc<Kernel>, s: Arc<Session>, a: DiffArgs) -> Result<DiffResult, KernelError> {
    let slug = readable(&k, &s, &a.repo).await?;
    if a.commit.trim().is_empty() {
        return Err(RepoError::BadArgument("commit is required".into()).into());
    }
    let rev = names::revision(Some(&a.commit))?;
    let context = clamp_context(a.context);
    let store = store_of(&k);
    blocking(move || {
        let repo = store.open(&slug)?;
        let commit = store::resolve_commit(&repo, &rev)?;
        let (tree, parent) = store::commit_tree_and_parent(&repo, commit)?;
        let parent_tree = parent.map(|p| store::tree_of(&repo, p)).transpose()?;
        let (stats, files) = store::diff_trees(&repo, parent_tree, tree, context, true)?;
        Ok(DiffResult {
            repo: slug.to_string(),
            commit_hash: commit.to_string(),
            parent_hash: parent.map(|p| p.to_string()),
            stats,
            files,
        })
    })
    .await
}

pub async fn compare(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: CompareArgs,
) -> Result<CompareResult, KernelError> {
    let slug = readable(&k, &s, &a.repo).await?;
    if a.base.trim().is_empty() || a.head.trim().is_empty() {
        return Err(RepoError::BadArgument("base and head are required".into()).into());
    }
    let base = names::revision(Some(&a.base))?;
    let head = names::revision(Some(&a.head))?;
    let context = clamp_context(a.context);
    let with_hunks = a.stat != Some(true);
    let store = store_of(&k);
    blocking(move || {
        let repo = store.open(&slug)?;
        let base = store::resolve_commit(&repo, &base)?;
        let head = store::resolve_commit(&repo, &head)?;
        let (stats, files) = store::diff_trees(
            &repo,
            Some(store::tree_of(&repo, base)?),
            store::tree_of(&repo, head)?,
            context,
            with_hunks,
        )?;
        Ok(CompareResult {
            repo: slug.to_string(),
            base: base.to_string(),
            head: head.to_string(),
            stats,
            files,
        })
    })
    .await
}

/// One commit of puts, deletes and moves; `expectedHead` is a
/// compare-and-swap on the branch.
pub async fn apply(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ApplyArgs,
) -> Result<ApplyResult, KernelError> {
    let slug = writable(&s, &a.repo)?;
    let branch = names::branch(a.r#ref.as_deref())?;
    let message = a.message.trim().to_owned();
    if message.is_empty() {
        return Err(RepoError::BadArgument("message is required".into()).into());
    }
    let expected_head = match a.expected_head.as_deref().map(str::trim) {
        Some(h) if !h.is_empty() => Some(parse_id(h, "expectedHead")?),
        _ => None,
    };
    let ops = a
        .ops
        .into_iter()
        .enumerate()
        .map(|(i, op)| Op::parse(op, i))
        .collect::<Result<Vec<_>, _>>()?;
    let allow_empty = a.allow_empty == Some(true);
    let author = author_of(&s);
    let store = store_of(&k);
    blocking(move || {
        let (repo, fresh) = store.open_or_init(&slug, &branch)?;
        let commit = store::Commit {
            branch: &branch,
            message: &message,
            author: &author,
            expected_head,
            allow_empty,
            ops: &ops,
        };
        let head = match store::apply(&repo, &commit) {
            Ok(h) => h,
            Err(e) => {
                if fresh {
                    store.discard(&slug);
                }
                return Err(e);
            }
        };
        Ok(ApplyResult {
            ok: true,
            repo: slug.to_string(),
            r#ref: branch,
            head: Some(head.to_string()),
        })
    })
    .await
}

/// Fetches an upstream ref and fast-forwards the branch to it; a repeat
/// with nothing new upstream is `changed: false`. `file://` upstreams are
/// paths on the kernel's machine, so only root may name them.
pub async fn import(
    k: Arc<Kernel>,
    s: Arc<Session>,
    a: ImportArgs,
) -> Result<ImportResult, KernelError> {
    let slug = writable(&s, &a.repo)?;
    let branch = names::branch(a.r#ref.as_deref())?;
    let remote_url = a.remote_url.trim().to_owned();
    if remote_url.is_empty() {
        return Err(RepoError::BadArgument("remoteUrl is required".into()).into());
    }
    let scheme = store::upstream_scheme(&remote_url)?;
    if scheme == store::UpstreamScheme::File && !s.identity.is_root() {
        return Err(KernelError::PermissionDenied(
            "file:// imports read the kernel's own disk (root only)".into(),
        ));
    }
    let remote_ref = match a.remote_ref.as_deref().map(str::trim) {
        Some(r) if !r.is_empty() => names::revision(Some(r))?,
        _ => branch.clone(),
    };
    let message = a
        .message
        .map(|m| m.trim().to_owned())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| format!("repo: import {remote_url}#{remote_ref}"));
    let store = store_of(&k);
    let interrupt = Arc::new(AtomicBool::new(false));
    let flag = interrupt.clone();
    let (url, rref, br) = (remote_url.clone(), remote_ref.clone(), branch.clone());
    let work = blocking(move || {
        let (repo, fresh) = store.open_or_init(&slug, &br)?;
        match store::import(&repo, &br, &url, &rref, &message, &flag) {
            Ok(done) => Ok((slug, done)),
            Err(e) => {
                if fresh {
                    store.discard(&slug);
                }
                Err(e)
            }
        }
    });
    let (slug, done) = match tokio::time::timeout(IMPORT_DEADLINE, work).await {
        Ok(r) => r?,
        Err(_) => {
            // The blocking fetch sees the flag and gives up before moving
            // any ref.
            interrupt.store(true, Ordering::Relaxed);
            return Err(KernelError::Upstream(format!(
                "import from {remote_url} did not finish within {}s",
                IMPORT_DEADLINE.as_secs()
            )));
        }
    };
    Ok(ImportResult {
        repo: slug.to_string(),
        r#ref: branch,
        head: Some(done.head.to_string()),
        changed: done.changed,
        remote_url,
        remote_ref,
    })
}
