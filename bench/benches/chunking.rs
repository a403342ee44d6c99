//! Chunk + hash throughput over 64 MiB of incompressible bytes in memory:
//! the cut+SHA-256 pipeline over a slice (what settle and dofs run), the
//! same over a reader (the streaming path), and on every core at once; with
//! the two halves of the pipeline alone (FastCDC cutting, SHA-256) and a
//! memcpy as baselines measured in the same run; and re-chunking an edited
//! buffer from its earlier chunks' BLAKE3 fingerprints, with BLAKE3 alone.
//! Target: >= 0.9 GB/s per core for cut+hash (peers-and-limits §D.1).

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
        let mut buf = Vec::new();
        b.iter(|| {
            chunk::chunk_reader_with(&data[..], &mut buf, None, |_, _| Ok(()))
                .unwrap()
                .len()
        })
    });
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    g.bench_function(format!("cut_and_hash_slice_{threads}_threads"), |b| {
        // Each thread cuts and hashes its own share: the aggregate rate.
        let per = data.len() / threads;
        b.iter(|| {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let part = &data[t * per..(t + 1) * per];
                        s.spawn(move || chunk::chunk_slice(part).len())
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
            })
        })
    });
    // Baselines: each half of the pipeline alone, and copying the bytes.
    g.bench_function("baseline_cut_only", |b| {
        b.iter(|| {
            fastcdc::v2020::FastCDC::new(
                &data,
                chunk::MIN_CHUNK,
                chunk::AVG_CHUNK,
                chunk::MAX_CHUNK,
            )
            .count()
        })
    });
    g.bench_function("baseline_sha256_only", |b| {
        b.iter(|| wsd_sync::Hash::of(&data))
    });
    // The same digest from the other implementations on offer, so the
    // choice in `Hash::of` stays a measured one: sha2 (runtime SHA-NI via
    // cpufeatures) vs ring (its own SHA-NI/AVX assembly), per 64 KiB chunk
    // as the pipeline hashes them and over the whole buffer at once.
    g.bench_function("baseline_sha256_sha2_64KiB_pieces", |b| {
        use sha2::Digest;
        b.iter(|| {
            data.chunks(chunk::AVG_CHUNK)
                .map(|c| sha2::Sha256::digest(c)[0])
                .fold(0u8, |a, x| a ^ x)
        })
    });
    g.bench_function("baseline_sha256_ring_64KiB_pieces", |b| {
        b.iter(|| {
            data.chunks(chunk::AVG_CHUNK)
                .map(|c| ring::digest::digest(&ring::digest::SHA256, c).as_ref()[0])
                .fold(0u8, |a, x| a ^ x)
        })
    });
    g.bench_function("baseline_sha256_ring", |b| {
        b.iter(|| ring::digest::digest(&ring::digest::SHA256, &data))
    });
    // Re-chunking after an edit from the earlier version's chunks and
    // BLAKE3 fingerprints (what a settle of an edited file of 1 MiB or more
    // runs, issue 32): 100 bytes inserted in the middle, as
    // `make-tree.py mutate` does to the big files.
    let print = |b: &[u8]| *blake3::hash(b).as_bytes();
    let previous: Vec<_> = chunk::chunk_slice(&data)
        .into_iter()
        .map(|(at, c)| chunk::KnownChunk {
            chunk: c,
            fingerprint: print(&data[at..at + c.size as usize]),
        })
        .collect();
    let mut edited = data.clone();
    edited.splice(data.len() / 2..data.len() / 2, pseudo_random(100, 7));
    g.bench_function("rechunk_after_insert_reader", |b| {
        let mut buf = Vec::new();
        b.iter(|| {
            chunk::rechunk_reader_with(&edited[..], &mut buf, &previous, print)
                .unwrap()
                .len()
        })
    });
    g.bench_function("baseline_blake3_64KiB_pieces", |b| {
        b.iter(|| {
            data.chunks(chunk::AVG_CHUNK)
                .map(|c| blake3::hash(c).as_bytes()[0])
                .fold(0u8, |a, x| a ^ x)
        })
    });
    g.bench_function("baseline_memcpy", |b| {
        let mut out = vec![0u8; data.len()];
        b.iter(|| {
            out.copy_from_slice(&data);
            out[out.len() - 1]
        })
    });
    g.finish();
}

criterion_group!(benches, chunking);
criterion_main!(benches);
