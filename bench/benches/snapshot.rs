//! Snapshot cost against tree size (issue 29): `Dofs::create_snapshot` of
//! a tree of 1 MiB files, 10 MiB and 100 MiB in all (mixed: half the
//! files of noise, half text), on a real SQLite file.
//!
//! Timed: creating a snapshot of the unchanged tree (and deleting it, so
//! every iteration is the same snapshot). Printed once per size, before
//! the timings: the first snapshot's `newBytes`, the second one's (an
//! unchanged tree: 0), and how much the second one grew the database
//! (the closed file's size) against the tree's bytes.
//!
//! Printed once (group `restore`): on the 100 MiB mixed tree pushed to a
//! real daemon on loopback, the first snapshot's create time, the restore
//! time after 10 of the 100 files were rewritten and pushed, and the bytes
//! the push after the restore sends against the tree's.
//!
//! Printed once (group `s3`, skipped without `weed`): the chunk store on
//! SeaweedFS (`weed mini` on loopback) against the SQLite store: a pull of
//! [`TreeSpec::BENCH`] from a daemon into a fresh dofs and a push from it
//! to a fresh daemon ([`S3_RUNS`] runs each, the two stores alternating
//! run by run so load affects both alike; MB/s, and the S3 / SQLite
//! ratio of the medians), the objects one S3 pull left in the bucket, and
//! `Dofs::read_file` of 500 small files with the hot cache cold (a fresh
//! client) and hot (the same files again), p50 and p99. The load average
//! is printed before and after.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use wsd_bench::{
    Daemon, Scratch, TreeSpec, block_on, open_local, pseudo_random, push, sync_store, text,
};
use wsd_dofs::seaweedfs::SeaweedFs;
use wsd_dofs::{
    BegunPut, ChunkStore, Dofs, DofsError, ObjectChunks, PackSlot, PendingPut, WriteOptions,
};
use wsd_sync::{
    ApplyBatch, ApplyOutcome, ChangeCursor, ChangeEntry, ChangesQuery, ChangesWindow, Hash, Object,
    Store, SyncError, SyncPath, Watermarks,
};

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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The mixed tree: `mib` files of 1 MiB, half noise and half text.
fn write_mixed(d: &mut Dofs, mib: usize, seed: u64) {
    let opts = WriteOptions {
        create_parents: true,
        ..WriteOptions::default()
    };
    for i in 0..mib {
        write_mixed_file(d, i, seed, opts);
    }
}

fn write_mixed_file(d: &mut Dofs, i: usize, seed: u64, opts: WriteOptions) {
    let bytes = if i.is_multiple_of(2) {
        pseudo_random(FILE, i as u64 + seed)
    } else {
        text(FILE, i as u64 + seed)
    };
    let path = SyncPath::new(format!("d{}/f{i}", i % 10)).unwrap();
    d.write_file_with(&path, &bytes[..], opts).unwrap();
}

/// Restore time and the push after it, on the 100 MiB mixed tree.
fn restore(_c: &mut Criterion) {
    let mut scratch = Scratch::default();
    let mut d = Dofs::open(scratch.dir().join("dofs.sqlite3")).unwrap();
    write_mixed(&mut d, 100, 0);
    let tree = (100 * FILE) as u64;
    let daemon = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
    let cold = block_on(sync_store(&mut d, &daemon.addr, "kernel", true));
    let t = Instant::now();
    let snap = d.create_snapshot("base").unwrap();
    let created = t.elapsed();
    let opts = WriteOptions::default();
    for i in (0..100).step_by(10) {
        write_mixed_file(&mut d, i, 1000, opts);
    }
    let edits = block_on(sync_store(&mut d, &daemon.addr, "kernel", true));
    let t = Instant::now();
    let out = d.restore_snapshot("base").unwrap();
    let restored = t.elapsed();
    let after = block_on(sync_store(&mut d, &daemon.addr, "kernel", true));
    eprintln!(
        "restore/100MiB: snapshot create {:.1} ms (newBytes {}); cold push {} bytes; \
         10 files rewritten, pushed {} bytes; restore {:.1} ms ({} changed, {} removed); \
         push after the restore {} bytes in {} objects = {:.2} % of the tree ({} bytes)",
        ms(created),
        snap.new_bytes,
        cold.object_bytes,
        edits.object_bytes,
        ms(restored),
        out.changed,
        out.removed,
        after.object_bytes,
        after.objects,
        after.object_bytes as f64 * 100.0 / tree as f64,
        tree
    );
}

