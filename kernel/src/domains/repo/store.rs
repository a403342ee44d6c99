//! The repositories on disk: bare git repositories at
//! `<data>/repos/<owner>/<name>.git`, read and written with `gix` (no
//! index, no worktree), so that real `git` reads them as its own.
//!
//! Everything here blocks (object I/O, zlib, network); callers run it on
//! `spawn_blocking`. Who may do what is decided above, in the handlers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use base64::Engine as _;
use gix::ObjectId;
use gix::bstr::{BString, ByteSlice};
use gix::objs::tree::{EntryKind, EntryMode};
use gix::refs::Target;
use gix::refs::transaction::{Change, LogChange, PreviousValue, RefEdit, RefLog};

use super::error::RepoError;
use super::names::Slug;
use super::{diff, log_index, pack};
use gsv_protocol::repo::*;

/// Search stops after this many matching lines (`truncated: true`).
pub const SEARCH_MATCH_LIMIT: usize = 200;
/// Blobs larger than this are not searched.
const SEARCH_BLOB_LIMIT: usize = 1 << 20;
/// Times an apply without `expectedHead` is rebuilt on a ref that moved.
const APPLY_RETRIES: usize = 5;
/// `repo.log` pages starting this deep read the first-parent index
/// ([`log_index`]) instead of walking every commit above them.
pub const INDEXED_LOG_OFFSET: u64 = 200;

/// Who a commit is by (the caller).
#[derive(Debug, Clone)]
pub struct Author {
    pub name: String,
    pub email: String,
}

/// The directory holding every repository.
#[derive(Debug, Clone)]
pub struct RepoStore {
    root: PathBuf,
}

impl RepoStore {
    pub fn new(root: PathBuf) -> RepoStore {
        RepoStore { root }
    }

    /// Where `slug` lives (whether or not it exists).
    pub fn path(&self, slug: &Slug) -> PathBuf {
        self.root
            .join(&slug.owner)
            .join(format!("{}.git", slug.name))
    }

    pub fn exists(&self, slug: &Slug) -> bool {
        self.path(slug).join("HEAD").is_file()
    }

    /// Every repository on disk, by slug.
    pub fn all(&self) -> Vec<Slug> {
        let mut out = Vec::new();
        let Ok(owners) = std::fs::read_dir(&self.root) else {
            return out;
        };
        for owner in owners.flatten() {
            let Some(owner_name) = owner.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            let Ok(repos) = std::fs::read_dir(owner.path()) else {
                continue;
            };
            for r in repos.flatten() {
                let file = r.file_name();
                let Some(name) = file.to_str().and_then(|n| n.strip_suffix(".git")) else {
                    continue;
                };
                if let Ok(slug) = Slug::parse(&format!("{owner_name}/{name}"))
                    && self.exists(&slug)
                {
                    out.push(slug);
                }
            }
        }
        out.sort();
        out
    }

    /// Opens an existing repository, or says it does not exist.
    pub fn open(&self, slug: &Slug) -> Result<gix::Repository, RepoError> {
        if !self.exists(slug) {
            return Err(RepoError::NotFound(format!("Repository not found: {slug}")));
        }
        open_path(&self.path(slug))
    }

    /// Opens `slug`, creating an empty bare repository whose HEAD names
    /// `branch` if there is none yet. The bool says whether it was created.
    pub fn open_or_init(
        &self,
        slug: &Slug,
        branch: &str,
    ) -> Result<(gix::Repository, bool), RepoError> {
        if self.exists(slug) {
            return Ok((self.open(slug)?, false));
        }
        let path = self.path(slug);
        std::fs::create_dir_all(path.parent().unwrap_or(&self.root)).map_err(RepoError::git)?;
        gix::init_bare(&path).map_err(RepoError::git)?;
        let repo = open_path(&path)?;
        repo.edit_reference(RefEdit {
            change: Change::Update {
                log: LogChange::default(),
                expected: PreviousValue::Any,
                new: Target::Symbolic(full_branch(branch)?),
            },
            name: "HEAD".try_into().map_err(RepoError::git)?,
            deref: false,
        })
        .map_err(RepoError::git)?;
        Ok((repo, true))
    }

    /// Removes a repository this call created and then failed to fill.
    pub fn discard(&self, slug: &Slug) {
        let _ = std::fs::remove_dir_all(self.path(slug));
    }

