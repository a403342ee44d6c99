//! Property test of garbage collection racing pushes: pushes are split at
//! the point a real one is exposed (probe and stage its chunks, ... later,
//! apply the entry naming them), and collections, local writes, deletes
//! and snapshots happen in between, in any order, on a real SQLite file.
//!
//! Each collection's cutoff is the start of the oldest push in flight: a
//! grace window just as long as the pushes take. Old garbage (deleted
//! files, dropped snapshots, earlier staged chunks) really is collected;
//! what must hold is that no apply ever misses a chunk, every live file and
//! every kept snapshot reads back exactly, and the integrity check passes.
//!
//! The same runs again with chunk bytes in an (in-memory) object store,
//! where the chunks of a batch share a pack: each collection also sweeps
//! the store as the kernel does (`ObjectChunks::collect` of the objects
//! older than the cutoff against the index rows of every store), so a pack
//! is deleted only when no row reads from it, and a pack mostly dead is
//! rewritten with its live chunks, every row naming it moved (the tree's
//! and those of forks taken along the way, which share its packs), before
//! it is deleted.
//!
//! Cases: `PROPTEST_CASES` or 32.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use proptest::prelude::*;
use wsd_dofs::{Dofs, DofsError, ObjectChunks, WriteOptions};
use wsd_sync::{
    ApplyBatch, Baseline, ChangeEntry, ChunkRef, EntryState, Hash, IgnoreRules, Object, Store,
    chunk,
};

use crate::util::{noise, p};

const PATHS: usize = 4;