/// p50 and p99 of `samples`.
fn percentiles(mut samples: Vec<Duration>) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| ms(samples[((samples.len() - 1) as f64 * q).round() as usize]);
    (at(0.5), at(0.99))
}

/// A dofs file in `dir`, keeping its chunks in `server` under `prefix`
/// when given.
fn open_dofs(path: &std::path::Path, s3: Option<(&SeaweedFs, &str)>) -> Dofs {
    let mut d = Dofs::open(path).unwrap();
    if let Some((server, prefix)) = s3 {
        d.keep_chunks_in(std::sync::Arc::new(server.chunks(prefix)));
    }
    d
}

/// Runs of each store in group `s3`.
const S3_RUNS: usize = 5;

/// The 1-minute load average, to print beside figures taken on a shared
/// machine.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The S3 chunk store against the SQLite store.
fn s3(_c: &mut Criterion) {
    let Some(server) = SeaweedFs::start() else {
        eprintln!("s3: skipped (no `weed`)");
        return;
    };
    let spec = TreeSpec::BENCH;
    let mut scratch = Scratch::default();
    let src = scratch.dir();
    spec.write(&src);
    let mut local = open_local(&src, &scratch.dir());
    let source = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
    block_on(push(&mut local, &source.addr, "bench"));
    let mb = spec.bytes() as f64 / 1e6;
    let mut reads = Vec::new();
    eprintln!("s3: load average {} at the start", load_average());
    let kinds = ["sqlite", "s3"];
    let mut pulls: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    let mut pushes: Vec<Vec<Duration>> = vec![Vec::new(); kinds.len()];
    for run in 0..S3_RUNS {
        for (k, kind) in kinds.into_iter().enumerate() {
            let (pulls, pushes) = (&mut pulls[k], &mut pushes[k]);
            let path = scratch.dir().join("dofs.sqlite3");
            let prefix = format!("bench-{run}");
            let s3 = (kind == "s3").then_some((&server, prefix.as_str()));
            let mut d = open_dofs(&path, s3);
            let t = Instant::now();
            let r = block_on(sync_store(&mut d, &source.addr, "kernel", false));
            pulls.push(t.elapsed());
            assert_eq!(r.object_bytes, spec.bytes());
            if run == 0 && kind == "s3" {
                let names = server.chunks(&prefix).list_documents("").unwrap();
                let count = |dir: &str| names.iter().filter(|n| n.starts_with(dir)).count();
                eprintln!(
                    "s3/s3: one pull left {} objects in the bucket: {} chunks stored alone, {} packs",
                    names.len(),
                    count("chunks/"),
                    count("packs/")
                );
            }
            // A fresh client: nothing of the tree in its hot cache.
            drop(d);
            let mut d = open_dofs(&path, s3);
            let target = Daemon::start(&scratch.dir().join("ws"), &scratch.dir());
            let t = Instant::now();
            let r = block_on(sync_store(&mut d, &target.addr, "kernel", true));
            pushes.push(t.elapsed());
            assert_eq!(r.object_bytes, spec.bytes());
            if run == 0 {
                drop(d);
                let d = open_dofs(&path, s3);
                let files: Vec<SyncPath> = (0..500)
                    .map(|i| SyncPath::new(spec.small_path(i * 4)).unwrap())
                    .collect();
                let time_all = |d: &Dofs| -> Vec<Duration> {
                    files
                        .iter()
                        .map(|p| {
                            let t = Instant::now();
                            std::hint::black_box(d.read_file(p).unwrap());
                            t.elapsed()
                        })
                        .collect()
                };
                let cold = percentiles(time_all(&d));
                let hot = percentiles(time_all(&d));
                reads.push((kind, cold, hot));
            }
        }
    }
    let best = |v: &[Duration]| v.iter().min().copied().unwrap_or_default();
    let median = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        v[v.len() / 2]
    };
    for (k, kind) in kinds.into_iter().enumerate() {
        eprintln!(
            "s3/{kind}: pull {:.1} MB/s (median of {S3_RUNS}, {:.0} ms; best {:.0} ms), \
             push {:.1} MB/s (median of {S3_RUNS}, {:.0} ms; best {:.0} ms), tree {} bytes",
            mb / median(&pulls[k]).as_secs_f64(),
            ms(median(&pulls[k])),
            ms(best(&pulls[k])),
            mb / median(&pushes[k]).as_secs_f64(),
            ms(median(&pushes[k])),
            ms(best(&pushes[k])),
            spec.bytes()
        );
    }
    let ratio = |v: &[Vec<Duration>]| median(&v[1]).as_secs_f64() / median(&v[0]).as_secs_f64();
    eprintln!(
        "s3: S3 / SQLite time (medians): pull {:.2}x, push {:.2}x; load average {} at the end",
        ratio(&pulls),
        ratio(&pushes),
        load_average()
    );
    for (kind, (cold_p50, cold_p99), (hot_p50, hot_p99)) in reads {
        eprintln!(
            "s3/{kind}: read_file of 500 small files: first read p50 {cold_p50:.3} ms, \
             p99 {cold_p99:.3} ms; again p50 {hot_p50:.3} ms, p99 {hot_p99:.3} ms"
        );
    }
    for kind in kinds {
        pull_timeline(&mut scratch, &server, &source, kind);
    }
}