    /// The description git keeps in `<repo>/description` (gitweb's), unless
    /// it is git's placeholder.
    pub fn description(&self, slug: &Slug) -> Option<String> {
        let text = std::fs::read_to_string(self.path(slug).join("description")).ok()?;
        let text = text.trim();
        (!text.is_empty() && !text.starts_with("Unnamed repository")).then(|| text.to_owned())
    }

    pub fn set_description(&self, slug: &Slug, text: &str) -> Result<(), RepoError> {
        std::fs::write(self.path(slug).join("description"), format!("{text}\n"))
            .map_err(RepoError::git)
    }
}

fn open_path(path: &Path) -> Result<gix::Repository, RepoError> {
    // Isolated: the kernel's own user config (signing, hooks, url rewrites)
    // has no say over repositories it serves.
    gix::open_opts(path, gix::open::Options::isolated()).map_err(RepoError::git)
}

fn full_branch(branch: &str) -> Result<gix::refs::FullName, RepoError> {
    format!("refs/heads/{branch}")
        .try_into()
        .map_err(|e| RepoError::BadArgument(format!("invalid branch ref {branch:?}: {e}")))
}

/// Short ref name → hash.
pub type RefNames = BTreeMap<String, String>;

/// A file's side of a change: its mode and blob.
type Side = Option<(EntryMode, ObjectId)>;

/// The commit `refs/heads/<branch>` points at, if the branch exists.
pub fn branch_head(repo: &gix::Repository, branch: &str) -> Result<Option<ObjectId>, RepoError> {
    let name = full_branch(branch)?;
    match repo.try_find_reference(&name).map_err(RepoError::git)? {
        Some(mut r) => Ok(Some(r.peel_to_id().map_err(RepoError::git)?.detach())),
        None => Ok(None),
    }
}

/// `rev` (a branch, tag, hash or any git revision) as a commit.
pub fn resolve_commit(repo: &gix::Repository, rev: &str) -> Result<ObjectId, RepoError> {
    let unknown = || RepoError::NotFound(format!("Unknown ref or commit: {rev}"));
    let id = repo.rev_parse_single(rev).map_err(|_| unknown())?;
    let object = id.object().map_err(|_| unknown())?;
    let commit = object
        .peel_to_commit()
        .map_err(|_| RepoError::NotFound(format!("{rev} does not name a commit")))?;
    Ok(commit.id)
}

pub fn refs(repo: &gix::Repository) -> Result<(RefNames, RefNames), RepoError> {
    let platform = repo.references().map_err(RepoError::git)?;
    let mut heads = BTreeMap::new();
    for r in platform.local_branches().map_err(RepoError::git)? {
        let mut r = r.map_err(RepoError::git)?;
        let name = r.name().shorten().to_string();
        let id = r.peel_to_id().map_err(RepoError::git)?;
        heads.insert(name, id.to_string());
    }
    let mut tags = BTreeMap::new();
    for r in platform.tags().map_err(RepoError::git)? {
        let r = r.map_err(RepoError::git)?;
        let name = r.name().shorten().to_string();
        if let Some(id) = r.target().try_id() {
            tags.insert(name, id.to_string());
        }
    }
    Ok((heads, tags))
}

/// Newest commit time of any branch, in ms (the list's `updatedAt`).
pub fn updated_at(repo: &gix::Repository) -> Option<i64> {
    let (heads, _) = refs(repo).ok()?;
    heads
        .values()
        .filter_map(|h| ObjectId::from_hex(h.as_bytes()).ok())
        .filter_map(|id| repo.find_commit(id).ok()?.time().ok())
        .map(|t| t.seconds * 1000)
        .max()
}

/// What `repo.read` finds at `path` of `commit`.
#[derive(Debug)]
pub enum Found {
    Tree(Vec<TreeEntry>),
    File { size: u64, bytes: Vec<u8> },
}

