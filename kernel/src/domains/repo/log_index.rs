//! `repo.log`'s first-parent index, so a deep page decodes its own
//! commits and not every commit above it. gix reads git's commit-graph
//! but cannot write one, so the repository keeps this file of its own.
//!
//! `<repo>.git/gsv-first-parent` holds one commit's first-parent chain
//! as raw ids, root first (that commit is the last record). Commits never
//! change, so any commit in the file has the prefix ending at it as its
//! own chain; a newer head is walked back only until it meets a commit
//! the file holds, and the file is rewritten for that head. Git ignores
//! the file (clones, fsck, gc).

use std::collections::HashMap;
use std::io::Write as _;
use std::path::Path;

use gix::ObjectId;

use super::error::RepoError;

const FILE: &str = "gsv-first-parent";

/// The first-parent chain ending at `tip`, root first.
pub fn chain(repo: &gix::Repository, tip: ObjectId) -> Result<Vec<ObjectId>, RepoError> {
    let path = repo.path().join(FILE);
    let mut chain = read(&path, repo.object_hash());
    if let Some(at) = chain.iter().rposition(|id| *id == tip) {
        chain.truncate(at + 1);
        return Ok(chain);
    }
    let known: HashMap<ObjectId, usize> =
        chain.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    let mut newer = Vec::new();
    let mut joined = None;
    let walk = repo
        .rev_walk([tip])
        .first_parent_only()
        .all()
        .map_err(RepoError::git)?;
    for info in walk {
        let id = info.map_err(RepoError::git)?.id;
        if let Some(&at) = known.get(&id) {
            joined = Some(at);
            break;
        }
        newer.push(id);
    }
    chain.truncate(joined.map_or(0, |at| at + 1));
    chain.extend(newer.into_iter().rev());
    // A failed write costs the next deep page a walk, nothing else.
    if let Err(e) = write(&path, &chain) {
        tracing::warn!(path = %path.display(), error = %e, "writing the log index failed");
    }
    Ok(chain)
}

/// The chain on disk; a missing or torn file is an empty chain.
fn read(path: &Path, hash: gix::hash::Kind) -> Vec<ObjectId> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let width = hash.len_in_bytes();
    if bytes.len() % width != 0 {
        return Vec::new();
    }
    bytes
        .chunks_exact(width)
        .map(ObjectId::from_bytes_or_panic)
        .collect()
}

/// Replaces the file at once (a reader sees the old chain or the new).
fn write(path: &Path, chain: &[ObjectId]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    let mut bytes = Vec::with_capacity(chain.len() * 20);
    for id in chain {
        bytes.extend_from_slice(id.as_bytes());
    }
    file.write_all(&bytes)?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}
