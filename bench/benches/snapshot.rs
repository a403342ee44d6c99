//! Snapshot cost against tree size (issue 29): `Dofs::create_snapshot` of
//! a tree of 1 MiB files, 10 MiB and 100 MiB in all (mixed: half the
//! files of noise, half text), on a real SQLite file.
//!
//! Timed: creating a snapshot of the unchanged tree (and deleting it, so
//! every iteration is the same snapshot). Printed once per size, before
//! the timings: the first snapshot's `newBytes`, the second one's (an
//! unchanged tree: 0), and how much the second one grew the database
//! (the closed file's size) against the tree's bytes.

use criterion::{Criterion, criterion_group, criterion_main};
use wsd_bench::{Scratch, pseudo_random, text};
use wsd_dofs::{Dofs, WriteOptions};
use wsd_sync::SyncPath;

const FILE: usize = 1024 * 1024;

/// The database file's size once closed (the last close checkpoints the
/// WAL into it), and the store opened again.
fn closed_size(d: Dofs, path: &std::path::Path) -> (u64, Dofs) {
    drop(d);
    let size = std::fs::metadata(path).unwrap().len();
    (size, Dofs::open(path).unwrap())
}

fn snapshots(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let mut g = c.benchmark_group("snapshot");
    g.sample_size(20);
    for mib in [10usize, 100] {
        let dir = scratch.dir();
        let db = dir.join("dofs.sqlite3");
        let mut d = Dofs::open(&db).unwrap();
        let opts = WriteOptions {
            create_parents: true,
            ..WriteOptions::default()
        };
        for i in 0..mib {
            let bytes = if i % 2 == 0 {
                pseudo_random(FILE, i as u64)
            } else {
                text(FILE, i as u64)
            };
            let path = SyncPath::new(format!("d{}/f{i}", i % 10)).unwrap();
            d.write_file_with(&path, &bytes[..], opts).unwrap();
        }
        let tree = (mib * FILE) as u64;
        let first = d.create_snapshot("first").unwrap();
        let (before, mut reopened) = closed_size(d, &db);
        let second = reopened.create_snapshot("second").unwrap();
        let (after, reopened) = closed_size(reopened, &db);
        let mut d = reopened;
        let growth = after.saturating_sub(before);
        eprintln!(
            "snapshot/{mib}MiB: files {}, bytes {}; first newBytes {}; second newBytes {}, \
             database growth {growth} bytes ({:.4} % of the tree)",
            second.files,
            second.bytes,
            first.new_bytes,
            second.new_bytes,
            growth as f64 * 100.0 / tree as f64
        );
        g.bench_function(format!("create_unchanged_{mib}MiB"), |b| {
            b.iter(|| {
                d.create_snapshot("timed").unwrap();
                d.delete_snapshot("timed").unwrap();
            })
        });
    }
    g.finish();
}

criterion_group!(benches, snapshots);
criterion_main!(benches);
