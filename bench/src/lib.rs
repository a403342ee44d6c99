//! Criterion benchmarks and the comparison harness.