/// What one call of the store took, for the pull's timeline.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Call {
    Has,
    Stage,
    Apply,
    Other,
}

/// A [`Store`] that records when each call to the wrapped dofs started
/// and ended: the time between calls is the driver's (mostly waiting for
/// the daemon's answers).
struct Timed<'a> {
    inner: &'a mut Dofs,
    calls: Vec<(Call, Instant, Instant, usize)>,
}

impl Timed<'_> {
    fn time<T>(&mut self, call: Call, bytes: usize, f: impl FnOnce(&mut Dofs) -> T) -> T {
        let start = Instant::now();
        let out = f(self.inner);
        self.calls.push((call, start, Instant::now(), bytes));
        out
    }
}

impl Store for Timed<'_> {
    fn current_rev(&mut self) -> Result<u64, SyncError> {
        self.time(Call::Other, 0, Store::current_rev)
    }
    fn watermarks(&mut self, remote: &str) -> Result<Watermarks, SyncError> {
        self.time(Call::Other, 0, |d| Store::watermarks(d, remote))
    }
    fn open_changes(&mut self, after: &ChangeCursor) -> Result<ChangesWindow, SyncError> {
        self.time(Call::Other, 0, |d| Store::open_changes(d, after))
    }
    fn changes(&mut self, query: ChangesQuery<'_>) -> Result<Vec<ChangeEntry>, SyncError> {
        self.time(Call::Other, 0, |d| Store::changes(d, query))
    }
    fn read_entry(&mut self, path: &SyncPath) -> Result<Option<ChangeEntry>, SyncError> {
        self.time(Call::Other, 0, |d| Store::read_entry(d, path))
    }
    fn has_objects(&mut self, hashes: &[Hash]) -> Result<Vec<Hash>, SyncError> {
        self.time(Call::Has, 0, |d| Store::has_objects(d, hashes))
    }
    fn read_object(&mut self, hash: &Hash) -> Result<Vec<u8>, SyncError> {
        self.time(Call::Other, 0, |d| Store::read_object(d, hash))
    }
    fn stage_objects(&mut self, objects: &[Object]) -> Result<(), SyncError> {
        let bytes = objects.iter().map(|o| o.bytes.len()).sum();
        self.time(Call::Stage, bytes, |d| Store::stage_objects(d, objects))
    }
    fn apply(&mut self, batch: ApplyBatch<'_>) -> Result<ApplyOutcome, SyncError> {
        self.time(Call::Apply, 0, |d| Store::apply(d, batch))
    }
    fn set_push_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        self.time(Call::Other, 0, |d| {
            Store::set_push_cursor(d, remote, cursor)
        })
    }
    fn set_fetch_cursor(&mut self, remote: &str, cursor: &ChangeCursor) -> Result<(), SyncError> {
        self.time(Call::Other, 0, |d| {
            Store::set_fetch_cursor(d, remote, cursor)
        })
    }
}

