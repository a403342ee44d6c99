//! Packs for `repo.*`'s writes. An apply's new objects go into one pack
//! and its index (`objects/pack/pack-*.{pack,idx}`) instead of one loose
//! file each (a temp file and a rename per object); and once more than
//! [`MAX_PACKS`] packs sit there, the small ones are merged (git's
//! `repack --geometric=2`), so a read searches a handful of indexes.
//!
//! gix writes the pack stream (`gix_pack::data::output`) and indexes it
//! into place (`Bundle::write_to_directory`); nothing here encodes the
//! format by hand. Objects are stored whole (no deltas): packs stay valid
//! for git, which re-deltifies them if its own `gc` ever runs.

use std::collections::{BTreeSet, HashSet};
use std::io::{BufReader, Seek as _, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::AtomicBool;

use gix::ObjectId;
use gix::objs::Find as _;
use gix::odb::memory::Storage;
use gix::zlib::Compression;
use gix_pack::data::output::{self, bytes::FromEntriesIter};

use super::error::RepoError;

/// Small packs are merged once a repository holds more than this many.
pub const MAX_PACKS: usize = 16;
/// A pack stays out of a merge only if it holds at least this many times
/// the objects of all smaller packs together.
const GEOMETRIC_FACTOR: u64 = 2;
/// Objects compressed and written per step of a merge.
const MERGE_CHUNK: usize = 512;

/// The repositories whose packs are being merged by this process: a
/// second merge of the same packs would only race the first one.
static MERGING: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

fn pack_dir(repo: &gix::Repository) -> PathBuf {
    repo.path().join("objects").join("pack")
}

/// Writes `objects` (an apply's, kept in memory while it was built) as
/// one pack and its index. Nothing is written for no objects.
pub fn write_objects(repo: &gix::Repository, objects: &Storage) -> Result<(), RepoError> {
    if objects.is_empty() {
        return Ok(());
    }
    let entries = objects
        .iter()
        .map(|(id, (kind, data))| {
            let data = gix::objs::Data::new(data, *kind, repo.object_hash());
            entry(*id, &data, Compression::BEST_SPEED)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let count = entries.len();
    let stream = pack_stream(Vec::new(), repo.object_hash(), count, [Ok(entries)])?;
    index_into(&pack_dir(repo), repo.object_hash(), &mut stream.as_slice())?;
    Ok(())
}

fn entry(
    id: ObjectId,
    data: &gix::objs::Data<'_>,
    compression: Compression,
) -> Result<output::Entry, RepoError> {
    output::Entry::from_data(&output::Count::from_data(id, None), data, compression)
        .map_err(RepoError::git)
}

/// The pack data stream of `count` entries, written to `out`.
fn pack_stream<W: Write>(
    out: W,
    hash: gix::hash::Kind,
    count: usize,
    chunks: impl IntoIterator<Item = Result<Vec<output::Entry>, RepoError>>,
) -> Result<W, RepoError> {
    let count = u32::try_from(count)
        .map_err(|_| RepoError::Git(format!("{count} objects do not fit one pack")))?;
    // The writer wants gix's own error type from its input; ours is carried
    // out through `failed` and reported instead.
    let mut failed = None;
    let input = chunks.into_iter().map_while(|chunk| match chunk {
        Ok(entries) => Some(Ok(entries)),
        Err(e) => {
            failed = Some(e);
            None
        }
    });
    let mut writer = FromEntriesIter::new(input, out, count, gix_pack::data::Version::V2, hash);
    for written in &mut writer {
        written.map_err(RepoError::git)?;
    }
    let out = writer.into_write();
    // An input error ended the stream early: what was written is no pack.
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Indexes a pack stream and moves the pack and its index into `dir`.
/// Returns the index's path.
fn index_into(
    dir: &Path,
    hash: gix::hash::Kind,
    stream: &mut dyn std::io::BufRead,
) -> Result<Option<PathBuf>, RepoError> {
    let outcome = gix_pack::Bundle::write_to_directory(
        stream,
        Some(dir),
        &mut gix::progress::Discard,
        &AtomicBool::new(false),
        None::<gix::objs::find::Never>,
        hash,
        gix_pack::bundle::write::Options {
            thread_limit: Some(1),
            ..Default::default()
        },
    )
    .map_err(RepoError::git)?;
    // The `.keep` guards a fetched pack until refs point into it; these
    // objects are ours and the caller moves the ref next.
    if let Some(keep) = outcome.keep_path {
        let _ = std::fs::remove_file(keep);
    }
    Ok(outcome.index_path)
}

/// One pack in `objects/pack`.
#[derive(Debug)]
struct PackFile {
    index: PathBuf,
    objects: u64,
}

/// Every pack with an index and no `.keep`, smallest first.
fn packs(dir: &Path, hash: gix::hash::Kind) -> Result<Vec<PackFile>, RepoError> {
    let mut out = Vec::new();
    let Ok(listing) = std::fs::read_dir(dir) else {
        return Ok(out);
    };
    for entry in listing.flatten() {
        let path = entry.path();
        if path.extension().is_none_or(|e| e != "idx") || path.with_extension("keep").exists() {
            continue;
        }
        let index = gix_pack::index::File::at(&path, hash).map_err(RepoError::git)?;
        out.push(PackFile {
            index: path,
            objects: u64::from(index.num_objects()),
        });
    }
    out.sort_by_key(|p| p.objects);
    Ok(out)
}

/// How many of `packs` (smallest first) to merge: all up to the last one
/// holding fewer than [`GEOMETRIC_FACTOR`] times the objects of those
/// before it, so the packs left are a geometric progression.
fn merge_split(packs: &[PackFile]) -> usize {
    let mut smaller = 0;
    let mut split = 0;
    for (i, p) in packs.iter().enumerate() {
        if p.objects < GEOMETRIC_FACTOR * smaller {
            split = i + 1;
        }
        smaller += p.objects;
    }
    split
}

/// Merges small packs into one when more than [`MAX_PACKS`] exist.
/// Returns how many packs were merged (0: none). Readers are safe
/// throughout: the merged pack is in place before the old ones go, and
/// git and gix look again when an object's pack has vanished.
pub fn consolidate(repo: &gix::Repository) -> Result<usize, RepoError> {
    let dir = pack_dir(repo);
    let hash = repo.object_hash();
    let mut all = packs(&dir, hash)?;
    if all.len() <= MAX_PACKS {
        return Ok(0);
    }
    {
        let mut merging = MERGING.lock().unwrap_or_else(|p| p.into_inner());
        if !merging.insert(dir.clone()) {
            return Ok(0);
        }
    }
    let result = (|| {
        let split = merge_split(&all);
        if split < 2 {
            return Ok(0);
        }
        all.truncate(split);
        merge(repo, &dir, &all)?;
        Ok(split)
    })();
    MERGING
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&dir);
    result
}

fn merge(repo: &gix::Repository, dir: &Path, packs: &[PackFile]) -> Result<(), RepoError> {
    let hash = repo.object_hash();
    let mut ids = HashSet::new();
    for p in packs {
        let index = gix_pack::index::File::at(&p.index, hash).map_err(RepoError::git)?;
        ids.extend(index.iter().map(|e| e.oid));
    }
    let ids: Vec<ObjectId> = ids.into_iter().collect();
    let mut buf = Vec::new();
    let chunks = ids.chunks(MERGE_CHUNK).map(|chunk| {
        chunk
            .iter()
            .map(|id| {
                let data = repo
                    .objects
                    .try_find(id, &mut buf)
                    .map_err(RepoError::git)?
                    .ok_or_else(|| RepoError::Git(format!("object {id} vanished from its pack")))?;
                entry(*id, &data, Compression::DEFAULT)
            })
            .collect::<Result<Vec<_>, _>>()
    });
    // Streamed through an unnamed temp file: a merge may be larger than
    // what an apply keeps in memory.
    let file = tempfile::tempfile_in(dir).map_err(RepoError::git)?;
    let mut file = pack_stream(file, hash, ids.len(), chunks)?;
    file.rewind().map_err(RepoError::git)?;
    let merged = index_into(dir, hash, &mut BufReader::new(file))?;
    for p in packs {
        if Some(&p.index) == merged.as_ref() {
            continue;
        }
        // The index first: a pack without one is invisible, an index
        // without its pack is an error to a reader.
        std::fs::remove_file(&p.index).map_err(RepoError::git)?;
        for ext in ["pack", "rev", "bitmap"] {
            let _ = std::fs::remove_file(p.index.with_extension(ext));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(v: &[u64]) -> Vec<PackFile> {
        v.iter()
            .map(|&objects| PackFile {
                index: PathBuf::new(),
                objects,
            })
            .collect()
    }

    #[test]
    fn the_split_leaves_a_geometric_progression() {
        // Equal small packs merge entirely.
        assert_eq!(merge_split(&sizes(&[3, 3, 3, 3])), 4);
        // A big pack stays when the small ones are under half of it.
        assert_eq!(merge_split(&sizes(&[3, 3, 3, 100])), 3);
        // ... and joins when they are not.
        assert_eq!(merge_split(&sizes(&[3, 3, 3, 10])), 4);
        // Already geometric: nothing to merge.
        assert_eq!(merge_split(&sizes(&[1, 2, 6, 20])), 0);
    }
}
