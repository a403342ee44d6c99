//! Shared helpers for the criterion benches in `benches/` and the
//! side-by-side harness `bench/compare` (a script). Outside the default
//! build: `cargo bench -p wsd-bench`.

/// Deterministic incompressible bytes (xorshift), so every run and every
/// tool sees the same input.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