pub fn read(repo: &gix::Repository, commit: ObjectId, path: &str) -> Result<Found, RepoError> {
    let root = repo
        .find_commit(commit)
        .and_then(|c| c.tree())
        .map_err(RepoError::git)?;
    let (mode, id) = if path.is_empty() {
        (EntryKind::Tree.into(), root.id)
    } else {
        let entry = root
            .lookup_entry_by_path(path)
            .map_err(RepoError::git)?
            .ok_or_else(|| RepoError::NotFound(format!("Path not found: {path}")))?;
        (entry.mode(), entry.object_id())
    };
    if mode.is_tree() {
        let tree = repo.find_tree(id).map_err(RepoError::git)?;
        let decoded = tree.decode().map_err(RepoError::git)?;
        let entries = decoded
            .entries
            .iter()
            .filter_map(|e| {
                let kind = entry_type(e.mode)?;
                let name = e.filename.to_str_lossy().into_owned();
                Some(TreeEntry {
                    path: if path.is_empty() {
                        name.clone()
                    } else {
                        format!("{path}/{name}")
                    },
                    name,
                    mode: octal_mode(e.mode),
                    hash: e.oid.to_string(),
                    kind,
                })
            })
            .collect();
        return Ok(Found::Tree(entries));
    }
    let blob = repo.find_blob(id).map_err(RepoError::git)?;
    Ok(Found::File {
        size: blob.data.len() as u64,
        bytes: blob.data.clone(),
    })
}

/// Tree entry types the seed names; submodules (gitlinks) are left out.
fn entry_type(mode: EntryMode) -> Option<EntryType> {
    match mode.kind() {
        EntryKind::Tree => Some(EntryType::Tree),
        EntryKind::Blob | EntryKind::BlobExecutable => Some(EntryType::Blob),
        EntryKind::Link => Some(EntryType::Symlink),
        EntryKind::Commit => None,
    }
}

/// `git ls-tree`'s six-digit octal mode.
fn octal_mode(mode: EntryMode) -> String {
    format!("{:06o}", mode.value())
}

/// Every file (blob or symlink) under `commit`'s tree: path → (mode, id).
fn files(
    repo: &gix::Repository,
    tree: ObjectId,
) -> Result<BTreeMap<String, (EntryMode, ObjectId)>, RepoError> {
    let tree = repo.find_tree(tree).map_err(RepoError::git)?;
    let all = tree
        .traverse()
        .breadthfirst
        .files()
        .map_err(RepoError::git)?;
    Ok(all
        .into_iter()
        .filter(|e| !e.mode.is_tree())
        .map(|e| (e.filepath.to_str_lossy().into_owned(), (e.mode, e.oid)))
        .collect())
}

/// Literal, case-sensitive search of text files under `prefix`.
pub fn search(
    repo: &gix::Repository,
    commit: ObjectId,
    query: &str,
    prefix: &str,
) -> Result<(Vec<SearchMatch>, bool), RepoError> {
    let tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree_id())
        .map_err(RepoError::git)?;
    let mut matches = Vec::new();
    for (path, (mode, id)) in files(repo, tree.detach())? {
        if !prefix.is_empty() && path != prefix && !path.starts_with(&format!("{prefix}/")) {
            continue;
        }
        if !mode.is_blob() {
            continue;
        }
        let blob = repo.find_blob(id).map_err(RepoError::git)?;
        if blob.data.len() > SEARCH_BLOB_LIMIT || diff::is_binary(&blob.data) {
            continue;
        }
        let text = String::from_utf8_lossy(&blob.data);
        for (n, line) in text.lines().enumerate() {
            if line.contains(query) {
                if matches.len() == SEARCH_MATCH_LIMIT {
                    return Ok((matches, true));
                }
                matches.push(SearchMatch {
                    path: path.clone(),
                    line: n as u64 + 1,
                    content: line.to_owned(),
                });
            }
        }
    }
    Ok((matches, false))
}

/// First-parent history from `commit`: `limit` entries after `offset`.
pub fn log(
    repo: &gix::Repository,
    commit: ObjectId,
    offset: u64,
    limit: u32,
) -> Result<Vec<LogEntry>, RepoError> {
    let ids: Vec<ObjectId> = if offset >= INDEXED_LOG_OFFSET {
        let chain = log_index::chain(repo, commit)?;
        chain
            .iter()
            .rev()
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(limit as usize)
            .copied()
            .collect()
    } else {
        let walk = repo
            .rev_walk([commit])
            .first_parent_only()
            .all()
            .map_err(RepoError::git)?;
        walk.skip(offset as usize)
            .take(limit as usize)
            .map(|info| info.map(|i| i.id).map_err(RepoError::git))
            .collect::<Result<_, _>>()?
    };
    ids.into_iter().map(|id| log_entry(repo, id)).collect()
}

