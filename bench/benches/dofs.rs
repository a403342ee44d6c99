//! dofs, the authority-side store (all in one SQLite database):
//! - write and read throughput of one 64 MiB file and of 1,000 4 KiB files,
//!   against writing and reading the same bytes as plain files in the same
//!   run (the baseline), and the 1,000 files as one `write_files` batch;
//! - coalesce: paging through the change stream of a 10,000-file store in
//!   pages of 256 (`Store::changes`, as a push or a fetch does);
//! - apply: 10,000 file entries (objects staged beforehand) in batches of
//!   256, as a pull or a peer's push applies them.

use std::time::Duration;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use wsd_bench::{Scratch, pseudo_random, text};
use wsd_dofs::{Dofs, WriteOptions};
use wsd_sync::{
    ApplyBatch, Baseline, ChangeCursor, ChangeEntry, ChangesQuery, ChunkRef, EntryState, Hash,
    IgnoreRules, Object, Store, SyncPath,
};

const ENTRIES: usize = 10_000;
const BATCH: usize = 256;

fn p(s: &str) -> SyncPath {
    SyncPath::new(s).unwrap()
}

fn parents() -> WriteOptions {
    WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    }
}

/// Path of file `i` among 10,000: 100 directories of 100 files.
fn path(i: usize) -> String {
    format!("d{:02}/f{i:05}.txt", i % 100)
}

fn throughput(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let big = pseudo_random(64 * 1024 * 1024, 7);
    let mut g = c.benchmark_group("dofs_file");
    g.sample_size(10);
    g.throughput(Throughput::Bytes(big.len() as u64));
    let dir = scratch.dir();
    let mut d = Dofs::open(dir.join("dofs.sqlite3")).unwrap();
    let mut n = 0u64;
    // Fresh bytes for every write (dofs would deduplicate a repeat).
    g.bench_function("write_64MiB", |b| {
        b.iter_batched(
            || {
                n += 1;
                (n, pseudo_random(big.len(), 100 + n))
            },
            |(n, bytes)| {
                d.write_file_with(&p(&format!("w/big{n}")), &bytes[..], parents())
                    .unwrap()
            },
            BatchSize::PerIteration,
        )
    });
    d.write_file_with(&p("r/big"), &big[..], parents()).unwrap();
    g.bench_function("read_64MiB", |b| {
        b.iter(|| d.read_file(&p("r/big")).unwrap().len())
    });
    let plain = scratch.dir();
    g.bench_function("baseline_plain_file_write_64MiB", |b| {
        b.iter_batched(
            || {
                n += 1;
                (n, pseudo_random(big.len(), 100 + n))
            },
            |(n, bytes)| std::fs::write(plain.join(format!("big{n}")), &bytes).unwrap(),
            BatchSize::PerIteration,
        )
    });
    std::fs::write(plain.join("r"), &big).unwrap();
    g.bench_function("baseline_plain_file_read_64MiB", |b| {
        b.iter(|| std::fs::read(plain.join("r")).unwrap().len())
    });
    g.finish();

    let files = 1000;
    let small = |round: u64| -> Vec<Vec<u8>> {
        (0..files).map(|i| text(4096, round * 10_000 + i)).collect()
    };
    let mut g = c.benchmark_group("dofs_small_files");
    g.sample_size(10);
    g.throughput(Throughput::Elements(files));
    let mut round = 0u64;
    g.bench_function("write_1000x4KiB", |b| {
        b.iter_batched(
            || {
                round += 1;
                (round, small(round))
            },
            |(round, small)| {
                for (i, s) in small.iter().enumerate() {
                    d.write_file_with(&p(&format!("s{round}/f{i:04}")), &s[..], parents())
                        .unwrap();
                }
            },
            BatchSize::PerIteration,
        )
    });
    // The same files through `Dofs::write_files`: one transaction, one rev.
    g.bench_function("write_1000x4KiB_one_batch", |b| {
        b.iter_batched(
            || {
                round += 1;
                let paths: Vec<SyncPath> = (0..files)
                    .map(|i| p(&format!("s{round}/f{i:04}")))
                    .collect();
                (paths, small(round))
            },
            |(paths, small)| {
                d.write_files(
                    paths
                        .iter()
                        .zip(&small)
                        .map(|(path, s)| (path, &s[..], parents())),
                )
                .unwrap()
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("read_1000x4KiB", |b| {
        b.iter(|| {
            (0..files)
                .map(|i| d.read_file(&p(&format!("s1/f{i:04}"))).unwrap().len())
                .sum::<usize>()
        })
    });
    g.bench_function("baseline_plain_write_1000x4KiB", |b| {
        b.iter_batched(
            || {
                round += 1;
                (round, small(round))
            },
            |(round, small)| {
                let dir = plain.join(format!("s{round}"));
                std::fs::create_dir(&dir).unwrap();
                for (i, s) in small.iter().enumerate() {
                    std::fs::write(dir.join(format!("f{i:04}")), s).unwrap();
                }
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// 10,000 small text entries with their objects.
fn entries() -> (Vec<ChangeEntry>, Vec<Object>) {
    let mut entries = Vec::with_capacity(ENTRIES);
    let mut objects = Vec::with_capacity(ENTRIES);
    for i in 0..ENTRIES {
        let bytes = text(1024 + (i * 37) % 3000, i as u64);
        let hash = Hash::of(&bytes);
        entries.push(ChangeEntry {
            rev: 1,
            path: p(&path(i)),
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

/// Applies `entries` in batches of 256 with sender cursors, as the pull
/// driver does.
pub fn apply_all<S: Store>(store: &mut S, entries: &[ChangeEntry]) {
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

/// Pages through every change after zero in pages of 256; returns the count.
pub fn coalesce_all<S: Store>(store: &mut S) -> usize {
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

fn coalesce_and_apply(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let (entries, objects) = entries();
    let mut g = c.benchmark_group("dofs_10k");
    g.sample_size(10);
    g.throughput(Throughput::Elements(ENTRIES as u64));
    g.measurement_time(Duration::from_secs(20));

    let mut d = Dofs::open(scratch.dir().join("dofs.sqlite3")).unwrap();
    d.stage_objects(&objects).unwrap();
    apply_all(&mut d, &entries);
    g.bench_function("coalesce_pages_of_256", |b| {
        b.iter(|| assert_eq!(coalesce_all(&mut d), entries.len() + 100))
    });

    g.bench_function("apply_batches_of_256", |b| {
        b.iter_batched(
            || {
                let mut d = Dofs::open(scratch.dir().join("dofs.sqlite3")).unwrap();
                d.stage_objects(&objects).unwrap();
                d
            },
            |mut d| {
                apply_all(&mut d, &entries);
                d
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, throughput, coalesce_and_apply);
criterion_main!(benches);