/// A [`ChunkStore`] that records, around the S3 store, how long each
/// `put_many` (or `begin_put_many`: packing, and the uploads it waits for)
/// took, and each wait for uploads left running.
struct TimedChunks {
    inner: ObjectChunks,
    puts: Mutex<Vec<(Instant, Instant, usize)>>,
    waits: Arc<Mutex<Vec<(Instant, Instant)>>>,
}

impl ChunkStore for TimedChunks {
    fn put_if_absent(&self, hash: &Hash, bytes: &[u8]) -> Result<bool, DofsError> {
        self.inner.put_if_absent(hash, bytes)
    }
    fn get(&self, hash: &Hash) -> Result<Vec<u8>, DofsError> {
        self.inner.get(hash)
    }
    fn has(&self, hashes: &[Hash]) -> Result<Vec<Hash>, DofsError> {
        self.inner.has(hashes)
    }
    fn put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<Vec<Option<PackSlot>>, DofsError> {
        let start = Instant::now();
        let out = self.inner.put_many(chunks);
        let bytes = chunks.iter().map(|(_, b)| b.len()).sum();
        self.puts
            .lock()
            .unwrap()
            .push((start, Instant::now(), bytes));
        out
    }
    fn begin_put_many(&self, chunks: &[(Hash, &[u8])]) -> Result<BegunPut, DofsError> {
        let start = Instant::now();
        let mut out = self.inner.begin_put_many(chunks)?;
        let bytes = chunks.iter().map(|(_, b)| b.len()).sum();
        self.puts
            .lock()
            .unwrap()
            .push((start, Instant::now(), bytes));
        out.pending = out.pending.map(|pending| {
            let waits = self.waits.clone();
            PendingPut::new(move || {
                let start = Instant::now();
                let out = pending.finish();
                waits.lock().unwrap().push((start, Instant::now()));
                out
            })
        });
        Ok(out)
    }
    fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Vec<u8>>, DofsError> {
        self.inner.get_many(hashes)
    }
    fn get_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Vec<u8>>, DofsError> {
        self.inner.get_placed(chunks)
    }
    fn locate(&self, hashes: &[Hash]) -> Result<Vec<(Hash, Option<PackSlot>)>, DofsError> {
        self.inner.locate(hashes)
    }
    fn lasting_place(&self, hash: &Hash, slot: Option<PackSlot>) -> bool {
        self.inner.lasting_place(hash, slot)
    }
    fn missing_placed(&self, chunks: &[(Hash, Option<PackSlot>)]) -> Result<Vec<Hash>, DofsError> {
        self.inner.missing_placed(chunks)
    }
}

/// This process's CPU time (user + system, every thread, ended ones
/// included).
fn own_cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    Duration::from_micros(micros(u.user_time()) + micros(u.system_time()))
}

/// CPU time of this process's live threads by name, from
/// `/proc/self/task/*/schedstat` (nanoseconds on CPU).
fn threads_cpu() -> std::collections::BTreeMap<String, Duration> {
    let mut out = std::collections::BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let dir = task.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        *out.entry(name.trim().to_owned()).or_insert(Duration::ZERO) += Duration::from_nanos(ns);
    }
    out
}

