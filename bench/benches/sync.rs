//! Push and fetch of a tree over loopback TCP against a real daemon (store,
//! exec runner and RPC server on their own thread), driven like the CLI
//! (settle, connect, reconcile, push or pull). The tree is
//! [`TreeSpec::BENCH`]: 2,000 small files and two 8 MiB files, ~21 MiB.
//! - cold: into an empty workspace (push: the source already indexed);
//! - no-op: nothing changed;
//! - incremental: after one round of edits (1% of the small files
//!   rewritten, 100 bytes inserted in each big file);
//! - `hasObjects` with 10,000 hashes in one call, against a `watermarks`
//!   call (the bare round trip) in the same run.
//!
//! Baseline for cold: copying the same tree with `std::fs` (read + write
//! per file) in the same run.

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wsd_bench::{Daemon, Scratch, TreeSpec, block_on, connect, open_local, pull, push};
use wsd_sync::Hash;

const SPEC: TreeSpec = TreeSpec::BENCH;

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::write(&dst, std::fs::read(e.path()).unwrap()).unwrap();
        }
    }
}

fn push_bench(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let src = scratch.dir();
    SPEC.write(&src);
    let local_state = scratch.dir();
    let mut local = open_local(&src, &local_state);
    local.settle().unwrap();

    let mut g = c.benchmark_group("push");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(15));
    g.throughput(Throughput::Bytes(SPEC.bytes()));
    g.bench_function("cold", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let daemon = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
                let t = Instant::now();
                let r = block_on(push(&mut local, &daemon.addr, "bench"));
                total += t.elapsed();
                assert_eq!(r.object_bytes, SPEC.bytes());
            }
            total
        })
    });
    g.bench_function("baseline_std_fs_copy", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let to = scratch.dir().join("copy");
                let t = Instant::now();
                copy_tree(&src, &to);
                total += t.elapsed();
            }
            total
        })
    });
    g.throughput(Throughput::Elements(SPEC.entries() as u64));
    let daemon = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
    block_on(push(&mut local, &daemon.addr, "bench"));
    g.bench_function("noop", |b| {
        b.iter(|| assert_eq!(block_on(push(&mut local, &daemon.addr, "bench")).entries, 0))
    });
    let mut round = 0;
    g.bench_function("incremental", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                SPEC.mutate(&src, round);
                let t = Instant::now();
                let r = block_on(push(&mut local, &daemon.addr, "bench"));
                total += t.elapsed();
                assert!(r.entries > 0);
            }
            total
        })
    });
    g.finish();
}

fn fetch_bench(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    // The daemon's workspace holds the tree (pushed once).
    let daemon = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
    let seed = scratch.dir();
    SPEC.write(&seed);
    let mut seeder = open_local(&seed, &scratch.dir());
    block_on(push(&mut seeder, &daemon.addr, "seeder"));

    let mut g = c.benchmark_group("fetch");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(15));
    g.throughput(Throughput::Bytes(SPEC.bytes()));
    g.bench_function("cold", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let mut local = open_local(&scratch.dir().join("l"), &scratch.dir());
                let t = Instant::now();
                let r = block_on(pull(&mut local, &daemon.addr, "puller"));
                total += t.elapsed();
                assert_eq!(r.object_bytes, SPEC.bytes());
            }
            total
        })
    });
    g.throughput(Throughput::Elements(SPEC.entries() as u64));
    let mut local = open_local(&scratch.dir().join("l"), &scratch.dir());
    block_on(pull(&mut local, &daemon.addr, "puller"));
    g.bench_function("noop", |b| {
        b.iter(|| {
            assert_eq!(
                block_on(pull(&mut local, &daemon.addr, "puller")).entries,
                0
            )
        })
    });
    let mut round = 0;
    g.bench_function("incremental", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                // Edit the daemon's workspace directly, as a command would.
                round += 1;
                SPEC.mutate(&daemon.root, round);
                let t = Instant::now();
                let r = block_on(pull(&mut local, &daemon.addr, "puller"));
                total += t.elapsed();
                assert!(r.entries > 0);
            }
            total
        })
    });
    g.finish();
}

fn has_objects_bench(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let daemon = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
    let src = scratch.dir();
    let spec = TreeSpec {
        files: 5000,
        dirs: 100,
        big: 0,
        big_size: 0,
    };
    spec.write(&src);
    let mut local = open_local(&src, &scratch.dir());
    block_on(push(&mut local, &daemon.addr, "bench"));
    // 5,000 held (the tree's files) and 5,000 not.
    let mut hashes: Vec<Hash> = (0..spec.files)
        .map(|i| Hash::of(&std::fs::read(src.join(spec.small_path(i))).unwrap()))
        .collect();
    hashes.extend((0..5000u32).map(|i| Hash::of(&i.to_le_bytes())));
    let rt = wsd_bench::runtime();
    let set = tokio::task::LocalSet::new();
    let client = set.block_on(&rt, connect(&daemon.addr, "bench"));

    let mut g = c.benchmark_group("rpc");
    g.sample_size(30);
    g.throughput(Throughput::Elements(hashes.len() as u64));
    g.bench_function("has_objects_10k", |b| {
        b.iter(|| {
            let held = set.block_on(&rt, client.has_objects(&hashes)).unwrap();
            assert_eq!(held.len(), spec.files);
        })
    });
    g.throughput(Throughput::Elements(1));
    g.bench_function("baseline_watermarks_round_trip", |b| {
        b.iter(|| set.block_on(&rt, client.watermarks()).unwrap())
    });
    g.finish();
}

criterion_group!(benches, push_bench, fetch_bench, has_objects_bench);
criterion_main!(benches);
