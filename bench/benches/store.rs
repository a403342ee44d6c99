//! The workspace store (a real directory plus a SQLite index), 10,000 files:
//! - coalesce: paging through its change stream in pages of 256;
//! - apply: 10,000 file entries (objects staged beforehand) in batches of
//!   256 into an empty workspace, files written to disk;
//! - settle: the no-op walk that finds nothing changed (what bounds a no-op
//!   push), against a bare `readdir` + `lstat` walk of the same tree in the
//!   same run, and the first settle that hashes the whole tree.

use std::path::Path;
use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use wsd::store::{StoreOptions, WorkspaceStore};
use wsd_bench::{Scratch, open_local, text};
use wsd_sync::{
    ApplyBatch, Baseline, ChangeCursor, ChangeEntry, ChangesQuery, ChunkRef, EntryState, Hash,
    IgnoreRules, Object, Store, SyncPath,
};

const ENTRIES: usize = 10_000;
const BATCH: usize = 256;

fn path(i: usize) -> String {
    format!("d{:02}/f{i:05}.txt", i % 100)
}

/// 10,000 small text entries (plus their 100 directories) and objects.
fn entries() -> (Vec<ChangeEntry>, Vec<Object>) {
    let mut entries = Vec::with_capacity(ENTRIES + 100);
    let mut objects = Vec::with_capacity(ENTRIES);
    for d in 0..100 {
        entries.push(ChangeEntry {
            rev: 1,
            path: SyncPath::new(format!("d{d:02}")).unwrap(),
            state: EntryState::Dir {
                mode: 0o755,
                mtime: 1_700_000_000_000,
            },
        });
    }
    for i in 0..ENTRIES {
        let bytes = text(1024 + (i * 37) % 3000, i as u64);
        let hash = Hash::of(&bytes);
        entries.push(ChangeEntry {
            rev: 1,
            path: SyncPath::new(path(i)).unwrap(),
            state: EntryState::File {
                mode: 0o644,
                mtime: 1_700_000_000_000,
                size: bytes.len() as u64,
                chunks: vec![ChunkRef {
                    hash,
                    size: bytes.len() as u32,
                }],
            },
        });
        objects.push(Object { hash, bytes });
    }
    entries.sort_by(|a, b| a.path.cmp(&b.path));
    (entries, objects)
}

fn apply_all<S: Store>(store: &mut S, entries: &[ChangeEntry]) {
    for (k, batch) in entries.chunks(BATCH).enumerate() {
        let last = batch.last().unwrap();
        let sender = if (k + 1) * BATCH >= entries.len() {
            ChangeCursor::at(last.rev)
        } else {
            ChangeCursor::within(last.rev, last.path.clone())
        };
        let out = store
            .apply(ApplyBatch {
                remote: "bench",
                sender: Some(sender),
                entries: batch,
                baseline: Baseline::Off,
                ignore: &wsd_sync::IgnoreRules::none(),
            })
            .unwrap();
        assert_eq!(out.applied, batch.len());
    }
}

fn coalesce_all<S: Store>(store: &mut S) -> usize {
    let ignore = IgnoreRules::none();
    let window = store.open_changes(&ChangeCursor::ZERO).unwrap();
    let mut after = ChangeCursor::ZERO;
    let mut n = 0;
    loop {
        let page = store
            .changes(ChangesQuery {
                after: &after,
                through: &window.through,
                ignore: &ignore,
                exclude_applied_from: Some("someone-else"),
                limit: BATCH,
            })
            .unwrap();
        n += page.len();
        match page.last() {
            Some(e) if page.len() == BATCH => after = ChangeCursor::within(e.rev, e.path.clone()),
            _ => return n,
        }
    }
}

/// A workspace store as the daemon opens it, without a watcher (every
/// settle walks).
fn daemon_store(root: &Path, state: &Path) -> WorkspaceStore {
    std::fs::create_dir_all(root).unwrap();
    WorkspaceStore::open(
        root,
        state,
        StoreOptions {
            watch: false,
            ..StoreOptions::default()
        },
    )
    .unwrap()
}

fn coalesce_and_apply(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let (entries, objects) = entries();
    let mut g = c.benchmark_group("workspace_10k");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ENTRIES as u64));
    g.measurement_time(Duration::from_secs(20));

    let mut ws = daemon_store(&scratch.dir(), &scratch.dir());
    ws.stage_objects(&objects).unwrap();
    apply_all(&mut ws, &entries);
    g.bench_function("coalesce_pages_of_256", |b| {
        b.iter(|| assert_eq!(coalesce_all(&mut ws), entries.len()))
    });

    g.bench_function("apply_batches_of_256", |b| {
        b.iter_batched(
            || {
                let mut ws = daemon_store(&scratch.dir(), &scratch.dir());
                ws.stage_objects(&objects).unwrap();
                ws
            },
            |mut ws| {
                apply_all(&mut ws, &entries);
                ws
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// Counts entries with `readdir` + `lstat`, nothing else: the floor of a
/// settle's walk.
fn stat_walk(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let m = e.metadata().unwrap();
        n += 1;
        if m.is_dir() {
            n += stat_walk(&e.path());
        }
    }
    n
}

fn settle(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let tree = scratch.dir();
    for i in 0..ENTRIES {
        let p = tree.join(path(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text(1024 + (i * 37) % 3000, i as u64)).unwrap();
    }
    let mut g = c.benchmark_group("settle_10k");
    g.sample_size(20);
    g.throughput(Throughput::Elements((ENTRIES + 100) as u64));
    g.bench_function("first_settle_hashes_everything", |b| {
        b.iter_batched(
            || open_local(&tree, &scratch.dir()),
            |mut local| {
                local.settle().unwrap();
                local
            },
            BatchSize::PerIteration,
        )
    });
    let mut local = open_local(&tree, &scratch.dir());
    local.settle().unwrap();
    // Files written more than the racy margin ago are trusted by stat.
    std::thread::sleep(Duration::from_millis(2100));
    local.settle().unwrap();
    g.bench_function("noop_settle_walk", |b| {
        b.iter(|| assert_eq!(local.settle().unwrap().changed, 0))
    });
    g.bench_function("baseline_readdir_lstat_walk", |b| {
        b.iter(|| assert_eq!(stat_walk(&tree), ENTRIES + 100))
    });
    g.finish();
}

criterion_group!(benches, coalesce_and_apply, settle);
criterion_main!(benches);