/// Small and multi-chunk contents; 2 and 3 share most of their chunks,
/// so a push finds some already held (perhaps as garbage).
fn content(i: usize) -> Vec<u8> {
    static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let big = || BIG.get_or_init(|| noise(200 * 1024, 7)).clone();
    match i {
        0 => b"alpha".to_vec(),
        1 => b"beta".to_vec(),
        2 => big(),
        _ => {
            let mut b = big();
            b.extend_from_slice(b"a different tail");
            b
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Probe and stage the chunks of `content` for a push to `path`.
    Begin {
        content: usize,
        path: usize,
    },
    /// Apply the `n`-th push in flight.
    Finish(usize),
    Write {
        content: usize,
        path: usize,
    },
    Remove(usize),
    /// Writes every path in one batch (one upload, so its new chunks
    /// share packs), path `i` getting content `(i + shift) % 4`.
    WriteAll(usize),
    /// Forks the newest snapshot into a store of its own over the same
    /// bucket (its rows name the same packs).
    Fork,
    Snapshot,
    DropSnapshot(usize),
    Collect,
    /// A collection reaching one store at a time, with a write of
    /// `content` to `path` into the tree's store after its mark (before
    /// the forks'): the write must not reuse an object the collection
    /// deletes.
    CollectWriting {
        content: usize,
        path: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..4, 0..PATHS).prop_map(|(content, path)| Op::Begin { content, path }),
        3 => (0usize..4).prop_map(Op::Finish),
        2 => (0usize..4, 0..PATHS).prop_map(|(content, path)| Op::Write { content, path }),
        2 => (0..PATHS).prop_map(Op::Remove),
        1 => (0usize..4).prop_map(Op::WriteAll),
        1 => Just(Op::Fork),
        1 => Just(Op::Snapshot),
        1 => (0usize..4).prop_map(Op::DropSnapshot),
        3 => Just(Op::Collect),
        2 => (0usize..4, 0..PATHS).prop_map(|(content, path)| Op::CollectWriting { content, path }),
    ]
}

struct InFlight {
    started: SystemTime,
    path: usize,
    content: usize,
    chunks: Vec<ChunkRef>,
}

fn path(i: usize) -> String {
    format!("p{i}")
}

/// What a real push does before its apply: asks which chunks the store
/// holds and sends only the others.
fn begin(d: &mut Dofs, content_index: usize, path: usize) -> InFlight {
    // Whatever was stored before this push is strictly older than its start.
    std::thread::sleep(Duration::from_millis(2));
    let started = SystemTime::now();
    let bytes = content(content_index);
    let cut = chunk::chunk_slice(&bytes);
    let hashes: Vec<Hash> = cut.iter().map(|(_, c)| c.hash).collect();
    let held = d.has_objects(&hashes).unwrap();
    let objects: Vec<Object> = cut
        .iter()
        .filter(|(_, c)| !held.contains(&c.hash))
        .map(|(off, c)| Object {
            hash: c.hash,
            bytes: bytes[*off..*off + c.size as usize].to_vec(),
        })
        .collect();
    d.stage_objects(&objects).unwrap();
    InFlight {
        started,
        path,
        content: content_index,
        chunks: cut.into_iter().map(|(_, c)| c).collect(),
    }
}

fn finish(d: &mut Dofs, push: InFlight) {
    let size = push.chunks.iter().map(|c| u64::from(c.size)).sum();
    let entry = ChangeEntry {
        rev: 1,
        path: p(&path(push.path)),
        state: EntryState::File {
            mode: 0o644,
            mtime: 1,
            size,
            chunks: push.chunks,
        },
    };
    d.apply(ApplyBatch {
        remote: "peer",
        sender: None,
        entries: &[entry],
        baseline: Baseline::Off,
        ignore: &IgnoreRules::none(),
    })
    .unwrap_or_else(|e| panic!("a push in flight lost a chunk to a collection: {e}"));
}

type Model = BTreeMap<usize, usize>;

fn check_tree(d: &Dofs, model: &Model) {
    for i in 0..PATHS {
        match model.get(&i) {
            Some(c) => assert_eq!(
                d.read_file(&p(&path(i))).unwrap(),
                content(*c),
                "{}",
                path(i)
            ),
            None => assert!(!d.exists(&p(&path(i))).unwrap(), "{}", path(i)),
        }
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

/// A collection as the kernel runs it: each store's, then (with an object
/// store) a collection of the objects stored before `cutoff` against the
/// rows of the tree's store and of every fork.
fn collect(d: &mut Dofs, forks: &mut [Fork], bucket: Option<&ObjectChunks>, cutoff: SystemTime) {
    collect_writing(d, forks, bucket, cutoff, None);
}

/// [`collect`] reaching one store at a time (the kernel's way), writing
/// `write` (path, content) into the tree's store after its mark.
fn collect_writing(
    d: &mut Dofs,
    forks: &mut [Fork],
    bucket: Option<&ObjectChunks>,
    cutoff: SystemTime,
    write: Option<(usize, usize)>,
) {
    d.collect_garbage_stored_before(cutoff).unwrap();
    for fork in forks.iter_mut() {
        fork.store.collect_garbage_stored_before(cutoff).unwrap();
    }
    let opts = WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    };
    let mut write = write;
    let mut write_now = |d: &mut Dofs| {
        if let Some((i, c)) = write.take() {
            d.write_file_with(&p(&path(i)), content(c).as_slice(), opts)
                .unwrap();
        }
    };
    let Some(bucket) = bucket else {
        write_now(d);
        return;
    };
    let stale = bucket.stale_objects(cutoff).unwrap();
    let mut each = |f: &mut dyn FnMut(&mut Dofs) -> Result<(), DofsError>| {
        f(d)?;
        write_now(d);
        forks.iter_mut().try_for_each(|fork| f(&mut fork.store))
    };
    bucket
        .collect_each(stale, &mut each, &HashSet::new())
        .unwrap();
    // Nothing stale: the collection reached no store.
    write_now(d);
}

/// After a collection with nothing in flight: every pack left is read
/// from by some row, and less than the repack share of its chunk bytes is
/// dead (rows reading its chunks elsewhere count as dead here).
fn no_pack_is_mostly_dead(bucket: &ObjectChunks, d: &Dofs, forks: &[Fork]) {
    let stale = bucket
        .stale_objects(SystemTime::now() + Duration::from_secs(1))
        .unwrap();
    let hashes: Vec<Hash> = stale.iter().flat_map(|o| o.chunks.clone()).collect();
    let mut places: HashSet<(Hash, Option<Hash>)> = HashSet::new();
    for store in std::iter::once(d).chain(forks.iter().map(|f| &f.store)) {
        places.extend(store.chunk_places(&hashes).unwrap());
    }
    let (share, of) = wsd_dofs::REPACK_DEAD_SHARE;
    for object in stale {
        let Some(pack) = object.pack else { continue };
        let (mut live, mut dead) = (0u64, 0u64);
        for (hash, slot) in object.chunks.iter().zip(&object.slots) {
            match places.contains(&(*hash, Some(pack))) || places.contains(&(*hash, None)) {
                true => live += u64::from(slot.len),
                false => dead += u64::from(slot.len),
            }
        }
        assert!(
            live > 0,
            "pack {pack}: no row reads from it, yet it is left"
        );
        assert!(
            dead * of < (live + dead) * share,
            "pack {pack}: {dead} of {} bytes dead after a collection",
            live + dead
        );
    }
}

/// A store forked from a snapshot, and the tree it must keep reading.
struct Fork {
    store: Dofs,
    model: Model,
    _dir: tempfile::TempDir,
}

fn in_memory_bucket() -> Arc<ObjectChunks> {
    Arc::new(
        ObjectChunks::over(
            Arc::new(object_store::memory::InMemory::new()),
            "gc",
            "memory://gc".into(),
            wsd_dofs::DEFAULT_DEADLINE,
        )
        .unwrap(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn a_collection_racing_pushes_and_snapshots_never_frees_a_chunk_they_need(
        ops in prop::collection::vec(op(), 1..40),
    ) {
        race(ops, None);
    }

    #[test]
    fn a_sweep_of_packs_racing_pushes_and_snapshots_never_frees_a_chunk_they_need(
        ops in prop::collection::vec(op(), 1..40),
    ) {
        race(ops, Some(in_memory_bucket()));
    }
}

fn race(ops: Vec<Op>, bucket: Option<Arc<ObjectChunks>>) {
    let dir = tempfile::tempdir().unwrap();
    let mut d = Dofs::open(dir.path().join("gc.dofs")).unwrap();
    if let Some(bucket) = &bucket {
        d.keep_chunks_in(bucket.clone());
    }
    let shared = bucket.clone();
    let bucket = bucket.as_deref();
    let mut forks: Vec<Fork> = Vec::new();
    let mut model = Model::new();
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut snapshots: Vec<(String, Model)> = Vec::new();
    let mut taken = 0;
    let opts = WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    };
    for op in ops {
        match op {
            Op::Begin { content, path } => in_flight.push(begin(&mut d, content, path)),
            Op::Finish(n) if !in_flight.is_empty() => {
                let push = in_flight.remove(n % in_flight.len());
                model.insert(push.path, push.content);
                finish(&mut d, push);
            }
            Op::Finish(_) => {}
            Op::Write {
                content: c,
                path: i,
            } => {
                d.write_file_with(&p(&path(i)), content(c).as_slice(), opts)
                    .unwrap();
                model.insert(i, c);
            }
            Op::Remove(i) => {
                if model.remove(&i).is_some() {
                    d.rm(&p(&path(i)), false).unwrap();
                }
            }
            Op::WriteAll(shift) => {
                let paths: Vec<_> = (0..PATHS).map(|i| p(&path(i))).collect();
                let contents: Vec<Vec<u8>> = (0..PATHS).map(|i| content((i + shift) % 4)).collect();
                d.write_files(
                    paths
                        .iter()
                        .zip(&contents)
                        .map(|(path, c)| (path, c.as_slice(), opts)),
                )
                .unwrap();
                for i in 0..PATHS {
                    model.insert(i, (i + shift) % 4);
                }
            }
            Op::Fork => {
                // Over the bucket only: a fork between stores of one
                // bucket copies index rows, pack ranges included.
                if let (Some(bucket), Some((id, at))) = (&shared, snapshots.last()) {
                    let dir = tempfile::tempdir().unwrap();
                    let mut store = Dofs::open(dir.path().join("fork.dofs")).unwrap();
                    store.keep_chunks_in(bucket.clone());
                    store.fork_from(&d, id).unwrap();
                    forks.push(Fork {
                        store,
                        model: at.clone(),
                        _dir: dir,
                    });
                }
            }
            Op::Snapshot => {
                taken += 1;
                let id = format!("s{taken}");
                d.create_snapshot(&id).unwrap();
                snapshots.push((id, model.clone()));
            }
            Op::DropSnapshot(n) if !snapshots.is_empty() => {
                let (id, _) = snapshots.remove(n % snapshots.len());
                d.delete_snapshot(&id).unwrap();
            }
            Op::DropSnapshot(_) => {}
            Op::Collect => {
                let cutoff = in_flight
                    .iter()
                    .map(|f| f.started)
                    .min()
                    .unwrap_or_else(SystemTime::now);
                collect(&mut d, &mut forks, bucket, cutoff);
            }
            Op::CollectWriting {
                content: c,
                path: i,
            } => {
                let cutoff = in_flight
                    .iter()
                    .map(|f| f.started)
                    .min()
                    .unwrap_or_else(SystemTime::now);
                collect_writing(&mut d, &mut forks, bucket, cutoff, Some((i, c)));
                model.insert(i, c);
            }
        }
        check_tree(&d, &model);
        for fork in &forks {
            check_tree(&fork.store, &fork.model);
        }
    }
    for push in in_flight.drain(..) {
        model.insert(push.path, push.content);
        finish(&mut d, push);
    }
    check_tree(&d, &model);
    d.check_integrity().unwrap();
    // Every kept snapshot still has every chunk it names.
    for (id, at) in &snapshots {
        d.restore_snapshot(id).unwrap();
        check_tree(&d, at);
    }
    // And with nothing in flight, everything unreferenced goes (whole
    // packs too); what is left still reads.
    collect(
        &mut d,
        &mut forks,
        bucket,
        SystemTime::now() + Duration::from_secs(1),
    );
    d.check_integrity().unwrap();
    for fork in &forks {
        fork.store.check_integrity().unwrap();
        check_tree(&fork.store, &fork.model);
    }
    if let Some(bucket) = bucket {
        no_pack_is_mostly_dead(bucket, &d, &forks);
    }
    match snapshots.last() {
        Some((_, at)) => check_tree(&d, at),
        None => check_tree(&d, &model),
    }
    for (id, at) in &snapshots {
        d.restore_snapshot(id).unwrap();
        check_tree(&d, at);
    }
}