fn log_entry(repo: &gix::Repository, id: ObjectId) -> Result<LogEntry, RepoError> {
    let c = repo.find_commit(id).map_err(RepoError::git)?;
    let d = c.decode().map_err(RepoError::git)?;
    let author = d.author().map_err(RepoError::git)?;
    let committer = d.committer().map_err(RepoError::git)?;
    Ok(LogEntry {
        hash: id.to_string(),
        tree_hash: d.tree().to_string(),
        author: author.name.to_str_lossy().into_owned(),
        author_email: author.email.to_str_lossy().into_owned(),
        author_time: author.seconds(),
        committer: committer.name.to_str_lossy().into_owned(),
        committer_email: committer.email.to_str_lossy().into_owned(),
        commit_time: committer.seconds(),
        message: d.message.to_str_lossy().into_owned(),
        parents: d.parents().map(|p| p.to_string()).collect(),
    })
}

/// The files that differ between two trees (`None`: the empty tree).
pub fn diff_trees(
    repo: &gix::Repository,
    old: Option<ObjectId>,
    new: ObjectId,
    context: u32,
    with_hunks: bool,
) -> Result<(DiffStats, Vec<DiffFile>), RepoError> {
    let old_tree = old
        .map(|id| repo.find_tree(id))
        .transpose()
        .map_err(RepoError::git)?;
    let new_tree = repo.find_tree(new).map_err(RepoError::git)?;
    // No rename tracking: the seed's statuses are added/deleted/modified.
    let changes = repo
        .diff_tree_to_tree(old_tree.as_ref(), &new_tree, gix::diff::Options::default())
        .map_err(RepoError::git)?;
    let mut stats = DiffStats::default();
    let mut files = Vec::new();
    for change in changes {
        use gix::object::tree::diff::ChangeDetached as C;
        // (path, old side, new side); trees appear through their files.
        let sides: Vec<(BString, Side, Side)> = match change {
            C::Addition {
                entry_mode,
                id,
                location,
                ..
            } => vec![(location, None, Some((entry_mode, id)))],
            C::Deletion {
                entry_mode,
                id,
                location,
                ..
            } => vec![(location, Some((entry_mode, id)), None)],
            C::Modification {
                previous_entry_mode,
                previous_id,
                entry_mode,
                id,
                location,
            } => {
                if previous_entry_mode.is_tree() != entry_mode.is_tree() {
                    vec![
                        (
                            location.clone(),
                            Some((previous_entry_mode, previous_id)),
                            None,
                        ),
                        (location, None, Some((entry_mode, id))),
                    ]
                } else {
                    vec![(
                        location,
                        Some((previous_entry_mode, previous_id)),
                        Some((entry_mode, id)),
                    )]
                }
            }
            C::Rewrite {
                source_location,
                source_entry_mode,
                source_id,
                entry_mode,
                id,
                location,
                ..
            } => vec![
                (source_location, Some((source_entry_mode, source_id)), None),
                (location, None, Some((entry_mode, id))),
            ],
        };
        for (path, old_side, new_side) in sides {
            let old_side = old_side.filter(|(m, _)| !m.is_tree());
            let new_side = new_side.filter(|(m, _)| !m.is_tree());
            if old_side.is_none() && new_side.is_none() {
                continue;
            }
            let status = match (&old_side, &new_side) {
                (None, _) => FileStatus::Added,
                (_, None) => FileStatus::Deleted,
                _ => FileStatus::Modified,
            };
            let blob = |side: Side| -> Result<Vec<u8>, RepoError> {
                match side {
                    Some((m, id)) if !m.is_commit() => {
                        Ok(repo.find_blob(id).map_err(RepoError::git)?.data.clone())
                    }
                    _ => Ok(Vec::new()),
                }
            };
            let (old_bytes, new_bytes) = (blob(old_side)?, blob(new_side)?);
            let file_diff = diff::file_hunks(&old_bytes, &new_bytes, context);
            stats.files_changed += 1;
            stats.additions += file_diff.additions;
            stats.deletions += file_diff.deletions;
            files.push(DiffFile {
                path: path.to_str_lossy().into_owned(),
                status,
                old_hash: old_side.map(|(_, id)| id.to_string()),
                new_hash: new_side.map(|(_, id)| id.to_string()),
                hunks: with_hunks.then_some(file_diff.hunks),
            });
        }
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok((stats, files))
}

/// The tree and first parent of `commit`.
pub fn commit_tree_and_parent(
    repo: &gix::Repository,
    commit: ObjectId,
) -> Result<(ObjectId, Option<ObjectId>), RepoError> {
    let c = repo.find_commit(commit).map_err(RepoError::git)?;
    let tree = c.tree_id().map_err(RepoError::git)?.detach();
    let parent = c.parent_ids().next().map(|p| p.detach());
    Ok((tree, parent))
}

pub fn tree_of(repo: &gix::Repository, commit: ObjectId) -> Result<ObjectId, RepoError> {
    Ok(commit_tree_and_parent(repo, commit)?.0)
}

/// A checked `repo.apply` op: paths normalised, content decoded.
#[derive(Debug, Clone)]
pub enum Op {
    Put { path: String, bytes: Vec<u8> },
    Delete { path: String, recursive: bool },
    Move { from: String, to: String },
}

impl Op {
    /// Checks one wire op; `index` names it in errors.
    pub fn parse(op: ApplyOp, index: usize) -> Result<Op, RepoError> {
        use super::names::write_path;
        let label = |what: &str| format!("ops[{index}].{what}");
        Ok(match op {
            ApplyOp::Put {
                path,
                content,
                content_base64,
            } => {
                let path = write_path(&path, &label("path"))?;
                let bytes = match (content, content_base64) {
                    (Some(_), Some(_)) => {
                        return Err(RepoError::BadArgument(format!(
                            "put {path} cannot specify both content and contentBase64"
                        )));
                    }
                    (_, Some(b64)) => base64::engine::general_purpose::STANDARD
                        .decode(b64.trim())
                        .map_err(|e| {
                            RepoError::BadArgument(format!(
                                "{}: not base64: {e}",
                                label("contentBase64")
                            ))
                        })?,
                    (Some(text), None) => text.into_bytes(),
                    (None, None) => Vec::new(),
                };
                Op::Put { path, bytes }
            }
            ApplyOp::Delete { path, recursive } => Op::Delete {
                path: write_path(&path, &label("path"))?,
                recursive: recursive == Some(true),
            },
            ApplyOp::Move { from, to } => {
                let from = write_path(&from, &label("from"))?;
                let to = write_path(&to, &label("to"))?;
                if to == from || to.starts_with(&format!("{from}/")) {
                    return Err(RepoError::BadArgument(format!(
                        "move {from} -> {to}: the destination is inside the source"
                    )));
                }
                Op::Move { from, to }
            }
        })
    }
}

/// One commit for `repo.apply` / `repo.create`.
#[derive(Debug, Clone)]
pub struct Commit<'a> {
    pub branch: &'a str,
    pub message: &'a str,
    pub author: &'a Author,
    /// The head the caller saw; `None` rebuilds on whatever head is current.
    pub expected_head: Option<ObjectId>,
    pub allow_empty: bool,
    pub ops: &'a [Op],
}

