//! The `wsd` binary's own surface, linked once: `cli` (help text,
//! argument errors, exit codes, the client subcommands against a real
//! daemon child), `exit_rev` (the store rev an exit carries) and `sandbox`
//! (`wsd serve --sandbox` under bubblewrap).
//! Their presence also makes `cargo test` build the `wsd` binary that the
//! cross-crate scenarios in `tests/` drive. `stream_memory.rs` stays its
//! own binary: it installs a counting global allocator.

mod cli;
mod exit_rev;
mod sandbox;
