//! The watcher: what adding inotify watches costs, on a tree of 1,000 leaf
//! directories (one small file each) under 20 parents.
//! - `first_settle_1000_dirs`: opening a watched workspace store over that
//!   tree and its first settle, which walks the tree and watches every
//!   directory (1,021 with the root) before listing it;
//! - `baseline_notify_watch_1000_dirs`: `notify` 8 watching the same
//!   directories one by one (non-recursive), as the store did before: each
//!   `watch` is a synchronous round trip to notify's event thread;
//! - `baseline_inotify_add_1000_dirs`: the `inotify` crate adding the same
//!   watches (one `inotify_add_watch` each), as the store does now.
//!
//! The two baselines time the adding only, not the watcher's start or
//! teardown (notify tears down on its own thread, inotify in `close`).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use notify::Watcher;
use wsd::store::{StoreOptions, WorkspaceStore};
use wsd_bench::Scratch;

const DIRS: usize = 1_000;

fn tree(root: &std::path::Path) -> Vec<PathBuf> {
    let mut dirs = Vec::with_capacity(DIRS);
    for i in 0..DIRS {
        let d = root.join(format!("d{:02}/e{i:04}", i % 20));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("f.txt"), format!("file {i}\n")).unwrap();
        dirs.push(d);
    }
    dirs
}

fn watch(c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let root = scratch.dir();
    let dirs = tree(&root);
    let mut g = c.benchmark_group("watch");
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(5));
    g.throughput(Throughput::Elements(DIRS as u64));

    g.bench_function("first_settle_1000_dirs", |b| {
        // A new state directory (so a new index) each time: the settle is
        // the first one, which watches every directory.
        b.iter_batched(
            || scratch.dir(),
            |state| {
                let opts = StoreOptions {
                    watch: true,
                    ..StoreOptions::default()
                };
                let mut store = WorkspaceStore::open(&root, &state, opts).unwrap();
                store.settle().unwrap();
                // Still watching: the watch limit was not reached, so this
                // measured watched walking, not the fallback.
                assert!(store.is_watching(), "the store runs its watcher");
                store
            },
            BatchSize::PerIteration,
        )
    });

    g.bench_function("baseline_notify_watch_1000_dirs", |b| {
        b.iter_custom(|iters| {
            let mut adding = Duration::ZERO;
            for _ in 0..iters {
                let mut w =
                    notify::recommended_watcher(|_: notify::Result<notify::Event>| {}).unwrap();
                let t = Instant::now();
                for d in &dirs {
                    w.watch(d, notify::RecursiveMode::NonRecursive).unwrap();
                }
                adding += t.elapsed();
            }
            adding
        })
    });

    g.bench_function("baseline_inotify_add_1000_dirs", |b| {
        b.iter_custom(|iters| {
            let mut adding = Duration::ZERO;
            for _ in 0..iters {
                let inotify = inotify::Inotify::init().unwrap();
                let mut watches = inotify.watches();
                let mask = inotify::WatchMask::ATTRIB
                    | inotify::WatchMask::CREATE
                    | inotify::WatchMask::DELETE
                    | inotify::WatchMask::CLOSE_WRITE
                    | inotify::WatchMask::MODIFY
                    | inotify::WatchMask::MOVED_FROM
                    | inotify::WatchMask::MOVED_TO
                    | inotify::WatchMask::ONLYDIR
                    | inotify::WatchMask::DONT_FOLLOW;
                let t = Instant::now();
                for d in &dirs {
                    watches.add(d, mask).unwrap();
                }
                adding += t.elapsed();
            }
            adding
        })
    });
    g.finish();
}

criterion_group!(benches, watch);
criterion_main!(benches);
