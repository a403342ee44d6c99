//! Chunk + hash throughput: the FastCDC cutter alone, the cut+SHA-256
//! pipeline over a slice, and the streaming chunker over a reader.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use wsd_bench::pseudo_random;
use wsd_sync::chunk;

fn chunking(c: &mut Criterion) {
    let data = pseudo_random(64 * 1024 * 1024, 42);
    let mut g = c.benchmark_group("chunk");
    g.throughput(Throughput::Bytes(data.len() as u64));
    g.sample_size(10);
    g.bench_function("cut_and_hash_slice", |b| {
        b.iter(|| chunk::chunk_slice(&data).len())
    });
    g.bench_function("cut_and_hash_reader", |b| {
        b.iter(|| chunk::chunk_reader(&data[..], |_, _| Ok(())).unwrap().len())
    });
    g.bench_function("sha256_only", |b| b.iter(|| wsd_sync::Hash::of(&data)));
    g.finish();
}

criterion_group!(benches, chunking);
criterion_main!(benches);