/// Applies `c.ops` to the branch's tree as one commit and moves the branch
/// to it with a compare-and-swap. Returns the new head.
pub fn apply(repo: &gix::Repository, c: &Commit<'_>) -> Result<ObjectId, RepoError> {
    let mut attempt = 0;
    loop {
        let head = branch_head(repo, c.branch)?;
        if let Some(expected) = c.expected_head
            && head != Some(expected)
        {
            return Err(RepoError::Conflict(format!(
                "expectedHead {expected} is stale: {} is at {}",
                c.branch,
                head.map_or_else(|| "no commit".to_owned(), |h| h.to_string())
            )));
        }
        let base_tree = match head {
            Some(h) => tree_of(repo, h)?,
            None => ObjectId::empty_tree(repo.object_hash()),
        };
        // The new blobs, trees and commit are kept in memory and then
        // written as one pack: one file pair, not a file per object.
        let mut building = repo.clone().with_object_memory();
        let tree = edit_tree(&building, base_tree, c.ops)?;
        if tree == base_tree && !c.allow_empty {
            return Err(RepoError::BadArgument(
                "nothing to commit: the ops leave the tree unchanged (allowEmpty: true commits anyway)"
                    .into(),
            ));
        }
        let commit = new_commit(&building, c.author, c.message, tree, head)?;
        let objects = building.objects.take_object_memory().unwrap_or_default();
        pack::write_objects(repo, &objects)?;
        match move_branch(repo, c.branch, head, commit, c.message) {
            Ok(()) => {
                merge_packs(repo);
                return Ok(commit);
            }
            Err(RepoError::Conflict(_)) if c.expected_head.is_none() && attempt < APPLY_RETRIES => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Merges small packs once too many accumulated. The commit is already
/// made, so a failure here is logged, not the caller's error.
fn merge_packs(repo: &gix::Repository) {
    if let Err(e) = pack::consolidate(repo) {
        tracing::warn!(repo = %repo.path().display(), error = %e, "merging packs failed");
    }
}

/// The tree `ops` make of `base`; every op is checked against the tree as
/// the ops before it left it, so a failing op fails the whole apply.
fn edit_tree(repo: &gix::Repository, base: ObjectId, ops: &[Op]) -> Result<ObjectId, RepoError> {
    let mut files = files(repo, base)?;
    let mut editor = repo.edit_tree(base).map_err(RepoError::git)?;
    let is_dir = |files: &BTreeMap<String, (EntryMode, ObjectId)>, p: &str| {
        let prefix = format!("{p}/");
        files
            .range(prefix.clone()..)
            .next()
            .is_some_and(|(k, _)| k.starts_with(&prefix))
    };
    // A file standing where a parent directory of `path` must go.
    let file_in_the_way = |files: &BTreeMap<String, (EntryMode, ObjectId)>, path: &str| {
        path.match_indices('/')
            .map(|(i, _)| &path[..i])
            .find(|parent| files.contains_key(*parent))
            .map(str::to_owned)
    };
    for op in ops {
        match op {
            Op::Put { path, bytes } => {
                if is_dir(&files, path) {
                    return Err(RepoError::BadArgument(format!(
                        "put {path}: it is a directory"
                    )));
                }
                if let Some(parent) = file_in_the_way(&files, path) {
                    return Err(RepoError::BadArgument(format!(
                        "put {path}: {parent} is a file"
                    )));
                }
                let id = repo.write_blob(bytes).map_err(RepoError::git)?.detach();
                // An executable file stays executable when rewritten.
                let kind = match files.get(path) {
                    Some((m, _)) if m.is_executable() => EntryKind::BlobExecutable,
                    _ => EntryKind::Blob,
                };
                editor
                    .upsert(path.as_str(), kind, id)
                    .map_err(RepoError::git)?;
                files.insert(path.clone(), (kind.into(), id));
            }
            Op::Delete { path, recursive } => {
                if files.remove(path).is_some() {
                    editor.remove(path.as_str()).map_err(RepoError::git)?;
                } else if is_dir(&files, path) {
                    if !recursive {
                        return Err(RepoError::BadArgument(format!(
                            "delete {path}: it is a directory (recursive: true deletes it)"
                        )));
                    }
                    let prefix = format!("{path}/");
                    files.retain(|k, _| !k.starts_with(&prefix));
                    editor.remove(path.as_str()).map_err(RepoError::git)?;
                } else {
                    return Err(RepoError::NotFound(format!("delete {path}: no such path")));
                }
            }
            Op::Move { from, to } => {
                if files.contains_key(to) || is_dir(&files, to) {
                    return Err(RepoError::BadArgument(format!(
                        "move {from} -> {to}: {to} already exists"
                    )));
                }
                if let Some(parent) = file_in_the_way(&files, to) {
                    return Err(RepoError::BadArgument(format!(
                        "move {from} -> {to}: {parent} is a file"
                    )));
                }
                let moved: Vec<(String, (EntryMode, ObjectId))> =
                    if let Some(e) = files.remove(from) {
                        vec![(to.clone(), e)]
                    } else if is_dir(&files, from) {
                        let prefix = format!("{from}/");
                        let under: Vec<String> = files
                            .keys()
                            .filter(|k| k.starts_with(&prefix))
                            .cloned()
                            .collect();
                        under
                            .into_iter()
                            .map(|k| {
                                let e = files.remove(&k).expect("listed above");
                                (format!("{to}/{}", &k[prefix.len()..]), e)
                            })
                            .collect()
                    } else {
                        return Err(RepoError::NotFound(format!("move {from}: no such path")));
                    };
                editor.remove(from.as_str()).map_err(RepoError::git)?;
                for (path, (mode, id)) in moved {
                    editor
                        .upsert(path.as_str(), mode.kind(), id)
                        .map_err(RepoError::git)?;
                    files.insert(path, (mode, id));
                }
            }
        }
    }
    Ok(editor.write().map_err(RepoError::git)?.detach())
}

fn new_commit(
    repo: &gix::Repository,
    author: &Author,
    message: &str,
    tree: ObjectId,
    parent: Option<ObjectId>,
) -> Result<ObjectId, RepoError> {
    let sig = gix::actor::Signature {
        name: author.name.as_str().into(),
        email: author.email.as_str().into(),
        time: gix::date::Time::now_utc(),
    };
    let commit = gix::objs::Commit {
        tree,
        parents: parent.into_iter().collect(),
        author: sig.clone(),
        committer: sig,
        encoding: None,
        message: message.into(),
        extra_headers: Vec::new(),
    };
    Ok(repo.write_object(&commit).map_err(RepoError::git)?.detach())
}

/// Moves `refs/heads/<branch>` from `from` (`None`: it must not exist) to
/// `to`, or fails with a conflict if it is no longer at `from`.
fn move_branch(
    repo: &gix::Repository,
    branch: &str,
    from: Option<ObjectId>,
    to: ObjectId,
    message: &str,
) -> Result<(), RepoError> {
    let expected = match from {
        Some(id) => PreviousValue::MustExistAndMatch(Target::Object(id)),
        None => PreviousValue::MustNotExist,
    };
    let summary = message.lines().next().unwrap_or_default();
    let edit = RefEdit {
        change: Change::Update {
            log: LogChange {
                mode: RefLog::AndReference,
                force_create_reflog: false,
                message: summary.into(),
            },
            expected,
            new: Target::Object(to),
        },
        name: full_branch(branch)?,
        deref: false,
    };
    match repo.edit_reference(edit) {
        Ok(_) => Ok(()),
        Err(e) => {
            // Whether the ref moved under us (a lost race) or the store failed.
            if branch_head(repo, branch)? != from {
                Err(RepoError::Conflict(format!(
                    "{branch} moved while this commit was made; read it again and retry"
                )))
            } else {
                Err(RepoError::git(e))
            }
        }
    }
}

/// `repo.create`'s empty first commit (`None` if the branch exists).
pub fn create_branch(
    repo: &gix::Repository,
    branch: &str,
    message: &str,
    author: &Author,
) -> Result<(ObjectId, bool), RepoError> {
    if let Some(head) = branch_head(repo, branch)? {
        return Ok((head, false));
    }
    let tree = ObjectId::empty_tree(repo.object_hash());
    // The empty tree is implicit in gix; git wants it stored.
    repo.write_object(gix::objs::Tree::empty())
        .map_err(RepoError::git)?;
    let commit = new_commit(repo, author, message, tree, None)?;
    match move_branch(repo, branch, None, commit, message) {
        Ok(()) => Ok((commit, true)),
        // Someone created it first: that is "exists", not an error.
        Err(RepoError::Conflict(_)) => match branch_head(repo, branch)? {
            Some(head) => Ok((head, false)),
            None => Err(RepoError::Git(format!("creating {branch} failed"))),
        },
        Err(e) => Err(e),
    }
}

/// Which upstream URLs an import may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamScheme {
    /// `file://`: a path on the kernel's machine.
    File,
    /// `git://`: git's daemon protocol.
    Git,
}

/// The scheme of an import URL, or why it is refused. https needs gix's
/// http transport (a TLS stack), which this build leaves out.
pub fn upstream_scheme(url: &str) -> Result<UpstreamScheme, RepoError> {
    let parsed = gix::url::parse(gix::bstr::BStr::new(url))
        .map_err(|e| RepoError::BadArgument(format!("remoteUrl {url:?} is not a git URL: {e}")))?;
    match parsed.scheme {
        gix::url::Scheme::File if url.starts_with("file://") => Ok(UpstreamScheme::File),
        gix::url::Scheme::Git => Ok(UpstreamScheme::Git),
        other => Err(RepoError::BadArgument(format!(
            "remoteUrl {url:?}: only file:// and git:// upstreams are supported (not {})",
            other.as_str()
        ))),
    }
}

/// What an import did.
#[derive(Debug, Clone)]
pub struct Imported {
    pub head: ObjectId,
    pub changed: bool,
}

/// Fetches `remote_ref` of `url` and fast-forwards `branch` to it. A
/// branch with commits the upstream lacks is refused (nothing is lost);
/// `interrupt` abandons the transfer (the caller's deadline).
pub fn import(
    repo: &gix::Repository,
    branch: &str,
    url: &str,
    remote_ref: &str,
    message: &str,
    interrupt: &Arc<AtomicBool>,
) -> Result<Imported, RepoError> {
    let upstream_err =
        |e: &dyn std::fmt::Display| RepoError::Upstream(format!("import from {url} failed: {e}"));
    // A refspec with no destination: objects arrive, no tracking ref is
    // written; the branch moves below, with a compare-and-swap.
    let remote = repo
        .remote_at(url)
        .map_err(|e| upstream_err(&e))?
        // Tags are not followed: an import writes the one branch it names.
        .with_fetch_tags(gix::remote::fetch::Tags::None)
        .with_refspecs([remote_ref], gix::remote::Direction::Fetch)
        .map_err(|e| RepoError::BadArgument(format!("remoteRef {remote_ref:?}: {e}")))?;
    let connection = remote
        .connect(gix::remote::Direction::Fetch)
        .map_err(|e| upstream_err(&e))?;
    let prepared = connection
        .prepare_fetch(gix::progress::Discard, Default::default())
        .map_err(|e| upstream_err(&e))?;
    let fetched = prepared
        .ref_map()
        .mappings
        .iter()
        .find_map(|m| m.remote.as_id().map(|id| id.to_owned()))
        .ok_or_else(|| {
            RepoError::NotFound(format!("remoteRef {remote_ref} does not exist at {url}"))
        })?;
    let received = prepared
        .receive(gix::progress::Discard, interrupt)
        .map_err(|e| upstream_err(&e))?;
    // gix keeps a fetched pack's `.keep` until a ref of the fetch moves;
    // this fetch moves none (the branch moves below, by hand), and a
    // `.keep` would hold the pack out of every merge.
    if let gix::remote::fetch::Status::Change {
        write_pack_bundle, ..
    } = &received.status
        && let Some(keep) = &write_pack_bundle.keep_path
    {
        let _ = std::fs::remove_file(keep);
    }
    if interrupt.load(Ordering::Relaxed) {
        return Err(RepoError::Upstream(format!("import from {url} timed out")));
    }
    let upstream = repo
        .find_object(fetched)
        .map_err(RepoError::git)?
        .peel_to_commit()
        .map_err(|_| RepoError::BadArgument(format!("remoteRef {remote_ref} is not a commit")))?
        .id;
    let head = branch_head(repo, branch)?;
    match head {
        Some(h) if h == upstream => {
            return Ok(Imported {
                head: h,
                changed: false,
            });
        }
        Some(h) => {
            let base = repo
                .merge_base(h, upstream)
                .map_err(RepoError::git)?
                .map(|b| b.detach());
            if base == Some(upstream) {
                // The upstream has nothing the branch lacks.
                return Ok(Imported {
                    head: h,
                    changed: false,
                });
            }
            if base != Some(h) {
                return Err(RepoError::Conflict(format!(
                    "{branch} has commits that {url} {remote_ref} lacks; import refuses to drop them"
                )));
            }
        }
        None => {}
    }
    move_branch(repo, branch, head, upstream, message)?;
    merge_packs(repo);
    Ok(Imported {
        head: upstream,
        changed: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One handle kept across applies still finds every commit after
    /// packs were merged under it. (Past about 70 merges one gix store
    /// starts to miss objects in packs that replaced others, a limit of
    /// gix-odb's slot reuse; the handlers open a store per call.)
    #[test]
    fn a_long_lived_handle_survives_pack_merges() {
        let dir = tempfile::tempdir().unwrap();
        let store = RepoStore::new(dir.path().to_path_buf());
        let slug = Slug::parse("alice/merge").unwrap();
        let (repo, _) = store.open_or_init(&slug, "main").unwrap();
        let author = Author {
            name: "alice".into(),
            email: "alice@gsv.local".into(),
        };
        for i in 0..(pack::MAX_PACKS * 6) {
            let ops = [Op::Put {
                path: "counter".into(),
                bytes: i.to_string().into_bytes(),
            }];
            let commit = Commit {
                branch: "main",
                message: "count",
                author: &author,
                expected_head: None,
                allow_empty: false,
                ops: &ops,
            };
            let head = apply(&repo, &commit).unwrap_or_else(|e| panic!("apply {i}: {e}"));
            let page =
                log(&repo, head, 0, 100).unwrap_or_else(|e| panic!("log after apply {i}: {e}"));
            assert_eq!(page.len(), (i + 1).min(100));
        }
    }
}