/// CPU time (user + system) of process `pid`, from `/proc/PID/stat`
/// (clock ticks of 10 ms).
fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the `(comm)`, which may hold spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15, i.e. 11 and 12 after `)`.
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// One pull of `spec` from `source` into a fresh dofs, every store call
/// timed (and, on S3, every `put_many` and every wait for uploads left
/// running), with the CPU each process and thread spent: where a pull's
/// time goes. Printed as totals and a line per `stage_objects` and
/// `apply` call.
fn pull_timeline(scratch: &mut Scratch, server: &SeaweedFs, source: &Daemon, kind: &str) {
    let path = scratch.dir().join("dofs.sqlite3");
    let mut d = Dofs::open(&path).unwrap();
    let timed_chunks = (kind == "s3").then(|| {
        Arc::new(TimedChunks {
            inner: server.chunks("timeline"),
            puts: Mutex::new(Vec::new()),
            waits: Arc::new(Mutex::new(Vec::new())),
        })
    });
    if let Some(c) = &timed_chunks {
        d.keep_chunks_in(c.clone());
    }
    let mut timed = Timed {
        inner: &mut d,
        calls: Vec::new(),
    };
    let (cpu0, threads0, weed0) = (own_cpu(), threads_cpu(), process_cpu(server.pid()));
    let t0 = Instant::now();
    block_on(sync_store(&mut timed, &source.addr, "kernel", false));
    let wall = t0.elapsed();
    let (cpu1, threads1, weed1) = (own_cpu(), threads_cpu(), process_cpu(server.pid()));
    let calls = timed.calls;
    let total = |c: Call| -> Duration {
        calls
            .iter()
            .filter(|(k, ..)| *k == c)
            .map(|(_, s, e, _)| *e - *s)
            .sum()
    };
    let in_calls: Duration = calls.iter().map(|(_, s, e, _)| *e - *s).sum();
    let (puts, waits) = timed_chunks
        .as_ref()
        .map(|c| {
            let puts: Vec<(Instant, Instant)> = c
                .puts
                .lock()
                .unwrap()
                .iter()
                .map(|(s, e, _)| (*s, *e))
                .collect();
            (puts, c.waits.lock().unwrap().clone())
        })
        .unwrap_or_default();
    let sum =
        |spans: &[(Instant, Instant)]| -> Duration { spans.iter().map(|(s, e)| *e - *s).sum() };
    // The part of `spans` inside [from, to].
    let within = |spans: &[(Instant, Instant)], from: Instant, to: Instant| -> f64 {
        ms(spans
            .iter()
            .filter(|(s, e)| *s >= from && *e <= to)
            .map(|(s, e)| *e - *s)
            .sum())
    };
    eprintln!(
        "timeline/{kind}: wall {:.1} ms: outside the store (the driver waiting for the daemon) \
         {:.1} ms, stage_objects {:.1} ms ({} calls), apply {:.1} ms, has_objects {:.1} ms, \
         other {:.1} ms; put_many {:.1} ms in {} calls, waiting for uploads {:.1} ms",
        ms(wall),
        ms(wall.saturating_sub(in_calls)),
        ms(total(Call::Stage)),
        calls.iter().filter(|(k, ..)| *k == Call::Stage).count(),
        ms(total(Call::Apply)),
        ms(total(Call::Has)),
        ms(total(Call::Other)),
        ms(sum(&puts)),
        puts.len(),
        ms(sum(&waits)),
    );
    let mut threads: Vec<(String, f64)> = threads1
        .iter()
        .map(|(name, t)| {
            let before = threads0.get(name).copied().unwrap_or_default();
            (name.clone(), ms(t.saturating_sub(before)))
        })
        .filter(|(_, t)| *t >= 1.0)
        .collect();
    threads.sort_by(|a, b| b.1.total_cmp(&a.1));
    let live: f64 = threads.iter().map(|(_, t)| t).sum();
    eprintln!(
        "timeline/{kind}: CPU ms: this process {:.0} (live threads: {}; ended threads ~{:.0}), \
         weed {:.0} (10 ms ticks)",
        ms(cpu1 - cpu0),
        threads
            .iter()
            .map(|(n, t)| format!("{n} {t:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        (ms(cpu1 - cpu0) - live).max(0.0),
        ms(weed1.saturating_sub(weed0)),
    );
    // A line per stage_objects and apply call: the gap before it (since
    // the previous store call ended: the driver's time), its time, and
    // within it the time in put_many and waiting for uploads.
    let mut last_end = t0;
    for (call, start, end, bytes) in &calls {
        if matches!(call, Call::Stage | Call::Apply) {
            eprintln!(
                "timeline/{kind}:   at {:6.1} ms after {:5.1} ms: {} {:5.1} ms \
                 (put_many {:5.1}, waiting for uploads {:5.1})",
                ms(*start - t0),
                ms(*start - last_end),
                match call {
                    Call::Stage => format!("stage {bytes:8} bytes"),
                    _ => format!("{:20}", "apply"),
                },
                ms(*end - *start),
                within(&puts, *start, *end),
                within(&waits, *start, *end),
            );
        }
        last_end = *end;
    }
}

criterion_group!(benches, snapshots, restore, s3);
criterion_main!(benches);
